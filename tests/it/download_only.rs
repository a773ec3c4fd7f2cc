//! `pivot --download-only`: pull and import, deploy nothing; the later pivot of that image by
//! digest deploys it without the registry.

use crate::common::*;

#[test]
fn download_only_deploys_nothing_and_the_digest_pivot_later_needs_no_registry() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    let deployments = |env: &Env| env.status_json()["deployments"].as_array().unwrap().len();

    let out = env.pivot(&["--download-only", &v2.by_tag]);
    assert_success(&out);
    assert_eq!(deployments(&env), 1, "nothing deployed");
    assert_eq!(
        env.status_json()["pivot"][STATEROOT]["last"]["outcome"],
        "downloaded"
    );
    assert!(stderr(&out).contains(&v2.digest), "{}", stderr(&out));
    let rev = std::process::Command::new("ostree")
        .args(["rev-parse", "--repo"])
        .arg(env.sysroot.repo_path())
        .arg(format!("pivot/downloaded/{}", v2.digest.replace(':', "-")))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&rev.stdout).trim(), v2.commit);

    env.registry.stop();
    let out = env.pivot(&[&v2.by_digest]);
    assert_success(&out);
    let status = env.status_json();
    assert_eq!(status["deployments"].as_array().unwrap().len(), 2);
    assert_eq!(status["deployments"][0]["checksum"], v2.commit.as_str());
    assert!(status["deployments"][0]["image"]
        .as_str()
        .unwrap()
        .ends_with(&v2.digest));
    assert_eq!(status["deployments"][0]["version"], "2");
}

#[test]
fn download_only_of_a_bad_image_keeps_nothing() {
    let env = Env::new();
    let before = env.sysroot.snapshot().unwrap();
    let spec = pivot_testkit::ImageSpec::new(fixture("os-v2"), "2");
    let mut spec = spec;
    spec.commit_label = pivot_testkit::CommitLabel::Value("0".repeat(64));
    let bad = env.push("bad", &spec);
    let out = env.pivot(&["--download-only", &bad.by_tag]);
    assert_fails_with(&out, &["not in the image"]);
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
}
