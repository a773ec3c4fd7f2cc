use super::*;
use crate::fetch::sha256_state::Sha256State;
use std::io::Write;

/// A blob in memory that reports its position, as the blob reader does.
struct Marked<'a> {
    data: &'a [u8],
    read: u64,
    hash: Sha256State,
}

impl Read for Marked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Small reads, so that points fall at every kind of offset.
        let len = buf.len().min(5000);
        let n = (&self.data[self.read as usize..]).read(&mut buf[..len])?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl Blob for Marked<'_> {
    fn mark(&self) -> Option<BlobMark> {
        Some(BlobMark {
            read: self.read,
            hash: self.hash.clone(),
        })
    }
}

/// Text-like data that compresses into many blocks, in two gzip members.
fn sample() -> (Vec<u8>, Vec<u8>) {
    let mut plain = Vec::new();
    let mut gz = Vec::new();
    for member in 0..2u32 {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        let mut part = Vec::new();
        for i in 0..60_000u32 {
            let x = i.wrapping_mul(2654435761).rotate_left(member + 3);
            writeln!(part, "line {i} of member {member}: {x:08x} {}", x % 977).unwrap();
        }
        enc.write_all(&part).unwrap();
        gz.extend(enc.finish().unwrap());
        plain.extend(part);
    }
    (plain, gz)
}

fn read_all(mut reader: impl Read) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    reader.read_to_end(&mut out)?;
    Ok(out)
}

/// Decodes `gz` whole, offering points every 64 KiB; returns the output and every point
/// offered.
fn decode_with_points(gz: &[u8]) -> (Vec<u8>, Vec<InflatePoint>) {
    let points = Arc::new(Points::default());
    let blob = Marked {
        data: gz,
        read: 0,
        hash: Sha256State::default(),
    };
    let mut reader = GzReader::new(blob, Some((points.clone(), 64 << 10))).unwrap();
    let mut out = Vec::new();
    let mut seen: Vec<InflatePoint> = Vec::new();
    let mut buf = vec![0; 7000];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            return (out, seen);
        }
        out.extend_from_slice(&buf[..n]);
        if let Some(p) = points.at_or_before(u64::MAX) {
            if seen.last().is_none_or(|s| s.output != p.output) {
                seen.push(p);
            }
        }
    }
}

#[test]
fn decoding_resumed_from_any_point_gives_the_rest_of_the_stream() {
    let (plain, gz) = sample();
    let (out, seen) = decode_with_points(&gz);
    assert_eq!(out, plain);
    assert!(seen.len() > 5, "only {} points", seen.len());
    assert!(seen.iter().any(|p| p.bits != 0));
    for point in &seen {
        let saved: InflatePoint =
            serde_json::from_str(&serde_json::to_string(point).unwrap()).unwrap();
        let rest = &gz[saved.input as usize..];
        let resumed = read_all(GzReader::resume(rest, &saved, None).unwrap()).unwrap();
        assert_eq!(resumed, plain[saved.output as usize..], "from {saved:?}");
        assert!(saved.blob.read >= saved.input);
    }
}

#[test]
fn a_resume_from_a_wrong_point_is_refused_not_taken_for_data() {
    let (_, gz) = sample();
    let mut point = decode_with_points(&gz).1.pop().unwrap();
    point.input += 1;
    let err = read_all(GzReader::resume(&gz[point.input as usize..], &point, None).unwrap());
    assert!(err.is_err());
}

#[test]
fn broken_gzip_is_refused_naming_the_problem() {
    let (_, gz) = sample();
    let err = |data: &[u8]| {
        read_all(GzReader::new(data, None).unwrap())
            .unwrap_err()
            .to_string()
    };
    assert!(err(b"").contains("empty"));
    assert!(err(b"PK\x03\x04 zip").contains("not gzip"));
    assert!(err(&gz[..gz.len() / 2]).contains("ends inside"));
    let mut bad_crc = gz.clone();
    let at = bad_crc.len() - 6;
    bad_crc[at] ^= 1;
    assert!(err(&bad_crc).contains("does not match its trailer"));
    let mut trailing = gz.clone();
    trailing.extend_from_slice(b"garbage");
    assert!(err(&trailing).contains("no gzip magic"));
}
