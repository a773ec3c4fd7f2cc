//! A real `docker-registry` (distribution 2.8) process on loopback.

use crate::registry_config::{copy_dir, Options, RegistryBuilder, Storage};
use anyhow::{bail, Context, Result};
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// One request as recorded in the registry's combined-format access log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogEntry {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Body bytes the registry wrote (what reached the socket, for a cut connection).
    pub bytes: u64,
}

pub struct Registry {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    port: u16,
    child: Option<Child>,
    opts: Options,
}

impl Registry {
    /// A plain-HTTP registry without auth.
    pub fn start() -> Result<Registry> {
        Registry::builder().start()
    }

    /// Options for auth, TLS and storage; see [`RegistryBuilder`].
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    pub(crate) fn start_with(opts: Options) -> Result<Registry> {
        let dir = tempfile::Builder::new()
            .prefix("pivot-registry-")
            .tempdir()
            .context("creating registry temp dir")?;
        let root = dir.path().to_path_buf();
        if let Storage::CopiedFrom(from) = &opts.storage {
            let to = root.join("storage");
            if from.exists() {
                copy_dir(from, &to)?;
            }
        }
        let mut last_err = None;
        // A port found free can be taken again before the registry binds it; retry then.
        for _ in 0..3 {
            let port = free_port()?;
            let mut reg = Registry {
                dir: None,
                root: root.clone(),
                port,
                child: None,
                opts: opts.clone(),
            };
            match reg.start_again() {
                Ok(()) => {
                    reg.dir = Some(dir);
                    return Ok(reg);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.expect("at least one attempt"))
    }

    /// (Re)starts the process on the same port and storage; the log is appended to.
    pub fn start_again(&mut self) -> Result<()> {
        self.stop();
        let config = self.write_config()?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .context("opening registry log")?;
        let log2 = log.try_clone().context("duplicating registry log fd")?;
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .with_context(|| format!("spawning {REGISTRY_BIN}"))?;
        self.child = Some(child);
        self.wait_ready()
            .with_context(|| format!("registry log tail:\n{}", self.log_tail(20)))
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// "https://127.0.0.1:PORT" with TLS, else "http://...".
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "https" } else { "http" };
        format!("{scheme}://{}", self.host())
    }

    pub fn is_tls(&self) -> bool {
        self.opts.tls.is_some()
    }

    /// The CA that issued the server certificate, when TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.opts.tls.as_ref().map(|t| t.ca_pem.clone())
    }

    /// Whether TLS clients must present a certificate from the client CA.
    pub fn requires_client_cert(&self) -> bool {
        self.opts.client_ca_pem.is_some()
    }

    /// The user and password the kit's own pushes send (the first htpasswd
    /// user, or the token server's first user).
    pub fn credentials(&self) -> Option<(String, String)> {
        self.opts.push_credentials()
    }

    /// Writes `<dir>/<host>/ca.crt` (certs.d(5) layout) when TLS; returns
    /// `<dir>/<host>`, a directory usable as `--cert-dir`.
    pub fn write_certs_d(&self, dir: &Path) -> Result<PathBuf> {
        let ca = self
            .ca_pem()
            .with_context(|| format!("registry {} has no TLS", self.host()))?;
        let host_dir = dir.join(self.host());
        fs::create_dir_all(&host_dir)
            .with_context(|| format!("creating {}", host_dir.display()))?;
        crate::tls::write(&host_dir.join("ca.crt"), &ca)?;
        Ok(host_dir)
    }

    pub fn storage_dir(&self) -> PathBuf {
        match &self.opts.storage {
            Storage::Shared(dir) => dir.clone(),
            Storage::Own | Storage::CopiedFrom(_) => self.root.join("storage"),
        }
    }

    /// Kills and reaps the process; safe to call repeatedly.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process and keeps its directory (storage, config, log) on disk.
    pub fn into_kept_dir(mut self) -> PathBuf {
        self.stop();
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        self.root.clone()
    }

    /// Where the filesystem driver stores a blob; accepts `sha256:<hex>` or `<hex>`.
    pub fn blob_data_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        let first2 = hex.get(..2).unwrap_or(hex);
        self.storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(first2)
            .join(hex)
            .join("data")
    }

    /// Places `manifest` into the registry's own storage as `repository:tag` (and by digest),
    /// as distribution's filesystem driver lays it out; returns its digest. For manifests whose
    /// blobs exist nowhere (containers/image's signature fixtures name blobs it does not
    /// publish), which no registry accepts by push: the registry then serves them as it serves
    /// any manifest.
    pub fn store_manifest(&self, repository: &str, tag: &str, manifest: &[u8]) -> Result<String> {
        let digest = crate::push::sha256_digest(manifest);
        let hex = digest.trim_start_matches("sha256:");
        let data = self.blob_data_path(&digest);
        fs::create_dir_all(data.parent().expect("a blob path has a parent"))?;
        fs::write(&data, manifest)?;
        let manifests = self
            .storage_dir()
            .join("docker/registry/v2/repositories")
            .join(repository)
            .join("_manifests");
        for link in [
            manifests.join("revisions/sha256").join(hex),
            manifests.join("tags").join(tag).join("current"),
            manifests
                .join("tags")
                .join(tag)
                .join("index/sha256")
                .join(hex),
        ] {
            fs::create_dir_all(&link)?;
            fs::write(link.join("link"), &digest)?;
        }
        Ok(digest)
    }

    pub fn log(&self) -> String {
        fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Requests recorded so far, in order, from the access-log lines.
    pub fn requests(&self) -> Vec<AccessLogEntry> {
        self.settle_log();
        self.log().lines().filter_map(parse_access_line).collect()
    }

    /// Number of requests with exactly `method` whose path contains `path_contains`.
    pub fn count_requests(&self, method: &str, path_contains: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path.contains(path_contains))
            .count()
    }

    /// Writes `dir/registries.conf` listing this registry, marked insecure
    /// when it is plain HTTP.
    pub fn registries_conf(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join("registries.conf");
        let insecure = if self.is_tls() {
            ""
        } else {
            "insecure = true\n"
        };
        let text = format!(
            "unqualified-search-registries = []\n\n[[registry]]\nlocation = \"{}\"\n{insecure}",
            self.host()
        );
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    fn log_path(&self) -> PathBuf {
        self.root.join("registry.log")
    }

    fn write_config(&self) -> Result<PathBuf> {
        self.opts
            .write_config(&self.root, &self.storage_dir(), &self.host())
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().context("polling registry")? {
                    self.child = None;
                    bail!("docker-registry exited early: {status}");
                }
            }
            // A plain request to a TLS port gets Go's 400; auth answers 401.
            let ready: &[u16] = match (self.is_tls(), self.credentials().is_some()) {
                (true, _) => &[400],
                (false, true) => &[401],
                (false, false) => &[200],
            };
            if let Ok(code) = http_status(self.port, "/v2/") {
                if ready.contains(&code) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.stop();
                bail!(
                    "docker-registry on {} not ready after {READY_TIMEOUT:?}",
                    self.host()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The access line is written right around the response; wait briefly until
    /// the log stops growing so a count taken right after a request includes it.
    fn settle_log(&self) {
        let len = || fs::metadata(self.log_path()).map(|m| m.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut last = len();
        loop {
            std::thread::sleep(Duration::from_millis(30));
            let now = len();
            if now == last || Instant::now() > deadline {
                return;
            }
            last = now;
        }
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a free loopback port")?;
    Ok(listener.local_addr().context("reading bound port")?.port())
}

/// Minimal HTTP/1.0 GET so readiness checks need no HTTP client.
fn http_status(port: u16, path: &str) -> Result<u16> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    let code = line
        .split_whitespace()
        .nth(1)
        .context("no status code")?
        .parse()?;
    Ok(code)
}

/// Parses a combined-log line:
/// `127.0.0.1 - - [30/Nov/2026:15:30:32 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "curl/7.88.1"`.
/// The logrus "response completed" lines describe the same requests and are skipped,
/// so each request counts once.
fn parse_access_line(line: &str) -> Option<AccessLogEntry> {
    let after_time = &line[line.find("] \"")? + 3..];
    let (request, rest) = after_time.split_once('"')?;
    let mut parts = request.split(' ');
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let mut fields = rest.split_whitespace();
    let status = fields.next()?.parse().ok()?;
    let bytes = fields.next().and_then(|b| b.parse().ok()).unwrap_or(0);
    Some(AccessLogEntry {
        method,
        path,
        status,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_access_lines_only() {
        let access = r#"127.0.0.1 - - [30/Nov/2026:15:30:32 +0000] "HEAD /v2/foo/manifests/latest HTTP/1.1" 404 96 "" "curl/7.88.1""#;
        let logrus = r#"time="2026-11-30T15:30:32Z" level=info msg="response completed" http.request.method=GET http.request.uri=/v2/ http.response.status=200"#;
        assert_eq!(
            parse_access_line(access),
            Some(AccessLogEntry {
                method: "HEAD".into(),
                path: "/v2/foo/manifests/latest".into(),
                status: 404,
                bytes: 96,
            })
        );
        assert_eq!(parse_access_line(logrus), None);
    }
}
