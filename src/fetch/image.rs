//! The two image formats pivot deploys, told apart by the config labels, and what an image's
//! manifest and config say about the OS inside.
//!
//! - A legacy oscontainer carries an OSTree archive repo at `srv/repo` in its layers; the commit
//!   to deploy is named by the config label `com.coreos.ostree-commit` (if absent: the repo's
//!   single ref).
//! - An ostree-native container (CoreOS, RHCOS and bootc images, written by ostree-rs-ext) names
//!   its commit by the label `ostree.commit`; layer 0 carries the commit and its metadata, the
//!   layers up to the one whose diffid is the label `ostree.final-diffid` carry its content, and
//!   any layers after that were derived from it by a container build.
//!
//! The label `version` (or `org.opencontainers.image.version`) is the version shown to people.

use anyhow::{bail, ensure, Context, Result};
use oci_client::manifest::OciDescriptor;
use oci_spec::image::{Descriptor, ImageManifest};

use crate::fetch::registry::ResolvedManifest;

pub const COMMIT_LABEL: &str = "com.coreos.ostree-commit";
pub const VERSION_LABEL: &str = "version";
/// The commit of an ostree-native container image.
pub const NATIVE_COMMIT_LABEL: &str = "ostree.commit";
/// The diffid of the last layer of an ostree-native image that belongs to its commit.
pub const FINAL_DIFFID_LABEL: &str = "ostree.final-diffid";
const OCI_VERSION_LABEL: &str = "org.opencontainers.image.version";
/// Labels that mark a bootable (ostree-native) OS image: ostree-rs-ext's and bootc's.
const BOOTABLE_LABELS: [&str; 2] = ["ostree.bootable", "containers.bootc"];

/// How an image carries its OSTree commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An archive repo at `srv/repo/` (label `com.coreos.ostree-commit`).
    Legacy,
    /// The ostree-rs-ext tar format under `sysroot/ostree/repo/` (label `ostree.commit`).
    Native,
}

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
    /// A layer of an ostree-native image after `ostree.final-diffid`: files a container build
    /// added, applied as a new commit on top of the image's.
    pub derived: bool,
}

/// An oscontainer as described by its manifest and config, before any layer is fetched.
#[derive(Debug, Clone)]
pub struct OsImage {
    /// The digest the image is known by (the index's, when the pullspec named one).
    pub digest: String,
    pub format: Format,
    /// The commit that is the target: once it is deployed, the node is at this image. None when
    /// the image does not say (a legacy one without the label) or when its commit is made by
    /// pivot (an ostree-native image with derived layers).
    pub commit_label: Option<String>,
    /// For an ostree-native image with derived layers: the commit they apply on.
    pub base_commit: Option<String>,
    pub version: Option<String>,
    pub layers: Vec<Layer>,
    /// The platform manifest's digest, its JSON and the config's JSON: what an ostree-native
    /// image's merge commit records (see [`crate::import::store`]). Empty for an image read back from
    /// the repo rather than from its source.
    pub manifest_digest: String,
    pub manifest_json: String,
    pub config_json: String,
}

impl OsImage {
    pub fn config_descriptor(manifest: &ImageManifest) -> OciDescriptor {
        to_oci(manifest.config())
    }

    /// Whether layer `i` is a blob an earlier layer of the image is too (OCI allows it; a build
    /// step can repeat a layer): a pivot fetches it once, and it makes no objects of its own.
    pub fn repeats_earlier_layer(&self, i: usize) -> bool {
        let digest = &self.layers[i].descriptor.digest;
        self.layers[..i].iter().any(|l| &l.descriptor.digest == digest)
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
        let native = label(NATIVE_COMMIT_LABEL)?;
        // Every bootable label is checked (a malformed one is refused even after a good one).
        let mut bootable = None;
        for name in BOOTABLE_LABELS {
            if label(name)?.is_some() {
                bootable = bootable.or(Some(name));
            }
        }
        // Labelled bootable but without its commit: a bootc image of a kind pivot cannot read
        // (its layers are a plain filesystem); say so now rather than after the download.
        if let (None, Some(name)) = (&native, bootable) {
            ensure!(
                label(COMMIT_LABEL)?.is_some(),
                "the image is labelled {name} but has no {NATIVE_COMMIT_LABEL} label: pivot deploys ostree-native images (encapsulated by ostree-rs-ext, rpm-ostree or bootc) and legacy oscontainers, not plain container filesystems"
            );
        }
        if native.is_some() && bootable.is_none() {
            // Not a refusal: the commit's kernel is what makes it bootable, and libostree
            // refuses to deploy a commit without one.
            tracing::warn!(
                "the image has an {NATIVE_COMMIT_LABEL} label but neither {} nor {}: it may not be meant to boot",
                BOOTABLE_LABELS[0],
                BOOTABLE_LABELS[1]
            );
        }
        let (format, mut commit_label) = match native {
            Some(commit) => (Format::Native, Some((NATIVE_COMMIT_LABEL, commit))),
            None => (
                Format::Legacy,
                label(COMMIT_LABEL)?.map(|c| (COMMIT_LABEL, c)),
            ),
        };
        if let Some((name, commit)) = &commit_label {
            ensure!(
                is_checksum(commit),
                "label {name}={commit:?} is not an OSTree commit checksum (64 lowercase hex digits)"
            );
        }
        let mut layers = resolved
            .manifest
            .layers()
            .iter()
            .map(|d| {
                Ok(Layer {
                    compression: compression_of(d.media_type().as_ref())?,
                    descriptor: to_oci(d),
                    derived: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        ensure!(!layers.is_empty(), "the image has no layers");
        if format == Format::Native {
            let commit_layers =
                native_commit_layers(&config, label(FINAL_DIFFID_LABEL)?)?.unwrap_or(layers.len());
            ensure!(
                commit_layers <= layers.len(),
                "the image config lists more layers ({commit_layers}) than its manifest ({})",
                layers.len()
            );
            for layer in &mut layers[commit_layers..] {
                layer.derived = true;
            }
        }
        let mut base_commit = None;
        if layers.iter().any(|l| l.derived) {
            base_commit = commit_label.take();
        }
        let version = match label(VERSION_LABEL)? {
            Some(v) => Some(v),
            None => label(OCI_VERSION_LABEL)?,
        };
        Ok(OsImage {
            digest: resolved.digest.clone(),
            format,
            commit_label: commit_label.map(|(_, c)| c),
            base_commit: base_commit.map(|(_, c)| c),
            version,
            layers,
            manifest_digest: resolved.manifest_digest.clone(),
            manifest_json: resolved.json.clone(),
            // Parsed as JSON above, so UTF-8.
            config_json: String::from_utf8_lossy(config_json).into_owned(),
        })
    }
}

/// How many layers of an ostree-native image hold its commit: up to the layer whose diffid is
/// `final_diffid` (images without the label, from older encapsulations, hold it in all).
fn native_commit_layers(
    config: &serde_json::Value,
    final_diffid: Option<String>,
) -> Result<Option<usize>> {
    let diff_ids: Vec<&str> = config
        .get("rootfs")
        .and_then(|r| r.get("diff_ids"))
        .and_then(|d| d.as_array())
        .map(|a| a.iter().filter_map(|d| d.as_str()).collect())
        .unwrap_or_default();
    let Some(final_diffid) = final_diffid else {
        return Ok(None);
    };
    let position = diff_ids
        .iter()
        .position(|d| *d == final_diffid)
        .with_context(|| {
            format!("label {FINAL_DIFFID_LABEL}={final_diffid:?} names no layer of the image config's rootfs.diff_ids")
        })?;
    // Two layers with that diffid (ostree-rs-ext 0.15 writes two empty ones when a chunk ends up
    // empty) leave the image's own layers and those built on it ambiguous: ostree-rs-ext refuses
    // such an image ("Multiple entries for …"), and so does pivot.
    let count = diff_ids.iter().filter(|d| **d == final_diffid).count();
    ensure!(
        count == 1,
        "label {FINAL_DIFFID_LABEL}={final_diffid:?} names {count} layers of the image config's rootfs.diff_ids: which layers are the image's own is ambiguous"
    );
    Ok(Some(position + 1))
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

pub(crate) fn to_oci(d: &Descriptor) -> OciDescriptor {
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
    fn native_commit_layers_end_at_the_final_diffid() {
        let config = serde_json::json!({
            "rootfs": { "type": "layers", "diff_ids": ["sha256:a", "sha256:b", "sha256:c"] }
        });
        let layers = |label: Option<&str>| native_commit_layers(&config, label.map(Into::into));
        assert_eq!(layers(Some("sha256:b")).unwrap(), Some(2));
        assert_eq!(layers(Some("sha256:c")).unwrap(), Some(3));
        assert_eq!(layers(None).unwrap(), None);
        let err = layers(Some("sha256:x")).unwrap_err().to_string();
        assert!(err.contains(FINAL_DIFFID_LABEL), "{err}");
    }

    #[test]
    fn a_final_diffid_naming_two_layers_is_refused() {
        // As ostree-rs-ext 0.15.3's chunking writes it: an empty chunk beside the empty last one.
        let config = serde_json::json!({
            "rootfs": { "type": "layers", "diff_ids": ["sha256:a", "sha256:e", "sha256:b", "sha256:e"] }
        });
        let err = native_commit_layers(&config, Some("sha256:e".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("names 2 layers") && err.contains("ambiguous"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

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

    fn image_with_labels(labels: serde_json::Value) -> Result<OsImage> {
        let layer = format!("sha256:{}", "1".repeat(64));
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": format!("sha256:{}", "2".repeat(64)), "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer, "size": 10}]
        });
        let resolved = ResolvedManifest {
            digest: format!("sha256:{}", "3".repeat(64)),
            manifest_digest: format!("sha256:{}", "3".repeat(64)),
            json: manifest.to_string(),
            manifest: serde_json::from_value(manifest).unwrap(),
        };
        let config = serde_json::json!({"config": {"Labels": labels}});
        OsImage::new(&resolved, config.to_string().as_bytes())
    }

    #[test]
    fn bootc_image_without_ostree_commit_is_refused_before_download() {
        let err = image_with_labels(serde_json::json!({"containers.bootc": "1"}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("labelled containers.bootc but has no ostree.commit label"),
            "{err}"
        );
    }

    #[test]
    fn bootable_labels_go_with_either_format() {
        let commit = "a".repeat(64);
        let native = image_with_labels(serde_json::json!({
            "ostree.commit": commit, "ostree.bootable": "true"
        }))
        .unwrap();
        assert_eq!(native.format, Format::Native);
        let legacy = image_with_labels(serde_json::json!({
            "com.coreos.ostree-commit": commit, "containers.bootc": "1"
        }))
        .unwrap();
        assert_eq!(legacy.format, Format::Legacy);
    }
}
