//! How a pivot run ended, or that it has not: one vocabulary, spelled the same in the state
//! file and `pivot status --json` (`last.outcome`), the journal (`PIVOT_OUTCOME` of the
//! [`crate::node::events::FINISHED`] event) and the `--progress-fd` stream (`done.outcome`), so that a
//! program reading any of them needs one table. Values are only ever added.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Started and not ended: the run is going on, or it was killed (the next run, or
    /// `pivot confirm` at the next boot, tells what became of it).
    Running,
    /// A new deployment was staged on the booted system; it takes effect at the next boot.
    Staged,
    /// A new deployment was written into a sysroot that is not the booted one (image builds).
    Deployed,
    /// `--download-only`: the image is in the repo, ready to be deployed without the registry.
    Downloaded,
    /// The target was already deployed (booted, staged or default): nothing changed.
    Unchanged,
    /// `--check`: the target differs from what is deployed (at target, a check ends
    /// `unchanged`). Checks are not recorded in the state file.
    UpdateAvailable,
    /// The node runs what pivot deployed for the pullspec file, which has done its job: set
    /// at boot by `pivot confirm`, or by a run that finds the node already on its target.
    Confirmed,
    /// The run failed, or the node booted without the deployment pivot made; `error` says why.
    Failed,
    /// The node booted what pivot deployed and was taken back to the deployment before it by
    /// itself: a health check failed there (`health` in the status says which), or on GRUB the
    /// target never came up and the bootloader fell back. Set by `pivot confirm` at the boot
    /// that runs the previous deployment again.
    RolledBack,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Running,
        Outcome::Staged,
        Outcome::Deployed,
        Outcome::Downloaded,
        Outcome::Unchanged,
        Outcome::UpdateAvailable,
        Outcome::Confirmed,
        Outcome::Failed,
        Outcome::RolledBack,
    ];

    /// The value as every output spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Running => "running",
            Outcome::Staged => "staged",
            Outcome::Deployed => "deployed",
            Outcome::Downloaded => "downloaded",
            Outcome::Unchanged => "unchanged",
            Outcome::UpdateAvailable => "update-available",
            Outcome::Confirmed => "confirmed",
            Outcome::Failed => "failed",
            Outcome::RolledBack => "rolled-back",
        }
    }

    /// A new deployment waits for the next boot.
    pub fn made_deployment(self) -> bool {
        matches!(self, Outcome::Staged | Outcome::Deployed)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_spells_every_value_as_displayed() {
        for outcome in Outcome::ALL {
            let json = serde_json::to_value(outcome).unwrap();
            assert_eq!(json, outcome.as_str());
            assert_eq!(serde_json::from_value::<Outcome>(json).unwrap(), outcome);
        }
        // ALL holds each value once.
        let distinct: std::collections::HashSet<_> = Outcome::ALL.iter().collect();
        assert_eq!(distinct.len(), Outcome::ALL.len());
    }

    /// Each value, recorded in a state file, reads back the same in `pivot status --json` and
    /// ends the progress stream spelled the same (the integration tests drive real runs to
    /// every value a host can reach; `staged` and `running` need a booted node or a kill).
    #[test]
    fn every_value_round_trips_through_the_state_file_status_and_progress_stream() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        for outcome in Outcome::ALL {
            let file = crate::node::state::StateFile::for_stateroot(dir.path(), None, "os");
            let mut attempt = crate::node::state::Attempt::new(
                "quay.io/os:1",
                crate::api::status::PullspecSource::File,
            );
            attempt.outcome = outcome;
            let state = crate::node::state::State {
                last: Some(attempt),
                ..Default::default()
            };
            file.save(&state).unwrap();
            let status = crate::api::status::Status {
                api_version: crate::api::API_VERSION.into(),
                kind: crate::api::status::KIND.into(),
                version: crate::api::status::FORMAT_VERSION,
                sysroot: "/".into(),
                deployments: Vec::new(),
                pivot: [(
                    "os".to_string(),
                    crate::node::status::published(file.load().unwrap()),
                )]
                .into(),
            };
            let json = serde_json::to_value(&status).unwrap();
            assert_eq!(json["pivot"]["os"]["last"]["outcome"], outcome.as_str());

            let stream = dir.path().join("progress.jsonl");
            let out = std::fs::File::create(&stream).unwrap();
            crate::node::progress::Progress::new(Some(out.as_raw_fd()))
                .unwrap()
                .finish(outcome);
            let mut text = String::new();
            std::fs::File::open(&stream)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            let mut lines = text.lines();
            let first: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
            assert_eq!(first["apiVersion"], crate::api::API_VERSION);
            let done: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
            assert_eq!(done["outcome"], outcome.as_str());
        }
    }
}
