use anyhow::Result;
use pivot_testkit::{commit_tree, Entry, Tree};
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn parse_include_escape_and_write_round_trip() -> Result<()> {
    let inc = tempfile::tempdir()?;
    fs::write(
        inc.path().join("base.tree"),
        "# base\nfile etc/old 0600 gone\nfile etc/keep 0640 a\\tb\\\\c\\n\n",
    )?;
    let text = "include base.tree   # comment\n\
                \n\
                dir usr/lib/modules 0700\n\
                file usr/bin/x 0755 #!/bin/sh\\necho  hi # not a comment\\n\n\
                symlink usr/bin/y x   # comment\n\
                remove etc/old\n";
    let tree = Tree::parse(text, inc.path())?;
    assert_eq!(tree.get("etc/old"), None);
    assert_eq!(tree.file_text("etc/keep"), Some("a\tb\\c\n"));
    assert_eq!(
        tree.file_text("usr/bin/x"),
        Some("#!/bin/sh\necho  hi # not a comment\n")
    );
    assert_eq!(tree.get("usr"), Some(&Entry::Dir { mode: 0o755 }));
    assert_eq!(
        tree.get("usr/lib/modules"),
        Some(&Entry::Dir { mode: 0o700 })
    );

    let out = tempfile::tempdir()?;
    tree.write_to(out.path())?;
    let mode = |p: &str| -> Result<u32> {
        Ok(fs::symlink_metadata(out.path().join(p))?
            .permissions()
            .mode()
            & 0o7777)
    };
    assert_eq!(
        fs::read_to_string(out.path().join("etc/keep"))?,
        "a\tb\\c\n"
    );
    assert_eq!(mode("etc/keep")?, 0o640);
    assert_eq!(mode("usr/bin/x")?, 0o755);
    assert_eq!(mode("usr/lib/modules")?, 0o700);
    assert_eq!(
        fs::read_link(out.path().join("usr/bin/y"))?.to_str(),
        Some("x")
    );
    assert!(!out.path().join("etc/old").exists());
    Ok(())
}

#[test]
fn later_lines_replace_and_builders_work() -> Result<()> {
    let tree = Tree::parse(
        "file a 0644 one\nfile a 0600 two\n",
        std::path::Path::new("."),
    )?
    .with_file("b/c", 0o644, "x")
    .without("b");
    assert_eq!(tree.file_text("a"), Some("two"));
    assert_eq!(tree.get("b"), None);
    assert_eq!(tree.get("b/c"), None);
    Ok(())
}

#[test]
fn errors_name_the_line() {
    let dir = std::path::Path::new(".");
    let err = format!(
        "{:#}",
        Tree::parse("\nfile a 0644 bad\\q\n", dir).unwrap_err()
    );
    assert!(err.contains(":2:"), "{err}");
    let err = format!("{:#}", Tree::parse("frob a\n", dir).unwrap_err());
    assert!(err.contains("unknown keyword"), "{err}");
    let err = format!("{:#}", Tree::parse("dir a 999\n", dir).unwrap_err());
    assert!(err.contains("octal"), "{err}");
    let err = format!("{:#}", Tree::parse("dir ../a 0755\n", dir).unwrap_err());
    assert!(err.contains(".."), "{err}");
}

#[test]
fn include_cycle_fails() -> Result<()> {
    let dir = tempfile::tempdir()?;
    fs::write(dir.path().join("a.tree"), "include b.tree\n")?;
    fs::write(dir.path().join("b.tree"), "include a.tree\n")?;
    let err = format!(
        "{:#}",
        Tree::parse("include a.tree\n", dir.path()).unwrap_err()
    );
    assert!(err.contains("cycle"), "{err}");
    Ok(())
}

#[test]
fn fixtures_describe_two_versions() -> Result<()> {
    let v1 = Tree::fixture("os-v1")?;
    let v2 = Tree::fixture("os-v2")?;
    assert!(v1
        .file_text("usr/lib/os-release")
        .unwrap()
        .contains("VERSION=\"1\""));
    assert!(v2
        .file_text("usr/lib/os-release")
        .unwrap()
        .contains("PRETTY_NAME=\"Pivot Test OS 2\""));
    assert!(v1.get("usr/share/pivot/v2-marker").is_none());
    assert!(v2.get("usr/share/pivot/v2-marker").is_some());
    assert_ne!(
        v1.file_text("usr/etc/pivot-test.conf"),
        v2.file_text("usr/etc/pivot-test.conf")
    );
    for t in [&v1, &v2] {
        assert!(t.get("usr/lib/modules/6.1.0-pivot/vmlinuz").is_some());
        assert!(t
            .file_text("usr/bin/true-ish")
            .unwrap()
            .starts_with("#!/bin/sh\n"));
    }
    Ok(())
}

#[test]
fn commit_tree_is_deterministic_and_carries_version() -> Result<()> {
    let tree = Tree::fixture("os-v1")?;
    let mut commits = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir()?;
        let repo = ostree::Repo::new_for_path(dir.path());
        repo.create(ostree::RepoMode::Archive, ostree::gio::Cancellable::NONE)?;
        let c = commit_tree(&repo, &tree, Some("os/test"), "1")?;
        assert_eq!(repo.require_rev("os/test")?.as_str(), c);
        let (commit, _) = repo.load_commit(&c)?;
        let meta = ostree::glib::VariantDict::new(Some(&commit.child_value(0)));
        assert_eq!(meta.lookup::<String>("version")?.as_deref(), Some("1"));
        commits.push(c);
    }
    assert_eq!(commits[0], commits[1]);

    let dir = tempfile::tempdir()?;
    let repo = ostree::Repo::new_for_path(dir.path());
    repo.create(ostree::RepoMode::Archive, ostree::gio::Cancellable::NONE)?;
    assert_ne!(commit_tree(&repo, &tree, None, "2")?, commits[0]);
    Ok(())
}
