use super::*;
use ostree::gio::prelude::FileExt;

/// An archive repo in a transaction, with a base commit of `usr/share/{a,b}`,
/// `usr/etc/keep.conf` and the symlink `usr/link` → `/etc`.
fn base() -> (tempfile::TempDir, ostree::Repo, String) {
    base_with(&[])
}

/// [`base`] with more files, e.g. a policy under `usr/etc/selinux`.
fn base_with(files: &[(&str, &str)]) -> (tempfile::TempDir, ostree::Repo, String) {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    for (path, content) in files {
        let path = tree.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    std::fs::create_dir_all(tree.join("usr/share")).unwrap();
    std::fs::create_dir_all(tree.join("usr/etc")).unwrap();
    std::fs::write(tree.join("usr/share/a"), "a\n").unwrap();
    std::fs::write(tree.join("usr/share/b"), "b\n").unwrap();
    std::fs::write(tree.join("usr/etc/keep.conf"), "keep\n").unwrap();
    std::os::unix::fs::symlink("/etc", tree.join("usr/link")).unwrap();
    let repo = ostree::Repo::new_for_path(dir.path().join("repo"));
    repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE)
        .unwrap();
    repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
    let commit = crate::sysroot::commit_files::commit_dir(&repo, &tree);
    (dir, repo, commit)
}

fn layer(entries: &[(&str, EntryType, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, kind, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, path, *data).unwrap();
    }
    tar.into_inner().unwrap()
}

fn apply_layers(repo: &ostree::Repo, base: &str, layers: &[Vec<u8>]) -> Result<String> {
    let mut all = DerivedLayer::default();
    for data in layers {
        let mut one = DerivedLayer::default();
        one.import_tar(repo, data.as_slice())?;
        all.absorb(one);
    }
    let root = apply(repo, base, &all)?;
    let commit = repo.write_commit(None, None, None, None, &root, gio::Cancellable::NONE)?;
    Ok(commit.to_string())
}

fn exists(repo: &ostree::Repo, commit: &str, path: &str) -> bool {
    let (root, _) = repo.read_commit(commit, gio::Cancellable::NONE).unwrap();
    root.resolve_relative_path(path)
        .query_exists(gio::Cancellable::NONE)
}

/// The `security.selinux` label of `path` in `commit`, if any.
fn label(repo: &ostree::Repo, commit: &str, path: &str) -> Option<String> {
    let (root, _) = repo.read_commit(commit, gio::Cancellable::NONE).unwrap();
    let file = root.resolve_relative_path(path);
    let file = ostree::glib::object::Cast::downcast::<ostree::RepoFile>(file).unwrap();
    file.ensure_resolved().unwrap();
    let xattrs = if file.tree_get_contents_checksum().is_some() {
        repo.load_variant(
            ObjectType::DirMeta,
            &file.tree_get_metadata_checksum().unwrap(),
        )
        .unwrap()
        .child_value(3)
    } else {
        repo.load_file(&file.checksum(), gio::Cancellable::NONE)
            .unwrap()
            .2
    };
    xattrs
        .iter()
        .filter_map(|x| x.get::<(Vec<u8>, Vec<u8>)>())
        .find(|(name, _)| name == b"security.selinux\0")
        .map(|(_, v)| String::from_utf8(v).unwrap())
}

#[test]
fn derived_files_are_labeled_from_the_base_policy() {
    // A minimal policy libostree reads: the config, file contexts, and a policy file
    // (only checksummed).
    let contexts = "/\tsystem_u:object_r:root_t:s0\n\
                    /usr(/.*)?\tsystem_u:object_r:usr_t:s0\n\
                    /usr/share/derived(/.*)?\tsystem_u:object_r:derived_t:s0\n";
    let (_dir, repo, base) = base_with(&[
        (
            "usr/etc/selinux/config",
            "SELINUX=enforcing\nSELINUXTYPE=test\n",
        ),
        (
            "usr/etc/selinux/test/contexts/files/file_contexts",
            contexts,
        ),
        ("usr/etc/selinux/test/policy/policy.33", "policy\n"),
    ]);
    let dir = EntryType::Directory;
    let file = EntryType::Regular;
    let commit = apply_layers(
        &repo,
        &base,
        &[layer(&[
            ("usr/share/derived/", dir, b""),
            ("usr/share/derived/added", file, b"added\n"),
            ("usr/share/deep/er/file", file, b"deep\n"),
            ("etc/derived.conf", file, b"conf\n"),
        ])],
    )
    .unwrap();
    let label = |path| label(&repo, &commit, path);
    assert_eq!(
        label("usr/share/derived/added").as_deref(),
        Some("system_u:object_r:derived_t:s0\0")
    );
    assert_eq!(
        label("usr/share/derived").as_deref(),
        Some("system_u:object_r:derived_t:s0\0")
    );
    // Implied directories and files elsewhere, /usr/etc included, by their own paths.
    for path in [
        "usr/share/deep",
        "usr/share/deep/er/file",
        "usr/etc/derived.conf",
    ] {
        assert_eq!(
            label(path).as_deref(),
            Some("system_u:object_r:usr_t:s0\0"),
            "{path}"
        );
    }
    // The base's own files keep what their commit has.
    assert_eq!(label("usr/share/a"), None);

    // Without a policy in the base, nothing is labeled.
    let (_dir, repo, unlabeled) = super::tests::base();
    let commit = apply_layers(
        &repo,
        &unlabeled,
        &[layer(&[("usr/share/derived/added", file, b"added\n")])],
    )
    .unwrap();
    assert_eq!(
        super::tests::label(&repo, &commit, "usr/share/derived/added"),
        None
    );
}

#[test]
fn whiteouts_hide_only_lower_layers_and_etc_goes_to_usr_etc() {
    let (_dir, repo, base) = base();
    let dir = EntryType::Directory;
    let file = EntryType::Regular;
    let first = layer(&[
        ("usr/share/", dir, b""),
        ("usr/share/c", file, b"c\n"),
        ("usr/share/.wh.a", file, b""),
        ("etc/", dir, b""),
        ("etc/new.conf", file, b"new\n"),
        ("opt/dropped", file, b"x\n"),
    ]);
    // An opaque directory hides the lower layers' b and c, not its own layer's d.
    let second = layer(&[
        ("usr/share/d", file, b"d\n"),
        ("usr/share/.wh..wh..opq", file, b""),
    ]);
    let commit = apply_layers(&repo, &base, std::slice::from_ref(&first)).unwrap();
    assert!(!exists(&repo, &commit, "usr/share/a"));
    assert!(exists(&repo, &commit, "usr/share/b"));
    assert!(exists(&repo, &commit, "usr/share/c"));
    assert!(exists(&repo, &commit, "usr/etc/new.conf"));
    assert!(exists(&repo, &commit, "usr/etc/keep.conf"));
    assert!(!exists(&repo, &commit, "opt"));
    let layers = [first, second];
    let commit = apply_layers(&repo, &base, &layers).unwrap();
    assert!(exists(&repo, &commit, "usr/share/d"));
    assert!(!exists(&repo, &commit, "usr/share/b"));
    assert!(!exists(&repo, &commit, "usr/share/c"));
    // The same layers on the same commit give the same commit.
    assert_eq!(apply_layers(&repo, &base, &layers).unwrap(), commit);
}

#[test]
fn a_layer_cannot_write_through_a_symlink_of_the_image() {
    let (_dir, repo, base) = base();
    let data = layer(&[("usr/link/shadow", EntryType::Regular, b"x\n")]);
    let err = format!("{:#}", apply_layers(&repo, &base, &[data]).unwrap_err());
    assert!(err.contains("is not a directory in the image"), "{err}");
}

#[test]
fn layer_paths_map_as_ostree_rs_ext_maps_them() {
    assert_eq!(map_path("usr/bin/x").as_deref(), Some("usr/bin/x"));
    assert_eq!(map_path("etc/x.conf").as_deref(), Some("usr/etc/x.conf"));
    assert_eq!(map_path("etc").as_deref(), Some("usr/etc"));
    assert_eq!(
        map_path("var/lib/x").as_deref(),
        Some("usr/share/factory/var/lib/x")
    );
    assert_eq!(map_path("tmp").as_deref(), Some("tmp"));
    assert_eq!(map_path("tmp/x"), None);
    assert_eq!(map_path("opt/x"), None);
    assert_eq!(map_path("").as_deref(), Some(""));
}
