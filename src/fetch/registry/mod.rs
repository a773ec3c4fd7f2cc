//! Talking to registries with oci-client: choosing the source (mirrors, then the primary),
//! credentials and TLS per source, manifests (index → this host's platform), the config blob and
//! ranged blob streams. Manifests and configs returned here have been checked against their
//! digests; blob streams are checked by [`crate::fetch::blob_reader`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use oci_client::client::{
    BlobResponse, ClientConfig, ClientProtocol,
};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::ImageManifest;
use sha2::{Digest, Sha256};

use crate::fetch::config::auth::AuthFiles;
use crate::fetch::config::certs;
use crate::fetch::config::registries::{RegistriesConf, Source};
use crate::fetch::content_range;
use crate::fetch::reference::ImageRef;
use crate::fetch::retry::{self, RetryPolicy};

mod attachments;
mod insecure;
pub(crate) mod manifest;
mod token;

use manifest::{host_platform, resolve_child, resolve_top, Resolution};

/// Manifests and configs are small JSON documents; anything bigger is not an oscontainer.
pub const MAX_JSON_BYTES: usize = 4 << 20;
/// A registry that does not accept a connection in this time is treated as down (and retried).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A transfer that delivers no byte for this long is cut and resumed.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// One image's manifest, resolved to this host's platform.
#[derive(Debug, Clone)]
pub struct ResolvedManifest {
    /// The digest the pullspec names (or its tag resolved to): an index's when it is one.
    pub digest: String,
    /// The platform manifest's own digest (equal to `digest` unless an index was resolved).
    pub manifest_digest: String,
    pub manifest: ImageManifest,
    /// The platform manifest as it hashes to `manifest_digest` (what ostree-rs-ext's store
    /// records: see `crate::import::store`).
    pub json: String,
}

/// How to reach registries: credentials, TLS and the retry budget.
#[derive(Debug, Clone)]
pub struct Access {
    pub auth: AuthFiles,
    /// `--cert-dir`: replaces the certs.d lookup.
    pub cert_dir: Option<PathBuf>,
    /// `--tls-verify=false` turns certificate verification off.
    pub tls_verify: bool,
    pub retry: RetryPolicy,
}

/// Tries the image's sources in registries.conf order (mirrors, then the primary); the first
/// that serves the manifest is used for everything else.
pub async fn open(
    image: &ImageRef,
    conf: &RegistriesConf,
    access: &Access,
) -> Result<(Registry, ResolvedManifest)> {
    let sources = conf.sources(image)?;
    let mut failures = Vec::new();
    for source in &sources {
        let attempt = async {
            let registry = match source.insecure {
                true => Registry::connect_insecure(source, access).await?,
                false => Registry::connect(source, access, ClientProtocol::Https)?,
            };
            let resolved = registry.resolve().await?;
            anyhow::Ok((registry, resolved))
        };
        match attempt.await {
            Ok(found) => {
                if source.mirror {
                    tracing::info!("pulling {} from mirror {}", image, source.image.name());
                }
                return Ok(found);
            }
            Err(e) if sources.len() == 1 => return Err(e),
            Err(e) => {
                tracing::warn!("{}: {e:#}", source.image.name());
                failures.push(format!("{}: {e:#}", source.image.name()));
            }
        }
    }
    bail!("no source could serve it: {}", failures.join("; "))
}

/// A connection to one source of an image.
#[derive(Clone)]
pub struct Registry {
    client: Client,
    /// For manifests, which oci-client would read whole: the same TLS settings and timeouts.
    http: reqwest::Client,
    scheme: &'static str,
    /// The bearer token for manifests (see [`token`]).
    token: Arc<std::sync::Mutex<Option<Option<String>>>>,
    auth: RegistryAuth,
    /// The auth file the credentials came from, if any.
    auth_source: Option<PathBuf>,
    /// The client certificate presented in TLS handshakes, if any.
    client_cert: Option<PathBuf>,
    /// Where a client certificate for this registry is looked for.
    cert_dir: PathBuf,
    image: ImageRef,
    retry: RetryPolicy,
}

impl Registry {
    /// Sets up the client for `source` over `protocol`; an insecure source's certificates are
    /// not verified (see [`insecure`]).
    pub fn connect(source: &Source, access: &Access, protocol: ClientProtocol) -> Result<Registry> {
        Registry::connect_with(source, access, protocol, None)
    }

    /// [`Registry::connect`], sending through `http` when given: an HTTP client already set up
    /// for this source (an insecure registry found to speak plain HTTP keeps the client that
    /// asked). Setting up TLS loads the system's trust store, which OpenSSL 3 takes tens of
    /// milliseconds to do; oci-client shares pivot's client instead of building its own.
    pub(super) fn connect_with(
        source: &Source,
        access: &Access,
        protocol: ClientProtocol,
        http: Option<reqwest::Client>,
    ) -> Result<Registry> {
        let image = source.image.clone();
        let host = image.registry.as_str();
        let tls_verify = access.tls_verify && !source.insecure;
        let tls = certs::for_host(host, access.cert_dir.as_deref())?;
        let cert_dir = tls
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(certs::CERTS_D[0]).join(host));
        let client_cert = tls.client_cert()?;
        if let Some(cert) = &client_cert {
            tracing::debug!(
                registry = %host,
                "presenting client certificate {} with key {}",
                cert.cert_path.display(),
                cert.key_path.display()
            );
            if tls.client_pairs.len() > 1 {
                tracing::debug!(
                    registry = %host,
                    "{} holds {} client certificates; a TLS handshake presents one, the first in name order",
                    cert_dir.display(),
                    tls.client_pairs.len()
                );
            }
        }
        if !access.tls_verify {
            tracing::warn!(registry = %host, "TLS certificate verification is off (--tls-verify=false)");
        }
        let http = match http {
            Some(http) => http,
            None => http_client(&tls.ca_pems, tls_verify, client_cert.as_ref())
                .with_context(|| format!("setting up TLS for {host}"))?,
        };
        let scheme = match protocol {
            ClientProtocol::Http => "http",
            _ => "https",
        };
        // TLS, timeouts and the client identity are `http`'s: oci-client sends through it.
        let config = ClientConfig {
            protocol,
            ..Default::default()
        };
        let client = Client::with_http_client(config, http.clone());
        let (auth, auth_source) = match access.auth.lookup(&image.name())? {
            Some(creds) => {
                tracing::info!(registry = %host, "using credentials from {}", creds.source.display());
                (
                    RegistryAuth::Basic(creds.username, creds.password),
                    Some(creds.source),
                )
            }
            None => (RegistryAuth::Anonymous, None),
        };
        Ok(Registry {
            client,
            http,
            scheme,
            token: Arc::default(),
            auth,
            auth_source,
            client_cert: client_cert.map(|cert| cert.cert_path),
            cert_dir,
            image,
            retry: access.retry,
        })
    }

    fn reference(&self, digest: Option<&str>) -> Reference {
        let image = &self.image;
        match digest.or(image.digest.as_deref()) {
            Some(d) => {
                Reference::with_digest(image.registry.clone(), image.repository.clone(), d.into())
            }
            None => Reference::with_tag(
                image.registry.clone(),
                image.repository.clone(),
                image.tag_or_latest().into(),
            ),
        }
    }

    /// Fetches the manifest the image names, checking its bytes against the pinned digest (a tag
    /// is resolved here, once), and resolves an index to the manifest for this host's platform.
    pub async fn resolve(&self) -> Result<ResolvedManifest> {
        let what = self.image.pinned_or_tagged();
        let (bytes, digest) = self
            .fetch_manifest(self.image.digest.as_deref())
            .await
            .with_context(|| format!("fetching manifest of {what}"))?;
        match resolve_top(&bytes, digest, &what)? {
            Resolution::Done(resolved) => Ok(*resolved),
            Resolution::Child { digest, entry } => {
                let child = entry.digest().to_string();
                let (bytes, child_digest) =
                    self.fetch_manifest(Some(&child)).await.with_context(|| {
                        format!("fetching the {} manifest {child}", host_platform().1)
                    })?;
                resolve_child(&bytes, digest, child_digest, &what)
            }
        }
    }

    /// Returns the manifest bytes and their digest, verified against `expected` when given.
    async fn fetch_manifest(&self, expected: Option<&str>) -> Result<(Bytes, String)> {
        let reference = self.reference(expected);
        let bytes = retry::retry(&self.retry, "fetching manifest", || {
            self.renewing(&reference, || self.get_manifest(&reference))
        })
        .await
        .map_err(|e| self.explain_refusal(e))??;
        // The server's Docker-Content-Digest header is not trusted: the digest is what the bytes hash to.
        let actual = sha256_digest(&bytes);
        if let Some(expected) = expected {
            ensure!(
                actual == expected,
                "manifest digest mismatch: expected {expected}, the registry served {actual}"
            );
        }
        Ok((bytes, actual))
    }

    /// Fetches a small JSON blob (the image config), verified against its descriptor. Never more
    /// than the descriptor's size is read: a registry that announces or sends more is refused.
    pub async fn fetch_json_blob(&self, desc: &OciDescriptor) -> Result<Vec<u8>> {
        ensure_json_size(desc, "config blob")?;
        let reference = self.reference(None);
        let desc = safe_descriptor(desc);
        let size = desc.size as u64;
        // The outer error is the request's (maybe retried); the inner one a refusal.
        let read = retry::retry(&self.retry, "fetching the image config", || async {
            let blob = self
                .renewing(&reference, || {
                    self.client.pull_blob_stream(&reference, &desc)
                })
                .await?;
            if let Some(announced) = blob.content_length.filter(|&n| n != size) {
                return Ok(Err(size_mismatch(&desc.digest, announced, 0, size)));
            }
            let mut out = Vec::with_capacity(size as usize);
            let mut stream = blob.stream;
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(e) if is_digest_error(&e) => return Ok(Err(anyhow::anyhow!("{e}"))),
                    Err(e) => return Err(e.into()),
                };
                if out.len() as u64 + chunk.len() as u64 > size {
                    return Ok(Err(too_long(&desc.digest, size)));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(Ok(out))
        })
        .await
        .and_then(|read| read)
        .with_context(|| format!("fetching blob {}", desc.digest))?;
        ensure!(
            read.len() as u64 == size && sha256_digest(&read) == desc.digest,
            "blob {} has {} bytes hashing to {}; its descriptor says {size} bytes",
            desc.digest,
            read.len(),
            sha256_digest(&read)
        );
        Ok(read)
    }

    /// One request for a blob's bytes from `offset` on. Unverified: the caller hashes every byte
    /// (see [`crate::fetch::blob_reader`]); errors are left unwrapped so they can be classified.
    pub async fn blob_from(
        &self,
        desc: &OciDescriptor,
        offset: u64,
    ) -> std::result::Result<BlobStream, OciDistributionError> {
        let reference = self.reference(None);
        let desc = safe_descriptor(desc);
        if offset == 0 {
            let sized = self
                .renewing(&reference, || {
                    self.client.pull_blob_stream(&reference, &desc)
                })
                .await?;
            return Ok(BlobStream {
                remaining: sized.content_length,
                stream: sized.stream,
            });
        }
        let partial = self.renewing(&reference, || {
            self.client
                .pull_blob_stream_partial(&reference, &desc, offset, None)
        });
        match partial.await? {
            BlobResponse::Partial(sized) => {
                // Bytes from anywhere but `offset` must not be joined to those already read.
                let size = u64::try_from(desc.size).unwrap_or_default();
                content_range::parse(&sized.content_ranges)
                    .and_then(|range| content_range::check(range, offset, size))
                    .map_err(|e| {
                        OciDistributionError::SpecViolationError(format!(
                            "the registry's answer to resuming {} at byte {offset} has an unusable Content-Range: {e:#}",
                            desc.digest
                        ))
                    })?;
                Ok(BlobStream {
                    remaining: sized.content_length,
                    stream: sized.stream,
                })
            }
            // The server ignored the Range header: skip what we already have.
            BlobResponse::Full(sized) => Ok(BlobStream {
                remaining: sized.content_length.map(|n| n.saturating_sub(offset)),
                stream: skip_bytes(sized.stream, offset),
            }),
        }
    }

    /// Says why the registry refused: a TLS handshake without the client certificate it
    /// requires (or with one it does not accept), or no credentials or the wrong ones (never
    /// what they are).
    fn explain_refusal(&self, e: anyhow::Error) -> anyhow::Error {
        let text = e.to_string();
        if let Some(alert) = retry::refusal_alert(&text) {
            // A handshake failure may have other causes (no common cipher, protocol version).
            let certain = alert != "alert handshake failure";
            let why = match (&self.client_cert, certain) {
                (None, true) => "it requires a client certificate",
                (None, false) => "it may require a client certificate",
                (Some(_), true) => "it did not accept the client certificate",
                (Some(_), false) => "it may not accept the client certificate",
            };
            return e.context(match &self.client_cert {
                None => format!(
                    "the registry refused the TLS handshake: {why} (put <name>.cert and <name>.key in {})",
                    self.cert_dir.display()
                ),
                Some(cert) => format!(
                    "the registry refused the TLS handshake: {why} {} (is it issued by a CA the registry trusts, for client authentication, and unexpired?)",
                    cert.display()
                ),
            });
        }
        if !text.contains("Not authorized") || text.contains("refused a newly issued token") {
            return e;
        }
        let name = self.image.name();
        match &self.auth_source {
            None => e.context(format!(
                "the registry requires credentials and no auth file has any for {name} (see --authfile)"
            )),
            Some(path) => e.context(format!(
                "the registry refused the credentials for {name} from {}",
                path.display()
            )),
        }
    }

    /// The image as this source names it: a mirror's own reference when pulling through one.
    pub fn image(&self) -> &ImageRef {
        &self.image
    }

    /// An HTTP client with this registry's TLS settings (certs.d CAs, client certificate,
    /// `insecure`), for the lookaside store that belongs to it, as containers/image fetches it.
    pub fn http_client(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }
}

/// A reqwest client set up as oci-client sets up its own (see `Client::try_from`).
fn http_client(
    ca_pems: &[Vec<u8>],
    tls_verify: bool,
    client_cert: Option<&certs::ClientCert>,
) -> Result<reqwest::Client> {
    let roots = ca_pems
        .iter()
        .map(|pem| reqwest::Certificate::from_pem(pem))
        .collect::<reqwest::Result<Vec<_>>>()?;
    let mut builder = reqwest::Client::builder();
    if let Some(cert) = client_cert {
        builder = builder.identity(reqwest::Identity::from_pkcs8_pem(
            &cert.cert_chain_pem,
            &cert.key_pkcs8_pem,
        )?);
    }
    Ok(builder
        .danger_accept_invalid_certs(!tls_verify)
        .danger_accept_invalid_hostnames(!tls_verify)
        .tls_certs_merge(roots)
        .read_timeout(STALL_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(ClientConfig::default().user_agent)
        .build()?)
}

/// A blob's bytes from some offset on.
pub struct BlobStream {
    pub stream: BoxStream<'static, std::io::Result<Bytes>>,
    /// How many bytes the registry announced it will send (its Content-Length), if it did.
    pub remaining: Option<u64>,
}

/// The refusal of a blob whose announced length disagrees with its descriptor.
pub fn size_mismatch(digest: &str, announced: u64, offset: u64, declared: u64) -> anyhow::Error {
    if offset == 0 {
        anyhow::anyhow!(
            "the registry announces blob {digest} as {announced} bytes, but the manifest declares {declared}: refusing a blob whose size is not the declared one"
        )
    } else {
        anyhow::anyhow!(
            "the registry announces {announced} bytes of blob {digest} from byte {offset} on, but the manifest declares {declared} in all: refusing a blob whose size is not the declared one"
        )
    }
}

/// The refusal of a blob that keeps coming after its declared size.
pub fn too_long(digest: &str, declared: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "blob {digest} is larger than the {declared} bytes its descriptor declares (too large): refusing it"
    )
}

/// oci-client's verifying stream reports a digest mismatch as an I/O error wrapping it.
fn is_digest_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>())
}

fn skip_bytes(
    stream: BoxStream<'static, std::io::Result<Bytes>>,
    skip: u64,
) -> BoxStream<'static, std::io::Result<Bytes>> {
    let mut left = skip;
    stream
        .filter_map(move |item| {
            let out = match item {
                Ok(mut chunk) if left > 0 => {
                    let n = left.min(chunk.len() as u64) as usize;
                    left -= n as u64;
                    let rest = chunk.split_off(n);
                    (!rest.is_empty()).then_some(Ok(rest))
                }
                other => Some(other),
            };
            std::future::ready(out)
        })
        .boxed()
}

/// Only the digest is passed on: a manifest's `urls` would send the client to other hosts.
fn safe_descriptor(desc: &OciDescriptor) -> OciDescriptor {
    OciDescriptor {
        media_type: desc.media_type.clone(),
        digest: desc.digest.clone(),
        size: desc.size,
        ..Default::default()
    }
}

/// Refuses, before reading it, a JSON blob (`what`: a config, a manifest) whose descriptor
/// claims more than [`MAX_JSON_BYTES`].
pub(crate) fn ensure_json_size(desc: &OciDescriptor, what: &str) -> Result<()> {
    ensure!(
        (0..=MAX_JSON_BYTES as i64).contains(&desc.size),
        "{what} {} claims {} bytes; at most {MAX_JSON_BYTES} are accepted (too large)",
        desc.digest,
        desc.size
    );
    Ok(())
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}
