//! `pivot rollback`: the previous deployment becomes the default
//! ([`crate::sysroot::rollback`]), and the stateroot's state records it, so that status shows
//! it and the first-boot pivot does not move the node straight back to the target the admin
//! turned away from: that target is held until `/etc/pivot/image-pullspec` names another one,
//! or an admin runs `pivot` by hand.

use std::path::Path;

use anyhow::{Context, Result};

use crate::node::events::{self, Target};
use crate::node::state::{self, StateFile};
use crate::sysroot::deployments;
use crate::sysroot::rollback::{self, RolledBack};

/// What `pivot rollback` did, and whether it could be recorded.
pub struct Report {
    pub done: RolledBack,
    /// Why the rollback could not be recorded, if it could not: then the first-boot pivot would
    /// move the node forward again at the next boot, and pivot must not reboot.
    pub unrecorded: Option<String>,
}

pub fn run(sysroot_path: &Path) -> Result<Report> {
    let sysroot = deployments::open_sysroot(sysroot_path)?;
    let booted = deployments::booted_stateroot_of(&sysroot);
    let done = rollback::rollback(&sysroot)?;
    // A boot-once attempt pivot armed at the update left behind must not send the next boot
    // anywhere; a counter someone else armed (greenboot) stays theirs.
    if let Err(e) = crate::sysroot::grubenv::settle(sysroot_path) {
        tracing::warn!("settling GRUB's boot-once attempt: {e:#}");
    }
    let state_file = StateFile::for_stateroot(sysroot_path, booted.as_deref(), &done.stateroot);
    // What the first-boot pivot would read at the next boot: the pullspec file of the
    // deployment now the default (its /etc may still name the target the node left).
    let pullspec_file = std::fs::read_to_string(done.to_etc.join(super::PULLSPEC_FILE))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    let recorded = state_file.load().and_then(|mut state| {
        state.rollback = Some(state::Rollback {
            at: state::now(),
            from: done.from.clone(),
            to: done.to.clone(),
            held: pullspec_file.or(state.target.clone()),
        });
        state_file.save(&state)
    });
    let unrecorded = recorded
        .with_context(|| format!("recording the rollback in {}", state_file.path().display()))
        .err()
        .map(|e| {
            tracing::warn!("{e:#}");
            format!("{e:#}")
        });
    let target = Target {
        commit: done.to.clone(),
        ..Default::default()
    };
    events::info(
        events::ROLLED_BACK,
        &target,
        &format!(
            "rolled back: {} is the default deployment again, instead of {}",
            done.to, done.from
        ),
    );
    Ok(Report { done, unrecorded })
}
