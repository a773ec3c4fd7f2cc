use super::*;
use crate::import::objects::tests::{
    bare_repo_in_transaction, file_checksum, has_file, regular_file_info, ostree_cli, walkdir,
};
use ostree::gio;
use ostree::glib;
use ostree::glib::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};

const OWNER: (u32, u32, u32) = (0, 0, 0o644);

/// `count` files' contents and the checksums libostree computes for them.
fn files(count: usize) -> Vec<(String, Vec<u8>)> {
    let xattrs = no_xattrs();
    (0..count)
        .map(|i| {
            let content = format!("file {i} of the publisher's test\n").repeat(40).into_bytes();
            let info = regular_file_info(content.len(), OWNER);
            let checksum = file_checksum(&info, &xattrs, &content);
            (checksum, content)
        })
        .collect()
}

fn no_xattrs() -> glib::Variant {
    Vec::<(Vec<u8>, Vec<u8>)>::new().to_variant()
}

fn in_objects(repo_dir: &Path, checksum: &str) -> bool {
    repo_dir
        .join(format!("objects/{}/{}.file", &checksum[..2], &checksum[2..]))
        .exists()
}

fn objects_count(repo_dir: &Path) -> usize {
    walkdir(&repo_dir.join("objects")).len()
}

fn prefix_dirs(repo_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo_dir.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Waits until `count` of `files` are in `objects/` (the publisher works on its own thread).
fn wait_for_moved(repo_dir: &Path, files: &[(String, Vec<u8>)], count: usize) {
    let started = Instant::now();
    loop {
        let moved = files.iter().filter(|(c, _)| in_objects(repo_dir, c)).count();
        if moved >= count {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "only {moved} of {count} objects moved into objects/"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stages `files`: two batches of 4, each waited for until it reached `objects/`, then 2,
/// which stay staged. (A batch takes all that is staged when the thread wakes: 8 written at
/// once could become a batch of 5 and 3 left waiting.)
fn write_and_wait(staging: &Staging, repo_dir: &Path, files: &[(String, Vec<u8>)]) {
    for (i, (checksum, content)) in files.iter().enumerate() {
        staging.write_file(checksum, OWNER, &no_xattrs(), content).unwrap();
        if i == 3 || i == 7 {
            wait_for_moved(repo_dir, files, i + 1);
        }
    }
}

/// Whole batches reach `objects/` while the transaction is open, the rest at its commit;
/// afterwards the repo is whole, as if libostree had moved everything.
#[test]
fn staged_objects_move_into_objects_in_batches_and_stay_once_the_transaction_commits() {
    let dir = tempfile::tempdir().unwrap();
    let repo = bare_repo_in_transaction(dir.path());
    let repo_dir = dir.path().join("bare");
    let staging = Staging::of_transaction(&repo).expect("the transaction's staging directory");
    let publisher = Publisher::start_batched(staging.clone(), &repo_dir.join("objects"), 4).unwrap();
    let files = files(10);
    write_and_wait(&staging, &repo_dir, &files);
    for (checksum, _) in &files {
        assert!(has_file(&repo, checksum), "{checksum} is neither staged nor in objects/");
    }

    let mut publisher = publisher;
    publisher.stop();
    assert_eq!(publisher.published(), 8);
    repo.commit_transaction(gio::Cancellable::NONE).unwrap();
    publisher.keep();
    for (checksum, _) in &files {
        assert!(in_objects(&repo_dir, checksum), "{checksum} is not in objects/");
    }
    ostree_cli(&repo_dir, &["fsck", "--quiet"]);
}

/// A transaction that does not commit (a refused image, an error after the layers) takes
/// back what was moved: `objects/` is as it was (its prefix directories too), and what was
/// there before stays.
#[test]
fn objects_moved_for_a_transaction_that_does_not_commit_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let repo = bare_repo_in_transaction(dir.path());
    let repo_dir = dir.path().join("bare");
    let earlier = files(12).split_off(10);
    {
        let staging = Staging::of_transaction(&repo).unwrap();
        for (checksum, content) in &earlier {
            staging.write_file(checksum, OWNER, &no_xattrs(), content).unwrap();
        }
    }
    repo.commit_transaction(gio::Cancellable::NONE).unwrap();
    let before = objects_count(&repo_dir);
    assert_eq!(before, 2);
    let dirs_before = prefix_dirs(&repo_dir);

    repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
    let staging = Staging::of_transaction(&repo).unwrap();
    let publisher = Publisher::start_batched(staging.clone(), &repo_dir.join("objects"), 4).unwrap();
    let files = files(10);
    write_and_wait(&staging, &repo_dir, &files);
    drop(publisher);
    repo.abort_transaction(gio::Cancellable::NONE).unwrap();

    assert_eq!(objects_count(&repo_dir), before);
    assert_eq!(prefix_dirs(&repo_dir), dirs_before, "objects/ keeps prefix directories made for it");
    for (checksum, _) in &earlier {
        assert!(in_objects(&repo_dir, checksum), "{checksum}, there before, was removed");
    }
    ostree_cli(&repo_dir, &["fsck", "--quiet"]);
}

/// While the transaction is open, objects moved into `objects/` are not a prune's to remove,
/// though no ref reaches them yet: libostree's prune waits for the transaction's shared repo
/// lock (given up here after a second) and removes nothing.
#[test]
fn a_prune_waits_for_the_transaction_whose_objects_were_moved() {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("bare");
    let repo = ostree::Repo::new_for_path(&repo_dir);
    repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
        .unwrap();
    ostree_cli(&repo_dir, &["config", "set", "core.lock-timeout-secs", "1"]);
    let repo = ostree::Repo::new_for_path(&repo_dir);
    repo.open(gio::Cancellable::NONE).unwrap();
    repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
    let staging = Staging::of_transaction(&repo).unwrap();
    let mut publisher =
        Publisher::start_batched(staging.clone(), &repo_dir.join("objects"), 4).unwrap();
    let files = files(10);
    write_and_wait(&staging, &repo_dir, &files);

    let prune = std::process::Command::new("ostree")
        .args(["prune", "--refs-only"])
        .arg(format!("--repo={}", repo_dir.display()))
        .output()
        .unwrap();
    assert!(!prune.status.success(), "the prune did not wait: {prune:?}");
    let err = String::from_utf8_lossy(&prune.stderr);
    assert!(err.contains("Locking repo exclusive"), "the prune failed otherwise: {err}");
    assert_eq!(objects_count(&repo_dir), 8, "{prune:?}");

    publisher.stop();
    repo.commit_transaction(gio::Cancellable::NONE).unwrap();
    publisher.keep();
    assert_eq!(objects_count(&repo_dir), 10);
}
