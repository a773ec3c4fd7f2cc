//! Fleets: when a node that has staged an update reboots into it. The fleet decides, through
//! the strategy the admins configure ([`config`], `/etc/pivot/config.d/*.toml`):
//!
//! - `immediate`: at once (the default, and pivot's behaviour before strategies existed);
//! - `fleet_lock`: once a FleetLock server ([`fleet_lock`]: airlock on etcd, fleetlock on
//!   Kubernetes) grants a reboot slot; until then the update stays staged and pivot asks again
//!   with backoff, logging each refusal. The node gives the slot back at its next boot, in
//!   `pivot confirm`, whatever became of the update, so one failed node never holds up the rest;
//! - `sentinel`: never by itself; `/var/run/reboot-required` tells kured, which drains the node
//!   and reboots it when its own lock allows (as for package updates);
//! - `never`: never by itself (the machine-config daemon's drain-then-reboot, or an admin).
//!
//! The node's FleetLock id is derived from its machine ID ([`machine_id`]).

pub mod config;
pub mod fleet_lock;
pub mod machine_id;

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::node::events::Target;
use crate::node::reboot;
use config::Strategy;
use fleet_lock::{Answer, Client};

/// The file kured watches (its `--reboot-sentinel` default).
pub const SENTINEL: &str = "/var/run/reboot-required";
/// Waits between FleetLock requests grow from the first to the last.
const FIRST_WAIT: Duration = Duration::from_secs(2);
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Reboots into the staged update as `strategy` says; `etc` is the running system's `/etc`.
/// Returns once the reboot was asked for, or when the strategy leaves it to someone else.
pub async fn reboot(strategy: &Strategy, etc: &Path, target: &Target) -> Result<()> {
    reboot_or_leave(strategy, etc, target, Path::new(SENTINEL)).await
}

/// [`reboot()`], with kured's sentinel at `sentinel`.
async fn reboot_or_leave(
    strategy: &Strategy,
    etc: &Path,
    target: &Target,
    sentinel: &Path,
) -> Result<()> {
    match strategy {
        Strategy::Immediate => reboot::reboot(target, "rebooting into the new deployment"),
        Strategy::Never => {
            tracing::info!(
                "not rebooting (reboot strategy never): the new deployment starts at the next reboot"
            );
            Ok(())
        }
        Strategy::Sentinel => {
            std::fs::write(sentinel, b"")
                .with_context(|| format!("writing the reboot sentinel {}", sentinel.display()))?;
            tracing::info!(
                "not rebooting (reboot strategy sentinel): wrote {}, for kured to drain and reboot the node",
                sentinel.display()
            );
            Ok(())
        }
        Strategy::FleetLock(lock) => {
            let client = Client::new(lock, machine_id::of_etc(etc)?)?;
            let mut wait = FIRST_WAIT;
            loop {
                let why = match client.pre_reboot().await {
                    Ok(Answer::Granted) => break,
                    Ok(refused) => format!("the server refuses: {refused}"),
                    Err(e) => format!("{e:#}"),
                };
                tracing::warn!(
                    "waiting for a reboot slot from the FleetLock server {} (id {}, group {}): {why}; asking again in {} s",
                    client.base_url,
                    client.id,
                    client.group,
                    wait.as_secs()
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_WAIT);
            }
            tracing::info!(
                "the FleetLock server {} granted a reboot slot to {}",
                client.base_url,
                client.id
            );
            reboot::reboot(
                target,
                "rebooting into the new deployment (FleetLock slot granted)",
            )
        }
    }
}

/// At boot, with the `fleet_lock` strategy: gives the node's reboot slot back, asking again
/// with backoff for up to `budget`. Other strategies have nothing to give back.
pub async fn steady_state(strategy: &Strategy, etc: &Path, budget: Duration) -> Result<()> {
    let Strategy::FleetLock(lock) = strategy else {
        return Ok(());
    };
    let client = Client::new(lock, machine_id::of_etc(etc)?)?;
    let deadline = tokio::time::Instant::now() + budget;
    let mut wait = FIRST_WAIT;
    loop {
        let why = match client.steady_state().await {
            Ok(Answer::Granted) => {
                tracing::info!(
                    "reported steady state to the FleetLock server {} (id {}): any reboot slot held is released",
                    client.base_url,
                    client.id
                );
                return Ok(());
            }
            Ok(refused) => format!("the server refuses: {refused}"),
            Err(e) => format!("{e:#}"),
        };
        if tokio::time::Instant::now() + wait > deadline {
            bail!(
                "could not report steady state to the FleetLock server {} (id {}) within {} s: {why}; the node may still hold a reboot slot",
                client.base_url,
                client.id,
                budget.as_secs()
            );
        }
        tracing::warn!(
            "reporting steady state to the FleetLock server {}: {why}; trying again in {} s",
            client.base_url,
            wait.as_secs()
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strategy: &Strategy, sentinel: &Path) -> Result<()> {
        let etc = tempfile::tempdir().unwrap();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(reboot_or_leave(strategy, etc.path(), &Target::default(), sentinel))
    }

    #[test]
    fn sentinel_and_never_leave_the_reboot_to_others() {
        let dir = tempfile::tempdir().unwrap();
        let sentinel = dir.path().join("reboot-required");
        run(&Strategy::Never, &sentinel).unwrap();
        assert!(!sentinel.exists(), "never wrote the sentinel");
        run(&Strategy::Sentinel, &sentinel).unwrap();
        assert!(sentinel.exists(), "sentinel did not write kured's file");
        // A sentinel that cannot be written is an error, not a silent reboot or nothing.
        let err = run(&Strategy::Sentinel, &dir.path().join("missing/reboot-required"));
        assert!(format!("{:#}", err.unwrap_err()).contains("reboot sentinel"));
    }

    #[test]
    fn fleet_lock_needs_the_machine_id_before_it_asks_anyone() {
        let lock = config::FleetLock {
            base_url: "http://127.0.0.1:9".into(),
            group: "default".into(),
        };
        let dir = tempfile::tempdir().unwrap();
        let err = run(&Strategy::FleetLock(lock), &dir.path().join("s")).unwrap_err();
        assert!(format!("{err:#}").contains("machine-id"), "{err:#}");
    }
}
