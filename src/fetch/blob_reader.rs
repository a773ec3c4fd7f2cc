//! A blocking `Read` over a layer blob that the async runtime downloads ahead of it, resuming
//! with HTTP Range requests after transient faults (within the retry budget, counted from the
//! last byte that arrived), or that a blocking task reads from an OCI layout; either way it
//! checks the blob's size and sha256 digest itself: the reader reports end-of-file only for a
//! blob that verified, so a consumer that reads to the end has verified data.
//!
//! With a spool file, every byte received is also appended to it; a later run (after this one was
//! killed) replays the spool and downloads only the rest. Spooled bytes are trusted no more than
//! fresh ones: they are hashed with the rest.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use bytes::Bytes;
use futures_util::StreamExt;
use oci_client::manifest::OciDescriptor;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::fetch::layout::Layout;
use crate::node::progress::Progress;
use crate::fetch::registry::{size_mismatch, too_long, Registry};
use crate::fetch::sha256_state::Sha256State;
use crate::fetch::source::Source;

/// Chunks buffered ahead of the consumer: bounds memory to a few MiB per layer.
const CHANNEL_DEPTH: usize = 32;
/// The largest piece sent through the channel: with [`CHANNEL_DEPTH`], at most 2 MiB ahead.
const PIECE: usize = 64 << 10;

/// How far a blob was read and its digest state there, to resume hashing from.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BlobMark {
    pub read: u64,
    pub hash: Sha256State,
}

/// A layer blob as the decompressor reads it: where it is, when that can be resumed from.
pub trait Blob: Read + Send {
    fn mark(&self) -> Option<BlobMark> {
        None
    }
}

impl Blob for &[u8] {}

impl<B: Blob + ?Sized> Blob for &mut B {
    fn mark(&self) -> Option<BlobMark> {
        (**self).mark()
    }
}

/// Where a resumed read starts: the spool from byte `from` (the bytes before it are gone), the
/// digest state `mark` (at or after `from`: the bytes in between are passed on unhashed).
pub struct Resume {
    pub from: u64,
    pub mark: BlobMark,
}

pub struct BlobReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
    replay: Option<File>,
    spool: Option<File>,
    hasher: Sha256State,
    /// Bytes before this offset are in `hasher` already (of a resumed read).
    hashed_to: u64,
    read: u64,
    size: u64,
    digest: String,
    done: bool,
    /// Bytes that came from the network in this run.
    pub downloaded: u64,
    progress: Option<(Progress, usize)>,
}

impl BlobReader {
    /// Starts fetching `desc` (after what `spool` already holds) on `runtime`; with `resume`,
    /// reads from its offset on (its spool must reach its mark).
    pub fn open(
        runtime: &Handle,
        source: &Source,
        desc: &OciDescriptor,
        spool: Option<&Path>,
        resume: Option<Resume>,
    ) -> io::Result<BlobReader> {
        let size = u64::try_from(desc.size)
            .map_err(|_| io::Error::other(format!("blob {} has a negative size", desc.digest)))?;
        let from = resume.as_ref().map_or(0, |r| r.from);
        // A checkpoint vouches for the spool only up to the bytes it had read: those were
        // synced before it was written (see `crate::fetch::spool_writer`); what follows may not
        // have reached the disk whole before a power cut, so it is fetched again.
        let trusted = resume.as_ref().map(|r| r.mark.read);
        let (replay, spool, offset) = match spool {
            Some(path) => open_spool(path, size, from, trusted)?,
            None => (None, None, 0),
        };
        let (hasher, hashed_to) = match resume {
            Some(r) if r.mark.hash.is_sound() && r.mark.read <= offset && r.from <= r.mark.read => {
                (r.mark.hash, r.mark.read)
            }
            Some(_) => {
                return Err(io::Error::other(
                    "the checkpoint does not match the download kept",
                ))
            }
            None => (Sha256State::default(), 0),
        };
        if offset > 0 {
            tracing::info!("resuming {} at byte {offset} of {size}", desc.digest);
        }
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        match source {
            Source::Registry(registry) => {
                runtime.spawn(forward(
                    (**registry).clone(),
                    desc.clone(),
                    offset,
                    size,
                    tx,
                ));
            }
            Source::Layout(layout) => {
                let (layout, desc) = (layout.clone(), desc.clone());
                // Nothing is spooled from a layout (the blob is on disk already).
                runtime.spawn_blocking(move || read_layout_blob(&layout, &desc, tx));
            }
        }
        Ok(BlobReader {
            rx,
            current: Bytes::new(),
            replay,
            spool,
            hasher,
            hashed_to,
            read: from,
            size,
            digest: desc.digest.clone(),
            done: false,
            downloaded: 0,
            progress: None,
        })
    }

    /// Reports bytes read as layer `index` of `progress`.
    pub fn with_progress(mut self, progress: Progress, index: usize) -> BlobReader {
        // A resumed read starts past the bytes an earlier run took.
        progress.present(index, self.read);
        self.progress = Some((progress, index));
        self
    }

    fn finish(&mut self) -> io::Result<usize> {
        self.done = true;
        if self.read != self.size {
            return Err(io::Error::other(format!(
                "blob {} ended after {} of its {} bytes",
                self.digest, self.read, self.size
            )));
        }
        let actual = format!("sha256:{}", self.hasher.hex());
        if actual != self.digest {
            return Err(io::Error::other(format!(
                "digest mismatch: expected {}, got {actual}",
                self.digest
            )));
        }
        Ok(0)
    }

    /// Hands `chunk` to the reader: `fetched` by this run, or replayed from the spool an
    /// earlier run kept.
    fn take(&mut self, buf: &mut [u8], chunk: &[u8], fetched: bool) -> io::Result<usize> {
        if self.read + chunk.len() as u64 > self.size {
            self.done = true;
            return Err(io::Error::other(
                too_long(&self.digest, self.size).to_string(),
            ));
        }
        buf[..chunk.len()].copy_from_slice(chunk);
        let unhashed = self
            .hashed_to
            .saturating_sub(self.read)
            .min(chunk.len() as u64);
        self.hasher.update(&chunk[unhashed as usize..]);
        self.read += chunk.len() as u64;
        if let Some((progress, index)) = &self.progress {
            match fetched {
                true => progress.bytes(*index, chunk.len() as u64),
                false => progress.present(*index, chunk.len() as u64),
            }
        }
        Ok(chunk.len())
    }
}

impl Blob for BlobReader {
    fn mark(&self) -> Option<BlobMark> {
        Some(BlobMark {
            read: self.read,
            hash: self.hasher.clone(),
        })
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if let Some(replay) = &mut self.replay {
            let mut tmp = vec![0; buf.len().min(1 << 16)];
            let n = replay.read(&mut tmp)?;
            if n > 0 {
                return self.take(buf, &tmp[..n], false);
            }
            self.replay = None;
        }
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    if let Some(spool) = &mut self.spool {
                        spool.write_all(&chunk)?;
                    }
                    self.downloaded += chunk.len() as u64;
                    self.current = chunk;
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                None => return self.finish(),
            }
        }
        let n = buf.len().min(self.current.len());
        let chunk = self.current.split_to(n);
        self.take(buf, &chunk, true)
    }
}

/// Opens `path` for replay from byte `from` and append; a spool longer than the blob, or one
/// whose bytes before `from` are gone while `from` is 0, is discarded. Spools hold image content
/// that is not yet in the repo: the file is 0600 and its directory 0700.
fn open_spool(
    path: &Path,
    size: u64,
    from: u64,
    trusted: Option<u64>,
) -> io::Result<(Option<File>, Option<File>, u64)> {
    if let Some(dir) = path.parent() {
        crate::node::state::private_dir(dir).map_err(io::Error::other)?;
    }
    let mut existing = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if let Some(trusted) = trusted.filter(|t| *t < existing) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len(trusted)?;
        existing = trusted;
    }
    let keep = existing <= size && (from > 0 || starts_with_data(path));
    let writer = std::fs::OpenOptions::new()
        .create(true)
        .append(keep)
        .write(true)
        .truncate(!keep)
        .mode(0o600)
        .open(path)?;
    let private = std::fs::Permissions::from_mode(0o600);
    if writer.metadata()?.permissions().mode() & 0o777 != 0o600 {
        writer.set_permissions(private)?;
    }
    if !keep || existing == 0 {
        return Ok((None, Some(writer), 0));
    }
    let mut replay = File::open(path)?;
    std::io::Seek::seek(&mut replay, std::io::SeekFrom::Start(from))?;
    Ok((Some(replay), Some(writer), existing))
}

/// Frees the first `end` bytes of the spool at `path` (punches them out; the file keeps its
/// length, so a later run still knows where the download stopped).
pub(crate) fn free_before(path: &Path, end: u64) -> io::Result<()> {
    if end == 0 {
        return Ok(());
    }
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let punch = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
    let end = i64::try_from(end).map_err(io::Error::other)?;
    nix::fcntl::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), punch, 0, end)?;
    Ok(())
}

/// Whether the file's first byte is data, not a hole punched behind an import (see
/// `crate::fetch::spools`): only then can it be replayed from its start. Empty files count as data.
fn starts_with_data(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return true;
    };
    match nix::unistd::lseek(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        0,
        nix::unistd::Whence::SeekData,
    ) {
        Ok(offset) => offset == 0,
        // ENXIO: no data at all (empty, or all hole).
        Err(nix::errno::Errno::ENXIO) => file.metadata().map(|m| m.len() == 0).unwrap_or(false),
        Err(_) => true,
    }
}

/// Reads the blob from a layout into `tx`, in [`PIECE`]s.
fn read_layout_blob(layout: &Layout, desc: &OciDescriptor, tx: mpsc::Sender<io::Result<Bytes>>) {
    let mut blob = match layout.open_blob(desc) {
        Ok(blob) => blob,
        Err(e) => {
            let _ = tx.blocking_send(Err(io::Error::other(format!("{e:#}"))));
            return;
        }
    };
    loop {
        let mut piece = vec![0; PIECE];
        let item = match blob.read(&mut piece) {
            Ok(0) => return,
            Ok(n) => {
                piece.truncate(n);
                Ok(Bytes::from(piece))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
        let failed = item.is_err();
        if tx.blocking_send(item).is_err() || failed {
            return; // The reader gave up, or was told why this one cannot go on.
        }
    }
}

/// Downloads the blob from `offset` into `tx`, resuming after transient faults.
async fn forward(
    registry: Registry,
    desc: OciDescriptor,
    mut offset: u64,
    size: u64,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let policy = *registry.retry_policy();
    let mut attempt = 0;
    let mut progress = std::time::Instant::now();
    // What the registry asked for when it refused the last request (`Retry-After`).
    let mut asked = None;
    while offset < size {
        let failure = match registry.blob_from(&desc, offset).await {
            Ok(blob) if blob.remaining.is_some_and(|n| n != size - offset) => {
                let announced = blob.remaining.unwrap_or_default();
                let refusal = size_mismatch(&desc.digest, announced, offset, size);
                let _ = tx.send(Err(io::Error::other(refusal.to_string()))).await;
                return;
            }
            Ok(blob) => {
                let mut stream = blob.stream;
                let mut failure = None;
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(mut chunk) => {
                            offset += chunk.len() as u64;
                            attempt = 0;
                            progress = std::time::Instant::now();
                            // In small pieces, so that the channel bounds the bytes held
                            // ahead, whatever size of chunks the connection delivers.
                            while !chunk.is_empty() {
                                let piece = chunk.split_to(chunk.len().min(PIECE));
                                if tx.send(Ok(piece)).await.is_err() {
                                    return; // The reader gave up: stop downloading.
                                }
                            }
                        }
                        Err(e) => {
                            failure = Some(crate::fetch::retry::describe(&e));
                            break;
                        }
                    }
                }
                match failure {
                    // All bytes are in; a verifying stream's complaint is the reader's to make.
                    _ if offset >= size => return,
                    Some(f) => f,
                    None => format!("the connection closed after byte {offset}"),
                }
            }
            Err(e) if !crate::fetch::retry::is_transient(&e) => {
                let _ = tx
                    .send(Err(io::Error::other(crate::fetch::retry::describe(&e))))
                    .await;
                return;
            }
            Err(e) => {
                asked = crate::fetch::retry::retry_after(&e);
                crate::fetch::retry::describe(&e)
            }
        };
        attempt += 1;
        match policy.next_delay(attempt, progress, asked.take()) {
            Some(delay) => {
                tracing::warn!(
                    "fetching blob {}: {failure}; resuming at byte {offset} in {:.1} s",
                    desc.digest,
                    delay.as_secs_f64()
                );
                tokio::time::sleep(delay).await;
            }
            None => {
                let _ = tx
                    .send(Err(io::Error::other(format!(
                        "{failure} (gave up at byte {offset} of {size} after {} s without progress, the retry budget)",
                        policy.budget().as_secs()
                    ))))
                    .await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spool_whose_start_was_freed_is_replayed_only_from_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spools/layer.partial");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        free_before(&path, 32 << 10).unwrap();
        // From a checkpoint at byte 40 KiB: replayed from there, appended to at the end.
        let (replay, _, offset) = open_spool(&path, 1 << 20, 40 << 10, None).unwrap();
        assert_eq!(offset, 64 << 10);
        let mut rest = Vec::new();
        replay.unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, vec![7u8; 24 << 10]);
        // Without one, its zeros are not taken for the blob's first bytes: it starts over.
        let (replay, _, offset) = open_spool(&path, 1 << 20, 0, None).unwrap();
        assert!(replay.is_none());
        assert_eq!(offset, 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    #[test]
    fn a_spool_is_kept_only_as_far_as_its_checkpoint_vouches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spools/layer.partial");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // 48 KiB read by the checkpoint, then 16 KiB a power cut may have torn.
        let mut bytes = vec![7u8; 48 << 10];
        bytes.extend(vec![0u8; 16 << 10]);
        std::fs::write(&path, bytes).unwrap();
        let (replay, _, offset) = open_spool(&path, 1 << 20, 40 << 10, Some(48 << 10)).unwrap();
        assert_eq!(offset, 48 << 10, "the download goes on after what the checkpoint read");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 48 << 10);
        let mut rest = Vec::new();
        replay.unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, vec![7u8; 8 << 10]);
    }
}
