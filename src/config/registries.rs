//! containers-registries.conf(5): which registries are reached over plain HTTP.
//!
//! Read from `$CONTAINERS_REGISTRIES_CONF`, else `/etc/containers/registries.conf`. Both the v2
//! `[[registry]]` tables (`prefix`/`location`, `insecure`) and the v1
//! `[registries.insecure] registries = [...]` list are understood. A registry not marked insecure
//! is reached over TLS with verified certificates.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

pub const DEFAULT_PATH: &str = "/etc/containers/registries.conf";

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    registry: Vec<Registry>,
    #[serde(default)]
    registries: V1,
}

#[derive(Debug, Default, Deserialize)]
struct V1 {
    #[serde(default)]
    insecure: V1List,
}

#[derive(Debug, Default, Deserialize)]
struct V1List {
    #[serde(default)]
    registries: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Registry {
    prefix: Option<String>,
    location: Option<String>,
    #[serde(default)]
    insecure: bool,
}

/// The parts of registries.conf that pivot acts on.
#[derive(Debug, Default)]
pub struct RegistriesConf {
    /// (prefix, insecure), from `[[registry]]` tables.
    entries: Vec<(String, bool)>,
    /// Hosts from the v1 insecure list.
    v1_insecure: Vec<String>,
}

impl RegistriesConf {
    /// Loads the file named by `$CONTAINERS_REGISTRIES_CONF`, else the system one if it exists.
    pub fn load_default() -> Result<RegistriesConf> {
        match std::env::var_os("CONTAINERS_REGISTRIES_CONF") {
            // An explicitly named file must exist: a typo should not silently mean "all TLS".
            Some(path) => RegistriesConf::load(&PathBuf::from(path)),
            None if Path::new(DEFAULT_PATH).exists() => {
                RegistriesConf::load(Path::new(DEFAULT_PATH))
            }
            None => Ok(RegistriesConf::default()),
        }
    }

    pub fn load(path: &Path) -> Result<RegistriesConf> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading registries configuration {}", path.display()))?;
        RegistriesConf::parse(&text)
            .with_context(|| format!("parsing registries configuration {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<RegistriesConf> {
        let file: File = toml::from_str(text)?;
        let entries = file
            .registry
            .into_iter()
            .filter_map(|r| {
                let prefix = r.prefix.or(r.location)?;
                Some((prefix, r.insecure))
            })
            .collect();
        Ok(RegistriesConf {
            entries,
            v1_insecure: file.registries.insecure.registries,
        })
    }

    /// Whether `name` (`host[:port]/path`) is to be reached over plain HTTP. The longest
    /// matching `[[registry]]` prefix decides, as in containers-registries.conf(5).
    pub fn is_insecure(&self, name: &str) -> bool {
        let host = name.split('/').next().unwrap_or(name);
        let best = self
            .entries
            .iter()
            .filter(|(prefix, _)| prefix_matches(prefix, name))
            .max_by_key(|(prefix, _)| prefix.len());
        match best {
            Some((_, insecure)) => *insecure,
            None => self.v1_insecure.iter().any(|h| h == host),
        }
    }
}

/// A prefix matches whole path components: `quay.io/os` matches `quay.io/os/node`, not
/// `quay.io/osx`.
fn prefix_matches(prefix: &str, name: &str) -> bool {
    match name.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_insecure_registry_is_matched_by_host_and_port() {
        let conf = RegistriesConf::parse(
            r#"
            unqualified-search-registries = ["docker.io"]
            [[registry]]
            location = "127.0.0.1:5000"
            insecure = true
            "#,
        )
        .unwrap();
        assert!(conf.is_insecure("127.0.0.1:5000/os/node"));
        assert!(!conf.is_insecure("127.0.0.1:5001/os/node"));
        assert!(!conf.is_insecure("quay.io/os"));
    }

    #[test]
    fn longest_prefix_decides() {
        let conf = RegistriesConf::parse(
            r#"
            [[registry]]
            location = "reg.example.com"
            insecure = true
            [[registry]]
            prefix = "reg.example.com/secure"
            location = "reg.example.com/secure"
            "#,
        )
        .unwrap();
        assert!(conf.is_insecure("reg.example.com/os"));
        assert!(!conf.is_insecure("reg.example.com/secure/os"));
        assert!(conf.is_insecure("reg.example.com/secureish"));
    }

    #[test]
    fn v1_insecure_list_is_honoured() {
        let conf =
            RegistriesConf::parse("[registries.insecure]\nregistries = ['localhost:5000']\n")
                .unwrap();
        assert!(conf.is_insecure("localhost:5000/os"));
    }

    #[test]
    fn malformed_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registries.conf");
        std::fs::write(&path, "[[registry]\n").unwrap();
        let err = format!("{:#}", RegistriesConf::load(&path).unwrap_err());
        assert!(err.contains("registries.conf"), "{err}");
    }
}
