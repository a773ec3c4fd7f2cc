//! A reverse HTTP/1.1 proxy on loopback in front of a plain-HTTP registry,
//! injecting faults (cuts, stalls, error statuses, resets) and counting what
//! reaches the client. One exchange per connection (`Connection: close` both
//! ways) keeps message framing out of the proxy: bodies are relayed until the
//! upstream closes, so Range/206, HEAD and chunked bodies pass untouched.

use crate::fault::error_code;
pub use crate::fault::{Fault, FaultKind, ProxiedRequest};
use crate::http1::{self, read_head, Head};
use crate::serve::Server;
use anyhow::{Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct FaultProxy {
    server: Server,
    state: Arc<State>,
}

struct State {
    upstream: String,
    faults: Mutex<Vec<Fault>>,
    log: Mutex<Vec<ProxiedRequest>>,
    /// Exchanges still relaying bytes (stalled ones excluded).
    busy: AtomicUsize,
}

/// Marks one exchange busy until dropped.
struct Busy<'a>(&'a AtomicUsize);

impl<'a> Busy<'a> {
    fn enter(n: &'a AtomicUsize) -> Busy<'a> {
        n.fetch_add(1, Ordering::SeqCst);
        Busy(n)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FaultProxy {
    /// Proxies to `upstream_host` ("127.0.0.1:PORT", plain HTTP).
    pub fn start(upstream_host: &str) -> Result<FaultProxy> {
        let state = Arc::new(State {
            upstream: upstream_host.to_string(),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            busy: AtomicUsize::new(0),
        });
        let shared = state.clone();
        let server = Server::spawn("pivot-fault-proxy", move |stream| {
            let state = shared.clone();
            async move {
                if let Err(e) = handle(stream, &state).await {
                    // Clients hanging up mid-body are routine here.
                    eprintln!("fault proxy: {e:#}");
                }
            }
        })?;
        Ok(FaultProxy { server, state })
    }

    /// "127.0.0.1:PORT" of the proxy; use it in image references.
    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.host())
    }

    pub fn upstream(&self) -> &str {
        &self.state.upstream
    }

    /// Refuses new connections (the listener is closed: ECONNREFUSED) for
    /// `duration`, then listens again on the same port. Returns once closed.
    pub fn refuse_connections_for(&self, duration: Duration) -> Result<()> {
        self.server.refuse_for(duration)
    }

    /// Faults apply in the order added; the first match with times left wins.
    pub fn add_fault(&self, fault: Fault) {
        self.state.faults.lock().expect("faults lock").push(fault);
    }

    pub fn clear_faults(&self) {
        self.state.faults.lock().expect("faults lock").clear();
    }

    /// Injections still to come, summed over all faults (saturating).
    pub fn pending_faults(&self) -> u32 {
        let faults = self.state.faults.lock().expect("faults lock");
        faults.iter().fold(0u32, |n, f| n.saturating_add(f.times))
    }

    /// Requests so far, in arrival order. Waits (up to 2 s) for exchanges
    /// still relaying to finish, so counts taken right after a client exits
    /// include its last bytes; stalled exchanges are not waited for.
    pub fn requests(&self) -> Vec<ProxiedRequest> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.state.busy.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.state.log.lock().expect("proxy log lock").clone()
    }

    /// Number of requests with `method` whose target contains `path_contains`.
    pub fn count_requests(&self, method: &str, path_contains: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path.contains(path_contains))
            .count()
    }

    /// Response body bytes written to clients for targets containing
    /// `path_contains` ("" for all).
    pub fn body_bytes_sent(&self, path_contains: &str) -> u64 {
        self.requests()
            .iter()
            .filter(|r| r.path.contains(path_contains))
            .map(|r| r.body_bytes)
            .sum()
    }

    /// Writes `dir/registries.conf` marking the proxy insecure (plain HTTP).
    pub fn registries_conf(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("registries.conf");
        let text = format!(
            "unqualified-search-registries = []\n\n[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
            self.host()
        );
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

impl State {
    fn take_fault(&self, method: &str, target: &str) -> Option<FaultKind> {
        let mut faults = self.faults.lock().expect("faults lock");
        let fault = faults.iter_mut().find(|f| f.matches(method, target))?;
        fault.times -= 1;
        Some(fault.kind.clone())
    }

    fn record(&self, entry: ProxiedRequest) -> usize {
        let mut log = self.log.lock().expect("proxy log lock");
        log.push(entry);
        log.len() - 1
    }

    fn update(&self, idx: usize, f: impl FnOnce(&mut ProxiedRequest)) {
        f(&mut self.log.lock().expect("proxy log lock")[idx]);
    }
}

async fn handle(mut client: TcpStream, state: &State) -> Result<()> {
    let (mut head, body_start) = match read_head(&mut client).await {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(()),
        Err(e) => {
            let reply = http1::response(400, &[], b"not HTTP/1\n", true);
            client.write_all(&reply).await.ok();
            return Err(e);
        }
    };
    // Counted from here: idle connections must not hold up readers.
    let busy = Busy::enter(&state.busy);
    let method = head.method().to_string();
    let fault = state.take_fault(&method, head.target());
    let idx = state.record(ProxiedRequest {
        method: method.clone(),
        path: head.target().to_string(),
        range: head.header("Range").map(str::to_string),
        status: None,
        body_bytes: 0,
        fault: fault.clone(),
        at: Instant::now(),
    });
    let mut limit = None;
    let mut stall = None;
    let mut overflow = false;
    let mut rate = None;
    let mut set_header = None;
    match fault {
        Some(FaultKind::Reset) => {
            // Zero linger turns the close into a RST: "connection reset by peer".
            client.set_zero_linger().context("setting SO_LINGER")?;
            return Ok(());
        }
        Some(FaultKind::Status { code, retry_after }) => {
            let body = json!({ "errors": [{
                "code": error_code(code),
                "message": format!("pivot-testkit fault proxy injected HTTP {code}"),
                "detail": null,
            }]})
            .to_string();
            let retry = retry_after.map(|s| s.to_string());
            let mut headers = vec![("Content-Type", "application/json")];
            if let Some(r) = &retry {
                headers.push(("Retry-After", r));
            }
            // A registry refusing a bearer token (expired, revoked) challenges for a new one.
            if code == 401 {
                headers.push(("WWW-Authenticate", "Bearer error=\"invalid_token\""));
            }
            let with_body = method != "HEAD";
            let reply = http1::response(code, &headers, body.as_bytes(), with_body);
            client
                .write_all(&reply)
                .await
                .context("writing injected status")?;
            let sent = if with_body { body.len() as u64 } else { 0 };
            state.update(idx, |r| {
                r.status = Some(code);
                r.body_bytes = sent;
            });
            return Ok(());
        }
        Some(FaultKind::Respond {
            status,
            content_type,
            body,
            endless,
        }) => {
            let headers = [("Content-Type", content_type.as_str())];
            let with_body = method != "HEAD";
            let mut reply = http1::response(status, &headers, &body, with_body);
            if endless.is_some() {
                // Body delimited by the close alone: drop the Content-Length line.
                let text = String::from_utf8_lossy(&reply).into_owned();
                let cl = format!("Content-Length: {}\r\n", body.len());
                reply = text.replacen(&cl, "", 1).into_bytes();
            }
            client
                .write_all(&reply)
                .await
                .context("writing injected response")?;
            let mut sent = if with_body { body.len() as u64 } else { 0 };
            state.update(idx, |r| {
                r.status = Some(status);
                r.body_bytes = sent;
            });
            if let (Some(filler), true) = (endless, with_body) {
                send_forever(&mut client, filler, &mut sent, state, idx).await;
            }
            return Ok(());
        }
        Some(FaultKind::Answer {
            status,
            headers,
            body,
        }) => {
            let mut reply = format!("HTTP/1.1 {status} Injected\r\n").into_bytes();
            for (name, value) in &headers {
                reply.extend_from_slice(format!("{name}: ").as_bytes());
                reply.extend_from_slice(value);
                reply.extend_from_slice(b"\r\n");
            }
            let with_body = method != "HEAD";
            reply.extend_from_slice(
                format!(
                    "Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            if with_body {
                reply.extend_from_slice(&body);
            }
            client
                .write_all(&reply)
                .await
                .context("writing injected answer")?;
            state.update(idx, |r| {
                r.status = Some(status);
                r.body_bytes = if with_body { body.len() as u64 } else { 0 };
            });
            return Ok(());
        }
        Some(FaultKind::SetHeader { name, value }) => set_header = Some((name, value)),
        Some(FaultKind::Overflow) => overflow = true,
        Some(FaultKind::Delay(d)) => tokio::time::sleep(d).await,
        Some(FaultKind::DropAfter(n)) => limit = Some(n),
        Some(FaultKind::StallAfter { bytes, duration }) => {
            limit = Some(bytes);
            stall = Some(duration);
        }
        Some(FaultKind::Throttle(bytes_per_second)) => rate = Some(bytes_per_second.max(1)),
        Some(FaultKind::ThrottleThenDrop { rate: r, after }) => {
            rate = Some(r.max(1));
            limit = Some(after);
        }
        None => {}
    }

    let upstream = match TcpStream::connect(&state.upstream).await {
        Ok(s) => s,
        Err(e) => {
            let reply = http1::response(502, &[], format!("upstream: {e}\n").as_bytes(), true);
            state.update(idx, |r| r.status = Some(502));
            client.write_all(&reply).await.ok();
            return Err(e).context("connecting upstream");
        }
    };
    close_after_exchange(&mut head);
    // The client's Host stays, so URLs the registry builds point at the proxy.
    head.remove("Expect");
    let (mut up_r, mut up_w) = upstream.into_split();
    let (mut cl_r, mut cl_w) = client.into_split();
    up_w.write_all(&head.to_bytes())
        .await
        .context("forwarding request head")?;
    up_w.write_all(&body_start)
        .await
        .context("forwarding request body")?;
    // Any further request body streams up while the response streams down.
    let body_up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut cl_r, &mut up_w).await;
        let _ = up_w.shutdown().await;
    });
    let edits = Edits {
        limit,
        overflow,
        rate,
        set_header,
    };
    let result = relay_response(&mut up_r, &mut cl_w, state, idx, edits).await;
    body_up.abort();
    if let (Ok(true), Some(d)) = (&result, stall) {
        drop(busy);
        tokio::time::sleep(d).await;
    }
    result.map(|_| ())
}

/// How a relayed response is changed on its way.
struct Edits {
    /// At most this many body bytes.
    limit: Option<u64>,
    /// No Content-Length, and zero bytes after the body, without end.
    overflow: bool,
    /// At most this many body bytes per second.
    rate: Option<u64>,
    /// This header (name, raw value) replaces upstream's.
    set_header: Option<(String, Vec<u8>)>,
}

/// Relays the upstream response as `edits` say. Returns whether the limit cut the body short.
async fn relay_response(
    up: &mut tokio::net::tcp::OwnedReadHalf,
    client: &mut tokio::net::tcp::OwnedWriteHalf,
    state: &State,
    idx: usize,
    edits: Edits,
) -> Result<bool> {
    let Edits {
        limit,
        overflow,
        rate,
        set_header,
    } = edits;
    let Some((mut head, mut pending)) = read_head(up).await? else {
        anyhow::bail!("upstream closed without a response");
    };
    state.update(idx, |r| r.status = head.status());
    close_after_exchange(&mut head);
    if overflow {
        head.remove("Content-Length");
    }
    let mut head_bytes = head.to_bytes();
    if let Some((name, value)) = set_header {
        head.remove(&name);
        head_bytes = head.to_bytes();
        head_bytes.truncate(head_bytes.len() - 2); // the blank line
        head_bytes.extend_from_slice(format!("{name}: ").as_bytes());
        head_bytes.extend_from_slice(&value);
        head_bytes.extend_from_slice(b"\r\n\r\n");
    }
    client
        .write_all(&head_bytes)
        .await
        .context("writing response head")?;
    let mut sent = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    let started = Instant::now();
    loop {
        if pending.is_empty() {
            let n = up.read(&mut chunk).await.context("reading upstream body")?;
            if n == 0 {
                if overflow {
                    send_forever(client, 0, &mut sent, state, idx).await;
                }
                return Ok(false);
            }
            pending.extend_from_slice(&chunk[..n]);
        }
        let room = limit.map_or(u64::MAX, |l| l - sent);
        let mut take = pending
            .len()
            .min(usize::try_from(room).unwrap_or(usize::MAX));
        if let Some(rate) = rate {
            // Small slices, each sent once the rate allows it.
            take = take.min(usize::try_from(rate / 20).unwrap_or(usize::MAX).max(1024));
            let due = Duration::from_secs_f64((sent + take as u64) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        client
            .write_all(&pending[..take])
            .await
            .context("writing response body")?;
        sent += take as u64;
        state.update(idx, |r| r.body_bytes = sent);
        pending.drain(..take);
        if limit == Some(sent) {
            return Ok(true);
        }
    }
}

/// Writes `filler` bytes until the client stops reading (or hangs up), counting them; gives up
/// after 1 GiB, so a client that never stops cannot keep the proxy busy forever.
async fn send_forever<W: AsyncWriteExt + Unpin>(
    client: &mut W,
    filler: u8,
    sent: &mut u64,
    state: &State,
    idx: usize,
) {
    let chunk = vec![filler; 64 * 1024];
    let start = *sent;
    while *sent - start < 1 << 30 {
        let write = client.write_all(&chunk);
        match tokio::time::timeout(Duration::from_secs(10), write).await {
            Ok(Ok(())) => {
                *sent += chunk.len() as u64;
                state.update(idx, |r| r.body_bytes = *sent);
            }
            _ => return,
        }
    }
}

fn close_after_exchange(head: &mut Head) {
    head.remove("Keep-Alive");
    head.remove("Proxy-Connection");
    head.set("Connection", "close");
}
