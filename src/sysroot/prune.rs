//! Pruning the repo after a deployment is written: deleting the objects no ref and no deployment
//! reaches any more (a rolled-off deployment's commit, an import whose deployment never came).
//!
//! libostree's own cleanup prunes with two GLib hash tables, every reachable object's name and
//! every object of the repo, about 450 bytes per object: 20 MiB more at 1 GB, 40 MiB at 2.5 GB,
//! the largest part of pivot's peak memory. Here the mark is a set of 33-byte keys (type and
//! binary checksum) and the sweep reads `objects/` one directory at a time, so a 1 GB image costs
//! about 2 MiB. What is reachable follows libostree's sysroot cleanup: the commits that refs
//! (heads, remotes, mirrors) and deployments point to, their detached metadata and trees — not
//! their parents. Objects of a kind this does not know are left alone, and when any reachable
//! tree cannot be read, nothing is deleted.
// unsafe: libostree's repo lock calls, which the Rust bindings do not offer.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, Result};
use ostree::gio::prelude::FileExt;
use ostree::glib::translate::ToGlibPtr;
use ostree::{gio, ObjectType};

use crate::import::commit_walk::walk_commit;
use crate::import::{object_name, object_type, ObjectKey};

/// What a prune deleted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub objects: u64,
    pub bytes: u64,
}

/// Deletes every loose object of the sysroot's repo that no ref and no deployment reaches.
/// The caller holds the sysroot lock; the repo's exclusive lock keeps other writers out.
pub fn prune(sysroot: &ostree::Sysroot, repo: &ostree::Repo) -> Result<Pruned> {
    let _lock = RepoLock::exclusive(repo)?;
    let refs = repo
        .list_refs_ext(
            None,
            ostree::RepoListRefsExtFlags::NONE,
            gio::Cancellable::NONE,
        )
        .context("listing the repo's refs")?;
    // The container store's layer refs first: an object set is one flat tree of every object
    // of its layer, the largest dirtree there is, and read while the reachable set is still
    // small it adds nothing to the peak (read last, it added several MiB at 1 GB).
    let (mut roots, mut others): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for (name, commit) in refs {
        match name.starts_with(crate::import::store::LAYER_PREFIX) {
            true => roots.push(commit.to_string()),
            false => others.push(commit.to_string()),
        }
    }
    others.extend(sysroot.deployments().iter().map(|d| d.csum().to_string()));
    others.extend(sysroot.staged_deployment().map(|d| d.csum().to_string()));
    roots.sort();
    others.sort();
    roots.extend(others);
    let mut seen = HashSet::new();
    roots.retain(|c| seen.insert(c.clone()));

    let mut reachable: HashSet<ObjectKey> = HashSet::new();
    for commit in &roots {
        if !repo.has_object(ObjectType::Commit, commit, gio::Cancellable::NONE)? {
            continue; // A ref to a commit that is not here reaches nothing here.
        }
        reachable.insert(ObjectKey::parse(ObjectType::CommitMeta, commit)?);
        walk_commit(repo, commit, |kind, checksum| {
            Ok(reachable.insert(ObjectKey::parse(kind, checksum)?))
        })
        .with_context(|| format!("reading what commit {commit} reaches"))?;
    }

    let objects = repo
        .path()
        .path()
        .context("the repo's path")?
        .join("objects");
    // Commits first: a run killed halfway then leaves only objects no commit names, never a
    // commit with holes that `ostree fsck` would report.
    let mut pruned = Pruned::default();
    sweep(repo, &objects, &reachable, true, &mut pruned)?;
    sweep(repo, &objects, &reachable, false, &mut pruned)?;
    Ok(pruned)
}

/// Deletes the unreachable commits (`commits`) or the other unreachable objects, reading
/// `objects/` one directory at a time.
fn sweep(
    repo: &ostree::Repo,
    objects: &Path,
    reachable: &HashSet<ObjectKey>,
    commits: bool,
    pruned: &mut Pruned,
) -> Result<()> {
    for prefix in 0..=255u8 {
        let dir = objects.join(format!("{prefix:02x}"));
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((checksum, kind)) = object_file(prefix, name) else {
                continue;
            };
            if (kind == ObjectType::Commit) != commits {
                continue;
            }
            if reachable.contains(&ObjectKey::parse(kind, &checksum)?) {
                continue;
            }
            // Gone already: the detached metadata of a commit deleted before it.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            repo.delete_object(kind, &checksum, gio::Cancellable::NONE)
                .with_context(|| {
                    format!(
                        "deleting {checksum}.{}",
                        ostree::object_type_to_string(kind)
                    )
                })?;
            pruned.objects += 1;
            pruned.bytes += meta.len();
        }
    }
    Ok(())
}

/// The object file `name` in `objects/<prefix>/` → its checksum and type; None for anything
/// else (other kinds of object, temporary files).
fn object_file(prefix: u8, name: &str) -> Option<(String, ObjectType)> {
    let rel = format!("{prefix:02x}/{name}");
    let (checksum, ext) = object_name(&rel)?;
    Some((checksum, object_type(ext)?))
}

/// libostree's exclusive repo lock, released when dropped (on the thread that took it, as
/// libostree's lock stack is per thread).
struct RepoLock<'r>(&'r ostree::Repo);

/// `ostree_repo_lock_push` or `ostree_repo_lock_pop`.
type LockCall = unsafe extern "C" fn(
    *mut ostree::ffi::OstreeRepo,
    ostree::ffi::OstreeRepoLockType,
    *mut gio::ffi::GCancellable,
    *mut *mut ostree::glib::ffi::GError,
) -> ostree::glib::ffi::gboolean;

impl<'r> RepoLock<'r> {
    fn exclusive(repo: &'r ostree::Repo) -> Result<Self> {
        Self::call(repo, ostree::ffi::ostree_repo_lock_push).context("locking the repo")?;
        Ok(RepoLock(repo))
    }

    fn call(repo: &ostree::Repo, f: LockCall) -> Result<(), ostree::glib::Error> {
        let mut error = std::ptr::null_mut();
        // SAFETY: a valid repo, no cancellable, an out-pointer for the error, which libostree
        // hands over when it fails.
        unsafe {
            let ok = f(
                repo.to_glib_none().0,
                ostree::ffi::OSTREE_REPO_LOCK_EXCLUSIVE,
                std::ptr::null_mut(),
                &mut error,
            );
            match ok {
                0 => Err(ostree::glib::translate::from_glib_full(error)),
                _ => Ok(()),
            }
        }
    }
}

impl Drop for RepoLock<'_> {
    fn drop(&mut self) {
        if let Err(e) = Self::call(self.0, ostree::ffi::ostree_repo_lock_pop) {
            tracing::warn!("unlocking the repo: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_files_are_told_from_other_files() {
        let rest = "a".repeat(62);
        let checksum = format!("0a{rest}");
        assert_eq!(
            object_file(0x0a, &format!("{rest}.dirtree")),
            Some((checksum.clone(), ObjectType::DirTree))
        );
        assert_eq!(
            object_file(0x0a, &format!("{rest}.filez")),
            Some((checksum, ObjectType::File))
        );
        assert_eq!(object_file(0x0a, &format!("{rest}.payload-link")), None);
        assert_eq!(object_file(0x0a, &format!("{rest}.commit-tombstone")), None);
        assert_eq!(object_file(0x0a, "tmpobject.file"), None);
        assert_eq!(object_file(0x0a, &format!("{}.file", "g".repeat(62))), None);
    }

    #[test]
    fn keys_are_the_binary_checksum() {
        let checksum = format!("{}ff", "0".repeat(62));
        let file = ObjectKey::parse(ObjectType::File, &checksum).unwrap();
        assert_eq!(file.kind(), ObjectType::File);
        assert_eq!(file.checksum(), checksum);
        assert!(ObjectKey::parse(ObjectType::File, "abc").is_err());
        assert!(ObjectKey::parse(ObjectType::File, &"z".repeat(64)).is_err());
    }
}
