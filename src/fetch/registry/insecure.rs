//! `insecure = true` in registries.conf, as containers-registries.conf(5) means it: TLS without
//! certificate verification, or plain HTTP for a registry that does not speak TLS. As the
//! containers tools do, TLS is tried first (`GET /v2/`), then HTTP; the first that answers
//! (any status: a 401 is an answer) is used for the whole run. An answer asking to come back
//! later (429, 408, 5xx) is waited out, its `Retry-After` included, and the ping sent again.
//! Each verdict is logged as a warning: an insecure entry in use is worth knowing about.

use anyhow::{Context, Result};
use oci_client::client::ClientProtocol;
use oci_client::errors::OciDistributionError;

use super::{Access, Registry};
use crate::fetch::config::registries::Source;
use crate::fetch::retry;

impl Registry {
    /// The client for an insecure `source`, over TLS if it speaks TLS, else over plain HTTP.
    /// A registry that answers neither is retried within the retry budget.
    pub(super) async fn connect_insecure(source: &Source, access: &Access) -> Result<Registry> {
        let host = source.image.registry.as_str();
        let tls = Registry::connect(source, access, ClientProtocol::Https)?;
        // The first request of a pull, so named as a secure registry's first failure is.
        let what = format!("fetching manifest: reaching {host}");
        let protocol = retry::retry(&access.retry, &what, || async {
            let https = match tls.ping("https").await {
                Ok(()) => return Ok(ClientProtocol::Https),
                // It speaks TLS and asks to be left alone for a while (429, 408, 5xx): asked again
                // once the wait is over.
                Err(e) if matches!(retry::peel(&e), OciDistributionError::ServerError { .. }) => {
                    return Err(e)
                }
                // It speaks TLS and refused the handshake (a client certificate it wants):
                // over TLS, that refusal is what gets explained.
                Err(e) if retry::refusal_alert(&retry::describe(&e)).is_some() => {
                    return Ok(ClientProtocol::Https)
                }
                Err(e) => e,
            };
            match tls.ping("http").await {
                Ok(()) => Ok(ClientProtocol::Http),
                // Neither answers: if HTTP cannot even connect, the registry is down (retried);
                // otherwise TLS's complaint is the one worth reading.
                Err(http) if retry::is_transient(&http) => Err(http),
                Err(_) => Err(https),
            }
        })
        .await
        .with_context(|| what.clone())?;
        Ok(match protocol {
            ClientProtocol::Http => {
                tracing::warn!(registry = %host, "registry is marked insecure and does not speak TLS: using plain HTTP");
                Registry::connect_with(source, access, ClientProtocol::Http, Some(tls.http))?
            }
            _ => {
                tracing::warn!(registry = %host, "registry is marked insecure: its TLS certificate is not verified");
                tls
            }
        })
    }

    /// `GET /v2/` over `scheme` (`https` or `http`): does the registry answer? The HTTP client
    /// serves both (its TLS settings matter only to `https`), so no second one is set up. An
    /// answer asking to come back later (429, 408, 5xx, with its `Retry-After`) is an error to
    /// retry: the next request must not come sooner, the ping included.
    async fn ping(&self, scheme: &str) -> Result<(), OciDistributionError> {
        let url = format!("{scheme}://{}/v2/", self.image.registry);
        let response = self.http.get(&url).send().await?;
        match oci_client::client::busy_error(&response) {
            Some(busy) => Err(busy),
            None => Ok(()),
        }
    }
}
