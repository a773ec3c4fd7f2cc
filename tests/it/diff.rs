//! `pivot diff` and `pivot --check --diff`: the packages that differ between two trees, read
//! from the package lists they carry: dpkg's status file of Debian-built trees (real ones: this
//! machine's, with real packages taken out or moved to other versions), judged against
//! `dpkg-query` of each tree, and rpm-ostree's package list in the commit metadata.

use std::collections::BTreeMap;
use std::process::Command;

use pivot_testkit::{ImageSpec, Tree};

use crate::common::*;

const STATUS: &str = "usr/share/dpkg/database/status";

/// This machine's dpkg status file, as (package, stanza) in file order.
fn host_stanzas() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/var/lib/dpkg/status").unwrap();
    text.split("\n\n")
        .filter(|s| s.contains("Package: ") && s.contains(" installed\n"))
        .filter_map(|s| {
            let name = s.lines().find_map(|l| l.strip_prefix("Package: "))?;
            Some((name.to_string(), s.trim_end().to_string()))
        })
        .collect()
}

/// A package's name and how its version is changed.
type VersionEdit<'a> = (&'a str, fn(&str) -> String);

/// A status file of `stanzas` without `drop`, with the versions of `versions` (name → edit of
/// the version) changed.
fn status_text(stanzas: &[(String, String)], drop: &[&str], versions: &[VersionEdit]) -> String {
    let mut out = String::new();
    for (name, stanza) in stanzas {
        if drop.contains(&name.as_str()) {
            continue;
        }
        let edit = versions.iter().find(|(n, _)| n == name).map(|(_, f)| f);
        for line in stanza.lines() {
            match (line.strip_prefix("Version: "), edit) {
                (Some(v), Some(f)) => out.push_str(&format!("Version: {}\n", f(v))),
                _ => out.push_str(&format!("{line}\n")),
            }
        }
        out.push('\n');
    }
    out
}

/// What `dpkg-query` says is installed in a tree whose status file is `text`: name → version
/// (this machine has no package installed for two architectures, which would share a name).
fn dpkg_query(text: &str) -> BTreeMap<String, String> {
    let admin = tempfile::tempdir().unwrap();
    std::fs::write(admin.path().join("status"), text).unwrap();
    std::fs::create_dir_all(admin.path().join("info")).unwrap();
    let out = Command::new("dpkg-query")
        .arg(format!("--admindir={}", admin.path().display()))
        .args(["-W", "-f", "${Package} ${Version} ${db:Status-Status}\\n"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[2] == "installed").then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

fn dpkg_lt(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "lt", b])
        .status()
        .unwrap()
        .success()
}

fn names(list: &serde_json::Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// A node made of `v1` that pivoted to `v2` (version 2): deployments 0 `v2` and 1 `v1`.
fn pivoted(v1: &Tree, v2: Tree) -> Env {
    let env = Env::with_v1(v1);
    let image = env.push("v2", &ImageSpec::new(v2, "2"));
    assert_success(&env.pivot(&[&image.by_tag]));
    env
}

fn with_status(tree: Tree, text: &str) -> Tree {
    tree.with_file(STATUS, 0o644, text)
}

#[test]
fn diff_between_two_debian_trees_lists_exactly_what_dpkg_query_tells_apart() {
    let host = host_stanzas();
    let pick = |wanted: &str| {
        host.iter()
            .find(|(n, _)| n == wanted)
            .map(|(n, _)| n.as_str())
            .unwrap_or_else(|| panic!("{wanted} is not installed here"))
    };
    // Packages every Debian system has.
    let (older, newer, only_v1, only_v2) = (pick("bash"), pick("sed"), pick("gzip"), pick("tar"));
    let v1_status = status_text(
        &host,
        &[only_v2],
        &[
            (older, |v| format!("{v}~old")),
            (newer, |v| format!("{v}+new")),
        ],
    );
    let v2_status = status_text(&host, &[only_v1], &[]);
    let env = Env::with_v1(&with_status(fixture("os-v1"), &v1_status));
    let v2 = env.push(
        "v2",
        &ImageSpec::new(with_status(fixture("os-v2"), &v2_status), "2"),
    );
    assert_success(&env.pivot(&[&v2.by_tag]));

    let out = env.subcommand("diff", &["--json"]);
    assert_success(&out);
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(diff["kind"], "PivotPackageDiff");
    assert_eq!(
        diff["from"]["checksum"],
        env.deployed()[1].as_str(),
        "{diff}"
    );
    assert_eq!(diff["to"]["checksum"], v2.commit.as_str(), "{diff}");
    assert_eq!(diff["to"]["packages_from"], format!("/{STATUS}"));

    // The judge: dpkg-query of each tree's database.
    let (before, after) = (dpkg_query(&v1_status), dpkg_query(&v2_status));
    assert_eq!(diff["from"]["packages"], before.len());
    assert_eq!(diff["to"]["packages"], after.len());
    let added: Vec<_> = after
        .keys()
        .filter(|n| !before.contains_key(*n))
        .cloned()
        .collect();
    let removed: Vec<_> = before
        .keys()
        .filter(|n| !after.contains_key(*n))
        .cloned()
        .collect();
    let changed = |up: bool| -> Vec<String> {
        after
            .iter()
            .filter(|(n, v)| {
                before.get(*n).is_some_and(|b| match up {
                    true => dpkg_lt(b, v),
                    false => dpkg_lt(v, b),
                })
            })
            .map(|(n, _)| n.clone())
            .collect()
    };
    assert_eq!(names(&diff["added"]), added);
    assert_eq!(names(&diff["removed"]), removed);
    assert_eq!(names(&diff["upgraded"]), changed(true));
    assert_eq!(names(&diff["downgraded"]), changed(false));
    assert_eq!(added, [only_v2]);
    assert_eq!(removed, [only_v1]);
    assert_eq!(changed(true), [older]);
    assert_eq!(changed(false), [newer]);

    let text = String::from_utf8(env.subcommand("diff", &[]).stdout).unwrap();
    let bash = &after[older];
    assert!(
        text.contains(&format!("Upgraded:\n  {older} {bash}~old -> {bash}\n")),
        "{text}"
    );
    // dpkg's names: package:arch, then the version.
    assert!(text.contains(&format!("Removed:\n  {only_v1}:")), "{text}");
    // By index and by checksum, the other way round: the same changes, mirrored.
    let back = env.subcommand("diff", &["--json", "0", &env.deployed()[1][..12]]);
    assert_success(&back);
    let back: serde_json::Value = serde_json::from_slice(&back.stdout).unwrap();
    assert_eq!(names(&back["added"]), removed);
    assert_eq!(names(&back["downgraded"]), changed(true));
}

#[test]
fn an_rpm_ostree_package_list_in_the_commit_metadata_is_read() {
    let v1 = fixture("os-v1").with_rpm_pkglist(&[
        "kernel 0 6.1.0 1.fc40 x86_64",
        "bash 0 5.2.26 3.fc40 x86_64",
        "openssl 1 3.2.1 2.fc40 x86_64",
        "nano 0 7.2 6.fc40 x86_64",
    ]);
    let v2 = fixture("os-v2").with_rpm_pkglist(&[
        "kernel 0 6.10.0 1.fc40 x86_64",
        "bash 0 5.2.26 3.fc40 x86_64",
        "openssl 0 3.3.0 1.fc40 x86_64",
        "vim-minimal 2 9.1.0 1.fc40 x86_64",
    ]);
    let env = pivoted(&v1, v2);
    let out = env.subcommand("diff", &["--json"]);
    assert_success(&out);
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(diff["to"]["packages_from"], "rpmostree.rpmdb.pkglist");
    // 6.10 is newer than 6.1 (numbers, not strings); epoch 1 beats any version of epoch 0.
    assert_eq!(diff["upgraded"][0]["to"], "6.10.0-1.fc40");
    assert_eq!(names(&diff["upgraded"]), ["kernel"]);
    assert_eq!(names(&diff["downgraded"]), ["openssl"]);
    assert_eq!(diff["downgraded"][0]["from"], "1:3.2.1-2.fc40");
    assert_eq!(names(&diff["removed"]), ["nano"]);
    assert_eq!(names(&diff["added"]), ["vim-minimal"]);
    assert_eq!(diff["added"][0]["version"], "2:9.1.0-1.fc40");
}

#[test]
fn check_diff_downloads_the_update_once_and_shows_its_packages_before_any_deployment() {
    let host = host_stanzas();
    let v1_status = status_text(&host, &[], &[]);
    let gone = host[0].0.clone();
    let v2_status = status_text(&host, &[gone.as_str()], &[]);
    let env = Env::with_v1(&with_status(fixture("os-v1"), &v1_status));
    let v2 = env.push(
        "v2",
        &ImageSpec::new(with_status(fixture("os-v2"), &v2_status), "2"),
    );
    let deployments = env.deployed();

    let out = env.pivot(&["--check", "--diff", "--json", &v2.by_tag]);
    assert_success(&out);
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(check["kind"], "PivotUpdateCheck");
    assert_eq!(check["update"]["commit"], v2.commit.as_str());
    assert_eq!(names(&check["packages"]["removed"]), [gone.as_str()]);
    assert!(check["packages"]["added"].as_array().unwrap().is_empty());
    assert_eq!(
        check["packages"]["to"]["description"]
            .as_str()
            .unwrap()
            .split(' ')
            .next(),
        Some("download")
    );
    // Nothing deployed; the download is kept, and the pivot that follows fetches nothing again.
    assert_eq!(env.deployed(), deployments);
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(env.deployed()[0], v2.commit);
    for layer in &v2.layer_digests {
        assert_eq!(env.registry.count_requests("GET", layer), 1, "{layer}");
    }
}

#[test]
fn a_tree_without_a_package_list_is_one_line_naming_what_was_looked_for() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    let out = env.subcommand("diff", &[]);
    assert_fails_with(
        &out,
        &[
            "no package list",
            "rpmostree.rpmdb.pkglist",
            "/usr/share/dpkg/database/status",
        ],
    );
    // Nothing to compare with on a node that runs its only deployment.
    let env = Env::new();
    assert_fails_with(&env.subcommand("diff", &[]), &["nothing to compare with"]);
}

#[test]
fn an_ostree_native_deployment_is_read_by_its_image_commits_package_list() {
    let v1 = fixture("os-v1")
        .with_rpm_pkglist(&["kernel 0 6.1.0 1.fc40 x86_64", "nano 0 7.2 6.fc40 x86_64"]);
    let v2 = fixture("os-v2")
        .with_rpm_pkglist(&["kernel 0 6.10.0 1.fc40 x86_64", "nano 0 7.2 6.fc40 x86_64"]);
    let env = Env::with_v1(&v1);
    let (image, _) = crate::check::push_chunked(&env, &v2, "2", "v2");
    assert_success(&env.pivot(&[&image]));
    let out = env.subcommand("diff", &["--json"]);
    assert_success(&out);
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The deployment is the image's merge commit; the list is on the commit it was made from.
    let source = diff["to"]["packages_from"].as_str().unwrap();
    assert!(source.starts_with("rpmostree.rpmdb.pkglist"), "{source}");
    assert_eq!(names(&diff["upgraded"]), ["kernel"]);
    assert!(
        diff["added"].as_array().unwrap().is_empty()
            && diff["removed"].as_array().unwrap().is_empty()
    );
}

/// rpm-ostree's pairing (`_rpm_ostree_diff_package_lists` in src/lib/rpmostree-package.c), on
/// a sysroot: glibc gains its i686 build next to the x86_64 one (multilib: one addition, the
/// x86_64 one untouched), two kernels move up one each (install-only: both versions counted),
/// a package turns from noarch to x86_64 at the same version (one change, reported). Every
/// package of each list is counted. Then rpm-ostree's conventions: `pivot diff TO` compares
/// the running deployment with TO, `--format=json` is `rpm-ostree db diff --format=json`'s
/// document and `--format=diff` its lines for scripts.
#[test]
fn diff_pairs_packages_by_name_and_arch_and_takes_rpm_ostree_db_diffs_arguments() {
    let v1 = fixture("os-v1").with_rpm_pkglist(&[
        "bash 0 5.2.26 3.fc40 x86_64",
        "glibc 0 2.39 22.fc40 x86_64",
        "kernel-core 0 6.9.12 200.fc40 x86_64",
        "kernel-core 0 6.10.3 200.fc40 x86_64",
        "pkg-archtrans 0 1.0 1 noarch",
    ]);
    let v2 = fixture("os-v2").with_rpm_pkglist(&[
        "bash 0 5.2.26 3.fc40 x86_64",
        "glibc 0 2.39 22.fc40 i686",
        "glibc 0 2.39 22.fc40 x86_64",
        "kernel-core 0 6.10.3 200.fc40 x86_64",
        "kernel-core 0 6.11.2 300.fc40 x86_64",
        "pkg-archtrans 0 1.0 1 x86_64",
    ]);
    let env = pivoted(&v1, v2);
    let (new, old) = (env.deployed()[0].clone(), env.deployed()[1].clone());

    // No argument on a sysroot that is not booted, nothing waiting: from the rollback
    // deployment to the default one, which stands for the booted one.
    let out = env.subcommand("diff", &["--json"]);
    assert_success(&out);
    let diff: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(diff["from"]["checksum"], old.as_str());
    assert_eq!(diff["to"]["checksum"], new.as_str());
    assert_eq!(diff["package_manager"], "rpm");
    assert_eq!(
        (
            diff["from"]["packages"].as_u64(),
            diff["to"]["packages"].as_u64()
        ),
        (Some(5), Some(6))
    );
    assert_eq!(names(&diff["added"]), ["glibc"]);
    assert_eq!(diff["added"][0]["arch"], "i686");
    assert!(diff["removed"].as_array().unwrap().is_empty(), "{diff}");
    assert!(diff["downgraded"].as_array().unwrap().is_empty(), "{diff}");
    assert_eq!(
        names(&diff["upgraded"]),
        ["kernel-core", "kernel-core", "pkg-archtrans"]
    );
    let arch = &diff["upgraded"][2];
    assert_eq!(
        (&arch["from_arch"], &arch["arch"]),
        (&"noarch".into(), &"x86_64".into())
    );
    // Counted once each: what is left of either list but its removals (or additions) is the
    // changed and unchanged packages, the same on both sides.
    let count = |side: &str, list: &str| {
        diff[side]["packages"].as_u64().unwrap() - diff[list].as_array().unwrap().len() as u64
    };
    assert_eq!(count("from", "removed"), count("to", "added"));

    let text = String::from_utf8(env.subcommand("diff", &[]).stdout).unwrap();
    let expected = format!(
        "ostree diff commit from: rollback deployment 1, version 1 ({old})\n\
         ostree diff commit to:   default deployment 0, version 2 ({new})\n\
         Upgraded:\n\
         \x20 kernel-core 6.9.12-200.fc40 -> 6.10.3-200.fc40\n\
         \x20 kernel-core 6.10.3-200.fc40 -> 6.11.2-300.fc40\n\
         \x20 pkg-archtrans 1.0-1 -> 1.0-1 (noarch -> x86_64)\n\
         Added:\n\
         \x20 glibc-2.39-22.fc40.i686\n"
    );
    assert_eq!(text, expected);

    // One argument is TO, from the running deployment (the default one here): the way back.
    let out = env.subcommand("diff", &["--json", "1"]);
    assert_success(&out);
    let back: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(back["from"]["checksum"], new.as_str());
    assert_eq!(back["to"]["checksum"], old.as_str());
    assert_eq!(names(&back["removed"]), ["glibc"]);
    assert_eq!(
        names(&back["downgraded"]),
        ["kernel-core", "kernel-core", "pkg-archtrans"]
    );

    // rpm-ostree's JSON, as its tests read it (tests/vmcheck/test-db.sh: `.pkgdiff`, type 0
    // added, 1 removed, 2 upgraded, 3 downgraded; sorted by type, then name).
    let out = env.subcommand("diff", &["--format=json", "1", "0"]);
    assert_success(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ostree-commit-from"], old.as_str());
    assert_eq!(json["ostree-commit-to"], new.as_str());
    let pkg = |n: &str, v: &str, a: &str| serde_json::json!([n, v, a]);
    assert_eq!(
        json["pkgdiff"],
        serde_json::json!([
            ["glibc", 0, { "NewPackage": pkg("glibc", "2.39-22.fc40", "i686") }],
            ["kernel-core", 2, {
                "PreviousPackage": pkg("kernel-core", "6.9.12-200.fc40", "x86_64"),
                "NewPackage": pkg("kernel-core", "6.10.3-200.fc40", "x86_64") }],
            ["kernel-core", 2, {
                "PreviousPackage": pkg("kernel-core", "6.10.3-200.fc40", "x86_64"),
                "NewPackage": pkg("kernel-core", "6.11.2-300.fc40", "x86_64") }],
            ["pkg-archtrans", 2, {
                "PreviousPackage": pkg("pkg-archtrans", "1.0-1", "noarch"),
                "NewPackage": pkg("pkg-archtrans", "1.0-1", "x86_64") }],
        ])
    );
    assert_eq!(json["advisories"], serde_json::json!([]));

    let out = env.subcommand("diff", &["--format=diff", "1", "0"]);
    assert_success(&out);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "+glibc-2.39-22.fc40.i686\n\
         !kernel-core-6.9.12-200.fc40.x86_64\n=kernel-core-6.10.3-200.fc40.x86_64\n\
         !kernel-core-6.10.3-200.fc40.x86_64\n=kernel-core-6.11.2-300.fc40.x86_64\n\
         !pkg-archtrans-1.0-1.noarch\n=pkg-archtrans-1.0-1.x86_64\n"
    );
    // pivot's document or rpm-ostree's, not both: a usage error.
    let both = env.subcommand("diff", &["--json", "--format=json"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    assert!(
        stderr(&both).contains("cannot be used with"),
        "{}",
        stderr(&both)
    );
}

/// The package lists of two package managers (a Debian tree, then an rpm-ostree one) are not
/// compared, and the error says so in words, not in pivot's type names.
#[test]
fn lists_of_two_package_managers_are_refused_in_plain_words() {
    let v1 = with_status(
        fixture("os-v1"),
        &status_text(&host_stanzas()[..1], &[], &[]),
    );
    let env = pivoted(
        &v1,
        fixture("os-v2").with_rpm_pkglist(&["nano 0 7.2 6.fc40 x86_64"]),
    );
    let out = env.subcommand("diff", &[]);
    assert_fails_with(
        &out,
        &["the rollback deployment 1 has dpkg packages and the default deployment 0 rpm ones"],
    );
    assert!(!stderr(&out).contains("Deb"), "{}", stderr(&out));
}
