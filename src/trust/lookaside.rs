//! Signatures kept beside the registry ("lookaside", containers-registries.d(5)): for image
//! `host/path` and manifest digest `sha256:<hex>`, the files `<base>/path@sha256=<hex>/signature-1`,
//! `signature-2`, … up to the first that does not exist, over `file://`, `http://` or
//! `https://`. HTTP fetches use the registry's own client, as containers/image does: its TLS
//! settings (certs.d CAs and client certificate, `insecure`) and the environment's proxy; transient
//! faults are retried under the pull's retry budget.

use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use oci_client::errors::OciDistributionError;

use super::MAX_SIGNATURES;
use crate::fetch::retry::{self, RetryPolicy};

/// A signature is a few hundred bytes; a store that sends more is refused.
const MAX_SIGNATURE: u64 = 4 << 20;

/// The signatures of manifest `digest` of the repository at `path` (inside its registry,
/// normalized: `library/busybox`) in the store at `base`.
pub async fn signatures(
    base: &str,
    path: &str,
    digest: &str,
    retry: &RetryPolicy,
    client: Option<&reqwest::Client>,
) -> Result<Vec<Vec<u8>>> {
    let (algorithm, hex) = digest
        .split_once(':')
        .with_context(|| format!("malformed digest {digest:?}"))?;
    let dir = format!(
        "{}/{}@{algorithm}={hex}",
        base.trim_end_matches('/'),
        path
    );
    let mut found = Vec::new();
    if let Some(path) = base.strip_prefix("file://") {
        ensure!(path.starts_with('/'), "lookaside {base:?} is not an absolute file:// URL");
        let dir = PathBuf::from(dir.strip_prefix("file://").unwrap_or(&dir));
        for n in 1..=MAX_SIGNATURES {
            let path = dir.join(format!("signature-{n}"));
            match std::fs::metadata(&path) {
                Ok(meta) if meta.len() > MAX_SIGNATURE => {
                    bail!("{} is larger than a signature can be", path.display())
                }
                Ok(_) => found.push(
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
        }
    } else if base.starts_with("http://") || base.starts_with("https://") {
        let client = match client {
            Some(client) => client.clone(),
            None => reqwest::Client::builder()
                .build()
                .context("setting up the lookaside client")?,
        };
        for n in 1..=MAX_SIGNATURES {
            let url = format!("{dir}/signature-{n}");
            let what = format!("fetching signature {url}");
            let body = retry::retry(retry, &what, || fetch(&client, &url)).await?;
            match body {
                Some(body) => found.push(body),
                None => return Ok(found),
            }
        }
    } else {
        bail!("lookaside {base:?}: only file://, http:// and https:// stores are supported");
    }
    bail!("the lookaside at {dir} lists more than {MAX_SIGNATURES} signatures")
}

/// One signature, `None` when the store has none by that name.
async fn fetch(
    client: &reqwest::Client,
    url: &str,
) -> Result<Option<Vec<u8>>, OciDistributionError> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(OciDistributionError::RequestError)?;
    let status = response.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(oci_client::client::with_retry_after(
            OciDistributionError::ServerError {
                code: status.as_u16(),
                url: url.to_string(),
                message: status.canonical_reason().unwrap_or_default().to_string(),
            },
            response.headers(),
        ));
    }
    if response.content_length().is_some_and(|n| n > MAX_SIGNATURE) {
        return Err(OciDistributionError::GenericError(Some(format!(
            "{url} is larger than a signature can be"
        ))));
    }
    let mut body = Vec::new();
    let mut response = response;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(OciDistributionError::RequestError)?
    {
        body.extend_from_slice(&chunk);
        if body.len() as u64 > MAX_SIGNATURE {
            return Err(OciDistributionError::GenericError(Some(format!(
                "{url} is larger than a signature can be"
            ))));
        }
    }
    Ok(Some(body))
}
