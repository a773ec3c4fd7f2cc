//! Checking every tar member of every layer before anything is done with it. pivot unpacks
//! nothing to disk, but a layer that could only mean harm on a system that did is refused all the
//! same, naming the member: `..` components, absolute paths, links inside the OSTree repo or
//! leading out of the image, members written through a symlink, device nodes, fifos and setuid or
//! setgid files. Everything else outside `srv/repo/` is ignored.

use std::collections::BTreeSet;

use anyhow::{bail, Result};
use tar::EntryType;

use super::REPO_DIR;

/// What a member that passed the checks is to the importer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Member {
    /// Outside `srv/repo/`, or a directory: nothing to import.
    Ignored,
    /// A regular file at `srv/repo/<rel>`.
    RepoFile(String),
}

/// The checks, with what earlier members made symlinks. Layers are checked each on their own
/// (they are imported in parallel); [`MemberCheck::absorb`] then replays a later layer's members
/// outside the repository against the symlinks of the layers before it.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct MemberCheck {
    symlinks: BTreeSet<String>,
    /// This layer's members outside the repository, in order: (path, made a symlink).
    outside: Vec<(String, bool)>,
}

/// Members outside `srv/repo/` one layer may have: an oscontainer carries its OS inside the
/// repository, and this bounds what the replay of [`MemberCheck::absorb`] holds in memory.
pub(super) const MAX_OUTSIDE_MEMBERS: usize = 200_000;

impl MemberCheck {
    /// Paths it holds: symlinks and members outside the repository.
    pub fn paths(&self) -> usize {
        self.symlinks.len() + self.outside.len()
    }

    /// Checks one member: `name` and `link` are its raw path and link target (after long-name
    /// and pax extensions), `mode` the permission bits of its header.
    pub fn check(
        &mut self,
        name: &[u8],
        kind: EntryType,
        mode: u32,
        link: Option<&[u8]>,
    ) -> Result<Member> {
        let shown = String::from_utf8_lossy(name);
        let path = clean(&shown).map_err(|why| anyhow::anyhow!("tar member {shown:?} {why}"))?;
        if path.is_empty() {
            return Ok(Member::Ignored); // "./": the layer's root.
        }
        if let Some(link) = self.through_symlink(&path) {
            bail!("tar member {shown:?} is written through the symlink {link:?}");
        }
        let in_repo = is_in_repo(&path);
        if !in_repo {
            if self.outside.len() >= MAX_OUTSIDE_MEMBERS {
                bail!("the layer has more than {MAX_OUTSIDE_MEMBERS} members outside {REPO_DIR}: not an oscontainer");
            }
            self.outside.push((path.clone(), kind.is_symlink()));
        }
        if kind.is_character_special() || kind.is_block_special() {
            bail!("tar member {shown:?} is a device node");
        }
        if kind.is_fifo() {
            bail!("tar member {shown:?} is a fifo");
        }
        if !kind.is_dir() && mode & 0o6000 != 0 {
            bail!(
                "tar member {shown:?} is setuid or setgid (mode {:o}); an oscontainer carries such files only inside OSTree objects",
                mode & 0o7777
            );
        }
        if kind.is_symlink() {
            let target = String::from_utf8_lossy(link.unwrap_or_default());
            if in_repo || is_repo_ancestor(&path) {
                bail!("tar member {shown:?} is a symlink (to {target:?}) where the OSTree repository {REPO_DIR} must be real files");
            }
            self.symlinks.insert(path);
            return Ok(Member::Ignored);
        }
        // A symlink replaced by anything else no longer redirects what follows.
        self.symlinks.remove(&path);
        if kind.is_hard_link() {
            let target = String::from_utf8_lossy(link.unwrap_or_default());
            if let Err(why) = clean(&target) {
                bail!("tar member {shown:?} is a hardlink to {target:?}, which {why}: it leads out of the image");
            }
            if in_repo {
                bail!("tar member {shown:?} is a hardlink (to {target:?}) inside the OSTree repository {REPO_DIR}");
            }
            return Ok(Member::Ignored);
        }
        if !in_repo || kind.is_dir() || kind.is_pax_global_extensions() {
            return Ok(Member::Ignored);
        }
        if !(kind.is_file() || kind.is_contiguous()) {
            bail!("tar member {shown:?} inside the OSTree repository is neither a regular file nor a directory ({kind:?})");
        }
        let Some(rel) = path.strip_prefix(REPO_DIR) else {
            bail!("tar member {shown:?} puts a file where the OSTree repository directory {REPO_DIR} must be");
        };
        Ok(Member::RepoFile(rel.to_string()))
    }

    /// Replays the members `later` (the next layer) had outside the repository as if they came
    /// after this layer's: what it wrote through a symlink made here is refused.
    pub fn absorb(&mut self, later: MemberCheck) -> Result<()> {
        for (path, is_symlink) in later.outside {
            if let Some(link) = self.through_symlink(&path) {
                bail!("tar member {path:?} is written through the symlink {link:?} of an earlier layer");
            }
            if is_symlink {
                self.symlinks.insert(path);
            } else {
                self.symlinks.remove(&path);
            }
        }
        Ok(())
    }

    /// The symlink made earlier that is a parent directory of `path`, if any.
    fn through_symlink(&self, path: &str) -> Option<&str> {
        if self.symlinks.is_empty() {
            return None;
        }
        path.match_indices('/')
            .map(|(i, _)| &path[..i])
            .find_map(|parent| self.symlinks.get(parent).map(String::as_str))
    }
}

/// `./a//b/./c/` → `a/b/c`; an absolute path or a `..` component is refused (with the reason).
pub(super) fn clean(name: &str) -> std::result::Result<String, &'static str> {
    if name.starts_with('/') {
        return Err("is an absolute path");
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("has a `..` component"),
            other => parts.push(other),
        }
    }
    Ok(parts.join("/"))
}

/// `srv/repo/…` (with `REPO_DIR` = `srv/repo/`), or `srv/repo` itself.
fn is_in_repo(path: &str) -> bool {
    path.starts_with(REPO_DIR) || path == REPO_DIR.trim_end_matches('/')
}

/// `srv`: a symlink there would redirect the repository.
fn is_repo_ancestor(path: &str) -> bool {
    REPO_DIR.starts_with(&format!("{path}/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(m: &mut MemberCheck, name: &str, kind: EntryType, mode: u32) -> Result<Member> {
        m.check(name.as_bytes(), kind, mode, None)
    }

    fn err(r: Result<Member>) -> String {
        format!("{:#}", r.unwrap_err())
    }

    #[test]
    fn names_are_cleaned() {
        assert_eq!(clean("./srv/repo/config").unwrap(), "srv/repo/config");
        assert_eq!(clean("srv//repo/./x/").unwrap(), "srv/repo/x");
        assert_eq!(clean("./").unwrap(), "");
        assert!(clean("/srv/repo").is_err());
        assert!(clean("srv/../etc").is_err());
        assert!(clean("..").is_err());
    }

    #[test]
    fn repo_files_are_recognised_and_the_rest_ignored() {
        let mut m = MemberCheck::default();
        let file = EntryType::Regular;
        assert_eq!(
            check(&mut m, "./srv/repo/config", file, 0o644).unwrap(),
            Member::RepoFile("config".into())
        );
        assert_eq!(
            check(&mut m, "usr/bin/x", file, 0o755).unwrap(),
            Member::Ignored
        );
        assert_eq!(
            check(&mut m, "srv/repo/objects/", EntryType::Directory, 0o2755).unwrap(),
            Member::Ignored
        );
    }

    #[test]
    fn hostile_members_are_refused_by_name() {
        let mut m = MemberCheck::default();
        let file = EntryType::Regular;
        assert!(err(check(&mut m, "srv/../../etc/passwd", file, 0o644)).contains("`..`"));
        assert!(err(check(&mut m, "/etc/passwd", file, 0o644)).contains("absolute"));
        assert!(err(check(&mut m, "dev/sda", EntryType::Block, 0o600)).contains("device node"));
        assert!(err(check(&mut m, "dev/tty", EntryType::Char, 0o600)).contains("device node"));
        assert!(err(check(&mut m, "run/pipe", EntryType::Fifo, 0o600)).contains("fifo"));
        assert!(err(check(&mut m, "usr/bin/su", file, 0o4755)).contains("setuid"));
        assert!(err(check(&mut m, "usr/bin/x", file, 0o2755)).contains("setgid"));
    }

    #[test]
    fn links_are_refused_where_they_could_redirect() {
        let mut m = MemberCheck::default();
        let sym = EntryType::Symlink;
        let link = EntryType::Link;
        let e = err(m.check(b"srv/repo/objects/ab", sym, 0o777, Some(b"/etc")));
        assert!(e.contains("symlink") && e.contains("/etc"), "{e}");
        assert!(err(m.check(b"srv", sym, 0o777, Some(b"/etc"))).contains("symlink"));
        let e = err(m.check(b"x", link, 0o644, Some(b"/etc/shadow")));
        assert!(e.contains("leads out of the image"), "{e}");
        let e = err(m.check(b"x", link, 0o644, Some(b"../../etc/shadow")));
        assert!(e.contains("leads out of the image"), "{e}");
        let e = err(m.check(b"srv/repo/config", link, 0o644, Some(b"srv/other")));
        assert!(e.contains("hardlink"), "{e}");
        // Ordinary OS symlinks outside the repo are fine, but nothing may be written through them.
        assert_eq!(
            m.check(
                b"usr/etc/os-release",
                sym,
                0o777,
                Some(b"../lib/os-release")
            )
            .unwrap(),
            Member::Ignored
        );
        assert_eq!(
            m.check(b"etc", sym, 0o777, Some(b"/outside")).unwrap(),
            Member::Ignored
        );
        let e = err(check(&mut m, "etc/shadow", EntryType::Regular, 0o644));
        assert!(e.contains("through the symlink \"etc\""), "{e}");
        // Replaced by a directory, it redirects nothing any more.
        check(&mut m, "etc/", EntryType::Directory, 0o755).unwrap();
        check(&mut m, "etc/shadow", EntryType::Regular, 0o644).unwrap();
    }

    /// Regression (fuzzing): a file named exactly `srv/repo` made the importer slice past the
    /// end of its name.
    #[test]
    fn a_file_in_place_of_the_repo_directory_is_refused() {
        let mut m = MemberCheck::default();
        let e = err(check(&mut m, "./srv/repo", EntryType::Regular, 0o644));
        assert!(e.contains("where the OSTree repository directory"), "{e}");
        assert_eq!(
            check(&mut m, "srv/repo/", EntryType::Directory, 0o755).unwrap(),
            Member::Ignored
        );
    }

    #[test]
    fn member_of_a_later_layer_written_through_an_earlier_layers_symlink_is_refused() {
        let mut first = MemberCheck::default();
        first
            .check(b"etc", EntryType::Symlink, 0o777, Some(b"/outside"))
            .unwrap();
        let mut second = MemberCheck::default();
        check(&mut second, "etc/shadow", EntryType::Regular, 0o644).unwrap();
        let e = format!("{:#}", first.absorb(second).unwrap_err());
        assert!(
            e.contains("\"etc/shadow\"") && e.contains("earlier layer"),
            "{e}"
        );

        // A later layer that first replaces the symlink by a directory writes nothing through it.
        let mut first = MemberCheck::default();
        first
            .check(b"etc", EntryType::Symlink, 0o777, Some(b"/outside"))
            .unwrap();
        let mut second = MemberCheck::default();
        check(&mut second, "etc/", EntryType::Directory, 0o755).unwrap();
        check(&mut second, "etc/shadow", EntryType::Regular, 0o644).unwrap();
        first.absorb(second).unwrap();
    }

    #[test]
    fn odd_types_inside_the_repo_are_refused() {
        let mut m = MemberCheck::default();
        let e = err(check(&mut m, "srv/repo/x", EntryType::GNUSparse, 0o644));
        assert!(e.contains("neither a regular file nor a directory"), "{e}");
    }
}
