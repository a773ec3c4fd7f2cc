//! The resumable gzip decoder (unsafe zlib calls on registry content): arbitrary bytes as a gzip
//! layer, decoded whole while it offers resume points every KiB or so. It must never panic or
//! misbehave, and decoding resumed from each point must give exactly the rest of the output.
#![no_main]

use std::io::Read;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use pivot::fetch::blob_reader::{Blob, BlobMark};
use pivot::import::gz::{GzReader, InflatePoint, Points};
use pivot::fetch::sha256_state::Sha256State;

/// The most output read from one input: enough for many blocks, bounded for the fuzzer.
const MAX_OUTPUT: usize = 16 << 20;

/// The input as a blob that reports its position (its digest state is not under test).
struct Marked<'a> {
    data: &'a [u8],
    read: usize,
}

impl Read for Marked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // Small reads, so that buffer refills fall inside headers and blocks.
        let len = buf.len().min(777);
        let n = (&self.data[self.read..]).read(&mut buf[..len])?;
        self.read += n;
        Ok(n)
    }
}

impl Blob for Marked<'_> {
    fn mark(&self) -> Option<BlobMark> {
        Some(BlobMark {
            read: self.read as u64,
            hash: Sha256State::default(),
        })
    }
}

fn read_all(mut reader: impl Read) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    reader.by_ref().take(MAX_OUTPUT as u64 + 1).read_to_end(&mut out)?;
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let points = Arc::new(Points::default());
    let blob = Marked { data, read: 0 };
    let mut reader = GzReader::new(blob, Some((points.clone(), 1024))).unwrap();
    let mut out = Vec::new();
    let mut seen: Vec<InflatePoint> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return,
        }
        if let Some(point) = points.at_or_before(u64::MAX) {
            if seen.last().is_none_or(|s| s.output != point.output) {
                seen.push(point);
            }
        }
        if out.len() > MAX_OUTPUT {
            return;
        }
    }
    // A few points spread over the stream (each resume decodes the rest again).
    let step = seen.len().div_ceil(8).max(1);
    for point in seen.iter().step_by(step) {
        assert!(point.blob.read >= point.input);
        let rest = &data[point.input as usize..];
        let resumed = read_all(GzReader::resume(rest, point, None).unwrap())
            .unwrap_or_else(|e| panic!("resuming from {point:?}: {e}"));
        assert!(
            resumed == out[point.output as usize..],
            "resuming from {point:?} gave other bytes"
        );
    }
});
