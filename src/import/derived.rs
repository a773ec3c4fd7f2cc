//! Layers derived from an ostree-native image (a user's `FROM <os image>` build with extra files),
//! applied as a new commit on top of the image's commit, the way ostree-rs-ext does: `usr/` is
//! kept, `etc/` becomes `usr/etc/`, `var/` becomes `usr/share/factory/var/`, the children of
//! `run`, `tmp`, `proc`, `sys` and `dev` and anything else outside those are dropped, and OCI
//! whiteouts (`.wh.<name>`, `.wh..wh..opq`) remove what lower layers had.
//!
//! Each layer is read on its own (in parallel with the others, like every layer): its files
//! become content objects in the open transaction and its entries a list of changes. Once all
//! layers are in, [`apply`] replays the changes layer by layer on a mutable tree of the commit
//! (whiteouts of a layer first: they hide only what lower layers had) and writes the new commit,
//! with the base commit's metadata and time, so the same image always gives the same commit.
//! Nothing is unpacked to disk. Extended attributes of derived files (SELinux labels included)
//! are not carried: like ostree-rs-ext's import, the files get none from the layer.

use std::io::Read;

use anyhow::{anyhow, bail, ensure, Context, Result};
use ostree::gio;
use ostree::glib;
use ostree::ObjectType;
use tar::EntryType;

use super::member::clean;
use super::objects;

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
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
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

/// Writes the commit of `base` with the derived layers' `changes` applied; returns it.
pub(super) fn apply(repo: &ostree::Repo, base: &str, layers: &DerivedLayer) -> Result<String> {
    let cancellable = gio::Cancellable::NONE;
    let root = ostree::MutableTree::from_commit(repo, base)
        .with_context(|| format!("reading commit {base}"))?;
    let info = gio::FileInfo::new();
    info.set_attribute_uint32("unix::uid", 0);
    info.set_attribute_uint32("unix::gid", 0);
    info.set_attribute_uint32("unix::mode", libc::S_IFDIR | 0o755);
    let default_dirmeta = write_dirmeta(repo, &info)?;
    // Layer by layer (split at the boundary markers): whiteouts first, then the rest.
    for layer in layers.changes.split(|c| matches!(c, Change::NextLayer)) {
        let (hiding, adding): (Vec<&Change>, Vec<&Change>) = layer
            .iter()
            .partition(|c| matches!(c, Change::Whiteout(_) | Change::Opaque(_)));
        for change in hiding.into_iter().chain(adding) {
            apply_change(&root, change, &default_dirmeta)
                .with_context(|| format!("applying the derived layers: {change:?}"))?;
        }
    }
    let tree = repo
        .write_mtree(&root, cancellable)
        .context("writing the derived tree")?;
    let tree = glib::object::Cast::downcast::<ostree::RepoFile>(tree)
        .map_err(|_| anyhow!("write_mtree did not return a RepoFile"))?;
    let (base_commit, _) = repo.load_commit(base)?;
    let metadata = glib::VariantDict::new(Some(&base_commit.child_value(0)));
    metadata.insert("pivot.base-commit", base);
    let metadata = metadata.end();
    let time = ostree::commit_get_timestamp(&base_commit);
    let commit = repo
        .write_commit_with_time(
            None,
            Some(&format!("{base} with derived layers")),
            None,
            Some(&metadata),
            &tree,
            time,
            cancellable,
        )
        .context("writing the derived commit")?;
    Ok(commit.to_string())
}

fn apply_change(root: &ostree::MutableTree, change: &Change, default_dirmeta: &str) -> Result<()> {
    match change {
        Change::Whiteout(path) => {
            let (dir, name) = parent_of(root, path, default_dirmeta, false)?;
            if let Some(dir) = dir {
                dir.remove(name, true)?;
            }
        }
        Change::Opaque(path) => {
            if let Some(dir) = lookup_dir(root, path)? {
                for name in dir.copy_files().into_keys() {
                    dir.remove(&name, true)?;
                }
                for name in dir.copy_subdirs().into_keys() {
                    dir.remove(&name, true)?;
                }
            }
        }
        Change::Dir { path, dirmeta } => {
            let (dir, name) = parent_of(root, path, default_dirmeta, true)?;
            let dir = dir.expect("created");
            if let (Some(_), None) = dir.lookup(name).unwrap_or((None, None)) {
                dir.remove(name, false)?;
            }
            dir.ensure_dir(name)?.set_metadata_checksum(dirmeta);
        }
        Change::File { path, checksum } => replace_file(root, path, checksum, default_dirmeta)?,
        Change::NextLayer => {}
        Change::Link { path, target } => {
            let (dir, name) = parent_of(root, target, default_dirmeta, false)?;
            let checksum = dir
                .and_then(|d| d.lookup(name).ok())
                .and_then(|(file, _)| file)
                .ok_or_else(|| anyhow!("the hardlink target {target:?} is not a file"))?;
            replace_file(root, path, &checksum, default_dirmeta)?;
        }
    }
    Ok(())
}

fn replace_file(
    root: &ostree::MutableTree,
    path: &str,
    checksum: &str,
    default_dirmeta: &str,
) -> Result<()> {
    let (dir, name) = parent_of(root, path, default_dirmeta, true)?;
    let dir = dir.expect("created");
    if let (None, Some(_)) = dir.lookup(name).unwrap_or((None, None)) {
        dir.remove(name, false)?;
    }
    dir.replace_file(name, checksum)?;
    Ok(())
}

/// The directory holding `path` and its last component; with `create`, missing parents are
/// made (root-owned 0755). A parent that is a file (a symlink, say) is refused: a layer cannot
/// write through it.
fn parent_of<'p>(
    root: &ostree::MutableTree,
    path: &'p str,
    default_dirmeta: &str,
    create: bool,
) -> Result<(Option<ostree::MutableTree>, &'p str)> {
    let (parent, name) = match path.rsplit_once('/') {
        Some((p, n)) => (p, n),
        None => ("", path),
    };
    let mut dir = root.clone();
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        match dir.lookup(part).unwrap_or((None, None)) {
            (_, Some(sub)) => dir = sub,
            (Some(_), None) => {
                bail!("{parent:?} is not a directory in the image (its {part:?} is a file or symlink)")
            }
            (None, None) if create => {
                let sub = dir.ensure_dir(part)?;
                sub.set_metadata_checksum(default_dirmeta);
                dir = sub;
            }
            (None, None) => return Ok((None, name)),
        }
    }
    Ok((Some(dir), name))
}

fn lookup_dir(root: &ostree::MutableTree, path: &str) -> Result<Option<ostree::MutableTree>> {
    let mut dir = root.clone();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        match dir.lookup(part).unwrap_or((None, None)) {
            (_, Some(sub)) => dir = sub,
            _ => return Ok(None),
        }
    }
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostree::gio::prelude::FileExt;

    /// An archive repo in a transaction, with a base commit of `usr/share/{a,b}`,
    /// `usr/etc/keep.conf` and the symlink `usr/link` → `/etc`.
    fn base() -> (tempfile::TempDir, ostree::Repo, String) {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
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
        let mtree = ostree::MutableTree::new();
        repo.write_directory_to_mtree(
            &gio::File::for_path(&tree),
            &mtree,
            None,
            gio::Cancellable::NONE,
        )
        .unwrap();
        let root = repo.write_mtree(&mtree, gio::Cancellable::NONE).unwrap();
        let root = glib::object::Cast::downcast::<ostree::RepoFile>(root).unwrap();
        let commit = repo
            .write_commit(None, None, None, None, &root, gio::Cancellable::NONE)
            .unwrap()
            .to_string();
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
        apply(repo, base, &all)
    }

    fn exists(repo: &ostree::Repo, commit: &str, path: &str) -> bool {
        let (root, _) = repo.read_commit(commit, gio::Cancellable::NONE).unwrap();
        root.resolve_relative_path(path)
            .query_exists(gio::Cancellable::NONE)
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
}
