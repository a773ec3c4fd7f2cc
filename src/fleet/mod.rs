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
//!   may be held, and where), then reports the node steady as zincati does at every start. A
//!   step after the grant that fails gives the slot back at once: a slot is held only while
//!   the node is on its way to a reboot. Every reboot pivot makes under `fleet_lock` holds a
//!   slot, a rollback's too;
//! - `sentinel`: never by itself; `/var/run/reboot-required` tells kured, which drains the node
//!   and reboots it when its own lock allows (as for package updates);
//! - `never`: never by itself (the machine-config daemon's drain-then-reboot, or an admin).
//!
//! The node's FleetLock id is zincati's ([`machine_id`]).

pub mod config;
pub mod fleet_lock;
pub mod machine_id;
mod release;
pub mod slot;
mod wait;

pub use release::{give_back, report_steady, steady_state, Released};
use release::{lock_records, record, release};
use wait::wait_after;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::node::events::Target;
use crate::node::reboot;
use crate::node::state::StateFile;
use crate::sysroot::finalize::Unlocked;
use config::{Config, FleetLock, Strategy};
use fleet_lock::{Answer, Client};
use slot::{Records, Slot};

/// The file kured watches (its `--reboot-sentinel` default).
pub const SENTINEL: &str = "/var/run/reboot-required";

/// The node a reboot is for.
#[derive(Debug, Clone)]
pub struct Node {
    /// The running system's `/etc` (its machine ID gives the FleetLock id).
    pub etc: PathBuf,
    pub sysroot: PathBuf,
    /// The running stateroot's pivot state directory ([`crate::node::state::dir`]): the slot
    /// record, [`slot`].
    pub state_dir: PathBuf,
}

/// The unit that waits for a FleetLock slot in the background ([`Wait::Background`]).
pub const BACKGROUND_UNIT: &str = "pivot-reboot.service";

/// Where a reboot under `fleet_lock` waits for its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Here, until the slot is granted: an admin's command.
    Here,
    /// One request here (the slot granted at once: the reboot follows at once); otherwise in
    /// [`BACKGROUND_UNIT`], and this run ends. `pivot.service` is ordered before kubelet, and
    /// kubelet is never held for a slot: the node serves (or joins) on its current OS while it
    /// waits, as a node running zincati does. At the first boot too: one request, since
    /// poseidon/fleetlock finds the node to drain by what kubelet reports, and a group that is
    /// busy for hours must not keep a new node out of the cluster for hours.
    Background,
}

/// Reboots into the staged update as the configured strategy says. Returns once the reboot was
/// asked for, or when the strategy leaves it to someone else (or to [`BACKGROUND_UNIT`]).
pub async fn reboot(config: &Config, node: &Node, target: &Target, wait: Wait) -> Result<()> {
    reboot_or_leave(config, node, target, Path::new(SENTINEL), wait).await
}

/// [`reboot()`], with kured's sentinel at `sentinel`.
async fn reboot_or_leave(
    config: &Config,
    node: &Node,
    target: &Target,
    sentinel: &Path,
    wait: Wait,
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
            let sysroot = node.sysroot.clone();
            let tries = config.boot_tries;
            let then = async move {
                let unlocked =
                    tokio::task::spawn_blocking(move || unlock(&sysroot, tries)).await??;
                if let Some(unlocked) = unlocked.filter(|u| u.was_locked) {
                    tracing::info!("unlocked the staged deployment {}", unlocked.commit);
                }
                reboot::reboot(target, SLOT_GRANTED_REBOOT)
            };
            match wait {
                Wait::Here => with_slot(lock, node, then).await,
                Wait::Background => match ask_once(lock, node).await? {
                    true => after_grant(node, then).await,
                    false => wait_in_background(),
                },
            }
        }
    }
}

/// Takes a reboot slot, then runs `then` (the steps up to and including the reboot). A slot
/// may only be held while the node is on its way to a reboot: when a step fails, no reboot
/// follows, so the slot is given back at once ([`give_back`]) and the step's error returned.
pub async fn with_slot<F>(lock: &FleetLock, node: &Node, then: F) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    take_slot(lock, node).await?;
    after_grant(node, then).await
}

/// Runs `then` with the slot granted, giving it back if `then` fails.
async fn after_grant<F>(node: &Node, then: F) -> Result<()>
where
    F: std::future::Future<Output = Result<()>>,
{
    // A bug (a panic) in a step is a failure too: no reboot follows it.
    match crate::node::panics::caught(then).await {
        Ok(()) => Ok(()),
        Err(e) => {
            give_back(&node.state_dir).await;
            Err(e.context("after the FleetLock slot was granted (the slot is given back)"))
        }
    }
}

/// Takes a reboot slot: gives back one an earlier boot may hold (so that its late
/// `steady-state` cannot undo this grant) and one this boot asked of another server, group or
/// id, records the one asked for, and asks every `interval` (jittered, or later when the
/// answer says `Retry-After`) until the server grants it.
pub async fn take_slot(lock: &FleetLock, node: &Node) -> Result<()> {
    let id = machine_id::of_etc(&node.etc)?;
    let boot = slot::boot_id()?;
    let mut slot = Slot::new(lock, &id, &boot);
    release(&node.state_dir, Some(&id), |recorded| {
        recorded.in_the_way_of(&slot, &boot)
    })
    .await?;
    let client = Client::new(lock, id)?;
    loop {
        let answer = ask(&client, &mut slot, &node.state_dir).await?;
        if let Ok(Answer::Granted) = answer {
            return Ok(());
        }
        let what = format!(
            "waiting for a reboot slot from the FleetLock server {} (id {}, group {})",
            client.base_url, client.id, client.group
        );
        wait_after(lock.interval, &answer, &what).await;
    }
}

/// One `pre-reboot` request for `slot`, recorded around it: "may hold" before the request,
/// cleared again only by the server's own refusal (a node the server refuses holds no slot
/// there). Errors are the record's; the request's own outcome is the answer.
async fn ask(client: &Client, slot: &mut Slot, state_dir: &Path) -> Result<Result<Answer>> {
    slot.may_hold = true;
    record(state_dir, slot).await?;
    let answer = client.pre_reboot().await;
    match &answer {
        Ok(Answer::Granted) => tracing::info!(
            "the FleetLock server {} granted a reboot slot to {} (group {})",
            client.base_url,
            client.id,
            client.group
        ),
        Ok(refused) if refused.is_from_server() => {
            slot.may_hold = false;
            record(state_dir, slot).await?;
        }
        _ => {}
    }
    Ok(answer)
}

/// Asks for a reboot slot once: whether the server granted it. Not at all while a slot of an
/// earlier boot (or another server's) is still to be given back: the background waiter gives
/// it back first, which may take as long as that server is away.
pub async fn ask_once(lock: &FleetLock, node: &Node) -> Result<bool> {
    let id = machine_id::of_etc(&node.etc)?;
    let boot = slot::boot_id()?;
    let mut slot = Slot::new(lock, &id, &boot);
    {
        let records = lock_records(&node.state_dir).await?;
        if let Some(recorded) = records.read()? {
            if recorded.in_the_way_of(&slot, &boot) {
                tracing::info!(
                    "a reboot slot taken earlier ({}, id {}) is still to be given back: {BACKGROUND_UNIT} gives it back, then asks for this one",
                    recorded.base_url,
                    recorded.id
                );
                return Ok(false);
            }
        }
    }
    let client = Client::new(lock, id)?;
    let why = match ask(&client, &mut slot, &node.state_dir).await? {
        Ok(Answer::Granted) => return Ok(true),
        Ok(refused) => refused.to_string(),
        Err(e) => format!("{e:#}"),
    };
    tracing::info!(
        "no reboot slot from the FleetLock server {} at once (id {}, group {}): {why}",
        client.base_url,
        client.id,
        client.group
    );
    Ok(false)
}

/// Hands the wait for the slot to [`BACKGROUND_UNIT`] and lets this run end.
fn wait_in_background() -> Result<()> {
    let status = std::process::Command::new("systemctl")
        .args(["start", "--no-block", BACKGROUND_UNIT])
        .status()
        .with_context(|| format!("running systemctl start {BACKGROUND_UNIT}"))?;
    anyhow::ensure!(
        status.success(),
        "systemctl start {BACKGROUND_UNIT} failed ({status}): nothing waits for the reboot slot; the update stays staged, locked, for the next boot"
    );
    tracing::info!(
        "the update stays staged, locked: {BACKGROUND_UNIT} waits for the reboot slot and reboots the node once it is granted; the boot goes on meanwhile (kubelet is not held)"
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
        let state_file =
            StateFile::for_stateroot(sysroot, u.booted_stateroot.as_deref(), &u.stateroot);
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

/// Makes sure the node holds a reboot slot for a reboot that is not into a staged update (a
/// rollback's): under `fleet_lock`, the slot an earlier boot was granted and still holds (the
/// update's, the node going down again for it) is kept through this boot, else one is taken.
/// Under the other strategies there is nothing to hold. The caller reboots, and calls
/// [`give_back`] if the reboot fails.
pub async fn slot_for_reboot(config: &Config, node: &Node) -> Result<()> {
    let Strategy::FleetLock(lock) = &config.strategy else {
        return Ok(());
    };
    let state_dir = node.state_dir.clone();
    if tokio::task::spawn_blocking(move || hold_through_this_boot(&state_dir)).await?? {
        tracing::info!("keeping the FleetLock reboot slot through this reboot");
        return Ok(());
    }
    take_slot(lock, node).await
}

/// Keeps the slot recorded in `state_dir` through this boot: the node reboots again for its
/// update (a rollback), and gives the slot back only at the boot after. Returns whether a slot
/// was recorded.
pub fn hold_through_this_boot(state_dir: &Path) -> Result<bool> {
    let records = Records::lock(state_dir)?;
    match records.read()? {
        Some(mut slot) if slot.may_hold => {
            slot.boot_id = slot::boot_id()?;
            slot.give_back = false;
            records.write(&slot)?;
            Ok(true)
        }
        _ => Ok(false),
    }
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
                Wait::Here,
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
        let lock = config::FleetLock::new("http://127.0.0.1:9/", "default");
        let dir = tempfile::tempdir().unwrap();
        let err = run(&Strategy::FleetLock(lock), &dir.path().join("s")).unwrap_err();
        assert!(format!("{err:#}").contains("machine-id"), "{err:#}");
    }
}
