//! Health checks at the first boot of a target (`/etc/pivot/health.d`): a failing check rolls
//! the node back to the deployment before, records which check failed and how, and the next
//! boot records the rollback; a target is left once only, so a second failure never loops.

use std::os::unix::fs::PermissionsExt;

use crate::common::*;

/// Installs check `name` running `script` in the /etc of the deployment that boots next.
fn install_check(env: &Env, name: &str, script: &str) {
    let dir = env.default_etc().join("pivot/health.d");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn state(env: &Env) -> serde_json::Value {
    env.status_json()["pivot"][STATEROOT].clone()
}

#[test]
fn a_failing_check_rolls_back_once_per_target_and_the_next_boot_records_it() {
    let env = Env::new();
    let v1 = env.deployed()[0].clone();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    install_check(&env, "10-passes", "#!/bin/sh\necho fine\n");
    install_check(
        &env,
        "50-runtime",
        "#!/bin/sh\necho \"checking $PIVOT_TARGET_COMMIT\"\necho crio.service is not active >&2\nexit 4\n",
    );

    // The target's first boot: the check fails, the previous deployment becomes the default.
    let out = env.subcommand("confirm", &[]);
    assert_fails_with(
        &out,
        &[
            "health check 50-runtime failed (exit status 4)",
            "crio.service is not active",
            &format!("rolling back to {v1}"),
        ],
    );
    assert_eq!(env.deployed(), [v1.clone(), v2.commit.clone()]);
    let s = state(&env);
    assert_eq!(s["last"]["outcome"], "failed", "{s:#}");
    assert_eq!(s["health"]["check"], "50-runtime");
    assert_eq!(s["health"]["how"], "failed (exit status 4)");
    assert_eq!(s["health"]["commit"], v2.commit.as_str());
    assert_eq!(s["health"]["rolled_back_to"], v1.as_str());
    assert_eq!(
        s["health"]["output_tail"],
        format!("checking {}\ncrio.service is not active", v2.commit)
    );
    let text = String::from_utf8_lossy(&env.subcommand("status", &[]).stdout).to_string();
    assert!(
        text.contains("Failed health check") && text.contains("50-runtime failed (exit status 4)"),
        "{text}"
    );

    // The next boot runs v1 again: the attempt is recorded rolled back, once.
    let out = env.subcommand("confirm", &[]);
    assert_success(&out);
    assert!(
        stderr(&out).contains("rolled back from"),
        "{}",
        stderr(&out)
    );
    assert_eq!(state(&env)["last"]["outcome"], "rolled-back");
    let before = env.sysroot.snapshot().unwrap();
    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(env.sysroot.snapshot().unwrap(), before);

    // An admin sends the node to v2 again and the check fails again: it stays, failed.
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(env.deployed()[0], v2.commit);
    install_check(&env, "50-runtime", "#!/bin/sh\nexit 1\n");
    let out = env.subcommand("confirm", &[]);
    assert_fails_with(&out, &["50-runtime", "not rolling back", "once already"]);
    assert_eq!(env.deployed()[0], v2.commit);
    let s = state(&env);
    assert!(s["health"]["rolled_back_to"].is_null(), "{s:#}");
    assert_eq!(s["last"]["outcome"], "failed");
}

#[test]
fn passing_checks_confirm_and_clear_an_earlier_failure() {
    let env = Env::new();
    let v2 = env.push_v2();
    let v3 = env.push("v3", &pivot_testkit::ImageSpec::new(fixture("os-v2"), "3"));
    assert_success(&env.pivot(&[&v2.by_tag]));
    install_check(&env, "50-net", "#!/bin/sh\nexit 1\n");
    assert_fails_with(&env.subcommand("confirm", &[]), &["50-net"]);
    assert!(!state(&env)["health"].is_null());

    assert_success(&env.pivot(&[&v3.by_tag]));
    install_check(&env, "50-net", "#!/bin/sh\nexit 0\n");
    assert_success(&env.subcommand("confirm", &[]));
    let s = state(&env);
    assert_eq!(s["last"]["outcome"], "confirmed", "{s:#}");
    assert!(s["health"].is_null(), "{s:#}");
    assert_eq!(env.deployed()[0], v3.commit);
}

#[test]
fn a_check_that_hangs_is_cut_at_the_configured_bound() {
    let env = Env::new();
    let v1 = env.deployed()[0].clone();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    install_check(
        &env,
        "20-hangs",
        "#!/bin/sh\necho waiting\nexec sleep 600\n",
    );
    let config = env.default_etc().join("pivot/config.d");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("50-health.toml"), "[health]\ntimeout = 1\n").unwrap();
    let started = std::time::Instant::now();
    let out = env.subcommand("confirm", &[]);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert_fails_with(
        &out,
        &["health check 20-hangs timed out after 1 s", "waiting"],
    );
    assert_eq!(env.deployed()[0], v1);
}

#[test]
fn a_confirm_killed_during_its_checks_runs_them_again_at_the_next_boot() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    // The power goes while the check runs: here, the check kills pivot confirm itself.
    install_check(&env, "50-cut", "#!/bin/sh\nkill -9 $PPID\nsleep 5\n");
    let out = env.subcommand("confirm", &[]);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(state(&env)["last"]["outcome"], "deployed");

    install_check(&env, "50-cut", "#!/bin/sh\necho ran >> \"$0.ran\"\n");
    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(state(&env)["last"]["outcome"], "confirmed");
    assert!(env.default_etc().join("pivot/health.d/50-cut.ran").exists());
}
