//! Importing the layers of an ostree-native container image: the tar format ostree-rs-ext writes
//! (`ostree_ext::tar::export`, format version 1), read straight from the layer stream into the
//! open transaction.
//!
//! Its objects live under `sysroot/ostree/repo/objects/`; everything else in a layer (a checkout
//! of the commit as hardlinks to those objects, `/etc` carried as `etc`, a `var/tmp`) is only there
//! for container runtimes and is checked, not imported. Metadata objects (`.commit`,
//! `.commitmeta`, `.dirtree`, `.dirmeta`) are stored as in a repo. A content object is not an
//! archive "filez": `.file` is the file itself (a regular file or a symlink, owner and mode in
//! its tar header), and its extended attributes come just before it, as a `.file-xattrs-link`
//! hardlink (named by the content object) to a `.file-xattrs` object (named by the SHA-256 of the
//! serialized xattrs) of the same layer. libostree rebuilds each object from those parts and
//! checks that it hashes to its name.
//!
//! pivot reads this format itself rather than through the `ostree-ext` crate: ostree-ext pins the
//! `ostree` 0.19 crate (pivot links 0.20, and two versions cannot be linked together), and it
//! pulls images through skopeo's containers-image-proxy, which pivot must not depend on; this
//! importer keeps pivot's streaming pipeline (no temporary copy of a layer, layers in parallel)
//! and its checks on hostile input for both formats.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use anyhow::{anyhow, bail, ensure, Context, Result};
use ostree::gio;
use ostree::glib;
use ostree::ObjectType;
use sha2::{Digest, Sha256};
use tar::EntryType;

use super::checkpoint::{member_end, Tracker};
use super::member::clean;
use super::objects::{self, object_name, write_object, Outcome, Tally};

/// Where the objects are in the tar stream.
pub(super) const NATIVE_REPO_DIR: &str = "sysroot/ostree/repo/";
/// Extended attributes of one file; real ones are a few hundred bytes.
const MAX_XATTRS: u64 = 1 << 20;
/// Distinct xattrs sets one layer may carry (each is small; this bounds the cache).
const MAX_XATTRS_SETS: usize = 100_000;

/// What one layer's import keeps between its tar members.
#[derive(Default)]
pub(super) struct NativeLayer {
    /// `.file-xattrs` objects of this layer: SHA-256 of the serialized xattrs → the xattrs.
    xattrs: HashMap<String, glib::Variant>,
    /// The `.file-xattrs-link` just read: (content object checksum, xattrs checksum).
    pending: Option<(String, String)>,
    pub tally: Tally,
    /// Where regular files are written without libostree ([`objects::Staging`]), if anywhere.
    pub staging: Option<std::sync::Arc<objects::Staging>>,
}

impl NativeLayer {
    /// Imports one uncompressed layer; with `tracker`, keeps checkpoints at the ends of its
    /// members (between a content object's xattrs and the object, there is none).
    pub fn import_tar(
        &mut self,
        repo: &ostree::Repo,
        reader: impl Read,
        mut tracker: Option<&mut Tracker>,
    ) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().context("reading the layer as tar")? {
            let mut entry = entry.context("reading the layer as tar")?;
            let end = member_end(&entry);
            self.entry(repo, &mut entry)?;
            if let Some(tracker) = tracker.as_deref_mut().filter(|_| self.pending.is_none()) {
                tracker.member_end(end, || {
                    Some((
                        super::ImportedLayer::native(&self.tally)?,
                        self.saved_xattrs(),
                    ))
                });
            }
        }
        if let Some((file, _)) = &self.pending {
            bail!("the layer ends after the xattrs of content object {file}, without the object");
        }
        Ok(())
    }

    fn entry(&mut self, repo: &ostree::Repo, entry: &mut tar::Entry<impl Read>) -> Result<()> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        let path = clean(&shown).map_err(|why| anyhow!("tar member {shown:?} {why}"))?;
        if kind.is_character_special() || kind.is_block_special() {
            bail!("tar member {shown:?} is a device node");
        }
        if kind.is_fifo() {
            bail!("tar member {shown:?} is a fifo");
        }
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        if kind.is_hard_link() {
            let target = String::from_utf8_lossy(link.as_deref().unwrap_or_default());
            if let Err(why) = clean(&target) {
                bail!("tar member {shown:?} is a hardlink to {target:?}, which {why}: it leads out of the image");
            }
        }
        let Some(rel) = path.strip_prefix(NATIVE_REPO_DIR) else {
            return Ok(()); // The checkout for container runtimes, `var/tmp`, the repo's parents.
        };
        let Some(obj) = rel.strip_prefix("objects/") else {
            return Ok(()); // config, refs/, tmp/ and the like: nothing a deployment needs.
        };
        if kind.is_dir() {
            return Ok(());
        }
        let context = || format!("importing {NATIVE_REPO_DIR}{rel}");
        self.member(repo, obj, kind, link.as_deref(), entry)
            .with_context(context)
    }

    /// The xattrs objects read so far, as checksum → serialized xattrs in hex (for a checkpoint).
    pub fn saved_xattrs(&self) -> BTreeMap<String, String> {
        self.xattrs
            .iter()
            .map(|(k, v)| (k.clone(), hex::encode(v.data_as_bytes())))
            .collect()
    }

    /// Takes back the xattrs objects of a checkpoint; each must hash to its name.
    pub fn restore_xattrs(&mut self, saved: &BTreeMap<String, String>) -> Result<()> {
        for (checksum, data) in saved {
            let data = hex::decode(data).context("the checkpoint's xattrs are not hex")?;
            ensure!(
                hex::encode(Sha256::digest(&data)) == *checksum,
                "the checkpoint's xattrs object {checksum} does not match its name"
            );
            self.xattrs.insert(checksum.clone(), xattrs_variant(data));
        }
        Ok(())
    }

    fn member(
        &mut self,
        repo: &ostree::Repo,
        obj: &str,
        kind: EntryType,
        link: Option<&[u8]>,
        entry: &mut tar::Entry<impl Read>,
    ) -> Result<()> {
        let Some((checksum, ext)) = object_name(obj) else {
            bail!("not an object name");
        };
        match ext {
            "file-xattrs" => {
                ensure!(
                    kind.is_file(),
                    "an xattrs object is not a regular file ({kind:?})"
                );
                let xattrs_checksum = self.read_xattrs(entry)?;
                ensure!(
                    xattrs_checksum == checksum,
                    "xattrs object {checksum} holds xattrs whose checksum is {xattrs_checksum}: its content does not match its name"
                );
            }
            "file-xattrs-link" => {
                if let Some((file, _)) = &self.pending {
                    bail!("content object {file} is missing after its xattrs");
                }
                let xattrs_checksum = if kind.is_hard_link() {
                    let target = String::from_utf8_lossy(link.unwrap_or_default()).into_owned();
                    let target = clean(&target).map_err(|why| anyhow!("the link {why}"))?;
                    target
                        .strip_prefix(NATIVE_REPO_DIR)
                        .and_then(|t| t.strip_prefix("objects/"))
                        .and_then(object_name)
                        .filter(|(_, ext)| *ext == "file-xattrs")
                        .map(|(c, _)| c)
                        .ok_or_else(|| {
                            anyhow!("the link leads to {target:?}, not to an xattrs object")
                        })?
                } else if kind.is_file() {
                    self.read_xattrs(entry)?
                } else {
                    bail!("an xattrs link is neither a hardlink nor a regular file ({kind:?})");
                };
                ensure!(
                    self.xattrs.contains_key(&xattrs_checksum),
                    "xattrs object {xattrs_checksum} is not earlier in the layer"
                );
                self.pending = Some((checksum, xattrs_checksum));
            }
            "file" => {
                let (file, xattrs_checksum) = self
                    .pending
                    .take()
                    .ok_or_else(|| anyhow!("content object {checksum} comes without its xattrs"))?;
                ensure!(
                    file == checksum,
                    "content object {checksum} follows the xattrs of {file}"
                );
                let xattrs = self.xattrs[&xattrs_checksum].clone();
                let staging = self.staging.as_deref();
                let outcome = write_content(repo, staging, &checksum, kind, link, &xattrs, entry)?;
                self.tally.count(&checksum, ext, outcome);
            }
            "commit" | "commitmeta" | "dirtree" | "dirmeta" => {
                ensure!(
                    kind.is_file(),
                    "a metadata object is not a regular file ({kind:?})"
                );
                let size = entry.size();
                let outcome = write_object(repo, &checksum, ext, entry, size)?;
                self.tally.count(&checksum, ext, outcome);
            }
            // Signatures, tombstones and the like carry nothing a deployment needs.
            _ => {}
        }
        Ok(())
    }

    /// Reads and caches an xattrs object; returns the SHA-256 of its bytes.
    fn read_xattrs(&mut self, entry: &mut impl Read) -> Result<String> {
        let mut data = Vec::new();
        entry.take(MAX_XATTRS + 1).read_to_end(&mut data)?;
        ensure!(
            data.len() as u64 <= MAX_XATTRS,
            "xattrs larger than the {MAX_XATTRS} bytes accepted"
        );
        let checksum = hex::encode(Sha256::digest(&data));
        if !self.xattrs.contains_key(&checksum) {
            ensure!(
                self.xattrs.len() < MAX_XATTRS_SETS,
                "more than {MAX_XATTRS_SETS} distinct xattrs in one layer"
            );
            self.xattrs.insert(checksum.clone(), xattrs_variant(data));
        }
        Ok(checksum)
    }
}

/// Serialized xattrs as the variant libostree takes.
fn xattrs_variant(data: Vec<u8>) -> glib::Variant {
    let ty = glib::VariantTy::new("a(ayay)").expect("static variant type");
    glib::Variant::from_bytes_with_type(&glib::Bytes::from_owned(data), ty)
}

/// Writes the content object `checksum` from its tar member: a regular file (content, owner and
/// mode from the member) or a symlink, with `xattrs`. Its stream is hashed and checked against
/// the name before the object lands (see [`objects::write_raw`]).
fn write_content(
    repo: &ostree::Repo,
    staging: Option<&objects::Staging>,
    checksum: &str,
    kind: EntryType,
    link: Option<&[u8]>,
    xattrs: &glib::Variant,
    entry: &mut tar::Entry<impl Read>,
) -> Result<Outcome> {
    let header = entry.header();
    let uid = u32::try_from(header.uid()?).context("uid out of range")?;
    let gid = u32::try_from(header.gid()?).context("gid out of range")?;
    // The permission bits are kept by `write_raw`, as libostree keeps them.
    let mode = header.mode()?;
    if repo.has_object(ObjectType::File, checksum, gio::Cancellable::NONE)? {
        return Ok(Outcome::Skipped);
    }
    let symlink = if kind.is_symlink() {
        Some(objects::symlink_target(link)?)
    } else if kind.is_file() || kind.is_contiguous() {
        None
    } else {
        bail!("a content object is neither a regular file nor a symlink ({kind:?})");
    };
    let size = if symlink.is_some() { 0 } else { entry.size() };
    objects::write_raw(
        (repo, staging),
        checksum,
        (uid, gid, mode),
        symlink,
        xattrs,
        entry,
        size,
    )?;
    Ok(Outcome::Written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer with one content object named `checksum` holding `content`, with empty xattrs.
    fn layer(checksum: &str, content: &[u8], with_xattrs: bool) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let objects = format!("{NATIVE_REPO_DIR}objects");
        let empty = hex::encode(Sha256::digest(b""));
        let mut add = |path: String, kind: EntryType, link: Option<&str>, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_size(data.len() as u64);
            match link {
                Some(target) => tar.append_link(&mut h, &path, target).unwrap(),
                None => tar.append_data(&mut h, &path, data).unwrap(),
            }
        };
        let xattrs = format!("{objects}/{}/{}.file-xattrs", &empty[..2], &empty[2..]);
        if with_xattrs {
            add(xattrs.clone(), EntryType::Regular, None, b"");
            add(
                format!(
                    "{objects}/{}/{}.file-xattrs-link",
                    &checksum[..2],
                    &checksum[2..]
                ),
                EntryType::Link,
                Some(&xattrs),
                b"",
            );
        }
        add(
            format!("{objects}/{}/{}.file", &checksum[..2], &checksum[2..]),
            EntryType::Regular,
            None,
            content,
        );
        tar.into_inner().unwrap()
    }

    fn import(data: &[u8]) -> Result<NativeLayer> {
        let dir = tempfile::tempdir().unwrap();
        let repo = ostree::Repo::new_for_path(dir.path());
        repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE)?;
        repo.prepare_transaction(gio::Cancellable::NONE)?;
        let mut layer = NativeLayer::default();
        let imported = layer.import_tar(&repo, data, None);
        repo.abort_transaction(gio::Cancellable::NONE)?;
        imported.map(|()| layer)
    }

    #[test]
    fn content_that_does_not_match_its_name_is_refused() {
        let wrong = "ab".repeat(32);
        let err = format!(
            "{:#}",
            import(&layer(&wrong, b"hello\n", true)).err().unwrap()
        );
        assert!(err.contains(&wrong[2..]), "{err}");
        assert!(
            err.to_lowercase().contains("corrupted") || err.contains("does not match"),
            "{err}"
        );
    }

    #[test]
    fn content_without_its_xattrs_is_refused() {
        let name = "cd".repeat(32);
        let err = format!(
            "{:#}",
            import(&layer(&name, b"hello\n", false)).err().unwrap()
        );
        assert!(err.contains("without its xattrs"), "{err}");
    }

    #[test]
    fn members_leading_out_of_the_image_are_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(EntryType::Link);
        h.set_size(0);
        tar.append_link(&mut h, "usr/bin/x", "../../etc/shadow")
            .unwrap();
        let err = format!("{:#}", import(&tar.into_inner().unwrap()).err().unwrap());
        assert!(err.contains("leads out of the image"), "{err}");
    }

    /// One content object as libostree names it, written into a layer by its parts.
    struct Object {
        mode: u32,
        owner: (u32, u32),
        /// The content, or with `symlink` the target.
        data: Vec<u8>,
        symlink: bool,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    }

    #[test]
    fn objects_are_named_as_libostree_names_them() {
        use ostree::glib::prelude::ToVariant;
        let big: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
        let selinux = vec![(
            b"security.selinux\0".to_vec(),
            b"system_u:object_r:bin_t:s0\0".to_vec(),
        )];
        let objects = [
            Object {
                mode: 0o644,
                owner: (0, 0),
                data: b"hello\n".to_vec(),
                symlink: false,
                xattrs: vec![],
            },
            Object {
                mode: 0o4755,
                owner: (0, 0),
                data: b"#!/bin/sh\n".to_vec(),
                symlink: false,
                xattrs: selinux.clone(),
            },
            Object {
                mode: 0o600,
                owner: (1000, 5),
                data: vec![],
                symlink: false,
                xattrs: vec![],
            },
            // Past the in-memory bound: hashed as libostree reads it.
            Object {
                mode: 0o644,
                owner: (0, 0),
                data: big,
                symlink: false,
                xattrs: vec![],
            },
            Object {
                mode: 0o777,
                owner: (0, 0),
                data: b"../lib/os-release".to_vec(),
                symlink: true,
                xattrs: selinux,
            },
        ];
        // The names libostree gives them, written into a repo of its own.
        let reference = tempfile::tempdir().unwrap();
        let repo = ostree::Repo::new_for_path(reference.path());
        repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
            .unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let dir = format!("{NATIVE_REPO_DIR}objects");
        let path = |c: &str, ext: &str| format!("{dir}/{}/{}.{ext}", &c[..2], &c[2..]);
        let mut names = Vec::new();
        for o in &objects {
            let xattrs = o.xattrs.to_variant();
            let name = if o.symlink {
                let target = std::str::from_utf8(&o.data).unwrap();
                repo.write_symlink(
                    None,
                    o.owner.0,
                    o.owner.1,
                    Some(&xattrs),
                    target,
                    gio::Cancellable::NONE,
                )
            } else {
                repo.write_regfile_inline(
                    None,
                    o.owner.0,
                    o.owner.1,
                    libc::S_IFREG | o.mode,
                    Some(&xattrs),
                    &o.data,
                    gio::Cancellable::NONE,
                )
            }
            .unwrap()
            .to_string();
            let serialized = xattrs.data_as_bytes();
            let xattrs_name = hex::encode(Sha256::digest(&serialized));
            let header = |kind: EntryType, size: usize| {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(kind);
                h.set_mode(o.mode);
                h.set_uid(o.owner.0.into());
                h.set_gid(o.owner.1.into());
                h.set_size(size as u64);
                h
            };
            let mut h = header(EntryType::Regular, serialized.len());
            tar.append_data(&mut h, path(&xattrs_name, "file-xattrs"), &*serialized)
                .unwrap();
            let mut h = header(EntryType::Link, 0);
            tar.append_link(
                &mut h,
                path(&name, "file-xattrs-link"),
                path(&xattrs_name, "file-xattrs"),
            )
            .unwrap();
            if o.symlink {
                let mut h = header(EntryType::Symlink, 0);
                tar.append_link(
                    &mut h,
                    path(&name, "file"),
                    std::str::from_utf8(&o.data).unwrap(),
                )
                .unwrap();
            } else {
                let mut h = header(EntryType::Regular, o.data.len());
                tar.append_data(&mut h, path(&name, "file"), &o.data[..])
                    .unwrap();
            }
            names.push(name);
        }
        let layer = tar.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let repo = ostree::Repo::new_for_path(dir.path());
        repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
            .unwrap();
        repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
        let mut imported = NativeLayer::default();
        imported.import_tar(&repo, &layer[..], None).unwrap();
        repo.commit_transaction(gio::Cancellable::NONE).unwrap();
        assert_eq!(imported.tally.written, objects.len() as u64);
        for name in &names {
            assert!(
                repo.has_object(ObjectType::File, name, gio::Cancellable::NONE)
                    .unwrap(),
                "{name}"
            );
        }
        // What libostree reads back hashes to the name.
        for name in &names {
            let (stream, info, xattrs) = repo.load_file(name, gio::Cancellable::NONE).unwrap();
            let checksum = ostree::checksum_file_from_input(
                &info,
                Some(&xattrs),
                stream.as_ref(),
                ObjectType::File,
                gio::Cancellable::NONE,
            )
            .unwrap();
            assert_eq!(&checksum.to_hex(), name);
        }
    }
}
