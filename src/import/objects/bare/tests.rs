use super::*;
use crate::import::objects::tests::{
    bare_repo_in_transaction, file_checksum, has_file, ostree_cli, regular_file_info, walkdir,
};
use ostree::gio;
use ostree::gio::prelude::*;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

const OWNER: (u32, u32, u32) = (1000, 1001, 0o4751);

fn xattrs() -> glib::Variant {
    vec![(b"user.pivot\0".to_vec(), b"checked".to_vec())].to_variant()
}

/// Writes `content` as a regular-file object with [`OWNER`] and [`xattrs`] through libostree;
/// returns its checksum.
fn write_with_libostree(repo: &ostree::Repo, content: &[u8]) -> String {
    libostree_write(repo, content).unwrap()
}

fn libostree_write(repo: &ostree::Repo, content: &[u8]) -> Result<String, glib::Error> {
    let info = regular_file_info(content.len(), OWNER);
    let input = gio::MemoryInputStream::from_bytes(&glib::Bytes::from(content));
    let (stream, length) =
        ostree::raw_file_to_content_stream(&input, &info, Some(&xattrs()), gio::Cancellable::NONE)
            .unwrap();
    Ok(repo
        .write_content(None, &stream, length, gio::Cancellable::NONE)?
        .to_hex())
}

/// What a reader of the repo sees of the object: its content, file info and xattrs, and the
/// checksum libostree computes from them.
fn read_back(repo: &ostree::Repo, checksum: &str) -> (Vec<u8>, (u32, u32, u32, i64), glib::Variant, String) {
    let (stream, info, xattrs) = repo.load_file(checksum, gio::Cancellable::NONE).unwrap();
    let mut content = Vec::new();
    stream
        .unwrap()
        .into_read()
        .read_to_end(&mut content)
        .unwrap();
    let actual = file_checksum(&info, &xattrs, &content);
    let attrs = (
        info.attribute_uint32("unix::uid"),
        info.attribute_uint32("unix::gid"),
        info.attribute_uint32("unix::mode"),
        info.size(),
    );
    (content, attrs, xattrs, actual)
}

/// A bare repo at `path` with `key` set to `value` in its config, in a transaction.
fn configured_in_transaction(path: &Path, key: &str, value: &str) -> ostree::Repo {
    let repo = ostree::Repo::new_for_path(path);
    repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
        .unwrap();
    ostree_cli(path, &["config", "set", key, value]);
    let repo = ostree::Repo::new_for_path(path);
    repo.open(gio::Cancellable::NONE).unwrap();
    repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
    repo
}

fn loose(repo_dir: &Path, checksum: &str) -> std::fs::Metadata {
    let path = repo_dir.join(format!("objects/{}/{}.file", &checksum[..2], &checksum[2..]));
    std::fs::symlink_metadata(path).unwrap()
}

/// The object pivot writes is the one libostree writes: same content, owner, mode (setuid kept
/// though the owner is set), xattrs and modification time, under the name libostree computes
/// for it; a second write of it (another layer's) changes nothing.
#[test]
fn a_file_written_without_libostree_is_the_object_libostree_writes() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (by_libostree, by_pivot) = (bare_repo_in_transaction(a.path()), bare_repo_in_transaction(b.path()));
    let content = b"#!/bin/sh\necho pivot\n".repeat(300);
    let checksum = write_with_libostree(&by_libostree, &content);

    // Another transaction's staging directory (another program's, or an earlier boot's) is not
    // this one's.
    let tmp = b.path().join("bare/tmp");
    std::fs::create_dir(tmp.join("staging-0123-elsewhere")).unwrap();
    std::fs::write(tmp.join("staging-0123-elsewhere-lock"), "").unwrap();
    let staging = Staging::of_transaction(&by_pivot).expect("the transaction's staging directory");
    staging
        .write_file(&checksum, OWNER, &xattrs(), &content)
        .unwrap();
    assert!(has_file(&by_pivot, &checksum), "not staged in the transaction's directory");
    let elsewhere = std::fs::read_dir(tmp.join("staging-0123-elsewhere")).unwrap();
    assert_eq!(elsewhere.count(), 0);
    staging
        .write_file(&checksum, OWNER, &xattrs(), &content)
        .unwrap();
    for repo in [&by_libostree, &by_pivot] {
        repo.commit_transaction(gio::Cancellable::NONE).unwrap();
    }

    let expected = read_back(&by_libostree, &checksum);
    let written = read_back(&by_pivot, &checksum);
    assert_eq!(written.0, content);
    assert_eq!(written.1, (OWNER.0, OWNER.1, libc::S_IFREG | OWNER.2, content.len() as i64));
    assert_eq!(written.2, expected.2, "xattrs");
    assert_eq!(written.3, checksum, "the checksum of what was written");
    assert_eq!(written, expected);
    let (expected, written) = (loose(&a.path().join("bare"), &checksum), loose(&b.path().join("bare"), &checksum));
    assert_eq!((written.mtime(), written.mtime_nsec()), (0, 0));
    assert_eq!(
        (written.mode(), written.uid(), written.gid(), written.mtime(), written.nlink()),
        (expected.mode(), expected.uid(), expected.gid(), expected.mtime(), expected.nlink())
    );
    ostree_cli(&b.path().join("bare"), &["fsck", "--quiet"]);
}

/// Where libostree would write otherwise (no transaction, a repo that is not bare, a repo
/// asking for per-object fsync), pivot leaves every object to it.
#[test]
fn where_libostree_would_write_otherwise_it_writes_every_object() {
    let dir = tempfile::tempdir().unwrap();
    let repo = ostree::Repo::new_for_path(dir.path().join("idle"));
    repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
        .unwrap();
    assert!(Staging::of_transaction(&repo).is_none(), "no transaction");

    for mode in [ostree::RepoMode::Archive, ostree::RepoMode::BareUser] {
        let repo = ostree::Repo::new_for_path(dir.path().join(format!("{mode:?}")));
        repo.create(mode, gio::Cancellable::NONE).unwrap();
        repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
        assert!(Staging::of_transaction(&repo).is_none(), "{mode:?}");
    }

    let repo = configured_in_transaction(&dir.path().join("fsync"), "core.per-object-fsync", "true");
    assert!(Staging::of_transaction(&repo).is_none(), "per-object fsync");
}

/// Past the repo's min-free-space reserve, an object is refused as libostree refuses it, and
/// nothing of it is staged.
#[test]
fn a_file_past_the_min_free_space_reserve_is_refused_as_libostree_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    // More than any test machine's disk.
    let repo = configured_in_transaction(&dir.path().join("bare"), "core.min-free-space-size", "1000000000MB");
    let content = b"pivot";

    let refused = "min-free-space-size 1000000000MB would be exceeded";
    let by_libostree = libostree_write(&repo, content).unwrap_err().to_string();
    assert!(by_libostree.contains(refused), "{by_libostree}");
    let staging = Staging::of_transaction(&repo).expect("the transaction's staging directory");
    let checksum = format!("{:064x}", 1);
    let err = staging
        .write_file(&checksum, OWNER, &xattrs(), content)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with(refused), "{err}");
    assert!(!has_file(&repo, &checksum));
}

/// A name that is not 64 lowercase hex digits (upper case, short, long, not hex) is refused
/// before anything is written: no object could be found under it again.
#[test]
fn a_name_that_is_not_an_object_checksum_is_refused_and_nothing_is_staged() {
    let dir = tempfile::tempdir().unwrap();
    let repo = bare_repo_in_transaction(dir.path());
    let staging = Staging::of_transaction(&repo).unwrap();
    let good = "ab".repeat(32);
    for name in [good.to_uppercase(), good[..62].to_string(), format!("{good}00"), "zz".repeat(32)] {
        let err = staging
            .write_file(&name, OWNER, &xattrs(), b"content")
            .unwrap_err();
        assert!(err.to_string().contains("is not an object checksum"), "{name}: {err:#}");
    }
    let staged = walkdir(&dir.path().join("bare/tmp"));
    assert!(
        staged.iter().all(|p| !p.to_string_lossy().ends_with(".file")),
        "{staged:?}"
    );
}
