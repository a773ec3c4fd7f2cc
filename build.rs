//! Build-time outputs:
//! - the man pages and shell completions, generated from the command line's definition
//!   (src/cli/args.rs) into `$OUT_DIR/assets`, where packaging/install takes them: packaging
//!   never runs the built binary, which a cross-built image could not;
//! - for the VM suite (tests/vm.rs) only: `PIVOT_VM_SKIP=1` at build time marks its scenarios
//!   ignored, so a run without the VMs says so instead of counting them as passed. Nothing in
//!   the library or the binary reads that flag.

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

#[allow(dead_code)]
#[path = "src/cli/args.rs"]
mod args;

/// What `args` asks of its parent module. The build needs only the definition, not the check.
#[allow(dead_code)]
fn karg(arg: &str) -> Result<String, String> {
    Ok(arg.to_string())
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pivot_vm_skip)");
    println!("cargo::rerun-if-env-changed=PIVOT_VM_SKIP");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/cli/args.rs");
    if std::env::var("PIVOT_VM_SKIP").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=pivot_vm_skip");
    }
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    if let Err(e) = assets(&Path::new(&out).join("assets")) {
        panic!("generating the man pages and completions: {e}");
    }
}

/// `pivot.1` and a page a subcommand (`pivot-status.1`, …), and the bash, zsh and fish
/// completions.
fn assets(dir: &Path) -> std::io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let mut command = args::Cli::command();
    command.build();
    clap_mangen::generate_to(command.clone(), &man)?;
    // clap's `help` subcommand is not a command of pivot's to document.
    for page in std::fs::read_dir(&man)? {
        let page = page?;
        if page.file_name().to_string_lossy().starts_with("pivot-help") {
            std::fs::remove_file(page.path())?;
        }
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut command, "pivot", &completions)?;
    }
    Ok(())
}
