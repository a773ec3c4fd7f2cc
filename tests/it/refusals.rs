//! Bad input is refused with a clear error naming the problem, and the sysroot is left exactly
//! as it was: same deployments, boot entries, refs, origins and repo objects.

use crate::common::*;
use pivot_testkit::{CommitLabel, ImageSpec};

#[test]
fn malformed_pullspecs_are_refused_naming_the_bad_part() {
    let env = Env::new();
    let cases: [(&str, &[&str]); 6] = [
        ("fedora:latest", &["invalid pullspec", "no registry host"]),
        (
            "quay.io/os@sha256:1234",
            &["invalid pullspec", "64 lowercase hex"],
        ),
        ("quay.io:99999/os", &["port \"99999\""]),
        ("quay.io/OS", &["component \"OS\""]),
        (
            "docker-daemon:os:v2",
            &["unsupported transport \"docker-daemon\"", "oci:"],
        ),
        ("quay.io/os:bad:tag", &["tag", "bad:tag"]),
    ];
    for (spec, needles) in cases {
        assert_refused(&env, &[spec], needles);
    }
}

#[test]
fn malformed_pullspec_file_is_refused_naming_the_file() {
    let env = Env::new();
    let etc = env.default_etc();
    std::fs::create_dir_all(etc.join("pivot")).unwrap();
    std::fs::write(etc.join("pivot/image-pullspec"), "not a pullspec\n").unwrap();
    assert_refused(
        &env,
        &[],
        &["invalid pullspec in", "pivot/image-pullspec", "white space"],
    );
    std::fs::write(etc.join("pivot/image-pullspec"), "\n").unwrap();
    assert_refused(&env, &[], &["image-pullspec is empty"]);
}

#[test]
fn unknown_digest_is_refused() {
    let env = Env::new();
    env.push_v2();
    let missing = format!(
        "{}/pivot/os@sha256:{}",
        env.registry.host(),
        "ab".repeat(32)
    );
    assert_refused(
        &env,
        &[&missing],
        &["fetching manifest", "manifest unknown"],
    );
}

#[test]
fn manifest_not_matching_its_digest_is_refused() {
    let env = Env::new();
    let v2 = env.push_v2();
    // The registry serves what is on its disk: alter the manifest's bytes there.
    // Keep it valid JSON (the registry parses it): change a digit of the first "size".
    flip_byte(&env.registry.blob_data_path(&v2.digest), |bytes| {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let at = text.find("\"size\":").expect("a size field") + "\"size\":".len();
        bytes[at] = if bytes[at] == b'9' {
            b'8'
        } else {
            bytes[at] + 1
        };
    });
    assert_refused(
        &env,
        &[&v2.by_digest],
        &[
            "fetching manifest",
            &format!("manifest digest mismatch: expected {}", v2.digest),
        ],
    );
}

#[test]
fn corrupted_layer_blob_is_refused_as_a_digest_mismatch() {
    let env = Env::new();
    let v2 = env.push_v2();
    flip_byte(
        &env.registry.blob_data_path(&v2.layer_digests[0]),
        |bytes| {
            let at = bytes.len() / 2;
            bytes[at] ^= 0xff;
        },
    );
    assert_refused(
        &env,
        &[&v2.by_tag],
        &[
            "fetching layer 1/1",
            &v2.layer_digests[0],
            "digest mismatch: expected",
        ],
    );
}

#[test]
fn image_without_ostree_repo_is_refused() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.with_repo = false;
    let image = env.push("norepo", &spec);
    assert_refused(
        &env,
        &[&image.by_tag],
        &["no OSTree repository at srv/repo/"],
    );
}

#[test]
fn missing_label_with_several_refs_is_refused() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.commit_label = CommitLabel::Omit;
    spec.refs = vec!["os/a".into(), "os/b".into()];
    let image = env.push("tworefs", &spec);
    assert_refused(
        &env,
        &[&image.by_tag],
        &[
            "no com.coreos.ostree-commit label",
            "several refs (os/a, os/b)",
        ],
    );
}

#[test]
fn label_naming_a_commit_the_image_lacks_is_refused() {
    let env = Env::new();
    let absent = "0123456789abcdef".repeat(4);
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.commit_label = CommitLabel::Value(absent.clone());
    let image = env.push("wronglabel", &spec);
    assert_refused(
        &env,
        &[&image.by_tag],
        &[&format!("commit {absent} is not in the image's repository")],
    );
}

#[test]
fn label_that_is_not_a_checksum_is_refused() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.commit_label = CommitLabel::Value("v2-latest".into());
    let image = env.push("badlabel", &spec);
    assert_refused(
        &env,
        &[&image.by_tag],
        &["com.coreos.ostree-commit=\"v2-latest\" is not an OSTree commit checksum"],
    );
}

#[test]
fn registry_that_is_down_is_reported_and_the_failure_recorded() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    env.registry.stop();
    assert_refused(&env, &[&v2.by_tag], &["pulling", "fetching manifest"]);
    let last = &env.status_json()["pivot"][STATEROOT]["last"];
    assert_eq!(last["outcome"], "failed");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("fetching manifest"),
        "{last}"
    );
}

#[test]
fn pullspec_file_attempts_are_bounded_so_a_failing_target_cannot_loop() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    env.registry.stop();
    let etc = env.default_etc();
    std::fs::create_dir_all(etc.join("pivot")).unwrap();
    std::fs::write(etc.join("pivot/image-pullspec"), &v2.by_tag).unwrap();

    for attempt in 1..=3 {
        assert_refused(&env, &[], &["fetching manifest"]);
        assert_eq!(env.status_json()["pivot"][STATEROOT]["attempts"], attempt);
    }
    // The fourth run gives up without trying again, and says how to retry.
    assert_refused(
        &env,
        &[],
        &[
            "giving up on",
            "after 3 attempts",
            "fetching manifest",
            "state.json",
        ],
    );
    // The file stays, so the failure remains visible.
    assert!(etc.join("pivot/image-pullspec").exists());
    // An admin's explicit pivot is not limited.
    env.registry.start_again().unwrap();
    assert_success(&env.pivot(&[&v2.by_tag]));
}

fn flip_byte(path: &std::path::Path, edit: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    edit(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}
