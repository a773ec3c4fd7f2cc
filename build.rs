//! Only for the VM suite (tests/vm.rs): `PIVOT_VM_SKIP=1` at build time marks its scenarios
//! ignored, so a run without the VMs says so instead of counting them as passed. Nothing in the
//! library or the binary reads the flag.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(pivot_vm_skip)");
    println!("cargo::rerun-if-env-changed=PIVOT_VM_SKIP");
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var("PIVOT_VM_SKIP").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=pivot_vm_skip");
    }
}
