//! containers-registries.d(5): where an image's signatures are kept. Every `*.yaml` file of the
//! directory is read (a scope defined twice is an error, as in the containers tools); per
//! scope, `lookaside` (or its older name `sigstore`) is the URL of a signature store and
//! `use-sigstore-attachments` says signatures are attached in the registry. The `-staging`
//! keys are for writers and ignored. Scopes match like policy.json's docker scopes: the
//! reference with its tag or digest, the repository, its namespaces, the host, `*.domain`
//! wildcards, then `default-docker`; each setting separately, as in containers/image, so a
//! scope that sets only `use-sigstore-attachments` still takes its lookaside from an enclosing
//! scope. With no lookaside anywhere, the built-in default `file:///var/lib/containers/sigstore`
//! applies (containers/image's, for root).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::identity;
use super::policy::repository_scopes;
use crate::fetch::reference::ImageRef;

pub const DEFAULT_DIR: &str = "/etc/containers/registries.d";
/// containers/image's lookaside for root when registries.d names none.
pub const DEFAULT_LOOKASIDE: &str = "file:///var/lib/containers/sigstore";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct File {
    #[serde(default)]
    default_docker: Option<Storage>,
    #[serde(default)]
    docker: BTreeMap<String, Storage>,
}

/// Where the signatures of a scope are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Storage {
    #[serde(default)]
    pub lookaside: Option<String>,
    #[serde(default)]
    lookaside_staging: Option<String>,
    /// The older name of `lookaside`.
    #[serde(default)]
    sigstore: Option<String>,
    #[serde(default)]
    sigstore_staging: Option<String>,
    #[serde(default)]
    pub use_sigstore_attachments: Option<bool>,
}

impl Storage {
    /// The signature store's URL, by either of its names.
    pub fn lookaside(&self) -> Option<&str> {
        self.lookaside.as_deref().or(self.sigstore.as_deref())
    }
}

/// The merged configuration of a registries.d directory.
#[derive(Debug, Clone, Default)]
pub struct RegistriesD {
    default_docker: Option<Storage>,
    docker: BTreeMap<String, Storage>,
}

impl RegistriesD {
    /// Reads `dir`; a missing directory is an empty configuration.
    pub fn load(dir: &Path) -> Result<RegistriesD> {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        files.sort();
        let mut merged = RegistriesD::default();
        for path in files {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            merged
                .add(&text)
                .with_context(|| format!("reading {}", path.display()))?;
        }
        Ok(merged)
    }

    /// Adds one file's configuration.
    pub fn add(&mut self, text: &str) -> Result<()> {
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_yaml_ng::from_str(text)?
        };
        if let Some(storage) = file.default_docker {
            if self.default_docker.is_some() {
                bail!("default-docker is defined in more than one file");
            }
            self.default_docker = Some(storage);
        }
        for (scope, storage) in file.docker {
            if self.docker.insert(scope.clone(), storage).is_some() {
                bail!("docker scope {scope:?} is defined in more than one file");
            }
        }
        Ok(())
    }

    /// The scopes' settings for `image` (a registry image), most specific first, then
    /// `default-docker`'s.
    fn settings_for<'a>(&'a self, image: &ImageRef) -> impl Iterator<Item = &'a Storage> {
        let mut scopes = Vec::new();
        if let Some(named) = identity::image_reference(image) {
            scopes.push(named.to_string());
        }
        scopes.extend(repository_scopes(image));
        scopes
            .into_iter()
            .filter_map(|scope| self.docker.get(&scope))
            .chain(self.default_docker.as_ref())
    }

    /// The lookaside store for `image`: the most specific scope that sets one, else the
    /// built-in default.
    pub fn lookaside_for(&self, image: &ImageRef) -> String {
        self.settings_for(image)
            .find_map(|s| s.lookaside().filter(|l| !l.is_empty()))
            .unwrap_or(DEFAULT_LOOKASIDE)
            .to_string()
    }

    /// `use-sigstore-attachments` for `image`: the most specific scope that sets it.
    pub fn use_sigstore_attachments(&self, image: &ImageRef) -> Option<bool> {
        self.settings_for(image)
            .find_map(|s| s.use_sigstore_attachments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_merge_across_files_and_the_most_specific_wins() {
        let mut conf = RegistriesD::default();
        conf.add("default-docker:\n  lookaside: file:///var/lib/sigs\n")
            .unwrap();
        conf.add(
            "docker:\n  quay.io/os:\n    lookaside: https://sigs.example.com/os\n  quay.io:\n    sigstore: https://old.example.com\n    use-sigstore-attachments: true\n",
        )
        .unwrap();
        let lookaside = |s: &str| conf.lookaside_for(&ImageRef::parse(s).unwrap());
        assert_eq!(lookaside("quay.io/os/node:1"), "https://sigs.example.com/os");
        assert_eq!(lookaside("quay.io/other/node"), "https://old.example.com");
        assert_eq!(lookaside("reg.local:5000/x"), "file:///var/lib/sigs");
        let twice = conf.add("docker:\n  quay.io/os:\n    lookaside: file:///x\n");
        assert!(format!("{:#}", twice.unwrap_err()).contains("more than one file"));
        let mut bad = RegistriesD::default();
        assert!(bad.add("docker: [1, 2]\n").is_err());
    }

    /// containers/image looks each setting up on its own: a scope that only turns attachments
    /// on keeps the lookaside of the scope around it, and without any lookaside the built-in
    /// default applies.
    #[test]
    fn each_setting_falls_back_on_its_own() {
        let mut conf = RegistriesD::default();
        conf.add("docker:\n  quay.io/os/node:\n    use-sigstore-attachments: true\n  quay.io:\n    lookaside: https://sigs.example.com\n    use-sigstore-attachments: false\n  quay.io/os/node:4.15:\n    lookaside: https://tagged.example.com\n")
            .unwrap();
        let image = |s: &str| ImageRef::parse(s).unwrap();
        assert_eq!(conf.lookaside_for(&image("quay.io/os/node:1")), "https://sigs.example.com");
        assert_eq!(conf.use_sigstore_attachments(&image("quay.io/os/node:1")), Some(true));
        assert_eq!(conf.use_sigstore_attachments(&image("quay.io/os/other:1")), Some(false));
        assert_eq!(conf.lookaside_for(&image("quay.io/os/node:4.15")), "https://tagged.example.com");
        assert_eq!(conf.lookaside_for(&image("example.org/x:1")), DEFAULT_LOOKASIDE);
        assert_eq!(conf.use_sigstore_attachments(&image("example.org/x:1")), None);
    }
}
