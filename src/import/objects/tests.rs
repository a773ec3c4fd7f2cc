use super::*;

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
fn filez_objects(dir: &std::path::Path, files: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
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

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
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

/// Both ways a file object held in memory is written — checked by pivot, or by libostree when
/// its stream is over `VERIFIED_IN_MEMORY` (3 MiB of zeros: a few KiB compressed) — land under
/// their names with their content, and refuse content under another object's name without
/// leaving anything in the repo.
#[test]
fn in_memory_file_objects_are_checked_before_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let large = vec![0u8; 3 << 20];
    let files = [("large", large.clone()), ("small", b"small file\n".to_vec())];
    let objects = filez_objects(dir.path(), &files);
    assert_eq!(objects.len(), 2);
    assert!(objects[0].1.len() as u64 <= IN_MEMORY_OBJECT);
    let repo = ostree::Repo::new_for_path(dir.path().join("bare"));
    repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
        .unwrap();
    repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
    let has = |c: &str| {
        repo.has_object(ObjectType::File, c, gio::Cancellable::NONE)
            .unwrap()
    };
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
