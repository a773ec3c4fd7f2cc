//! What pivot attempted and how it ended, kept under the stateroot's
//! `/var/lib/pivot/state.json` (mode 0600, directory 0700), so that a pivot that did not take
//! effect is noticed on the next boot and a target that keeps failing is given up on instead of
//! becoming a reboot loop. Only `pivot` writes it; `pivot status` shows it. Which directory
//! that is, for every record pivot keeps, is [`dir`]'s decision.
//!
//! The file's shape is private to pivot: `pivot status --json` ([`crate::api::status`]) is what
//! other programs read. Files written by earlier versions read the same.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::api::outcome::Outcome;
use crate::api::status::PullspecSource;

/// Attempts at one pullspec-file target before pivot stops trying (and stops rebooting).
pub const MAX_ATTEMPTS: u32 = 3;

/// The file's record of one stateroot; its fields mean what those of
/// [`crate::api::status::PivotState`] and [`crate::api::status::Attempt`] say.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub target: Option<String>,
    pub attempts: u32,
    pub last: Option<Attempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<Rollback>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The published record as is (its fields are only added to).
    pub cached_update: Option<crate::api::status::CachedUpdate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthFailure>,
    /// Targets (commits) pivot rolled the node back from by itself, newest last: each at most
    /// once, so a target that fails again stays, failed, instead of looping.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auto_rolled_back: Vec<String>,
}

/// Kept in [`State::auto_rolled_back`]: enough for any realistic run of bad targets.
pub const AUTO_ROLLED_BACK_KEPT: usize = 32;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HealthFailure {
    pub at: u64,
    pub commit: String,
    pub check: String,
    pub how: String,
    pub output_tail: String,
    pub rolled_back_to: Option<String>,
}


#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rollback {
    pub at: u64,
    pub from: String,
    pub to: String,
    pub held: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub pullspec: String,
    pub source: PullspecSource,
    pub started: u64,
    pub outcome: Outcome,
    pub digest: Option<String>,
    pub commit: Option<String>,
    pub error: Option<String>,
    /// Staged with `--lock-finalization`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub locked: bool,
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl Attempt {
    pub fn new(pullspec: &str, source: PullspecSource) -> Attempt {
        Attempt {
            pullspec: pullspec.to_string(),
            source,
            started: now(),
            outcome: Outcome::Running,
            digest: None,
            commit: None,
            error: None,
            locked: false,
        }
    }
}

/// pivot's state directory as the running system sees it, whatever filesystem `/var` is.
pub const RUNNING_DIR: &str = "/var/lib/pivot";

/// The directory of pivot's records for `stateroot` of `sysroot` (the state file, the FleetLock
/// slot record, kept signatures), given `booted`: the stateroot of the deployment libostree
/// found booted in `sysroot`, None when `sysroot` is not the running system. Every reader and
/// writer asks here, and the units' conditions look where it answers for the running system.
///
/// - The booted stateroot: [`RUNNING_DIR`], the running `/var/lib/pivot`. A stateroot's `/var` is
///   `<sysroot>/ostree/deploy/<stateroot>/var` only until something else is mounted on `/var`:
///   a separate `/var` partition (or LUKS volume) of Fedora CoreOS and RHCOS is mounted over the
///   deployment's `/var` by the deployment's fstab, and there the deploy path is a directory of
///   the root filesystem that nothing booted reads. The running `/var` is what the next boot of
///   that stateroot mounts again (its /etc, fstab included, is merged into the target), so the
///   bootimage's record is found by the target's first boot, and by the units' conditions.
///   Without a partition it is the same directory (ostree-prepare-root binds the deploy path at
///   `/var`, writable even under a read-only `/sysroot`), so nothing moves.
/// - Another stateroot on the running system (`pivot --stateroot`), and every stateroot of a
///   sysroot that is not running (`--sysroot` on an image, the tests): the deploy path, the only
///   `/var` pivot can name for it; it is the `/var` that stateroot boots with unless its own
///   fstab mounts another over it.
pub fn dir(sysroot: &Path, booted: Option<&str>, stateroot: &str) -> PathBuf {
    match booted {
        Some(b) if b == stateroot => PathBuf::from(RUNNING_DIR),
        _ => sysroot
            .join("ostree/deploy")
            .join(stateroot)
            .join("var/lib/pivot"),
    }
}

/// The state file of one stateroot.
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file of `stateroot` of `sysroot`, in [`dir`] (`booted` as there).
    pub fn for_stateroot(sysroot: &Path, booted: Option<&str>, stateroot: &str) -> StateFile {
        StateFile::in_dir(&dir(sysroot, booted, stateroot))
    }

    /// The state file in the state directory `dir` (one [`dir`] chose).
    pub fn in_dir(dir: &Path) -> StateFile {
        StateFile {
            path: dir.join("state.json"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A missing file is a fresh state; an unreadable one is an error (never silently reset the
    /// attempt count).
    pub fn load(&self) -> Result<State> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "parsing {} (remove it to reset pivot's state)",
                    self.path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.path.display())),
        }
    }

    /// Replaces the file atomically, so a crash (or a concurrent pivot) leaves either the old or
    /// the new state, never a mix: each writer fills its own temporary file, syncs it, renames it
    /// over the state file, and syncs the directory so the rename survives a power loss.
    pub fn save(&self, state: &State) -> Result<()> {
        let dir = self.path.parent().expect("state path has a parent");
        private_dir(dir)?;
        let tmp = dir.join(format!(
            ".state.json.{}.{}.tmp",
            std::process::id(),
            SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let written = (|| -> Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            file.write_all(&serde_json::to_vec_pretty(state)?)
                .and_then(|_| file.sync_all())
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, &self.path)
                .with_context(|| format!("replacing {}", self.path.display()))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
        Ok(())
    }
}

/// Saves made by this process, so that every save has a temporary file of its own.
static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates `dir` (mode 0700) and the parents it lacks (0755: they are /var/lib and the like,
/// which other services read), or narrows an existing `dir` to 0700.
pub fn private_dir(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mode = std::fs::metadata(dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .with_context(|| format!("restricting {} to mode 0700", dir.display()))?;
            }
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_booted_stateroot_keeps_its_state_in_the_running_var() {
        let sysroot = Path::new("/");
        assert_eq!(
            dir(sysroot, Some("fedora-coreos"), "fedora-coreos"),
            Path::new("/var/lib/pivot")
        );
        // `--sysroot /sysroot` names the same running system when libostree finds it booted.
        assert_eq!(
            dir(Path::new("/sysroot"), Some("rhcos"), "rhcos"),
            Path::new(RUNNING_DIR)
        );
        assert_eq!(
            StateFile::for_stateroot(sysroot, Some("rhcos"), "rhcos").path(),
            Path::new("/var/lib/pivot/state.json")
        );
    }

    #[test]
    fn other_stateroots_and_sysroots_not_running_keep_the_deploy_path() {
        // Another stateroot of the running system: its own /var, as it boots with it.
        assert_eq!(
            dir(Path::new("/"), Some("rhcos"), "fedora-coreos"),
            Path::new("/ostree/deploy/fedora-coreos/var/lib/pivot")
        );
        // A sysroot that is not running (an image, the tests): no deployment is booted.
        let image = Path::new("/mnt/image");
        assert_eq!(
            dir(image, None, "rhcos"),
            Path::new("/mnt/image/ostree/deploy/rhcos/var/lib/pivot")
        );
        assert_eq!(
            StateFile::for_stateroot(image, None, "rhcos").path(),
            Path::new("/mnt/image/ostree/deploy/rhcos/var/lib/pivot/state.json")
        );
    }

    #[test]
    fn state_round_trips_with_tight_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::for_stateroot(dir.path(), None, "os");
        assert_eq!(file.load().unwrap().attempts, 0);
        let mut state = State {
            target: Some("quay.io/os:1".into()),
            attempts: 2,
            last: Some(Attempt::new("quay.io/os:1", PullspecSource::File)),
            ..State::default()
        };
        state.last.as_mut().unwrap().error = Some("boom".into());
        file.save(&state).unwrap();
        let loaded = file.load().unwrap();
        assert_eq!(loaded.attempts, 2);
        assert_eq!(loaded.last.unwrap().error.as_deref(), Some("boom"));
        let mode = std::fs::metadata(file.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = std::fs::metadata(file.path().parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dmode & 0o777, 0o700);
    }

    #[test]
    fn corrupt_state_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::for_stateroot(dir.path(), None, "os");
        std::fs::create_dir_all(file.path().parent().unwrap()).unwrap();
        std::fs::write(file.path(), "{not json").unwrap();
        let err = format!("{:#}", file.load().unwrap_err());
        assert!(err.contains("state.json"), "{err}");
    }

    #[test]
    fn parents_stay_readable_and_a_wide_state_dir_is_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::for_stateroot(dir.path(), None, "os");
        let pivot_dir = file.path().parent().unwrap();
        std::fs::create_dir_all(pivot_dir.parent().unwrap()).unwrap();
        std::fs::set_permissions(
            pivot_dir.parent().unwrap(),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::create_dir(pivot_dir).unwrap();
        std::fs::set_permissions(pivot_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        file.save(&State::default()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(pivot_dir), 0o700);
        assert_eq!(mode(pivot_dir.parent().unwrap()), 0o755);
        // Fresh parents (var/lib of a new stateroot) are made 0755, not 0700.
        let fresh = StateFile::for_stateroot(dir.path(), None, "other");
        fresh.save(&State::default()).unwrap();
        assert_eq!(mode(fresh.path().parent().unwrap()), 0o700);
        assert_eq!(
            mode(fresh.path().parent().unwrap().parent().unwrap()),
            0o755
        );
    }

    #[test]
    fn concurrent_saves_never_leave_a_torn_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::for_stateroot(dir.path(), None, "os");
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                let file = &file;
                scope.spawn(move || {
                    for i in 0..50u32 {
                        let state = State {
                            target: Some(format!(
                                "writer {t} {}",
                                "x".repeat((i * 37 % 200) as usize)
                            )),
                            attempts: i,
                            last: Some(Attempt::new("quay.io/os:1", PullspecSource::File)),
                            ..State::default()
                        };
                        file.save(&state).unwrap();
                        file.load().expect("every reader sees a whole state");
                    }
                });
            }
        });
        let leftovers: Vec<_> = std::fs::read_dir(file.path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "state.json")
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
