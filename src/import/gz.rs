//! A gzip decoder (zlib's raw inflate, gzip framing read here) that can be resumed in the
//! middle of a stream: at deflate block boundaries it offers [`InflatePoint`]s (the compressed
//! and decompressed offsets, the bits of the last byte still unread, the 32 KiB window, the
//! CRC so far, and where the blob reader was), from which [`GzReader::resume`] decodes on
//! without any byte before the point. This is zlib's `zran` technique; it is what lets a killed
//! pivot resume inside a layer after its download spool was trimmed behind the import.
//! Multi-member streams (concatenated gzip files) are read as one, like `gunzip`.
// unsafe: zlib through its C API (libz-sys), for a decoder that can be resumed mid-stream.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::CStr;
use std::io::{self, Read};
use std::os::raw::c_int;
use std::sync::{Arc, Mutex};

use libz_sys as z;

use crate::fetch::blob_reader::{Blob, BlobMark};

/// Input buffered from the blob.
const INPUT: usize = 64 << 10;
/// The most of its history deflate refers back to.
const WINDOW: usize = 32 << 10;
/// Points kept for the importer to pick from: it trails the decoder by the chunks in flight and
/// the member it is writing.
const POINTS_KEPT: usize = 8;

extern "C" {
    // Not declared by libz-sys; in zlib since 1.2.8.
    fn inflateGetDictionary(strm: *mut z::z_stream, dict: *mut u8, len: *mut z::uInt) -> c_int;
}

/// Where decoding can resume.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct InflatePoint {
    /// Compressed offset of the first byte not yet (even partly) consumed.
    pub input: u64,
    /// Unused high bits of the byte before `input` (0 to 7) and that byte.
    pub bits: u8,
    pub last_byte: u8,
    /// Decompressed offset (from the start of the layer, across gzip members).
    pub output: u64,
    /// The last 32 KiB (or fewer) of this member's output.
    #[serde(with = "crate::fetch::sha256_state::hex_bytes")]
    pub window: Vec<u8>,
    /// CRC-32 and length of this member's output so far.
    pub crc: u32,
    pub member_output: u64,
    /// The blob reader's position and digest state when the point was taken (at or past `input`).
    pub blob: BlobMark,
}

/// The points a decoder offers, newest last.
#[derive(Default)]
pub struct Points(Mutex<VecDeque<InflatePoint>>);

impl Points {
    fn push(&self, point: InflatePoint) {
        let mut points = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if points.len() == POINTS_KEPT {
            points.pop_front();
        }
        points.push_back(point);
    }

    /// The compressed offset of the newest point at or before decompressed offset `output`
    /// (without copying the point's window).
    pub fn input_at_or_before(&self, output: u64) -> Option<u64> {
        let points = self.0.lock().unwrap_or_else(|e| e.into_inner());
        points.iter().rev().find(|p| p.output <= output).map(|p| p.input)
    }

    /// The newest point at or before decompressed offset `output`.
    pub fn at_or_before(&self, output: u64) -> Option<InflatePoint> {
        let points = self.0.lock().unwrap_or_else(|e| e.into_inner());
        points.iter().rev().find(|p| p.output <= output).cloned()
    }
}

enum State {
    Header,
    Deflate,
    Done,
}

pub struct GzReader<R> {
    inner: R,
    strm: Box<z::z_stream>,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    /// Compressed bytes taken from `inner` (from the start of the blob).
    taken: u64,
    last_byte: u8,
    state: State,
    members: u64,
    crc: crc32fast::Hasher,
    member_output: u64,
    output: u64,
    points: Option<(Arc<Points>, u64)>,
    last_point: u64,
}

// SAFETY: the z_stream's pointers are only used by the thread that owns the reader.
unsafe impl<R: Send> Send for GzReader<R> {}

unsafe extern "C" fn zalloc(_: z::voidpf, items: z::uInt, size: z::uInt) -> z::voidpf {
    libc::calloc(items as usize, size as usize)
}

unsafe extern "C" fn zfree(_: z::voidpf, address: z::voidpf) {
    libc::free(address)
}

fn raw_stream() -> io::Result<Box<z::z_stream>> {
    let mut strm = Box::new(z::z_stream {
        next_in: std::ptr::null_mut(),
        avail_in: 0,
        total_in: 0,
        next_out: std::ptr::null_mut(),
        avail_out: 0,
        total_out: 0,
        msg: std::ptr::null_mut(),
        state: std::ptr::null_mut(),
        zalloc,
        zfree,
        opaque: std::ptr::null_mut(),
        data_type: 0,
        adler: 0,
        reserved: 0,
    });
    let size = std::mem::size_of::<z::z_stream>() as c_int;
    // SAFETY: strm is boxed (zlib keeps its address) and initialised as zlib requires.
    let ret = unsafe { z::inflateInit2_(&mut *strm, -15, z::zlibVersion(), size) };
    if ret != z::Z_OK {
        return Err(io::Error::other(format!(
            "starting zlib inflate failed ({ret})"
        )));
    }
    Ok(strm)
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

impl<R: Blob> GzReader<R> {
    /// Decodes `inner` from its start; with `points`, offers a point every `span` decompressed
    /// bytes (or so: only block boundaries qualify).
    pub fn new(inner: R, points: Option<(Arc<Points>, u64)>) -> io::Result<Self> {
        Ok(GzReader {
            inner,
            strm: raw_stream()?,
            buf: vec![0; INPUT],
            pos: 0,
            len: 0,
            taken: 0,
            last_byte: 0,
            state: State::Header,
            members: 0,
            crc: crc32fast::Hasher::new(),
            member_output: 0,
            output: 0,
            points,
            last_point: 0,
        })
    }

    /// Decodes on from `point`; `inner` must yield the blob from `point.input`.
    pub fn resume(
        inner: R,
        point: &InflatePoint,
        points: Option<(Arc<Points>, u64)>,
    ) -> io::Result<Self> {
        let mut reader = GzReader::new(inner, points)?;
        if point.bits > 7 || point.window.len() > WINDOW {
            return Err(invalid(
                "the checkpoint's inflate state is not one zlib could have had",
            ));
        }
        let strm = &mut *reader.strm;
        // SAFETY: strm was initialised by raw_stream; the window outlives the call.
        unsafe {
            if point.bits > 0 {
                let value = c_int::from(point.last_byte >> (8 - point.bits));
                if z::inflatePrime(strm, c_int::from(point.bits), value) != z::Z_OK {
                    return Err(invalid("zlib refused the checkpoint's bit offset"));
                }
            }
            if !point.window.is_empty()
                && z::inflateSetDictionary(
                    strm,
                    point.window.as_ptr(),
                    point.window.len() as z::uInt,
                ) != z::Z_OK
            {
                return Err(invalid("zlib refused the checkpoint's window"));
            }
        }
        reader.taken = point.input;
        reader.state = State::Deflate;
        reader.members = 1;
        reader.crc = crc32fast::Hasher::new_with_initial_len(point.crc, point.member_output);
        reader.member_output = point.member_output;
        reader.output = point.output;
        reader.last_point = point.output;
        Ok(reader)
    }

    fn refill(&mut self) -> io::Result<bool> {
        if self.pos < self.len {
            return Ok(true);
        }
        let n = loop {
            match self.inner.read(&mut self.buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        self.taken += n as u64;
        self.pos = 0;
        self.len = n;
        Ok(n > 0)
    }

    fn byte(&mut self) -> io::Result<u8> {
        if !self.refill()? {
            return Err(invalid(
                "the gzip stream ends inside a member header or trailer",
            ));
        }
        self.pos += 1;
        Ok(self.buf[self.pos - 1])
    }

    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut out = [0; N];
        for b in &mut out {
            *b = self.byte()?;
        }
        Ok(out)
    }

    /// Reads a member header; false at the end of the stream (after at least one member).
    fn start_member(&mut self) -> io::Result<bool> {
        if !self.refill()? {
            if self.members == 0 {
                return Err(invalid("the layer is empty, not gzip"));
            }
            return Ok(false);
        }
        let [id1, id2, method, flags] = self.bytes::<4>()?;
        if [id1, id2] != [0x1f, 0x8b] {
            return Err(invalid(if self.members == 0 {
                "the layer is not gzip (no gzip magic number)".to_string()
            } else {
                format!("gzip member {} has no gzip magic number", self.members + 1)
            }));
        }
        if method != 8 || flags & 0xe0 != 0 {
            return Err(invalid(format!(
                "unsupported gzip header (method {method}, flags {flags:#x})"
            )));
        }
        self.bytes::<6>()?; // mtime, extra flags, OS
        if flags & 4 != 0 {
            let len = u16::from_le_bytes(self.bytes::<2>()?);
            for _ in 0..len {
                self.byte()?;
            }
        }
        for flag in [8, 16] {
            // File name, comment: NUL-terminated.
            if flags & flag != 0 {
                while self.byte()? != 0 {}
            }
        }
        if flags & 2 != 0 {
            self.bytes::<2>()?; // header CRC
        }
        // SAFETY: strm was initialised by raw_stream.
        if unsafe { z::inflateReset2(&mut *self.strm, -15) } != z::Z_OK {
            return Err(io::Error::other("resetting zlib inflate failed"));
        }
        self.members += 1;
        self.crc = crc32fast::Hasher::new();
        self.member_output = 0;
        Ok(true)
    }

    fn end_member(&mut self) -> io::Result<()> {
        let crc = u32::from_le_bytes(self.bytes::<4>()?);
        let size = u32::from_le_bytes(self.bytes::<4>()?);
        let actual = std::mem::take(&mut self.crc).finalize();
        if crc != actual || size != self.member_output as u32 {
            return Err(invalid(format!(
                "gzip member {} does not match its trailer (CRC {actual:08x}, expected {crc:08x})",
                self.members
            )));
        }
        Ok(())
    }

    fn offer_point(&mut self, bits: u8) {
        let Some((points, span)) = &self.points else {
            return;
        };
        if self.output < self.last_point + span {
            return;
        }
        let Some(blob) = self.inner.mark() else {
            return;
        };
        let mut window = vec![0; WINDOW];
        let mut len: z::uInt = 0;
        // SAFETY: window has room for the 32 KiB zlib may copy.
        if unsafe { inflateGetDictionary(&mut *self.strm, window.as_mut_ptr(), &mut len) }
            != z::Z_OK
        {
            return;
        }
        window.truncate(len as usize);
        points.push(InflatePoint {
            input: self.taken - (self.len - self.pos) as u64,
            bits,
            last_byte: self.last_byte,
            output: self.output,
            window,
            crc: self.crc.clone().finalize(),
            member_output: self.member_output,
            blob,
        });
        self.last_point = self.output;
    }

    fn inflate(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if !self.refill()? {
            return Err(invalid("the gzip stream ends inside compressed data"));
        }
        let available = self.len - self.pos;
        let strm = &mut *self.strm;
        strm.next_in = self.buf[self.pos..].as_mut_ptr();
        strm.avail_in = available as z::uInt;
        strm.next_out = out.as_mut_ptr();
        strm.avail_out = out.len().min(z::uInt::MAX as usize) as z::uInt;
        let asked = strm.avail_out as usize;
        // SAFETY: the pointers above are valid for the lengths given, for this call.
        let ret = unsafe { z::inflate(strm, z::Z_BLOCK) };
        let used = available - strm.avail_in as usize;
        let produced = asked - strm.avail_out as usize;
        let data_type = strm.data_type;
        let message = (!strm.msg.is_null()).then(|| {
            // SAFETY: zlib's messages are static NUL-terminated strings.
            unsafe { CStr::from_ptr(strm.msg) }
                .to_string_lossy()
                .into_owned()
        });
        self.pos += used;
        if used > 0 {
            self.last_byte = self.buf[self.pos - 1];
        }
        self.crc.update(&out[..produced]);
        self.member_output += produced as u64;
        self.output += produced as u64;
        match ret {
            z::Z_STREAM_END => {
                self.end_member()?;
                self.state = State::Header;
            }
            z::Z_BUF_ERROR if used == 0 && produced == 0 => {
                return Err(invalid("invalid gzip data: zlib can make no progress"));
            }
            z::Z_OK | z::Z_BUF_ERROR => {
                // At the end of a block that is not the last one: a point to resume from.
                if data_type & 128 != 0 && data_type & 64 == 0 {
                    self.offer_point((data_type & 7) as u8);
                }
            }
            _ => {
                return Err(invalid(format!(
                    "invalid gzip data: {}",
                    message.unwrap_or_else(|| format!("zlib error {ret}"))
                )))
            }
        }
        Ok(produced)
    }
}

impl<R: Blob> Read for GzReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            match self.state {
                State::Done => return Ok(0),
                State::Header => {
                    self.state = if self.start_member()? {
                        State::Deflate
                    } else {
                        State::Done
                    };
                }
                State::Deflate => {
                    let n = self.inflate(out)?;
                    if n > 0 {
                        return Ok(n);
                    }
                }
            }
        }
    }
}

impl<R> Drop for GzReader<R> {
    fn drop(&mut self) {
        // SAFETY: strm was initialised by raw_stream and is not used after this.
        unsafe { z::inflateEnd(&mut *self.strm) };
    }
}

#[cfg(test)]
mod tests;
