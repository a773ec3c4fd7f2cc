//! libostree's staging directories (`tmp/staging-*`): an ended transaction keeps its objects
//! there for a later one to reuse, and a killed one leaves them behind for good. pivot removes
//! every one no live process holds after each import, so a refused image's objects and a
//! killed run's leftovers do not stay on the node.
// unsafe: the probe of libostree's staging-directory locks (fcntl, flock).
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The `staging-*` directories libostree keeps under the repo's `tmp/`.
pub fn staging_dirs(tmp: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("staging-"))
        .collect()
}

/// The prefix of the repos that hold earlier boots' staging directories while they are read
/// ([`super::adopt()`]).
pub(super) const ADOPT_PREFIX: &str = "pivot-adopt-";

/// The repos under `tmp` that hold earlier boots' staging directories, in name order.
pub(super) fn shells(tmp: &Path) -> Vec<PathBuf> {
    let mut repos: Vec<PathBuf> = std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(ADOPT_PREFIX))
        .map(|e| e.path())
        .collect();
    repos.sort();
    repos
}

/// Removes the staging directories (and their lock files) that no live process holds: an
/// ended transaction keeps its objects there for a later one to reuse, which a refused image
/// must not, and a killed run (its `<name>-lock` file left behind, unheld) leaves them for
/// good. libostree reuses such a directory only in the boot that made it, and deletes one only
/// after a day. A directory whose lock is held (a transaction of this or another program) is
/// left alone. Earlier boots' directories moved aside to be read ([`super::adopt()`]) go too.
pub fn remove_unheld_staging_dirs(tmp: &Path) {
    for shell in shells(tmp) {
        if let Err(e) = std::fs::remove_dir_all(&shell) {
            tracing::warn!("could not free {}: {e}", shown(&shell));
        }
    }
    for name in staging_dirs(tmp) {
        let name = name.to_string_lossy();
        if name.ends_with("-lock") {
            continue;
        }
        let lock = tmp.join(format!("{name}-lock"));
        if lock_held(&lock) {
            continue;
        }
        let dir = tmp.join(&*name);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::debug!("removed {}, which no transaction holds", shown(&dir)),
            Err(e) => tracing::warn!("could not free {}: {e}", shown(&dir)),
        }
        // Gone already (an ended transaction removes its own): nothing to do.
        let _ = std::fs::remove_file(&lock);
    }
}

/// `path`, an entry of the repo's `tmp/`, as messages name it: the repo is often open through a
/// descriptor, whose `/proc/self/fd/…` path means nothing to the reader.
pub(super) fn shown(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    format!("ostree/repo/tmp/{name}")
}

/// Whether a live process holds the lock libostree takes on `lock` (an open file description
/// lock, or on kernels without those a `flock`, as libglnx takes it). A missing file is not
/// held.
pub fn lock_held(lock: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(lock) else {
        return false;
    };
    // SAFETY: a zeroed flock is a valid value; fcntl fills it in.
    let mut probe: libc::flock = unsafe { std::mem::zeroed() };
    probe.l_type = libc::F_WRLCK as libc::c_short;
    probe.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: an open descriptor and a pointer to a flock that outlives the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut probe) } == 0 {
        return probe.l_type != libc::F_UNLCK as libc::c_short;
    }
    // SAFETY: an open descriptor; a lock taken here is released when `file` closes.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}
