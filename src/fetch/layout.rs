//! OCI image layouts as image sources: a directory (`oci:DIR`) or a tar file of one
//! (`oci-archive:FILE`), for sites without a registry. They are trusted no more than a registry:
//! the manifest is checked against the digest its index entry (or the pullspec) names, the config
//! against the manifest, and every layer byte is hashed as it is read ([`crate::fetch::blob_reader`]).
//!
//! An archive is never unpacked: its members are indexed once (headers only) and blobs are read
//! in place, so an offline pivot needs no second copy of the image on disk. It must be a plain
//! tar, as `skopeo copy … oci-archive:` writes it; a compressed one is refused by name.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use oci_client::manifest::OciDescriptor;
use oci_spec::image::ImageIndex;

use crate::fetch::image::to_oci;
use crate::fetch::reference::{parse_digest, ImageRef, Transport};
use crate::fetch::registry::manifest::{host_platform, resolve_child, resolve_top, Resolution};
use crate::fetch::registry::{ensure_json_size, sha256_digest, ResolvedManifest, MAX_JSON_BYTES};

/// The annotation that gives an index entry its tag (`oci:DIR:TAG`).
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// An archive with more members than this is not an image layout.
const MAX_ARCHIVE_MEMBERS: usize = 1_000_000;

/// An opened layout: where its files are.
#[derive(Debug)]
pub struct Layout {
    path: PathBuf,
    /// For an archive: member name → (offset of its data, size).
    members: Option<HashMap<String, (u64, u64)>>,
}

impl Layout {
    /// Opens the layout `image` names and checks that it is one.
    pub fn open(image: &ImageRef) -> Result<Layout> {
        let path = image
            .layout_path()
            .context("not an OCI layout reference")?
            .to_path_buf();
        let members = match image.transport {
            Transport::OciArchive => Some(index_archive(&path)?),
            _ => {
                let meta = std::fs::metadata(&path)
                    .with_context(|| format!("opening the OCI layout {}", path.display()))?;
                ensure!(
                    meta.is_dir(),
                    "{} is not a directory: an oci: layout is one (a tar file of one is oci-archive:)",
                    path.display()
                );
                None
            }
        };
        let layout = Layout { path, members };
        let marker = layout
            .read_small("oci-layout")
            .with_context(|| format!("{} is not an OCI image layout", layout.path.display()))?;
        let marker = crate::fetch::image::parse_json(&marker, "oci-layout")?;
        let version = marker
            .get("imageLayoutVersion")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        ensure!(
            version.starts_with("1."),
            "{}: unsupported imageLayoutVersion {version:?} (pivot reads 1.x)",
            layout.path.display()
        );
        Ok(layout)
    }

    /// Picks the image from `index.json` (by digest, by tag, or the only one), checks its
    /// manifest against that digest, and resolves an index to this host's platform.
    pub fn resolve(&self, image: &ImageRef) -> Result<ResolvedManifest> {
        let index = self.read_small("index.json")?;
        let index: ImageIndex =
            serde_json::from_value(crate::fetch::image::parse_json(&index, "index.json")?)
                .context("index.json is not an OCI image index")?;
        let entry = pick_entry(&index, image)?;
        let digest = entry.digest().to_string();
        let bytes = self.read_json_blob(&to_oci(entry))?;
        match resolve_top(&bytes, digest.clone(), &digest)? {
            Resolution::Done(resolved) => Ok(*resolved),
            Resolution::Child { digest, entry } => {
                let child = entry.digest().to_string();
                let bytes = self.read_json_blob(&to_oci(&entry)).with_context(|| {
                    format!("reading the {} manifest {child}", host_platform().1)
                })?;
                resolve_child(&bytes, digest.clone(), child, &digest)
            }
        }
    }

    /// A small blob (manifest, config), checked against its descriptor's size and digest.
    pub fn read_json_blob(&self, desc: &OciDescriptor) -> Result<Vec<u8>> {
        ensure_json_size(desc, "blob")?;
        let mut bytes = Vec::new();
        self.open_blob(desc)?
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading blob {}", desc.digest))?;
        let actual = sha256_digest(&bytes);
        ensure!(
            actual == desc.digest,
            "digest mismatch: blob {} in {} hashes to {actual}",
            desc.digest,
            self.path.display()
        );
        Ok(bytes)
    }

    /// A blob's bytes, exactly its declared size of them (unverified: the caller hashes them).
    pub fn open_blob(&self, desc: &OciDescriptor) -> Result<std::io::Take<File>> {
        let digest = parse_digest(&desc.digest)?;
        let (algorithm, hex) = digest.split_once(':').unwrap_or_default();
        let (file, size) = self
            .open_member(&format!("blobs/{algorithm}/{hex}"))
            .with_context(|| format!("blob {digest} is not in the layout"))?;
        ensure!(
            i64::try_from(size).ok() == Some(desc.size),
            "blob {digest} in {} is {size} bytes; its descriptor declares {}: refusing a blob whose size is not the declared one",
            self.path.display(),
            desc.size
        );
        Ok(file.take(size))
    }

    /// A file of the layout (no more than [`MAX_JSON_BYTES`] of it).
    fn read_small(&self, name: &str) -> Result<Vec<u8>> {
        let (file, size) = self.open_member(name)?;
        ensure!(
            size <= MAX_JSON_BYTES as u64,
            "{name} is {size} bytes, more than the {MAX_JSON_BYTES} it may have (too large)"
        );
        let mut bytes = Vec::new();
        file.take(size)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {name}"))?;
        Ok(bytes)
    }

    /// The file `name` of the layout, positioned at its data, and its size.
    fn open_member(&self, name: &str) -> Result<(File, u64)> {
        match &self.members {
            None => {
                let path = self.path.join(name);
                let file =
                    File::open(&path).with_context(|| format!("opening {}", path.display()))?;
                let meta = file.metadata()?;
                ensure!(meta.is_file(), "{} is not a regular file", path.display());
                Ok((file, meta.len()))
            }
            Some(members) => {
                let &(offset, size) = members
                    .get(name)
                    .with_context(|| format!("{} has no member {name}", self.path.display()))?;
                let mut file = File::open(&self.path)
                    .with_context(|| format!("opening {}", self.path.display()))?;
                file.seek(SeekFrom::Start(offset))?;
                Ok((file, size))
            }
        }
    }
}

/// The regular files of a tar archive, by name (`./` stripped), without reading their data.
fn index_archive(path: &Path) -> Result<HashMap<String, (u64, u64)>> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic)?;
    let compressed = match &magic[..n] {
        [0x1f, 0x8b, ..] => Some("gzip"),
        [0x28, 0xb5, 0x2f, 0xfd] => Some("zstd"),
        _ => None,
    };
    if let Some(kind) = compressed {
        bail!(
            "{} is {kind}-compressed: an oci-archive is a plain tar (decompress it first)",
            path.display()
        );
    }
    file.rewind()?;
    let mut archive = tar::Archive::new(file);
    let mut members = HashMap::new();
    let entries = archive
        .entries_with_seek()
        .with_context(|| format!("reading {} as a tar archive", path.display()))?;
    for entry in entries {
        let entry =
            entry.with_context(|| format!("reading {} as a tar archive", path.display()))?;
        ensure!(
            members.len() < MAX_ARCHIVE_MEMBERS,
            "{} has more than {MAX_ARCHIVE_MEMBERS} members: not an image layout",
            path.display()
        );
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let name = name.trim_start_matches("./").to_string();
        members.insert(name, (entry.raw_file_position(), entry.size()));
    }
    ensure!(
        !members.is_empty(),
        "{} is not a tar archive of an OCI layout (no files in it)",
        path.display()
    );
    Ok(members)
}

/// The index entry the pullspec names: by digest, else by tag, else the only one.
fn pick_entry<'i>(
    index: &'i ImageIndex,
    image: &ImageRef,
) -> Result<&'i oci_spec::image::Descriptor> {
    let entries = index.manifests();
    let tag_of = |d: &oci_spec::image::Descriptor| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .cloned()
    };
    let listing = || {
        entries
            .iter()
            .map(|d| match tag_of(d) {
                Some(tag) => format!("{tag} ({})", d.digest()),
                None => d.digest().to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let name = image.name();
    let found: Vec<_> = match (&image.digest, &image.tag) {
        (Some(digest), _) => entries
            .iter()
            .filter(|d| d.digest().to_string() == *digest)
            .collect(),
        (None, Some(tag)) => entries
            .iter()
            .filter(|d| tag_of(d).as_deref() == Some(tag))
            .collect(),
        (None, None) => {
            ensure!(
                entries.len() == 1,
                "{name} holds {} images; name one with :TAG or @DIGEST (it has: {})",
                entries.len(),
                listing()
            );
            entries.iter().collect()
        }
    };
    match found.as_slice() {
        [one] => Ok(one),
        [] => bail!(
            "{} is not in {name} (it has: {})",
            image.pinned_or_tagged(),
            listing()
        ),
        _ => bail!(
            "{} names {} entries of {name}'s index",
            image.pinned_or_tagged(),
            found.len()
        ),
    }
}
