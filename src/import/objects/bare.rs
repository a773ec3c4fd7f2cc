//! An ostree-native layer's regular-file objects, written into the open transaction's staging
//! directory with plain system calls rather than through `ostree_repo_write_content`.
//!
//! Per file, libostree 2022.7 looks the object up three times (six `fstatat`, staging directory
//! and `objects/`), allocates its extents up front (`fallocate`), sets its mode three times and
//! makes its prefix directory again, all through GLib streams: on a 300 MB tree of 18k files,
//! an eighth of the whole run's CPU time (docs/benchmark.md). Here an object costs `openat`
//! (`O_TMPFILE`), `write`, `fchown`, `fchmod`, one `fsetxattr` per xattr, `futimens`, `linkat`
//! and `close`; each prefix directory is made once per transaction.
//!
//! The object is the one libostree writes in a `bare` repo (`commit_loose_regfile_object`):
//! owner, then permission bits (a `chown` clears setuid bits), xattrs, modification time 0, the
//! access time left alone. The caller has checked that the content stream hashes to the name,
//! and the name is linked only once every byte and attribute is written, so a killed run leaves
//! an anonymous file the kernel frees, never a wrong object under a right name. libostree still
//! owns the transaction: its staging directory (found, not made), its commit, symlinks,
//! metadata and large files. What is staged here reaches `objects/` in batches while the import
//! goes on ([`super::Publisher`]); the commit moves the rest.
//!
//! The repo's min-free-space reserve holds as libostree holds it: the blocks free when the
//! transaction began, less the reserve, and each object takes its size in blocks plus one.
//! libostree keeps its own count for what it writes, so a layer of large files and symlinks may
//! go past the reserve by what libostree writes; pivot's check before the import
//! (`crate::sysroot::space`) already counts the whole image against it.
//!
//! Only where libostree would write the same file: a `bare` repo without fs-verity, per-object
//! fsync or payload links, and a staging directory told apart from any other. Elsewhere
//! libostree writes every object, as before.

use std::collections::HashSet;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use ostree::gio::prelude::FileExt;
use ostree::glib;
use rustix::fs::{AtFlags, Mode, OFlags, Timestamps, XattrFlags, CWD, UTIME_OMIT};

use super::publish::Queue;
use crate::fetch::image::is_checksum;
use crate::import::staging::staging_dirs;

/// The open transaction's staging directory, where objects are written.
pub struct Staging {
    dir: std::fs::File,
    /// The prefix directories (`objects/XX` in the staging directory) made so far.
    made: [AtomicBool; 256],
    /// Blocks left above the repo's min-free-space reserve; None without a reserve.
    budget: Option<Mutex<Budget>>,
    /// What is staged for a [`super::Publisher`] to move into `objects/`.
    queue: Queue,
}

struct Budget {
    blocks: u64,
    block_size: u64,
    /// The reserve as libostree's error names it (`min-free-space-size 500MB`).
    reserve: String,
}

impl Staging {
    /// The staging directory of the transaction open on `repo`, when libostree would write
    /// regular files the way [`Self::write_file`] does; None otherwise (libostree then writes).
    pub fn of_transaction(repo: &ostree::Repo) -> Option<Arc<Staging>> {
        match Self::find(repo) {
            Ok(staging) => Some(Arc::new(staging)),
            Err(e) => {
                tracing::debug!("libostree writes every object: {e:#}");
                None
            }
        }
    }

    fn find(repo: &ostree::Repo) -> Result<Staging> {
        if repo.mode() != ostree::RepoMode::Bare {
            bail!("the repo is not a bare repo");
        }
        let config = repo.config();
        if config.has_group("ex-fsverity") {
            bail!("the repo configures fs-verity");
        }
        for key in ["per-object-fsync", "payload-link-threshold"] {
            if config.has_key("core", key).unwrap_or(false) {
                bail!("the repo sets core.{key}");
            }
        }
        let path = repo.path().path().context("the repo has no path")?;
        let tmp = path.join("tmp");
        let name = transaction_dir(&tmp)?;
        let dir = std::fs::File::open(tmp.join(&name))
            .with_context(|| format!("opening the staging directory {name}"))?;
        // Where the filesystem has no anonymous files, libostree names its temporary files.
        temporary_file(&dir).context("the staging directory's filesystem has no O_TMPFILE")?;
        let budget = budget(repo, &dir)?;
        Ok(Staging {
            dir,
            made: std::array::from_fn(|_| AtomicBool::new(false)),
            budget: budget.map(Mutex::new),
            queue: Queue::default(),
        })
    }

    /// Writes the regular-file object `checksum`, `content` owned by `uid`:`gid` with the
    /// permission bits of `mode` and `xattrs` (libostree's `a(ayay)`), into the staging
    /// directory. The caller has checked the checksum. An object another writer staged first
    /// is left as it is.
    pub fn write_file(
        &self,
        checksum: &str,
        (uid, gid, mode): (u32, u32, u32),
        xattrs: &glib::Variant,
        content: &[u8],
    ) -> Result<()> {
        let id = object_id(checksum)?;
        self.take_blocks(content.len() as u64)?;
        let mut file = temporary_file(&self.dir).context("creating a temporary file")?;
        file.write_all(content).context("writing the file")?;
        // As libostree: a chown clears setuid bits, so the mode comes after it.
        rustix::fs::fchown(
            &file,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .context("setting its owner")?;
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o7777))
            .context("setting its mode")?;
        for (name, value) in xattr_pairs(xattrs)? {
            rustix::fs::fsetxattr(&file, name.as_c_str(), &value, XattrFlags::empty())
                .with_context(|| format!("setting its xattr {name:?}"))?;
        }
        let times = Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        rustix::fs::futimens(&file, &times).context("setting its modification time")?;
        let name = object_name(&id);
        let prefix = &name[..2];
        let slot = usize::from(id[0]);
        if !self.made[slot].load(Ordering::Relaxed) {
            match rustix::fs::mkdirat(&self.dir, prefix, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e).context(format!("making the staging directory {prefix}")),
            }
            self.made[slot].store(true, Ordering::Relaxed);
        }
        let fd = format!("/proc/self/fd/{}", file.as_fd().as_raw_fd());
        match rustix::fs::linkat(CWD, fd.as_str(), &self.dir, name.as_str(), AtFlags::SYMLINK_FOLLOW) {
            Ok(()) => {
                self.queue.push(id);
                Ok(())
            }
            // Staged by another layer's writer meanwhile: the same object, by its name.
            Err(rustix::io::Errno::EXIST) => Ok(()),
            Err(e) => Err(e).context("linking it into the staging directory"),
        }
    }

    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }

    pub(super) fn dir(&self) -> &std::fs::File {
        &self.dir
    }

    /// Takes an object of `size` bytes from the budget, as libostree does.
    fn take_blocks(&self, size: u64) -> Result<()> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        let mut budget = budget.lock().unwrap_or_else(|e| e.into_inner());
        let blocks = size / budget.block_size + 1;
        if blocks > budget.blocks {
            bail!(
                "{} would be exceeded, at least {} bytes requested",
                budget.reserve,
                blocks * budget.block_size
            );
        }
        budget.blocks -= blocks;
        Ok(())
    }
}

/// The 32 bytes a file object's checksum (64 lowercase hex digits) names.
fn object_id(checksum: &str) -> Result<[u8; 32]> {
    let mut id = [0u8; 32];
    if !is_checksum(checksum) || hex::decode_to_slice(checksum, &mut id).is_err() {
        bail!("{checksum:?} is not an object checksum");
    }
    Ok(id)
}

/// The file object `id`'s path under `objects/` (and the staging directory): `XX/rest.file`.
pub(super) fn object_name(id: &[u8; 32]) -> String {
    let hex = hex::encode(id);
    format!("{}/{}.file", &hex[..2], &hex[2..])
}

/// An anonymous file in `dir`, for writing only, with no permission bits beyond the owner's.
fn temporary_file(dir: &std::fs::File) -> std::io::Result<std::fs::File> {
    let file = rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    Ok(std::fs::File::from(file))
}

/// The name of the staging directory of the transaction this process holds open on the repo
/// whose `tmp/` is `tmp`: libostree keeps it open for the transaction, and it is the only
/// staging directory this process has open.
fn transaction_dir(tmp: &Path) -> Result<String> {
    let mut staging = Vec::new();
    for name in staging_dirs(tmp) {
        let name = name.to_string_lossy().into_owned();
        if name.ends_with("-lock") {
            continue;
        }
        if let Ok(meta) = std::fs::symlink_metadata(tmp.join(&name)) {
            if meta.is_dir() {
                staging.push((name, (meta.dev(), meta.ino())));
            }
        }
    }
    let mut open = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").context("listing /proc/self/fd")? {
        // Gone since it was listed (another thread closed it), or not statable: not a directory
        // this transaction holds.
        if let Ok(meta) = entry.and_then(|e| std::fs::metadata(e.path())) {
            if meta.is_dir() {
                open.insert((meta.dev(), meta.ino()));
            }
        }
    }
    let mut held = staging.into_iter().filter(|(_, id)| open.contains(id));
    match (held.next(), held.next()) {
        (Some((name, _)), None) => Ok(name),
        (None, _) => bail!("no staging directory of the repo is open"),
        (Some(_), Some(_)) => bail!("several staging directories of the repo are open"),
    }
}

/// What is left above the repo's min-free-space reserve, as libostree counts it when a
/// transaction begins (`ostree_repo_prepare_transaction`); None without a reserve.
fn budget(repo: &ostree::Repo, dir: &std::fs::File) -> Result<Option<Budget>> {
    let reserved = repo
        .min_free_space_bytes()
        .context("reading the repo's min-free-space reserve")?;
    // libostree checks nothing either without a reserve (and on a filesystem too small for one
    // block of it, an object larger than what is free fails on its own).
    if reserved == 0 {
        return Ok(None);
    }
    let config = repo.config();
    let size = config.string("core", "min-free-space-size").ok();
    let percent = config.string("core", "min-free-space-percent").ok();
    let stat = rustix::fs::fstatvfs(dir.as_fd()).context("reading the free space")?;
    let block_size = stat.f_bsize.max(1);
    let free = if nix::unistd::Uid::current().is_root() {
        stat.f_bfree
    } else {
        stat.f_bavail
    };
    let reserve = match (size, percent) {
        (Some(size), _) => format!("min-free-space-size {size}"),
        (None, Some(percent)) => format!("min-free-space-percent '{}%'", percent.trim()),
        (None, None) => "min-free-space-percent '3%'".to_string(),
    };
    Ok(Some(Budget {
        blocks: free.saturating_sub(reserved / block_size),
        block_size,
        reserve,
    }))
}

/// The (name, value) pairs of libostree's serialized xattrs (`a(ayay)`, each name with its
/// terminating NUL).
fn xattr_pairs(xattrs: &glib::Variant) -> Result<Vec<(CString, Vec<u8>)>> {
    (0..xattrs.n_children())
        .map(|i| {
            let pair = xattrs.child_value(i);
            let name = pair.child_value(0);
            let name = name.data();
            let name = name.strip_suffix(&[0]).unwrap_or(name);
            let name = CString::new(name).map_err(|_| anyhow!("an xattr name holds a NUL byte"))?;
            Ok((name, pair.child_value(1).data().to_vec()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
