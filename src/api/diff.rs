//! `pivot diff --json`: the packages that differ between two commits, as `rpm-ostree db diff`
//! reports them (schema: `docs/diff.schema.json`).

use serde::{Deserialize, Serialize};

/// `kind` of the document.
pub const KIND: &str = "PivotPackageDiff";

/// The package changes from one commit to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PackageDiff {
    /// Always `pivot.openshift.io/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always `PivotPackageDiff`.
    pub kind: String,
    /// Whose packages these are: `rpm` (rpm-ostree's package list) or `dpkg`.
    pub package_manager: String,
    pub from: DiffSide,
    pub to: DiffSide,
    /// Newer version in `to`, by the package manager's version order.
    pub upgraded: Vec<Change>,
    /// Older version in `to`.
    pub downgraded: Vec<Change>,
    /// In `from` only.
    pub removed: Vec<Package>,
    /// In `to` only.
    pub added: Vec<Package>,
}

/// One of the two commits compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DiffSide {
    pub checksum: String,
    /// What it is: `booted deployment 1`, `staged deployment 0`, `downloaded (pivot/downloaded/…)`, `commit`.
    pub description: String,
    /// The commit's `version`.
    pub version: Option<String>,
    /// Where its package list was read: `rpmostree.rpmdb.pkglist` (commit metadata) or a dpkg
    /// status file of the tree.
    pub packages_from: String,
    /// How many packages it has.
    pub packages: u32,
}

/// A package in one of the commits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Package {
    pub name: String,
    /// `[epoch:]version-release` (rpm) or dpkg's `Version`.
    pub version: String,
    pub arch: String,
}

/// A package in both, at different versions or architectures. Packages are paired as
/// rpm-ostree pairs them: by name and architecture, so that each architecture of a multilib
/// (or dpkg `Multi-Arch: same`) package is its own; a name there once on each side is one
/// change even when its architecture changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Change {
    pub name: String,
    /// The architecture in `to`.
    pub arch: String,
    pub from: String,
    pub to: String,
    /// The architecture in `from`: `arch` but for a package that changed architecture
    /// (`noarch` → `x86_64`, `all` → `amd64`).
    pub from_arch: String,
}
