//! Objects that an import killed by a reboot or a power cut had staged, taken back in the next
//! boot.
//!
//! libostree reuses a killed transaction's staging directory (`tmp/staging-<boot id>-*`) only
//! in the boot that made it: after a power cut, an object staged there may not have reached the
//! disk whole. So after a reboot the records and checkpoints pivot keeps (see
//! `crate::fetch::spools`) would name objects the new transaction lacks, and their layers would
//! be fetched again from the start. Instead, before the layers are imported, every object they
//! name is copied from the earlier boots' staging directories into the open transaction through
//! libostree, which checksums it as it writes it: one cut short fails and is left, and the
//! layer that named it is fetched again as before. The rest of such a directory goes with it at
//! the end of the import ([`super::remove_unheld_staging_dirs`]).
//!
//! To read them, a directory is moved under a repo of its own (`tmp/pivot-adopt-<its name>/`,
//! the directory as its `objects/`: a staging directory has the loose objects' layout). A run
//! killed during the copy finds that repo and goes on from it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ostree::gio;
use ostree::gio::prelude::FileExt;

use super::staging::{lock_held, shells, shown, staging_dirs, ADOPT_PREFIX};
use super::ObjectKey;

/// What [`adopt`] took.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Adopted {
    /// Objects copied into the transaction, their checksums verified.
    pub objects: usize,
    /// Objects found there that did not read back whole (left out).
    pub damaged: usize,
}

/// Copies the objects `wanted` names that the open transaction of `repo` lacks from the staging
/// directories of earlier boots (any not held by a live process and not named after this boot).
/// `wanted` is asked only when there are such directories.
pub(crate) fn adopt(
    repo: &ostree::Repo,
    wanted: impl FnOnce() -> HashSet<ObjectKey>,
) -> Result<Adopted> {
    let mut adopted = Adopted::default();
    let tmp = repo.path().path().unwrap_or_default().join("tmp");
    let sources = earlier_boots(repo, &tmp)?;
    if sources.is_empty() {
        return Ok(adopted);
    }
    let mut missing = Vec::new();
    for key in wanted() {
        if !repo.has_object(key.kind(), &key.checksum(), gio::Cancellable::NONE)? {
            missing.push(key);
        }
    }
    for source in sources {
        if missing.is_empty() {
            break;
        }
        let from = ostree::Repo::new_for_path(&source);
        from.open(gio::Cancellable::NONE)
            .with_context(|| format!("reading {}", shown(&source)))?;
        missing.retain(|key| {
            let checksum = key.checksum();
            match from.has_object(key.kind(), &checksum, gio::Cancellable::NONE) {
                Ok(true) => {}
                _ => return true,
            }
            match repo.import_object_from_with_trust(
                &from,
                key.kind(),
                &checksum,
                false,
                gio::Cancellable::NONE,
            ) {
                Ok(()) => {
                    adopted.objects += 1;
                    false
                }
                Err(e) => {
                    tracing::debug!("object {key} of {}: {e}", shown(&source));
                    adopted.damaged += 1;
                    true
                }
            }
        });
    }
    Ok(adopted)
}

/// The repos holding earlier boots' staging directories (in the mode of `repo`, whose objects
/// they are), made for those not yet moved.
fn earlier_boots(repo: &ostree::Repo, tmp: &Path) -> Result<Vec<PathBuf>> {
    let ours = format!("staging-{}-", boot_id()?);
    for name in staging_dirs(tmp) {
        let name = name.to_string_lossy();
        if name.ends_with("-lock")
            || name.starts_with(&ours)
            || lock_held(&tmp.join(format!("{name}-lock")))
            || !tmp.join(&*name).is_dir()
        {
            continue;
        }
        let shell = tmp.join(format!("{ADOPT_PREFIX}{name}"));
        // Left by a run killed before it moved the directory in: made again.
        if shell.exists() {
            std::fs::remove_dir_all(&shell)
                .with_context(|| format!("removing {}", shown(&shell)))?;
        }
        let made = ostree::Repo::new_for_path(&shell);
        made.create(repo.mode(), gio::Cancellable::NONE)
            .with_context(|| format!("making {}", shown(&shell)))?;
        let objects = shell.join("objects");
        std::fs::remove_dir_all(&objects)
            .and_then(|()| std::fs::rename(tmp.join(&*name), &objects))
            .with_context(|| format!("moving {name} into {}", shown(&shell)))?;
        let _ = std::fs::remove_file(tmp.join(format!("{name}-lock")));
    }
    Ok(shells(tmp))
}

/// This boot's id, as libostree names its staging directories after it.
fn boot_id() -> Result<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .context("reading this boot's id")?;
    Ok(id.trim().to_string())
}
