use super::*;
use ostree::gio::prelude::InputStreamExtManual;
use sha2::{Digest, Sha256};

#[test]
fn object_paths_are_recognised() {
    let hex = "ab".to_string() + &"c".repeat(62);
    let path = format!("ab/{}.filez", "c".repeat(62));
    let (csum, ext) = object_name(&path).unwrap();
    assert_eq!((csum.as_str(), ext), (hex.as_str(), "filez"));
    assert!(object_name("ab/short.filez").is_none());
    assert!(object_name(&format!("abc/{}.filez", &"c".repeat(61))).is_none());
}

#[test]
fn object_keys_are_written_as_loose_names_and_read_back() {
    let checksum = "ab".to_string() + &"c".repeat(62);
    let mut tally = Tally {
        names: Some(Vec::new()),
        ..Tally::default()
    };
    tally.count(&checksum, "filez", Outcome::Written);
    tally.count(&checksum, "dirtree", Outcome::Skipped);
    tally.count(&checksum, "sig", Outcome::Ignored);
    let keys = tally.names.unwrap();
    assert_eq!((tally.written, tally.skipped), (1, 1));
    let json = serde_json::to_string(&keys).unwrap();
    assert_eq!(
        json,
        format!("[\"{checksum}.file\",\"{checksum}.dirtree\"]")
    );
    assert_eq!(serde_json::from_str::<Vec<ObjectKey>>(&json).unwrap(), keys);
    assert_eq!(keys[0].kind(), ObjectType::File);
    for bad in [
        "\"abc.file\"",
        &format!("\"{checksum}.sig\""),
        &format!("\"{}.file\"", checksum.to_uppercase()),
    ] {
        assert!(serde_json::from_str::<ObjectKey>(bad).is_err(), "{bad}");
    }
}

/// The file objects of an archive repo committing `files` (name, content): name and bytes, the
/// largest content first.
pub(in crate::import) fn filez_objects(dir: &std::path::Path, files: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let (tree, archive) = (dir.join("tree"), dir.join("archive"));
    std::fs::create_dir_all(&tree).unwrap();
    for (name, content) in files {
        std::fs::write(tree.join(name), content).unwrap();
    }
    let ostree = |args: &[&str]| {
        let out = std::process::Command::new("ostree")
            .arg(format!("--repo={}", archive.display()))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    ostree(&["init", "--mode=archive"]);
    ostree(&["commit", "--branch=t", &format!("--tree=dir={}", tree.display())]);
    let mut objects: Vec<(String, Vec<u8>, u64)> = walkdir(&archive.join("objects"))
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(archive.join("objects")).unwrap();
            let (checksum, ext) = object_name(rel.to_str()?)?;
            if ext != "filez" {
                return None;
            }
            let repo = ostree::Repo::new_for_path(&archive);
            repo.open(gio::Cancellable::NONE).unwrap();
            let (_, info, _) = repo.load_file(&checksum, gio::Cancellable::NONE).unwrap();
            let size = info.size() as u64;
            Some((checksum, std::fs::read(&path).unwrap(), size))
        })
        .collect();
    objects.sort_by_key(|(_, _, size)| std::cmp::Reverse(*size));
    objects.into_iter().map(|(c, d, _)| (c, d)).collect()
}

/// A bare repo at `dir/bare` with a transaction open, as an import writes into.
pub(in crate::import) fn bare_repo_in_transaction(dir: &std::path::Path) -> ostree::Repo {
    let repo = ostree::Repo::new_for_path(dir.join("bare"));
    repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
        .unwrap();
    repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
    repo
}

/// Runs the `ostree` command on the repo at `repo` and returns its trimmed output.
pub(in crate::import) fn ostree_cli(repo: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("ostree")
        .args(args)
        .arg(format!("--repo={}", repo.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The file info of a regular file of `size` bytes owned by `uid`:`gid` with `mode`'s bits.
pub(in crate::import) fn regular_file_info(size: usize, (uid, gid, mode): (u32, u32, u32)) -> gio::FileInfo {
    let info = gio::FileInfo::new();
    info.set_file_type(gio::FileType::Regular);
    info.set_size(size as i64);
    info.set_attribute_uint32("unix::uid", uid);
    info.set_attribute_uint32("unix::gid", gid);
    info.set_attribute_uint32("unix::mode", libc::S_IFREG | mode);
    info
}

/// The checksum libostree computes for a regular file of `info` and `xattrs` holding `content`.
pub(in crate::import) fn file_checksum(
    info: &gio::FileInfo,
    xattrs: &glib::Variant,
    content: &[u8],
) -> String {
    let input = gio::MemoryInputStream::from_bytes(&glib::Bytes::from(content));
    ostree::checksum_file_from_input(
        info,
        Some(xattrs),
        Some(&input),
        ObjectType::File,
        gio::Cancellable::NONE,
    )
    .unwrap()
    .to_hex()
}

pub(in crate::import) fn has_file(repo: &ostree::Repo, checksum: &str) -> bool {
    repo.has_object(ObjectType::File, checksum, gio::Cancellable::NONE)
        .unwrap()
}

pub(in crate::import) fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        match path.is_dir() {
            true => found.extend(walkdir(&path)),
            false => found.push(path),
        }
    }
    found
}

/// Both ways a file object held in memory is written — its stream inflated whole, or (3 MiB of
/// zeros: a few KiB compressed) handed to libostree while it is hashed — land under their names
/// with their content, and refuse content under another object's name without leaving anything
/// in the repo.
#[test]
fn in_memory_file_objects_are_checked_before_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let large = vec![0u8; 3 << 20];
    let files = [("large", large.clone()), ("small", b"small file\n".to_vec())];
    let objects = filez_objects(dir.path(), &files);
    assert_eq!(objects.len(), 2);
    assert!(objects[0].1.len() as u64 <= IN_MEMORY_OBJECT);
    let repo = bare_repo_in_transaction(dir.path());
    let has = |c: &str| has_file(&repo, c);
    // Each object's bytes under the other's name.
    for (i, (name, _)) in objects.iter().enumerate() {
        let (actual, data) = &objects[1 - i];
        let err = format!("{:#}", write_object_bytes(&repo, name, "filez", data.clone()).unwrap_err());
        // pivot's check and libostree's both name the two checksums.
        assert!(err.contains(name.as_str()) && err.contains(actual.as_str()), "{err}");
        assert!(!has(name) && !has(actual));
    }
    for ((name, data), (_, content)) in objects.iter().zip(&files) {
        let outcome = write_object_bytes(&repo, name, "filez", data.clone()).unwrap();
        assert_eq!(outcome, Outcome::Written);
        let (input, _, _) = repo.load_file(name, gio::Cancellable::NONE).unwrap();
        let mut read = Vec::new();
        input.unwrap().into_read().read_to_end(&mut read).unwrap();
        assert_eq!(&read, content);
    }
}

/// `len` bytes that do not compress: a SHA-256 chain.
pub(in crate::import) fn incompressible(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut block = Sha256::digest(b"pivot").to_vec();
    while out.len() < len {
        block = Sha256::digest(&block).to_vec();
        out.extend_from_slice(&block);
    }
    out.truncate(len);
    out
}

/// A file object too large to hold (over `IN_MEMORY_OBJECT` compressed) streams to libostree
/// while pivot hashes it, and its last chunk is held back until the hash matches: content
/// under another object's name, or cut short, is refused naming the problem, and nothing lands
/// in the repo or its staging directory; the real object lands with its content.
#[test]
fn streamed_file_objects_are_checked_before_they_land() {
    let dir = tempfile::tempdir().unwrap();
    let big = incompressible(3 << 20);
    let files = [("big", big.clone()), ("other", incompressible(2 << 20))];
    let objects = filez_objects(dir.path(), &files);
    assert!(objects.iter().all(|(_, d)| d.len() as u64 > IN_MEMORY_OBJECT));
    // Streamed from a reader this thread borrows (inflated here, hashed and written on another
    // thread) and from one it owns (all on this thread, as the pool's writers do).
    for owned in [false, true] {
        let dir = dir.path().join(format!("owned-{owned}"));
        std::fs::create_dir(&dir).unwrap();
        let repo = bare_repo_in_transaction(&dir);
        let has = |c: &str| has_file(&repo, c);
        let staged = || walkdir(&dir.join("bare/tmp")).len();
        let before = staged();
        let write = |name: &str, data: &[u8], size: usize| match owned {
            false => write_object(&repo, name, "filez", &mut &data[..], size as u64),
            true => {
                let input = std::io::Cursor::new(data.to_vec());
                write_object_owned(&repo, name, "filez", input, size as u64)
            }
        };
        let ((big_name, big_data), (other_name, other_data)) = (&objects[0], &objects[1]);
        let err = format!("{:#}", write(big_name, other_data, other_data.len()).unwrap_err());
        assert!(err.contains(big_name.as_str()) && err.contains(other_name.as_str()), "{err}");
        assert!(err.contains("does not match its name"), "{err}");
        let cut = &big_data[..big_data.len() - 4096];
        // The caller names the member; this says what is wrong with it.
        let err = format!("{:#}", write(big_name, cut, big_data.len()).unwrap_err());
        assert!(err.contains("inflating archived file object"), "{err}");
        assert!(!has(big_name) && !has(other_name));
        assert_eq!(staged(), before, "an unchecked object was left behind");
        assert_eq!(write(big_name, big_data, big_data.len()).unwrap(), Outcome::Written);
        assert_eq!(write(big_name, big_data, big_data.len()).unwrap(), Outcome::Skipped);
        let (input, _, _) = repo.load_file(big_name, gio::Cancellable::NONE).unwrap();
        let mut read = Vec::new();
        input.unwrap().into_read().read_to_end(&mut read).unwrap();
        assert!(read == big, "the object's content differs from the file's");
    }
}

/// An archive header that claims more than any real one (owner, mode and xattrs take a few
/// hundred bytes) is refused by its size before pivot reads it, naming the problem.
#[test]
fn a_file_object_with_an_absurd_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let repo = bare_repo_in_transaction(dir.path());
    let mut data = (64u32 << 20).to_be_bytes().to_vec();
    data.resize(4 << 20, 0);
    let name = hex::encode(Sha256::digest(&data));
    let err = format!("{:#}", write_object_bytes(&repo, &name, "filez", data).unwrap_err());
    assert!(err.contains("header of 67108864 bytes is larger than"), "{err}");
    assert!(!has_file(&repo, &name));
}
