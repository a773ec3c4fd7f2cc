//! containers-registries.conf(5), v2 format: where an image is pulled from.
//!
//! Read from `$CONTAINERS_REGISTRIES_CONF`, else `/etc/containers/registries.conf` and the
//! drop-ins in `/etc/containers/registries.conf.d/*.conf` (in name order; a later `[[registry]]`
//! with the same prefix replaces an earlier one). What pivot acts on:
//! - `[[registry]]` `prefix` (default: `location`; `*.example.com` matches subdomains) chooses the
//!   entry with the longest match;
//! - `location` rewrites the matched prefix;
//! - `[[registry.mirror]]` entries are tried in order before the primary (a mirror with
//!   `pull-from-mirror = "digest-only"`, or an entry with `mirror-by-digest-only = true`, only
//!   for pullspecs pinned by digest);
//! - `insecure = true` means TLS without certificate verification, or plain HTTP for a registry
//!   that does not speak TLS (otherwise TLS, verified; see `crate::fetch::registry::insecure`);
//! - `blocked = true` refuses the pull.
//!
//! The v1 `[registries.insecure]` / `[registries.block]` lists are honoured too.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::fetch::reference::ImageRef;

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
    #[serde(default)]
    block: V1List,
}

#[derive(Debug, Default, Deserialize)]
struct V1List {
    #[serde(default)]
    registries: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Registry {
    prefix: Option<String>,
    location: Option<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror_by_digest_only: bool,
    #[serde(default)]
    mirror: Vec<Mirror>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Mirror {
    location: String,
    #[serde(default)]
    insecure: bool,
    pull_from_mirror: Option<String>,
}

/// One place to try pulling an image from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The image as named at this place (tag and digest kept).
    pub image: ImageRef,
    /// Plain HTTP.
    pub insecure: bool,
    pub mirror: bool,
}

#[derive(Debug, Default)]
pub struct RegistriesConf {
    entries: Vec<Registry>,
    v1_insecure: Vec<String>,
    v1_blocked: Vec<String>,
}

impl RegistriesConf {
    /// Loads `$CONTAINERS_REGISTRIES_CONF`, else the system file and its drop-ins.
    pub fn load_default() -> Result<RegistriesConf> {
        match std::env::var_os("CONTAINERS_REGISTRIES_CONF") {
            // An explicitly named file must exist: a typo should not silently mean "all TLS".
            Some(path) => RegistriesConf::load(&PathBuf::from(path)),
            None => {
                let mut conf = if Path::new(DEFAULT_PATH).exists() {
                    RegistriesConf::load(Path::new(DEFAULT_PATH))?
                } else {
                    RegistriesConf::default()
                };
                for dropin in dropins(Path::new("/etc/containers/registries.conf.d"))? {
                    conf.merge(RegistriesConf::load(&dropin)?);
                }
                Ok(conf)
            }
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
        for r in &file.registry {
            if r.prefix.is_none() && r.location.is_none() {
                bail!("a [[registry]] entry has neither prefix nor location");
            }
        }
        Ok(RegistriesConf {
            entries: file.registry,
            v1_insecure: file.registries.insecure.registries,
            v1_blocked: file.registries.block.registries,
        })
    }

    fn merge(&mut self, later: RegistriesConf) {
        for entry in later.entries {
            let prefix = entry_prefix(&entry).to_string();
            self.entries.retain(|e| entry_prefix(e) != prefix);
            self.entries.push(entry);
        }
        self.v1_insecure.extend(later.v1_insecure);
        self.v1_blocked.extend(later.v1_blocked);
    }

    /// The places to pull `image` from, in order: mirrors first, then the primary.
    pub fn sources(&self, image: &ImageRef) -> Result<Vec<Source>> {
        let name = image.name();
        let host = image.registry.as_str();
        let Some(entry) = self
            .entries
            .iter()
            .filter(|e| prefix_matches(entry_prefix(e), &name))
            .max_by_key(|e| entry_prefix(e).len())
        else {
            if self.v1_blocked.iter().any(|h| h == host) {
                bail!("registry {host} is blocked in registries.conf");
            }
            return Ok(vec![Source {
                image: image.clone(),
                insecure: self.v1_insecure.iter().any(|h| h == host),
                mirror: false,
            }]);
        };
        let prefix = entry_prefix(entry);
        if entry.blocked {
            bail!("pulling {name} is blocked in registries.conf ([[registry]] prefix {prefix:?})");
        }
        let by_digest = image.digest.is_some();
        let mut sources = Vec::new();
        for mirror in &entry.mirror {
            let digest_only = match mirror.pull_from_mirror.as_deref() {
                Some("digest-only") => true,
                // A tag-only mirror must not serve a digest pull.
                Some("tag-only") if by_digest => continue,
                Some("tag-only") => false,
                Some("all") => false,
                _ => entry.mirror_by_digest_only,
            };
            if digest_only && !by_digest {
                continue;
            }
            sources.push(Source {
                image: rewrite(image, prefix, &mirror.location)?,
                insecure: mirror.insecure,
                mirror: true,
            });
        }
        let location = entry.location.as_deref().unwrap_or(prefix);
        sources.push(Source {
            image: rewrite(image, prefix, location)?,
            insecure: entry.insecure,
            mirror: false,
        });
        Ok(sources)
    }

    /// Whether `name` (`host[:port]/path`) is reached over plain HTTP when pulled from its primary.
    #[cfg(any(test, feature = "internal-testing-api"))]
    pub fn is_insecure(&self, image: &ImageRef) -> bool {
        self.sources(image)
            .ok()
            .and_then(|s| s.last().map(|s| s.insecure))
            .unwrap_or(false)
    }
}

fn entry_prefix(r: &Registry) -> &str {
    r.prefix
        .as_deref()
        .or(r.location.as_deref())
        .unwrap_or_default()
}

/// A prefix matches whole path components: `quay.io/os` matches `quay.io/os/node`, not
/// `quay.io/osx`; `*.example.com` matches any subdomain's host.
fn prefix_matches(prefix: &str, name: &str) -> bool {
    if let Some(domain) = prefix.strip_prefix("*.") {
        let host = name.split('/').next().unwrap_or_default();
        let host = host.split(':').next().unwrap_or_default();
        return host.ends_with(&format!(".{domain}"));
    }
    match name.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/'),
        None => false,
    }
}

/// Replaces the part of `image`'s name matched by `prefix` with `location`.
fn rewrite(image: &ImageRef, prefix: &str, location: &str) -> Result<ImageRef> {
    let name = image.name();
    let rest = if prefix.starts_with("*.") {
        // A wildcard entry keeps the whole name; its location can only be the host itself.
        return Ok(image.clone());
    } else {
        &name[prefix.len()..]
    };
    let mut spec = format!("{}{rest}", location.trim_end_matches('/'));
    if let Some(tag) = &image.tag {
        spec.push(':');
        spec.push_str(tag);
    }
    if let Some(digest) = &image.digest {
        spec.push('@');
        spec.push_str(digest);
    }
    ImageRef::parse(&spec)
        .with_context(|| format!("registries.conf rewrites {name} to an invalid name"))
}

fn dropins(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(spec: &str) -> ImageRef {
        ImageRef::parse(spec).unwrap()
    }

    fn names(conf: &RegistriesConf, spec: &str) -> Vec<String> {
        conf.sources(&image(spec))
            .unwrap()
            .iter()
            .map(|s| format!("{}{}", s.image, if s.insecure { " (http)" } else { "" }))
            .collect()
    }

    #[test]
    fn insecure_registry_is_matched_by_host_and_port() {
        let conf = RegistriesConf::parse(
            "unqualified-search-registries = [\"docker.io\"]\n[[registry]]\nlocation = \"127.0.0.1:5000\"\ninsecure = true\n",
        )
        .unwrap();
        assert!(conf.is_insecure(&image("127.0.0.1:5000/os/node")));
        assert!(!conf.is_insecure(&image("127.0.0.1:5001/os/node")));
        assert!(!conf.is_insecure(&image("quay.io/os")));
    }

    #[test]
    fn mirrors_come_first_then_the_rewritten_primary() {
        let conf = RegistriesConf::parse(
            r#"
            [[registry]]
            prefix = "quay.io/openshift"
            location = "internal.example.com/ocp"
            [[registry.mirror]]
            location = "mirror-a.example.com:5000/ocp"
            insecure = true
            [[registry.mirror]]
            location = "mirror-b.example.com/ocp"
            pull-from-mirror = "digest-only"
            "#,
        )
        .unwrap();
        assert_eq!(
            names(&conf, "quay.io/openshift/os:4.1"),
            vec![
                "mirror-a.example.com:5000/ocp/os:4.1 (http)",
                "internal.example.com/ocp/os:4.1"
            ]
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            names(&conf, &format!("quay.io/openshift/os@{digest}")),
            vec![
                format!("mirror-a.example.com:5000/ocp/os@{digest} (http)"),
                format!("mirror-b.example.com/ocp/os@{digest}"),
                format!("internal.example.com/ocp/os@{digest}"),
            ]
        );
        // Not under the prefix: untouched.
        assert_eq!(names(&conf, "quay.io/other/os"), vec!["quay.io/other/os"]);
    }

    #[test]
    fn mirror_by_digest_only_skips_mirrors_for_tags() {
        let conf = RegistriesConf::parse(
            "[[registry]]\nlocation = \"quay.io\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"m.example.com\"\n",
        )
        .unwrap();
        assert_eq!(names(&conf, "quay.io/os:1"), vec!["quay.io/os:1"]);
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
        assert!(conf.is_insecure(&image("reg.example.com/os")));
        assert!(!conf.is_insecure(&image("reg.example.com/secure/os")));
        assert!(conf.is_insecure(&image("reg.example.com/secureish")));
    }

    #[test]
    fn blocked_registries_are_refused_naming_the_entry() {
        let conf = RegistriesConf::parse(
            "[[registry]]\nprefix = \"quay.io/bad\"\nlocation = \"quay.io/bad\"\nblocked = true\n[registries.block]\nregistries = ['evil.example.com']\n",
        )
        .unwrap();
        let err = conf
            .sources(&image("quay.io/bad/os"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("blocked") && err.contains("quay.io/bad"),
            "{err}"
        );
        let err = conf
            .sources(&image("evil.example.com/os"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("evil.example.com is blocked"), "{err}");
        assert!(conf.sources(&image("quay.io/good/os")).is_ok());
    }

    #[test]
    fn wildcard_prefix_matches_subdomains() {
        let conf =
            RegistriesConf::parse("[[registry]]\nprefix = \"*.internal\"\ninsecure = true\n")
                .unwrap();
        assert!(conf.is_insecure(&image("reg.internal:5000/os")));
        assert!(!conf.is_insecure(&image("internal.example.com/os")));
    }

    #[test]
    fn v1_insecure_list_is_honoured() {
        let conf =
            RegistriesConf::parse("[registries.insecure]\nregistries = ['localhost:5000']\n")
                .unwrap();
        assert!(conf.is_insecure(&image("localhost:5000/os")));
    }

    #[test]
    fn dropins_replace_entries_with_the_same_prefix() {
        let mut conf =
            RegistriesConf::parse("[[registry]]\nlocation = \"r.example.com\"\ninsecure = true\n")
                .unwrap();
        conf.merge(RegistriesConf::parse("[[registry]]\nlocation = \"r.example.com\"\n").unwrap());
        assert!(!conf.is_insecure(&image("r.example.com/os")));
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
