//! A size-limited tmpfs mounted on a fresh temporary directory (needs root), unmounted on drop.
//!
//! Crash and disk-space tests put sysroots on one: a full filesystem is then a real ENOSPC, and
//! libostree's fsfreeze/thaw of /boot (which a tmpfs does not support) never freezes the host's
//! own filesystem, even when a test kills the deploying process in the middle of it.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` (rounded up to pages by the kernel) on a new temp dir.
    pub fn mount(bytes: u64) -> Result<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("pivot-tmpfs-")
            .tempdir()
            .context("creating a mount point")?;
        let path = dir.path().to_path_buf();
        Tmpfs::mount_on(&path, bytes)?;
        Ok(Tmpfs {
            dir: Some(dir),
            path,
        })
    }

    /// Mounts a tmpfs of `bytes` over the existing directory `path`, keeping what it holds:
    /// the contents are copied onto the new filesystem (e.g. a small `/boot` for a sysroot).
    pub fn mount_over(path: &Path, bytes: u64) -> Result<Tmpfs> {
        let saved = tempfile::Builder::new()
            .prefix("pivot-tmpfs-saved-")
            .tempdir()
            .context("creating a scratch dir")?;
        copy_contents(path, saved.path())?;
        Tmpfs::mount_on(path, bytes)?;
        let mounted = Tmpfs {
            dir: None,
            path: path.to_path_buf(),
        };
        copy_contents(saved.path(), path)?;
        Ok(mounted)
    }

    fn mount_on(path: &Path, bytes: u64) -> Result<()> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={bytes},mode=0755"))
            .arg("pivot-test")
            .arg(path)
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "mounting a tmpfs on {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn copy_contents(from: &Path, to: &Path) -> Result<()> {
    let out = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .context("running cp -a")?;
    if !out.status.success() {
        bail!(
            "copying {} to {}: {}",
            from.display(),
            to.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily, so a process still holding a file there cannot keep the mount alive.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        drop(self.dir.take());
    }
}
