//! `pivot confirm`, the next-boot check: it records whether the node runs what the last pivot
//! deployed, says why not when it does not, and records each verdict once.

use crate::common::*;

fn last_attempt(env: &Env) -> serde_json::Value {
    env.status_json()["pivot"][STATEROOT]["last"].clone()
}

#[test]
fn pivot_that_took_effect_is_confirmed() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(last_attempt(&env)["outcome"], "deployed");

    let out = env.subcommand("confirm", &[]);
    assert_success(&out);
    let last = last_attempt(&env);
    assert_eq!(last["outcome"], "confirmed", "{last}");
    assert_eq!(last["commit"], v2.commit.as_str());
    assert!(stderr(&out).contains("confirmed"), "{}", stderr(&out));
}

#[test]
fn deployment_lost_before_boot_is_reported_once_naming_finalize_staged() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    // What a failed ostree-finalize-staged leaves: the new deployment never made it to disk.
    env.undeploy(0);

    let out = env.subcommand("confirm", &[]);
    assert_fails_with(
        &out,
        &[
            "did not take effect",
            &v2.commit,
            "never written",
            "ostree-finalize-staged",
        ],
    );
    let last = last_attempt(&env);
    assert_eq!(last["outcome"], "failed", "{last}");
    assert!(
        last["error"].as_str().unwrap().contains("never written"),
        "{last}"
    );
    // The verdict is recorded: the next boot does not report it again.
    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(last_attempt(&env)["outcome"], "failed");
}

#[test]
fn confirm_without_a_pivot_does_nothing() {
    let env = Env::new();
    let before = env.sysroot.snapshot().unwrap();
    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    assert!(last_attempt(&env).is_null());
}
