//! A read-only view of a sysroot's deployments, as plain data: what status shows and what the
//! already-at-target check compares against.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ostree::gio::prelude::FileExt;
use ostree::{gio, glib};
use serde::Serialize;

/// The scheme of the origin's `custom-url`, as openshift/pivot wrote it.
pub const ORIGIN_SCHEME: &str = "pivot://";

#[derive(Debug, Clone, Serialize)]
pub struct DeploymentInfo {
    pub stateroot: String,
    pub checksum: String,
    pub serial: i32,
    /// The commit's `version` metadata, else the image's `version` label recorded at pivot time.
    pub version: Option<String>,
    /// `host/path@sha256:…` this deployment was pivoted from, if pivot (or openshift/pivot) made it.
    pub image: Option<String>,
    /// The pullspec pivot deployed this from, as it was given (tag included).
    #[serde(skip)]
    pub pullspec: Option<String>,
    pub booted: bool,
    pub staged: bool,
    /// First in boot order: what the bootloader starts next (a staged deployment, once finalized
    /// at shutdown, goes before it).
    pub default: bool,
    /// The bootloader's next entry after the default one.
    pub rollback: bool,
    #[serde(skip)]
    pub path: PathBuf,
}

impl DeploymentInfo {
    /// The digest part of `image`.
    pub fn image_digest(&self) -> Option<&str> {
        self.image.as_deref()?.rsplit_once('@').map(|(_, d)| d)
    }
}

/// Opens and loads the sysroot at `path` (not locked: a read-only look).
pub fn open_sysroot(path: &Path) -> Result<ostree::Sysroot> {
    let sysroot = ostree::Sysroot::new(Some(&gio::File::for_path(path)));
    sysroot
        .load(gio::Cancellable::NONE)
        .with_context(|| format!("loading the OSTree sysroot at {}", path.display()))?;
    Ok(sysroot)
}

pub fn list(sysroot: &ostree::Sysroot) -> Result<Vec<DeploymentInfo>> {
    let repo = sysroot.repo();
    let booted = sysroot.booted_deployment();
    let deployments = sysroot.deployments();
    let default_idx = deployments.iter().position(|d| !d.is_staged());
    let rollback_idx = default_idx.and_then(|i| {
        deployments
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, d)| !d.is_staged())
            .map(|(j, _)| j)
    });
    deployments
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let checksum = d.csum().to_string();
            let origin = d.origin();
            let pullspec = origin
                .as_ref()
                .and_then(|o| o.string("pivot", "pullspec").ok())
                .map(|p| p.to_string());
            let label_version = origin
                .as_ref()
                .and_then(|o| o.string("pivot", "version").ok())
                .map(|v| v.to_string());
            Ok(DeploymentInfo {
                stateroot: d.osname().to_string(),
                version: commit_version(&repo, &checksum)?.or(label_version),
                pullspec,
                image: origin.as_ref().and_then(origin_image),
                serial: d.deployserial(),
                booted: booted.as_ref().is_some_and(|b| b.equal(d)),
                staged: d.is_staged(),
                default: Some(i) == default_idx,
                rollback: Some(i) == rollback_idx,
                path: sysroot
                    .path()
                    .path()
                    .unwrap_or_default()
                    .join(sysroot.deployment_dirpath(d).as_str()),
                checksum,
            })
        })
        .collect()
}

/// The `version` key of a commit's metadata.
pub fn commit_version(repo: &ostree::Repo, checksum: &str) -> Result<Option<String>> {
    let Some(commit) = repo
        .load_variant_if_exists(ostree::ObjectType::Commit, checksum)
        .with_context(|| format!("loading commit {checksum}"))?
    else {
        return Ok(None);
    };
    let metadata = glib::VariantDict::new(Some(&commit.child_value(0)));
    Ok(metadata.lookup::<String>("version").ok().flatten())
}

fn origin_image(origin: &glib::KeyFile) -> Option<String> {
    let url = origin.string("origin", "custom-url").ok()?;
    url.strip_prefix(ORIGIN_SCHEME).map(str::to_string)
}
