//! Faults the proxy injects, and what it records about each request.

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Forward the response head and this many body bytes, then close the
    /// connection: a transfer cut mid-blob.
    DropAfter(u64),
    /// Answer `code` without contacting upstream, with an OCI error JSON body
    /// and, if set, `Retry-After: <seconds>`.
    Status { code: u16, retry_after: Option<u64> },
    /// Forward the head and `bytes` body bytes, go silent for `duration`,
    /// then close: a stalled transfer.
    StallAfter { bytes: u64, duration: Duration },
    /// Wait `duration` before contacting upstream, then proxy normally: a slow
    /// first byte.
    Delay(Duration),
    /// Read the request, then reset the connection (RST) without answering.
    Reset,
    /// Answer `status` with `body` (and `content_type`) without contacting
    /// upstream. With `endless`, no Content-Length is sent and `filler`
    /// bytes follow the body until the client hangs up.
    Respond {
        status: u16,
        content_type: String,
        body: Vec<u8>,
        endless: Option<u8>,
    },
    /// Answer `status` with exactly these headers (any bytes, as a hostile registry or proxy
    /// might send) and `body`, without contacting upstream.
    Answer {
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    },
    /// Proxy normally, but replace the response header `name` with `value` (or add it).
    SetHeader { name: String, value: Vec<u8> },
    /// Relay upstream's response without its Content-Length, then keep
    /// sending zero bytes after its body until the client hangs up: more
    /// bytes than any descriptor declares, without end.
    Overflow,
    /// Proxy normally, but send the response body at most this many bytes per second: a slow
    /// link, so that a transfer lasts long enough to be interrupted at a chosen point.
    Throttle(u64),
    /// Throttle to `rate` bytes per second, and close the connection after `after` body
    /// bytes: a slow link that drops late in a long transfer.
    ThrottleThenDrop { rate: u64, after: u64 },
}

/// A fault for the first `times` requests whose target (path and query)
/// contains `path_contains` (is it, with [`Fault::exact`]) and, if set, whose
/// method is `method`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub path_contains: String,
    /// The target must be `path_contains` itself, not merely contain it: `/v2/`, the ping,
    /// is part of every registry path.
    pub exact: bool,
    pub method: Option<String>,
    pub times: u32,
    pub kind: FaultKind,
}

impl Fault {
    pub fn new(path_contains: &str, kind: FaultKind) -> Fault {
        Fault {
            path_contains: path_contains.into(),
            exact: false,
            method: None,
            times: 1,
            kind,
        }
    }

    pub fn drop_after(path_contains: &str, bytes: u64) -> Fault {
        Fault::new(path_contains, FaultKind::DropAfter(bytes))
    }

    pub fn status(path_contains: &str, code: u16) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::Status {
                code,
                retry_after: None,
            },
        )
    }

    /// 429 with `Retry-After: <seconds>` when given.
    pub fn too_many_requests(path_contains: &str, retry_after: Option<u64>) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::Status {
                code: 429,
                retry_after,
            },
        )
    }

    pub fn stall_after(path_contains: &str, bytes: u64, duration: Duration) -> Fault {
        Fault::new(path_contains, FaultKind::StallAfter { bytes, duration })
    }

    pub fn delay(path_contains: &str, duration: Duration) -> Fault {
        Fault::new(path_contains, FaultKind::Delay(duration))
    }

    pub fn reset(path_contains: &str) -> Fault {
        Fault::new(path_contains, FaultKind::Reset)
    }

    /// Serves `body` as the answer, never asking upstream.
    pub fn respond(path_contains: &str, content_type: &str, body: Vec<u8>) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::Respond {
                status: 200,
                content_type: content_type.into(),
                body,
                endless: None,
            },
        )
    }

    /// Serves `body`, then `filler` bytes forever, with no Content-Length.
    pub fn respond_endless(
        path_contains: &str,
        content_type: &str,
        body: Vec<u8>,
        filler: u8,
    ) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::Respond {
                status: 200,
                content_type: content_type.into(),
                body,
                endless: Some(filler),
            },
        )
    }

    /// Answers `status` with `headers` and `body`, never asking upstream.
    pub fn answer(
        path_contains: &str,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::Answer {
                status,
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_vec()))
                    .collect(),
                body: body.to_vec(),
            },
        )
    }

    /// Proxies the request, with the answer's header `name` set to `value`.
    pub fn set_header(path_contains: &str, name: &str, value: &[u8]) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::SetHeader {
                name: name.into(),
                value: value.to_vec(),
            },
        )
    }

    pub fn overflow(path_contains: &str) -> Fault {
        Fault::new(path_contains, FaultKind::Overflow)
    }

    /// Bodies at most `bytes_per_second` (combine with [`Fault::always`]).
    pub fn throttle(path_contains: &str, bytes_per_second: u64) -> Fault {
        Fault::new(path_contains, FaultKind::Throttle(bytes_per_second))
    }

    /// Sends `after` body bytes at `bytes_per_second`, then closes the connection.
    pub fn throttle_then_drop(path_contains: &str, bytes_per_second: u64, after: u64) -> Fault {
        Fault::new(
            path_contains,
            FaultKind::ThrottleThenDrop {
                rate: bytes_per_second,
                after,
            },
        )
    }

    /// Applies to the first `n` matching requests (default 1).
    pub fn times(mut self, n: u32) -> Fault {
        self.times = n;
        self
    }

    /// Applies to every matching request.
    pub fn always(self) -> Fault {
        self.times(u32::MAX)
    }

    /// Only requests whose whole target is the path given (e.g. `/v2/`, the ping).
    pub fn exact(mut self) -> Fault {
        self.exact = true;
        self
    }

    /// Proxies the matching requests untouched: with [`Fault::times`], lets that many through
    /// before the faults added after it apply.
    pub fn pass(path_contains: &str) -> Fault {
        Fault::new(path_contains, FaultKind::Delay(Duration::ZERO))
    }

    /// Only requests with this method (e.g. "GET", so HEADs pass untouched).
    pub fn method(mut self, method: &str) -> Fault {
        self.method = Some(method.to_ascii_uppercase());
        self
    }

    pub(crate) fn matches(&self, method: &str, target: &str) -> bool {
        self.times > 0
            && match self.exact {
                true => target == self.path_contains,
                false => target.contains(&self.path_contains),
            }
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
    }
}

/// One request through the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxiedRequest {
    pub method: String,
    /// Request target: path and query.
    pub path: String,
    /// The `Range` header, passed upstream unchanged.
    pub range: Option<String>,
    /// Status sent to the client (upstream's or injected); None if none was.
    pub status: Option<u16>,
    /// Response body bytes written to the client so far.
    pub body_bytes: u64,
    pub fault: Option<FaultKind>,
    /// When the request arrived.
    pub at: std::time::Instant,
}

/// The OCI distribution error code for an injected status.
pub(crate) fn error_code(status: u16) -> &'static str {
    match status {
        401 => "UNAUTHORIZED",
        403 => "DENIED",
        404 => "NAME_UNKNOWN",
        429 => "TOOMANYREQUESTS",
        _ => "UNAVAILABLE",
    }
}
