//! `pivot finalize`: lets a reboot apply the deployment `--lock-finalization` staged, by
//! removing libostree's lock file (what rpm-ostree's `finalize-deployment` does on libostree
//! versions before `ostree_sysroot_change_finalization`, which Debian's 2022.7 lacks).

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::sysroot::deployments::{self, STAGED_LOCKED};

/// The staged deployment, unlocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlocked {
    pub commit: String,
    /// Whether it was locked (else there was nothing to unlock).
    pub was_locked: bool,
}

pub fn unlock(sysroot_path: &Path) -> Result<Unlocked> {
    let sysroot = deployments::open_sysroot(sysroot_path)?;
    let Some(staged) = sysroot.staged_deployment() else {
        bail!("no deployment is staged: there is nothing to finalize");
    };
    let was_locked = match std::fs::remove_file(STAGED_LOCKED) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("removing {STAGED_LOCKED}")),
    };
    Ok(Unlocked {
        commit: staged.csum().to_string(),
        was_locked,
    })
}
