//! A FleetLock client, as zincati speaks the protocol (zincati's
//! `docs/development/fleetlock/protocol.md`): `POST <base>/v1/pre-reboot` to take a reboot slot
//! before rebooting, `POST <base>/v1/steady-state` to give it back once the node is up again;
//! header `fleet-lock-protocol: true`, body `{"client_params": {"id", "group"}}`. Any 2xx is
//! yes, as zincati takes it (poseidon/fleetlock answers 200 with text, airlock with nothing);
//! anything else is no, with the server's `{"kind", "value"}` error when it sends one (airlock
//! sends it as `text/plain`, so the body is parsed whatever its type). Both operations are
//! recursive on the server, so repeating either is harmless.
//!
//! A no is one of two kinds ([`Answer::is_misconfiguration`]). *Not now*: the lock is held
//! (poseidon's `423 lock_held`, for steady-state too while another node holds its group's
//! lease; airlock's `500 failed_lock` when all slots are taken), the server is busy or failing
//! (408, 429, 5xx). *A configuration to fix*: any other 4xx (a malformed request, airlock's
//! `400 unknown_group`, a base URL that names no FleetLock endpoint: 404, 405). zincati asks
//! again after either, at its usual period; pivot does too, the second more slowly and loudly
//! (an admin may be fixing the server's groups right now: a node that stopped asking would
//! stay behind until its next boot).
//!
//! Whether a no came from the FleetLock server itself ([`Answer::is_from_server`]) matters
//! for the slot record: only the server's own `{"kind", "value"}` error says it did not grant.
//! A gateway's 502 or 504, or a timeout, may hide a grant the server made.
//!
//! Endpoints are resolved against the base URL as zincati resolves them (`Url::join` with
//! `v1/pre-reboot`): a base with a trailing `/` keeps its path, one without has its last
//! segment replaced. `Retry-After` (RFC 9110), which neither server sends but a gateway or
//! proxy in front of one may, is honoured.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use reqwest::Url;
use serde::Deserialize;

use super::config::FleetLock;

/// The longest `Retry-After` honoured: a day. A longer one (or an absurd one) is taken as that.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

pub struct Client {
    http: reqwest::Client,
    pub base_url: String,
    pub id: String,
    pub group: String,
    pre_reboot: Url,
    steady_state: Url,
}

/// The server's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Granted,
    Refused {
        status: u16,
        /// The error's `kind` (e.g. poseidon's `lock_held`, airlock's `failed_lock`), if the body
        /// had one: the FleetLock server's own answer, not a gateway's.
        kind: Option<String>,
        /// The error's `value`, else the body's text.
        why: String,
        /// `Retry-After`, bounded by [`MAX_RETRY_AFTER`].
        retry_after: Option<Duration>,
    },
}

#[derive(Deserialize)]
struct ErrorBody {
    kind: String,
    value: String,
}

/// `v1/<operation>` resolved against `base_url` as zincati resolves it.
pub fn endpoint(base_url: &str, operation: &str) -> Result<Url> {
    let base = Url::parse(base_url)
        .with_context(|| format!("the FleetLock base URL {base_url:?} is not a URL"))?;
    base.join(&format!("v1/{operation}"))
        .with_context(|| format!("resolving v1/{operation} against {base_url}"))
}

impl Client {
    pub fn new(lock: &FleetLock, id: String) -> Result<Client> {
        let pre_reboot = endpoint(&lock.base_url, "pre-reboot")?;
        let steady_state = endpoint(&lock.base_url, "steady-state")?;
        Client::with_endpoints(lock, id, pre_reboot, steady_state)
    }

    /// A client for the endpoints given, whatever the base URL would resolve to (a slot record
    /// of an earlier pivot names where it asked).
    pub fn with_endpoints(
        lock: &FleetLock,
        id: String,
        pre_reboot: Url,
        steady_state: Url,
    ) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(lock.timeout)
            .user_agent(concat!("pivot/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("setting up the FleetLock client")?;
        Ok(Client {
            http,
            base_url: lock.base_url.clone(),
            id,
            group: lock.group.clone(),
            pre_reboot,
            steady_state,
        })
    }

    pub fn steady_state_url(&self) -> &Url {
        &self.steady_state
    }

    /// Asks for a reboot slot.
    pub async fn pre_reboot(&self) -> Result<Answer> {
        self.post(&self.pre_reboot).await
    }

    /// Gives the slot back (also when this node holds none).
    pub async fn steady_state(&self) -> Result<Answer> {
        self.post(&self.steady_state).await
    }

    async fn post(&self, url: &Url) -> Result<Answer> {
        let body = serde_json::json!({"client_params": {"id": self.id, "group": self.group}});
        let response = self
            .http
            .post(url.clone())
            .header("fleet-lock-protocol", "true")
            .json(&body)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{}", crate::fetch::retry::describe(&e)))
            .with_context(|| format!("POST {url}"))?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(Answer::Granted);
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .map(|v| v.as_bytes().to_vec());
        // A refusal's body is a short JSON error; more is not read.
        let body = read_at_most(response, MAX_BODY).await;
        Ok(refused(status, retry_after.as_deref(), &body))
    }
}

/// The most of a refusal's body that is read.
const MAX_BODY: usize = 64 * 1024;
/// The most of a refusal's reason (or kind) that is kept: it goes into one journal line.
const MAX_WHY: usize = 200;

/// The answer a refusal makes: status `status`, the `Retry-After` header's bytes if it was sent,
/// and (the start of) its body. Whatever a server or a gateway sends, this is a refusal whose
/// texts are one short line each and whose wait is at most [`MAX_RETRY_AFTER`].
pub fn refused(status: u16, retry_after_header: Option<&[u8]>, body: &[u8]) -> Answer {
    let retry_after = retry_after_header
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(retry_after);
    refusal(status, &String::from_utf8_lossy(body), retry_after)
}

/// A `Retry-After` value, bounded by [`MAX_RETRY_AFTER`]; `None` for one that is neither
/// delay-seconds nor an HTTP-date (the interval applies).
fn retry_after(value: &str) -> Option<Duration> {
    crate::fetch::retry_after::parse(value, SystemTime::now()).map(|d| d.min(MAX_RETRY_AFTER))
}

async fn read_at_most(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= limit {
            body.truncate(limit);
            break;
        }
    }
    body
}

/// A refusal with status `status` and body `text`.
fn refusal(status: u16, text: &str, retry_after: Option<Duration>) -> Answer {
    match serde_json::from_str::<ErrorBody>(text) {
        Ok(error) => Answer::Refused {
            status,
            kind: Some(short(&error.kind)),
            why: short(&error.value),
            retry_after,
        },
        Err(_) => Answer::Refused {
            status,
            kind: None,
            why: short(text),
            retry_after,
        },
    }
}

/// `text` on one line (no control character left), at most [`MAX_WHY`] characters of it.
fn short(text: &str) -> String {
    let line: String = crate::node::logging::one_line(text)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_WHY)
        .collect();
    line.trim().to_string()
}

impl Answer {
    /// A refusal that only a change of configuration (the node's or the server's) can turn
    /// into a yes (see the module docs).
    pub fn is_misconfiguration(&self) -> bool {
        match self {
            Answer::Granted => false,
            Answer::Refused { status, .. } => {
                (400..500).contains(status) && !matches!(status, 408 | 423 | 429)
            }
        }
    }

    /// Whether the FleetLock server itself refused (its `{"kind", "value"}` error): then it
    /// did not grant. Anything else (a gateway's 502 or 504, a proxy's page) may hide a grant.
    pub fn is_from_server(&self) -> bool {
        matches!(self, Answer::Refused { kind: Some(_), .. })
    }

    /// The wait the answer asks for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Answer::Granted => None,
            Answer::Refused { retry_after, .. } => *retry_after,
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Granted => write!(f, "granted"),
            Answer::Refused {
                status,
                kind: Some(kind),
                why,
                ..
            } => write!(f, "{why} ({kind}, HTTP {status})"),
            Answer::Refused {
                status,
                kind: None,
                why,
                ..
            } => write!(f, "HTTP {status}: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_a_fixed_configuration_can_change_are_misconfigurations() {
        let refused = |status| refusal(status, "", None);
        // poseidon's lock_held, airlock's failed_lock, busy and failing servers: waits.
        for status in [423, 500, 408, 429, 502, 503] {
            assert!(!refused(status).is_misconfiguration(), "{status}");
        }
        // A malformed request, an unknown group, no FleetLock endpoint there.
        for status in [400, 401, 403, 404, 405, 409, 422] {
            assert!(refused(status).is_misconfiguration(), "{status}");
        }
        assert!(!Answer::Granted.is_misconfiguration());
    }

    #[test]
    fn only_the_servers_own_error_says_nothing_was_granted() {
        let poseidon = refusal(423, "{\"kind\":\"lock_held\",\"value\":\"held by x\"}\n", None);
        assert!(poseidon.is_from_server());
        assert_eq!(poseidon.to_string(), "held by x (lock_held, HTTP 423)");
        // A gateway's page in front of the server: the grant may have happened behind it.
        for (status, body) in [(502, "<html>Bad Gateway</html>"), (504, ""), (500, "oops")] {
            assert!(!refusal(status, body, None).is_from_server(), "{status}");
        }
        // A body that tries to break the log line is kept on one.
        let odd = refusal(500, "{\"kind\":\"a\\nb\",\"value\":\"c\\r\\nd\"}", None);
        assert!(!odd.to_string().contains('\n'), "{odd}");
    }

    /// A server or gateway may send a body of any size (only [`MAX_BODY`] bytes of it are read):
    /// the reason kept stays one short line.
    #[test]
    fn a_huge_refusal_keeps_a_short_reason() {
        let value = "x".repeat(MAX_BODY);
        let body = format!("{{\"kind\":\"{}\",\"value\":\"{value}\"}}", "k".repeat(1000));
        let Answer::Refused { kind, why, .. } = refused(423, None, body.as_bytes()) else {
            panic!("granted")
        };
        assert_eq!((kind.unwrap().len(), why.len()), (MAX_WHY, MAX_WHY));
        let Answer::Refused { why, .. } = refused(502, None, &vec![b'<'; MAX_BODY]) else {
            panic!("granted")
        };
        assert_eq!(why.len(), MAX_WHY);
    }

    proptest::proptest! {
        /// Any status, `Retry-After` bytes and body: a refusal, its texts one line of at most
        /// [`MAX_WHY`] characters, its wait at most [`MAX_RETRY_AFTER`]; never a panic.
        #[test]
        fn any_refusal_is_bounded(
            status in 300u16..1000,
            retry in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)),
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let Answer::Refused { kind, why, retry_after, .. } = refused(status, retry.as_deref(), &body) else {
                panic!("a refusal was taken for a grant")
            };
            for text in kind.iter().chain([&why]) {
                proptest::prop_assert!(text.chars().count() <= MAX_WHY && !text.contains(['\n', '\r']));
            }
            proptest::prop_assert!(retry_after.is_none_or(|d| d <= MAX_RETRY_AFTER));
        }
    }

    #[test]
    fn retry_after_is_bounded_at_every_extreme() {
        assert_eq!(retry_after("120"), Some(Duration::from_secs(120)));
        for huge in ["99999999999999999999", "86401", "Fri, 31 Dec 9999 23:59:59 GMT"] {
            assert_eq!(retry_after(huge), Some(MAX_RETRY_AFTER), "{huge}");
        }
        // A date in the past is no wait; anything else is no value at all.
        assert_eq!(retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        for junk in ["", " ", "-1", "1.5", "soon", "0x10"] {
            assert_eq!(retry_after(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn endpoints_resolve_as_zincatis_url_join() {
        let at = |base: &str| endpoint(base, "pre-reboot").unwrap().to_string();
        assert_eq!(at("http://h:8080/fleetlock/"), "http://h:8080/fleetlock/v1/pre-reboot");
        assert_eq!(at("http://h:8080/fleetlock"), "http://h:8080/v1/pre-reboot");
        assert_eq!(at("http://h:8080"), "http://h:8080/v1/pre-reboot");
        assert_eq!(at("https://h/a/b/"), "https://h/a/b/v1/pre-reboot");
        assert!(endpoint("not a url", "pre-reboot").is_err());
    }
}
