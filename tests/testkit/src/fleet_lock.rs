//! A FleetLock server on loopback that follows the protocol as published (zincati's
//! `docs/development/fleetlock/protocol.md`), since no real one (airlock needs etcd, fleetlock a
//! Kubernetes cluster) runs here: `POST <base>/v1/pre-reboot` and `<base>/v1/steady-state`, the
//! `fleet-lock-protocol: true` header required, a JSON body with `client_params.id` and
//! `client_params.group` (`^[a-zA-Z0-9.-]+$`), a counting semaphore per group with owned,
//! recursive locks, 200 for success and a `{"kind", "value"}` error body otherwise.

use crate::http1::{read_head, response};
use crate::serve::Server;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The path the server's endpoints live under, so clients must keep a base URL's path.
pub const BASE_PATH: &str = "/fleetlock";

/// One request as the server judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// `pre-reboot` or `steady-state` (or the path, for anything else).
    pub operation: String,
    pub id: String,
    pub group: String,
    pub status: u16,
}

#[derive(Default)]
struct State {
    slots: usize,
    holders: BTreeMap<String, Vec<String>>,
    requests: Vec<LockRequest>,
}

pub struct FleetLockServer {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl FleetLockServer {
    /// A server granting `slots` concurrent reboots per group.
    pub fn start(slots: usize) -> Result<FleetLockServer> {
        let state = Arc::new(Mutex::new(State {
            slots,
            ..Default::default()
        }));
        let shared = state.clone();
        let server = Server::spawn("pivot-fleetlock", move |stream| {
            let state = shared.clone();
            async move {
                if let Err(e) = handle(stream, &state).await {
                    eprintln!("fleetlock server: {e:#}");
                }
            }
        })?;
        Ok(FleetLockServer { server, state })
    }

    pub fn port(&self) -> u16 {
        self.server.addr().port()
    }

    /// The base URL clients are configured with.
    pub fn base_url(&self) -> String {
        format!("http://{}{BASE_PATH}", self.server.addr())
    }

    /// Another node takes a slot in `group`, as its own pre-reboot would.
    pub fn hold(&self, group: &str, id: &str) {
        let mut state = self.state.lock().unwrap();
        let holders = state.holders.entry(group.to_string()).or_default();
        if !holders.iter().any(|h| h == id) {
            holders.push(id.to_string());
        }
    }

    /// That node gives its slot back, as its own steady-state would.
    pub fn release(&self, group: &str, id: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(holders) = state.holders.get_mut(group) {
            holders.retain(|h| h != id);
        }
    }

    pub fn holders(&self, group: &str) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state.holders.get(group).cloned().unwrap_or_default()
    }

    pub fn requests(&self) -> Vec<LockRequest> {
        self.state.lock().unwrap().requests.clone()
    }
}

fn error(kind: &str, value: &str) -> Vec<u8> {
    serde_json::json!({"kind": kind, "value": value})
        .to_string()
        .into_bytes()
}

async fn handle(mut stream: TcpStream, state: &Mutex<State>) -> Result<()> {
    let Some((head, mut body)) = read_head(&mut stream).await? else {
        return Ok(());
    };
    let length: usize = head
        .header("Content-Length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    if length > 64 * 1024 {
        anyhow::bail!("body of {length} bytes");
    }
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = stream.read(&mut chunk).await.context("reading the body")?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let (status, reply, request) = judge(&head, &body, state);
    state.lock().unwrap().requests.push(request);
    let json = [("Content-Type", "application/json")];
    stream
        .write_all(&response(status, &json, &reply, true))
        .await?;
    Ok(())
}

fn judge(
    head: &crate::http1::Head,
    body: &[u8],
    state: &Mutex<State>,
) -> (u16, Vec<u8>, LockRequest) {
    let path = head.target().split('?').next().unwrap_or_default();
    let operation = path
        .strip_prefix(BASE_PATH)
        .and_then(|p| p.strip_prefix("/v1/"))
        .unwrap_or(path)
        .to_string();
    let params: Option<(String, String)> = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let p = v.get("client_params")?;
            Some((
                p.get("id")?.as_str()?.to_string(),
                p.get("group")?.as_str()?.to_string(),
            ))
        });
    let (id, group) = params.clone().unwrap_or_default();
    let mut request = LockRequest {
        operation: operation.clone(),
        id: id.clone(),
        group: group.clone(),
        status: 0,
    };
    let (status, reply) = if head.method() != "POST" {
        (405, error("failed_method", "only POST is accepted"))
    } else if operation != "pre-reboot" && operation != "steady-state" {
        (404, error("failed_endpoint", "no such endpoint"))
    } else if head.header("fleet-lock-protocol") != Some("true") {
        (
            400,
            error("failed_header", "missing fleet-lock-protocol: true header"),
        )
    } else if params.is_none() || id.is_empty() {
        (
            400,
            error(
                "failed_body",
                "client_params.id and client_params.group are required",
            ),
        )
    } else if group.is_empty()
        || !group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        (
            400,
            error("failed_group", "group must match ^[a-zA-Z0-9.-]+$"),
        )
    } else {
        let mut state = state.lock().unwrap();
        let slots = state.slots;
        let holders = state.holders.entry(group.clone()).or_default();
        if operation == "pre-reboot" {
            if holders.contains(&id) {
                (200, Vec::new())
            } else if holders.len() < slots {
                holders.push(id.clone());
                (200, Vec::new())
            } else {
                (
                    409,
                    error(
                        "failed_lock_semaphore_full",
                        "semaphore currently full, all slots are locked already",
                    ),
                )
            }
        } else {
            holders.retain(|h| *h != id);
            (200, Vec::new())
        }
    };
    request.status = status;
    (status, reply, request)
}
