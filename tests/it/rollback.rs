//! `pivot rollback`: the previous deployment becomes the default, recorded in the state and
//! shown by status; the pullspec file's target is held until the file names another image.

use crate::common::*;
use pivot_testkit::ImageSpec;

#[test]
fn rollback_makes_the_previous_deployment_the_default_and_can_itself_be_undone() {
    let env = Env::new();
    let v1 = env.deployed()[0].clone();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(env.deployed(), [v2.commit.clone(), v1.clone()]);

    let out = env.subcommand("rollback", &[]);
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("{v1} is the default deployment now")),
        "{out:?}"
    );
    assert_eq!(env.deployed(), [v1.clone(), v2.commit.clone()]);
    // libostree's own view (the bootloader entries it wrote) agrees.
    let admin = std::process::Command::new("ostree")
        .args(["admin", "status", "--sysroot"])
        .arg(&env.sysroot.path)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&admin.stdout).to_string();
    let first = listing
        .lines()
        .find(|l| l.contains(STATEROOT))
        .unwrap_or_default();
    assert!(first.contains(&v1), "{listing}");

    let status = env.status_json();
    let rollback = &status["pivot"][STATEROOT]["rollback"];
    assert_eq!(rollback["to"], v1.as_str());
    assert_eq!(rollback["from"], v2.commit.as_str());
    assert!(rollback["held"].is_null(), "{status:#}");
    let text = env.subcommand("status", &[]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("Last rollback"),
        "{text:?}"
    );

    // Rolling back the rollback.
    assert_success(&env.subcommand("rollback", &[]));
    assert_eq!(env.deployed(), [v2.commit.clone(), v1]);
    assert_fsck_clean(&env);
}

#[test]
fn with_nothing_to_go_back_to_rollback_says_so_and_changes_nothing() {
    let env = Env::new();
    let before = env.sysroot.snapshot().unwrap();
    let out = env.subcommand("rollback", &[]);
    assert_fails_with(&out, &["no deployment to roll back to", STATEROOT]);
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
}

#[test]
fn the_pullspec_files_target_is_held_after_a_rollback_until_the_file_changes() {
    let env = Env::new();
    let v1 = env.deployed()[0].clone();
    let v2 = env.push_v2();
    let v3 = env.push("v3", &ImageSpec::new(fixture("os-v2"), "3"));
    let write_pullspec = |pullspec: &str| {
        let etc = env.default_etc();
        std::fs::create_dir_all(etc.join("pivot")).unwrap();
        std::fs::write(etc.join("pivot/image-pullspec"), format!("{pullspec}\n")).unwrap();
    };
    write_pullspec(&v2.by_tag);
    assert_success(&env.pivot(&[]));
    assert_eq!(env.deployed()[0], v2.commit);

    assert_success(&env.subcommand("rollback", &[]));
    assert_eq!(env.deployed()[0], v1);
    assert_eq!(
        env.status_json()["pivot"][STATEROOT]["rollback"]["held"],
        v2.by_tag.as_str()
    );
    // The next first-boot run leaves the node where the admin put it, and says why.
    let before = env.sysroot.snapshot().unwrap();
    let out = env.pivot(&[]);
    assert_success(&out);
    assert!(
        stderr(&out).contains(&format!("not pivoting to {}", v2.by_tag)),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    assert_eq!(env.deployed()[0], v1);

    // Another target in the file is pursued.
    write_pullspec(&v3.by_tag);
    assert_success(&env.pivot(&[]));
    assert_eq!(env.deployed()[0], v3.commit);

    // An admin's own pivot lifts the hold too.
    assert_success(&env.subcommand("rollback", &[]));
    write_pullspec(&v3.by_tag);
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert!(env.status_json()["pivot"][STATEROOT]["rollback"]["held"].is_null());
}
