//! Giving a reboot slot back: at the boots after the reboot it was for (`pivot steady-state`),
//! at once when a step after the grant fails, and zincati's steady-state report at every start.
//! Only the record ([`super::slot`]) is needed to give a slot back, never the configuration.

use std::path::Path;

use anyhow::Result;

use super::fleet_lock::{Answer, Client};
use super::slot::{self, Records, Slot};
use super::wait::wait_after;
use super::{machine_id, FleetLock, Node};

pub(super) async fn record(state_dir: &Path, slot: &Slot) -> Result<()> {
    let (dir, slot) = (state_dir.to_path_buf(), slot.clone());
    tokio::task::spawn_blocking(move || Records::lock(&dir)?.write(&slot)).await?
}

pub(super) async fn lock_records(state_dir: &Path) -> Result<Records> {
    let dir = state_dir.to_path_buf();
    tokio::task::spawn_blocking(move || Records::lock(&dir)).await?
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

/// Gives back the slot recorded in `state_dir` by an earlier boot (or by this one, when no
/// reboot follows: [`Slot::give_back`]), asking every interval until the server says yes: a
/// slot kept by mistake stalls the node's whole group. It needs nothing but the record (the
/// configuration may have changed, or not load at all in a pivot of another version).
/// `current_id` is the node's FleetLock id now, to say so when the machine ID changed since.
pub async fn steady_state(state_dir: &Path, current_id: Option<&str>) -> Result<Released> {
    let boot = slot::boot_id()?;
    let records = lock_records(state_dir).await?;
    match records.read()? {
        None => return Ok(Released::Nothing),
        Some(slot) if slot.held_for_reboot_in(&boot) => return Ok(Released::ThisBoot),
        Some(_) => {}
    }
    drop(records);
    release(state_dir, current_id, |slot| {
        !slot.held_for_reboot_in(&boot)
    })
    .await
}

/// Gives back the recorded slot while `which` says it is one to give back (the record is read
/// again, under its lock, before every request).
pub(super) async fn release(
    state_dir: &Path,
    current_id: Option<&str>,
    which: impl Fn(&Slot) -> bool,
) -> Result<Released> {
    let mut warned_id = false;
    loop {
        let records = lock_records(state_dir).await?;
        let Some(slot) = records.read()?.filter(&which) else {
            return Ok(Released::Nothing);
        };
        if !slot.may_hold {
            // Every request of it was refused by the server: there is nothing to give back.
            records.remove()?;
            return Ok(Released::Nothing);
        }
        if let Some(now) = current_id.filter(|now| *now != slot.id && !warned_id) {
            warned_id = true;
            tracing::error!(
                "the machine ID changed since the FleetLock slot was taken: it was taken as {}, the node is {now} now; giving it back as {} (poseidon/fleetlock knows nodes by their current machine ID and refuses until an admin clears the lease: kubectl -n <namespace> patch lease fleetlock-{} --type=merge -p '{{\"spec\":{{\"holderIdentity\":null}}}}')",
                slot.id,
                slot.id,
                slot.group
            );
        }
        let client = slot.client()?;
        let answer = client.steady_state().await;
        if let Ok(Answer::Granted) = answer {
            records.remove()?;
            return Ok(steady(client, ": the reboot slot is given back"));
        }
        drop(records);
        let what = format!(
            "giving the reboot slot of {} back to the FleetLock server {} (group {})",
            client.id,
            client.steady_state_url(),
            client.group
        );
        wait_after(slot.lock().interval, &answer, &what).await;
    }
}

/// The server said yes to `client`'s steady-state: logged, with `more` said of it.
fn steady(client: Client, more: &str) -> Released {
    tracing::info!(
        "reported steady state to the FleetLock server {} (id {}, group {}){more}",
        client.base_url,
        client.id,
        client.group
    );
    Released::GivenBack {
        base_url: client.base_url,
        id: client.id,
    }
}

/// Reports the node steady to the configured server under its current id, as zincati does at
/// every start (releasing a slot an earlier agent, or another client on this node, took),
/// asking every interval until the server says yes. Not while this boot holds a slot for a
/// reboot still to come: the report would undo its grant.
pub async fn report_steady(lock: &FleetLock, node: &Node) -> Result<Released> {
    let id = machine_id::of_etc(&node.etc)?;
    let boot = slot::boot_id()?;
    let client = Client::new(lock, id)?;
    loop {
        // Under the record's lock: a slot taken meanwhile waits for this request to end.
        let records = lock_records(&node.state_dir).await?;
        if records.read()?.is_some_and(|s| s.held_for_reboot_in(&boot)) {
            return Ok(Released::ThisBoot);
        }
        let answer = client.steady_state().await;
        if let Ok(Answer::Granted) = answer {
            return Ok(steady(client, ""));
        }
        drop(records);
        let what = format!(
            "reporting steady state to the FleetLock server {} (id {}, group {})",
            client.base_url, client.id, client.group
        );
        wait_after(lock.interval, &answer, &what).await;
    }
}

/// A step after the grant failed and no reboot follows in this boot: the slot this boot took
/// is marked to be given back now, and given back, one request here; if that is refused, the
/// node's `pivot-steady-state.service` is started to keep asking (on a booted system; the
/// record says what to give back, so any later `pivot steady-state` does it too).
pub async fn give_back(state_dir: &Path) {
    let marked = async {
        let boot = slot::boot_id()?;
        let records = lock_records(state_dir).await?;
        match records.read()? {
            Some(mut slot) if slot.boot_id == boot => {
                slot.give_back = true;
                records.write(&slot)?;
                Ok::<_, anyhow::Error>(Some(slot))
            }
            _ => Ok(None),
        }
    }
    .await;
    let slot = match marked {
        Ok(Some(slot)) => slot,
        Ok(None) => return,
        Err(e) => {
            tracing::error!("marking the FleetLock slot to be given back: {e:#}");
            return;
        }
    };
    let once = async {
        let client = slot.client()?;
        let records = lock_records(state_dir).await?;
        match client.steady_state().await? {
            Answer::Granted => {
                records.remove()?;
                Ok(true)
            }
            refused => {
                tracing::warn!("giving the reboot slot back: {refused}");
                Ok::<_, anyhow::Error>(false)
            }
        }
    }
    .await;
    match once {
        Ok(true) => tracing::info!(
            "gave the reboot slot of {} back to the FleetLock server {}: no reboot follows",
            slot.id,
            slot.base_url
        ),
        Ok(false) | Err(_) => {
            if let Err(e) = &once {
                tracing::warn!("giving the reboot slot back: {e:#}");
            }
            if Path::new("/run/ostree-booted").exists() {
                let started = std::process::Command::new("systemctl")
                    .args(["start", "--no-block", "pivot-steady-state.service"])
                    .status();
                if !started.is_ok_and(|s| s.success()) {
                    tracing::error!(
                        "could not start pivot-steady-state.service: the reboot slot of {} is given back by the next `pivot steady-state`",
                        slot.id
                    );
                }
            } else {
                tracing::error!(
                    "the reboot slot of {} is not given back yet: `pivot steady-state` gives it back",
                    slot.id
                );
            }
        }
    }
}
