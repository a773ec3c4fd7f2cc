//! Manifests: fetched with a bounded read (oci-client reads a manifest body whole, so a registry
//! could make pivot hold any amount of memory), parsed, and an index resolved to this host's
//! platform.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use futures_util::StreamExt;
use oci_client::errors::{OciDistributionError, OciEnvelope};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use reqwest::header::{ACCEPT, WWW_AUTHENTICATE};
use reqwest::StatusCode;

use super::{Registry, ResolvedManifest, MAX_JSON_BYTES};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const ACCEPTED: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];
/// Of an error response, only this much is read (for its message).
const MAX_ERROR_BODY: usize = 64 << 10;

/// A fetch's outcome: the outer error is the request's (classified, maybe retried), the inner
/// one a refusal of what the registry sent.
pub(super) type Fetched = std::result::Result<Result<Bytes>, OciDistributionError>;

impl Registry {
    /// GETs the manifest `reference` names, reading at most [`MAX_JSON_BYTES`] of it. The
    /// credentials go the way oci-client sends them: a bearer token from the registry's token
    /// service when it asks for one (oci-client gets it), Basic only when challenged for Basic.
    pub(super) async fn get_manifest(&self, reference: &Reference) -> Fetched {
        let token = match self.token() {
            Some(token) => token,
            None => self.new_token(reference).await?,
        };
        let registry = reference.resolve_registry();
        let url = format!(
            "{}://{registry}/v2/{}/manifests/{}",
            self.scheme,
            reference.repository(),
            reference.digest().or(reference.tag()).unwrap_or("latest")
        );
        let accept = ACCEPTED.join(", ");
        let request = || self.http.get(&url).header(ACCEPT, &accept);
        let mut response = match &token {
            Some(token) => request().bearer_auth(token).send().await?,
            None => request().send().await?,
        };
        if response.status() == StatusCode::UNAUTHORIZED && token.is_none() {
            let basic = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|h| h.to_str().ok())
                .is_some_and(|h| h.trim_start().to_ascii_lowercase().starts_with("basic"));
            if let (true, RegistryAuth::Basic(user, password)) = (basic, &self.auth) {
                response = request().basic_auth(user, Some(password)).send().await?;
            }
        }
        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body = read_bounded(response, MAX_ERROR_BODY)
                .await?
                .unwrap_or_default();
            return Err(oci_client::client::with_retry_after(
                registry_error(status, &body, &url),
                &headers,
            ));
        }
        if let Some(announced) = response.content_length() {
            if announced > MAX_JSON_BYTES as u64 {
                return Ok(Err(too_large(&format!("{announced} bytes announced"))));
            }
        }
        Ok(read_bounded(response, MAX_JSON_BYTES)
            .await?
            .ok_or_else(|| too_large(&format!("more than {MAX_JSON_BYTES} bytes sent"))))
    }
}

fn too_large(what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "manifest is too large: {what}, more than the {MAX_JSON_BYTES} an image manifest may have"
    )
}

/// The body, or `None` once it exceeds `limit` bytes (the rest is not read).
async fn read_bounded(
    response: reqwest::Response,
    limit: usize,
) -> std::result::Result<Option<Bytes>, OciDistributionError> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body.into()))
}

/// The error oci-client would make of this response, so it is classified and worded the same.
fn registry_error(status: StatusCode, body: &[u8], url: &str) -> OciDistributionError {
    let url = url.to_string();
    if status == StatusCode::UNAUTHORIZED {
        return OciDistributionError::UnauthorizedError { url };
    }
    if status.is_client_error() {
        if let Ok(envelope) = serde_json::from_slice::<OciEnvelope>(body) {
            return OciDistributionError::RegistryError { envelope, url };
        }
    }
    OciDistributionError::ServerError {
        code: status.as_u16(),
        url,
        message: String::from_utf8_lossy(body).into_owned(),
    }
}

enum Parsed {
    Manifest(Box<ImageManifest>),
    Index(Box<ImageIndex>),
}

fn parse_manifest(bytes: &[u8]) -> Result<Parsed> {
    let value: serde_json::Value = crate::fetch::image::parse_json(bytes, "manifest")?;
    let media_type = value
        .get("mediaType")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    if value.get("schemaVersion").and_then(|v| v.as_i64()) == Some(1) {
        bail!("Docker schema 1 manifests are not supported; push the image as schema 2 or OCI");
    }
    let is_index = match media_type {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        // OCI allows an absent mediaType; the shape tells.
        "" => value.get("manifests").is_some(),
        other => bail!("unsupported manifest media type {other:?}"),
    };
    if is_index {
        Ok(Parsed::Index(Box::new(
            serde_json::from_value(value).context("malformed image index")?,
        )))
    } else {
        Ok(Parsed::Manifest(Box::new(
            serde_json::from_value(value).context("malformed image manifest")?,
        )))
    }
}

/// (os, architecture) in OCI's spelling.
pub(crate) fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "x86" => "386",
        other => other,
    };
    ("linux", arch)
}

fn pick_platform(index: &ImageIndex) -> Result<String> {
    let (os, arch) = host_platform();
    let mut seen = Vec::new();
    for entry in index.manifests() {
        let Some(platform) = entry.platform() else {
            seen.push("(no platform)".to_string());
            continue;
        };
        let (p_os, p_arch) = (
            platform.os().to_string(),
            platform.architecture().to_string(),
        );
        if p_os == os && p_arch == arch {
            return Ok(entry.digest().to_string());
        }
        seen.push(format!("{p_os}/{p_arch}"));
    }
    bail!(
        "no manifest for {os}/{arch}; the index has: {}",
        seen.join(", ")
    )
}

/// Where resolving an image stands after its top-level manifest: done, or an index whose entry
/// for this host's platform is to be fetched next (from a registry or a layout alike).
pub(crate) enum Resolution {
    Done(Box<ResolvedManifest>),
    Child {
        /// The index's digest: the image's.
        digest: String,
        /// The index's entry for this host.
        entry: Box<Descriptor>,
    },
}

/// The top-level manifest `bytes` (hashing to `digest`; `what` names the image in errors).
pub(crate) fn resolve_top(bytes: &[u8], digest: String, what: &str) -> Result<Resolution> {
    match parse_manifest(bytes).with_context(|| format!("reading manifest of {what}"))? {
        Parsed::Manifest(manifest) => Ok(Resolution::Done(Box::new(ResolvedManifest {
            manifest_digest: digest.clone(),
            digest,
            manifest: *manifest,
            // Parsed as JSON, so UTF-8.
            json: String::from_utf8_lossy(bytes).into_owned(),
        }))),
        Parsed::Index(index) => {
            let child = pick_platform(&index)
                .with_context(|| format!("choosing a platform from the index {what}"))?;
            let entry = index
                .manifests()
                .iter()
                .find(|m| m.digest().to_string() == child)
                .context("the chosen platform vanished from the index")?;
            Ok(Resolution::Child {
                digest,
                entry: Box::new(entry.clone()),
            })
        }
    }
}

/// The platform manifest `bytes` (hashing to `child`) an index of `what` (`digest`) led to.
pub(crate) fn resolve_child(
    bytes: &[u8],
    digest: String,
    child: String,
    what: &str,
) -> Result<ResolvedManifest> {
    match parse_manifest(bytes).with_context(|| format!("reading manifest {child}"))? {
        Parsed::Manifest(manifest) => Ok(ResolvedManifest {
            digest,
            manifest_digest: child,
            manifest: *manifest,
            json: String::from_utf8_lossy(bytes).into_owned(),
        }),
        Parsed::Index(_) => bail!("index {what} points at another index ({child})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_resolves_to_host_platform() {
        let (os, arch) = host_platform();
        let d1 = format!("sha256:{}", "1".repeat(64));
        let d2 = format!("sha256:{}", "2".repeat(64));
        let json = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": d1, "size": 10,
                 "platform": {"os": "linux", "architecture": "riscv64"}},
                {"mediaType": OCI_MANIFEST, "digest": d2, "size": 10,
                 "platform": {"os": os, "architecture": arch}},
            ]
        });
        let Parsed::Index(index) = parse_manifest(json.to_string().as_bytes()).unwrap() else {
            panic!("not parsed as an index")
        };
        assert_eq!(pick_platform(&index).unwrap(), d2);
    }

    #[test]
    fn index_without_host_platform_lists_what_it_has() {
        let json = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", "1".repeat(64)),
                "size": 10, "platform": {"os": "linux", "architecture": "riscv64"}}]
        });
        let Parsed::Index(index) = parse_manifest(json.to_string().as_bytes()).unwrap() else {
            panic!("not parsed as an index")
        };
        let err = pick_platform(&index).unwrap_err().to_string();
        assert!(err.contains("linux/riscv64"), "{err}");
    }

    #[test]
    fn schema1_is_refused_clearly() {
        let err = parse_manifest(br#"{"schemaVersion":1,"fsLayers":[]}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("schema 1"), "{err}");
    }
}
