//! The record of a FleetLock slot pivot asked for: `/var/lib/pivot/fleet-lock.json`, written
//! before the first `pre-reboot` request and removed once the server has said yes to
//! `steady-state`. It names the server, group and id the slot was asked of (released there, even
//! if the configuration changed since) and the boot that asked: a record from an earlier boot
//! is a slot the node may still hold, which `pivot steady-state` gives back (unless the server
//! refused every request of it); one from this boot is a reboot still to come, which nothing
//! releases.
//!
//! Fields are only ever added, each optional on reading, and unknown ones are kept out of
//! the judgement: a record a newer pivot wrote must still be given back by an older one (a
//! node rolled back), and one an older pivot wrote by a newer one (the pivot that took the
//! slot is the bootimage's; the one that gives it back is the target's).
//!
//! Both sides take an exclusive `flock` on `fleet-lock.lock` beside it for each step: the
//! releaser re-reads the record before every request, and a run asking for a new slot first
//! gives back an earlier one and rewrites the record under the lock, so a `steady-state` can
//! never follow (and undo) the `pre-reboot` that granted this boot's slot.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::time::Duration;

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};
use reqwest::Url;
use serde::{Deserialize, Serialize};

use super::config::FleetLock;
use super::fleet_lock::Client;

pub const RECORD: &str = "fleet-lock.json";
const LOCK: &str = "fleet-lock.lock";
const API_VERSION: &str = "pivot.openshift.io/v1";
const KIND: &str = "FleetLockSlot";

/// A slot asked of a FleetLock server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    pub api_version: String,
    pub kind: String,
    pub base_url: String,
    pub group: String,
    pub id: String,
    /// The boot (`/proc/sys/kernel/random/boot_id`) that asked for it.
    pub boot_id: String,
    /// Whether the server may have granted it: set before each request, cleared by the
    /// server's own refusal (a node the server refuses holds no slot there), so that a run
    /// killed at any moment, or an answer lost on the way, leaves it set whenever a grant may
    /// have happened. A slot never granted is not given back.
    pub may_hold: bool,
    /// Where the slot is given back. Records of pivots before it have none: they asked at
    /// `<base_url>/v1/...` ([`Slot::client`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady_state_url: Option<String>,
    /// Seconds between tries to give it back (`reboot.fleet_lock.interval` when it was asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<u64>,
    /// Seconds one request may take (`reboot.fleet_lock.timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// No reboot follows in this boot (a step after the grant failed): the slot is given back
    /// now, not after the next boot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub give_back: bool,
}

impl Slot {
    pub fn new(lock: &FleetLock, id: &str, boot_id: &str) -> Slot {
        Slot {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            base_url: lock.base_url.clone(),
            group: lock.group.clone(),
            id: id.into(),
            boot_id: boot_id.into(),
            may_hold: true,
            steady_state_url: super::fleet_lock::endpoint(&lock.base_url, "steady-state")
                .ok()
                .map(String::from),
            interval: Some(lock.interval.as_secs()),
            timeout: Some(lock.timeout.as_secs()),
            give_back: false,
        }
    }

    /// The server it was asked of, with the cadence it was asked at (a recorded value outside
    /// what the configuration allows reads as the default).
    pub fn lock(&self) -> FleetLock {
        let mut lock = FleetLock::new(&self.base_url, &self.group);
        let allowed = |s: &u64| (1..=super::config::MAX_SECONDS).contains(s);
        if let Some(interval) = self.interval.filter(allowed) {
            lock.interval = Duration::from_secs(interval);
        }
        if let Some(timeout) = self.timeout.filter(allowed) {
            lock.timeout = Duration::from_secs(timeout);
        }
        lock
    }

    /// A client that gives this slot back where it was asked for.
    pub fn client(&self) -> Result<Client> {
        let steady_state = match &self.steady_state_url {
            Some(url) => Url::parse(url)
                .with_context(|| format!("the recorded steady-state URL {url:?}"))?,
            // pivot before endpoints were resolved as zincati resolves them.
            None => Url::parse(&format!(
                "{}/v1/steady-state",
                self.base_url.trim_end_matches('/')
            ))
            .with_context(|| format!("the recorded base URL {:?}", self.base_url))?,
        };
        let pre_reboot = steady_state.join("pre-reboot")?;
        Client::with_endpoints(&self.lock(), self.id.clone(), pre_reboot, steady_state)
    }

    /// Whether it stands for a reboot still to come in the boot `boot`: asked for in it, and
    /// not to be given back at once (then nothing may release it yet).
    pub fn held_for_reboot_in(&self, boot: &str) -> bool {
        self.boot_id == boot && !self.give_back
    }

    /// Whether it names the same slot as `other`: server, group and id.
    pub fn same_slot(&self, other: &Slot) -> bool {
        fn key(s: &Slot) -> (&str, Option<&str>, &str, &str) {
            (&s.base_url, s.steady_state_url.as_deref(), &s.group, &s.id)
        }
        key(self) == key(other)
    }

    /// Whether it must be given back before `asked` is asked for in the boot `boot`: it is
    /// not a slot held for a reboot still to come in that boot, or not the same slot.
    pub fn in_the_way_of(&self, asked: &Slot, boot: &str) -> bool {
        !self.held_for_reboot_in(boot) || !self.same_slot(asked)
    }
}

/// The records in a node's `/var/lib/pivot` (`dir`), under their lock while held.
pub struct Records {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl Records {
    /// Waits for the lock on `dir`'s record.
    pub fn lock(dir: &Path) -> Result<Records> {
        crate::node::state::private_dir(dir)?;
        let path = dir.join(LOCK);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(Records {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(RECORD)
    }

    /// The slot recorded, if any. A record that cannot be read is an error: it may stand for a
    /// slot the node holds, which must not be forgotten.
    pub fn read(&self) -> Result<Option<Slot>> {
        let path = self.path();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let slot: Slot = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a FleetLock slot record", path.display()))?;
        anyhow::ensure!(
            slot.api_version == API_VERSION && slot.kind == KIND,
            "{} is a {} {}, not a {API_VERSION} {KIND}",
            path.display(),
            slot.api_version,
            slot.kind
        );
        Ok(Some(slot))
    }

    /// Replaces the record (atomically: a crash leaves the old one or the new one).
    pub fn write(&self, slot: &Slot) -> Result<()> {
        let path = self.path();
        let tmp = self.dir.join(format!(".{RECORD}.{}.tmp", std::process::id()));
        (|| -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(serde_json::to_string_pretty(slot)?.as_bytes())?;
            file.write_all(b"\n")?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        })()
        .with_context(|| format!("writing {}", path.display()))
    }

    pub fn remove(&self) -> Result<()> {
        let path = self.path();
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(()),
        }
    }
}

/// This boot's id.
pub fn boot_id() -> Result<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .context("reading this boot's id")?;
    Ok(id.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_foreign_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::lock(dir.path()).unwrap();
        assert_eq!(records.read().unwrap(), None);
        let lock = FleetLock::new("http://127.0.0.1:9/fleetlock/", "workers");
        let slot = Slot::new(&lock, "id", "boot");
        records.write(&slot).unwrap();
        assert_eq!(records.read().unwrap(), Some(slot));
        std::fs::write(
            dir.path().join(RECORD),
            r#"{"apiVersion":"v0","kind":"Other","baseUrl":"","group":"","id":"","bootId":"","mayHold":true}"#,
        )
        .unwrap();
        assert!(format!("{:#}", records.read().unwrap_err()).contains("not a pivot.openshift.io/v1 FleetLockSlot"));
        records.remove().unwrap();
        records.remove().unwrap();
        assert_eq!(records.read().unwrap(), None);
    }

    #[test]
    fn records_of_other_pivots_are_given_back_where_they_were_asked() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::lock(dir.path()).unwrap();
        // An earlier pivot's record: no endpoint, a base URL without its trailing slash, to
        // which it appended /v1/.
        std::fs::write(
            dir.path().join(RECORD),
            r#"{"apiVersion":"pivot.openshift.io/v1","kind":"FleetLockSlot","baseUrl":"http://127.0.0.1:9/fleetlock","group":"g","id":"i","bootId":"b","mayHold":true}"#,
        )
        .unwrap();
        let old = records.read().unwrap().unwrap();
        assert_eq!(
            old.client().unwrap().steady_state_url().as_str(),
            "http://127.0.0.1:9/fleetlock/v1/steady-state"
        );
        assert_eq!(old.lock().interval, super::super::config::DEFAULT_INTERVAL);
        // A newer pivot's record, with a field this one does not know: still read.
        std::fs::write(
            dir.path().join(RECORD),
            r#"{"apiVersion":"pivot.openshift.io/v1","kind":"FleetLockSlot","baseUrl":"http://h/fl","group":"g","id":"i","bootId":"b","mayHold":true,"steadyStateUrl":"http://h/v1/steady-state","interval":7,"somethingNew":[1]}"#,
        )
        .unwrap();
        let new = records.read().unwrap().unwrap();
        assert_eq!(new.client().unwrap().steady_state_url().as_str(), "http://h/v1/steady-state");
        assert_eq!(new.lock().interval.as_secs(), 7);
        // A cadence no configuration allows (0, or never again) reads as the default.
        for seconds in [0, u64::MAX] {
            let odd = Slot {
                interval: Some(seconds),
                timeout: Some(seconds),
                ..new.clone()
            };
            assert_eq!(odd.lock().interval, super::super::config::DEFAULT_INTERVAL);
            assert_eq!(odd.lock().timeout, super::super::config::DEFAULT_TIMEOUT);
        }
    }
}
