//! FleetLock servers on loopback that answer as the two servers fleets run, read from their
//! source (no real one runs here: airlock needs etcd, poseidon/fleetlock a Kubernetes API):
//!
//! - [`Flavour::Airlock`] (coreos/airlock, `internal/server/{pre_reboot,steady_state,http_params}.go`,
//!   `internal/lock/semaphore.go`): a counting semaphore of configured slots per group; groups not
//!   configured are `400 unknown_group`; no method check; a bad header or body is
//!   `400 invalid_client_identity`; a recursive lock and a non-holder's steady-state are `200`;
//!   a full semaphore is `500 failed_lock` "all N semaphore slots currently locked"; success is
//!   `200` with an empty body; errors are JSON sent as `text/plain`.
//! - [`Flavour::Poseidon`] (poseidon/fleetlock, `internal/{server,handlers,decode,encode,drain,nodes}.go`):
//!   one holder per group (a Lease), non-POST `405 method_not_allowed`, a bad header
//!   `400 missing_header`, a bad body `400 decode_error`; a lock held by another is
//!   `423 lock_held` for pre-reboot and for steady-state alike; pre-reboot drains the node whose
//!   machine ID gives zincati's app-specific id, and ignores a failed match; steady-state by the
//!   holder uncordons that node first, and when no node matches answers
//!   `500 internal_error "error uncordoning node"` keeping the lease; success bodies are text.
//!   The drain runs inside the pre-reboot request (`internal/server.go` `lock`: the reply is
//!   written, then `DrainNode` runs before the handler returns, with no timeout, so the client
//!   sees the answer only once the node is drained): [`FleetLockServer::set_drain_time`].
//!
//! Both serve `/v1/pre-reboot` and `/v1/steady-state` at the root of their listener
//! (poseidon's `internal/server.go` ServeMux, airlock's `internal/cli/serve.go`); anything else
//! is Go's `404 page not found`. Neither sends `Retry-After`; a gateway in front of one may
//! ([`FleetLockServer::gateway`]).

use crate::http1::{read_head, response};
use crate::serve::Server;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a gateway in front of the server does to the next requests ([`FleetLockServer::gateway`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gateway {
    /// Passes the request to the server, which acts on it, but answers `502 Bad Gateway` with
    /// its own HTML page: the server's answer (a grant, say) is lost on the way.
    LoseAnswer,
    /// Answers `429 Too Many Requests` with `Retry-After: <seconds>` itself, without passing the
    /// request on.
    RateLimit { retry_after: u64 },
}

/// Which real server this one answers as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// Slots per configured group (airlock's `[[lock.groups]]`).
    Airlock { groups: BTreeMap<String, usize> },
    /// One holder per group; the cluster's nodes by machine ID.
    Poseidon,
}

/// One request as the server judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// `pre-reboot` or `steady-state` (or the path, for anything else).
    pub operation: String,
    pub id: String,
    pub group: String,
    pub status: u16,
    pub at: Instant,
}

/// A Kubernetes node as poseidon/fleetlock sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub machine_id: String,
    pub unschedulable: bool,
    /// Times pre-reboot drained it.
    pub drains: u32,
}

struct State {
    flavour: Flavour,
    holders: BTreeMap<String, Vec<String>>,
    nodes: Vec<Node>,
    requests: Vec<LockRequest>,
    /// How long poseidon's drain takes before the pre-reboot answer leaves.
    drain_time: Duration,
    /// What the gateway does to the next requests, in order.
    gateway: std::collections::VecDeque<Gateway>,
}

pub struct FleetLockServer {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl FleetLockServer {
    /// An airlock with the group `default` of `slots` slots, as its configuration without
    /// `[[lock.groups]]` (`default_slots`).
    pub fn start(slots: usize) -> Result<FleetLockServer> {
        FleetLockServer::airlock(&[("default", slots)])
    }

    /// An airlock with these groups (the default group always exists, with 1 slot unless
    /// named here).
    pub fn airlock(groups: &[(&str, usize)]) -> Result<FleetLockServer> {
        let mut map: BTreeMap<String, usize> = BTreeMap::from([("default".to_string(), 1)]);
        map.extend(groups.iter().map(|(g, n)| (g.to_string(), *n)));
        FleetLockServer::with(Flavour::Airlock { groups: map })
    }

    /// A poseidon/fleetlock serving a cluster without nodes yet ([`Self::add_node`]).
    pub fn poseidon() -> Result<FleetLockServer> {
        FleetLockServer::with(Flavour::Poseidon)
    }

    fn with(flavour: Flavour) -> Result<FleetLockServer> {
        let state = Arc::new(Mutex::new(State {
            flavour,
            holders: BTreeMap::new(),
            nodes: Vec::new(),
            requests: Vec::new(),
            drain_time: Duration::ZERO,
            gateway: Default::default(),
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

    /// The base URL clients are configured with: the root, where both real servers serve
    /// `/v1/...`, written as zincati's docs write base URLs (with the trailing `/`).
    pub fn base_url(&self) -> String {
        format!("http://{}/", self.server.addr())
    }

    /// poseidon's drain of a node takes `time` from now on: its pre-reboot answer leaves only
    /// then (the drain runs inside the request).
    pub fn set_drain_time(&self, time: Duration) {
        self.state.lock().unwrap().drain_time = time;
    }

    /// The next requests meet the gateway's `faults`, one each, in order.
    pub fn gateway(&self, faults: &[Gateway]) {
        self.state
            .lock()
            .unwrap()
            .gateway
            .extend(faults.iter().cloned());
    }

    /// airlock's configuration gains a group of `slots` (an admin fixing it; airlock reads its
    /// configuration at start, so this is a restart with the new configuration).
    pub fn add_group(&self, group: &str, slots: usize) {
        if let Flavour::Airlock { groups } = &mut self.state.lock().unwrap().flavour {
            groups.insert(group.to_string(), slots);
        }
    }

    /// The server goes away for `duration` (connections refused), then comes back with its
    /// state, as a restarted server whose locks live in etcd or a Lease.
    pub fn down_for(&self, duration: Duration) -> Result<()> {
        self.server.refuse_for(duration)
    }

    /// The server goes away until the returned value is dropped.
    pub fn down(&self) -> Result<crate::serve::Resumer> {
        self.server.refuse_until_resumed()
    }

    /// A node joins the cluster (poseidon: what `Node.Status.NodeInfo.MachineID` reports).
    pub fn add_node(&self, name: &str, machine_id: &str) {
        self.state.lock().unwrap().nodes.push(Node {
            name: name.into(),
            machine_id: machine_id.into(),
            ..Default::default()
        });
    }

    pub fn node(&self, name: &str) -> Option<Node> {
        let state = self.state.lock().unwrap();
        state.nodes.iter().find(|n| n.name == name).cloned()
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

/// zincati's app-specific id of a machine ID, as poseidon's `ZincatiID` computes it:
/// HMAC-SHA256 keyed by the machine ID's 16 bytes over zincati's app ID, the first 16 bytes
/// marked as a version-4 UUID, lower-case hex.
pub fn zincati_id(machine_id: &str) -> Option<String> {
    use openssl::{hash::MessageDigest, pkey::PKey, sign::Signer};
    let key = hex_bytes(&machine_id.replace('-', ""))?;
    let app = hex_bytes("de35106b6ec24688b63afddaa156679b")?;
    let pkey = PKey::hmac(&key).ok()?;
    let mut signer = Signer::new(MessageDigest::sha256(), &pkey).ok()?;
    signer.update(&app).ok()?;
    let mut b = signer.sign_to_vec().ok()?;
    b.truncate(16);
    b[6] = (b[6] & 0x0F) | 0x40;
    b[8] = (b[8] & 0x3F) | 0x80;
    Some(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    if text.len() != 32 {
        return None;
    }
    (0..16)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn error(kind: &str, value: &str) -> Vec<u8> {
    let mut body = serde_json::json!({"kind": kind, "value": value})
        .to_string()
        .into_bytes();
    // Both servers' encoders end the JSON with a newline.
    body.push(b'\n');
    body
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
    let fault = state.lock().unwrap().gateway.pop_front();
    if let Some(Gateway::RateLimit { retry_after }) = fault {
        let retry_after = retry_after.to_string();
        let headers = [
            ("Content-Type", "text/html"),
            ("Retry-After", retry_after.as_str()),
        ];
        let mut request = judged_request(&head, &body, 429);
        request.operation = format!("gateway:{}", request.operation);
        state.lock().unwrap().requests.push(request);
        let page = b"<html><body><h1>429 Too Many Requests</h1></body></html>\n";
        stream
            .write_all(&response(429, &headers, page, true))
            .await?;
        return Ok(());
    }
    let (status, reply, content_type, request) = judge(&head, &body, state);
    let drained = request.operation == "pre-reboot" && status == 200;
    state.lock().unwrap().requests.push(request);
    let drain_time = state.lock().unwrap().drain_time;
    if drained && matches!(state.lock().unwrap().flavour, Flavour::Poseidon) {
        tokio::time::sleep(drain_time).await;
    }
    if let Some(Gateway::LoseAnswer) = fault {
        let page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n";
        let headers = [("Content-Type", "text/html")];
        stream
            .write_all(&response(502, &headers, page, true))
            .await?;
        return Ok(());
    }
    let headers = [("Content-Type", content_type)];
    stream
        .write_all(&response(status, &headers, &reply, true))
        .await?;
    Ok(())
}

fn judged_request(head: &crate::http1::Head, body: &[u8], status: u16) -> LockRequest {
    let (id, group) = params(body).unwrap_or_default();
    LockRequest {
        operation: operation(head),
        id,
        group,
        status,
        at: Instant::now(),
    }
}

/// `pre-reboot` or `steady-state` for the two endpoints at the root, else the path.
fn operation(head: &crate::http1::Head) -> String {
    let path = head.target().split('?').next().unwrap_or_default();
    match path {
        "/v1/pre-reboot" => "pre-reboot".into(),
        "/v1/steady-state" => "steady-state".into(),
        other => other.to_string(),
    }
}

/// The decoded `client_params` (Go's decoder: unknown fields ignored, missing ones empty).
fn params(body: &[u8]) -> Option<(String, String)> {
    let v = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    let p = v.get("client_params");
    let field = |name: &str| {
        p.and_then(|p| p.get(name))
            .and_then(|f| f.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Some((field("id"), field("group")))
}

type Judged = (u16, Vec<u8>, &'static str, LockRequest);

fn judge(head: &crate::http1::Head, body: &[u8], state: &Mutex<State>) -> Judged {
    let operation = operation(head);
    let params = params(body);
    let (id, group) = params.clone().unwrap_or_default();
    let mut state = state.lock().unwrap();
    let (status, reply, content_type) = if operation != "pre-reboot" && operation != "steady-state"
    {
        // Go's ServeMux.
        (
            404,
            b"404 page not found\n".to_vec(),
            "text/plain; charset=utf-8",
        )
    } else {
        match state.flavour.clone() {
            Flavour::Airlock { groups } => {
                let (status, reply) = airlock(&mut state, &groups, head, &operation, params);
                (status, reply, "text/plain; charset=utf-8")
            }
            Flavour::Poseidon => poseidon(&mut state, head, &operation, params),
        }
    };
    let request = LockRequest {
        operation,
        id,
        group,
        status,
        at: Instant::now(),
    };
    (status, reply, content_type, request)
}

fn airlock(
    state: &mut State,
    groups: &BTreeMap<String, usize>,
    head: &crate::http1::Head,
    operation: &str,
    params: Option<(String, String)>,
) -> (u16, Vec<u8>) {
    let invalid = |why: &str| {
        (
            400,
            error(
                "invalid_client_identity",
                &format!("failed to validate client identity: {why}"),
            ),
        )
    };
    if head.header("fleet-lock-protocol") != Some("true") {
        return invalid("wrong 'fleet-lock-protocol' header");
    }
    let Some((id, group)) = params else {
        return invalid("EOF");
    };
    if group.is_empty() {
        return invalid("empty client group");
    }
    if id.is_empty() {
        return invalid("empty client ID");
    }
    let Some(&slots) = groups.get(&group) else {
        return (
            400,
            error("unknown_group", &format!("unknown group {group:?}")),
        );
    };
    let holders = state.holders.entry(group).or_default();
    if operation == "pre-reboot" {
        if !holders.contains(&id) {
            if holders.len() >= slots {
                return (
                    500,
                    error(
                        "failed_lock",
                        &format!("all {slots} semaphore slots currently locked"),
                    ),
                );
            }
            holders.push(id);
            holders.sort();
        }
    } else {
        holders.retain(|h| *h != id);
    }
    (200, Vec::new())
}

fn poseidon(
    state: &mut State,
    head: &crate::http1::Head,
    operation: &str,
    params: Option<(String, String)>,
) -> (u16, Vec<u8>, &'static str) {
    let json = "application/json";
    let text = "text/plain; charset=utf-8";
    if head.method() != "POST" {
        return (
            405,
            error("method_not_allowed", "required method POST"),
            json,
        );
    }
    if head.header("fleet-lock-protocol") != Some("true") {
        return (
            400,
            error(
                "missing_header",
                "missing required header fleet-lock-protocol: true",
            ),
            json,
        );
    }
    let Some((id, group)) = params.filter(|(id, group)| !id.is_empty() && !group.is_empty()) else {
        return (400, error("decode_error", "error decoding message"), json);
    };
    let holder = state
        .holders
        .get(&group)
        .and_then(|h| h.first().cloned())
        .unwrap_or_default();
    let node = state
        .nodes
        .iter()
        .position(|n| zincati_id(&n.machine_id).as_deref() == Some(id.as_str()));
    if operation == "pre-reboot" {
        let reply = if holder == id {
            "retained reboot lease"
        } else if holder.is_empty() {
            state.holders.insert(group, vec![id]);
            "obtained reboot lease"
        } else {
            return (
                423,
                error(
                    "lock_held",
                    &format!("reboot lease lock unavailable, held by {holder}"),
                ),
                json,
            );
        };
        // The drain is best effort: no matching node is no error.
        if let Some(i) = node {
            state.nodes[i].unschedulable = true;
            state.nodes[i].drains += 1;
        }
        return (200, reply.as_bytes().to_vec(), text);
    }
    if holder.is_empty() {
        return (200, b"reboot lease already unlocked".to_vec(), text);
    }
    if holder != id {
        return (
            423,
            error(
                "lock_held",
                &format!("reboot lease unlock unavailable, held by {holder}"),
            ),
            json,
        );
    }
    let Some(i) = node else {
        return (500, error("internal_error", "error uncordoning node"), json);
    };
    state.nodes[i].unschedulable = false;
    state.holders.remove(&group);
    (
        200,
        format!("unlocked reboot lease for {id}").into_bytes(),
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zincati_id_matches_poseidons_test_vector() {
        // poseidon/fleetlock internal/nodes_test.go TestZincatiID.
        for machine_id in [
            "1c09ca98649c4c7abc779cd04c96812e",
            "1c09ca98-649c-4c7a-bc77-9cd04c96812e",
        ] {
            assert_eq!(
                zincati_id(machine_id).as_deref(),
                Some("978a225b3d7b40e9acd7ce9b62f68444")
            );
        }
        assert_eq!(zincati_id("not hex"), None);
    }
}
