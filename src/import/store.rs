//! ostree-rs-ext's container store, written by pivot's own importer so that a node pivot moved
//! looks to rpm-ostree and bootc exactly like one they deployed (they read it through
//! ostree-rs-ext's `container::store`).
//!
//! The format (ostree-rs-ext 0.15, `container/store.rs`), matched in behaviour:
//! - every layer imported gets a ref `ostree/container/blob/<escaped layer digest>`: layer 0
//!   (the commit layer) on the image's `ostree.commit`; a component ("chunk") layer on an
//!   *object-set* commit, a flat tree whose file names are the checksums of the content objects
//!   the layer carried (mode 0755 root dir, time 0, no metadata); a derived layer on a commit of
//!   its own files (paths mapped as for the deployment, whiteouts kept as `.wh.` files);
//! - the image gets a ref `ostree/container/image/<escaped image reference>` on its *merge
//!   commit*: the tree that is deployed (the base commit's, or with the derived layers applied),
//!   no parent, timestamped with the manifest's `org.opencontainers.image.created` annotation or
//!   the config's `created`, carrying the manifest digest, the manifest and the config as JSON
//!   strings. The merge commit is what is deployed, also for an image without derived layers,
//!   because that is the commit bootc and rpm-ostree compare with the booted one.
//!
//! The image reference is the `ImageReference` part of the deployment's
//! `container-image-reference` origin (`docker://host/path@sha256:…`, `oci:/path:tag`), so
//! `store::query_image` of that origin finds the image, and a later `prepare` of a new version
//! fetches only the layers whose refs are missing. Pruning ([`gc`]) drops the image refs no
//! deployment uses and the layer refs no remaining image or deployment needs, as bootc's
//! `remove_undeployed_images` and ostree-rs-ext's `gc_image_layers` do.
// unsafe: a trusted GVariant over bytes serialized here.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

use anyhow::{anyhow, Context, Result};
use ostree::gio;
use ostree::glib;
use ostree::glib::prelude::*;
use ostree::ObjectType;

/// The ref prefix of layers.
pub const LAYER_PREFIX: &str = "ostree/container/blob";
/// The ref prefix of images (on their merge commits).
pub const IMAGE_PREFIX: &str = "ostree/container/image";
/// Refs under which other tools keep base images (their manifests keep layers).
const BASE_IMAGE_PREFIX: &str = "ostree/container/baseimage";
/// Refs libostree and rpm-ostree keep on deployments' commits.
const DEPLOYMENT_REF_PREFIXES: [&str; 3] = ["ostree/0", "ostree/1", "rpmostree/base"];
/// pivot's own refs (`--keep`, `--download-only`): their images' layers stay too.
const PIVOT_REF_PREFIX: &str = "pivot";

/// Merge commit metadata: the manifest digest (`sha256:…`).
pub const META_MANIFEST_DIGEST: &str = "ostree.manifest-digest";
/// Merge commit metadata: the manifest as JSON.
pub const META_MANIFEST: &str = "ostree.manifest";
/// Merge commit metadata: the image config as JSON.
pub const META_CONFIG: &str = "ostree.container.image-config";
/// Merge commit metadata: per derived layer, the top-level paths dropped and how many entries
/// (`a{sa{su}}`).
pub const META_FILTERED: &str = "ostree.tar-filtered";

/// `s` as ostree-rs-ext escapes a string into a ref: ASCII alphanumerics and `-` stay, `/`
/// stays between an alphanumeric and something more, `_` doubles, anything else is `_XX_`
/// (its code point in upper-case hex).
pub fn escape_for_ref(s: &str) -> Result<String> {
    anyhow::ensure!(!s.is_empty(), "an empty string cannot be a ref");
    anyhow::ensure!(!s.contains('\0'), "a ref cannot hold a NUL");
    let mut out = String::with_capacity(s.len() * 2);
    let mut chars = s.chars().peekable();
    let mut previous_alphanumeric = false;
    while let Some(c) = chars.next() {
        let alphanumeric = c.is_ascii_alphanumeric();
        match c {
            _ if alphanumeric => out.push(c),
            '/' if previous_alphanumeric && chars.peek().is_some() => out.push(c),
            '-' => out.push(c),
            '_' => out.push_str("__"),
            _ => write!(out, "_{:02X}_", c as u32).expect("writing to a String"),
        }
        previous_alphanumeric = alphanumeric;
    }
    Ok(out)
}

/// The reverse of [`escape_for_ref`]; None for what it cannot have written.
pub fn unescape_ref(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '_' => match chars.next()? {
                '_' => out.push('_'),
                first => {
                    let mut hex = String::from(first);
                    for c in chars.by_ref() {
                        if c == '_' {
                            break;
                        }
                        hex.push(c);
                    }
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
            },
            _ => out.push(c),
        }
    }
    Some(out)
}

/// The ref of a layer (`sha256:…`).
pub fn layer_ref(digest: &str) -> Result<String> {
    Ok(format!("{LAYER_PREFIX}/{}", escape_for_ref(digest)?))
}

/// The ref of an image reference (`docker://host/path@sha256:…`).
pub fn image_ref(reference: &str) -> Result<String> {
    Ok(format!("{IMAGE_PREFIX}/{}", escape_for_ref(reference)?))
}

/// The image reference (`<transport><name>`, as ostree-rs-ext prints it) of an origin's
/// `container-image-reference` (`<signature source>:<transport>:<name>`), or None when that is
/// not one ostree-rs-ext reads.
pub fn image_of_origin(reference: &str) -> Option<String> {
    let (scheme, rest) = reference.split_once(':')?;
    let transport_and_name = match scheme {
        "ostree-unverified-registry" => return registry(rest),
        "ostree-remote-registry" => return registry(rest.split_once(':')?.1),
        "ostree-unverified-image" | "ostree-image-signed" => rest,
        "ostree-remote-image" => rest.split_once(':')?.1,
        _ => return None,
    };
    let (transport, name) = transport_and_name.split_once(':')?;
    match transport {
        "registry" => registry(name),
        "docker" => registry(name.strip_prefix("//")?),
        "oci" | "oci-archive" | "docker-archive" | "containers-storage" | "dir"
            if !name.is_empty() =>
        {
            Some(format!("{transport}:{name}"))
        }
        _ => None,
    }
}

fn registry(name: &str) -> Option<String> {
    (!name.is_empty()).then(|| format!("docker://{name}"))
}

/// Per derived layer digest, the top-level paths its import dropped and how many entries
/// (ordered, so that the same image always gives the same merge commit).
pub type Filtered = BTreeMap<String, BTreeMap<String, u32>>;

/// What an image import needs to write its merge commit.
pub struct ImageMeta<'a> {
    /// The digest of the platform manifest (the one whose layers were imported).
    pub manifest_digest: &'a str,
    pub manifest_json: &'a str,
    pub config_json: &'a str,
}

impl<'a> ImageMeta<'a> {
    /// What `os`'s merge commit records.
    pub fn of(os: &'a crate::fetch::image::OsImage) -> ImageMeta<'a> {
        ImageMeta {
            manifest_digest: &os.manifest_digest,
            manifest_json: &os.manifest_json,
            config_json: &os.config_json,
        }
    }
}

/// Writes the object-set commit of a component layer: a flat tree naming each content object
/// it carried by its checksum (`sorted`: raw SHA-256s in ascending order, repeats allowed).
/// Needs an open transaction; the objects must be in the repo. The dirtree and the commit are
/// serialized here as libostree serializes them (the same bytes as ostree-rs-ext's), straight
/// from the checksums: through a `MutableTree` and `write_commit` the tree was built, then
/// loaded again, several MiB per ten thousand objects, two layers at a time.
pub fn write_object_set<'c>(
    repo: &ostree::Repo,
    sorted: impl Iterator<Item = &'c [u8; 32]> + Clone,
) -> Result<String> {
    let cancellable = gio::Cancellable::NONE;
    crate::import::memory::release_freed();
    let tree = {
        let ty = glib::VariantTy::new("(a(say)a(sayay))").expect("the dirtree type");
        // SAFETY: `object_set_dirtree` writes GLib's normal form of this type (tested against
        // GLib's serializer); trusted, the bytes are not copied again to normalize them.
        let dirtree =
            unsafe { glib::Variant::from_data_with_type_trusted(object_set_dirtree(sorted), ty) };
        repo.write_metadata(ObjectType::DirTree, None, &dirtree, cancellable)
            .context("writing the layer's object set")?
    };
    let dirmeta = hex::decode(root_dirmeta(repo)?)?;
    // (a{sv} ay a(say) s s t ay ay): no metadata, parent or related objects; empty subject and
    // body; time 0; the root's dirtree and dirmeta.
    let commit = (
        HashMap::<String, glib::Variant>::new(),
        Vec::<u8>::new(),
        Vec::<(String, Vec<u8>)>::new(),
        "",
        "",
        0u64,
        hex::decode(tree.to_hex())?,
        dirmeta,
    )
        .to_variant();
    let commit = repo
        .write_metadata(ObjectType::Commit, None, &commit, cancellable)
        .context("writing the layer's object-set commit")?;
    Ok(commit.to_hex())
}

/// The GVariant serialization of a dirtree `(a(say)a(sayay))` whose files are named by the
/// hex of `sorted` checksums (repeats skipped) and hold those objects, with no subdirectories.
/// Each `(say)` is the name with its NUL, the 32 bytes, and one framing offset (the name's
/// end); the array ends with a table of its elements' end offsets; the tuple with the array's
/// end (its last member, the empty array of directories, takes no bytes and no offset).
fn object_set_dirtree<'c>(sorted: impl Iterator<Item = &'c [u8; 32]> + Clone) -> Vec<u8> {
    const ELEMENT: usize = 64 + 1 + 32 + 1;
    let distinct = || {
        let mut previous = None;
        sorted
            .clone()
            .filter(move |c| previous.replace(*c) != Some(*c))
    };
    let count = distinct().count();
    let items = ELEMENT * count;
    // The offsets' width depends on the container's total size, offsets included.
    let width = |size: usize| crate::import::commit_walk::offset_width(size as u64) as usize;
    let array_width = [1, 2, 4, 8]
        .into_iter()
        .find(|&w| width(items + w * count) <= w)
        .unwrap_or(8);
    let array = items + array_width * count;
    let tuple_width = [1, 2, 4, 8]
        .into_iter()
        .find(|&w| width(array + w) <= w)
        .unwrap_or(8);
    let mut out = Vec::with_capacity(array + tuple_width);
    let put = |out: &mut Vec<u8>, value: usize, width: usize| {
        out.extend_from_slice(&value.to_le_bytes()[..width]);
    };
    for checksum in distinct() {
        out.extend_from_slice(hex::encode(checksum).as_bytes());
        out.push(0);
        out.extend_from_slice(checksum);
        put(&mut out, 65, 1);
    }
    for i in 1..=count {
        put(&mut out, i * ELEMENT, array_width);
    }
    put(&mut out, array, tuple_width);
    out
}

/// The dirmeta of a root-owned 0755 directory, written.
pub fn root_dirmeta(repo: &ostree::Repo) -> Result<String> {
    let info = gio::FileInfo::new();
    info.set_attribute_uint32("unix::uid", 0);
    info.set_attribute_uint32("unix::gid", 0);
    info.set_attribute_uint32("unix::mode", libc::S_IFDIR | 0o755);
    let dirmeta = ostree::create_directory_metadata(&info, None);
    Ok(repo
        .write_metadata(ObjectType::DirMeta, None, &dirmeta, gio::Cancellable::NONE)
        .context("writing directory metadata")?
        .to_hex())
}

/// Writes `tree` and returns its root.
pub fn write_tree(repo: &ostree::Repo, tree: &ostree::MutableTree) -> Result<ostree::RepoFile> {
    let root = repo
        .write_mtree(tree, gio::Cancellable::NONE)
        .context("writing a tree")?;
    root.downcast::<ostree::RepoFile>()
        .map_err(|_| anyhow!("write_mtree did not return a RepoFile"))
}

/// The root of `commit`'s tree.
pub fn commit_root(repo: &ostree::Repo, commit: &str) -> Result<ostree::RepoFile> {
    let (root, _) = repo
        .read_commit(commit, gio::Cancellable::NONE)
        .with_context(|| format!("reading commit {commit}"))?;
    root.downcast::<ostree::RepoFile>()
        .map_err(|_| anyhow!("read_commit did not return a RepoFile"))
}

/// Writes the image's merge commit on `root` (see the module documentation).
pub fn write_merge_commit(
    repo: &ostree::Repo,
    root: &ostree::RepoFile,
    image: &ImageMeta,
    filtered: &Filtered,
) -> Result<String> {
    let metadata = glib::VariantDict::new(None);
    metadata.insert(META_MANIFEST_DIGEST, image.manifest_digest);
    metadata.insert(META_MANIFEST, image.manifest_json);
    metadata.insert(META_CONFIG, image.config_json);
    metadata.insert_value(META_FILTERED, &filtered.to_variant());
    let time = image_created(image.manifest_json, image.config_json).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    });
    let commit = repo
        .write_commit_with_time(
            None,
            None,
            None,
            Some(&metadata.end()),
            root,
            time,
            gio::Cancellable::NONE,
        )
        .context("writing the image's merge commit")?;
    Ok(commit.to_string())
}

/// When the image was made: the manifest's `org.opencontainers.image.created` annotation, else
/// the config's `created` (RFC 3339), in seconds since the epoch.
pub fn image_created(manifest_json: &str, config_json: &str) -> Option<u64> {
    let field = |json: &str, pointer: &str| -> Option<String> {
        let value: serde_json::Value = serde_json::from_str(json).ok()?;
        value.pointer(pointer)?.as_str().map(str::to_string)
    };
    let created = field(
        manifest_json,
        "/annotations/org.opencontainers.image.created",
    )
    .or_else(|| field(config_json, "/created"))?;
    let time = glib::DateTime::from_iso8601(&created, Some(&glib::TimeZone::utc())).ok()?;
    u64::try_from(time.to_unix()).ok()
}

/// The commit a layer's ref holds, if the repo has it.
pub fn layer_commit(repo: &ostree::Repo, digest: &str) -> Result<Option<String>> {
    let name = layer_ref(digest)?;
    Ok(repo
        .resolve_rev(&name, true)
        .with_context(|| format!("reading the ref {name}"))?
        .map(|c| c.to_string()))
}

/// What a merge commit says about its image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCommit {
    pub manifest_digest: String,
    pub manifest: serde_json::Value,
    pub config: serde_json::Value,
    /// The commit's timestamp.
    pub timestamp: u64,
}

impl ContainerCommit {
    /// Reads `commit`'s container metadata; None for a commit that is not an image's merge
    /// commit (or is not in the repo).
    pub fn read(repo: &ostree::Repo, commit: &str) -> Result<Option<ContainerCommit>> {
        let Some(variant) = repo
            .load_variant_if_exists(ObjectType::Commit, commit)
            .with_context(|| format!("loading commit {commit}"))?
        else {
            return Ok(None);
        };
        let metadata = glib::VariantDict::new(Some(&variant.child_value(0)));
        let string = |key: &str| metadata.lookup::<String>(key).ok().flatten();
        let Some(manifest_digest) = string(META_MANIFEST_DIGEST) else {
            return Ok(None);
        };
        let json = |key: &str| {
            string(key)
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(serde_json::Value::Null)
        };
        Ok(Some(ContainerCommit {
            manifest_digest,
            manifest: json(META_MANIFEST),
            config: json(META_CONFIG),
            timestamp: ostree::commit_get_timestamp(&variant),
        }))
    }

    /// The digests of the image's layers, in order.
    pub fn layers(&self) -> Vec<String> {
        self.manifest
            .get("layers")
            .and_then(|l| l.as_array())
            .into_iter()
            .flatten()
            .filter_map(|l| l.get("digest")?.as_str().map(str::to_string))
            .collect()
    }

    /// A label of the image config.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.config.pointer("/config/Labels")?.get(key)?.as_str()
    }

    /// The version people know the image by (`version`, else the OCI version label).
    pub fn version(&self) -> Option<&str> {
        self.label(crate::fetch::image::VERSION_LABEL)
            .or_else(|| self.label("org.opencontainers.image.version"))
    }
}

/// Refs under `prefix`, name → commit.
fn refs(repo: &ostree::Repo, prefix: &str) -> Result<HashMap<String, String>> {
    Ok(repo
        .list_refs_ext(
            Some(prefix),
            ostree::RepoListRefsExtFlags::NONE,
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("listing the refs under {prefix}"))?
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// What [`gc`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collected {
    pub images: Vec<String>,
    pub layers: usize,
}

/// Drops the refs of images no deployment's origin names (bootc's
/// `remove_undeployed_images`), unless a pivot ref (`--keep`, `--download-only`) holds their
/// commit, then the layer refs that no remaining image, deployment or pivot ref needs
/// (`gc_image_layers`). Objects are left to the prune that follows.
pub fn gc(sysroot: &ostree::Sysroot, repo: &ostree::Repo) -> Result<Collected> {
    let cancellable = gio::Cancellable::NONE;
    let deployments = sysroot.deployments();
    let deployed: BTreeSet<String> = deployments
        .iter()
        .filter_map(|d| d.origin())
        .filter_map(|o| o.string("origin", "container-image-reference").ok())
        .filter_map(|r| image_of_origin(&r))
        .collect();
    let mut kept_commits: BTreeSet<String> = refs(repo, PIVOT_REF_PREFIX)?.into_values().collect();
    for prefix in DEPLOYMENT_REF_PREFIXES.iter().chain([&BASE_IMAGE_PREFIX]) {
        kept_commits.extend(refs(repo, prefix)?.into_values());
    }
    kept_commits.extend(deployments.iter().map(|d| d.csum().to_string()));

    let mut collected = Collected::default();
    for (name, commit) in refs(repo, IMAGE_PREFIX)? {
        let Some(image) = name
            .strip_prefix(IMAGE_PREFIX)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(unescape_ref)
        else {
            continue; // Not a ref ostree-rs-ext wrote; not pivot's to judge.
        };
        if deployed.contains(&image) || kept_commits.contains(&commit) {
            kept_commits.insert(commit);
            continue;
        }
        repo.set_ref_immediate(None, &name, None, cancellable)
            .with_context(|| format!("removing the ref {name}"))?;
        collected.images.push(image);
    }

    let mut needed = BTreeSet::new();
    for commit in &kept_commits {
        if let Some(image) = ContainerCommit::read(repo, commit)? {
            needed.extend(image.layers());
        }
    }
    for name in refs(repo, LAYER_PREFIX)?.into_keys() {
        let digest = name
            .strip_prefix(LAYER_PREFIX)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(unescape_ref);
        if digest.is_some_and(|d| needed.contains(&d)) {
            continue;
        }
        repo.set_ref_immediate(None, &name, None, cancellable)
            .with_context(|| format!("removing the ref {name}"))?;
        collected.layers += 1;
    }
    Ok(collected)
}

#[cfg(test)]
mod tests;
