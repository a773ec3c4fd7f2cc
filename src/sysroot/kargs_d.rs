//! Kernel arguments an image ships, in bootc's format: `/usr/lib/bootc/kargs.d/*.toml`, each
//! `kargs = ["arg", ...]` with an optional `match-architectures = ["x86_64", ...]` (Rust's
//! architecture names; a file naming others does not apply here), read in file-name order.
//! Files not ending in `.toml` are skipped, as bootc does.
//!
//! On a deployment they apply as bootc applies them on an update: the arguments the merge
//! deployment's image listed and the new image no longer lists are removed, those the new image
//! lists and the old one did not are added, and everything else on the merge deployment's
//! command line (the installer's, the admin's) stays. The admin's own edits
//! (`/etc/pivot/kernel-args`, `--karg-*`, [`crate::sysroot::kargs`]) are applied after, so they
//! win.
//!
//! Decided here: an entry holding several space-separated arguments is taken as those
//! arguments; comparison is by whole token. A new image whose kargs.d cannot be read (not TOML,
//! unknown keys, a quote or control byte in an argument, not a regular file) is refused: its
//! command line would be a guess. The merge deployment's kargs.d is only read for what to
//! remove: when it cannot be read, a warning says so and nothing is removed.

use anyhow::{ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::*;
use serde::Deserialize;

use crate::sysroot::commit_files;
use crate::sysroot::kargs::check_arg;

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

/// The arguments of one kargs.d file's text that apply on `arch`.
pub fn parse(text: &str, arch: &str) -> Result<Vec<String>> {
    let file: File = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    if let Some(arches) = &file.match_architectures {
        if !arches.iter().any(|a| a == arch) {
            return Ok(Vec::new());
        }
    }
    let mut args = Vec::new();
    for entry in &file.kargs {
        ensure!(!entry.trim().is_empty(), "an empty kernel argument");
        for arg in entry.split_whitespace() {
            args.push(check_arg(arg)?);
        }
    }
    Ok(args)
}

/// The kernel arguments `commit`'s kargs.d lists for this machine's architecture, in order.
pub fn read(repo: &ostree::Repo, commit: &str) -> Result<Vec<ImageKarg>> {
    let root = commit_files::root(repo, commit)?;
    let dir = root.resolve_relative_path(KARGS_D);
    let Some(entries) = commit_files::children(&dir)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, kind) in entries {
        if !name.ends_with(".toml") {
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
        let args = parse(&text, std::env::consts::ARCH).with_context(|| path.clone())?;
        out.extend(args.into_iter().map(|arg| ImageKarg {
            arg,
            file: name.clone(),
        }));
    }
    Ok(out)
}

/// The command line `current` after moving from an image that shipped `old` to one that ships
/// `new`: `old`'s arguments `new` lacks removed (every copy), `new`'s that `old` lacked added once.
pub fn update(current: &str, old: &[ImageKarg], new: &[ImageKarg]) -> Vec<String> {
    let lists = |list: &[ImageKarg], arg: &str| list.iter().any(|k| k.arg == arg);
    let mut args: Vec<String> = current
        .split_whitespace()
        .filter(|a| lists(new, a) || !lists(old, a))
        .map(str::to_string)
        .collect();
    for karg in new {
        if !lists(old, &karg.arg) && !args.contains(&karg.arg) {
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

    #[test]
    fn files_list_arguments_for_their_architectures() {
        let text = "kargs = [\"console=ttyS0,115200n8\", \"nosmt quiet\"]\n";
        assert_eq!(
            parse(text, "x86_64").unwrap(),
            ["console=ttyS0,115200n8", "nosmt", "quiet"]
        );
        let arm = "kargs = [\"a\"]\nmatch-architectures = [\"aarch64\", \"s390x\"]\n";
        assert!(parse(arm, "x86_64").unwrap().is_empty());
        assert_eq!(parse(arm, "aarch64").unwrap(), ["a"]);
    }

    #[test]
    fn malformed_files_are_errors_naming_the_problem() {
        let cases = [
            ("kargs = \"a\"\n", "invalid type"),
            ("kargs = [\"a\"]\narch = [\"x86_64\"]\n", "unknown field `arch`"),
            ("args = [\"a\"]\n", "unknown field"),
            ("kargs = [\"a=\\\"b c\\\"\"]\n", "quote"),
            ("kargs = [\"ostree=/x\"]\n", "libostree"),
            ("kargs = [\" \"]\n", "empty"),
            ("kargs = [\"a\"\n", "expected"),
        ];
        for (text, why) in cases {
            let err = format!("{:#}", parse(text, "x86_64").unwrap_err());
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn an_update_swaps_the_images_arguments_and_keeps_the_rest() {
        let old = kargs("10-a.toml", &["quiet", "console=ttyS0", "old.only"]);
        let new = kargs("10-a.toml", &["quiet", "console=ttyS1", "new.only"]);
        let current = "root=UUID=1 quiet console=ttyS0 nosmt old.only ostree=/ostree/boot.1/x";
        assert_eq!(
            update(current, &old, &new).join(" "),
            "root=UUID=1 quiet nosmt ostree=/ostree/boot.1/x console=ttyS1 new.only"
        );
    }

    #[test]
    fn an_argument_already_there_is_not_added_twice_and_unchanged_lists_change_nothing() {
        let new = kargs("10-a.toml", &["nosmt"]);
        assert_eq!(update("nosmt a", &[], &new), ["nosmt", "a"]);
        assert_eq!(update("b nosmt", &new, &new), ["b", "nosmt"]);
    }
}
