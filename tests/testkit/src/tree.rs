//! Small OS trees described in a line-based text format (see fixtures/README.md).

use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// Nesting bound for `include`, so a cycle fails instead of recursing forever.
const MAX_INCLUDE_DEPTH: usize = 16;

/// One filesystem entry of a [`Tree`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Dir { mode: u32 },
    File { mode: u32, content: Vec<u8> },
    Symlink { target: String },
}

/// A small directory tree keyed by relative path ("usr/lib/os-release").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    entries: BTreeMap<String, Entry>,
    /// rpm-ostree's `rpmostree.rpmdb.pkglist` for the commit's metadata: (name, epoch, version,
    /// release, arch) per package; none when empty.
    pub rpm_pkglist: Vec<(String, String, String, String, String)>,
}

/// `<workspace>/fixtures`, located from this crate's manifest dir.
pub fn fixtures_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .unwrap_or(manifest)
        .join("fixtures")
}

impl Tree {
    /// Parses tree text; `include` lines resolve against `include_dir`.
    pub fn parse(text: &str, include_dir: &Path) -> Result<Tree> {
        let mut tree = Tree::default();
        tree.parse_into(text, "<text>", include_dir, 0)?;
        Ok(tree)
    }

    /// Loads `fixtures/<name>.tree`.
    pub fn fixture(name: &str) -> Result<Tree> {
        let path = fixtures_dir().join(format!("{name}.tree"));
        let mut tree = Tree::default();
        tree.parse_file(&path, 0)?;
        Ok(tree)
    }

    pub fn with_file(mut self, path: &str, mode: u32, content: &str) -> Tree {
        let content = content.as_bytes().to_vec();
        self.insert(&clean_path(path), Entry::File { mode, content });
        self
    }

    /// The tree with `list` as its commit's rpm-ostree package list (`name epoch version
    /// release arch` per entry).
    pub fn with_rpm_pkglist(mut self, list: &[&str]) -> Tree {
        self.rpm_pkglist = list
            .iter()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                assert_eq!(f.len(), 5, "{line:?}: name epoch version release arch");
                (
                    f[0].into(),
                    f[1].into(),
                    f[2].into(),
                    f[3].into(),
                    f[4].into(),
                )
            })
            .collect();
        self
    }

    pub fn with_dir(mut self, path: &str, mode: u32) -> Tree {
        self.insert(&clean_path(path), Entry::Dir { mode });
        self
    }

    pub fn with_symlink(mut self, path: &str, target: &str) -> Tree {
        let target = target.to_string();
        self.insert(&clean_path(path), Entry::Symlink { target });
        self
    }

    /// Drops `path` and everything below it.
    pub fn without(mut self, path: &str) -> Tree {
        self.remove(&clean_path(path));
        self
    }

    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(&clean_path(path))
    }

    /// Text content of a regular file, if `path` is one and is UTF-8.
    pub fn file_text(&self, path: &str) -> Option<&str> {
        match self.get(path)? {
            Entry::File { content, .. } => std::str::from_utf8(content).ok(),
            _ => None,
        }
    }

    /// All entries, parents before children.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    /// Materializes the tree under `dir` (created if missing) with exact modes.
    pub fn write_to(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (rel, entry) in &self.entries {
            let path = dir.join(rel);
            match entry {
                Entry::Dir { .. } => fs::create_dir_all(&path)
                    .with_context(|| format!("creating dir {}", path.display()))?,
                Entry::File { mode, content } => {
                    fs::write(&path, content)
                        .with_context(|| format!("writing {}", path.display()))?;
                    set_mode(&path, *mode)?;
                }
                Entry::Symlink { target } => {
                    if path.symlink_metadata().is_ok() {
                        fs::remove_file(&path)
                            .with_context(|| format!("replacing {}", path.display()))?;
                    }
                    symlink(target, &path)
                        .with_context(|| format!("symlinking {}", path.display()))?;
                }
            }
        }
        // Dir modes last and deepest first, so a read-only dir cannot block its children.
        for (rel, entry) in self.entries.iter().rev() {
            if let Entry::Dir { mode } = entry {
                set_mode(&dir.join(rel), *mode)?;
            }
        }
        Ok(())
    }

    fn parse_file(&mut self, path: &Path, depth: usize) -> Result<()> {
        ensure!(
            depth <= MAX_INCLUDE_DEPTH,
            "include nesting deeper than {MAX_INCLUDE_DEPTH} at {} (cycle?)",
            path.display()
        );
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        self.parse_into(&text, &path.display().to_string(), dir, depth)
    }

    fn parse_into(&mut self, text: &str, origin: &str, dir: &Path, depth: usize) -> Result<()> {
        for (i, raw) in text.lines().enumerate() {
            self.parse_line(raw.trim_end_matches('\r'), dir, depth)
                .with_context(|| format!("{origin}:{}: {raw:?}", i + 1))?;
        }
        Ok(())
    }

    fn parse_line(&mut self, line: &str, dir: &Path, depth: usize) -> Result<()> {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            return Ok(());
        }
        let (keyword, rest) = split_word(line);
        if keyword == "file" {
            // File content is the verbatim rest of the line, so `#!/bin/sh` survives.
            let (path, rest) = split_word(rest);
            let (mode, content) = split_word(rest);
            ensure!(!path.is_empty(), "file needs a path");
            let mode = parse_mode(mode)?;
            let content = unescape(content)?.into_bytes();
            self.insert(&checked_path(path)?, Entry::File { mode, content });
            return Ok(());
        }
        let args = strip_comment(rest);
        match (keyword, args.as_slice()) {
            ("include", [file]) => self.parse_file(&dir.join(file), depth + 1)?,
            ("dir", [path, mode]) => {
                let mode = parse_mode(mode)?;
                self.insert(&checked_path(path)?, Entry::Dir { mode });
            }
            ("symlink", [path, target]) => {
                let target = unescape(target)?;
                self.insert(&checked_path(path)?, Entry::Symlink { target });
            }
            ("remove", [path]) => self.remove(&checked_path(path)?),
            ("include" | "dir" | "symlink" | "remove", _) => {
                bail!("wrong number of arguments for {keyword}")
            }
            _ => bail!("unknown keyword {keyword:?}"),
        }
        Ok(())
    }

    /// Later entries win: replacing a path drops its old subtree, and missing
    /// (or non-dir) parents become 0755 dirs.
    fn insert(&mut self, path: &str, entry: Entry) {
        for (slash, _) in path.match_indices('/') {
            let parent = &path[..slash];
            if !matches!(self.entries.get(parent), Some(Entry::Dir { .. })) {
                self.remove(parent);
                self.entries
                    .insert(parent.to_string(), Entry::Dir { mode: 0o755 });
            }
        }
        // Re-declaring a dir keeps its children; anything else replaces the subtree.
        if !matches!(
            (&entry, self.entries.get(path)),
            (Entry::Dir { .. }, Some(Entry::Dir { .. }))
        ) {
            self.remove(path);
        }
        self.entries.insert(path.to_string(), entry);
    }

    fn remove(&mut self, path: &str) {
        let prefix = format!("{path}/");
        self.entries
            .retain(|p, _| p != path && !p.starts_with(&prefix));
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// Splits off the first whitespace-separated word; the rest keeps inner spacing.
fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], s[i..].trim_start_matches([' ', '\t'])),
        None => (s, ""),
    }
}

/// Words of a non-file line, stopping at an inline `#` comment.
fn strip_comment(s: &str) -> Vec<&str> {
    s.split_whitespace()
        .take_while(|w| !w.starts_with('#'))
        .collect()
}

fn parse_mode(s: &str) -> Result<u32> {
    let mode = u32::from_str_radix(s, 8).with_context(|| format!("bad octal mode {s:?}"))?;
    ensure!(mode <= 0o7777, "mode {s} out of range");
    Ok(mode)
}

fn unescape(s: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            other => bail!(
                "unknown escape \\{}",
                other.map(String::from).unwrap_or_default()
            ),
        }
    }
    Ok(out)
}

/// Normalizes a path for the builder API, which has no error channel.
fn clean_path(path: &str) -> String {
    checked_path(path).unwrap_or_else(|e| panic!("bad tree path {path:?}: {e:#}"))
}

fn checked_path(path: &str) -> Result<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    ensure!(!parts.is_empty(), "empty path");
    ensure!(
        parts.iter().all(|p| *p != "." && *p != ".."),
        "path {path:?} must not contain . or .."
    );
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_word_keeps_content_spacing() {
        assert_eq!(split_word("a  b  c "), ("a", "b  c "));
        assert_eq!(split_word("a"), ("a", ""));
    }

    #[test]
    fn replacing_a_dir_with_a_file_drops_children() {
        let t = Tree::default()
            .with_file("a/b/c", 0o644, "x")
            .with_file("a/b", 0o600, "y");
        assert_eq!(t.get("a/b/c"), None);
        assert_eq!(t.file_text("a/b"), Some("y"));
        assert_eq!(t.get("a"), Some(&Entry::Dir { mode: 0o755 }));
    }
}
