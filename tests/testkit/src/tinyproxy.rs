//! A real forward proxy on loopback: Debian's `tinyproxy`, with its log read back to see which
//! requests it carried (plain-HTTP requests by their absolute URL, TLS ones as `CONNECT`).

use anyhow::{bail, Context, Result};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Tinyproxy {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    pub fn start() -> Result<Tinyproxy> {
        let dir = tempfile::Builder::new()
            .prefix("pivot-tinyproxy-")
            .tempdir()?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = dir.path().join("tinyproxy.log");
        let conf = dir.path().join("tinyproxy.conf");
        // No ConnectPort line: CONNECT is allowed to any port (the registries' random ones).
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{}\"\nLogLevel Info\n\
                 MaxClients 32\nAllow 127.0.0.1\n",
                log.display()
            ),
        )?;
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tinyproxy")?;
        let mut proxy = Tinyproxy {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = proxy.child.try_wait()? {
                bail!("tinyproxy exited ({status}): {}", proxy.log());
            }
            if Instant::now() > deadline {
                bail!("tinyproxy did not listen on {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(proxy)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The requests it carried to `host` (`host:port`), as its log lines name them.
    pub fn requests_to(&self, host: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| l.split_once("Request (file descriptor ").map(|(_, r)| r))
            .filter_map(|r| r.split_once("): ").map(|(_, r)| r.to_string()))
            .filter(|r| r.contains(host))
            .collect()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
