//! The packages a commit carries, as `rpm-ostree db diff` compares them: from the commit
//! metadata rpm-ostree writes at compose time (`rpmostree.rpmdb.pkglist`; for an ostree-native
//! image whose merge commit has the base commit's tree, the base commit's), else from dpkg's
//! status file in the tree (`/usr/share/dpkg/database/status`, where Debian-based OSTree builders
//! move dpkg's database, then `/var/lib/dpkg/status`, where a container build leaves it).
//!
//! Not read: the rpm database itself (`/usr/share/rpm`, sqlite) of a tree whose commit has no
//! package list, such as an image with derived layers: pivot does not link librpm, and a list
//! that may be stale is worse than none, so such a commit is an error naming what was looked for.

mod dpkg;
mod rpm;

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{bail, Result};
use ostree::glib;

use crate::sysroot::commit_files;

/// dpkg's status file, where pivot looks for it in a tree, in order.
pub const DPKG_STATUS: [&str; 2] = ["usr/share/dpkg/database/status", "var/lib/dpkg/status"];
/// The commit metadata key rpm-ostree writes the package list to.
pub const RPM_PKGLIST: &str = "rpmostree.rpmdb.pkglist";
/// A status file of a few thousand packages is a few MiB.
const STATUS_LIMIT: u64 = 64 << 20;

/// Which package manager's versions these are (they compare differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Rpm,
    Deb,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    /// `[epoch:]version-release` for rpm, dpkg's `Version` for Debian.
    pub version: String,
    pub arch: String,
}

impl fmt::Display for Package {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} {} ({})", self.name, self.version, self.arch)
    }
}

/// A commit's packages, keyed by name (by `name:arch` for a name installed for several
/// architectures, as dpkg's Multi-Arch: same packages are).
#[derive(Debug, Clone)]
pub struct PackageList {
    pub kind: Kind,
    /// What was read: the metadata key or the file.
    pub source: String,
    pub packages: BTreeMap<String, Package>,
}

impl PackageList {
    fn new(kind: Kind, source: String, list: Vec<Package>) -> PackageList {
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &list {
            *count.entry(p.name.as_str()).or_default() += 1;
        }
        let keys: Vec<String> = list
            .iter()
            .map(|p| match count[p.name.as_str()] {
                1 => p.name.clone(),
                _ => format!("{}:{}", p.name, p.arch),
            })
            .collect();
        PackageList {
            kind,
            source,
            packages: keys.into_iter().zip(list).collect(),
        }
    }

    /// How version `a` compares with `b`, as this list's package manager orders them.
    pub fn compare(&self, a: &str, b: &str) -> std::cmp::Ordering {
        match self.kind {
            Kind::Rpm => rpm::compare_evr(a, b),
            Kind::Deb => dpkg::compare_versions(a, b),
        }
    }
}

/// The packages of `commit` (which must be in the repo).
pub fn read(repo: &ostree::Repo, commit: &str) -> Result<PackageList> {
    let variant = repo
        .load_variant(ostree::ObjectType::Commit, commit)
        .map_err(|e| anyhow::anyhow!("loading commit {commit}: {e}"))?;
    if let Some(list) = rpm::pkglist(&variant)? {
        return Ok(PackageList::new(Kind::Rpm, RPM_PKGLIST.into(), list));
    }
    if let Some(base) = same_tree_base(repo, commit, &variant)? {
        if let Some(list) = rpm::pkglist(&base.1)? {
            let source = format!("{RPM_PKGLIST} of the image's commit {}", base.0);
            return Ok(PackageList::new(Kind::Rpm, source, list));
        }
    }
    let root = commit_files::root(repo, commit)?;
    for path in DPKG_STATUS {
        if let Some(bytes) = commit_files::read(repo, &root, path, STATUS_LIMIT)? {
            let list = dpkg::parse_status(&String::from_utf8_lossy(&bytes));
            return Ok(PackageList::new(Kind::Deb, format!("/{path}"), list));
        }
    }
    bail!(
        "commit {commit} has no package list pivot reads: no {RPM_PKGLIST} in its metadata, no dpkg status file (/{} or /{})",
        DPKG_STATUS[0],
        DPKG_STATUS[1]
    )
}

/// For an ostree-native image's merge commit whose tree is its base commit's (no derived
/// layer changed a file): the base commit (`ostree.commit`), which rpm-ostree's metadata is on.
fn same_tree_base(
    repo: &ostree::Repo,
    commit: &str,
    merge: &glib::Variant,
) -> Result<Option<(String, glib::Variant)>> {
    let container = crate::import::store::ContainerCommit::read(repo, commit)?;
    let Some(base) = container
        .as_ref()
        .and_then(|c| c.label(crate::fetch::image::NATIVE_COMMIT_LABEL))
    else {
        return Ok(None);
    };
    let Some(base_variant) = repo
        .load_variant_if_exists(ostree::ObjectType::Commit, base)
        .map_err(|e| anyhow::anyhow!("loading commit {base}: {e}"))?
    else {
        return Ok(None);
    };
    // A commit's children 6 and 7: its root directory's contents and metadata.
    let tree = |v: &glib::Variant| (v.child_value(6), v.child_value(7));
    Ok((tree(merge) == tree(&base_variant)).then(|| (base.to_string(), base_variant)))
}
