//! Artifacts attached to an image by tag in its own repository, as cosign attaches signatures
//! (`sha256-<hex>.sig`) and containers/image reads them with `use-sigstore-attachments`.

use anyhow::{Context, Result};
use bytes::Bytes;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::Reference;

use super::Registry;
use crate::fetch::retry;

impl Registry {
    /// The manifest tagged `tag` in the image's repository, checked to be what its bytes
    /// hash to; None when the registry has no such tag.
    pub async fn tagged_manifest(&self, tag: &str) -> Result<Option<Bytes>> {
        let reference = Reference::with_tag(
            self.image.registry.clone(),
            self.image.repository.clone(),
            tag.into(),
        );
        let what = format!("fetching manifest {tag}");
        let fetched = retry::retry(&self.retry, &what, || async {
            match self.renewing(&reference, || self.get_manifest(&reference)).await {
                Err(e) if is_unknown(&e) => Ok(None),
                Err(e) => Err(e),
                Ok(read) => Ok(Some(read)),
            }
        })
        .await
        .with_context(|| format!("{what} of {}", self.image.name()))?;
        fetched
            .transpose()
            .with_context(|| format!("{what} of {}", self.image.name()))
    }
}

/// The registry has no manifest by that name.
fn is_unknown(e: &OciDistributionError) -> bool {
    match retry::peel(e) {
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| matches!(e.code, OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown)),
        OciDistributionError::ServerError { code: 404, .. } => true,
        _ => false,
    }
}
