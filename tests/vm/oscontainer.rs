//! v2 as an oscontainer: an OCI image whose single layer holds an OSTree archive repo at
//! srv/repo with only the v2 commit, labelled `com.coreos.ostree-commit`. The testkit pushes
//! oscontainers made from its small fixture trees; this one is made from a real OS repo, so it is
//! built here (once per run) and pushed with oci-client like the testkit does.
//!
//! The layer is a gzip tar, as oscontainers are shipped (and only a gzip layer has checkpoints
//! inside it, which the power-cut scenario relies on). Archive-repo objects are zlib-compressed
//! already, so it is gzipped at the fastest level: the guest, emulated without KVM, inflates it
//! in seconds.

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::{Client, Reference};
use pivot_testkit::sha256_digest;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::os_commits::{self, OsCommits};
use super::qemu::GUEST_REGISTRY;

const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// The layer tar on disk and what the image config says about it.
pub struct OsLayer {
    pub tar: PathBuf,
    pub digest: String,
    pub size: u64,
    pub commit: String,
    pub version: String,
}

pub struct Pushed {
    pub repository: String,
    pub tag: String,
    pub digest: String,
    /// The commit a node deploys for this image: a legacy image's commit, an ostree-native
    /// image's merge commit (see pivot's `store` module).
    pub commit: String,
}

impl Pushed {
    /// The pullspec by tag, as the guest reaches the registry.
    pub fn guest_by_tag(&self) -> String {
        format!("{GUEST_REGISTRY}/{}:{}", self.repository, self.tag)
    }

    /// The image by digest, as the guest reaches the registry (what origins record).
    pub fn guest_pinned(&self) -> String {
        format!("{GUEST_REGISTRY}/{}@{}", self.repository, self.digest)
    }
}

/// Writes the v2 layer: a fresh archive repo holding only v2 (hard-linked objects), as a gzip
/// tar.
pub fn build_v2_layer(work: &Path, commits: &OsCommits) -> Result<OsLayer> {
    let repo = work.join("oscontainer-repo");
    os_commits::ostree(&repo, &["init", "--mode=archive"])?;
    os_commits::ostree(
        &repo,
        &[
            "pull-local",
            &commits.repo.display().to_string(),
            os_commits::V2_REF,
        ],
    )?;
    let tar = work.join("v2-layer.tar.gz");
    {
        let file = File::create(&tar).with_context(|| format!("creating {}", tar.display()))?;
        // The default level, as image builders compress. At zlib-rs's fastest level (flate2's
        // backend since pivot inflates with it) this layer offered pivot no point to take a
        // checkpoint at, which sit at deflate block boundaries, and hard-reset-mid-pivot
        // needs one.
        let level = flate2::Compression::default();
        let gz = flate2::write::GzEncoder::new(BufWriter::new(file), level);
        let mut builder = tar::Builder::new(gz);
        builder.follow_symlinks(false);
        builder
            .append_dir_all("srv/repo", &repo)
            .context("adding the repo to the layer")?;
        builder.into_inner()?.finish()?.into_inner()?.sync_all()?;
    }
    let (digest, size) = file_digest(&tar)?;
    Ok(OsLayer {
        tar,
        digest,
        size,
        commit: commits.v2.clone(),
        version: "2".into(),
    })
}

fn file_digest(path: &Path) -> Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        size += n as u64;
    }
    Ok((format!("sha256:{}", hex::encode(hash.finalize())), size))
}

/// Pushes the image as `<host>/<repository>:<tag>` to the plain-HTTP registry at `host`.
pub fn push(host: &str, repository: &str, tag: &str, layer: &OsLayer) -> Result<Pushed> {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Labels": {
            "com.coreos.ostree-commit": layer.commit,
            "version": layer.version,
        }},
        // Uncompressed layer: its diff ID is its digest.
        "rootfs": { "type": "layers", "diff_ids": [layer.digest] },
    }))?;
    let config_digest = sha256_digest(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": { "mediaType": CONFIG_TYPE, "digest": config_digest, "size": config.len() },
        "layers": [{ "mediaType": LAYER_TYPE, "digest": layer.digest, "size": layer.size }],
    }))?;
    let digest = sha256_digest(&manifest);
    let blob =
        std::fs::read(&layer.tar).with_context(|| format!("reading {}", layer.tar.display()))?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime
        .block_on(async {
            let client = Client::new(ClientConfig {
                protocol: ClientProtocol::Http,
                use_monolithic_push: true,
                ..Default::default()
            });
            let reference = Reference::with_tag(host.into(), repository.into(), tag.into());
            client
                .push_blob(&reference, blob, &layer.digest)
                .await
                .context("pushing the OS layer")?;
            client
                .push_blob(&reference, config, &config_digest)
                .await
                .context("pushing the image config")?;
            client
                .push_manifest_raw(
                    &reference,
                    manifest,
                    http::HeaderValue::from_static(MANIFEST_TYPE),
                )
                .await
                .context("pushing the manifest")?;
            anyhow::Ok(())
        })
        .with_context(|| format!("pushing {host}/{repository}:{tag}"))?;
    Ok(Pushed {
        repository: repository.to_string(),
        tag: tag.to_string(),
        digest,
        commit: layer.commit.clone(),
    })
}
