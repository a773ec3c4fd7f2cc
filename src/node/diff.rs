//! `pivot diff [[FROM] TO]`: the packages that differ between two deployments (or commits), as
//! `rpm-ostree db diff` shows them, from the package lists the commits carry
//! ([`crate::sysroot::packages`]): computed from the lists, never from a diff the image ships,
//! because the diff that matters is against what the node runs.
//!
//! The arguments are `rpm-ostree db diff`'s (src/app/rpmostree-db-builtin-diff.cxx,
//! `rpmostree_db_builtin_diff`): with FROM and TO, from one to the other; with one, from the
//! booted deployment to it; with none, from the booted deployment to the update waiting (the
//! staged deployment, else the newest download (`--download-only`) not deployed, else the
//! default deployment when it is not the booted one), else from the rollback deployment to the
//! booted one. On a sysroot that is not booted, the default deployment stands for the booted
//! one, as in `pivot --check`. Each is a deployment by index (the order `pivot status` lists
//! them in), a commit by checksum (or a unique prefix of a deployment's), or a ref
//! (`pivot/downloaded/…`).

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

/// The package changes between FROM and TO of the sysroot at `path`: both given, from one to
/// the other; only one, between it and the running deployment; neither, the defaults (module
/// doc).
pub fn read(path: &Path, from: Option<&str>, to: Option<&str>) -> Result<PackageDiff> {
    let sysroot = deployments::open_sysroot(path)?;
    let list = deployments::list(&sysroot)?;
    let repo = sysroot.repo();
    let (from, to) = match (from, to) {
        (Some(from), Some(to)) => (pick(&repo, &list, from)?, pick(&repo, &list, to)?),
        (None, Some(to)) => (running(&list)?, pick(&repo, &list, to)?),
        (Some(from), None) => (pick(&repo, &list, from)?, running(&list)?),
        (None, None) => default_pair(&repo, &list)?,
    };
    compare(&repo, &from, &to)
}

/// Why the packages of `checksum`, a commit of the sysroot at `path`, cannot be compared
/// (it carries no package list), or `None` when they can.
pub fn unknown_packages(path: &Path, checksum: &str) -> Result<Option<String>> {
    let sysroot = deployments::open_sysroot(path)?;
    match packages::read(&sysroot.repo(), checksum) {
        Ok(_) => Ok(None),
        Err(e) => no_package_list(e).map(Some),
    }
}

/// The error's text when it is that a commit carries no package list; else the error.
pub fn no_package_list(e: anyhow::Error) -> Result<String> {
    match e.downcast_ref::<packages::NoPackageList>() {
        Some(_) => Ok(format!("{e:#}")),
        None => Err(e),
    }
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
        "the {} has {} packages and the {} {} ones: packages of two package managers cannot be compared",
        from.description,
        old.kind,
        to.description,
        new.kind
    );
    let walk = packages::walk(&old, &new);
    let mut diff = PackageDiff {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        package_manager: old.kind.to_string(),
        from: side(repo, from, &old)?,
        to: side(repo, to, &new)?,
        upgraded: Vec::new(),
        downgraded: Vec::new(),
        removed: walk.removed.into_iter().map(package).collect(),
        added: walk.added.into_iter().map(package).collect(),
    };
    for (was, now) in walk.changed {
        let change = Change {
            name: now.name.clone(),
            arch: now.arch.clone(),
            from: was.version.clone(),
            to: now.version.clone(),
            from_arch: was.arch.clone(),
        };
        // rpm-ostree's verdict (rpm_ostree_db_diff_variant): a downgrade when the old package
        // orders after the new one, by version then architecture; any other change an upgrade.
        match old.order(was, now) {
            std::cmp::Ordering::Greater => diff.downgraded.push(change),
            _ => diff.upgraded.push(change),
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
        // Several deployments of one commit: the one that runs, else the default, else the
        // first; their packages are the same.
        let one_commit = matches.iter().all(|(_, d)| d.checksum == matches[0].1.checksum);
        let preferred = matches
            .iter()
            .find(|(_, d)| d.booted)
            .or_else(|| matches.iter().find(|(_, d)| d.default))
            .or(matches.first());
        match (preferred, one_commit) {
            (Some((i, d)), true) => return Ok(deployment(*i, d)),
            (None, _) => {}
            (Some(_), false) => {
                bail!("{spec} is the start of several deployments' commits: give more of it")
            }
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

/// What runs: the booted deployment, else (a sysroot that is not booted) the default one.
fn running(list: &[DeploymentInfo]) -> Result<Side> {
    let found = list
        .iter()
        .position(|d| d.booted)
        .or_else(|| list.iter().position(|d| d.default));
    match found {
        Some(i) => Ok(deployment(i, &list[i])),
        None => bail!("the sysroot has no deployment"),
    }
}

/// With no argument: from what runs to the update waiting, else from the rollback deployment
/// to what runs.
fn default_pair(repo: &ostree::Repo, list: &[DeploymentInfo]) -> Result<(Side, Side)> {
    let now = running(list)?;
    if let Some(i) = list.iter().position(|d| d.staged) {
        return Ok((now, deployment(i, &list[i])));
    }
    if let Some(side) = newest_download(repo, list)? {
        return Ok((now, side));
    }
    if let Some(i) = list.iter().position(|d| d.default && d.checksum != now.checksum) {
        return Ok((now, deployment(i, &list[i])));
    }
    match list.iter().position(|d| d.rollback) {
        Some(i) => Ok((deployment(i, &list[i]), now)),
        None => bail!(
            "nothing to compare with: no staged deployment, no download (--download-only), no other default deployment and no rollback; name what to compare (pivot diff [FROM] TO)"
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

/// How a package is named in the views: rpm's `name-[epoch:]version-release.arch`, as
/// rpm-ostree prints it, or dpkg's `name:arch version`.
fn named(diff: &PackageDiff, p: &Package) -> String {
    match diff.package_manager.as_str() {
        "dpkg" => format!("{}:{} {}", p.name, p.arch, p.version),
        _ => format!("{}-{}.{}", p.name, p.version, p.arch),
    }
}

/// The human view, as `rpm-ostree db diff` lays it out (its "block" format): the two commits,
/// then the upgraded, downgraded, removed and added packages. A package that changed
/// architecture shows both.
pub fn render(diff: &PackageDiff) -> String {
    let mut out = String::new();
    for (label, side) in [("from:", &diff.from), ("to:", &diff.to)] {
        let version = side.version.as_deref().unwrap_or("(none)");
        let _ = writeln!(
            out,
            "ostree diff commit {label:<5} {}, version {version} ({})",
            side.description, side.checksum
        );
    }
    for (title, changes) in [("Upgraded", &diff.upgraded), ("Downgraded", &diff.downgraded)] {
        if !changes.is_empty() {
            let _ = writeln!(out, "{title}:");
            for c in changes {
                let _ = write!(out, "  {} {} -> {}", c.name, c.from, c.to);
                match c.from_arch == c.arch {
                    true => out.push('\n'),
                    false => {
                        let _ = writeln!(out, " ({} -> {})", c.from_arch, c.arch);
                    }
                }
            }
        }
    }
    for (title, list) in [("Removed", &diff.removed), ("Added", &diff.added)] {
        if !list.is_empty() {
            let _ = writeln!(out, "{title}:");
            for p in list {
                let _ = writeln!(out, "  {}", named(diff, p));
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

/// `--format=diff`, rpm-ostree's view for scripts: `+` an added package, `-` a removed one,
/// `!` the old and `=` the new of a changed one, by name.
pub fn render_for_scripts(diff: &PackageDiff) -> String {
    let changed = |c: &Change, arch: &str, version: &str| Package {
        name: c.name.clone(),
        version: version.to_string(),
        arch: arch.to_string(),
    };
    let mut lines: Vec<(&str, String)> = Vec::new();
    for c in diff.upgraded.iter().chain(&diff.downgraded) {
        let (old, new) = (changed(c, &c.from_arch, &c.from), changed(c, &c.arch, &c.to));
        let text = format!("!{}\n={}\n", named(diff, &old), named(diff, &new));
        lines.push((&c.name, text));
    }
    for (sign, list) in [('-', &diff.removed), ('+', &diff.added)] {
        for p in list {
            lines.push((&p.name, format!("{sign}{}\n", named(diff, p))));
        }
    }
    lines.sort_by(|a, b| a.0.cmp(b.0));
    lines.into_iter().map(|(_, text)| text).collect()
}

/// `--format=json`: the document `rpm-ostree db diff --format=json` prints
/// (rpmostree_db_builtin_diff, and rpm_ostree_db_diff_variant in
/// src/daemon/rpmostree-package-variants.cxx): `ostree-commit-from`, `ostree-commit-to`,
/// `pkgdiff`, a list of `[name, type, {"PreviousPackage": [name, evr, arch], "NewPackage":
/// [...]}]` with type 0 added, 1 removed, 2 upgraded, 3 downgraded, sorted by type then name;
/// and `advisories`, which pivot does not read (always empty).
pub fn rpm_ostree_json(diff: &PackageDiff) -> serde_json::Value {
    use serde_json::{json, Value};
    let triple = |name: &str, version: &str, arch: &str| json!([name, version, arch]);
    let mut pkgdiff: Vec<(u32, &str, Value)> = Vec::new();
    for p in &diff.added {
        let new = triple(&p.name, &p.version, &p.arch);
        pkgdiff.push((0, &p.name, json!({ "NewPackage": new })));
    }
    for p in &diff.removed {
        let old = triple(&p.name, &p.version, &p.arch);
        pkgdiff.push((1, &p.name, json!({ "PreviousPackage": old })));
    }
    for (kind, changes) in [(2, &diff.upgraded), (3, &diff.downgraded)] {
        for c in changes {
            let details = json!({
                "PreviousPackage": triple(&c.name, &c.from, &c.from_arch),
                "NewPackage": triple(&c.name, &c.to, &c.arch),
            });
            pkgdiff.push((kind, &c.name, details));
        }
    }
    pkgdiff.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    json!({
        "ostree-commit-from": diff.from.checksum,
        "ostree-commit-to": diff.to.checksum,
        "pkgdiff": pkgdiff
            .into_iter()
            .map(|(kind, name, details)| json!([name, kind, details]))
            .collect::<Vec<Value>>(),
        "advisories": [],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(checksum: &str) -> DiffSide {
        DiffSide {
            checksum: checksum.into(),
            description: format!("commit {checksum}"),
            version: None,
            packages_from: "/usr/share/dpkg/database/status".into(),
            packages: 3,
        }
    }

    fn package(name: &str, version: &str, arch: &str) -> Package {
        Package {
            name: name.into(),
            version: version.into(),
            arch: arch.into(),
        }
    }

    /// A dpkg diff: a Multi-Arch: same library losing its i386 build, one downgraded, one
    /// turned from `all` to `amd64`.
    fn dpkg_diff() -> PackageDiff {
        let change = |name: &str, from: &str, to: &str, from_arch: &str, arch: &str| Change {
            name: name.into(),
            arch: arch.into(),
            from: from.into(),
            to: to.into(),
            from_arch: from_arch.into(),
        };
        PackageDiff {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            package_manager: "dpkg".into(),
            from: side("aaaa"),
            to: side("bbbb"),
            upgraded: vec![change("tzdata", "2024a-0", "2024a-0", "all", "amd64")],
            downgraded: vec![change("bash", "5.2.15-2", "5.2.15-1", "amd64", "amd64")],
            removed: vec![package("libc6", "2.36-9", "i386")],
            added: vec![],
        }
    }

    #[test]
    fn the_views_name_dpkg_packages_as_dpkg_does_and_show_architecture_changes() {
        let diff = dpkg_diff();
        assert_eq!(
            render(&diff),
            "ostree diff commit from: commit aaaa, version (none) (aaaa)\n\
             ostree diff commit to:   commit bbbb, version (none) (bbbb)\n\
             Upgraded:\n  tzdata 2024a-0 -> 2024a-0 (all -> amd64)\n\
             Downgraded:\n  bash 5.2.15-2 -> 5.2.15-1\n\
             Removed:\n  libc6:i386 2.36-9\n"
        );
        assert_eq!(
            render_for_scripts(&diff),
            "!bash:amd64 5.2.15-2\n=bash:amd64 5.2.15-1\n-libc6:i386 2.36-9\n\
             !tzdata:all 2024a-0\n=tzdata:amd64 2024a-0\n"
        );
    }

    /// rpm_ostree_db_diff_variant (src/daemon/rpmostree-package-variants.cxx): removed is
    /// type 1 with only `PreviousPackage`, downgraded 3; sorted by type, then name.
    #[test]
    fn rpm_ostree_json_types_and_order() {
        let json = rpm_ostree_json(&dpkg_diff());
        let types: Vec<(String, u64)> = json["pkgdiff"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e[0].as_str().unwrap().into(), e[1].as_u64().unwrap()))
            .collect();
        assert_eq!(
            types,
            [("libc6".into(), 1), ("tzdata".into(), 2), ("bash".into(), 3)]
        );
        assert_eq!(
            json["pkgdiff"][0][2],
            serde_json::json!({ "PreviousPackage": ["libc6", "2.36-9", "i386"] })
        );
        assert_eq!(json["ostree-commit-from"], "aaaa");
    }

    #[test]
    fn no_change_is_said() {
        let mut diff = dpkg_diff();
        (diff.upgraded, diff.downgraded, diff.removed) = (vec![], vec![], vec![]);
        assert!(render(&diff).ends_with(")\nNo package changes.\n"));
        assert_eq!(render_for_scripts(&diff), "");
    }
}
