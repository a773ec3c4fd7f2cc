//! Kernel arguments an image ships, in bootc's format: `/usr/lib/bootc/kargs.d/*.toml`, each
//! `kargs = ["arg", ...]` with an optional `match-architectures = ["x86_64", ...]` (Rust's
//! architecture names; a file naming others does not apply here). pivot does what bootc does,
//! as read in bootc 534c76e `crates/lib/src/bootc_kargs.rs` and the `linux_kernel_cmdline`
//! 0.1.1 crate it parses command lines with:
//!
//! - Files: those whose name has the extension `toml` (`Config::filename_matches`: Rust's
//!   `Path::extension`, so a file named just `.toml` has none and is skipped, `a.b.toml` is
//!   read), in name order; unknown keys are errors (`parse_kargs_toml`).
//! - Entries: a file's entries are split as the kernel splits its command line
//!   ([`crate::sysroot::kargs::split`]: at whitespace outside double quotes), so
//!   `"dyndbg=\"file x +p\""` is one argument and `"a b"` two; an empty entry is none.
//! - One list per image: an argument another file (or the same one) already listed is not
//!   listed again, by bootc's equality ([`crate::sysroot::kargs::same`]: `-` and `_` alike in
//!   keys, quotes aside) (`get_kargs_in_root`, `Cmdline::add`).
//! - An update (`get_kargs`, `compute_apply_kargs_diff`) starts from the merge deployment's
//!   command line. When the new image has a kargs.d directory, even an empty one, every copy of
//!   an argument the merge deployment's image listed and the new one does not is removed, and
//!   each the new one lists and the old one did not is appended unless an equal one is there.
//!   An argument both list is left as it is (where an admin removed it, it stays removed).
//!   When the new image has no kargs.d directory, nothing is removed and the old image's
//!   arguments are appended where missing. The admin's own edits (`/etc/pivot/kernel-args`,
//!   `--karg-*`, [`crate::sysroot::kargs`]) come after, so they win.
//!
//! Decided here, where bootc would go on or fail elsewhere: a new image whose kargs.d cannot be
//! read is refused, with one line naming the file and the whole entry: not TOML, unknown keys,
//! a control character or an unmatched double quote in an entry (the kernel would take the
//! rest of the command line into that argument), `ostree=` (libostree's), a file or kargs.d
//! itself that is not a regular file or directory (a symlink, which bootc does not read
//! either). The merge deployment's kargs.d is only read for what to remove: when it cannot be
//! read (an image another tool deployed), a warning says so and nothing is removed, where
//! bootc would refuse the update.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::*;
use serde::Deserialize;

use crate::sysroot::commit_files;
use crate::sysroot::kargs::{is_libostrees, same, split};

/// Where an image keeps its kernel arguments, relative to its root.
pub const KARGS_D: &str = "usr/lib/bootc/kargs.d";
/// A kargs.d file is a few lines; more than this is not one.
const FILE_LIMIT: u64 = 64 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct File {
    kargs: Vec<String>,
    match_architectures: Option<Vec<String>>,
}

/// One argument an image ships, and the kargs.d file that lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageKarg {
    pub arg: String,
    /// The file's name, e.g. `10-console.toml`.
    pub file: String,
}

/// Whether bootc reads a kargs.d file of this name: its extension is `toml`.
fn is_read(name: &str) -> bool {
    Path::new(name).extension().is_some_and(|ext| ext == "toml")
}

/// The arguments of one kargs.d file's text that apply on `arch`, in order.
pub fn parse(text: &str, arch: &str) -> Result<Vec<String>> {
    let file: File = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    if let Some(arches) = &file.match_architectures {
        if !arches.iter().any(|a| a == arch) {
            return Ok(Vec::new());
        }
    }
    let mut args = Vec::new();
    for entry in &file.kargs {
        ensure!(
            !entry.chars().any(char::is_control),
            "kernel argument {entry:?} holds a control character"
        );
        ensure!(
            entry.matches('"').count() % 2 == 0,
            "kernel argument `{entry}` has an unmatched double quote"
        );
        for arg in split(entry) {
            ensure!(
                !is_libostrees(arg),
                "kernel argument `{arg}`: the ostree= argument is libostree's to set"
            );
            args.push(arg.to_string());
        }
    }
    Ok(args)
}

/// The kernel arguments `commit`'s kargs.d lists for this machine's architecture, in order,
/// each once; `None` if the commit has no kargs.d directory.
pub fn read(repo: &ostree::Repo, commit: &str) -> Result<Option<Vec<ImageKarg>>> {
    let root = commit_files::root(repo, commit)?;
    let dir = root.resolve_relative_path(KARGS_D);
    match commit_files::file_type(&dir)? {
        None => return Ok(None),
        Some(gio::FileType::Directory) => {}
        Some(_) => bail!("/{KARGS_D}: not a directory"),
    }
    let entries = commit_files::children(&dir)?.unwrap_or_default();
    let mut out: Vec<ImageKarg> = Vec::new();
    for (name, kind) in entries {
        if !is_read(&name) {
            continue;
        }
        let path = format!("/{KARGS_D}/{name}");
        ensure!(
            kind == gio::FileType::Regular,
            "{path}: not a regular file"
        );
        let bytes = commit_files::read(repo, &root, &format!("{KARGS_D}/{name}"), FILE_LIMIT)?
            .with_context(|| format!("{path}: not a regular file"))?;
        let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{path}: not UTF-8"))?;
        for arg in parse(&text, std::env::consts::ARCH).with_context(|| path.clone())? {
            if !out.iter().any(|k| same(&k.arg, &arg)) {
                out.push(ImageKarg {
                    arg,
                    file: name.clone(),
                });
            }
        }
    }
    Ok(Some(out))
}

/// The command line `current` after moving from an image that shipped `old` to one that ships
/// `new` (`None`: no kargs.d directory), as bootc computes it (see the module doc).
pub fn update(current: &str, old: &[ImageKarg], new: Option<&[ImageKarg]>) -> Vec<String> {
    let lists = |list: &[ImageKarg], arg: &str| list.iter().any(|k| same(&k.arg, arg));
    let mut args: Vec<String> = split(current).into_iter().map(str::to_string).collect();
    let added: Vec<&ImageKarg> = match new {
        None => old.iter().collect(),
        Some(new) => {
            args.retain(|a| lists(new, a) || !lists(old, a));
            new.iter().filter(|k| !lists(old, &k.arg)).collect()
        }
    };
    for karg in added {
        if !args.iter().any(|a| same(a, &karg.arg)) {
            args.push(karg.arg.clone());
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kargs(file: &str, args: &[&str]) -> Vec<ImageKarg> {
        args.iter()
            .map(|a| ImageKarg {
                arg: a.to_string(),
                file: file.into(),
            })
            .collect()
    }

    /// A commit of a tree holding `files` (path, text) and the empty directories `dirs`.
    fn commit(files: &[(&str, &str)], dirs: &[&str]) -> (tempfile::TempDir, ostree::Repo, String) {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("usr")).unwrap();
        for path in dirs {
            std::fs::create_dir_all(tree.join(path)).unwrap();
        }
        for (path, text) in files {
            let path = tree.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let repo = ostree::Repo::new_for_path(dir.path().join("repo"));
        let none = gio::Cancellable::NONE;
        repo.create(ostree::RepoMode::Archive, none).unwrap();
        repo.prepare_transaction(none).unwrap();
        let commit = commit_files::commit_dir(&repo, &tree);
        repo.commit_transaction(none).unwrap();
        (dir, repo, commit)
    }

    fn args(list: &[ImageKarg]) -> Vec<&str> {
        list.iter().map(|k| k.arg.as_str()).collect()
    }

    /// bootc 534c76e `crates/lib/src/bootc_kargs.rs::tests::test_arch`.
    #[test]
    fn bootc_test_arch() {
        let any = r#"kargs = ["console=tty0", "nosmt"]"#;
        assert_eq!(parse(any, "x86_64").unwrap(), ["console=tty0", "nosmt"]);
        assert_eq!(parse(any, "aarch64").unwrap(), ["console=tty0", "nosmt"]);
        let x86 = "kargs = [\"console=tty0\", \"nosmt\"]\nmatch-architectures = [\"x86_64\"]\n";
        assert!(parse(x86, "aarch64").unwrap().is_empty());
        let arm = "kargs = [\"console=tty0\", \"nosmt\"]\nmatch-architectures = [\"aarch64\"]\n";
        assert_eq!(parse(arm, "aarch64").unwrap(), ["console=tty0", "nosmt"]);
        let both = "kargs = [\"console=tty0\", \"nosmt\"]\n\
                    match-architectures = [\"x86_64\", \"aarch64\"]\n";
        assert_eq!(parse(both, "x86_64").unwrap(), ["console=tty0", "nosmt"]);
        assert_eq!(parse(both, "aarch64").unwrap(), ["console=tty0", "nosmt"]);
        // An empty list matches no architecture (`any` of nothing).
        assert!(parse("kargs = [\"a\"]\nmatch-architectures = []\n", "x86_64")
            .unwrap()
            .is_empty());
    }

    /// bootc 534c76e `crates/lib/src/bootc_kargs.rs::tests::test_invalid`.
    #[test]
    fn bootc_test_invalid() {
        assert!(parse(r#"kargs = ["console=tty0", "nosmt"]\nfoo=bar"#, "x86_64").is_err());
        assert!(parse("foo=bar", "x86_64").is_err());
    }

    /// bootc 534c76e `crates/lib/src/bootc_kargs.rs::tests::test_get_kargs_in_root` and
    /// `test_get_kargs_in_ostree`: no directory, an empty one, a file whose name is not read, then
    /// `01-foo.toml` and `02-bar.toml` in name order. pivot tells "no directory" (`None`) from
    /// "empty" (`Some([])`), which bootc's `get_kargs` tells apart too.
    #[test]
    fn bootc_test_get_kargs_in_root() {
        let (_d, repo, c) = commit(&[], &[]);
        assert_eq!(read(&repo, &c).unwrap(), None);
        let (_d, repo, c) = commit(&[], &[KARGS_D]);
        assert_eq!(read(&repo, &c).unwrap(), Some(Vec::new()));
        let garbage = (&*format!("{KARGS_D}/somegarbage"), "garbage");
        let (_d, repo, c) = commit(&[garbage], &[]);
        assert_eq!(read(&repo, &c).unwrap(), Some(Vec::new()));
        let foo = format!("{KARGS_D}/01-foo.toml");
        let bar = format!("{KARGS_D}/02-bar.toml");
        let (_d, repo, c) = commit(
            &[
                (&bar, r#"kargs = ["console=ttyS1"]"#),
                (&foo, r#"kargs = ["console=tty0", "nosmt"]"#),
                garbage,
            ],
            &[],
        );
        let listed = read(&repo, &c).unwrap().unwrap();
        assert_eq!(args(&listed), ["console=tty0", "nosmt", "console=ttyS1"]);
        assert_eq!(listed[2].file, "02-bar.toml");
    }

    /// bootc's `Config::filename_matches`: the extension (Rust's `Path::extension`) is `toml`.
    #[test]
    fn only_names_whose_extension_is_toml_are_read() {
        for name in ["10-a.toml", "a.b.toml", "..toml"] {
            assert!(is_read(name), "{name}");
        }
        for name in [".toml", "toml", "a.TOML", "a.toml.bak", "README", "a.toml~"] {
            assert!(!is_read(name), "{name}");
        }
        let (_d, repo, c) = commit(
            &[
                (&format!("{KARGS_D}/.toml"), "kargs = [\"hidden\"]"),
                (&format!("{KARGS_D}/10-a.toml"), "kargs = [\"shown\"]"),
            ],
            &[],
        );
        assert_eq!(args(&read(&repo, &c).unwrap().unwrap()), ["shown"]);
    }

    /// bootc joins a file's entries and splits them as the kernel does (`parse_kargs_toml`).
    #[test]
    fn entries_split_as_the_kernel_splits_with_quotes_kept() {
        let text = r#"kargs = ["dyndbg=\"file x +p\"", "nosmt quiet", "", " ", "\"a b\""]"#;
        assert_eq!(
            parse(text, "x86_64").unwrap(),
            ["dyndbg=\"file x +p\"", "nosmt", "quiet", "\"a b\""]
        );
    }

    /// One list per image, each argument once by bootc's equality (`get_kargs_in_root`'s
    /// `Cmdline::extend`, which adds only what is not there), attributed to its first file.
    #[test]
    fn an_image_lists_each_argument_once_from_its_first_file() {
        let (_d, repo, c) = commit(
            &[
                (&format!("{KARGS_D}/10-a.toml"), r#"kargs = ["a-b=1", "x", "x"]"#),
                (&format!("{KARGS_D}/20-b.toml"), r#"kargs = ["a_b=1", "y", "x"]"#),
            ],
            &[],
        );
        let listed = read(&repo, &c).unwrap().unwrap();
        assert_eq!(args(&listed), ["a-b=1", "x", "y"]);
        assert_eq!(listed[2].file, "20-b.toml");
    }

    #[test]
    fn malformed_files_are_errors_naming_the_whole_argument() {
        let cases = [
            ("kargs = \"a\"\n", "invalid type"),
            ("kargs = [\"a\"]\narch = [\"x86_64\"]\n", "unknown field `arch`"),
            ("args = [\"a\"]\n", "unknown field"),
            (
                "kargs = [\"dyndbg=\\\"file x +p\"]\n",
                "kernel argument `dyndbg=\"file x +p` has an unmatched double quote",
            ),
            ("kargs = [\"a\\tb\"]\n", "kernel argument \"a\\tb\" holds a control"),
            ("kargs = [\"x ostree=/x\"]\n", "`ostree=/x`: the ostree= argument"),
            ("kargs = [\"\\\"ostree=/x\\\"\"]\n", "libostree"),
            ("kargs = [\"a\"\n", "expected"),
        ];
        for (text, why) in cases {
            let err = format!("{:#}", parse(text, "x86_64").unwrap_err());
            assert!(err.contains(why), "{text:?}: {err}");
        }
        let (_d, repo, c) = commit(&[(KARGS_D, "kargs = []")], &[]);
        let err = format!("{:#}", read(&repo, &c).unwrap_err());
        assert!(err.contains("kargs.d: not a directory"), "{err}");
    }

    /// bootc's `compute_apply_kargs_diff`: what the old image listed and the new one does not
    /// goes (every copy), what the new one adds comes once, the rest stays.
    #[test]
    fn an_update_swaps_the_images_arguments_and_keeps_the_rest() {
        let old = kargs("10-a.toml", &["quiet", "console=ttyS0", "old.only"]);
        let new = kargs("10-a.toml", &["quiet", "console=ttyS1", "new.only"]);
        let current = "root=UUID=1 quiet console=ttyS0 nosmt old.only ostree=/ostree/boot.1/x";
        assert_eq!(
            update(current, &old, Some(&new)).join(" "),
            "root=UUID=1 quiet nosmt ostree=/ostree/boot.1/x console=ttyS1 new.only"
        );
        // An argument both list and the admin removed stays removed.
        assert_eq!(update("root=1", &old, Some(&new)).join(" "), "root=1 console=ttyS1 new.only");
    }

    /// bootc's `get_kargs`: a new image without kargs.d keeps the command line and adds back the
    /// old image's arguments it lacks (`kargs.extend(&existing_kargs)`); with an empty kargs.d,
    /// every old argument goes.
    #[test]
    fn bootc_get_kargs_without_kargs_d_keeps_and_with_an_empty_one_removes() {
        let old = kargs("10-a.toml", &["quiet", "console=ttyS0"]);
        assert_eq!(update("root=1 quiet nosmt", &old, None), ["root=1", "quiet", "nosmt", "console=ttyS0"]);
        assert_eq!(update("root=1 quiet nosmt", &old, Some(&[])), ["root=1", "nosmt"]);
        assert_eq!(update("root=1", &[], None), ["root=1"]);
    }

    /// `linux_kernel_cmdline` 0.1.1 `src/bytes.rs::tests::test_add` and `test_remove_exact`, the
    /// `Cmdline::add` and `remove_exact` bootc applies its diff with: an equal argument is not
    /// added again, one with the same key and another value is; removal takes every equal copy
    /// and nothing else.
    #[test]
    fn bootc_kernel_cmdline_test_add_and_test_remove_exact() {
        let new = kargs("10-a.toml", &["console=ttyS2", "console=ttyS1", "quiet"]);
        assert_eq!(
            update("console=tty0 console=ttyS1", &[], Some(&new)).join(" "),
            "console=tty0 console=ttyS1 console=ttyS2 quiet"
        );
        let old = kargs("10-a.toml", &["foo=bar"]);
        assert_eq!(
            update("foo foo=bar foo=baz foo=\"bar\"", &old, Some(&[])),
            ["foo", "foo=baz"]
        );
        // bootc's equality: `a_b=1` is there as `a-b=1`, a quoted value as its bare one.
        let new = kargs("10-a.toml", &["a_b=1", "dyndbg=\"file x +p\""]);
        assert_eq!(
            update("a-b=1 dyndbg=\"file x +p\"", &[], Some(&new)),
            ["a-b=1", "dyndbg=\"file x +p\""]
        );
    }
}
