//! A run whose target is already deployed: nothing is pulled or written; what is said and
//! recorded depends on where the target is (running, staged, staged locked, the default).

use anyhow::{Context, Result};

use super::{Outcome, Run, Source, PULLSPEC_FILE};
use crate::node::events;
use crate::sysroot::deployments::DeploymentInfo;

impl Run<'_> {
    /// The target is already deployed as `hit`.
    pub(super) fn settle(&mut self, hit: DeploymentInfo) -> Result<Outcome> {
        if !self.opts.karg_edits.is_empty() {
            tracing::warn!("kernel argument edits apply to a new deployment, and none is made: the target is already deployed");
        }
        self.attempt.commit = Some(hit.checksum.clone());
        self.target.commit = hit.checksum.clone();
        if let Some(version) = &hit.version {
            self.target.version = version.clone();
        }
        if self.target.digest.is_empty() {
            self.target.digest = hit.image_digest().unwrap_or_default().to_string();
        }
        if self.local.is_current(&hit) {
            events::info(
                events::UNCHANGED,
                &self.target,
                &format!("already at target {}: nothing to do", self.image),
            );
            if self.source == Source::File && !self.opts.check {
                self.confirm()?;
                return Ok(Outcome::Confirmed);
            }
            return Ok(Outcome::Unchanged);
        }
        if hit.finalization_locked && self.fleet_locked {
            events::info(
                events::UNCHANGED,
                &self.target,
                &format!(
                    "target {} is staged with finalization locked until the FleetLock server grants a reboot slot",
                    self.image
                ),
            );
            self.reboot_pending = self.local.booted;
            self.waiting = true;
            return Ok(Outcome::Unchanged);
        }
        if hit.finalization_locked {
            // A reboot would not apply it: rebooting for it would only loop.
            events::info(
                events::UNCHANGED,
                &self.target,
                &format!(
                    "target {} is staged with finalization locked; `pivot finalize` lets the next reboot apply it",
                    self.image
                ),
            );
            self.waiting = true;
            return Ok(Outcome::Unchanged);
        }
        events::info(
            events::UNCHANGED,
            &self.target,
            &format!(
                "target {} is already deployed ({}); it takes effect at the next boot",
                self.image,
                if hit.staged { "staged" } else { "default" }
            ),
        );
        self.reboot_pending = self.source == Source::File && self.local.booted;
        Ok(Outcome::Unchanged)
    }

    /// The node runs the pullspec file's target: the file has done its job.
    fn confirm(&mut self) -> Result<()> {
        let path = self.local.etc.join(PULLSPEC_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!("removed {}: the node runs its target", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        self.state.target = None;
        self.state.attempts = 0;
        Ok(())
    }
}
