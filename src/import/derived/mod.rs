//! Layers derived from an ostree-native image (a user's `FROM <os image>` build with extra files),
//! applied on top of the image's commit, the way ostree-rs-ext does: `usr/` is
//! kept, `etc/` becomes `usr/etc/`, `var/` becomes `usr/share/factory/var/`, the children of
//! `run`, `tmp`, `proc`, `sys` and `dev` and anything else outside those are dropped, and OCI
//! whiteouts (`.wh.<name>`, `.wh..wh..opq`) remove what lower layers had.
//!
//! Each layer is read on its own (in parallel with the others, like every layer): its files
//! become content objects in the open transaction and its entries a list of changes. Once all
//! layers are in, [`apply`] replays the changes layer by layer on a mutable tree of the commit
//! (whiteouts of a layer first: they hide only what lower layers had) and writes the new tree,
//! which becomes the image's merge commit ([`crate::import::store`]). Each layer also gets a commit of
//! its own ([`DerivedLayer::write_layer_commit`]), as ostree-rs-ext keeps it under the layer's
//! ref: its mapped files with the whiteouts as `.wh.` files, so that ostree-rs-ext, reusing the
//! layer for a later image, checks it out over that image's base with the same result.
//! Nothing is unpacked to disk. Extended attributes of derived files are not carried from the
//! layer (like ostree-rs-ext's import); in the merged tree they get SELinux labels from the base
//! commit's policy instead (`super::selinux`).

use std::io::Read;

use anyhow::{anyhow, bail, ensure, Context, Result};
use ostree::gio;
use ostree::ObjectType;
use tar::EntryType;

mod tree;

use super::member::clean;
use super::objects;
pub(super) use tree::apply;
use tree::{apply_change, parent_of, Objects};

/// Entries one derived layer may have (each is a small change record kept until the end).
const MAX_ENTRIES: usize = 500_000;
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// One change a derived layer makes, on a path already mapped into the commit (`usr/…`).
#[derive(Debug, Clone)]
enum Change {
    /// Everything lower layers had at this path goes.
    Whiteout(String),
    /// Everything lower layers had inside this directory goes.
    Opaque(String),
    Dir {
        path: String,
        dirmeta: String,
    },
    /// A regular file or symlink: its content object.
    File {
        path: String,
        checksum: String,
    },
    /// A hardlink to an earlier path of the merged tree.
    Link {
        path: String,
        target: String,
    },
    /// Where one layer's changes end and the next layer's begin.
    NextLayer,
}

/// The changes of one derived layer.
#[derive(Default)]
pub(super) struct DerivedLayer {
    changes: Vec<Change>,
    pub objects_written: u64,
    /// Entries dropped (outside what maps into the commit), by top-level directory: what
    /// ostree-rs-ext records as `ostree.tar-filtered`.
    pub filtered: std::collections::BTreeMap<String, u32>,
}

impl DerivedLayer {
    pub fn import_tar(&mut self, repo: &ostree::Repo, reader: impl Read) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().context("reading the layer as tar")? {
            let mut entry = entry.context("reading the layer as tar")?;
            let shown = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let kind = entry.header().entry_type();
            if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
                continue;
            }
            let path = clean(&shown).map_err(|why| anyhow!("tar member {shown:?} {why}"))?;
            ensure!(
                self.changes.len() < MAX_ENTRIES,
                "a derived layer has more than {MAX_ENTRIES} entries"
            );
            let change = self
                .change(repo, &path, kind, &mut entry)
                .with_context(|| format!("derived layer member {shown:?}"))?;
            if let Some(change) = change {
                self.changes.push(change);
            }
        }
        Ok(())
    }

    fn change(
        &mut self,
        repo: &ostree::Repo,
        path: &str,
        kind: EntryType,
        entry: &mut tar::Entry<impl Read>,
    ) -> Result<Option<Change>> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", path),
        };
        if name == OPAQUE {
            return Ok(map_path(parent).map(Change::Opaque));
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let hidden = if parent.is_empty() {
                hidden.to_string()
            } else {
                format!("{parent}/{hidden}")
            };
            return Ok(map_path(&hidden)
                .filter(|p| !p.is_empty())
                .map(Change::Whiteout));
        }
        let Some(path) = map_path(path) else {
            let top = path.split('/').next().unwrap_or_default();
            *self.filtered.entry(top.to_string()).or_default() += 1;
            return Ok(None);
        };
        if path.is_empty() {
            return Ok(None); // The layer's root: the commit's root stays as it is.
        }
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            bail!("is a device node or fifo, which an OSTree commit cannot hold");
        }
        let header = entry.header();
        let uid = u32::try_from(header.uid()?).context("uid out of range")?;
        let gid = u32::try_from(header.gid()?).context("gid out of range")?;
        let mode = header.mode()? & 0o7777;
        if kind.is_dir() {
            let info = gio::FileInfo::new();
            info.set_attribute_uint32("unix::uid", uid);
            info.set_attribute_uint32("unix::gid", gid);
            info.set_attribute_uint32("unix::mode", libc::S_IFDIR | mode);
            let dirmeta = write_dirmeta(repo, &info)?;
            return Ok(Some(Change::Dir { path, dirmeta }));
        }
        if kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .map(|l| String::from_utf8_lossy(&l).into_owned())
                .unwrap_or_default();
            let cleaned = clean(&target)
                .map_err(|why| anyhow!("is a hardlink to {target:?}, which {why}"))?;
            let Some(target) = map_path(&cleaned) else {
                return Ok(None); // A link to something dropped is dropped as well.
            };
            return Ok(Some(Change::Link { path, target }));
        }
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        let written = objects::write_content_member(
            repo,
            None,
            None,
            kind,
            link.as_deref(),
            (uid, gid, mode),
            entry,
        )?;
        let Some(checksum) = written else {
            bail!("is of a kind a layer cannot apply ({kind:?})");
        };
        self.objects_written += 1;
        Ok(Some(Change::File { path, checksum }))
    }

    /// Appends `later`'s changes (the next layer's), keeping layers apart for [`apply`].
    pub fn absorb(&mut self, later: DerivedLayer) {
        self.changes.push(Change::NextLayer);
        self.changes.extend(later.changes);
        self.objects_written += later.objects_written;
        for (top, n) in later.filtered {
            *self.filtered.entry(top).or_default() += n;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Writes this one layer's changes as a commit of their own (time 0, no metadata): its
    /// directories and files at their mapped paths, a whiteout as an empty `.wh.<name>` file and
    /// an opaque directory as `.wh..wh..opq` in it, as `ostree commit` of the filtered layer
    /// leaves them for ostree-rs-ext. Call before [`Self::absorb`] merges layers.
    pub fn write_layer_commit(&self, repo: &ostree::Repo) -> Result<String> {
        let root = ostree::MutableTree::new();
        // Unlabeled: the base may not be in yet, and ostree-rs-ext labels a merge of derived
        // layers anew from the merged tree's policy.
        let objects = Objects {
            repo,
            default_dirmeta: crate::import::store::root_dirmeta(repo)?,
            labels: None,
        };
        root.set_metadata_checksum(&objects.default_dirmeta);
        let mut empty = None;
        let mut marker = |path: String| -> Result<Change> {
            let checksum = match &empty {
                Some(c) => String::clone(c),
                None => {
                    let c = objects::write_empty_file(repo)?;
                    empty = Some(c.clone());
                    c
                }
            };
            Ok(Change::File { path, checksum })
        };
        for change in &self.changes {
            let change = match change {
                Change::Whiteout(path) => {
                    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
                    marker(join(parent, &format!("{WHITEOUT}{name}")))?
                }
                Change::Opaque(path) => marker(join(path, OPAQUE))?,
                Change::Link { path, target } => {
                    // A link to a file of this layer; one to a lower layer's file has no target
                    // here and is left out (the merged tree has it).
                    let (dir, name) = parent_of(&root, target, None)?;
                    match dir.and_then(|d| d.lookup(name).ok()).and_then(|(f, _)| f) {
                        Some(checksum) => Change::File {
                            path: path.clone(),
                            checksum: checksum.to_string(),
                        },
                        None => continue,
                    }
                }
                other => other.clone(),
            };
            apply_change(&root, &change, &objects)
                .with_context(|| format!("writing the derived layer: {change:?}"))?;
        }
        let tree = crate::import::store::write_tree(repo, &root)?;
        let commit = repo
            .write_commit_with_time(None, None, None, None, &tree, 0, gio::Cancellable::NONE)
            .context("writing the derived layer's commit")?;
        Ok(commit.to_string())
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Maps a layer path into the commit (see the module documentation); None drops it.
fn map_path(path: &str) -> Option<String> {
    let (first, rest) = match path.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (path, None),
    };
    let join = |top: &str| match rest {
        Some(r) => format!("{top}/{r}"),
        None => top.to_string(),
    };
    match first {
        "" => Some(String::new()),
        "usr" => Some(join("usr")),
        "etc" => Some(join("usr/etc")),
        "var" => Some(join("usr/share/factory/var")),
        "run" | "tmp" | "proc" | "sys" | "dev" if rest.is_none() => Some(first.to_string()),
        _ => None,
    }
}

fn write_dirmeta(repo: &ostree::Repo, info: &gio::FileInfo) -> Result<String> {
    let v = ostree::create_directory_metadata(info, None);
    Ok(repo
        .write_metadata(ObjectType::DirMeta, None, &v, gio::Cancellable::NONE)
        .context("writing directory metadata")?
        .to_hex())
}

#[cfg(test)]
mod tests;
