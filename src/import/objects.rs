//! Writing one archive-repo object file into the open transaction. Every object is checked
//! against the checksum it is named by before it can count as staged: a file object by pivot
//! itself, before libostree writes it as trusted ([`filez`]); a metadata object by
//! libostree, except when the content it actually holds is already in the repo (libostree
//! 2022.7 then returns success with the real checksum), so the checksum libostree returns is
//! compared with the name as well.

use std::io::Read;

use anyhow::{anyhow, ensure, Context, Result};
use ostree::gio;
use ostree::glib;
use ostree::ObjectType;

use crate::fetch::image::is_checksum;

mod bare;
mod filez;
mod publish;
pub use bare::Staging;
pub use publish::Publisher;
pub(super) use filez::write_raw;

/// Objects up to this size are written from memory (on the writer threads: see
/// [`super::writers`]); larger ones are streamed.
pub(super) const IN_MEMORY_OBJECT: u64 = 1 << 20;
/// Commit, dirtree, dirmeta and detached metadata objects are small; this bounds what a hostile
/// image can make pivot hold in memory.
pub(super) const MAX_METADATA_OBJECT: u64 = 64 << 20;

/// Whether an object file was written or the repo already had it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Written,
    Skipped,
    /// Not an object pivot imports (signatures, tombstones, …).
    Ignored,
}

/// The objects a layer brought: how many were written and skipped and, when asked for, which,
/// for a resumed run to check they are still staged before it trusts a layer's record (see
/// `crate::fetch::spools`).
#[derive(Default)]
pub(super) struct Tally {
    pub written: u64,
    pub skipped: u64,
    pub names: Option<Vec<ObjectKey>>,
}

impl Tally {
    pub fn count(&mut self, checksum: &str, ext: &str, outcome: Outcome) {
        match outcome {
            Outcome::Written => self.written += 1,
            Outcome::Skipped => self.skipped += 1,
            Outcome::Ignored => return,
        }
        if let Some(names) = &mut self.names {
            names.extend(object_type(ext).and_then(|kind| ObjectKey::new(kind, checksum)));
        }
    }
}

/// An object, in 33 bytes, where tens of thousands are held (a layer in flight keeps one per
/// object it brought; a prune, one per reachable object); written as its loose name,
/// `<checksum>.<type>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ObjectKey {
    kind: u8,
    checksum: [u8; 32],
}

const KINDS: [ObjectType; 5] = [
    ObjectType::Commit,
    ObjectType::DirTree,
    ObjectType::DirMeta,
    ObjectType::File,
    ObjectType::CommitMeta,
];

impl ObjectKey {
    pub fn new(kind: ObjectType, checksum: &str) -> Option<ObjectKey> {
        let kind = KINDS.iter().position(|k| *k == kind)? as u8;
        let mut key = ObjectKey {
            kind,
            checksum: [0; 32],
        };
        hex::decode_to_slice(checksum, &mut key.checksum).ok()?;
        Some(key)
    }

    /// [`Self::new`], with an error naming `checksum` when it is not one.
    pub fn parse(kind: ObjectType, checksum: &str) -> Result<ObjectKey> {
        Self::new(kind, checksum).with_context(|| format!("{checksum:?} is not a checksum"))
    }

    pub fn kind(&self) -> ObjectType {
        KINDS[self.kind as usize]
    }

    pub fn checksum(&self) -> String {
        hex::encode(self.checksum)
    }

    pub fn sha256(&self) -> [u8; 32] {
        self.checksum
    }

    pub fn sha256_ref(&self) -> &[u8; 32] {
        &self.checksum
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = ostree::object_type_to_string(self.kind());
        write!(f, "{}.{kind}", self.checksum())
    }
}

impl serde::Serialize for ObjectKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ObjectKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.split_once('.')
            .filter(|(c, _)| is_checksum(c))
            .and_then(|(c, ext)| ObjectKey::new(object_type(ext)?, c))
            .ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not an object name")))
    }
}

/// The type of the object a loose name's extension (archive or bare) stands for; None for other
/// kinds of object (signatures, tombstones, …).
pub(crate) fn object_type(ext: &str) -> Option<ObjectType> {
    Some(match ext {
        "commit" => ObjectType::Commit,
        "dirtree" => ObjectType::DirTree,
        "dirmeta" => ObjectType::DirMeta,
        "filez" | "file" => ObjectType::File,
        "commitmeta" => ObjectType::CommitMeta,
        _ => return None,
    })
}

/// Writes the object file `entry` (of `size` bytes), named `checksum` + `.ext`: a large file
/// object streamed, anything else read into memory first.
pub(super) fn write_object(
    repo: &ostree::Repo,
    checksum: &str,
    ext: &str,
    entry: &mut impl Read,
    size: u64,
) -> Result<Outcome> {
    match object_type(ext) {
        Some(ObjectType::File) if ext == "filez" && size > IN_MEMORY_OBJECT => {
            if repo.has_object(ObjectType::File, checksum, gio::Cancellable::NONE)? {
                return Ok(Outcome::Skipped);
            }
            let actual = filez::write(repo, checksum, entry, size)?;
            matches_name(checksum, ext, &actual)?;
            Ok(Outcome::Written)
        }
        Some(ObjectType::File) if ext == "filez" => {
            write_object_bytes(repo, checksum, ext, read_all(entry, size)?)
        }
        // A bare `.file` is not what an archive repo holds.
        Some(_) if ext != "file" => {
            write_object_bytes(repo, checksum, ext, read_bounded(entry, size)?)
        }
        // Signatures, tombstones and the like carry nothing a deployment needs.
        _ => Ok(Outcome::Ignored),
    }
}

/// [`write_object`] from an input this thread owns, which a large file object is inflated,
/// hashed and written from on this thread alone (see [`filez::write_owned`]).
pub(super) fn write_object_owned(
    repo: &ostree::Repo,
    checksum: &str,
    ext: &str,
    mut input: impl Read + Send + 'static,
    size: u64,
) -> Result<Outcome> {
    if ext != "filez" || size <= IN_MEMORY_OBJECT {
        return write_object(repo, checksum, ext, &mut input, size);
    }
    if repo.has_object(ObjectType::File, checksum, gio::Cancellable::NONE)? {
        return Ok(Outcome::Skipped);
    }
    let actual = filez::write_owned(repo, checksum, input, size)?;
    matches_name(checksum, ext, &actual)?;
    Ok(Outcome::Written)
}

/// Writes the object file `checksum` + `.ext` read into memory as `data` (a file object of at
/// most [`IN_MEMORY_OBJECT`] bytes, or a metadata object).
pub(super) fn write_object_bytes(
    repo: &ostree::Repo,
    checksum: &str,
    ext: &str,
    data: Vec<u8>,
) -> Result<Outcome> {
    let objtype = match object_type(ext) {
        Some(ObjectType::CommitMeta) => {
            write_commitmeta(repo, checksum, data)?;
            return Ok(Outcome::Written);
        }
        Some(t) if ext != "file" => t,
        _ => return Ok(Outcome::Ignored),
    };
    let cancellable = gio::Cancellable::NONE;
    if repo.has_object(objtype, checksum, cancellable)? {
        return Ok(Outcome::Skipped);
    }
    let actual = if objtype == ObjectType::File {
        filez::write(repo, checksum, &mut &data[..], data.len() as u64)?
    } else {
        let data = glib::Bytes::from_owned(data);
        let variant = glib::Variant::from_bytes_with_type(&data, metadata_type(objtype));
        repo.write_metadata(objtype, Some(checksum), &variant, cancellable)
            .context("writing metadata object")?
            .to_hex()
    };
    matches_name(checksum, ext, &actual)?;
    Ok(Outcome::Written)
}

fn matches_name(checksum: &str, ext: &str, actual: &str) -> Result<()> {
    ensure!(
        actual == checksum,
        "object {checksum}.{ext} holds content whose checksum is {actual}: its content does not match its name"
    );
    Ok(())
}

fn write_commitmeta(repo: &ostree::Repo, checksum: &str, data: Vec<u8>) -> Result<()> {
    let variant = glib::Variant::from_bytes_with_type(
        &glib::Bytes::from_owned(data),
        glib::VariantTy::VARDICT,
    );
    repo.write_commit_detached_metadata(checksum, Some(&variant), gio::Cancellable::NONE)
        .context("writing detached commit metadata")
}

/// A metadata object's bytes, refusing sizes no real one has.
fn read_bounded(entry: &mut impl Read, size: u64) -> Result<Vec<u8>> {
    ensure!(
        size <= MAX_METADATA_OBJECT,
        "metadata object of {size} bytes is larger than the {MAX_METADATA_OBJECT} accepted"
    );
    read_all(entry, size)
}

fn read_all(entry: &mut impl Read, size: u64) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(size as usize);
    entry.take(size).read_to_end(&mut data)?;
    Ok(data)
}

fn metadata_type(objtype: ObjectType) -> &'static glib::VariantTy {
    let ty = match objtype {
        ObjectType::Commit => "(a{sv}aya(say)sstayay)",
        ObjectType::DirTree => "(a(say)a(sayay))",
        _ => "(uuua(ayay))",
    };
    glib::VariantTy::new(ty).expect("static variant type")
}

/// `ab/cdef….ext` → (`abcdef…`, `ext`) for a well-formed object path.
pub(crate) fn object_name(rel: &str) -> Option<(String, &str)> {
    let (prefix, file) = rel.split_once('/')?;
    let (rest, ext) = file.split_once('.')?;
    let checksum = format!("{prefix}{rest}");
    (prefix.len() == 2 && crate::fetch::image::is_checksum(&checksum)).then_some((checksum, ext))
}

/// Files up to this size are written from memory; larger ones are streamed.
const IN_MEMORY_CONTENT: u64 = 1 << 20;

/// Writes the content object a tar member holds, a symlink (to `link`) or a regular file, with
/// the given owner, permission bits and `xattrs`; returns its checksum, or None for a member of
/// another kind. With `expected`, libostree checks the content against it.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_content_member(
    repo: &ostree::Repo,
    expected: Option<&str>,
    xattrs: Option<&glib::Variant>,
    kind: tar::EntryType,
    link: Option<&[u8]>,
    (uid, gid, mode): (u32, u32, u32),
    entry: &mut tar::Entry<impl Read>,
) -> Result<Option<String>> {
    let cancellable = gio::Cancellable::NONE;
    if kind.is_symlink() {
        let target = symlink_target(link)?;
        let written = repo
            .write_symlink(expected, uid, gid, xattrs, target, cancellable)
            .context("writing symlink object")?;
        return Ok(Some(written.to_string()));
    }
    if !(kind.is_file() || kind.is_contiguous()) {
        return Ok(None);
    }
    let size = entry.size();
    let mode = libc::S_IFREG | mode;
    if size > IN_MEMORY_CONTENT {
        return write_regfile_streamed(repo, expected, uid, gid, mode, size, xattrs, entry)
            .map(Some);
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.take(size).read_to_end(&mut data)?;
    ensure!(data.len() as u64 == size, "the file is cut short");
    let written = repo
        .write_regfile_inline(expected, uid, gid, mode, xattrs, &data, cancellable)
        .context("writing file object")?;
    Ok(Some(written.to_string()))
}

/// A symlink member's target, as libostree takes it.
pub(super) fn symlink_target(link: Option<&[u8]>) -> Result<&str> {
    let target = link.ok_or_else(|| anyhow!("a symlink without a target"))?;
    let target = std::str::from_utf8(target).context("the symlink target is not UTF-8")?;
    ensure!(!target.contains('\0'), "the symlink target contains a NUL");
    Ok(target)
}

/// Writes an empty root-owned 0644 file (a whiteout marker); returns its checksum.
pub(super) fn write_empty_file(repo: &ostree::Repo) -> Result<String> {
    let written = repo
        .write_regfile_inline(
            None,
            0,
            0,
            libc::S_IFREG | 0o644,
            None,
            &[],
            gio::Cancellable::NONE,
        )
        .context("writing an empty file object")?;
    Ok(written.to_string())
}

/// Streams a regular file's content into libostree's writer in chunks, so memory stays bounded
/// whatever the file's size; returns the object's checksum. With `expected`, libostree checks the
/// content against it as it finishes.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_regfile_streamed(
    repo: &ostree::Repo,
    expected: Option<&str>,
    uid: u32,
    gid: u32,
    mode: u32,
    size: u64,
    xattrs: Option<&glib::Variant>,
    entry: &mut impl Read,
) -> Result<String> {
    use ostree::gio::prelude::OutputStreamExtManual;
    let cancellable = gio::Cancellable::NONE;
    let writer = repo
        .write_regfile(expected, uid, gid, mode, size, xattrs)
        .context("writing file object")?;
    let mut buf = vec![0u8; 128 * 1024];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(left as usize);
        let n = entry.read(&mut buf[..want])?;
        ensure!(n > 0, "the file is cut short");
        let (_, partial) = writer
            .write_all(&buf[..n], cancellable)
            .context("writing file object")?;
        if let Some(e) = partial {
            return Err(anyhow!(e).context("writing file object"));
        }
        left -= n as u64;
    }
    Ok(writer
        .finish(cancellable)
        .context("writing file object")?
        .to_string())
}

#[cfg(test)]
pub(super) mod tests;
