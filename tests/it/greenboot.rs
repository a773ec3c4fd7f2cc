//! greenboot beside pivot: both use the GRUB environment protocol of Fedora's GRUB
//! (`boot_success`, `boot_counter`), and each settles only the counter it armed. greenboot's
//! counter is written here exactly as its scripts write it (`grub2-editenv`, Debian's
//! `grub-editenv`); pivot's is armed by pivot's own code. What a user notices: whether GRUB
//! still counts greenboot's attempt down after `pivot confirm`, and whether greenboot's
//! fallback check still finds `boot_counter=-1` to roll back from.

use std::path::{Path, PathBuf};
use std::process::Command;

use pivot_testkit::PushedImage;

use crate::common::*;

/// The sysroot's environment block, made as `grub-editenv` makes one (as a node's GRUB
/// package does), on /boot/grub2 as on Fedora-style nodes.
fn grubenv(env: &Env) -> PathBuf {
    let dir = env.sysroot.path.join("boot/grub2");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("grubenv");
    editenv(&file, &["create"]);
    file
}

/// `grub-editenv FILE ARGS…`, as greenboot's scripts run `grub2-editenv`; returns its output.
fn editenv(file: &Path, args: &[&str]) -> String {
    let out = Command::new("grub-editenv")
        .arg(file)
        .args(args)
        .output()
        .expect("running grub-editenv");
    assert!(out.status.success(), "grub-editenv {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The block's variables, as `grub-editenv list` (and greenboot's fallback check) reads them.
fn listed(file: &Path) -> Vec<String> {
    editenv(file, &["list"]).lines().map(String::from).collect()
}

/// greenboot-grub2-set-counter, at the shutdown that finalizes a staged deployment
/// (GREENBOOT_MAX_BOOT_ATTEMPTS, 3 by default).
fn greenboot_arms(file: &Path, attempts: &str) {
    editenv(file, &["set", &format!("boot_counter={attempts}")]);
    editenv(file, &["set", "boot_success=0"]);
}

/// A pivot to v2 recorded, its deployment written (the sysroot is not booted: v2 is what runs
/// when `pivot confirm` looks).
fn pivoted(env: &Env) -> (String, PushedImage) {
    let v1 = env.deployed()[0].clone();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(env.deployed(), [v2.commit.clone(), v1.clone()]);
    (v1, v2)
}

#[test]
fn greenboots_counter_is_left_to_greenboot_on_a_confirmed_boot() {
    let env = Env::new();
    let (v1, v2) = pivoted(&env);
    let file = grubenv(&env);
    greenboot_arms(&file, "3");
    // GRUB counted the boot that runs v2 (the shipped counter, see packaging.rs).
    editenv(&file, &["set", "boot_counter=2"]);
    let before = std::fs::read(&file).unwrap();

    let out = env.subcommand("confirm", &[]);
    assert_success(&out);
    assert_eq!(
        env.status_json()["pivot"][STATEROOT]["last"]["outcome"],
        "confirmed"
    );
    // greenboot's attempt is still running: its health checks have not passed yet, so a reset
    // now still counts down towards its fallback.
    assert_eq!(listed(&file), ["boot_counter=2", "boot_success=0"]);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the block was rewritten"
    );
    assert_eq!(env.deployed(), [v2.commit.clone(), v1.clone()]);

    // greenboot-grub2-set-success, once its checks pass (after boot-complete.target).
    editenv(&file, &["set", "boot_success=1"]);
    editenv(&file, &["unset", "boot_counter"]);
    assert_eq!(listed(&file), ["boot_success=1"]);
    // The next boots: pivot has nothing to settle and writes nothing.
    let settled = std::fs::read(&file).unwrap();
    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(std::fs::read(&file).unwrap(), settled);
    assert_eq!(env.deployed(), [v2.commit, v1]);
}

#[test]
fn greenboots_fallback_is_greenboots_pivot_does_not_roll_back_twice() {
    let env = Env::new();
    let (v1, v2) = pivoted(&env);
    let file = grubenv(&env);
    // greenboot arms 10 tries (more than pivot's counter once could count); the target never
    // came up and GRUB ran out of them: it booted entry 1 and left -1.
    greenboot_arms(&file, "10");
    editenv(&file, &["set", "boot_counter=-1"]);
    let before = std::fs::read(&file).unwrap();

    assert_success(&env.subcommand("confirm", &[]));
    // What greenboot-rpm-ostree-grub2-check-fallback looks for (`grub2-editenv list | grep -q
    // "^boot_counter=-1$"`) is still there: greenboot makes the one rollback.
    assert!(
        listed(&file).iter().any(|l| l == "boot_counter=-1"),
        "{:?}",
        listed(&file)
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the block was rewritten"
    );
    // pivot did not roll back itself: the boot order is the one GRUB fell back from, for
    // greenboot's `rpm-ostree rollback` to change once.
    assert_eq!(env.deployed(), [v2.commit.clone(), v1.clone()]);
    assert!(
        env.status_json()["pivot"][STATEROOT]["rollback"].is_null(),
        "pivot recorded a rollback"
    );

    // An admin's `pivot rollback` leaves greenboot's counter to greenboot too.
    editenv(&file, &["set", "boot_counter=2"]);
    let armed = std::fs::read(&file).unwrap();
    assert_success(&env.subcommand("rollback", &[]));
    assert_eq!(env.deployed(), [v1, v2.commit]);
    assert_eq!(std::fs::read(&file).unwrap(), armed);
}

#[test]
fn pivots_own_counter_is_settled_by_pivot_confirm() {
    let env = Env::new();
    let (_, v2) = pivoted(&env);
    let file = grubenv(&env);
    // What staging on a booted node without greenboot writes (pivot's own code; the booted
    // system here is v1's deployment, which has no greenboot units).
    let armed =
        pivot::sysroot::grubenv::arm(&env.sysroot.path, &env.deployment(1), 3, &v2.commit).unwrap();
    assert_eq!(armed, pivot::sysroot::grubenv::Armed::Block(file.clone()));
    assert_eq!(
        listed(&file),
        [
            "boot_success=0".to_string(),
            "boot_counter=3".to_string(),
            format!("pivot_boot_once={}", v2.commit),
        ]
    );
    // GRUB counted the boot that runs v2.
    editenv(&file, &["set", "boot_counter=2"]);

    assert_success(&env.subcommand("confirm", &[]));
    // Settled: GRUB keeps booting v2, and counts nothing.
    assert_eq!(listed(&file), ["boot_success=1"]);
    assert_eq!(
        env.status_json()["pivot"][STATEROOT]["last"]["outcome"],
        "confirmed"
    );
}

#[test]
fn beside_greenboot_pivot_leaves_the_counter_to_it() {
    let env = Env::new();
    let (_, v2) = pivoted(&env);
    let file = grubenv(&env);
    let before = std::fs::read(&file).unwrap();
    // The booted system has greenboot's unit that arms every staged deployment.
    let system = tempfile::tempdir().unwrap();
    let units = system.path().join("usr/lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    let unit = units.join("greenboot-grub2-set-counter.service");
    std::fs::write(
        &unit,
        "[Install]\nRequiredBy=ostree-finalize-staged.service\n",
    )
    .unwrap();

    let armed =
        pivot::sysroot::grubenv::arm(&env.sysroot.path, system.path(), 3, &v2.commit).unwrap();
    assert_eq!(armed, pivot::sysroot::grubenv::Armed::Greenboot(unit));
    assert_eq!(std::fs::read(&file).unwrap(), before);
    // greenboot arms at shutdown, with its own number of attempts.
    greenboot_arms(&file, "5");
    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(listed(&file), ["boot_counter=5", "boot_success=0"]);
}
