//! `/usr/lib/pivot/config.d/*.toml` (an image's defaults) and `/etc/pivot/config.d/*.toml` (the
//! admin's, which replace or mask the image's by name: [`crate::node::drop_ins`]): how the node
//! reboots into an update. Drop-ins are read in file name order and a later file's keys win, so
//! an image can ship `10-fleet.toml` and a node override one key in `90-local.toml`. Unknown sections and keys are errors, named with their
//! file, so a typo never silently keeps the default.
//!
//! ```toml
//! [reboot]
//! strategy = "fleet_lock"        # immediate (default) | fleet_lock | sentinel | never
//!
//! [reboot.fleet_lock]
//! base_url = "http://fleetlock.example.com:8080/"
//! group = "workers"              # default "default"
//! interval = 300                 # seconds between requests while waiting (default 300)
//! timeout = 1800                 # seconds one request may take (default 1800)
//!
//! [health]
//! timeout = 300                  # seconds one /etc/pivot/health.d check may run (default 300)
//!
//! [boot]
//! tries = 3                      # boots GRUB gives a new deployment (1-9, default 3)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node::drop_ins::{ADMIN_DIR, VENDOR_DIR};

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;

/// The admin's drop-ins, relative to the system's `/etc` (the image's are under
/// `/usr/lib/pivot/config.d`: see [`crate::node::drop_ins`]).
#[cfg(test)]
const CONFIG_DIR: &str = "pivot/config.d";
/// The drop-in directory, under `/usr/lib/pivot` and `/etc/pivot`.
const CONFIG_D: &str = "config.d";
/// Boots GRUB gives a new deployment that never reaches `pivot confirm` before it falls back
/// ([`crate::sysroot::grubenv`]): greenboot's default (`GREENBOOT_MAX_BOOT_ATTEMPTS`).
pub const DEFAULT_BOOT_TRIES: u8 = 3;
/// The most `[boot] tries` can be: a bound for a mistyped setting (the shipped GRUB counter
/// counts down any value, packaging/grub).
pub const MAX_BOOT_TRIES: u8 = 9;
/// The FleetLock group of a node that names none, as zincati's.
pub const DEFAULT_GROUP: &str = "default";
/// Between two FleetLock requests while pivot waits (for a slot, or to give one back):
/// zincati's `DEFAULT_REFRESH_PERIOD_SECS`, the period its agent asks `pre-reboot` and retries
/// `steady-state` at. A fleet of pivots then loads a server as a fleet of zincatis does.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// How long one FleetLock request may take: zincati's `DEFAULT_HTTP_COMPLETION_TIMEOUT`.
/// poseidon/fleetlock cordons the node and evicts its pods inside the `pre-reboot` request,
/// with no bound of its own, before it answers.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The largest `interval` or `timeout`: a day.
pub const MAX_SECONDS: u64 = 24 * 3600;

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
    /// As configured: endpoints are `v1/pre-reboot` and `v1/steady-state` resolved against it
    /// as a URL reference, as zincati resolves them (`Url::join`), so `http://h/fleetlock/`
    /// serves under `/fleetlock/v1/...` and `http://h/fleetlock` under `/v1/...`.
    pub base_url: String,
    pub group: String,
    /// Between two requests while waiting ([`DEFAULT_INTERVAL`]), jittered as zincati's.
    pub interval: Duration,
    /// How long one request may take ([`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
}

impl FleetLock {
    /// A server at `base_url`, group `group`, with zincati's cadence and timeout.
    pub fn new(base_url: &str, group: &str) -> FleetLock {
        FleetLock {
            base_url: base_url.to_string(),
            group: group.to_string(),
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub strategy: Strategy,
    /// How long one health check may run ([`crate::node::health`]).
    pub health_timeout: std::time::Duration,
    /// `[boot] tries`: the `boot_counter` staging arms GRUB's fallback with.
    pub boot_tries: u8,
    /// `[signatures] require_policy`: without a signature policy file, refuse every image
    /// instead of pulling without checking signatures (see docs/signatures.md).
    pub require_policy: bool,
    /// The drop-ins read, in order (for messages).
    pub files: Vec<PathBuf>,
    /// The drop-in each key that is set came from (`reboot.strategy`, …); the others are
    /// defaults.
    pub sources: BTreeMap<&'static str, PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            strategy: Strategy::default(),
            health_timeout: crate::node::health::DEFAULT_TIMEOUT,
            boot_tries: DEFAULT_BOOT_TRIES,
            require_policy: false,
            files: Vec::new(),
            sources: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DropIn {
    reboot: Option<RebootSection>,
    health: Option<HealthSection>,
    boot: Option<BootSection>,
    signatures: Option<SignaturesSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignaturesSection {
    require_policy: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BootSection {
    tries: Option<i64>,
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
    /// Seconds.
    interval: Option<u64>,
    /// Seconds.
    timeout: Option<u64>,
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
        let mut files = crate::node::drop_ins::list(etc, CONFIG_D)?;
        files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
        let (mut strategy, mut base_url, mut group) = (None, None, None);
        let (mut interval, mut timeout) = (None, None);
        let mut health_timeout = None;
        let mut boot_tries = None;
        let mut require_policy = None;
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
                health_timeout = Some((std::time::Duration::from_secs(timeout), file.clone()));
            }
            if let Some(tries) = drop_in.boot.and_then(|b| b.tries) {
                ensure!(
                    (1..=i64::from(MAX_BOOT_TRIES)).contains(&tries),
                    "{}: boot.tries must be 1 to {MAX_BOOT_TRIES} (boots of a new deployment before GRUB falls back), not {tries}",
                    file.display()
                );
                boot_tries = Some((tries as u8, file.clone()));
            }
            if let Some(require) = drop_in.signatures.and_then(|s| s.require_policy) {
                require_policy = Some((require, file.clone()));
            }
            let Some(reboot) = drop_in.reboot else { continue };
            strategy = reboot.strategy.map(|s| (s, file.clone())).or(strategy);
            if let Some(fleet_lock) = reboot.fleet_lock {
                base_url = fleet_lock.base_url.map(|u| (u, file.clone())).or(base_url);
                group = fleet_lock.group.map(|g| (g, file.clone())).or(group);
                for (value, key, slot) in [
                    (fleet_lock.interval, "interval", &mut interval),
                    (fleet_lock.timeout, "timeout", &mut timeout),
                ] {
                    if let Some(seconds) = value {
                        ensure!(
                            (1..=MAX_SECONDS).contains(&seconds),
                            "{}: reboot.fleet_lock.{key} must be 1 to {MAX_SECONDS} (seconds), not {seconds}",
                            file.display()
                        );
                        *slot = Some((Duration::from_secs(seconds), file.clone()));
                    }
                }
            }
        }
        let mut sources = BTreeMap::new();
        if let Some((_, file)) = &strategy {
            sources.insert("reboot.strategy", file.clone());
        }
        if let Some((_, file)) = &health_timeout {
            sources.insert("health.timeout", file.clone());
        }
        if let Some((_, file)) = &boot_tries {
            sources.insert("boot.tries", file.clone());
        }
        if let Some((_, file)) = &require_policy {
            sources.insert("signatures.require_policy", file.clone());
        }
        let strategy = match strategy.map_or(StrategyName::Immediate, |(s, _)| s) {
            StrategyName::Immediate => Strategy::Immediate,
            StrategyName::Sentinel => Strategy::Sentinel,
            StrategyName::Never => Strategy::Never,
            StrategyName::FleetLock => {
                let Some((url, file)) = base_url else {
                    bail!(
                        "reboot.strategy is fleet_lock but no drop-in (/{VENDOR_DIR}/{CONFIG_D}, {}) sets reboot.fleet_lock.base_url",
                        etc.join(ADMIN_DIR).join(CONFIG_D).display()
                    );
                };
                sources.insert("reboot.fleet_lock.base_url", file.clone());
                let parsed = reqwest::Url::parse(&url).ok();
                ensure!(
                    parsed.as_ref().is_some_and(|u| {
                        matches!(u.scheme(), "http" | "https") && u.host().is_some()
                    }),
                    "{}: reboot.fleet_lock.base_url {url:?} is not an http:// or https:// URL",
                    file.display()
                );
                if let Some((_, file)) = &interval {
                    sources.insert("reboot.fleet_lock.interval", file.clone());
                }
                if let Some((_, file)) = &timeout {
                    sources.insert("reboot.fleet_lock.timeout", file.clone());
                }
                let group = match group {
                    Some((group, file)) => {
                        sources.insert("reboot.fleet_lock.group", file.clone());
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
                    base_url: url,
                    group,
                    interval: interval.map_or(DEFAULT_INTERVAL, |(d, _)| d),
                    timeout: timeout.map_or(DEFAULT_TIMEOUT, |(d, _)| d),
                })
            }
        };
        Ok(Config {
            strategy,
            health_timeout: health_timeout.map_or(crate::node::health::DEFAULT_TIMEOUT, |(t, _)| t),
            boot_tries: boot_tries.map_or(DEFAULT_BOOT_TRIES, |(t, _)| t),
            require_policy: require_policy.is_some_and(|(r, _)| r),
            files,
            sources,
        })
    }
}

impl Config {
    /// Every key with its value and the drop-in that set it (`None`: the default), for
    /// `pivot config`.
    pub fn keys(&self) -> Vec<(&'static str, String, Option<&Path>)> {
        let from = |key| self.sources.get(key).map(PathBuf::as_path);
        let mut keys = vec![(
            "reboot.strategy",
            match &self.strategy {
                Strategy::Immediate => "immediate",
                Strategy::FleetLock(_) => "fleet_lock",
                Strategy::Sentinel => "sentinel",
                Strategy::Never => "never",
            }
            .to_string(),
            from("reboot.strategy"),
        )];
        if let Strategy::FleetLock(lock) = &self.strategy {
            keys.push((
                "reboot.fleet_lock.base_url",
                lock.base_url.clone(),
                from("reboot.fleet_lock.base_url"),
            ));
            keys.push((
                "reboot.fleet_lock.group",
                lock.group.clone(),
                from("reboot.fleet_lock.group"),
            ));
            keys.push((
                "reboot.fleet_lock.interval",
                lock.interval.as_secs().to_string(),
                from("reboot.fleet_lock.interval"),
            ));
            keys.push((
                "reboot.fleet_lock.timeout",
                lock.timeout.as_secs().to_string(),
                from("reboot.fleet_lock.timeout"),
            ));
        }
        keys.push((
            "health.timeout",
            self.health_timeout.as_secs().to_string(),
            from("health.timeout"),
        ));
        keys.push((
            "boot.tries",
            self.boot_tries.to_string(),
            from("boot.tries"),
        ));
        keys.push((
            "signatures.require_policy",
            self.require_policy.to_string(),
            from("signatures.require_policy"),
        ));
        keys
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
    fn the_images_defaults_apply_unless_etc_replaces_or_masks_them() {
        let root = tempfile::tempdir().unwrap();
        let vendor = root.path().join("usr/lib/pivot/config.d");
        let etc = root.path().join("etc");
        std::fs::create_dir_all(&vendor).unwrap();
        std::fs::create_dir_all(etc.join(CONFIG_DIR)).unwrap();
        std::fs::write(
            vendor.join("10-fleet.toml"),
            "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"http://lock:8080/\"\n",
        )
        .unwrap();
        std::fs::write(vendor.join("20-health.toml"), "[health]\ntimeout = 60\n").unwrap();
        std::fs::write(
            etc.join(CONFIG_DIR).join("50-group.toml"),
            "[reboot.fleet_lock]\ngroup = \"canary\"\n",
        )
        .unwrap();
        let config = Config::load(&etc).unwrap();
        assert_eq!(
            config.strategy,
            Strategy::FleetLock(FleetLock::new("http://lock:8080/", "canary"))
        );
        assert_eq!(config.health_timeout.as_secs(), 60);
        let keys = config.keys();
        assert_eq!(
            keys[0],
            ("reboot.strategy", "fleet_lock".into(), Some(vendor.join("10-fleet.toml").as_path()))
        );
        assert_eq!(keys[2].2, Some(etc.join(CONFIG_DIR).join("50-group.toml").as_path()));
        // The admin masks the image's fleet file: the default strategy again.
        std::os::unix::fs::symlink("/dev/null", etc.join(CONFIG_DIR).join("10-fleet.toml")).unwrap();
        let config = Config::load(&etc).unwrap();
        assert_eq!(config.strategy, Strategy::Immediate);
        assert_eq!(config.keys()[0].2, None);
    }

    #[test]
    fn boot_tries_default_to_greenboots_and_are_bounded() {
        assert_eq!(load(&[]).unwrap().boot_tries, 3);
        let config = load(&[("10-a.toml", "[boot]\ntries = 1\n"), ("20-b.toml", "[boot]\ntries = 9\n")]).unwrap();
        assert_eq!(config.boot_tries, 9);
        assert!(config.keys().contains(&("boot.tries", "9".into(), config.sources.get("boot.tries").map(PathBuf::as_path))));
        for bad in ["0", "10", "-1"] {
            let e = load(&[("50-x.toml", &format!("[boot]\ntries = {bad}\n"))]).unwrap_err().to_string();
            assert!(e.contains("50-x.toml") && e.contains("boot.tries") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn a_signature_policy_is_required_only_when_a_drop_in_says_so() {
        let open = load(&[]).unwrap();
        assert!(!open.require_policy);
        assert!(open.keys().contains(&("signatures.require_policy", "false".into(), None)));
        let config = load(&[
            ("10-a.toml", "[signatures]\nrequire_policy = true\n"),
            ("20-b.toml", "[health]\ntimeout = 5\n"),
        ])
        .unwrap();
        assert!(config.require_policy);
        let from = config.sources.get("signatures.require_policy").unwrap();
        assert!(from.ends_with("10-a.toml"), "{}", from.display());
        let e = load(&[("50-x.toml", "[signatures]\nrequire_policy = \"yes\"\n")]).unwrap_err();
        assert!(e.to_string().contains("50-x.toml"), "{e}");
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
            Strategy::FleetLock(FleetLock::new("http://lock:8080/", "canary"))
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
        for bad in ["interval = 0", "timeout = 0", "interval = 86401"] {
            let e = err(&[(
                "50-x.toml",
                &format!("[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"http://l/\"\n{bad}\n"),
            )]);
            let key = bad.split(' ').next().unwrap();
            assert!(e.contains("50-x.toml") && e.contains(&format!("reboot.fleet_lock.{key}")), "{e}");
        }
    }

    #[test]
    fn the_cadence_is_zincatis_unless_configured() {
        let fleet = "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"http://l/fl\"\n";
        let Strategy::FleetLock(lock) = load(&[("10-f.toml", fleet)]).unwrap().strategy else {
            panic!("not fleet_lock")
        };
        assert_eq!((lock.interval.as_secs(), lock.timeout.as_secs()), (300, 1800));
        // Kept as written: the endpoints are resolved against it as zincati resolves them.
        assert_eq!(lock.base_url, "http://l/fl");
        let config = load(&[
            ("10-f.toml", fleet),
            ("20-t.toml", "[reboot.fleet_lock]\ninterval = 30\ntimeout = 600\n"),
        ])
        .unwrap();
        let Strategy::FleetLock(lock) = &config.strategy else { panic!("not fleet_lock") };
        assert_eq!((lock.interval.as_secs(), lock.timeout.as_secs()), (30, 600));
        assert!(config
            .keys()
            .iter()
            .any(|(k, v, from)| *k == "reboot.fleet_lock.interval" && v == "30" && from.is_some_and(|p| p.ends_with("20-t.toml"))));
    }
}
