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

use std::cmp::Ordering;
use std::fmt;

use anyhow::Result;
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

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Kind::Rpm => "rpm",
            Kind::Deb => "dpkg",
        })
    }
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

/// A commit's packages, in rpm-ostree's order: by name, then version (by the package manager's
/// order), then architecture. A name may be there several times: for several architectures
/// (rpm's multilib, dpkg's `Multi-Arch: same`) or at several versions (rpm's install-only
/// packages, such as two kernels).
#[derive(Debug, Clone)]
pub struct PackageList {
    pub kind: Kind,
    /// What was read: the metadata key or the file.
    pub source: String,
    pub packages: Vec<Package>,
}

/// What [`walk`] found, as rpm-ostree's `_rpm_ostree_diff_package_lists` sorts the two lists'
/// packages: each of the old list's is removed, changed or common; each of the new list's
/// added, changed or common.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walk<'a> {
    pub removed: Vec<&'a Package>,
    pub added: Vec<&'a Package>,
    /// (old, new): the same name, at another version or (for a name that is there once on each
    /// side) another architecture.
    pub changed: Vec<(&'a Package, &'a Package)>,
    pub common: usize,
}

impl PackageList {
    fn new(kind: Kind, source: String, mut packages: Vec<Package>) -> PackageList {
        packages.sort_by(|a, b| package_order(kind, a, b));
        PackageList {
            kind,
            source,
            packages,
        }
    }

    /// How package `a` orders before `b` in this list's package manager's terms: by name, then
    /// version, then architecture (rpm-ostree's `rpm_ostree_package_cmp`). A changed package
    /// whose old one orders after its new one is a downgrade; any other change an upgrade.
    pub fn order(&self, a: &Package, b: &Package) -> Ordering {
        package_order(self.kind, a, b)
    }
}

fn package_order(kind: Kind, a: &Package, b: &Package) -> Ordering {
    let version = |a: &str, b: &str| match kind {
        Kind::Rpm => rpm::compare_evr(a, b),
        Kind::Deb => dpkg::compare_versions(a, b),
    };
    a.name
        .cmp(&b.name)
        .then_with(|| version(&a.version, &b.version))
        .then_with(|| a.arch.cmp(&b.arch))
}

/// The packages of `old` and `new` (lists of one package manager, in their order) paired as
/// rpm-ostree pairs them (`_rpm_ostree_diff_package_lists`, src/lib/rpmostree-package.c): both
/// lists walked together by name; of one name, packages of the same architecture pair in order
/// (an install-only package's versions pair oldest with oldest, and what is left over on one
/// side is added or removed); a name there once on each side at different architectures is one
/// change (noarch → x86_64, all → amd64); several architectures of one name (multilib) are
/// each their own package, added or removed when the other side lacks that architecture.
pub fn walk<'a>(old: &'a PackageList, new: &'a PackageList) -> Walk<'a> {
    let (a, b) = (&old.packages, &new.packages);
    let single = |list: &[Package], i: usize| list.get(i + 1).is_none_or(|n| n.name != list[i].name);
    let mut walk = Walk::default();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (p, q) = (&a[i], &b[j]);
        match p.name.cmp(&q.name) {
            Ordering::Less => {
                walk.removed.push(p);
                i += 1;
            }
            Ordering::Greater => {
                walk.added.push(q);
                j += 1;
            }
            Ordering::Equal if p.arch == q.arch || (single(a, i) && single(b, j)) => {
                match p.arch == q.arch && old.order(p, q) == Ordering::Equal {
                    true => walk.common += 1,
                    false => walk.changed.push((p, q)),
                }
                i += 1;
                j += 1;
            }
            Ordering::Equal if p.arch < q.arch => {
                walk.removed.push(p);
                i += 1;
            }
            Ordering::Equal => {
                walk.added.push(q);
                j += 1;
            }
        }
    }
    walk.removed.extend(&a[i..]);
    walk.added.extend(&b[j..]);
    walk
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
    Err(NoPackageList {
        commit: commit.to_string(),
    }
    .into())
}

/// The error of [`read`] for a commit that carries no package list pivot reads (callers that
/// can go on without the packages look for it in the error's chain).
#[derive(Debug)]
pub struct NoPackageList {
    pub commit: String,
}

impl fmt::Display for NoPackageList {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "commit {} has no package list pivot reads: no {RPM_PKGLIST} in its metadata, no dpkg status file (/{} or /{})",
            self.commit, DPKG_STATUS[0], DPKG_STATUS[1]
        )
    }
}

impl std::error::Error for NoPackageList {}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `name version arch` entries, in any order.
    fn list(kind: Kind, entries: &[&str]) -> PackageList {
        let packages = entries
            .iter()
            .map(|e| {
                let f: Vec<&str> = e.split(' ').collect();
                Package {
                    name: f[0].into(),
                    version: f[1].into(),
                    arch: f[2].into(),
                }
            })
            .collect();
        PackageList::new(kind, "test".into(), packages)
    }

    /// The walk as rpm-ostree's `db diff --format=diff` prints it: `+` added, `-` removed,
    /// `!old =new` changed (old and new as `name version arch`); and whether every package of
    /// each side is counted once.
    fn lines(old: &PackageList, new: &PackageList) -> Vec<String> {
        let walk = walk(old, new);
        assert_eq!(
            walk.removed.len() + walk.changed.len() + walk.common,
            old.packages.len(),
            "every old package counted once: {walk:?}"
        );
        assert_eq!(
            walk.added.len() + walk.changed.len() + walk.common,
            new.packages.len(),
            "every new package counted once: {walk:?}"
        );
        let show = |p: &Package| format!("{} {} {}", p.name, p.version, p.arch);
        let mut out: Vec<String> = walk.added.iter().map(|p| format!("+{}", show(p))).collect();
        out.extend(walk.removed.iter().map(|p| format!("-{}", show(p))));
        for (p, q) in &walk.changed {
            let how = match old.order(p, q) {
                Ordering::Greater => "downgraded",
                _ => "upgraded",
            };
            out.push(format!("!{} ={} {how}", show(p), show(q)));
        }
        out.sort();
        out
    }

    /// rpm-ostree's tests/vmcheck/test-db.sh ("ok db diff", at coreos/rpm-ostree
    /// c43e315d6a0fa2229c9c7874a6ed19aa23abbf0b): the diff from `$pending_csum` to
    /// `$pending_layered_csum`. The layered side adds glibc.i686 next to glibc.x86_64 (multilib:
    /// glibc.x86_64 must be neither removed, re-added nor changed), pkg-to-overlay for two
    /// architectures, replaces pkg-to-replace-archtrans 1.0 noarch by 2.0 x86_64 (one change,
    /// not a removal and an addition), downgrades zzz-pkg-to-downgrade and removes
    /// pkg-to-remove.
    #[test]
    fn rpm_ostree_test_db_sh_ok_db_diff() {
        let pending = list(
            Kind::Rpm,
            &[
                "glibc 2.34-1 x86_64",
                "pkg-to-remove 1.0-1 x86_64",
                "pkg-to-replace 15-8 x86_64",
                "pkg-to-replace-archtrans 1.0-1 noarch",
                "zzz-pkg-to-downgrade 2.0-1 x86_64",
            ],
        );
        let layered = list(
            Kind::Rpm,
            &[
                "glibc 2.35-1 i686",
                "glibc 2.34-1 x86_64",
                "pkg-to-overlay 1.0-1 x86_64",
                "pkg-to-overlay 1.0-1 i686",
                "pkg-to-replace 15.4-4 x86_64",
                "pkg-to-replace-archtrans 2.0-1 x86_64",
                "zzz-pkg-to-downgrade 1.0-1 x86_64",
            ],
        );
        assert_eq!(
            lines(&pending, &layered),
            [
                "!pkg-to-replace 15-8 x86_64 =pkg-to-replace 15.4-4 x86_64 upgraded",
                "!pkg-to-replace-archtrans 1.0-1 noarch =pkg-to-replace-archtrans 2.0-1 x86_64 upgraded",
                "!zzz-pkg-to-downgrade 2.0-1 x86_64 =zzz-pkg-to-downgrade 1.0-1 x86_64 downgraded",
                "+glibc 2.35-1 i686",
                "+pkg-to-overlay 1.0-1 i686",
                "+pkg-to-overlay 1.0-1 x86_64",
                "-pkg-to-remove 1.0-1 x86_64",
            ]
        );
    }

    /// rpm-ostree's commit 829a7468211cbc15ecc02eac12f7b5cdc8ef6b8d ("lib/package: Handle arch
    /// pkg transitions", `next_pkg_has_different_name` in src/lib/rpmostree-package.c): a
    /// package there once on each side that changes architecture at the same version is one
    /// change, an upgrade or downgrade by the architectures' byte order
    /// (`rpm_ostree_package_cmp`), as rpm-ostree's `db diff` classes it.
    #[test]
    fn rpm_ostree_829a746_arch_transition_at_the_same_version() {
        let noarch = list(Kind::Rpm, &["foo 1.0-1 noarch"]);
        let x86 = list(Kind::Rpm, &["foo 1.0-1 x86_64"]);
        assert_eq!(
            lines(&noarch, &x86),
            ["!foo 1.0-1 noarch =foo 1.0-1 x86_64 upgraded"]
        );
        assert_eq!(
            lines(&x86, &noarch),
            ["!foo 1.0-1 x86_64 =foo 1.0-1 noarch downgraded"]
        );
    }

    /// Multilib the other way (rpm-ostree's `_rpm_ostree_diff_package_lists`: "Packages with
    /// different arches (e.g. multilib) are counted as different packages"): glibc i686 and
    /// x86_64 upgraded together are two upgrades; glibc.i686 dropped is one removal, and the
    /// x86_64 one that stays is unchanged.
    #[test]
    fn rpm_ostree_diff_package_lists_multilib() {
        let both = list(Kind::Rpm, &["glibc 2.39-1 x86_64", "glibc 2.39-1 i686"]);
        let newer = list(Kind::Rpm, &["glibc 2.39-2 x86_64", "glibc 2.39-2 i686"]);
        assert_eq!(
            lines(&both, &newer),
            [
                "!glibc 2.39-1 i686 =glibc 2.39-2 i686 upgraded",
                "!glibc 2.39-1 x86_64 =glibc 2.39-2 x86_64 upgraded",
            ]
        );
        let x86_only = list(Kind::Rpm, &["glibc 2.39-1 x86_64"]);
        assert_eq!(lines(&both, &x86_only), ["-glibc 2.39-1 i686"]);
        assert_eq!(lines(&x86_only, &both), ["+glibc 2.39-1 i686"]);
    }

    /// Install-only packages (several kernels), as rpm-ostree's code pairs them (the walk of
    /// `_rpm_ostree_diff_package_lists`: same name and architecture pair in version order; the
    /// rest is added or removed; rpm_ostree_db_diff's doc comment in src/lib/rpmostree-db.c
    /// describes an older pairing): every entry is counted, none lost.
    #[test]
    fn rpm_ostree_diff_package_lists_install_only() {
        let two = list(
            Kind::Rpm,
            &["kernel-core 6.10.3-200.fc40 x86_64", "kernel-core 6.9.12-200.fc40 x86_64"],
        );
        let next = list(
            Kind::Rpm,
            &["kernel-core 6.10.3-200.fc40 x86_64", "kernel-core 6.11.2-300.fc40 x86_64"],
        );
        assert_eq!(
            lines(&two, &next),
            [
                "!kernel-core 6.10.3-200.fc40 x86_64 =kernel-core 6.11.2-300.fc40 x86_64 upgraded",
                "!kernel-core 6.9.12-200.fc40 x86_64 =kernel-core 6.10.3-200.fc40 x86_64 upgraded",
            ]
        );
        let three = list(
            Kind::Rpm,
            &[
                "kernel-core 6.10.3-200.fc40 x86_64",
                "kernel-core 6.11.2-300.fc40 x86_64",
                "kernel-core 6.9.12-200.fc40 x86_64",
            ],
        );
        assert_eq!(
            lines(&three, &next),
            [
                "!kernel-core 6.10.3-200.fc40 x86_64 =kernel-core 6.11.2-300.fc40 x86_64 upgraded",
                "!kernel-core 6.9.12-200.fc40 x86_64 =kernel-core 6.10.3-200.fc40 x86_64 upgraded",
                "-kernel-core 6.11.2-300.fc40 x86_64",
            ]
        );
        assert_eq!(lines(&two, &two), Vec::<String>::new());
    }

    /// Epochs, as rpm-ostree's evr_cmp (rpmverCmp) orders them: an epoch beats any version of a
    /// lower one, and epoch 0 is no epoch.
    #[test]
    fn rpm_ostree_evr_cmp_epochs() {
        let old = list(Kind::Rpm, &["openssl 1:3.2.1-2.fc40 x86_64", "vim 0:9.1-1 x86_64"]);
        let new = list(Kind::Rpm, &["openssl 3.3.0-1.fc40 x86_64", "vim 9.1-1 x86_64"]);
        assert_eq!(
            lines(&old, &new),
            ["!openssl 1:3.2.1-2.fc40 x86_64 =openssl 3.3.0-1.fc40 x86_64 downgraded"]
        );
    }

    /// dpkg's multi-arch (package:arch): libc6 for amd64 and i386 are two packages, and
    /// `Architecture: all` becoming `amd64` at the same version is one change.
    #[test]
    fn dpkg_multi_arch_and_all_to_amd64() {
        let old = list(
            Kind::Deb,
            &[
                "libc6 2.36-9+deb12u7 amd64",
                "libc6 2.36-9+deb12u7 i386",
                "tzdata 2024a-0+deb12u1 all",
                "zlib1g 1:1.2.13.dfsg-1 amd64",
            ],
        );
        let new = list(
            Kind::Deb,
            &[
                "libc6 2.36-9+deb12u9 amd64",
                "tzdata 2024a-0+deb12u1 amd64",
                "zlib1g 1:1.2.13.dfsg-1 amd64",
                "zlib1g 1:1.2.13.dfsg-1 i386",
            ],
        );
        assert_eq!(
            lines(&old, &new),
            [
                "!libc6 2.36-9+deb12u7 amd64 =libc6 2.36-9+deb12u9 amd64 upgraded",
                "!tzdata 2024a-0+deb12u1 all =tzdata 2024a-0+deb12u1 amd64 upgraded",
                "+zlib1g 1:1.2.13.dfsg-1 i386",
                "-libc6 2.36-9+deb12u7 i386",
            ]
        );
    }
}
