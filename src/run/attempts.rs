//! The reboot-loop guard: runs from the pullspec file count attempts at its target, and after
//! [`MAX_ATTEMPTS`] pivot gives up instead of pulling and rebooting again.

use anyhow::{bail, Result};

use super::Run;
use crate::node::state::MAX_ATTEMPTS;

impl Run<'_> {
    /// Counts a pullspec-file run that starts without the node on its target.
    pub(super) fn count_attempt(&mut self) -> Result<()> {
        // A locked deployment never boots before its unlock, so reboots while it waits (for a
        // FleetLock slot, or `pivot finalize`) are no attempts at it: counting them would give
        // up on a target that never failed. Unlocking records the attempt unlocked.
        if self
            .state
            .last
            .as_ref()
            .is_some_and(|l| l.locked && l.outcome.made_deployment())
        {
            tracing::info!(
                "{} waits staged with finalization locked: not counted as another attempt",
                self.image
            );
            return Ok(());
        }
        if self.state.attempts >= MAX_ATTEMPTS {
            let last = self
                .state
                .last
                .as_ref()
                .and_then(|a| a.error.clone())
                .unwrap_or_else(|| "the node did not boot into it".into());
            bail!(
                "giving up on {} after {MAX_ATTEMPTS} attempts (last: {last}); run `pivot {}` by hand, or remove {} to try again",
                self.image,
                self.image,
                self.state_file.path().display()
            );
        }
        self.state.attempts += 1;
        tracing::info!(
            "pivot attempt {}/{MAX_ATTEMPTS} to {}",
            self.state.attempts,
            self.image
        );
        let mut snapshot = self.state.clone();
        snapshot.last = Some(self.attempt.clone());
        // Saved before any work, so a run that dies (or reboots) still counts. A run that
        // cannot count itself may still deploy, but must not reboot (see `Report::unrecorded`).
        if let Err(e) = self.state_file.save(&snapshot) {
            tracing::warn!("could not record the attempt: {e:#}");
            self.unrecorded = Some(format!("{e:#}"));
        }
        Ok(())
    }
}
