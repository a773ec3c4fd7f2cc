//! Just enough HTTP/1.1 for the kit's own loopback servers: read a message
//! head, edit its headers, write a small response. Every server here closes
//! the connection after one exchange, so no keep-alive bookkeeping exists.

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncRead, AsyncReadExt};

const MAX_HEAD: usize = 64 * 1024;

/// A request or response head: the first line and the headers, in order.
#[derive(Clone, Debug)]
pub(crate) struct Head {
    pub first_line: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn parse(raw: &[u8]) -> Result<Head> {
        let text = std::str::from_utf8(raw).context("HTTP head is not UTF-8")?;
        let mut lines = text.split("\r\n");
        let first_line = lines.next().unwrap_or_default().to_string();
        if first_line.split_whitespace().count() < 2 {
            bail!("malformed HTTP start line {first_line:?}");
        }
        let mut headers = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line
                .split_once(':')
                .with_context(|| format!("malformed header line {line:?}"))?;
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
        Ok(Head {
            first_line,
            headers,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn remove(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    pub fn set(&mut self, name: &str, value: &str) {
        self.remove(name);
        self.headers.push((name.to_string(), value.to_string()));
    }

    /// Request method (first word of a request line).
    pub fn method(&self) -> &str {
        self.first_line
            .split_whitespace()
            .next()
            .unwrap_or_default()
    }

    /// Request target (second word of a request line).
    pub fn target(&self) -> &str {
        self.first_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
    }

    /// Status code of a response line.
    pub fn status(&self) -> Option<u16> {
        self.first_line.split_whitespace().nth(1)?.parse().ok()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.first_line);
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.into_bytes()
    }
}

/// Reads up to the blank line ending a head. Returns the head and any bytes
/// read past it (the start of the body), or None on EOF before any byte.
pub(crate) async fn read_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<(Head, Vec<u8>)>> {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // A TLS ClientHello (0x16) or other binary: answer at once (with a
        // 400) so HTTPS-first clients fall back to HTTP instead of waiting.
        if buf.first().is_some_and(|b| !b.is_ascii_alphabetic()) {
            bail!("not an HTTP/1 message (first byte {:#04x})", buf[0]);
        }
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = Head::parse(&buf[..end])?;
            return Ok(Some((head, buf[end + 4..].to_vec())));
        }
        if buf.len() > MAX_HEAD {
            bail!("HTTP head longer than {MAX_HEAD} bytes");
        }
        let n = r.read(&mut chunk).await.context("reading HTTP head")?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            bail!("connection closed inside an HTTP head");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A complete `Connection: close` response. For HEAD requests pass
/// `with_body = false`: Content-Length still describes the body not sent.
pub(crate) fn response(
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
    with_body: bool,
) -> Vec<u8> {
    let mut head = Head {
        first_line: format!("HTTP/1.1 {status} {}", reason(status)),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
    };
    head.set("Content-Length", &body.len().to_string());
    head.set("Connection", "close");
    let mut out = head.to_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    out
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        423 => "Locked",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Splits a request target into its path and decoded query pairs.
pub(crate) fn split_query(target: &str) -> (String, Vec<(String, String)>) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let pairs = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    (path.to_string(), pairs)
}

/// application/x-www-form-urlencoded decoding ('+' is a space).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_edits_and_decodes() -> Result<()> {
        let mut h = Head::parse(b"GET /v2/a?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=5-")?;
        assert_eq!((h.method(), h.target()), ("GET", "/v2/a?x=1"));
        assert_eq!(h.header("range"), Some("bytes=5-"));
        h.set("connection", "close");
        assert!(String::from_utf8(h.to_bytes())?.ends_with("connection: close\r\n\r\n"));
        let (path, q) =
            split_query("/token?service=reg&scope=repository%3Afoo%3Apull%2Cpush&a=b+c&bad=%zz%4");
        assert_eq!(path, "/token");
        assert_eq!(q[1].1, "repository:foo:pull,push");
        assert_eq!(q[2].1, "b c");
        assert_eq!(q[3].1, "%zz%4");
        Ok(())
    }
}
