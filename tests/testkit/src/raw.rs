//! Hostile and broken images, byte by byte: tar layers whose headers say exactly what a test
//! wants (`..`, absolute names, links anywhere, device nodes, setuid bits, sizes), and manifests
//! and configs written by the test, pushed as they are.

use crate::layer::{self, Compression, Kind};
use crate::oscontainer::{build_repo, ImageSpec, COMMIT_LABEL};
use crate::push::{sha256_digest, upload, ManifestUpload, PushTarget};
use crate::registry::Registry;
use crate::tree::Tree;
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// What a raw tar member is.
#[derive(Clone, Debug)]
pub enum RawKind {
    Dir,
    File(Vec<u8>),
    /// A regular file of this many zero bytes, streamed (for sizes that do not fit in memory).
    Zeros(u64),
    Symlink(String),
    HardLink(String),
    CharDevice,
    BlockDevice,
    Fifo,
}

/// One tar member: its name bytes are written as given, unchecked.
#[derive(Clone, Debug)]
pub struct RawEntry {
    pub name: Vec<u8>,
    pub mode: u32,
    pub kind: RawKind,
}

/// A tar layer built member by member.
#[derive(Clone, Debug, Default)]
pub struct RawTar {
    pub entries: Vec<RawEntry>,
}

impl RawTar {
    pub fn new() -> RawTar {
        RawTar::default()
    }

    pub fn entry(mut self, name: impl AsRef<[u8]>, mode: u32, kind: RawKind) -> RawTar {
        self.entries.push(RawEntry {
            name: name.as_ref().to_vec(),
            mode,
            kind,
        });
        self
    }

    pub fn dir(self, name: &str) -> RawTar {
        self.entry(name, 0o755, RawKind::Dir)
    }

    pub fn file(self, name: &str, mode: u32, data: impl AsRef<[u8]>) -> RawTar {
        self.entry(name, mode, RawKind::File(data.as_ref().to_vec()))
    }

    pub fn symlink(self, name: &str, target: &str) -> RawTar {
        self.entry(name, 0o777, RawKind::Symlink(target.into()))
    }

    pub fn hardlink(self, name: &str, target: &str) -> RawTar {
        self.entry(name, 0o644, RawKind::HardLink(target.into()))
    }

    /// Appends all of `other`'s members.
    pub fn extend(mut self, other: &RawTar) -> RawTar {
        self.entries.extend(other.entries.iter().cloned());
        self
    }

    /// Replaces the content of the member named `name` (which must exist).
    pub fn replace_file(mut self, name: &str, data: Vec<u8>) -> RawTar {
        let entry = self
            .entries
            .iter_mut()
            .find(|e| e.name == name.as_bytes())
            .unwrap_or_else(|| panic!("no member {name}"));
        entry.kind = RawKind::File(data);
        self
    }

    /// The member's content, if it is a file.
    pub fn file_data(&self, name: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|e| e.name == name.as_bytes())
            .and_then(|e| match &e.kind {
                RawKind::File(data) => Some(data.as_slice()),
                _ => None,
            })
    }

    /// The uncompressed tar.
    pub fn to_tar(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// The tar, compressed as a layer blob.
    pub fn to_blob(&self, compression: Compression) -> Result<Vec<u8>> {
        match compression {
            Compression::None => self.to_tar(),
            Compression::Gzip => {
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                self.write_to(&mut enc)?;
                enc.finish().context("gzip")
            }
            Compression::Zstd => {
                let mut enc = zstd::Encoder::new(Vec::new(), 3).context("zstd")?;
                self.write_to(&mut enc)?;
                enc.finish().context("zstd")
            }
        }
    }

    fn write_to(&self, out: impl Write) -> Result<()> {
        let mut builder = tar::Builder::new(out);
        for e in &self.entries {
            append_raw(&mut builder, e)
                .with_context(|| format!("adding {:?}", String::from_utf8_lossy(&e.name)))?;
        }
        builder.into_inner().context("finishing tar")?.flush()?;
        Ok(())
    }
}

/// Writes the header fields by hand, so no name or link is refused or rewritten; names longer
/// than a header field get a GNU long-name member first.
fn append_raw<W: Write>(builder: &mut tar::Builder<W>, e: &RawEntry) -> Result<()> {
    let (kind, size, link): (tar::EntryType, u64, Option<&str>) = match &e.kind {
        RawKind::Dir => (tar::EntryType::Directory, 0, None),
        RawKind::File(data) => (tar::EntryType::Regular, data.len() as u64, None),
        RawKind::Zeros(n) => (tar::EntryType::Regular, *n, None),
        RawKind::Symlink(t) => (tar::EntryType::Symlink, 0, Some(t)),
        RawKind::HardLink(t) => (tar::EntryType::Link, 0, Some(t)),
        RawKind::CharDevice => (tar::EntryType::Char, 0, None),
        RawKind::BlockDevice => (tar::EntryType::Block, 0, None),
        RawKind::Fifo => (tar::EntryType::Fifo, 0, None),
    };
    if e.name.len() > 100 {
        append_long(builder, b'L', &e.name)?;
    }
    if let Some(link) = link.filter(|l| l.len() > 100) {
        append_long(builder, b'K', link.as_bytes())?;
    }
    let mut header = tar::Header::new_gnu();
    {
        let gnu = header.as_gnu_mut().context("GNU header")?;
        let n = e.name.len().min(100);
        gnu.name[..n].copy_from_slice(&e.name[..n]);
        if let Some(link) = link {
            let n = link.len().min(100);
            gnu.linkname[..n].copy_from_slice(&link.as_bytes()[..n]);
        }
    }
    header.set_entry_type(kind);
    header.set_mode(e.mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_size(size);
    if matches!(e.kind, RawKind::CharDevice | RawKind::BlockDevice) {
        header.set_device_major(8)?;
        header.set_device_minor(0)?;
    }
    header.set_cksum();
    match &e.kind {
        RawKind::File(data) => builder.append(&header, data.as_slice())?,
        RawKind::Zeros(n) => builder.append(&header, io::repeat(0).take(*n))?,
        _ => builder.append(&header, io::empty())?,
    }
    Ok(())
}

fn append_long<W: Write>(builder: &mut tar::Builder<W>, kind: u8, name: &[u8]) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.as_gnu_mut().context("GNU header")?.name[..13].copy_from_slice(b"././@LongLink");
    header.set_entry_type(tar::EntryType::new(kind));
    header.set_mode(0o644);
    header.set_size(name.len() as u64 + 1);
    header.set_cksum();
    let mut data = name.to_vec();
    data.push(0);
    builder.append(&header, data.as_slice())?;
    Ok(())
}

/// A real archive repo with a tree committed (ref `os/pivot-test`), as tar members under
/// `srv/repo/`, to which a test adds its hostile members.
pub struct RepoTar {
    pub tar: RawTar,
    pub commit: String,
    _scratch: tempfile::TempDir,
    repo_dir: PathBuf,
}

impl RepoTar {
    pub fn build(tree: &Tree, version: &str) -> Result<RepoTar> {
        let scratch = tempfile::tempdir().context("creating repo scratch dir")?;
        let repo_dir = scratch.path().join("repo");
        let commit = build_repo(&repo_dir, &ImageSpec::new(tree.clone(), version))?;
        let skip = |rel: &str| rel == ".lock" || rel.starts_with("tmp/");
        let mut tar = RawTar::new().dir("srv/").dir("srv/repo/");
        for item in layer::walk(&repo_dir, "srv/repo", &skip)? {
            tar = match item.kind {
                Kind::Dir { mode } => tar.entry(format!("{}/", item.path), mode, RawKind::Dir),
                Kind::File { mode, source } => {
                    let data = std::fs::read(&source)
                        .with_context(|| format!("reading {}", source.display()))?;
                    tar.entry(&item.path, mode, RawKind::File(data))
                }
                Kind::Symlink { target } => tar.symlink(&item.path, &target.to_string_lossy()),
            };
        }
        Ok(RepoTar {
            tar,
            commit,
            _scratch: scratch,
            repo_dir,
        })
    }

    /// The archive repo on disk.
    pub fn repo_path(&self) -> &Path {
        &self.repo_dir
    }

    /// Member name of an object: `srv/repo/objects/ab/cdef….<ext>`.
    pub fn object_member(checksum: &str, ext: &str) -> String {
        format!(
            "srv/repo/objects/{}/{}.{ext}",
            &checksum[..2],
            &checksum[2..]
        )
    }

    /// Checksums of the objects with extension `ext` in the repo.
    pub fn objects(&self, ext: &str) -> Vec<String> {
        let suffix = format!(".{ext}");
        let mut out: Vec<String> = self
            .tar
            .entries
            .iter()
            .filter_map(|e| {
                let name = std::str::from_utf8(&e.name).ok()?;
                let rest = name.strip_prefix("srv/repo/objects/")?;
                let (dir, file) = rest.split_once('/')?;
                Some(format!("{dir}{}", file.strip_suffix(&suffix)?))
            })
            .collect();
        out.sort();
        out
    }
}

/// One layer as pushed: its blob, media type and the size its descriptor declares.
#[derive(Clone, Debug)]
pub struct RawLayer {
    pub media_type: String,
    pub blob: Vec<u8>,
    /// Declared in the manifest instead of the blob's real size.
    pub declared_size: Option<i64>,
}

impl RawLayer {
    pub fn new(tar: &RawTar, compression: Compression) -> Result<RawLayer> {
        let media_type = match compression {
            Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
            Compression::None => "application/vnd.oci.image.layer.v1.tar",
        };
        Ok(RawLayer {
            media_type: media_type.into(),
            blob: tar.to_blob(compression)?,
            declared_size: None,
        })
    }

    pub fn digest(&self) -> String {
        sha256_digest(&self.blob)
    }
}

/// An image pushed exactly as a test assembles it.
#[derive(Clone, Debug)]
pub struct RawImage {
    pub layers: Vec<RawLayer>,
    /// The config blob's bytes.
    pub config: Vec<u8>,
}

/// What a push of a [`RawImage`] made.
#[derive(Clone, Debug)]
pub struct PushedRaw {
    pub by_tag: String,
    pub by_digest: String,
    pub digest: String,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
}

impl RawImage {
    /// An image with these layers and a config whose labels name `commit` (when given).
    pub fn new(layers: Vec<RawLayer>, commit: Option<&str>) -> RawImage {
        let mut labels = serde_json::Map::new();
        labels.insert("version".into(), "hostile".into());
        if let Some(commit) = commit {
            labels.insert(COMMIT_LABEL.into(), commit.into());
        }
        RawImage {
            layers,
            config: Self::config_with_labels(Value::Object(labels)),
        }
    }

    /// A config blob with these labels.
    pub fn config_with_labels(labels: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Labels": labels },
            "rootfs": { "type": "layers", "diff_ids": [] },
        }))
        .expect("serializing config")
    }

    /// The OCI manifest for the layers and config, declared sizes included.
    pub fn manifest(&self) -> Value {
        let layers: Vec<Value> = self
            .layers
            .iter()
            .map(|l| {
                json!({
                    "mediaType": l.media_type,
                    "digest": l.digest(),
                    "size": l.declared_size.unwrap_or(l.blob.len() as i64),
                })
            })
            .collect();
        json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": OCI_CONFIG,
                "digest": sha256_digest(&self.config),
                "size": self.config.len(),
            },
            "layers": layers,
        })
    }

    /// Pushes blobs and [`RawImage::manifest`] as `<registry>/<repository>:<tag>`.
    pub fn push(&self, registry: &Registry, repository: &str, tag: &str) -> Result<PushedRaw> {
        let manifest = serde_json::to_vec(&self.manifest()).context("serializing manifest")?;
        self.push_with_manifest(registry, repository, tag, manifest)
    }

    /// Pushes the blobs and `manifest` exactly as given.
    pub fn push_with_manifest(
        &self,
        registry: &Registry,
        repository: &str,
        tag: &str,
        manifest: Vec<u8>,
    ) -> Result<PushedRaw> {
        ensure!(
            !registry.requires_client_cert(),
            "raw images go to plain registries"
        );
        let mut blobs: Vec<Vec<u8>> = self.layers.iter().map(|l| l.blob.clone()).collect();
        blobs.push(self.config.clone());
        let target = PushTarget {
            host: registry.host(),
            https: registry.is_tls(),
            ca_pem: registry.ca_pem(),
            credentials: registry.credentials(),
        };
        let digest = sha256_digest(&manifest);
        upload(
            &target,
            repository,
            &blobs,
            &[ManifestUpload {
                tag: Some(tag.into()),
                body: manifest,
                media_type: OCI_MANIFEST,
            }],
        )?;
        let base = format!("{}/{repository}", registry.host());
        Ok(PushedRaw {
            by_tag: format!("{base}:{tag}"),
            by_digest: format!("{base}@{digest}"),
            digest,
            config_digest: sha256_digest(&self.config),
            layer_digests: self.layers.iter().map(RawLayer::digest).collect(),
        })
    }
}
