//! `pivot --check`: what a pivot would change, from the manifest and config alone; nothing is
//! downloaded beyond them and nothing is written.

use pivot_testkit::{
    encapsulate, ext_fixtures_tool, skopeo_push, Compression, ImageSpec, RawImage, RawLayer,
    RepoTar, Tree,
};

use crate::common::*;

#[test]
fn check_reports_the_update_from_manifest_and_config_only_and_writes_nothing() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.labels = vec![("ostree.linux".into(), "6.1.0-28-amd64".into())];
    spec.created = Some("2026-11-30T15:00:00.5Z".into());
    let v2 = env.push("v2", &spec);
    let before = env.sysroot.snapshot().unwrap();

    let out = env.pivot(&["--check", &v2.by_tag]);
    assert_success(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    let pinned = format!("{}/pivot/os@{}", env.registry.host(), v2.digest);
    assert!(
        report.contains(&format!("Update available ({STATEROOT}): {pinned}")),
        "{report}"
    );
    assert!(report.contains("Version: 2 (now 1)"), "{report}");
    assert!(
        report.contains(&format!("Commit: {} (now ", v2.commit)),
        "{report}"
    );
    assert!(
        report.contains("Timestamp: 2026-11-30 15:00:00 UTC"),
        "{report}"
    );
    assert!(report.contains("Kernel: 6.1.0-28-amd64"), "{report}");
    assert!(report.contains(" in 1 of 1 layer\n"), "{report}");

    // The same as JSON, in the status document's vocabulary.
    let out = env.pivot(&["--check", "--json", &v2.by_tag]);
    assert_success(&out);
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(check["kind"], "PivotUpdateCheck");
    assert_eq!(check["version"], "1");
    let update = &check["update"];
    assert_eq!(update["image"], pinned.as_str());
    assert_eq!(update["commit"], v2.commit.as_str());
    assert_eq!(update["kernel"], "6.1.0-28-amd64");
    assert_eq!(update["timestamp"], 1_796_050_800);
    assert_eq!(update["download"]["bytes"], v2.layer_sizes[0], "{update}");
    assert_eq!(update["download"]["layers"], 1);

    // One config fetch per check, and no layer.
    assert_eq!(env.registry.count_requests("GET", &v2.config_digest), 2);
    for layer in &v2.layer_digests {
        assert_eq!(env.registry.count_requests("GET", layer), 0, "{layer}");
    }
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    // It records no attempt, only what it found, which status shows until it is no news.
    let status = env.status_json();
    let state = &status["pivot"][STATEROOT];
    assert!(state["last"].is_null() && state["attempts"] == 0, "{state}");
    assert_eq!(&state["cached_update"], update);
    let text = env.subcommand("status", &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("Update available ({STATEROOT}): {pinned}")),
        "{text}"
    );
    assert!(text.contains("Kernel: 6.1.0-28-amd64"), "{text}");
    assert!(text.contains(" in 1 of 1 layer\n"), "{text}");

    // Pivoting to it makes it no news.
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert!(env.status_json()["pivot"][STATEROOT]["cached_update"].is_null());
}

#[test]
fn a_check_that_finds_nothing_new_clears_what_an_earlier_one_found() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&["--check", &v2.by_tag]));
    assert!(!env.status_json()["pivot"][STATEROOT]["cached_update"].is_null());
    // A check of the image the node runs (the same commit as its deployment) finds nothing.
    let v1 = env.push("v1", &pivot_testkit::ImageSpec::new(fixture("os-v1"), "1"));
    assert_eq!(env.deployed()[0], v1.commit);
    let out = env.pivot(&["--check", &v1.by_tag]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    assert!(env.status_json()["pivot"][STATEROOT]["cached_update"].is_null());
}

#[test]
fn check_at_target_exits_77() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    let out = env.pivot(&["--check", &v2.by_tag]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    assert!(stderr(&out).contains("already"), "{}", stderr(&out));
    // rpm-ostree upgrade --check's words, and its exit code (77).
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "No updates available.\n"
    );
    let out = env.pivot(&["--check", "--json", &v2.by_tag]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(check["update"].is_null(), "{check}");
    assert_eq!(check["checksum"], v2.commit.as_str());
}

#[test]
fn check_with_the_commit_already_in_the_repo_has_nothing_to_download() {
    let env = Env::new();
    let v2 = env.push_v2();
    // v2 was pivoted to (kept under a ref), then its deployment went away: the commit stays.
    assert_success(&env.pivot(&["--keep", &v2.by_tag]));
    env.undeploy(0);

    let out = env.pivot(&["--check", &v2.by_tag]);
    assert_success(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("Download: nothing: the commit is in the repo already"),
        "{report}"
    );
}

/// `tree` committed as `version` and encapsulated chunked by ostree-rs-ext, pushed as
/// `pivot/native:<tag>`; its pullspec and its manifest's layers (digest, size).
pub(crate) fn push_chunked(
    env: &Env,
    tree: &Tree,
    version: &str,
    tag: &str,
) -> (String, Vec<(String, u64)>) {
    let dir = tempfile::tempdir().unwrap();
    let repo_path = dir.path().join("repo");
    let repo = ostree::Repo::new_for_path(&repo_path);
    repo.create(ostree::RepoMode::Archive, ostree::gio::Cancellable::NONE)
        .unwrap();
    pivot_testkit::commit_tree(&repo, tree, Some("os"), version).unwrap();
    let tool = ext_fixtures_tool(false).unwrap();
    encapsulate(
        &tool,
        &repo_path,
        "os",
        &dir.path().join("oci"),
        Some("chunked"),
    )
    .unwrap();
    let pullspec = format!("{}/pivot/native:{tag}", env.registry.host());
    skopeo_push(&dir.path().join("oci/chunked"), &pullspec).unwrap();
    let manifest = std::fs::read_dir(dir.path().join("oci/chunked/blobs/sha256"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .find(|j| j["layers"].is_array())
        .expect("the manifest");
    let layers = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().unwrap().to_string(),
                l["size"].as_u64().unwrap(),
            )
        })
        .collect();
    (pullspec, layers)
}

#[test]
fn check_of_a_chunked_native_update_counts_only_the_layers_the_node_lacks() {
    let env = Env::new();
    // Two trees that differ in one file of one component (usr/share), of the same size.
    let tree =
        |content: &str| fixture("os-v2").with_file("usr/share/pivot/component", 0o644, content);
    let (v1, v1_layers) = push_chunked(&env, &tree("release one"), "1", "v1");
    let (v2, v2_layers) = push_chunked(&env, &tree("release two"), "2", "v2");
    assert_success(&env.pivot(&[&v1]));

    let fetched: Vec<&(String, u64)> = v2_layers
        .iter()
        .filter(|l| !v1_layers.contains(l))
        .collect();
    assert_eq!(
        fetched.len(),
        2,
        "the commit layer and one component: {fetched:?}"
    );
    let out = env.pivot(&["--check", "--json", &v2]);
    assert_success(&out);
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let download = &check["update"]["download"];
    assert_eq!(
        download["bytes"],
        fetched.iter().map(|l| l.1).sum::<u64>(),
        "{download}"
    );
    assert_eq!(download["layers"], 2);
    assert_eq!(download["of_layers"], v2_layers.len());
    assert_eq!(download["commit_in_repo"], false);
}

/// On a sysroot that is not booted the check calls the default deployment "now"; the package
/// changes of `--check --diff` are from it too, not from the rollback deployment (the two are
/// different commits here).
#[test]
fn check_diff_compares_the_update_with_the_deployment_it_calls_now() {
    let v1 = fixture("os-v1")
        .with_rpm_pkglist(&["kernel 0 6.1.0 1.fc40 x86_64", "nano 0 7.2 6.fc40 x86_64"]);
    let v2 = fixture("os-v2")
        .with_rpm_pkglist(&["kernel 0 6.5.0 1.fc40 x86_64", "nano 0 7.2 6.fc40 x86_64"]);
    let v3 = fixture("os-v2")
        .with_file("usr/share/pivot/v3", 0o644, "3")
        .with_rpm_pkglist(&[
            "kernel 0 6.10.0 1.fc40 x86_64",
            "vim-minimal 2 9.1.0 1.fc40 x86_64",
        ]);
    let env = Env::with_v1(&v1);
    let v2 = env.push("v2", &ImageSpec::new(v2, "2"));
    let v3 = env.push("v3", &ImageSpec::new(v3, "3"));
    assert_success(&env.pivot(&[&v2.by_tag]));
    let now = env.deployed()[0].clone();
    assert_ne!(now, env.deployed()[1]);

    let out = env.pivot(&["--check", "--diff", &v3.by_tag]);
    assert_success(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(&format!("Commit: {} (now {now})", v3.commit)),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "ostree diff commit from: default deployment 0, version 2 ({now})"
        )),
        "{report}"
    );
    assert!(
        report.contains("  kernel 6.5.0-1.fc40 -> 6.10.0-1.fc40\n"),
        "{report}"
    );
    assert!(
        report.contains("Removed:\n  nano-7.2-6.fc40.x86_64\n"),
        "{report}"
    );

    let out = env.pivot(&["--check", "--diff", "--json", &v3.by_tag]);
    assert_success(&out);
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(check["checksum"], now.as_str());
    assert_eq!(check["packages"]["from"]["checksum"], now.as_str());
    assert_eq!(check["packages"]["upgraded"][0]["from"], "6.5.0-1.fc40");
    assert_eq!(check["packages"]["added"][0]["name"], "vim-minimal");
}

/// `--check --diff` when a commit carries no package list: the update is still shown, and the
/// packages are named unknown, with why. When it is the running commit, nothing is
/// downloaded. An image without an `ostree.linux` label has its kernel named unknown too.
#[test]
fn check_diff_without_package_lists_shows_the_update_and_names_the_packages_unknown() {
    let env = Env::new();
    let v2 = env.push_v2();
    let out = env.pivot(&["--check", "--diff", &v2.by_tag]);
    assert_success(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(&format!("Update available ({STATEROOT}): ")),
        "{report}"
    );
    assert!(report.contains("Version: 2 (now 1)"), "{report}");
    assert!(
        report.contains("Kernel: unknown (the image has no ostree.linux label)"),
        "{report}"
    );
    assert!(
        report
            .contains("Packages: unknown: reading the packages of the running deployment: commit "),
        "{report}"
    );
    assert!(report.contains("no package list"), "{report}");
    for layer in &v2.layer_digests {
        assert_eq!(env.registry.count_requests("GET", layer), 0, "{layer}");
    }
    let out = env.pivot(&["--check", "--diff", "--json", &v2.by_tag]);
    assert_success(&out);
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(check["packages"].is_null(), "{check}");
    assert!(check["packages_unknown"]
        .as_str()
        .unwrap()
        .contains("no package list"));

    // The running commit has a list, the update none: downloaded, then unknown.
    let env = Env::with_v1(&fixture("os-v1").with_rpm_pkglist(&["nano 0 7.2 6.fc40 x86_64"]));
    let v2 = env.push_v2();
    let out = env.pivot(&["--check", "--diff", &v2.by_tag]);
    assert_success(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report
            .contains("Packages: unknown: reading the packages of the download (pivot/downloaded/"),
        "{report}"
    );
}

/// A blob the image carries twice is downloaded once: the check counts it once.
#[test]
fn check_counts_a_layer_the_image_carries_twice_once() {
    let env = Env::new();
    let repo = RepoTar::build(&fixture("os-v2"), "2").unwrap();
    let layer = RawLayer::new(&repo.tar, Compression::Gzip).unwrap();
    let size = layer.blob.len();
    let image = RawImage::new(vec![layer.clone(), layer], Some(&repo.commit));
    let pushed = image.push(&env.registry, "pivot/os", "twice").unwrap();
    let out = env.pivot(&["--check", "--json", &pushed.by_tag]);
    assert_success(&out);
    let check: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let download = &check["update"]["download"];
    assert_eq!(download["bytes"], size, "{download}");
    assert_eq!(
        (&download["layers"], &download["of_layers"]),
        (&1.into(), &2.into()),
        "{download}"
    );
}
