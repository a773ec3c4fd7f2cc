//! After writing a deployment, pivot prunes the repo itself (libostree's cleanup holds every
//! object name in memory). libostree is the judge: after pivot's prune, `ostree prune` of the
//! same reach (refs only, no parents) finds nothing left to delete, and `ostree fsck` finds
//! nothing missing.

use std::process::Command;

use crate::common::*;
use pivot_testkit::ImageSpec;

#[test]
fn a_pivot_that_rolls_off_a_deployment_deletes_what_only_it_used() {
    let env = Env::new();
    let v1 = env.sysroot.commit_v1().to_string();
    let v1_os_release = content_checksum(&env, &v1, "/usr/lib/os-release");
    let v2 = env.push_v2();
    let tree = fixture("os-v2").with_file("usr/share/pivot/v3-marker", 0o644, "v3\n");
    let v3 = env.push("v3", &ImageSpec::new(tree, "3"));
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert!(has_object(&env, &v1_os_release, "file"));
    let v1_dir = env.deployment(1);

    let out = env.pivot(&[&v3.by_tag]);
    assert_success(&out);
    // v3 and its rollback v2; v1 rolled off, its deployment and its own objects with it.
    assert_eq!(env.deployed(), [v3.commit.clone(), v2.commit.clone()]);
    assert!(!v1_dir.exists(), "{} is still there", v1_dir.display());
    assert!(!env.has_commit(&v1), "v1's commit is still there");
    assert!(
        !has_object(&env, &v1_os_release, "file"),
        "v1's os-release is still there"
    );
    assert!(stderr(&out).contains("pruned "), "{}", stderr(&out));
    assert_libostree_finds_nothing_to_prune(&env);
    assert_fsck_clean(&env);
}

#[test]
fn a_commit_nothing_refers_to_is_pruned_and_a_commit_under_a_ref_is_kept() {
    let env = Env::new();
    let orphan = commit_file(&env, None, "orphan\n");
    let kept = commit_file(&env, Some("admin/kept"), "kept by a ref\n");
    let v2 = env.push_v2();

    assert_success(&env.pivot(&[&v2.by_tag]));
    assert!(!env.has_commit(&orphan), "the orphan is still there");
    assert!(env.has_commit(&kept), "the ref's commit was deleted");
    assert_eq!(
        read_file(&env, &kept, "/kept"),
        "kept by a ref\n",
        "the ref's commit lost its content"
    );
    assert_libostree_finds_nothing_to_prune(&env);
    assert_fsck_clean(&env);
}

#[test]
fn when_a_reachable_tree_cannot_be_read_nothing_is_pruned() {
    let env = Env::new();
    let orphan = commit_file(&env, None, "orphan\n");
    let broken = commit_file(&env, Some("admin/broken"), "broken\n");
    // The ref's commit loses its root dirtree: what it reaches can no longer be known.
    let root = root_dirtree(&env, &broken);
    std::fs::remove_file(object_path(&env, &root, "dirtree")).unwrap();
    let before = object_files(&env);
    let v2 = env.push_v2();

    let out = env.pivot(&[&v2.by_tag]);
    assert_success(&out);
    assert!(
        stderr(&out).contains(&format!("dirtree object {root} is missing")),
        "{}",
        stderr(&out)
    );
    assert!(env.has_commit(&orphan), "pruned regardless");
    let after = object_files(&env);
    let gone: Vec<_> = before.difference(&after).collect();
    assert!(
        gone.is_empty(),
        "deleted although the reach was unknown: {gone:?}"
    );
    assert_eq!(env.deployed()[0], v2.commit);
}

/// Runs `ostree <args> --repo=<the sysroot's repo>`, which must succeed: its stdout.
fn ostree(env: &Env, args: &[&str]) -> String {
    let out = Command::new("ostree")
        .args(args)
        .arg(format!("--repo={}", env.sysroot.repo_path().display()))
        .output()
        .expect("running ostree");
    assert!(out.status.success(), "ostree {args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A commit of one file `/kept` or `/orphan` holding `text`, under `branch` or none.
fn commit_file(env: &Env, branch: Option<&str>, text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let name = if branch.is_some() { "kept" } else { "orphan" };
    std::fs::write(dir.path().join(name), text).unwrap();
    let tree = format!("--tree=dir={}", dir.path().display());
    let mut args = vec!["commit", &tree, "--owner-uid=0", "--owner-gid=0"];
    let branch_arg;
    match branch {
        Some(b) => {
            branch_arg = format!("--branch={b}");
            args.push(&branch_arg);
        }
        None => args.push("--orphan"),
    }
    ostree(env, &args).trim().to_string()
}

fn read_file(env: &Env, commit: &str, path: &str) -> String {
    ostree(env, &["cat", commit, path])
}

/// The content object of `path` in `commit`.
fn content_checksum(env: &Env, commit: &str, path: &str) -> String {
    let line = ostree(env, &["ls", "-C", commit, path]);
    line.split_whitespace()
        .find(|w| w.len() == 64 && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no checksum in {line:?}"))
        .to_string()
}

/// The root dirtree of `commit`.
fn root_dirtree(env: &Env, commit: &str) -> String {
    let line = ostree(env, &["ls", "-C", "-d", commit, "/"]);
    // d00755 0 0 0 <dirtree> <dirmeta> /
    let words: Vec<&str> = line.split_whitespace().collect();
    words[words.len() - 3].to_string()
}

fn object_path(env: &Env, checksum: &str, kind: &str) -> std::path::PathBuf {
    env.sysroot
        .repo_path()
        .join("objects")
        .join(&checksum[..2])
        .join(format!("{}.{kind}", &checksum[2..]))
}

fn has_object(env: &Env, checksum: &str, kind: &str) -> bool {
    object_path(env, checksum, kind).exists()
}

/// libostree's prune over what the sysroot's cleanup keeps (refs, no parents) deletes nothing.
fn assert_libostree_finds_nothing_to_prune(env: &Env) {
    let out = ostree(env, &["prune", "--refs-only", "--depth=0", "--no-prune"]);
    assert!(out.contains("No unreachable objects"), "{out}");
}
