//! Decompressing a layer on its own thread, bounded: a layer may not decompress to more than
//! [`decompressed_limit`] of its compressed size, so a decompression bomb is refused instead of
//! being read for hours.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context, Result};

use super::gz::{GzReader, InflatePoint, Points};
use crate::fetch::blob_reader::Blob;
use crate::fetch::image::Compression;

/// Streamed data moves between threads in chunks of this size: under glibc's mmap threshold
/// (fixed at 128 KiB in `src/main.rs`), so a chunk's buffer comes from the heap and is reused,
/// instead of being mapped, faulted in and unmapped every time.
pub(super) const STREAM_CHUNK: usize = 64 << 10;
/// Decompressed chunks buffered between the two threads (each [`STREAM_CHUNK`]).
pub(super) const DECOMPRESSED_AHEAD: usize = 16;

/// How far a layer of `compressed` bytes may decompress: 32 times its size plus 64 MiB. Real
/// OS content compresses 2–5×; only runs of nothing compress further.
pub fn decompressed_limit(compressed: u64) -> u64 {
    compressed.saturating_mul(32).saturating_add(64 << 20)
}

/// Where a decompression starts: from the beginning, or from a checkpoint's point (gzip only),
/// dropping `skip` bytes of output (up to the tar member the import resumes at). With `points`,
/// a gzip decoder offers points every so many decompressed bytes.
#[derive(Default)]
pub(super) struct Start<'a> {
    pub resume: Option<(&'a InflatePoint, u64)>,
    pub points: Option<(Arc<Points>, u64)>,
}

/// Sends the decompressed layer in chunks, then reads the rest of the blob, so that its digest
/// is checked even when the consumer stopped early.
pub(super) fn decompress(
    mut blob: impl Blob,
    compression: Compression,
    compressed_size: u64,
    tx: SyncSender<Vec<u8>>,
    start: Start<'_>,
) -> Result<()> {
    let limit = decompressed_limit(compressed_size);
    let sent = (|| -> Result<()> {
        ensure!(
            start.resume.is_none() || compression == Compression::Gzip,
            "only a gzip layer resumes from a checkpoint"
        );
        let mut total = start.resume.map_or(0, |(point, _)| point.output);
        let mut skip = start.resume.map_or(0, |(_, skip)| skip);
        let mut decoder: Box<dyn Read + '_> = match (compression, start.resume) {
            (Compression::None, _) => Box::new(&mut blob),
            (Compression::Gzip, None) => Box::new(GzReader::new(&mut blob, start.points)?),
            (Compression::Gzip, Some((point, _))) => {
                Box::new(GzReader::resume(&mut blob, point, start.points)?)
            }
            (Compression::Zstd, _) => {
                Box::new(zstd::Decoder::new(&mut blob).context("starting zstd decompression")?)
            }
        };
        loop {
            let mut chunk = vec![0; STREAM_CHUNK];
            let n = decoder
                .read(&mut chunk)
                .context("decompressing the layer")?;
            if n == 0 {
                ensure!(
                    skip == 0,
                    "the layer ends before the checkpoint's tar member"
                );
                return Ok(());
            }
            total += n as u64;
            if total > limit {
                bail!(
                    "the layer decompresses to more than {limit} bytes, the most pivot accepts for {compressed_size} compressed bytes (32× plus 64 MiB): refusing a decompression bomb"
                );
            }
            chunk.truncate(n);
            if skip > 0 {
                let dropped = skip.min(n as u64) as usize;
                chunk.drain(..dropped);
                skip -= dropped as u64;
                if chunk.is_empty() {
                    continue;
                }
            }
            if tx.send(chunk).is_err() {
                return Ok(()); // The importer stopped; its error says why.
            }
        }
    })();
    drop(tx);
    let drained = io::copy(&mut blob, &mut io::sink());
    match (drained, sent) {
        (Err(e), _) => Err(anyhow!(e)),
        (Ok(_), sent) => sent,
    }
}

/// A `Read` over chunks sent by another thread; end of file when the sender is gone. A chunk
/// read is dropped before the next is waited for (a streamed object's chunk then gives back its
/// share of the bound on what streams hold: `super::writers`).
pub(super) struct ChunkReader<C = Vec<u8>> {
    rx: Receiver<C>,
    current: Option<C>,
    pos: usize,
}

impl<C> ChunkReader<C> {
    pub fn new(rx: Receiver<C>) -> ChunkReader<C> {
        ChunkReader {
            rx,
            current: None,
            pos: 0,
        }
    }
}

impl<C: AsRef<[u8]>> Read for ChunkReader<C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let unread = self.current.as_ref().map(|c| &c.as_ref()[self.pos..]);
            if let Some(unread) = unread.filter(|u| !u.is_empty()) {
                let n = buf.len().min(unread.len());
                buf[..n].copy_from_slice(&unread[..n]);
                self.pos += n;
                return Ok(n);
            }
            self.current = None;
            match self.rx.recv() {
                Ok(chunk) => (self.current, self.pos) = (Some(chunk), 0),
                Err(_) => return Ok(0),
            }
        }
    }
}

/// Reads into `buf` until it is full or the input ends; returns the bytes read.
pub(super) fn fill(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_decompression_bomb_is_refused() {
        // 100 MiB of zeros gzip to about 100 KiB: far beyond 32× plus 64 MiB.
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..100 {
            enc.write_all(&zeros).unwrap();
        }
        let blob = enc.finish().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(DECOMPRESSED_AHEAD);
        let consumer =
            std::thread::spawn(move || io::copy(&mut ChunkReader::new(rx), &mut io::sink()));
        let start = Start::default();
        let err =
            decompress(&blob[..], Compression::Gzip, blob.len() as u64, tx, start).unwrap_err();
        assert!(err.to_string().contains("decompression bomb"), "{err:#}");
        assert!(consumer.join().unwrap().unwrap() <= decompressed_limit(blob.len() as u64));
    }

    #[test]
    fn the_limit_leaves_room_for_real_layers() {
        assert_eq!(decompressed_limit(0), 64 << 20);
        assert_eq!(decompressed_limit(1 << 20), (32 << 20) + (64 << 20));
        assert_eq!(decompressed_limit(u64::MAX), u64::MAX);
    }
}
