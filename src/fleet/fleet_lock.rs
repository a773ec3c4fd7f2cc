//! A FleetLock client, as zincati speaks the protocol (zincati's
//! `docs/development/fleetlock/protocol.md`): `POST <base>/v1/pre-reboot` to take a reboot slot
//! before rebooting, `POST <base>/v1/steady-state` to give it back once the node is up again;
//! header `fleet-lock-protocol: true`, body `{"client_params": {"id", "group"}}`. Any 2xx is
//! yes, as zincati takes it (poseidon/fleetlock answers 200 with text, airlock with nothing);
//! anything else is no, with the server's `{"kind", "value"}` error when it sends one (airlock
//! sends it as `text/plain`, so the body is parsed whatever its type). Both operations are
//! recursive on the server, so repeating either is harmless.
//!
//! A no is one of two kinds ([`Answer::is_final`]). *Not now*: the lock is held (poseidon's
//! `423 lock_held`, for steady-state too while another node holds its group's lease; airlock's
//! `500 failed_lock` when all slots are taken), the server is busy or failing (408, 429, 5xx) —
//! asked again after a while. *Never*: any other 4xx (a malformed request, airlock's
//! `400 unknown_group`, a base URL that names no FleetLock endpoint: 404, 405), which asking
//! again cannot change.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use super::config::FleetLock;

/// How long one request may take: a server that hangs is retried like one that is down.
/// poseidon/fleetlock cordons the node and evicts its pods before it answers a pre-reboot.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Client {
    http: reqwest::Client,
    pub base_url: String,
    pub id: String,
    pub group: String,
}

/// The server's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Granted,
    Refused {
        status: u16,
        /// The error's `kind` (e.g. poseidon's `lock_held`, airlock's `failed_lock`), if the body
    /// had one.
        kind: Option<String>,
        /// The error's `value`, else the body's text.
        why: String,
    },
}

#[derive(Deserialize)]
struct ErrorBody {
    kind: String,
    value: String,
}

impl Client {
    pub fn new(lock: &FleetLock, id: String) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("pivot/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("setting up the FleetLock client")?;
        Ok(Client {
            http,
            base_url: lock.base_url.clone(),
            id,
            group: lock.group.clone(),
        })
    }

    /// Asks for a reboot slot.
    pub async fn pre_reboot(&self) -> Result<Answer> {
        self.post("pre-reboot").await
    }

    /// Gives the slot back (also when this node holds none).
    pub async fn steady_state(&self) -> Result<Answer> {
        self.post("steady-state").await
    }

    async fn post(&self, operation: &str) -> Result<Answer> {
        let url = format!("{}/v1/{operation}", self.base_url);
        let body = serde_json::json!({"client_params": {"id": self.id, "group": self.group}});
        let response = self
            .http
            .post(&url)
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
        let text = response.text().await.unwrap_or_default();
        Ok(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(error) => Answer::Refused {
                status,
                kind: Some(error.kind),
                why: error.value,
            },
            Err(_) => Answer::Refused {
                status,
                kind: None,
                why: text.chars().take(200).collect::<String>().trim().to_string(),
            },
        })
    }
}

impl Answer {
    /// A refusal that asking again cannot change (see the module docs).
    pub fn is_final(&self) -> bool {
        match self {
            Answer::Granted => false,
            Answer::Refused { status, .. } => {
                (400..500).contains(status) && !matches!(status, 408 | 423 | 429)
            }
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
            } => write!(f, "{why} ({kind}, HTTP {status})"),
            Answer::Refused {
                status,
                kind: None,
                why,
            } => write!(f, "HTTP {status}: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_asking_again_cannot_change_are_final() {
        let refused = |status| Answer::Refused {
            status,
            kind: None,
            why: String::new(),
        };
        // poseidon's lock_held, airlock's failed_lock, busy and failing servers: waits.
        for status in [423, 500, 408, 429, 502, 503] {
            assert!(!refused(status).is_final(), "{status}");
        }
        // A malformed request, an unknown group, no FleetLock endpoint there: final.
        for status in [400, 401, 403, 404, 405, 409, 422] {
            assert!(refused(status).is_final(), "{status}");
        }
        assert!(!Answer::Granted.is_final());
    }
}
