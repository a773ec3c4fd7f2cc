//! Mounts that undo themselves: bind mounts for the image build's chroot, and partitions of a
//! raw disk image mounted through a loop device at an offset (no partition scan needed). The loop
//! devices are set up by `mount -o loop`, which marks them autoclear: unmounting frees them, even
//! when it is a later run cleaning up after a killed one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::cmd;

const TIMEOUT: Duration = Duration::from_secs(60);

/// One mount point, unmounted on drop.
pub struct Mount {
    target: PathBuf,
}

impl Mount {
    pub fn bind(source: &Path, target: &Path) -> Result<Mount> {
        cmd::run(
            Command::new("mount").arg("--bind").arg(source).arg(target),
            TIMEOUT,
        )?;
        Ok(Mount {
            target: target.to_path_buf(),
        })
    }

    /// Mounts the ext4 filesystem at `offset..offset+size` of the raw image `image`.
    pub fn partition(
        image: &Path,
        offset: u64,
        size: u64,
        target: &Path,
        read_only: bool,
    ) -> Result<Mount> {
        std::fs::create_dir_all(target)
            .with_context(|| format!("creating {}", target.display()))?;
        let mut options = format!("loop,offset={offset},sizelimit={size}");
        if read_only {
            // noload: never replay a journal on a disk we only look at.
            options += ",ro,noload";
        }
        cmd::run(
            Command::new("mount")
                .args(["-t", "ext4", "-o", &options])
                .arg(image)
                .arg(target),
            TIMEOUT,
        )?;
        Ok(Mount {
            target: target.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.target
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = unmount(&self.target) {
            eprintln!("[vm] warning: {e:#}");
        }
    }
}

fn unmount(target: &Path) -> Result<()> {
    cmd::run(Command::new("umount").arg(target), TIMEOUT)
        .or_else(|_| cmd::run(Command::new("umount").arg("--lazy").arg(target), TIMEOUT))
        .with_context(|| format!("unmounting {}", target.display()))
        .map(drop)
}

/// Unmounts whatever a killed run left mounted under `dir`, deepest first.
pub fn unmount_below(dir: &Path) -> Result<()> {
    let Ok(dir) = dir.canonicalize() else {
        return Ok(());
    };
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Ok(());
    };
    // Field 5 is the mount point (spaces escaped as \040; none in our paths).
    let mut stale: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(&dir))
        .collect();
    stale.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for target in stale {
        unmount(&target)?;
    }
    Ok(())
}
