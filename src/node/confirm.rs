//! The next-boot check. A pivot on the booted system only stages its deployment; whether the
//! node then really runs it depends on `ostree-finalize-staged.service` at shutdown and on the
//! bootloader. `pivot confirm` (run early at every boot by `pivot-confirm.service`) compares
//! what runs with the last attempt recorded in the state file and records the verdict there:
//! `confirmed`, or `failed` with the reason, which `pivot status` and the journal then show.
//! A verdict is recorded once: the next boots find no attempt awaiting confirmation.

use std::path::Path;

use anyhow::{Context, Result};

use crate::sysroot::deployments::{self, DeploymentInfo};
use crate::node::events::Target;
use crate::api::outcome::Outcome;
use crate::node::state::StateFile;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The node runs the commit the last pivot deployed.
    Confirmed { target: Target },
    /// It does not; `reason` says what happened instead.
    NotRunning { target: Target, reason: String },
    /// The last pivot staged its deployment locked (`--lock-finalization`) and the node
    /// rebooted before `pivot finalize`: libostree dropped it, as it keeps staged deployments in
    /// /run. Nothing failed; the caller stages `pinned` again, locked, from the repo.
    LockedDropped { target: Target, pinned: String },
    /// No pivot awaits confirmation.
    Nothing,
}

/// Checks the stateroot that runs (the booted one; on a sysroot that is not booted, the default
/// deployment's, which is what would boot) and records the verdict in its state file, but a
/// `confirmed` only with `record_confirmed`: a caller with health checks to run records it once
/// they pass, so a boot cut short during them runs them again.
pub fn confirm(sysroot_path: &Path, record_confirmed: bool) -> Result<Verdict> {
    let sysroot = deployments::open_sysroot(sysroot_path)?;
    let list = deployments::list(&sysroot)?;
    let Some(running) = list
        .iter()
        .find(|d| d.booted)
        .or_else(|| list.iter().find(|d| d.default))
    else {
        return Ok(Verdict::Nothing);
    };
    let state_file = StateFile::for_stateroot(
        sysroot_path,
        deployments::booted_stateroot(&list),
        &running.stateroot,
    );
    let mut state = state_file.load()?;
    let Some(last) = state.last.as_mut() else {
        return Ok(Verdict::Nothing);
    };
    let Some(commit) = last
        .commit
        .clone()
        .filter(|_| last.outcome.made_deployment())
    else {
        return Ok(Verdict::Nothing);
    };
    let deployed = list.iter().find(|d| d.checksum == commit);
    let target = Target {
        image: deployed
            .and_then(|d| d.image.clone())
            .unwrap_or_else(|| last.pullspec.clone()),
        digest: last.digest.clone().unwrap_or_default(),
        version: deployed.and_then(|d| d.version.clone()).unwrap_or_default(),
        commit: commit.clone(),
    };
    if last.locked && deployed.is_none() && running.checksum != commit {
        let pinned = crate::fetch::reference::ImageRef::parse(&last.pullspec)
            .ok()
            .zip(last.digest.as_deref())
            .map(|(image, digest)| image.with_digest(digest).to_string());
        if let Some(pinned) = pinned {
            return Ok(Verdict::LockedDropped { target, pinned });
        }
    }
    let verdict = if running.checksum == commit {
        if !record_confirmed {
            return Ok(Verdict::Confirmed { target });
        }
        last.outcome = Outcome::Confirmed;
        last.error = None;
        Verdict::Confirmed { target }
    } else {
        let reason = not_running_reason(&list, running, &commit);
        last.outcome = Outcome::Failed;
        last.error = Some(reason.clone());
        Verdict::NotRunning { target, reason }
    };
    state_file
        .save(&state)
        .with_context(|| format!("recording the verdict in {}", state_file.path().display()))?;
    Ok(verdict)
}

fn not_running_reason(list: &[DeploymentInfo], running: &DeploymentInfo, commit: &str) -> String {
    let what = format!(
        "the node runs {} (version {}), not {commit} that pivot deployed",
        running.checksum,
        running.version.as_deref().unwrap_or("unknown")
    );
    if list.iter().any(|d| d.checksum == commit) {
        format!("{what}: its deployment exists but did not boot (the bootloader chose another entry, or the boot was interrupted)")
    } else {
        format!("{what}: its deployment was never written (ostree-finalize-staged.service failed at shutdown; see `journalctl -b -1 -u ostree-finalize-staged.service`)")
    }
}
