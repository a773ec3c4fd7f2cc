//! `ext-fixtures REPO REF OUTDIR [NAME...]`: encapsulates the commit REF of the OSTree repo REPO
//! with ostree-rs-ext (`ostree_ext::container::encapsulate`), the producer of today's CoreOS,
//! RHCOS and bootc images, so pivot's tests read ostree-native images they did not write
//! themselves.
//!
//! Writes three `oci:` directories under OUTDIR:
//! - `encapsulated`: one layer holding the whole commit;
//! - `chunked`: the commit layer plus component layers (fake "packages", one per top-level
//!   directory under `usr/`), up to the `ostree.final-diffid` label; `chunked:N` instead
//!   writes it with up to N layers, the components being the directories three levels under
//!   `usr/` (as many as an OS has packages: rpm-ostree's chunking packs those into the layers);
//! - `derived`: `encapsulated` with one more, plain tar layer on top, as a `FROM` build adds:
//!   a new file, a file under `etc/`, and a whiteout removing `usr/share/pivot/v2-marker`.
//!
//! Prints the directories' manifest digests, one per line, as `NAME DIGEST`. Given NAMEs, it
//! writes only those (`benches/pivot-bench` needs just `chunked`, of a tree up to 1 GB).
//!
//! `ext-fixtures pull REPO HOST/PATH:TAG` imports an image from a plain-HTTP registry into the
//! repo REPO the way rpm-ostree and bootc do (ostree-rs-ext's `ImageImporter`, through skopeo's
//! image proxy), and prints the merged commit: the peer pivot's native import is measured against.
//!
//! The judge of pivot's hand-over (what rpm-ostree and bootc read after a pivot), each printing
//! one JSON object; IMGREF is an ostree-rs-ext image reference (`docker://host/path@sha256:…`,
//! `oci:/path:tag`), plain-HTTP registries being named insecure in `CONTAINERS_REGISTRIES_CONF`:
//! - `ext-fixtures query REPO IMGREF`: `store::list_images` and `store::query_image`;
//! - `ext-fixtures prepare REPO IMGREF`: `ImageImporter::prepare` (with the layers it would
//!   fetch), writing nothing but the cached-update metadata ostree-rs-ext writes itself;
//! - `ext-fixtures import REPO IMGREF`: `ImageImporter::import`, as `bootc upgrade` does;
//! - `ext-fixtures copy REPO IMGREF DEST_REPO DEST_IMGREF`: `store::copy` of the image, its
//!   layers' refs and its merge commit into another repo under another name (every layer's ref
//!   must be there);
//! - `ext-fixtures deploy SYSROOT STATEROOT IMGREF`: `container::deploy::deploy` of an
//!   `ostree-unverified-image:` reference, as `bootc switch` and `rpm-ostree rebase` leave a node.

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroU32;
use std::path::Path;
use std::rc::Rc;

use anyhow::{bail, Context, Result};
use ostree_ext::container::{encapsulate, Config, ExportOpts, ImageReference, Transport};
use ostree_ext::objectsource::{ObjectMeta, ObjectSourceMeta};
use ostree_ext::oci_spec::image as oci_image;
use ostree_ext::{gio, ostree};

mod judge;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["pull", repo, image] => return pull_image(repo, image).await,
        ["query", repo, image] => return judge::query(repo, image),
        ["prepare", repo, image] => return judge::prepare(repo, image, false).await,
        ["import", repo, image] => return judge::prepare(repo, image, true).await,
        ["copy", from, image, to, name] => return judge::copy(from, image, to, name).await,
        ["deploy", sysroot, stateroot, image] => {
            return judge::deploy(sysroot, stateroot, image).await
        }
        _ => {}
    }
    let [repo, rev, out, only @ ..] = args.as_slice() else {
        bail!("usage: ext-fixtures REPO REF OUTDIR [encapsulated|chunked|chunked:N|derived ...]");
    };
    const NAMES: [&str; 3] = ["encapsulated", "chunked", "derived"];
    // `chunked:N`: N layers, components three directories deep (hundreds, as an OS has packages;
    // with fewer than about 2N, ostree-rs-ext 0.15.3 packs some layers empty).
    let mut chunking = (8, 1);
    for name in only {
        match name.split_once(':') {
            Some(("chunked", n)) => {
                let n: u32 = n
                    .parse()
                    .with_context(|| format!("{name}: N is not a number"))?;
                chunking = (n, 3);
            }
            _ if NAMES.contains(&name.as_str()) => {}
            _ => bail!("unknown image {name}: not one of {NAMES:?} or chunked:N"),
        }
    }
    let wanted =
        |name: &str| only.is_empty() || only.iter().any(|n| n.split(':').next() == Some(name));
    let repo_path = repo;
    let repo = ostree::Repo::new_for_path(repo_path);
    repo.open(gio::Cancellable::NONE)
        .with_context(|| format!("opening {repo_path}"))?;
    let out = Path::new(out);
    std::fs::create_dir_all(out)?;
    let config = Config {
        labels: Some(BTreeMap::from([(
            "containers.bootc".to_string(),
            "1".to_string(),
        )])),
        cmd: None,
    };

    if wanted("encapsulated") {
        let encapsulated = out.join("encapsulated");
        let digest = encapsulate(&repo, rev, &config, None, &oci_ref(&encapsulated)).await;
        report("encapsulated", &encapsulated, digest)?;
    }

    if wanted("chunked") {
        let meta = contentmeta(&repo, rev, chunking.1)?;
        let meta = ostree_ext::chunking::ObjectMetaSized::compute_sizes(&repo, meta)?;
        let mut opts = ExportOpts::default();
        opts.contentmeta = Some(&meta);
        opts.max_layers = NonZeroU32::new(chunking.0);
        let chunked = out.join("chunked");
        let digest = encapsulate(&repo, rev, &config, Some(opts), &oci_ref(&chunked)).await;
        report("chunked", &chunked, digest)?;
    }

    if wanted("derived") {
        let derived = out.join("derived");
        let digest = encapsulate(&repo, rev, &config, None, &oci_ref(&derived)).await;
        report("encapsulated-copy", &derived, digest)?;
        add_derived_layer(&derived)?;
        println!("derived {}", manifest_digest(&derived)?);
    }
    Ok(())
}

fn oci_ref(dir: &Path) -> ImageReference {
    ImageReference {
        transport: Transport::OciDir,
        name: dir.to_str().expect("UTF-8 path").to_string(),
    }
}

/// encapsulate() writes the directory, then asks skopeo's image proxy for the digest; the
/// directory itself is what the tests need, so its index names the digest printed.
fn report(name: &str, dir: &Path, digest: Result<oci_image::Digest>) -> Result<()> {
    if let Err(e) = digest {
        if !dir.join("index.json").exists() {
            return Err(e.context(format!("encapsulating {name}")));
        }
    }
    if name != "encapsulated-copy" {
        println!("{name} {}", manifest_digest(dir)?);
    }
    Ok(())
}

fn manifest_digest(dir: &Path) -> Result<String> {
    let index = oci_image::ImageIndex::from_file(dir.join("index.json"))?;
    let [m] = index.manifests().as_slice() else {
        bail!(
            "{} holds {} manifests",
            dir.display(),
            index.manifests().len()
        );
    };
    Ok(m.digest().to_string())
}

/// Content objects grouped into fake packages: each file's is its directory `depth` levels under
/// `usr/` (a file above that depth is its own).
fn contentmeta(repo: &ostree::Repo, rev: &str, depth: usize) -> Result<ObjectMeta> {
    let (root, _) = repo.read_commit(rev, gio::Cancellable::NONE)?;
    let mut meta = ObjectMeta::default();
    let mut ids = HashSet::new();
    walk(&root, "", &mut |path, checksum| {
        let rest = path.strip_prefix("/usr/").unwrap_or(path);
        let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        // The last part is the file's own name: a file above `depth` is its own component.
        let dirs = parts.len().saturating_sub(1).min(depth).max(1);
        let id = parts[..dirs].join("-");
        let id = if id.is_empty() { "root" } else { &id };
        let id: Rc<str> = Rc::from(format!("pkg-{id}"));
        // An object shared by several components belongs to the first. A component left with
        // none is not declared: ostree-rs-ext 0.15.3 would write it as a second empty layer,
        // an image its own importer refuses ("Multiple entries for …").
        if meta.map.contains_key(checksum) {
            return;
        }
        if ids.insert(id.clone()) {
            meta.set.insert(ObjectSourceMeta {
                identifier: id.clone(),
                name: id.clone(),
                srcid: id.clone(),
                change_time_offset: 1,
                // Spread as packages' changelog counts are (rpm-ostree's measure), from the
                // name so that v1 and v2 of a tree pack alike; at depth 1, all alike.
                change_frequency: if depth > 1 {
                    1 + name_hash(&id) % 50
                } else {
                    1
                },
            });
        }
        meta.map.insert(checksum.to_string(), id);
    })?;
    Ok(meta)
}

/// A stable small hash of a name (FNV-1a).
fn name_hash(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn walk(dir: &gio::File, path: &str, f: &mut dyn FnMut(&str, &str)) -> Result<()> {
    use ostree_ext::gio::prelude::*;
    let children = dir.enumerate_children(
        "standard::name,standard::type",
        gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
        gio::Cancellable::NONE,
    )?;
    while let Some(info) = children.next_file(gio::Cancellable::NONE)? {
        let name = info.name();
        let name = name.to_str().context("non-UTF-8 name")?;
        let child = dir.child(name);
        let child_path = format!("{path}/{name}");
        if info.file_type() == gio::FileType::Directory {
            walk(&child, &child_path, f)?;
        } else {
            let file = child
                .downcast_ref::<ostree::RepoFile>()
                .context("not a RepoFile")?;
            f(&child_path, file.checksum().as_str());
        }
    }
    Ok(())
}

/// Adds one gzip tar layer on top of the single manifest in `dir`, as `FROM image` + `RUN` would.
fn add_derived_layer(dir: &Path) -> Result<()> {
    use ocidir::cap_std;
    let cap = cap_std::fs::Dir::open_ambient_dir(dir, cap_std::ambient_authority())?;
    let ocidir = ocidir::OciDir::open(&cap)?;
    let index = ocidir.read_index()?.context("no index.json")?;
    let desc = index.manifests().first().context("no manifest")?.clone();
    let mut manifest: oci_image::ImageManifest = ocidir.read_json_blob(&desc)?;
    let mut config: oci_image::ImageConfiguration = ocidir.read_json_blob(manifest.config())?;

    let mut layer = ocidir.create_layer(None)?;
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, data: &[u8]| -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        layer.append_data(&mut h, path, data)?;
        Ok(())
    };
    add("usr/", tar::EntryType::Directory, 0o755, b"")?;
    add("usr/share/", tar::EntryType::Directory, 0o755, b"")?;
    add("usr/share/derived/", tar::EntryType::Directory, 0o755, b"")?;
    add(
        "usr/share/derived/added",
        tar::EntryType::Regular,
        0o644,
        b"derived\n",
    )?;
    add("usr/share/pivot/", tar::EntryType::Directory, 0o755, b"")?;
    add(
        "usr/share/pivot/.wh.v2-marker",
        tar::EntryType::Regular,
        0o644,
        b"",
    )?;
    add("etc/", tar::EntryType::Directory, 0o755, b"")?;
    add(
        "etc/derived.conf",
        tar::EntryType::Regular,
        0o644,
        b"derived=yes\n",
    )?;
    let layer = layer.into_inner()?.complete()?;
    ocidir.push_layer(&mut manifest, &mut config, layer, "RUN derive", None);
    ocidir.replace_with_single_manifest_and_config(manifest, config)?;
    Ok(())
}

trait ReplaceSingle {
    fn replace_with_single_manifest_and_config(
        &self,
        manifest: oci_image::ImageManifest,
        config: oci_image::ImageConfiguration,
    ) -> Result<()>;
}

impl ReplaceSingle for ocidir::OciDir {
    fn replace_with_single_manifest_and_config(
        &self,
        mut manifest: oci_image::ImageManifest,
        config: oci_image::ImageConfiguration,
    ) -> Result<()> {
        let config = self.write_config(config)?;
        manifest.set_config(config);
        self.replace_with_single_manifest(manifest, oci_image::Platform::default())?;
        Ok(())
    }
}

async fn pull_image(repo_path: &str, image: &str) -> Result<()> {
    use ostree_ext::container::store::{ImageImporter, PrepareResult};
    use ostree_ext::container::{OstreeImageReference, SignatureSource};
    let repo = ostree::Repo::new_for_path(repo_path);
    repo.open(gio::Cancellable::NONE)?;
    let imgref = OstreeImageReference {
        sigverify: SignatureSource::ContainerPolicyAllowInsecure,
        imgref: ImageReference {
            transport: Transport::Registry,
            name: image.to_string(),
        },
    };
    let config = ostree_ext::containers_image_proxy::ImageProxyConfig {
        insecure_skip_tls_verification: Some(true),
        ..Default::default()
    };
    let mut importer = ImageImporter::new(&repo, &imgref, config).await?;
    let state = match importer.prepare().await? {
        PrepareResult::AlreadyPresent(state) => state,
        PrepareResult::Ready(prepared) => importer.import(prepared).await?,
    };
    println!("{}", state.merge_commit);
    Ok(())
}
