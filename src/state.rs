//! What pivot attempted and how it ended, kept under the stateroot's
//! `/var/lib/pivot/state.json` (mode 0600, directory 0700), so that a pivot that did not take
//! effect is noticed on the next boot and a target that keeps failing is given up on instead of
//! becoming a reboot loop. Only `pivot` writes it; `pivot status` shows it.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Attempts at one pullspec-file target before pivot stops trying (and stops rebooting).
pub const MAX_ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    /// The pullspec from `/etc/pivot/image-pullspec` being pursued.
    pub target: Option<String>,
    /// Runs for `target` that started without the node running it yet.
    pub attempts: u32,
    pub last: Option<Attempt>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attempt {
    pub pullspec: String,
    /// `argument` or `file`.
    pub source: String,
    /// Seconds since the Unix epoch.
    pub started: u64,
    /// `running`, `staged`, `deployed`, `unchanged`, `confirmed` or `failed`.
    pub outcome: String,
    pub digest: Option<String>,
    pub commit: Option<String>,
    pub error: Option<String>,
}

impl Attempt {
    pub fn new(pullspec: &str, source: &str) -> Attempt {
        Attempt {
            pullspec: pullspec.to_string(),
            source: source.to_string(),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
            outcome: "running".into(),
            digest: None,
            commit: None,
            error: None,
        }
    }
}

/// The state file of one stateroot.
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn for_stateroot(sysroot: &Path, stateroot: &str) -> StateFile {
        StateFile {
            path: sysroot
                .join("ostree/deploy")
                .join(stateroot)
                .join("var/lib/pivot/state.json"),
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

    /// Replaces the file atomically, so a crash leaves either the old or the new state.
    pub fn save(&self, state: &State) -> Result<()> {
        let dir = self.path.parent().expect("state path has a parent");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(".state.json.tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        file.write_all(&serde_json::to_vec_pretty(state)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("replacing {}", self.path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn state_round_trips_with_tight_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::for_stateroot(dir.path(), "os");
        assert_eq!(file.load().unwrap().attempts, 0);
        let mut state = State {
            target: Some("quay.io/os:1".into()),
            attempts: 2,
            last: Some(Attempt::new("quay.io/os:1", "file")),
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
        let file = StateFile::for_stateroot(dir.path(), "os");
        std::fs::create_dir_all(file.path().parent().unwrap()).unwrap();
        std::fs::write(file.path(), "{not json").unwrap();
        let err = format!("{:#}", file.load().unwrap_err());
        assert!(err.contains("state.json"), "{err}");
    }
}
