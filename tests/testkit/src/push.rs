//! Uploading blobs and raw manifests to a loopback registry with oci-client.

use anyhow::{Context, Result};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A manifest to PUT, by tag or (when `tag` is None) by its own digest.
pub(crate) struct ManifestUpload {
    pub tag: Option<String>,
    pub body: Vec<u8>,
    pub media_type: &'static str,
}

/// Where and how the kit's own pushes reach a registry.
#[derive(Clone, Debug)]
pub(crate) struct PushTarget {
    pub host: String,
    pub https: bool,
    /// PEM of a CA to trust besides the system roots.
    pub ca_pem: Option<String>,
    pub credentials: Option<(String, String)>,
}

/// Pushes all blobs, then the manifests in order (children before the index).
pub(crate) fn upload(
    target: &PushTarget,
    repository: &str,
    blobs: &[Vec<u8>],
    manifests: &[ManifestUpload],
) -> Result<()> {
    // A private runtime on its own thread, so callers may be sync or inside tokio.
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("building tokio runtime")?
                .block_on(upload_async(target, repository, blobs, manifests))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("upload thread panicked"))?
    })
}

async fn upload_async(
    target: &PushTarget,
    repository: &str,
    blobs: &[Vec<u8>],
    manifests: &[ManifestUpload],
) -> Result<()> {
    let host = target.host.as_str();
    let client = Client::new(ClientConfig {
        protocol: if target.https {
            ClientProtocol::Https
        } else {
            ClientProtocol::Http
        },
        use_monolithic_push: true,
        extra_root_certificates: target
            .ca_pem
            .iter()
            .map(|pem| Certificate {
                encoding: CertificateEncoding::Pem,
                data: pem.clone().into_bytes(),
            })
            .collect(),
        ..Default::default()
    });
    let base = Reference::with_tag(host.into(), repository.into(), "latest".into());
    if let Some((user, pass)) = &target.credentials {
        // Negotiates Basic or a bearer token (pull+push scope) before the pushes.
        let auth = RegistryAuth::Basic(user.clone(), pass.clone());
        client
            .auth(&base, &auth, oci_client::RegistryOperation::Push)
            .await
            .with_context(|| format!("authenticating to {host} for a push"))?;
    }
    for blob in blobs {
        let digest = sha256_digest(blob);
        client
            .push_blob(&base, blob.clone(), &digest)
            .await
            .with_context(|| format!("pushing blob {digest} to {host}/{repository}"))?;
    }
    for m in manifests {
        let reference = match &m.tag {
            Some(tag) => Reference::with_tag(host.into(), repository.into(), tag.clone()),
            None => Reference::with_digest(host.into(), repository.into(), sha256_digest(&m.body)),
        };
        let content_type = http::HeaderValue::from_static(m.media_type);
        client
            .push_manifest_raw(&reference, m.body.clone(), content_type)
            .await
            .with_context(|| format!("pushing manifest {reference}"))?;
    }
    Ok(())
}
