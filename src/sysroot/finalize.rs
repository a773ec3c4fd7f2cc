//! `pivot finalize`: lets a reboot apply the deployment `--lock-finalization` staged, by
//! removing libostree's lock file (what rpm-ostree's `finalize-deployment` does on libostree
//! versions before `ostree_sysroot_change_finalization`, which Debian's 2022.7 lacks).

use std::path::Path;

use anyhow::{Context, Result};

use crate::sysroot::deployments::{self, STAGED_LOCKED};

/// The staged deployment, unlocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlocked {
    pub commit: String,
    pub stateroot: String,
    /// The stateroot that runs (staging needs the running system), for
    /// [`crate::node::state::dir`].
    pub booted_stateroot: Option<String>,
    /// Whether it was locked (else there was nothing to unlock).
    pub was_locked: bool,
}

/// Unlocks the staged deployment, if one is staged; the GRUB boot-once is armed with the
/// unlock, since only now can the next reboot start it ([`crate::sysroot::grubenv`]).
pub fn unlock_staged(sysroot_path: &Path, boot_tries: u8) -> Result<Option<Unlocked>> {
    let sysroot = deployments::open_sysroot(sysroot_path)?;
    let Some(staged) = sysroot.staged_deployment() else {
        return Ok(None);
    };
    let was_locked = match std::fs::remove_file(STAGED_LOCKED) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("removing {STAGED_LOCKED}")),
    };
    if was_locked {
        crate::sysroot::deploy::arm_boot_once(&sysroot, boot_tries, staged.csum().as_str());
    }
    Ok(Some(Unlocked {
        commit: staged.csum().to_string(),
        stateroot: staged.osname().to_string(),
        booted_stateroot: deployments::booted_stateroot_of(&sysroot),
        was_locked,
    }))
}
