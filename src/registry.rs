//! Talking to the registry with oci-client: manifests (index → this host's platform), the config
//! blob, and layer streams. Everything returned here has been checked against its digest; nothing
//! downstream re-checks.

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{ImageIndex, ImageManifest};
use sha2::{Digest, Sha256};

use crate::config::registries::RegistriesConf;
use crate::reference::ImageRef;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const ACCEPTED: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// Manifests and configs are small JSON documents; anything bigger is not an oscontainer.
const MAX_JSON_BYTES: usize = 4 << 20;

/// One image's manifest, resolved to this host's platform.
#[derive(Debug, Clone)]
pub struct ResolvedManifest {
    /// The digest the pullspec names (or its tag resolved to): an index's when it is one.
    pub digest: String,
    /// The platform manifest's own digest (equal to `digest` unless an index was resolved).
    pub manifest_digest: String,
    pub manifest: ImageManifest,
}

/// A registry connection for one image name.
#[derive(Clone)]
pub struct Registry {
    client: Client,
    auth: RegistryAuth,
    name: String,
}

impl Registry {
    pub fn new(image: &ImageRef, conf: &RegistriesConf) -> Result<Registry> {
        let name = image.name();
        let protocol = if conf.is_insecure(&name) {
            tracing::info!(registry = %image.registry, "registry is marked insecure: using plain HTTP");
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..Default::default()
        };
        let client = Client::try_from(config).context("setting up the HTTP client")?;
        Ok(Registry {
            client,
            auth: RegistryAuth::Anonymous,
            name,
        })
    }

    fn reference(&self, image: &ImageRef, digest: Option<&str>) -> Reference {
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

    /// Fetches the manifest `image` names, checking its bytes against the pinned digest (a tag is
    /// resolved here, once), and resolves an index to the manifest for this host's platform.
    pub async fn resolve(&self, image: &ImageRef) -> Result<ResolvedManifest> {
        let what = image.pinned_or_tagged();
        let (bytes, digest) = self
            .fetch_manifest(image, image.digest.as_deref())
            .await
            .with_context(|| format!("fetching manifest of {what}"))?;
        match parse_manifest(&bytes).with_context(|| format!("reading manifest of {what}"))? {
            Parsed::Manifest(manifest) => Ok(ResolvedManifest {
                manifest_digest: digest.clone(),
                digest,
                manifest: *manifest,
            }),
            Parsed::Index(index) => {
                let child = pick_platform(&index)
                    .with_context(|| format!("choosing a platform from the index {what}"))?;
                let (bytes, child_digest) = self
                    .fetch_manifest(image, Some(&child))
                    .await
                    .with_context(|| {
                        format!("fetching the {} manifest {child}", host_platform().1)
                    })?;
                match parse_manifest(&bytes).with_context(|| format!("reading manifest {child}"))? {
                    Parsed::Manifest(manifest) => Ok(ResolvedManifest {
                        digest,
                        manifest_digest: child_digest,
                        manifest: *manifest,
                    }),
                    Parsed::Index(_) => bail!("index {what} points at another index ({child})"),
                }
            }
        }
    }

    /// Returns the manifest bytes and their digest, verified against `expected` when given.
    async fn fetch_manifest(
        &self,
        image: &ImageRef,
        expected: Option<&str>,
    ) -> Result<(Bytes, String)> {
        let reference = self.reference(image, expected);
        let (bytes, _server_digest) = self
            .client
            .pull_manifest_raw(&reference, &self.auth, &ACCEPTED)
            .await
            .map_err(oci_error)?;
        ensure!(
            bytes.len() <= MAX_JSON_BYTES,
            "manifest is {} bytes, more than the {MAX_JSON_BYTES} an image manifest may have",
            bytes.len()
        );
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

    /// Fetches a small JSON blob (the image config), verified against its descriptor.
    pub async fn fetch_json_blob(&self, image: &ImageRef, desc: &OciDescriptor) -> Result<Vec<u8>> {
        ensure!(
            (0..=MAX_JSON_BYTES as i64).contains(&desc.size),
            "config blob {} claims {} bytes; at most {MAX_JSON_BYTES} are accepted",
            desc.digest,
            desc.size
        );
        let mut out = Vec::with_capacity(desc.size as usize);
        self.client
            .pull_blob(
                &self.reference(image, None),
                &safe_descriptor(desc),
                &mut out,
            )
            .await
            .map_err(oci_error)
            .with_context(|| format!("fetching blob {}", desc.digest))?;
        ensure!(
            out.len() as i64 == desc.size,
            "blob {} has {} bytes, its descriptor says {}",
            desc.digest,
            out.len(),
            desc.size
        );
        Ok(out)
    }

    /// Streams a blob. The stream ends with an error instead of `None` when the bytes do not
    /// hash to the descriptor's digest, so a consumer that reads to the end has verified data.
    pub async fn blob_stream(
        &self,
        image: &ImageRef,
        desc: &OciDescriptor,
    ) -> Result<BoxStream<'static, std::io::Result<Bytes>>> {
        let sized = self
            .client
            .pull_blob_stream(&self.reference(image, None), &safe_descriptor(desc))
            .await
            .map_err(oci_error)
            .with_context(|| format!("fetching blob {}", desc.digest))?;
        Ok(sized.stream)
    }

    /// `host/path` of the image this registry serves.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// oci-client's errors already spell out their causes in their message; keeping them as one
/// message avoids printing each cause twice in the error chain.
fn oci_error(e: oci_client::errors::OciDistributionError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
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

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

enum Parsed {
    Manifest(Box<ImageManifest>),
    Index(Box<ImageIndex>),
}

fn parse_manifest(bytes: &[u8]) -> Result<Parsed> {
    let value: serde_json::Value = serde_json::from_slice(bytes).context("manifest is not JSON")?;
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
fn host_platform() -> (&'static str, &'static str) {
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
