//! Legacy oscontainers: an OSTree archive repo at srv/repo inside an image.

use crate::commit::{commit_tree, sign_commit, CommitSigner};
use crate::layer::{self, Item, Kind};
use crate::push::{sha256_digest, upload, ManifestUpload, PushTarget};
use crate::registry::Registry;
use crate::tree::Tree;
use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use std::path::Path;

pub use crate::layer::Compression;

/// Label naming the OSTree commit inside the image.
pub const COMMIT_LABEL: &str = "com.coreos.ostree-commit";
/// Commit label of the arm64 decoy in an index; no repo has it.
pub const DECOY_COMMIT: &str = "deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ManifestFormat {
    #[default]
    Oci,
    DockerV2S2,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum CommitLabel {
    #[default]
    Correct,
    Omit,
    Value(String),
}

#[derive(Clone, Debug)]
pub struct ImageSpec {
    pub tree: Tree,
    pub version: String,
    pub commit_label: CommitLabel,
    pub with_repo: bool,
    pub refs: Vec<String>,
    pub compression: Compression,
    pub format: ManifestFormat,
    pub index: bool,
    pub layers: usize,
    /// Signs the commit in the image's repo.
    pub commit_signer: Option<CommitSigner>,
    /// More config labels (`ostree.linux`, ...).
    pub labels: Vec<(String, String)>,
    /// The config's `created` (RFC 3339), if any.
    pub created: Option<String>,
}

impl ImageSpec {
    pub fn new(tree: Tree, version: &str) -> ImageSpec {
        ImageSpec {
            tree,
            version: version.to_string(),
            commit_label: CommitLabel::Correct,
            with_repo: true,
            refs: vec!["os/pivot-test".to_string()],
            compression: Compression::Gzip,
            format: ManifestFormat::Oci,
            index: false,
            layers: 1,
            commit_signer: None,
            labels: Vec::new(),
            created: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct PushedImage {
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub manifest_digest: String,
    pub commit: String,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
    /// The layers' sizes, as the manifest gives them.
    pub layer_sizes: Vec<u64>,
    pub by_tag: String,
    pub by_digest: String,
}

struct MediaTypes {
    manifest: &'static str,
    index: &'static str,
    config: &'static str,
    layer: &'static str,
}

fn media_types(format: ManifestFormat, compression: Compression) -> Result<MediaTypes> {
    Ok(match format {
        ManifestFormat::Oci => MediaTypes {
            manifest: "application/vnd.oci.image.manifest.v1+json",
            index: "application/vnd.oci.image.index.v1+json",
            config: "application/vnd.oci.image.config.v1+json",
            layer: match compression {
                Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
                Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
                Compression::None => "application/vnd.oci.image.layer.v1.tar",
            },
        },
        ManifestFormat::DockerV2S2 => MediaTypes {
            manifest: "application/vnd.docker.distribution.manifest.v2+json",
            index: "application/vnd.docker.distribution.manifest.list.v2+json",
            config: "application/vnd.docker.container.image.v1+json",
            layer: match compression {
                Compression::Gzip => "application/vnd.docker.image.rootfs.diff.tar.gzip",
                Compression::None => "application/vnd.docker.image.rootfs.diff.tar",
                Compression::Zstd => bail!("Docker schema 2 has no zstd layer type; use Oci"),
            },
        },
    })
}

/// One platform image, serialized and ready to push.
struct Built {
    blobs: Vec<Vec<u8>>,
    config_digest: String,
    layer_digests: Vec<String>,
    layer_sizes: Vec<u64>,
    manifest: Vec<u8>,
}

/// Builds the image for `spec`, pushes it as `<registry>/<repository>:<tag>`.
pub fn push_oscontainer(
    registry: &Registry,
    repository: &str,
    tag: &str,
    spec: &ImageSpec,
) -> Result<PushedImage> {
    ensure!(spec.layers >= 1, "an image needs at least one layer");
    let types = media_types(spec.format, spec.compression)?;
    let scratch = tempfile::tempdir().context("creating oscontainer scratch dir")?;
    let repo_dir = scratch.path().join("repo");
    let commit = build_repo(&repo_dir, spec)?;

    let items = if spec.with_repo {
        // The lock file and tmp/ contents are runtime state, not repo content.
        let skip = |rel: &str| rel == ".lock" || rel.starts_with("tmp/");
        let mut items = vec![dir_item("srv"), dir_item("srv/repo")];
        items.extend(layer::walk(&repo_dir, "srv/repo", &skip)?);
        items
    } else {
        tree_items(&not_a_repo_tree(), &scratch.path().join("other"))?
    };
    let label = match &spec.commit_label {
        CommitLabel::Correct => Some(commit.clone()),
        CommitLabel::Omit => None,
        CommitLabel::Value(v) => Some(v.clone()),
    };
    let layers = layer::split(&items, spec.layers);
    let real = build_image(&layers, &types, spec, "amd64", label.as_deref())?;
    let manifest_digest = sha256_digest(&real.manifest);

    let mut blobs = real.blobs.clone();
    let mut manifests = Vec::new();
    let digest = if spec.index {
        let decoy_tree = Tree::default().with_file(
            "srv/decoy/README",
            0o644,
            "arm64 decoy image: not the real oscontainer\n",
        );
        let decoy_layers = vec![tree_items(&decoy_tree, &scratch.path().join("decoy"))?];
        let decoy = build_image(&decoy_layers, &types, spec, "arm64", Some(DECOY_COMMIT))?;
        blobs.extend(decoy.blobs.iter().cloned());
        let index = json!({
            "schemaVersion": 2,
            "mediaType": types.index,
            "manifests": [
                descriptor(types.manifest, &decoy.manifest, Some("arm64")),
                descriptor(types.manifest, &real.manifest, Some("amd64")),
            ],
        });
        let index = to_bytes(&index)?;
        manifests.push(by_digest(decoy.manifest, types.manifest));
        manifests.push(by_digest(real.manifest, types.manifest));
        let digest = sha256_digest(&index);
        manifests.push(ManifestUpload {
            tag: Some(tag.to_string()),
            body: index,
            media_type: types.index,
        });
        digest
    } else {
        manifests.push(ManifestUpload {
            tag: Some(tag.to_string()),
            body: real.manifest,
            media_type: types.manifest,
        });
        manifest_digest.clone()
    };
    push_to(registry, repository, &blobs, &manifests)?;

    let base = format!("{}/{repository}", registry.host());
    Ok(PushedImage {
        repository: repository.to_string(),
        tag: tag.to_string(),
        by_tag: format!("{base}:{tag}"),
        by_digest: format!("{base}@{digest}"),
        digest,
        manifest_digest,
        commit,
        config_digest: real.config_digest,
        layer_digests: real.layer_digests,
        layer_sizes: real.layer_sizes,
    })
}

/// Pushes with the registry's credentials and CA. The kit holds no client
/// certificate of its own, so a registry that demands one gets the push through
/// a short-lived plain-HTTP registry serving the same storage.
pub(crate) fn push_to(
    registry: &Registry,
    repository: &str,
    blobs: &[Vec<u8>],
    manifests: &[ManifestUpload],
) -> Result<()> {
    if registry.requires_client_cert() {
        let side = Registry::builder().shared_storage(registry).start()?;
        return push_to(&side, repository, blobs, manifests).context(
            "pushing through a plain registry sharing the client-cert registry's storage",
        );
    }
    let target = PushTarget {
        host: registry.host(),
        https: registry.is_tls(),
        ca_pem: registry.ca_pem(),
        credentials: registry.credentials(),
    };
    upload(&target, repository, blobs, manifests)
}

/// Creates the archive repo, commits the tree and points the refs at commits.
/// A second and later ref gets its own commit (same tree, other version).
pub(crate) fn build_repo(repo_dir: &Path, spec: &ImageSpec) -> Result<String> {
    let repo = ostree::Repo::new_for_path(repo_dir);
    repo.create(ostree::RepoMode::Archive, ostree::gio::Cancellable::NONE)
        .with_context(|| format!("creating archive repo {}", repo_dir.display()))?;
    let first = spec.refs.first().map(String::as_str);
    let commit = commit_tree(&repo, &spec.tree, first, &spec.version)?;
    if let Some(signer) = &spec.commit_signer {
        sign_commit(repo_dir, &commit, signer)?;
    }
    for (i, other) in spec.refs.iter().enumerate().skip(1) {
        let version = format!("{}.other{i}", spec.version);
        commit_tree(&repo, &spec.tree, Some(other), &version)?;
    }
    Ok(commit)
}

fn build_image(
    layers: &[Vec<Item>],
    types: &MediaTypes,
    spec: &ImageSpec,
    arch: &str,
    commit_label: Option<&str>,
) -> Result<Built> {
    let mut blobs = Vec::new();
    let mut diff_ids = Vec::new();
    let mut layer_descs = Vec::new();
    let mut layer_digests = Vec::new();
    let mut layer_sizes = Vec::new();
    for items in layers {
        let tar = layer::tar(items)?;
        diff_ids.push(sha256_digest(&tar));
        let blob = layer::compress(&tar, spec.compression)?;
        layer_descs.push(descriptor(types.layer, &blob, None));
        layer_digests.push(sha256_digest(&blob));
        layer_sizes.push(blob.len() as u64);
        blobs.push(blob);
    }
    let mut labels = serde_json::Map::new();
    labels.insert("version".into(), spec.version.clone().into());
    if let Some(commit) = commit_label {
        labels.insert(COMMIT_LABEL.into(), commit.into());
    }
    for (key, value) in &spec.labels {
        labels.insert(key.clone(), value.clone().into());
    }
    let mut config = json!({
        "architecture": arch,
        "os": "linux",
        "config": { "Labels": labels },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    if let Some(created) = &spec.created {
        config["created"] = created.clone().into();
    }
    let config = to_bytes(&config)?;
    let manifest = to_bytes(&json!({
        "schemaVersion": 2,
        "mediaType": types.manifest,
        "config": descriptor(types.config, &config, None),
        "layers": layer_descs,
    }))?;
    let config_digest = sha256_digest(&config);
    blobs.push(config);
    Ok(Built {
        blobs,
        config_digest,
        layer_digests,
        layer_sizes,
        manifest,
    })
}

fn descriptor(media_type: &str, body: &[u8], arch: Option<&str>) -> Value {
    let mut d = json!({
        "mediaType": media_type,
        "digest": sha256_digest(body),
        "size": body.len(),
    });
    if let Some(arch) = arch {
        d["platform"] = json!({ "architecture": arch, "os": "linux" });
    }
    d
}

fn by_digest(body: Vec<u8>, media_type: &'static str) -> ManifestUpload {
    ManifestUpload {
        tag: None,
        body,
        media_type,
    }
}

fn to_bytes(v: &Value) -> Result<Vec<u8>> {
    serde_json::to_vec(v).context("serializing JSON")
}

fn dir_item(path: &str) -> Item {
    Item {
        path: path.to_string(),
        kind: Kind::Dir { mode: 0o755 },
    }
}

/// What a `with_repo: false` image carries instead of srv/repo.
fn not_a_repo_tree() -> Tree {
    Tree::default()
        .with_file("srv/README", 0o644, "no ostree repo in this image\n")
        .with_file("usr/share/doc/not-an-oscontainer", 0o644, "plain image\n")
}

fn tree_items(tree: &Tree, dir: &Path) -> Result<Vec<Item>> {
    tree.write_to(dir)?;
    layer::walk(dir, "", &|_| false)
}
