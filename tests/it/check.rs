//! `pivot --check`: what a pivot would change, from the manifest and config alone; nothing is
//! downloaded beyond them and nothing is written.

use crate::common::*;

#[test]
fn check_reports_the_update_from_manifest_and_config_only_and_writes_nothing() {
    let env = Env::new();
    let v2 = env.push_v2();
    let before = env.sysroot.snapshot().unwrap();

    let out = env.pivot(&["--check", &v2.by_tag]);
    assert_success(&out);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("update available"), "{report}");
    assert!(report.contains("version: 2 (now 1)"), "{report}");
    assert!(report.contains(&v2.commit), "{report}");
    assert!(report.contains("in 1 layer(s)"), "{report}");

    assert_eq!(env.registry.count_requests("GET", &v2.config_digest), 1);
    for layer in &v2.layer_digests {
        assert_eq!(env.registry.count_requests("GET", layer), 0, "{layer}");
    }
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    // It records no attempt, only what it found, which status shows until it is no news.
    let status = env.status_json();
    let state = &status["pivot"][STATEROOT];
    assert!(state["last"].is_null() && state["attempts"] == 0, "{state}");
    let pinned = format!("{}/pivot/os@{}", env.registry.host(), v2.digest);
    assert_eq!(state["cached_update"]["image"], pinned.as_str());
    assert_eq!(state["cached_update"]["version"], "2");
    let text = env.subcommand("status", &[]);
    assert!(
        String::from_utf8_lossy(&text.stdout)
            .contains(&format!("Update available ({STATEROOT}): {pinned}")),
        "{text:?}"
    );

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
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
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
        report.contains("download: 0 B in 0 layer(s), the commit is already in the repo"),
        "{report}"
    );
}
