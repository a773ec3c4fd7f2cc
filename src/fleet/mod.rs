//! Fleets: when a node that has staged an update reboots into it. The fleet decides, through
//! the strategy the admins configure ([`config`], `/etc/pivot/config.d/*.toml`):
//!
//! - `immediate`: at once (the default, and pivot's behaviour before strategies existed);
//! - `fleet_lock`: once a FleetLock server ([`fleet_lock`]: airlock on etcd, poseidon/fleetlock
//!   on Kubernetes) grants a reboot slot, in zincati's order: the update is staged with its
//!   finalization locked (an orderly reboot meanwhile, by kured, an admin or the MCO, boots the
//!   old OS and `pivot confirm` stages the update again), then the slot is asked for, with
//!   jittered backoff, and only once it is granted is the deployment unlocked (GRUB's boot-once
//!   armed with it) and the node rebooted. At the following boots `pivot steady-state`
//!   (`pivot-steady-state.service`, beside kubelet, never before it) gives the slot back,
//!   whatever became of the update, asking until the server says yes ([`slot`] records what
//!   may be held, and where);
//! - `sentinel`: never by itself; `/var/run/reboot-required` tells kured, which drains the node
//!   and reboots it when its own lock allows (as for package updates);
//! - `never`: never by itself (the machine-config daemon's drain-then-reboot, or an admin).
//!
//! The node's FleetLock id is zincati's ([`machine_id`]).

pub mod config;
pub mod fleet_lock;
pub mod machine_id;
pub mod slot;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::node::events::Target;
use crate::node::reboot;
use crate::node::state::StateFile;
use crate::sysroot::finalize::Unlocked;
use config::{Config, FleetLock, Strategy};
use fleet_lock::{Answer, Client};
use slot::{Records, Slot};

/// The file kured watches (its `--reboot-sentinel` default).
pub const SENTINEL: &str = "/var/run/reboot-required";
/// Waits between pre-reboot requests grow from the first to the last (jittered).
const FIRST_WAIT: Duration = Duration::from_secs(2);
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Waits between steady-state requests: shorter, so a server that comes back gets its slot
/// back within half a minute.
const FIRST_RELEASE_WAIT: Duration = Duration::from_secs(1);
const MAX_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// The node a reboot is for.
#[derive(Debug, Clone)]
pub struct Node {
    /// The running system's `/etc` (its machine ID gives the FleetLock id).
    pub etc: PathBuf,
    pub sysroot: PathBuf,
    /// The running stateroot's `/var/lib/pivot` (the slot record, [`slot`]).
    pub state_dir: PathBuf,
}

/// Reboots into the staged update as the configured strategy says. Returns once the reboot was
/// asked for, or when the strategy leaves it to someone else.
pub async fn reboot(config: &Config, node: &Node, target: &Target) -> Result<()> {
    reboot_or_leave(config, node, target, Path::new(SENTINEL)).await
}

/// [`reboot()`], with kured's sentinel at `sentinel`.
async fn reboot_or_leave(
    config: &Config,
    node: &Node,
    target: &Target,
    sentinel: &Path,
) -> Result<()> {
    match &config.strategy {
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
            take_slot(lock, node).await?;
            let sysroot = node.sysroot.clone();
            let tries = config.boot_tries;
            let unlocked = tokio::task::spawn_blocking(move || unlock(&sysroot, tries)).await??;
            if let Some(unlocked) = unlocked.filter(|u| u.was_locked) {
                tracing::info!("unlocked the staged deployment {}", unlocked.commit);
            }
            reboot::reboot(target, SLOT_GRANTED_REBOOT)
        }
    }
}

/// Takes a reboot slot: gives back one an earlier boot may hold (so that its late
/// `steady-state` cannot undo this grant), records the one asked for, and asks until the
/// server grants it or refuses for good.
pub async fn take_slot(lock: &FleetLock, node: &Node) -> Result<()> {
    let id = machine_id::of_etc(&node.etc)?;
    let boot = slot::boot_id()?;
    steady_state(&node.state_dir).await?;
    let mut slot = Slot::new(lock, &id, &boot);
    let client = Client::new(lock, id)?;
    let mut wait = FIRST_WAIT;
    loop {
        slot.may_hold = true;
        record(&node.state_dir, &slot).await?;
        let answer = client.pre_reboot().await;
        if let Ok(refused @ Answer::Refused { .. }) = &answer {
            // Refused: this node holds no slot there.
            slot.may_hold = false;
            record(&node.state_dir, &slot).await?;
            tracing::debug!("pre-reboot refused: {refused}");
        }
        let why = match answer {
            Ok(Answer::Granted) => break,
            Ok(refused) if refused.is_final() => bail!(
                "the FleetLock server {} refuses a reboot slot to {} (group {}): {refused}; asking again would not change that",
                client.base_url,
                client.id,
                client.group
            ),
            Ok(refused) => format!("the server refuses: {refused}"),
            Err(e) => format!("{e:#}"),
        };
        let delay = jittered(wait);
        tracing::warn!(
            "waiting for a reboot slot from the FleetLock server {} (id {}, group {}): {why}; asking again in {:.0} s",
            client.base_url,
            client.id,
            client.group,
            delay.as_secs_f64()
        );
        tokio::time::sleep(delay).await;
        wait = (wait * 2).min(MAX_WAIT);
    }
    tracing::info!(
        "the FleetLock server {} granted a reboot slot to {} (group {})",
        client.base_url,
        client.id,
        client.group
    );
    Ok(())
}

/// Why the node reboots once its slot is granted and its update unlocked.
pub const SLOT_GRANTED_REBOOT: &str = "rebooting into the new deployment (FleetLock slot granted)";

/// Unlocks the staged deployment, if one is staged ([`crate::sysroot::finalize`]), marks the
/// reboot it now needs, and records that the last attempt is no longer locked: a deployment
/// then missing at the next boot is a finalization that failed, not a reboot that came before
/// the unlock.
pub fn unlock(sysroot: &Path, boot_tries: u8) -> Result<Option<Unlocked>> {
    let unlocked = crate::sysroot::finalize::unlock_staged(sysroot, boot_tries)?;
    if let Some(u) = unlocked.as_ref().filter(|u| u.was_locked) {
        let state_file = StateFile::for_stateroot(sysroot, &u.stateroot);
        let recorded = state_file.load().and_then(|mut state| {
            match state.last.as_mut() {
                Some(last) if last.commit.as_deref() == Some(u.commit.as_str()) => {
                    last.locked = false
                }
                _ => return Ok(()),
            }
            state_file.save(&state)
        });
        if let Err(e) = recorded {
            tracing::warn!("recording the unlock in {}: {e:#}", state_file.path().display());
        }
        reboot::mark_needed()?;
    }
    Ok(unlocked)
}

async fn record(state_dir: &Path, slot: &Slot) -> Result<()> {
    let (dir, slot) = (state_dir.to_path_buf(), slot.clone());
    tokio::task::spawn_blocking(move || Records::lock(&dir)?.write(&slot)).await?
}

/// What [`steady_state`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// No slot is recorded: nothing to give back.
    Nothing,
    /// The slot was asked for in this boot: the reboot it is for has not happened yet.
    ThisBoot,
    /// The server said yes to `steady-state`: the slot is given back.
    GivenBack { base_url: String, id: String },
}

/// Gives back the slot an earlier boot recorded in `state_dir`, asking until the server says
/// yes (jittered backoff, at most [`MAX_RELEASE_WAIT`] apart): a slot kept by mistake stalls
/// the node's whole group. Fails only on a refusal that asking again cannot change (the
/// record stays, for the next boot or the next start of the unit).
pub async fn steady_state(state_dir: &Path) -> Result<Released> {
    let boot = slot::boot_id()?;
    let mut wait = FIRST_RELEASE_WAIT;
    loop {
        let dir = state_dir.to_path_buf();
        let records = tokio::task::spawn_blocking(move || Records::lock(&dir)).await??;
        let Some(slot) = records.read()? else {
            return Ok(Released::Nothing);
        };
        if slot.boot_id == boot {
            return Ok(Released::ThisBoot);
        }
        if !slot.may_hold {
            // Every request of it was refused: there is nothing to give back.
            records.remove()?;
            return Ok(Released::Nothing);
        }
        let client = Client::new(&slot.lock(), slot.id.clone())?;
        let why = match client.steady_state().await {
            Ok(Answer::Granted) => {
                records.remove()?;
                tracing::info!(
                    "reported steady state to the FleetLock server {} (id {}, group {}): the reboot slot is given back",
                    client.base_url,
                    client.id,
                    client.group
                );
                return Ok(Released::GivenBack {
                    base_url: client.base_url,
                    id: client.id,
                });
            }
            Ok(refused) if refused.is_final() => bail!(
                "the FleetLock server {} refuses the steady state of {} (group {}): {refused}; the node may still hold a reboot slot",
                client.base_url,
                client.id,
                client.group
            ),
            Ok(refused) => format!("the server refuses: {refused}"),
            Err(e) => format!("{e:#}"),
        };
        drop(records);
        let delay = jittered(wait);
        tracing::warn!(
            "reporting steady state to the FleetLock server {} (id {}): {why}; trying again in {:.0} s",
            client.base_url,
            client.id,
            delay.as_secs_f64()
        );
        tokio::time::sleep(delay).await;
        wait = (wait * 2).min(MAX_RELEASE_WAIT);
    }
}

/// Keeps the slot recorded in `state_dir` through this boot: the node reboots again for its
/// update (a rollback), and gives the slot back only at the boot after.
pub fn hold_through_this_boot(state_dir: &Path) -> Result<()> {
    let records = Records::lock(state_dir)?;
    if let Some(mut slot) = records.read()? {
        slot.boot_id = slot::boot_id()?;
        records.write(&slot)?;
    }
    Ok(())
}

/// `wait` spread over [wait/2, wait): nodes of a group retrying together drift apart.
fn jittered(wait: Duration) -> Duration {
    wait.mul_f64(0.5 + 0.5 * crate::fetch::retry::jitter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strategy: &Strategy, sentinel: &Path) -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let node = Node {
            etc: dir.path().join("etc"),
            sysroot: dir.path().to_path_buf(),
            state_dir: dir.path().join("var/lib/pivot"),
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(reboot_or_leave(
                &Config {
                    strategy: strategy.clone(),
                    ..Config::default()
                },
                &node,
                &Target::default(),
                sentinel,
            ))
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
