//! `/etc/pivot/config.d/*.toml`: how the node reboots into an update. Drop-ins are read in file
//! name order and a later file's keys win, so a cluster can ship `10-fleet.toml` and a node
//! override one key in `90-local.toml`. Unknown sections and keys are errors, named with their
//! file, so a typo never silently keeps the default.
//!
//! ```toml
//! [reboot]
//! strategy = "fleet_lock"        # immediate (default) | fleet_lock | sentinel | never
//!
//! [reboot.fleet_lock]
//! base_url = "http://fleetlock.example.com:8080/"
//! group = "workers"              # default "default"
//!
//! [health]
//! timeout = 300                  # seconds one /etc/pivot/health.d check may run (default 300)
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;

/// Relative to the system's `/etc`.
pub const CONFIG_DIR: &str = "pivot/config.d";
/// The FleetLock group of a node that names none, as zincati's.
pub const DEFAULT_GROUP: &str = "default";

/// When a node reboots into a staged update.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Strategy {
    /// At once (pivot's behaviour without configuration).
    #[default]
    Immediate,
    /// Once a FleetLock server grants a reboot slot.
    FleetLock(FleetLock),
    /// Never by itself: `/run/reboot-required` tells kured (or an admin) that one is due.
    Sentinel,
    /// Never by itself, and says so: the update applies at the next reboot, whoever makes it.
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetLock {
    /// Without a trailing `/`: endpoints are `<base>/v1/...`.
    pub base_url: String,
    pub group: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub strategy: Strategy,
    /// How long one health check may run ([`crate::node::health`]).
    pub health_timeout: std::time::Duration,
    /// The drop-ins read, in order (for messages).
    pub files: Vec<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            strategy: Strategy::default(),
            health_timeout: crate::node::health::DEFAULT_TIMEOUT,
            files: Vec::new(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DropIn {
    reboot: Option<RebootSection>,
    health: Option<HealthSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthSection {
    /// Seconds.
    timeout: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RebootSection {
    strategy: Option<StrategyName>,
    fleet_lock: Option<FleetLockSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetLockSection {
    base_url: Option<String>,
    group: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StrategyName {
    Immediate,
    FleetLock,
    Sentinel,
    Never,
}

impl Config {
    /// Reads the drop-ins under `etc` (the system's `/etc`); none is the default configuration.
    pub fn load(etc: &Path) -> Result<Config> {
        let dir = etc.join(CONFIG_DIR);
        let mut files = match std::fs::read_dir(&dir) {
            Ok(entries) => entries
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<Vec<_>>>()
                .with_context(|| format!("reading {}", dir.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
        files.sort();
        let (mut strategy, mut base_url, mut group) = (None, None, None);
        let mut health_timeout = None;
        for file in &files {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let drop_in: DropIn = toml::from_str(&text).map_err(|e| {
                anyhow::anyhow!("{}: {}", file.display(), crate::node::logging::one_line(&e.to_string()))
            })?;
            if let Some(timeout) = drop_in.health.and_then(|h| h.timeout) {
                ensure!(
                    timeout > 0,
                    "{}: health.timeout must be at least 1 (seconds)",
                    file.display()
                );
                health_timeout = Some(std::time::Duration::from_secs(timeout));
            }
            let Some(reboot) = drop_in.reboot else { continue };
            strategy = reboot.strategy.or(strategy);
            if let Some(fleet_lock) = reboot.fleet_lock {
                base_url = fleet_lock.base_url.map(|u| (u, file.clone())).or(base_url);
                group = fleet_lock.group.map(|g| (g, file.clone())).or(group);
            }
        }
        let strategy = match strategy.unwrap_or(StrategyName::Immediate) {
            StrategyName::Immediate => Strategy::Immediate,
            StrategyName::Sentinel => Strategy::Sentinel,
            StrategyName::Never => Strategy::Never,
            StrategyName::FleetLock => {
                let Some((url, file)) = base_url else {
                    bail!(
                        "reboot.strategy is fleet_lock but no file of {} sets reboot.fleet_lock.base_url",
                        dir.display()
                    );
                };
                ensure!(
                    url.starts_with("http://") || url.starts_with("https://"),
                    "{}: reboot.fleet_lock.base_url {url:?} is not an http:// or https:// URL",
                    file.display()
                );
                let group = match group {
                    Some((group, file)) => {
                        ensure!(
                            !group.is_empty()
                                && group
                                    .bytes()
                                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'),
                            "{}: reboot.fleet_lock.group {group:?} is not a FleetLock group (letters, digits, '.' and '-')",
                            file.display()
                        );
                        group
                    }
                    None => DEFAULT_GROUP.to_string(),
                };
                Strategy::FleetLock(FleetLock {
                    base_url: url.trim_end_matches('/').to_string(),
                    group,
                })
            }
        };
        Ok(Config {
            strategy,
            health_timeout: health_timeout.unwrap_or(crate::node::health::DEFAULT_TIMEOUT),
            files,
        })
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn load(files: &[(&str, &str)]) -> Result<Config> {
        let etc = tempfile::tempdir().unwrap();
        let dir = etc.path().join(CONFIG_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        Config::load(etc.path())
    }

    #[test]
    fn no_configuration_reboots_at_once() {
        let etc = tempfile::tempdir().unwrap();
        assert_eq!(Config::load(etc.path()).unwrap().strategy, Strategy::Immediate);
        assert_eq!(load(&[("a.conf", "junk")]).unwrap().strategy, Strategy::Immediate);
    }

    #[test]
    fn later_drop_ins_win_key_by_key() {
        let config = load(&[
            (
                "10-fleet.toml",
                "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"http://lock:8080/\"\ngroup = \"workers\"\n",
            ),
            ("90-local.toml", "[reboot.fleet_lock]\ngroup = \"canary\"\n"),
        ])
        .unwrap();
        assert_eq!(
            config.strategy,
            Strategy::FleetLock(FleetLock {
                base_url: "http://lock:8080".into(),
                group: "canary".into()
            })
        );
        let config = load(&[
            ("10-fleet.toml", "[reboot]\nstrategy = \"fleet_lock\"\n"),
            ("20-off.toml", "[reboot]\nstrategy = \"sentinel\"\n"),
        ])
        .unwrap();
        assert_eq!(config.strategy, Strategy::Sentinel);
    }

    #[test]
    fn the_health_check_bound_is_read_in_seconds() {
        use std::time::Duration;
        let etc = tempfile::tempdir().unwrap();
        let config = Config::load(etc.path()).unwrap();
        assert_eq!(config.health_timeout, Duration::from_secs(300));
        let config = load(&[("10-health.toml", "[health]\ntimeout = 45\n")]).unwrap();
        assert_eq!(config.health_timeout, Duration::from_secs(45));
        assert_eq!(config.strategy, Strategy::Immediate);
        let e = format!("{:#}", load(&[("10-h.toml", "[health]\ntimeout = 0\n")]).unwrap_err());
        assert!(e.contains("10-h.toml") && e.contains("health.timeout"), "{e}");
    }

    #[test]
    fn mistakes_name_the_file_and_the_key() {
        let err = |files: &[(&str, &str)]| format!("{:#}", load(files).unwrap_err());
        let e = err(&[("50-x.toml", "[reboot]\nstrategy = \"later\"\n")]);
        assert!(e.contains("50-x.toml") && e.contains("later") && !e.contains('\n'), "{e}");
        let e = err(&[("50-x.toml", "[reboot]\nstrategey = \"never\"\n")]);
        assert!(e.contains("50-x.toml") && e.contains("strategey"), "{e}");
        let e = err(&[("50-x.toml", "[reboot]\nstrategy = \"fleet_lock\"\n")]);
        assert!(e.contains("reboot.fleet_lock.base_url"), "{e}");
        let e = err(&[(
            "50-x.toml",
            "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"lock:8080\"\n",
        )]);
        assert!(e.contains("50-x.toml") && e.contains("base_url"), "{e}");
        let e = err(&[(
            "50-x.toml",
            "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"http://l\"\ngroup = \"a b\"\n",
        )]);
        assert!(e.contains("50-x.toml") && e.contains("reboot.fleet_lock.group"), "{e}");
    }
}
