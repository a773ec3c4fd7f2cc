//! `pivot confirm`, at every boot before kubelet: the verdict on the last pivot
//! ([`crate::node::confirm`]), then what follows from it.
//!
//! - On the first boot of a target pivot deployed, the health checks run
//!   ([`crate::node::health`]). One fails: the previous deployment becomes the default (as
//!   `pivot rollback`, holding the pullspec file's target) and the caller reboots into it, once
//!   per target: a target pivot already left once stays, failed, when it fails again.
//! - At the boot after that, the node runs the previous deployment: the attempt is recorded
//!   `rolled-back`.
//! - On GRUB ([`crate::sysroot::grubenv`]), a boot-once attempt pivot armed is settled: after
//!   a good boot the new entry stays; after GRUB fell back from a target that never came up,
//!   the previous deployment is made the default for good and the attempt is recorded
//!   `rolled-back` too. A counter pivot did not arm (greenboot's) is left as it is, `-1`
//!   included: greenboot settles it after its own health checks and rolls back from `-1`
//!   itself (`pivot-confirm.service` runs after its fallback check), so pivot neither switches
//!   greenboot's rollback off nor undoes it with a second one.
//!
//! The node reboots for a rollback whatever the fleet's reboot strategy: the target is unfit to
//! run, and the node is still down for its update (with `fleet_lock` it still holds its slot,
//! which it gives back at the boot that runs the previous deployment).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::api::outcome::Outcome;
use crate::node::confirm::{self, Verdict};
use crate::node::events::Target;
use crate::node::health::{self, Failure};
use crate::node::state::{self, HealthFailure, StateFile};
use crate::sysroot::deployments;
use crate::sysroot::grubenv::{self, BootOnce};

/// What `pivot confirm` found and did.
#[derive(Debug)]
pub enum Done {
    /// The verdict, with nothing more to do (health checks, if any, passed).
    Verdict(Verdict),
    /// A health check failed on the target. `rolled_back_to` is the deployment now the
    /// default (reboot into it), or `None` with `why_not`.
    HealthFailed {
        target: Target,
        failure: Failure,
        rolled_back_to: Option<String>,
        why_not: Option<String>,
        booted: bool,
    },
    /// The node runs the deployment before the target it was taken back from.
    RolledBack { target: Target, reason: String },
}

pub fn confirm(sysroot: &Path, health_timeout: Duration) -> Result<Done> {
    // Read before the verdict is recorded: a fallback is judged with the attempt.
    let boot_once = grubenv::boot_once(sysroot).unwrap_or_else(|e| {
        tracing::warn!("{e:#}");
        BootOnce::Idle
    });
    // No system to find (no deployment) is no checks: the verdict then says what there is.
    let etc = super::system_etc(sysroot).ok();
    let checks = match &etc {
        Some(etc) => !health::list(etc)?.is_empty(),
        None => false,
    };
    let verdict = confirm::confirm(sysroot, !checks)?;
    match verdict {
        Verdict::Confirmed { target } if checks => {
            let etc = etc.expect("checks were listed from it");
            let env = health::CheckEnv {
                commit: target.commit.clone(),
                image: target.image.clone(),
                timeout: health_timeout,
            };
            match health::run(&etc, &env)? {
                None => {
                    settle(sysroot);
                    record_passed(sysroot)?;
                    Ok(Done::Verdict(Verdict::Confirmed { target }))
                }
                Some(failure) => health_failed(sysroot, target, failure),
            }
        }
        Verdict::Confirmed { .. } => {
            settle(sysroot);
            record_passed(sysroot)?;
            Ok(Done::Verdict(verdict))
        }
        Verdict::NotRunning { target, reason } if boot_once == BootOnce::FellBack => {
            fell_back(sysroot, target, &reason)
        }
        Verdict::NotRunning { .. } => {
            settle(sysroot);
            Ok(Done::Verdict(verdict))
        }
        Verdict::LockedDropped { .. } => Ok(Done::Verdict(verdict)),
        Verdict::Nothing => back_after_health(sysroot),
    }
}

/// A boot-once attempt pivot armed ends whichever way it went; a failure to write the block is
/// logged, as the verdict stands either way.
fn settle(sysroot: &Path) {
    match grubenv::settle(sysroot) {
        Ok(BootOnce::Foreign) => tracing::info!(
            "GRUB's boot counter was armed by another tool (greenboot): left for it to settle"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("settling GRUB's boot-once attempt: {e:#}"),
    }
}

/// The state file of the stateroot that runs (or boots next).
fn running_state(sysroot: &Path) -> Result<(StateFile, String)> {
    let sysroot_ = deployments::open_sysroot(sysroot)?;
    let list = deployments::list(&sysroot_)?;
    let running = list
        .iter()
        .find(|d| d.booted)
        .or_else(|| list.iter().find(|d| d.default))
        .context("the sysroot has no deployments")?;
    Ok((
        StateFile::for_stateroot(
            sysroot,
            deployments::booted_stateroot(&list),
            &running.stateroot,
        ),
        running.checksum.clone(),
    ))
}

/// The checks passed: the attempt is confirmed (if the verdict waited for them) and an earlier
/// target's failure is no longer news.
fn record_passed(sysroot: &Path) -> Result<()> {
    let (file, _) = running_state(sysroot)?;
    let mut state = file.load()?;
    let mut changed = state.health.take().is_some();
    if let Some(last) = state.last.as_mut().filter(|l| l.outcome != Outcome::Confirmed) {
        last.outcome = Outcome::Confirmed;
        last.error = None;
        changed = true;
    }
    if changed {
        file.save(&state)
            .with_context(|| format!("recording the verdict in {}", file.path().display()))?;
    }
    Ok(())
}

fn health_failed(sysroot: &Path, target: Target, failure: Failure) -> Result<Done> {
    let (file, _) = running_state(sysroot)?;
    let already = file.load()?.auto_rolled_back.contains(&target.commit);
    let (rolled_back_to, why_not, booted) = if already {
        let why = format!(
            "pivot rolled the node back from {} once already: it stays on it",
            target.commit
        );
        (None, Some(why), false)
    } else {
        match super::rollback::run(sysroot) {
            Ok(report) => (Some(report.done.to.clone()), None, report.done.booted),
            Err(e) => (None, Some(format!("{e:#}")), false),
        }
    };
    if rolled_back_to.is_some() || already {
        // Whichever entry the node boots next must be the default, not a boot-once fallback.
        settle(sysroot);
    }
    let mut state = file.load()?;
    if let Some(last) = state.last.as_mut() {
        last.outcome = Outcome::Failed;
        last.error = Some(match &why_not {
            None => format!("{}; rolled back", failure.summary()),
            Some(why) => format!("{}; not rolled back: {why}", failure.summary()),
        });
    }
    if rolled_back_to.is_some() {
        state.auto_rolled_back.push(target.commit.clone());
        let excess = state
            .auto_rolled_back
            .len()
            .saturating_sub(state::AUTO_ROLLED_BACK_KEPT);
        state.auto_rolled_back.drain(..excess);
    }
    state.health = Some(HealthFailure {
        at: state::now(),
        commit: target.commit.clone(),
        check: failure.check.clone(),
        how: failure.how.clone(),
        output_tail: failure.output_tail.clone(),
        rolled_back_to: rolled_back_to.clone(),
    });
    file.save(&state)
        .with_context(|| format!("recording the failed health check in {}", file.path().display()))?;
    Ok(Done::HealthFailed {
        target,
        failure,
        rolled_back_to,
        why_not,
        booted,
    })
}

/// The boot after a health rollback: the node runs the deployment it went back to.
fn back_after_health(sysroot: &Path) -> Result<Done> {
    let (file, running) = running_state(sysroot)?;
    let mut state = file.load()?;
    let Some(health) = state.health.clone() else {
        return Ok(Done::Verdict(Verdict::Nothing));
    };
    let Some(last) = state.last.as_mut() else {
        return Ok(Done::Verdict(Verdict::Nothing));
    };
    let pending = last.outcome == Outcome::Failed
        && last.commit.as_deref() == Some(health.commit.as_str())
        && health.rolled_back_to.as_deref() == Some(running.as_str());
    if !pending {
        return Ok(Done::Verdict(Verdict::Nothing));
    }
    last.outcome = Outcome::RolledBack;
    let target = Target {
        image: last.pullspec.clone(),
        digest: last.digest.clone().unwrap_or_default(),
        commit: health.commit.clone(),
        version: String::new(),
    };
    let reason = format!(
        "health check {} {} on {}: the node runs {} again",
        health.check, health.how, health.commit, running
    );
    file.save(&state)?;
    Ok(Done::RolledBack { target, reason })
}

/// GRUB booted the target once, it never reached `pivot confirm`, and GRUB fell back: the
/// previous deployment becomes the default for good (so the next boot does not try the target
/// again), then the attempt is settled and recorded.
fn fell_back(sysroot: &Path, target: Target, reason: &str) -> Result<Done> {
    let written = deployments::list(&deployments::open_sysroot(sysroot)?)?
        .iter()
        .any(|d| d.checksum == target.commit && !d.booted);
    if !written {
        // Not the target GRUB fell back from: it was never written (its verdict says why).
        settle(sysroot);
        return Ok(Done::Verdict(Verdict::NotRunning {
            target,
            reason: reason.to_string(),
        }));
    }
    let report = super::rollback::run(sysroot).context(
        "GRUB fell back from the target: making the previous deployment the default",
    )?;
    settle(sysroot);
    let (file, running) = running_state(sysroot)?;
    let mut state = file.load()?;
    let reason = format!(
        "the target did not come up: GRUB booted it once, then fell back to {running} ({reason})"
    );
    if let Some(last) = state.last.as_mut() {
        last.outcome = Outcome::RolledBack;
        last.error = Some(reason.clone());
    }
    state.auto_rolled_back.push(target.commit.clone());
    file.save(&state)?;
    tracing::info!(
        "{} is the default deployment again, instead of {}",
        report.done.to,
        report.done.from
    );
    Ok(Done::RolledBack { target, reason })
}
