//! The oscontainer format: what an image's manifest and config say about the OS inside.
//!
//! A (legacy) oscontainer carries an OSTree archive repo at `srv/repo` in its layers; the commit
//! to deploy is named by the config label `com.coreos.ostree-commit` (if absent: the repo's single
//! ref), and the label `version` is the version shown to people.

use anyhow::{bail, ensure, Result};
use oci_client::manifest::OciDescriptor;
use oci_spec::image::{Descriptor, ImageManifest};

use crate::registry::ResolvedManifest;

pub const COMMIT_LABEL: &str = "com.coreos.ostree-commit";
pub const VERSION_LABEL: &str = "version";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

#[derive(Debug, Clone)]
pub struct Layer {
    pub descriptor: OciDescriptor,
    pub compression: Compression,
}

/// An oscontainer as described by its manifest and config, before any layer is fetched.
#[derive(Debug, Clone)]
pub struct OsImage {
    /// The digest the image is known by (the index's, when the pullspec named one).
    pub digest: String,
    pub commit_label: Option<String>,
    pub version: Option<String>,
    pub layers: Vec<Layer>,
}

impl OsImage {
    pub fn config_descriptor(manifest: &ImageManifest) -> OciDescriptor {
        to_oci(manifest.config())
    }

    /// Reads the layers from the manifest and the labels from the config blob.
    pub fn new(resolved: &ResolvedManifest, config_json: &[u8]) -> Result<OsImage> {
        let config: serde_json::Value = parse_json(config_json, "image config")?;
        let labels = config
            .get("config")
            .and_then(|c| c.get("Labels"))
            .and_then(|l| l.as_object());
        let label = |key: &str| -> Result<Option<String>> {
            match labels.and_then(|l| l.get(key)) {
                None | Some(serde_json::Value::Null) => Ok(None),
                // Labels end up in GLib strings (the origin file), which cannot hold NUL.
                Some(serde_json::Value::String(s)) if s.contains('\0') => {
                    bail!("label {key} contains a NUL character")
                }
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => bail!("label {key} is not a string: {other}"),
            }
        };
        let commit_label = label(COMMIT_LABEL)?;
        if let Some(commit) = &commit_label {
            ensure!(
                is_checksum(commit),
                "label {COMMIT_LABEL}={commit:?} is not an OSTree commit checksum (64 lowercase hex digits)"
            );
        }
        let layers = resolved
            .manifest
            .layers()
            .iter()
            .map(|d| {
                Ok(Layer {
                    compression: compression_of(d.media_type().as_ref())?,
                    descriptor: to_oci(d),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ensure!(!layers.is_empty(), "the image has no layers");
        Ok(OsImage {
            digest: resolved.digest.clone(),
            commit_label,
            version: label(VERSION_LABEL)?,
            layers,
        })
    }
}

/// Parses a JSON document (`what` names it in errors), saying so when it is cut short.
pub fn parse_json(bytes: &[u8], what: &str) -> Result<serde_json::Value> {
    serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            anyhow::anyhow!(
                "{what} is truncated: its {} bytes end inside the JSON document ({e})",
                bytes.len()
            )
        } else {
            anyhow::anyhow!("{what} is not JSON: {e}")
        }
    })
}

pub fn is_checksum(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn to_oci(d: &Descriptor) -> OciDescriptor {
    OciDescriptor {
        media_type: d.media_type().to_string(),
        digest: d.digest().to_string(),
        size: d.size() as i64,
        ..Default::default()
    }
}

/// Layer compression from its media type (OCI and Docker v2 schema 2 spellings).
fn compression_of(media_type: &str) -> Result<Compression> {
    let base = media_type
        .strip_prefix("application/vnd.oci.image.layer.nondistributable.v1.")
        .map(|rest| format!("application/vnd.oci.image.layer.v1.{rest}"));
    Ok(match base.as_deref().unwrap_or(media_type) {
        "application/vnd.oci.image.layer.v1.tar" => Compression::None,
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Compression::Gzip,
        "application/vnd.oci.image.layer.v1.tar+zstd" => Compression::Zstd,
        other => bail!(
            "unsupported layer media type {other:?} (expected a tar, tar+gzip or tar+zstd layer)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_media_types_map_to_compression() {
        assert_eq!(
            compression_of("application/vnd.docker.image.rootfs.diff.tar.gzip").unwrap(),
            Compression::Gzip
        );
        assert_eq!(
            compression_of("application/vnd.oci.image.layer.v1.tar+zstd").unwrap(),
            Compression::Zstd
        );
        assert_eq!(
            compression_of("application/vnd.oci.image.layer.nondistributable.v1.tar").unwrap(),
            Compression::None
        );
        let err = compression_of("application/x-bzip2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("application/x-bzip2"), "{err}");
    }
}
