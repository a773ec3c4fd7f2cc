//! `pivot diff [FROM] [TO]`: the packages that differ between two deployments (or commits), as
//! `rpm-ostree db diff` shows them, from the package lists the commits carry
//! ([`crate::sysroot::packages`]): computed from the lists, never from a diff the image ships,
//! because the diff that matters is against what the node runs.
//!
//! FROM and TO are deployments by index (the order `pivot status` lists them in), commits by
//! checksum (or a unique prefix of a deployment's), or refs (`pivot/downloaded/…`). By default
//! FROM is the booted deployment (on a sysroot that is not booted: the one before the default)
//! and TO the update waiting: the staged deployment, else the newest download
//! (`--download-only`) not deployed, else the default deployment when it is not FROM.

use std::fmt::Write;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

use crate::api::diff::{Change, DiffSide, Package, PackageDiff, KIND};
use crate::api::API_VERSION;
use crate::sysroot::deployments::{self, commit_version, DeploymentInfo, DOWNLOADED_REF_PREFIX};
use crate::sysroot::packages::{self, PackageList};

/// One side picked: its commit and what it is, for people.
struct Side {
    checksum: String,
    description: String,
}

/// The package changes between FROM and TO (`None`: the defaults) of the sysroot at `path`.
pub fn read(path: &Path, from: Option<&str>, to: Option<&str>) -> Result<PackageDiff> {
    let sysroot = deployments::open_sysroot(path)?;
    let list = deployments::list(&sysroot)?;
    let repo = sysroot.repo();
    let from = match from {
        Some(spec) => pick(&repo, &list, spec)?,
        None => default_from(&list)?,
    };
    let to = match to {
        Some(spec) => pick(&repo, &list, spec)?,
        None => default_to(&repo, &list, &from.checksum)?,
    };
    compare(&repo, &from, &to)
}

/// The changes from `from` to `to`, both commits in `repo`.
fn compare(repo: &ostree::Repo, from: &Side, to: &Side) -> Result<PackageDiff> {
    let read = |side: &Side| {
        packages::read(repo, &side.checksum)
            .with_context(|| format!("reading the packages of the {}", side.description))
    };
    let (old, new) = (read(from)?, read(to)?);
    ensure!(
        old.kind == new.kind,
        "the {} lists {:?} packages and the {} {:?} ones: there is nothing to compare",
        from.description,
        old.kind,
        to.description,
        new.kind
    );
    let mut diff = PackageDiff {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        from: side(repo, from, &old)?,
        to: side(repo, to, &new)?,
        upgraded: Vec::new(),
        downgraded: Vec::new(),
        removed: Vec::new(),
        added: Vec::new(),
    };
    for (key, p) in &new.packages {
        let Some(was) = old.packages.get(key) else {
            diff.added.push(package(p));
            continue;
        };
        let change = Change {
            name: p.name.clone(),
            arch: p.arch.clone(),
            from: was.version.clone(),
            to: p.version.clone(),
        };
        match new.compare(&was.version, &p.version) {
            std::cmp::Ordering::Less => diff.upgraded.push(change),
            std::cmp::Ordering::Greater => diff.downgraded.push(change),
            std::cmp::Ordering::Equal => {}
        }
    }
    for (key, p) in &old.packages {
        if !new.packages.contains_key(key) {
            diff.removed.push(package(p));
        }
    }
    Ok(diff)
}

fn package(p: &packages::Package) -> Package {
    Package {
        name: p.name.clone(),
        version: p.version.clone(),
        arch: p.arch.clone(),
    }
}

fn side(repo: &ostree::Repo, side: &Side, list: &PackageList) -> Result<DiffSide> {
    Ok(DiffSide {
        checksum: side.checksum.clone(),
        description: side.description.clone(),
        version: commit_version(repo, &side.checksum)?,
        packages_from: list.source.clone(),
        packages: list.packages.len() as u32,
    })
}

/// `booted deployment 1`, `staged deployment 0`, `deployment 2`.
fn deployment(i: usize, d: &DeploymentInfo) -> Side {
    let role = [
        (d.booted, "booted "),
        (d.staged, "staged "),
        (d.default, "default "),
        (d.rollback, "rollback "),
    ]
    .into_iter()
    .find(|(on, _)| *on)
    .map_or("", |(_, role)| role);
    Side {
        checksum: d.checksum.clone(),
        description: format!("{role}deployment {i}"),
    }
}

/// A deployment by index, a commit by checksum (or a unique prefix of a deployment's), or a ref.
fn pick(repo: &ostree::Repo, list: &[DeploymentInfo], spec: &str) -> Result<Side> {
    if let Ok(i) = spec.parse::<usize>() {
        if let Some(d) = list.get(i) {
            return Ok(deployment(i, d));
        }
        if spec.len() < 4 {
            bail!("no deployment {i}: there are {} (pivot status lists them in order)", list.len());
        }
    }
    let hex = spec.len() >= 4 && spec.bytes().all(|b| b.is_ascii_hexdigit());
    if hex {
        let matches: Vec<(usize, &DeploymentInfo)> = list
            .iter()
            .enumerate()
            .filter(|(_, d)| d.checksum.starts_with(spec))
            .collect();
        match matches.as_slice() {
            [(i, d)] => return Ok(deployment(*i, d)),
            [] => {}
            _ => bail!("{spec} is the start of several deployments' commits: give more of it"),
        }
    }
    let resolved = repo
        .resolve_rev(spec, true)
        .with_context(|| format!("resolving {spec}"))?;
    match resolved {
        Some(checksum) if checksum.as_str() == spec => Ok(Side {
            checksum: spec.to_string(),
            description: download_ref(repo, spec)?
                .map_or_else(|| "commit".into(), |name| format!("download ({name})")),
        }),
        Some(checksum) => Ok(Side {
            checksum: checksum.to_string(),
            description: format!("ref {spec}"),
        }),
        None => bail!(
            "{spec:?} is no deployment, commit or ref: name a deployment by its index in pivot status, a commit by its checksum, or a ref"
        ),
    }
}

fn default_from(list: &[DeploymentInfo]) -> Result<Side> {
    let found = list
        .iter()
        .position(|d| d.booted)
        .or_else(|| list.iter().position(|d| d.rollback))
        .or_else(|| list.iter().position(|d| d.default));
    match found {
        Some(i) => Ok(deployment(i, &list[i])),
        None => bail!("the sysroot has no deployment"),
    }
}

fn default_to(repo: &ostree::Repo, list: &[DeploymentInfo], from: &str) -> Result<Side> {
    if let Some(i) = list.iter().position(|d| d.staged) {
        return Ok(deployment(i, &list[i]));
    }
    if let Some(side) = newest_download(repo, list)? {
        return Ok(side);
    }
    match list.iter().position(|d| d.default && d.checksum != from) {
        Some(i) => Ok(deployment(i, &list[i])),
        None => bail!(
            "nothing to compare with: no staged deployment, no download (--download-only) and no other default deployment; name what to compare (pivot diff FROM TO)"
        ),
    }
}

/// The repo's download refs (`--download-only`) and their commits.
fn downloads(repo: &ostree::Repo) -> Result<Vec<(String, String)>> {
    let refs = repo
        .list_refs(None, ostree::gio::Cancellable::NONE)
        .context("listing the repo's refs")?;
    Ok(refs
        .into_iter()
        .map(|(name, checksum)| (name.to_string(), checksum.to_string()))
        .filter(|(name, _)| name.starts_with(DOWNLOADED_REF_PREFIX))
        .collect())
}

/// The download ref that keeps `checksum`, if one does.
fn download_ref(repo: &ostree::Repo, checksum: &str) -> Result<Option<String>> {
    Ok(downloads(repo)?
        .into_iter()
        .find(|(_, c)| c == checksum)
        .map(|(name, _)| name))
}

/// The newest commit an earlier `--download-only` kept that no deployment is made of.
fn newest_download(repo: &ostree::Repo, list: &[DeploymentInfo]) -> Result<Option<Side>> {
    let mut newest: Option<(u64, Side)> = None;
    for (name, checksum) in downloads(repo)? {
        if list.iter().any(|d| d.has_commit(&checksum)) {
            continue;
        }
        let Ok(commit) = repo.load_commit(&checksum) else {
            continue;
        };
        let timestamp = ostree::commit_get_timestamp(&commit.0);
        if newest.as_ref().is_none_or(|(t, _)| timestamp > *t) {
            newest = Some((
                timestamp,
                Side {
                    checksum: checksum.to_string(),
                    description: format!("download ({name})"),
                },
            ));
        }
    }
    Ok(newest.map(|(_, side)| side))
}

/// The human view, as `rpm-ostree db diff` lays it out.
pub fn render(diff: &PackageDiff) -> String {
    let mut out = String::new();
    for (label, side) in [("From", &diff.from), ("To", &diff.to)] {
        let version = side.version.as_deref().unwrap_or("(none)");
        let _ = writeln!(
            out,
            "{label:>4}: {}, version {version} ({})",
            side.description, side.checksum
        );
        let _ = writeln!(out, "      {} packages from {}", side.packages, side.packages_from);
    }
    for (title, changes) in [("Upgraded", &diff.upgraded), ("Downgraded", &diff.downgraded)] {
        if !changes.is_empty() {
            let _ = writeln!(out, "{title}:");
            for c in changes {
                let _ = writeln!(out, "  {} {} -> {}", c.name, c.from, c.to);
            }
        }
    }
    for (title, list) in [("Removed", &diff.removed), ("Added", &diff.added)] {
        if !list.is_empty() {
            let _ = writeln!(out, "{title}:");
            for p in list {
                let _ = writeln!(out, "  {} {} ({})", p.name, p.version, p.arch);
            }
        }
    }
    let none = diff.upgraded.is_empty()
        && diff.downgraded.is_empty()
        && diff.removed.is_empty()
        && diff.added.is_empty();
    if none {
        out.push_str("No package changes.\n");
    }
    out
}
