//! Read-only `/sysroot` and `/boot`. Fedora CoreOS, RHCOS and anaconda's rpm-ostree installs
//! mount the physical root read-only (`sysroot.readonly` in the repo config; ostree-prepare-root
//! gives the booted stateroot's `/var` a writable mount of its own first), and Fedora CoreOS
//! mounts `/boot` read-only, so that only the OS updater writes them: in a mount namespace of its
//! own, where it remounts them read-write, as `ostree admin`, rpm-ostree, bootc and greenboot
//! do. The rest of the system keeps seeing them read-only.
//!
//! pivot makes that namespace at start, before any thread exists: `unshare(CLONE_NEWNS)` in a
//! process with threads moves only the calling thread, silently. It does so for the commands that
//! write a booted sysroot, and only when one of the two is read-only, so a writable node is left
//! alone. libostree's own way (`ostree_sysroot_initialize_with_mount_namespace`) reads
//! `/proc/1/ns/mnt`, which the confined units cannot (they hold no CAP_SYS_PTRACE); libostree is
//! told the namespace is in use ([`in_use`]), so it remounts again should a remount be undone.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{ensure, Context, Result};
use nix::mount::MsFlags;

/// The mounts an OS update writes, remounted in the namespace when read-only.
const WRITTEN: [&str; 2] = ["/sysroot", "/boot"];

static IN_USE: AtomicBool = AtomicBool::new(false);

/// Whether this process made its own mount namespace ([`writable`]): then every sysroot it
/// opens is told so (`ostree_sysroot_set_mount_namespace_in_use`, before it is loaded).
pub fn in_use() -> bool {
    IN_USE.load(Ordering::Relaxed)
}

/// Whether a command that writes `sysroot` needs a namespace: it is the booted system, and
/// one of `read_only` (the mounts in [`WRITTEN`] found read-only) is there.
fn needed(sysroot: &Path, booted: bool, read_only: &[&str]) -> bool {
    booted && sysroot == Path::new("/") && !read_only.is_empty()
}

/// Makes `/sysroot` and `/boot` writable for this process alone when the booted system
/// mounts them read-only (see the module). Call before any thread is started. Returns the
/// mounts it remounted.
pub fn writable(sysroot: &Path) -> Result<Vec<&'static str>> {
    let booted = Path::new("/run/ostree-booted").exists();
    let sysroot = sysroot.canonicalize().unwrap_or_else(|_| sysroot.to_path_buf());
    let read_only: Vec<&str> = WRITTEN
        .into_iter()
        .filter(|m| {
            nix::sys::statvfs::statvfs(*m)
                .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
        })
        .collect();
    if !needed(&sysroot, booted, &read_only) {
        return Ok(Vec::new());
    }
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    ensure!(
        status.lines().any(|l| l == "Threads:\t1"),
        "a mount namespace for the read-only {} must be made before any thread starts",
        read_only.join(" and ")
    );
    let context = || format!("making {} writable for pivot", read_only.join(" and "));
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).with_context(context)?;
    // Mounts the host makes later (an automounted /boot) still reach pivot; none of pivot's
    // reaches the host.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .with_context(context)?;
    for mount in &read_only {
        // As libostree remounts them: the superblock too (Fedora CoreOS's /boot is mounted
        // read-only, not bound read-only). The host's mount keeps its own read-only flag.
        nix::mount::mount(
            Some(*mount),
            *mount,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_RELATIME,
            Some(""),
        )
        .with_context(|| format!("remounting {mount} read-write in pivot's mount namespace"))?;
    }
    IN_USE.store(true, Ordering::Relaxed);
    Ok(read_only)
}

/// A new sysroot object for `path`, told whether this process has its own mount namespace.
pub fn sysroot(path: &Path) -> ostree::Sysroot {
    let sysroot = ostree::Sysroot::new(Some(&ostree::gio::File::for_path(path)));
    if in_use() {
        sysroot.set_mount_namespace_in_use();
    }
    sysroot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_booted_root_with_a_read_only_mount_gets_a_namespace() {
        let root = Path::new("/");
        assert!(needed(root, true, &["/sysroot"]));
        assert!(needed(root, true, &["/boot"]));
        assert!(!needed(root, true, &[]), "a writable node is left alone");
        assert!(!needed(root, false, &["/sysroot"]), "not an OSTree system");
        assert!(
            !needed(Path::new("/mnt/sysroot"), true, &["/sysroot"]),
            "another sysroot than the booted one"
        );
    }

    #[test]
    fn a_writable_machine_is_left_in_its_namespace() {
        // This machine is not a booted OSTree system: nothing to do, nothing done.
        assert!(writable(Path::new("/")).unwrap().is_empty());
        assert!(!in_use());
    }
}
