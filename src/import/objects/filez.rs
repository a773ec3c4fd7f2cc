//! Archive-repo file objects ("filez": a header, then the content deflated), checked by pivot
//! and written by libostree as trusted.
//!
//! An object's name is the SHA-256 of its content stream: the length-prefixed file header, then
//! the content. pivot reads the archive header with libostree (which builds the header the name
//! covers), inflates the content itself (zlib-rs, through flate2), hashes the stream with the
//! CPU's SHA instructions and hands it to `ostree_repo_write_content_trusted`, which neither
//! inflates nor hashes. Debian's libostree 2022.7 would hash with GLib's plain-C SHA-256 and
//! inflate through GIO's converter streams; on a tree of large files that was one saturated
//! thread and most of the import's time (docs/benchmark.md).
//!
//! The check comes before the object can land, never after: a resumed run reuses the
//! transaction's staging directory and trusts what it holds. A stream of up to
//! [`IN_MEMORY_STREAM`] is hashed whole before libostree sees it. A longer one is inflated on
//! this thread and written on another, which hashes each chunk as it arrives ([`Checked`]):
//! libostree reads exactly the stream's length and links the object into the staging directory
//! only after its last byte, and the read that would hand over the last chunk fails instead
//! when the hash does not match the name, so libostree drops its anonymous temporary file.
//! Inflating and hashing on two threads keeps a tree of large files from waiting on one core;
//! memory stays bounded by the chunks in flight.
//!
//! An ostree-native layer's content object ([`write_raw`]) takes the same path: its header is
//! built from the tar member's owner, mode and the layer's xattrs, its content is the member's
//! bytes as they are. There libostree's own check hashed every byte with GLib's SHA-256 again,
//! a tenth of a native import's CPU time. A native regular file held in memory is then written
//! by pivot itself where it can be, not by libostree ([`super::bare`]).
// unsafe: libostree calls the Rust bindings do not offer.
#![allow(unsafe_code)]

use std::io::{Cursor, Read};
use std::ptr;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, OnceLock};

use anyhow::{anyhow, bail, ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::{Cast, InputStreamExtManual, IsA};
use ostree::glib;
use ostree::glib::translate::{from_glib_full, ToGlibPtr};
use sha2::{Digest, Sha256};

use super::super::stream::{fill, ChunkReader, STREAM_CHUNK};
use super::bare::Staging;
use super::matches_name;

/// The largest content stream that is inflated whole in memory and hashed before libostree sees
/// it; two writer threads hold at most this much each.
const IN_MEMORY_STREAM: u64 = 2 << 20;
/// Chunks buffered between the inflating thread and libostree's writer.
const CHUNKS_AHEAD: usize = 8;
/// The largest archive file header accepted: owner, mode and extended attributes take a few
/// hundred bytes (ext4 keeps an inode's xattrs in one block); this bounds what a hostile object
/// makes pivot hold.
const MAX_FILE_HEADER: u64 = 1 << 20;

/// Writes the file object `checksum` read from `input`, an archive-z2 object of `size` bytes,
/// having checked that its content stream hashes to the name; returns the checksum. A long
/// stream is inflated on this thread and hashed and written on another.
pub(super) fn write(
    repo: &ostree::Repo,
    checksum: &str,
    input: &mut impl Read,
    size: u64,
) -> Result<String> {
    let stream = ContentStream::open(input, size)?;
    let length = stream.length;
    if length <= IN_MEMORY_STREAM {
        write_in_memory(repo, checksum, Source::Archived, stream, length)
    } else {
        write_streamed(repo, checksum, Source::Archived, stream, length)
    }
}

/// [`write()`] from an input this thread owns: a long stream is inflated, hashed and written here,
/// libostree pulling it through the check. A writer of the pool streams objects this way, the
/// pool spreading objects over the cores instead of one object over two threads.
pub(super) fn write_owned(
    repo: &ostree::Repo,
    checksum: &str,
    input: impl Read + Send + 'static,
    size: u64,
) -> Result<String> {
    let stream = ContentStream::open(input, size)?;
    let length = stream.length;
    if length <= IN_MEMORY_STREAM {
        return write_in_memory(repo, checksum, Source::Archived, stream, length);
    }
    let checked = Checked::new(stream, length, checksum, Source::Archived);
    let (actual, failure) = (checked.actual.clone(), checked.failure.clone());
    let written = repo.write_content_trusted(
        checksum,
        &gio::ReadInputStream::new(checked),
        length,
        gio::Cancellable::NONE,
    );
    if let Some(why) = failure.get() {
        bail!("{why}");
    }
    written_and_checked(checksum, Source::Archived, written, actual.get())
}

/// A file object read as its content stream: the file header the object's name covers, then
/// the content (an archive-z2 object's inflated as it is read, a native one's as it is).
struct ContentStream<C: Read> {
    header: Cursor<Vec<u8>>,
    /// None for a symlink, whose target is in the header.
    content: Option<std::io::Take<C>>,
    length: u64,
}

impl<R: Read> ContentStream<flate2::read::DeflateDecoder<R>> {
    fn open(mut input: R, size: u64) -> Result<Self> {
        let mut raw = vec![0; 8];
        input
            .read_exact(&mut raw)
            .context("reading archived file object's header")?;
        let header_size = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as u64;
        ensure!(
            header_size <= MAX_FILE_HEADER && header_size + 8 <= size,
            "archived file object's header of {header_size} bytes is larger than the object or the {MAX_FILE_HEADER} accepted"
        );
        raw.resize(8 + header_size as usize, 0);
        input
            .read_exact(&mut raw[8..])
            .context("reading archived file object's header")?;
        let raw = gio::MemoryInputStream::from_bytes(&glib::Bytes::from_owned(raw));
        let (_, info, xattrs) =
            parse_content_stream(&raw, size).context("parsing archived file object")?;
        let regular = info.file_type() == gio::FileType::Regular;
        let inflated = regular.then(|| flate2::read::DeflateDecoder::new(input));
        let stream = ContentStream::new(&info, xattrs.as_ref(), inflated)
            .context("reading archived file object")?;
        let content_size = stream
            .length
            .saturating_sub(stream.header.get_ref().len() as u64);
        ensure!(
            regular || content_size == 0,
            "archived symlink object declares {content_size} bytes of content"
        );
        Ok(stream)
    }
}

impl<C: Read> ContentStream<C> {
    /// The stream of a file described by `info` (its size being the content's) with `xattrs`,
    /// `content` read as it is.
    fn new(
        info: &gio::FileInfo,
        xattrs: Option<&glib::Variant>,
        content: Option<C>,
    ) -> Result<Self, glib::Error> {
        let regular = info.file_type() == gio::FileType::Regular;
        // The header the name covers, as libostree builds it: the stream with no content.
        let empty = regular.then(gio::MemoryInputStream::new);
        let (stream, length) =
            raw_file_to_content_stream(empty.as_ref().map(|s| s.upcast_ref()), info, xattrs)?;
        let mut header = Vec::new();
        stream
            .into_read()
            .take(2 * MAX_FILE_HEADER)
            .read_to_end(&mut header)
            .map_err(|e| glib::Error::new(gio::IOErrorEnum::Failed, &e.to_string()))?;
        let content_size = length.saturating_sub(header.len() as u64);
        Ok(ContentStream {
            header: Cursor::new(header),
            content: content.filter(|_| regular).map(|c| c.take(content_size)),
            length,
        })
    }
}

/// Writes the content object `checksum` of an ostree-native layer: a regular file of `size`
/// bytes read from `content` or, with `symlink`, a symlink to it; owned by `uid`:`gid` with the
/// permission bits of `mode` and `xattrs`. Its stream is checked against the name before the
/// object can land, as an archived one's; returns the checksum. A regular file held in memory
/// is written into `staging` when there is one, without libostree.
pub(in crate::import) fn write_raw(
    (repo, staging): (&ostree::Repo, Option<&Staging>),
    checksum: &str,
    (uid, gid, mode): (u32, u32, u32),
    symlink: Option<&str>,
    xattrs: &glib::Variant,
    content: &mut impl Read,
    size: u64,
) -> Result<String> {
    let info = gio::FileInfo::new();
    // As libostree describes a file it writes (`_ostree_mode_uidgid_to_gfileinfo`); a symlink's
    // mode is always 0777 (`ostree_repo_write_symlink`).
    let (kind, mode) = match symlink {
        Some(target) => {
            info.set_symlink_target(target);
            (gio::FileType::SymbolicLink, libc::S_IFLNK | 0o777)
        }
        None => {
            info.set_size(i64::try_from(size).context("file size out of range")?);
            (gio::FileType::Regular, libc::S_IFREG | (mode & 0o7777))
        }
    };
    info.set_file_type(kind);
    info.set_is_symlink(symlink.is_some());
    info.set_attribute_uint32("unix::uid", uid);
    info.set_attribute_uint32("unix::gid", gid);
    info.set_attribute_uint32("unix::mode", mode);
    let content = symlink.is_none().then_some(content);
    let stream = ContentStream::new(&info, Some(xattrs), content).context("writing file object")?;
    let length = stream.length;
    match staging {
        // A regular file pivot writes itself (see `super::bare`).
        Some(staging) if symlink.is_none() && length <= IN_MEMORY_STREAM => {
            let header = stream.header.get_ref().len();
            let bytes = read_checked(checksum, Source::Raw, stream, length)?;
            staging
                .write_file(checksum, (uid, gid, mode), xattrs, &bytes[header..])
                .context("writing file object")?;
            Ok(checksum.to_string())
        }
        _ if length <= IN_MEMORY_STREAM => {
            write_in_memory(repo, checksum, Source::Raw, stream, length)
        }
        _ => write_streamed(repo, checksum, Source::Raw, stream, length),
    }
}

/// Where a content stream comes from, as errors name it.
#[derive(Clone, Copy)]
enum Source {
    /// An archive-z2 object (`.filez`), inflated.
    Archived,
    /// A native layer's object (`.file`), as it is.
    Raw,
}

impl Source {
    fn ext(self) -> &'static str {
        match self {
            Source::Archived => "filez",
            Source::Raw => "file",
        }
    }

    fn reading(self) -> &'static str {
        match self {
            Source::Archived => "inflating archived file object",
            Source::Raw => "reading file object",
        }
    }

    fn object(self) -> &'static str {
        match self {
            Source::Archived => "archived file object",
            Source::Raw => "file object",
        }
    }
}

impl<C: Read> Read for ContentStream<C> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.header.read(buf)? {
            0 => self.content.as_mut().map_or(Ok(0), |c| c.read(buf)),
            n => Ok(n),
        }
    }
}

fn write_in_memory(
    repo: &ostree::Repo,
    checksum: &str,
    source: Source,
    stream: impl Read,
    length: u64,
) -> Result<String> {
    let bytes = read_checked(checksum, source, stream, length)?;
    let verified = gio::MemoryInputStream::from_bytes(&glib::Bytes::from_owned(bytes));
    repo.write_content_trusted(checksum, &verified, length, gio::Cancellable::NONE)
        .context("writing file object")?;
    Ok(checksum.to_string())
}

/// The content stream of `length` bytes read whole, once it hashes to `checksum`.
fn read_checked(
    checksum: &str,
    source: Source,
    mut stream: impl Read,
    length: u64,
) -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(length as usize);
    (&mut stream)
        .take(length)
        .read_to_end(&mut bytes)
        .context(source.reading())?;
    ends_early(checksum, source, bytes.len() as u64, length)?;
    let actual = hex::encode(Sha256::digest(&bytes));
    matches_name(checksum, source.ext(), &actual)?;
    Ok(bytes)
}

fn write_streamed(
    repo: &ostree::Repo,
    checksum: &str,
    source: Source,
    stream: impl Read,
    length: u64,
) -> Result<String> {
    let (tx, rx) = sync_channel::<Vec<u8>>(CHUNKS_AHEAD);
    std::thread::scope(|scope| {
        let repo = repo.clone();
        let writer = std::thread::Builder::new()
            .name("pivot-object".into())
            .spawn_scoped(scope, move || {
                let checked = Checked::new(ChunkReader::new(rx), length, checksum, source);
                let actual = checked.actual.clone();
                let input = gio::ReadInputStream::new(checked);
                let written =
                    repo.write_content_trusted(checksum, &input, length, gio::Cancellable::NONE);
                (written, actual.get().cloned())
            })
            .map_err(|e| anyhow!("starting an object writer thread: {e}"))?;
        // Inflates the stream and sends it on; the writer's side hashes it.
        let sent = (|| -> Result<()> {
            let mut input = stream.take(length);
            let mut read = 0u64;
            while read < length {
                let mut chunk = vec![0; STREAM_CHUNK];
                let n = fill(&mut input, &mut chunk).context(source.reading())?;
                if n == 0 {
                    ends_early(checksum, source, read, length)?;
                }
                chunk.truncate(n);
                read += n as u64;
                if tx.send(chunk).is_err() {
                    break; // The writer failed: its error says why.
                }
            }
            Ok(())
        })();
        // Short of the last chunk, libostree reads an early end and writes nothing.
        drop(tx);
        let (written, actual) = writer
            .join()
            .map_err(|_| anyhow!("the object writer panicked"))?;
        sent?;
        written_and_checked(checksum, source, written, actual.as_ref())
    })
}

/// The outcome of libostree's write of a checked stream: a mismatch is what made its read fail,
/// if it failed.
fn written_and_checked(
    checksum: &str,
    source: Source,
    written: Result<(), glib::Error>,
    actual: Option<&String>,
) -> Result<String> {
    if let Some(actual) = actual {
        matches_name(checksum, source.ext(), actual)?;
    }
    written.context("writing file object")?;
    actual
        .cloned()
        .context("the object writer did not read the whole object")
}

/// The stream libostree's writer reads: `inner` in chunks, hashed as they are read. When the
/// last one is read the hash is complete, and on a mismatch the read fails before any of the
/// last chunk's bytes are handed over.
struct Checked<R> {
    inner: R,
    current: Vec<u8>,
    pos: usize,
    hasher: Sha256,
    left: u64,
    /// The stream's checksum, once all of it was read.
    actual: Arc<OnceLock<String>>,
    /// Why reading `inner` failed, if it did: GIO passes on only the kind of a Rust reader's
    /// error, libostree's message then says little.
    failure: Arc<OnceLock<String>>,
    expected: String,
    source: Source,
}

impl<R: Read> Checked<R> {
    fn new(inner: R, length: u64, expected: &str, source: Source) -> Checked<R> {
        Checked {
            inner,
            current: Vec::with_capacity(STREAM_CHUNK),
            pos: 0,
            hasher: Sha256::new(),
            left: length,
            actual: Arc::default(),
            failure: Arc::default(),
            expected: expected.to_owned(),
            source,
        }
    }

    fn fail(&self, why: String) -> std::io::Error {
        let _ = self.failure.set(why.clone());
        std::io::Error::other(why)
    }
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.current.len() {
            if self.left == 0 {
                return Ok(0);
            }
            self.current.resize(STREAM_CHUNK.min(self.left as usize), 0);
            let n = fill(&mut self.inner, &mut self.current)
                .map_err(|e| self.fail(format!("{}: {e}", self.source.reading())))?;
            self.current.truncate(n);
            self.pos = 0;
            if n == 0 {
                let left = self.left;
                return Err(self.fail(format!(
                    "{}: it ends {left} bytes early",
                    self.source.reading()
                )));
            }
            self.left -= n as u64;
            self.hasher.update(&self.current);
            if self.left == 0 {
                let actual = hex::encode(std::mem::take(&mut self.hasher).finalize());
                let matches = actual == self.expected;
                let _ = self.actual.set(actual);
                if !matches {
                    return Err(std::io::Error::other("its content does not match its name"));
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn ends_early(checksum: &str, source: Source, read: u64, length: u64) -> Result<()> {
    ensure!(
        read == length,
        "{} {checksum}.{} ends {} bytes early",
        source.object(),
        source.ext(),
        length - read
    );
    Ok(())
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
