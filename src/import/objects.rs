//! Writing one archive-repo object file into the open transaction. Every object is checked
//! against the checksum it is named by before it can count as staged: a file object held in
//! memory by pivot itself, before libostree writes it as trusted ([`write_filez_verified`]);
//! anything else by libostree, except when the content it actually holds is already in the repo
//! (libostree 2022.7 then returns success with the real checksum), so the checksum libostree
//! returns is compared with the name as well.
// unsafe: libostree calls the Rust bindings do not offer.
#![allow(unsafe_code)]

use std::io::Read;
use std::ptr;

use anyhow::{anyhow, ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::{InputStreamExtManual, IsA};
use ostree::glib;
use ostree::glib::translate::{from_glib_full, ToGlibPtr};
use ostree::ObjectType;
use sha2::{Digest, Sha256};

use crate::fetch::image::is_checksum;

use super::stream::{ChunkReader, STREAM_CHUNK};

/// Objects up to this size are written from memory (on the writer threads: see
/// [`super::writers`]); larger ones are streamed.
pub(super) const IN_MEMORY_OBJECT: u64 = 1 << 20;
/// Commit, dirtree, dirmeta and detached metadata objects are small; this bounds what a hostile
/// image can make pivot hold in memory.
pub(super) const MAX_METADATA_OBJECT: u64 = 64 << 20;
/// The largest content stream of an in-memory file object that pivot inflates and checks itself
/// ([`write_filez_verified`]); two writer threads hold at most this much each.
const VERIFIED_IN_MEMORY: u64 = 2 << 20;

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
            let actual = write_filez_streaming(repo, checksum, entry, size)?;
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
    let size = data.len() as u64;
    let data = glib::Bytes::from_owned(data);
    let actual = if objtype == ObjectType::File {
        write_filez_verified(repo, checksum, &data, size)?
    } else {
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

/// Writes an archive-z2 "filez" object (a header, then zlib-compressed content) with libostree
/// checking it hashes to `checksum`; returns the checksum libostree computed.
fn write_filez(
    repo: &ostree::Repo,
    checksum: &str,
    input: &impl IsA<gio::InputStream>,
    size: u64,
) -> Result<String> {
    let (stream, length) = content_stream(input, size)?;
    write_checked(repo, checksum, &stream, length)
}

/// The content stream of an archive-z2 "filez" object of `size` bytes read from `input` (the
/// length-prefixed header, then the content, inflated as it is read) and its length.
fn content_stream(
    input: &impl IsA<gio::InputStream>,
    size: u64,
) -> Result<(gio::InputStream, u64)> {
    let (content, info, xattrs) =
        parse_content_stream(input, size).context("parsing archived file object")?;
    raw_file_to_content_stream(content.as_ref(), &info, xattrs.as_ref())
        .context("reading archived file object")
}

/// Writes a content stream with libostree checking it hashes to `checksum`; returns the checksum
/// libostree computed.
fn write_checked(
    repo: &ostree::Repo,
    checksum: &str,
    stream: &gio::InputStream,
    length: u64,
) -> Result<String> {
    let written = repo
        .write_content(Some(checksum), stream, length, gio::Cancellable::NONE)
        .context("writing file object")?;
    Ok(written.to_hex())
}

/// Writes an archive-z2 "filez" object held in memory, checked here instead of by libostree.
///
/// An object's name is the SHA-256 of its content stream (the length-prefixed header, then the
/// content). Debian's libostree 2022.7 hashes with GLib's plain-C SHA-256, a third of a
/// large-file import's CPU (docs/benchmark.md); here the inflated stream is hashed with the CPU's
/// SHA instructions, compared with the name, and only then written, as trusted, which libostree
/// does not hash. Before the write, never after: a resumed run reuses the transaction's staging
/// directory and trusts what it holds. A stream over [`VERIFIED_IN_MEMORY`] bytes takes
/// libostree's own checked write, so memory stays bounded whatever the object inflates to.
fn write_filez_verified(
    repo: &ostree::Repo,
    checksum: &str,
    data: &glib::Bytes,
    size: u64,
) -> Result<String> {
    let input = gio::MemoryInputStream::from_bytes(data);
    let (stream, length) = content_stream(&input, size)?;
    if length > VERIFIED_IN_MEMORY {
        return write_checked(repo, checksum, &stream, length);
    }
    let mut bytes = Vec::with_capacity(length as usize);
    stream
        .into_read()
        .take(length)
        .read_to_end(&mut bytes)
        .context("inflating archived file object")?;
    ensure!(
        bytes.len() as u64 == length,
        "archived file object {checksum}.filez ends {} bytes early",
        length - bytes.len() as u64
    );
    let actual = hex::encode(Sha256::digest(&bytes));
    matches_name(checksum, "filez", &actual)?;
    let verified = gio::MemoryInputStream::from_bytes(&glib::Bytes::from_owned(bytes));
    repo.write_content_trusted(checksum, &verified, length, gio::Cancellable::NONE)
        .context("writing file object")?;
    Ok(actual)
}

/// `ostree_content_stream_parse()`. The ostree bindings return its content stream as an object,
/// but for a symlink it is NULL; here it is an `Option`.
fn parse_content_stream(
    input: &impl IsA<gio::InputStream>,
    size: u64,
) -> Result<
    (
        Option<gio::InputStream>,
        gio::FileInfo,
        Option<glib::Variant>,
    ),
    glib::Error,
> {
    // SAFETY: plain out-parameters of a C function, each owned (transfer full) on success.
    unsafe {
        let mut content = ptr::null_mut();
        let mut info = ptr::null_mut();
        let mut xattrs = ptr::null_mut();
        let mut error = ptr::null_mut();
        let ok = ostree::ffi::ostree_content_stream_parse(
            glib::ffi::GTRUE,
            input.as_ref().to_glib_none().0,
            size,
            glib::ffi::GFALSE,
            &mut content,
            &mut info,
            &mut xattrs,
            ptr::null_mut(),
            &mut error,
        );
        if ok == glib::ffi::GFALSE || info.is_null() {
            let content: Option<gio::InputStream> = from_glib_full(content);
            let xattrs: Option<glib::Variant> = from_glib_full(xattrs);
            drop((content, xattrs));
            return Err(if error.is_null() {
                glib::Error::new(gio::IOErrorEnum::Failed, "no file info in file object")
            } else {
                from_glib_full(error)
            });
        }
        Ok((
            from_glib_full(content),
            from_glib_full(info),
            from_glib_full(xattrs),
        ))
    }
}

/// `ostree_raw_file_to_content_stream()`, taking a symlink's absent content stream as `None`.
fn raw_file_to_content_stream(
    content: Option<&gio::InputStream>,
    info: &gio::FileInfo,
    xattrs: Option<&glib::Variant>,
) -> Result<(gio::InputStream, u64), glib::Error> {
    // SAFETY: arguments are borrowed for the call; the out stream is owned on success.
    unsafe {
        let mut stream = ptr::null_mut();
        let mut length = 0u64;
        let mut error = ptr::null_mut();
        let ok = ostree::ffi::ostree_raw_file_to_content_stream(
            content.to_glib_none().0,
            info.to_glib_none().0,
            xattrs.to_glib_none().0,
            &mut stream,
            &mut length,
            ptr::null_mut(),
            &mut error,
        );
        if ok == glib::ffi::GFALSE || stream.is_null() {
            return Err(if error.is_null() {
                glib::Error::new(gio::IOErrorEnum::Failed, "no content stream")
            } else {
                from_glib_full(error)
            });
        }
        Ok((from_glib_full(stream), length))
    }
}

/// A large file object streams from the tar member to libostree through a small channel, so
/// memory stays bounded whatever the file's size: libostree reads on a helper thread while this
/// one feeds it.
fn write_filez_streaming(
    repo: &ostree::Repo,
    checksum: &str,
    entry: &mut impl Read,
    size: u64,
) -> Result<String> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
    std::thread::scope(|scope| {
        let repo = repo.clone();
        let writer = scope.spawn(move || {
            let input = gio::ReadInputStream::new(ChunkReader::new(rx));
            write_filez(&repo, checksum, &input, size)
        });
        let mut fed = Ok(());
        loop {
            let mut chunk = vec![0; STREAM_CHUNK];
            match entry.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    chunk.truncate(n);
                    // The writer stopped early (it failed): its error says why.
                    if tx.send(chunk).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    fed = Err(anyhow!(e));
                    break;
                }
            }
        }
        drop(tx);
        let written = writer
            .join()
            .map_err(|_| anyhow!("the object writer panicked"))?;
        match (fed, written) {
            (Err(e), _) => Err(e),
            (Ok(()), written) => written,
        }
    })
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
        let target = link.ok_or_else(|| anyhow!("a symlink without a target"))?;
        let target = std::str::from_utf8(target).context("the symlink target is not UTF-8")?;
        ensure!(!target.contains('\0'), "the symlink target contains a NUL");
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
mod tests;
