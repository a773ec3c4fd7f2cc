//! The image cache outside the repository (default /var/cache/pivot-vm, or $PIVOT_VM_CACHE):
//! entries named by a content hash of whatever determines them, published by rename so a build
//! that dies leaves no half-made entry, and built under a lock so two runs never race.
// unsafe: descriptors, mounts and locks of the VM harness (libc).
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

pub fn dir() -> PathBuf {
    std::env::var_os("PIVOT_VM_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/pivot-vm"))
}

/// A short hex digest of `parts` (each length-prefixed, so part boundaries count).
pub fn key(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hex::encode(&hash.finalize()[..8])
}

/// An exclusive `flock` on a file in the cache, held until dropped (or the process exits).
pub struct Lock {
    _file: File,
}

impl Lock {
    pub fn acquire(cache: &Path, name: &str) -> Result<Lock> {
        std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
        let path = cache.join(format!("{name}.lock"));
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            println!("[vm] waiting for {} (another run holds it)", path.display());
            // SAFETY: as above.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                let err = std::io::Error::last_os_error();
                bail!("locking {}: {err}", path.display());
            }
        }
        Ok(Lock { _file: file })
    }
}

/// Returns `cache/<name>`, building it with `build(tmp_dir)` first if it is not there yet.
pub fn entry(
    cache: &Path,
    name: &str,
    build: impl FnOnce(&Path) -> Result<()>,
) -> Result<(PathBuf, bool)> {
    let _lock = Lock::acquire(cache, name)?;
    let done = cache.join(name);
    if done.exists() {
        return Ok((done, false));
    }
    let tmp = cache.join(format!("{name}.partial"));
    if tmp.exists() {
        remove_tree(&tmp)?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    build(&tmp).with_context(|| format!("building cache entry {}", done.display()))?;
    std::fs::rename(&tmp, &done).with_context(|| format!("publishing {}", done.display()))?;
    Ok((done, true))
}

/// Removes a file, or a directory tree that may hold OSTree deployments (immutable bit) or mounts left by
/// a killed run. Mounts are undone first: a chroot's bind-mounted /dev must never be emptied.
pub fn remove_tree(path: &Path) -> Result<()> {
    let Ok(meta) = path.symlink_metadata() else {
        return Ok(());
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()));
    }
    super::mounts::unmount_below(path)?;
    if std::fs::remove_dir_all(path).is_ok() {
        return Ok(());
    }
    let _ = std::process::Command::new("chattr")
        .args(["-R", "-i"])
        .arg(path)
        .stderr(std::process::Stdio::null())
        .status();
    std::fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
}
