//! A read-only view of a sysroot's deployments, as plain data: what status shows and what the
//! already-at-target check compares against.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ostree::gio::prelude::FileExt;
use ostree::{gio, glib};

use crate::api::status::Verification;
use crate::import::store::ContainerCommit;

/// Where libostree marks the staged deployment locked (`--lock-finalization`);
/// ostree-finalize-staged skips a deployment while it exists.
pub const STAGED_LOCKED: &str = "/run/ostree/staged-deployment-locked";

/// Where the repo keeps `--download-only` commits: `<prefix><digest>` for a legacy image,
/// `<prefix>native/<digest>` for an ostree-native one.
pub const DOWNLOADED_REF_PREFIX: &str = "pivot/downloaded/";

/// The scheme of the origin's `custom-url`, as openshift/pivot wrote it.
pub const ORIGIN_SCHEME: &str = "pivot://";
/// The transport of an ostree-native deployment's `container-image-reference`, as bootc and
/// rpm-ostree write it for an image pulled without signature verification.
pub const NATIVE_ORIGIN_TRANSPORT: &str = "ostree-unverified-registry:";
/// The transport of a native deployment whose signature was verified by the containers
/// policy, as rpm-ostree writes it (`ostree-image-signed:docker://…`).
pub const SIGNED_ORIGIN_TRANSPORT: &str = "ostree-image-signed:";
/// The same for an image of any containers transport (an `oci:` or `oci-archive:` layout).
pub const NATIVE_LAYOUT_TRANSPORT: &str = "ostree-unverified-image:";
/// The origin's signature source for an image whose commit an OSTree remote's keys verified,
/// followed by `<remote>:<transport>:<name>`.
pub const REMOTE_ORIGIN_TRANSPORT: &str = "ostree-remote-image:";

/// A deployment as pivot works with it: the fields [`crate::api::status::Deployment`] publishes
/// (documented there), and what pivot needs besides.
#[derive(Debug, Clone)]
pub struct DeploymentInfo {
    pub stateroot: String,
    pub checksum: String,
    pub serial: i32,
    pub version: Option<String>,
    pub image: Option<String>,
    pub manifest_digest: Option<String>,
    pub timestamp: Option<u64>,
    pub booted: bool,
    pub staged: bool,
    pub finalization_locked: bool,
    pub default: bool,
    pub rollback: bool,
    pub verification: Option<Verification>,
    /// The OSTree remote whose keys verified the commit, when the origin names one.
    pub ostree_remote: Option<String>,
    /// For an ostree-native deployment: the image's `ostree.commit`, the base of its merge commit.
    pub base_commit: Option<String>,
    /// The pullspec pivot deployed this from, as it was given (tag included).
    pub pullspec: Option<String>,
    /// The kernel command line of its boot entry.
    pub options: Option<String>,
    /// The arguments pivot added for the admin when it made this deployment (its origin's
    /// record).
    pub kargs_added: Vec<String>,
    pub path: PathBuf,
}

impl DeploymentInfo {
    /// The digest of the image this deployment came from: the origin's, else its commit's.
    pub fn image_digest(&self) -> Option<&str> {
        let origin = self.image.as_deref().and_then(|i| i.rsplit_once('@'));
        origin.map(|(_, d)| d).or(self.manifest_digest.as_deref())
    }

    /// Whether this deployment came from the image `digest` (the pullspec's, or its platform
    /// manifest's): as its origin names it, or as its merge commit records it.
    pub fn has_digest(&self, digest: &str) -> bool {
        let origin = self.image.as_deref().and_then(|i| i.rsplit_once('@'));
        origin.is_some_and(|(_, d)| d == digest) || self.manifest_digest.as_deref() == Some(digest)
    }

    /// Whether this deployment is `commit`, or was made from it (the base of its merge commit).
    pub fn has_commit(&self, commit: &str) -> bool {
        self.checksum == commit || self.base_commit.as_deref() == Some(commit)
    }
}

/// The stateroot of the deployment that runs, when `list` is the running system's (libostree
/// found its booted deployment): what [`crate::node::state::dir`] needs to know.
pub fn booted_stateroot(list: &[DeploymentInfo]) -> Option<&str> {
    list.iter().find(|d| d.booted).map(|d| d.stateroot.as_str())
}

/// [`booted_stateroot`] of a loaded sysroot.
pub fn booted_stateroot_of(sysroot: &ostree::Sysroot) -> Option<String> {
    sysroot.booted_deployment().map(|d| d.osname().to_string())
}

/// Opens and loads the sysroot at `path` (not locked: a read-only look).
pub fn open_sysroot(path: &Path) -> Result<ostree::Sysroot> {
    let sysroot = crate::sysroot::namespace::sysroot(path);
    sysroot
        .load(gio::Cancellable::NONE)
        .with_context(|| format!("loading the OSTree sysroot at {}", path.display()))?;
    Ok(sysroot)
}

pub fn list(sysroot: &ostree::Sysroot) -> Result<Vec<DeploymentInfo>> {
    let repo = sysroot.repo();
    let booted = sysroot.booted_deployment();
    let deployments = sysroot.deployments();
    let default_idx = deployments.iter().position(|d| !d.is_staged());
    let rollback_idx = default_idx.and_then(|i| {
        deployments
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, d)| !d.is_staged())
            .map(|(j, _)| j)
    });
    deployments
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let checksum = d.csum().to_string();
            let origin = d.origin().map(|o| own_origin(&o, &checksum));
            let pullspec = origin
                .as_ref()
                .and_then(|o| o.string("pivot", "pullspec").ok())
                .map(|p| p.to_string());
            let label_version = origin
                .as_ref()
                .and_then(|o| o.string("pivot", "version").ok())
                .map(|v| v.to_string());
            let container = ContainerCommit::read(&repo, &checksum)?;
            let manifest_digest = container.as_ref().map(|c| c.manifest_digest.clone());
            let image = origin.as_ref().and_then(origin_image).or_else(|| {
                // A native origin by tag (bootc switch, rpm-ostree rebase): the tag plus the
                // digest its commit records.
                let reference = origin
                    .as_ref()?
                    .string("origin", "container-image-reference")
                    .ok()?;
                let image = crate::import::store::image_of_origin(&reference)?;
                let name = image.strip_prefix("docker://").unwrap_or(&image);
                Some(format!("{name}@{}", manifest_digest.as_deref()?))
            });
            Ok(DeploymentInfo {
                stateroot: d.osname().to_string(),
                version: commit_version(&repo, &checksum)?.or(label_version),
                pullspec,
                image,
                timestamp: container.as_ref().map(|c| c.timestamp),
                base_commit: container
                    .as_ref()
                    .and_then(|c| c.label(crate::fetch::image::NATIVE_COMMIT_LABEL))
                    .map(str::to_string),
                manifest_digest,
                serial: d.deployserial(),
                booted: booted.as_ref().is_some_and(|b| b.equal(d)),
                staged: d.is_staged(),
                // Staged deployments exist only on the booted system, whose /run this is.
                finalization_locked: d.is_staged() && Path::new(STAGED_LOCKED).exists(),
                default: Some(i) == default_idx,
                rollback: Some(i) == rollback_idx,
                verification: origin.as_ref().and_then(verification),
                ostree_remote: origin.as_ref().and_then(ostree_remote),
                options: d
                    .bootconfig()
                    .and_then(|b| b.get("options"))
                    .map(|o| o.to_string()),
                kargs_added: origin
                    .as_ref()
                    .and_then(|o| o.string("pivot", crate::sysroot::deploy::KARGS_ADDED_KEY).ok())
                    .map(|a| crate::sysroot::kargs::split(&a).into_iter().map(str::to_string).collect())
                    .unwrap_or_default(),
                path: sysroot
                    .path()
                    .path()
                    .unwrap_or_default()
                    .join(sysroot.deployment_dirpath(d).as_str()),
                checksum,
            })
        })
        .collect()
}

/// The origin as pivot reads it: pivot's `[pivot]` group only on the deployment it was written
/// for. rpm-ostree (`rebase`, `upgrade`) and bootc carry an origin's other groups over to the
/// deployments they make, so on theirs the group describes an image that is not deployed; their
/// own keys say what is. (Origins written before the group named its commit are taken as
/// pivot's.)
fn own_origin(origin: &glib::KeyFile, checksum: &str) -> glib::KeyFile {
    let copy = glib::KeyFile::new();
    let _ = copy.load_from_data(&origin.to_data(), glib::KeyFileFlags::KEEP_COMMENTS);
    let foreign = copy
        .string("pivot", "commit")
        .is_ok_and(|commit| commit != checksum);
    if foreign {
        let _ = copy.remove_group("pivot");
    }
    copy
}

/// The `version` key of a commit's metadata.
pub fn commit_version(repo: &ostree::Repo, checksum: &str) -> Result<Option<String>> {
    let Some(commit) = repo
        .load_variant_if_exists(ostree::ObjectType::Commit, checksum)
        .with_context(|| format!("loading commit {checksum}"))?
    else {
        return Ok(None);
    };
    let metadata = glib::VariantDict::new(Some(&commit.child_value(0)));
    if let Some(version) = metadata.lookup::<String>("version").ok().flatten() {
        return Ok(Some(version));
    }
    // An image's merge commit has no version of its own: its image config has.
    Ok(ContainerCommit::read(repo, checksum)?.and_then(|c| c.version().map(str::to_string)))
}

/// `host/path@digest` (or `oci:/path@digest`) of the image a deployment came from: what pivot
/// recorded, else openshift/pivot's `custom-url`, else the `container-image-reference` of an
/// ostree-native deployment (made by bootc or rpm-ostree) when it names a registry image by
/// digest.
fn origin_image(origin: &glib::KeyFile) -> Option<String> {
    if let Ok(image) = origin.string("pivot", "image") {
        return Some(image.to_string());
    }
    if let Ok(url) = origin.string("origin", "custom-url") {
        return url.strip_prefix(ORIGIN_SCHEME).map(str::to_string);
    }
    let reference = origin.string("origin", "container-image-reference").ok()?;
    native_image(&reference)
}

/// How the image of a deployment passed the signature policy: pivot's record, else what the
/// signature source of an ostree-native origin says.
fn verification(origin: &glib::KeyFile) -> Option<Verification> {
    if let Ok(recorded) = origin.string("pivot", "verification") {
        return Verification::from_name(&recorded);
    }
    let reference = origin.string("origin", "container-image-reference").ok()?;
    let (source, _) = reference.split_once(':')?;
    match source {
        "ostree-image-signed" => Some(Verification::Signed),
        "ostree-unverified-registry" | "ostree-unverified-image" => Some(Verification::Unverified),
        "ostree-remote-registry" | "ostree-remote-image" => Some(Verification::OstreeRemote),
        _ => None,
    }
}

/// The OSTree remote that verified a deployment's commit: pivot's record, else the remote of an
/// `ostree-remote-*` origin (`ostree-remote-image:<remote>:<transport>:<name>`).
fn ostree_remote(origin: &glib::KeyFile) -> Option<String> {
    if let Ok(remote) = origin.string("pivot", "ostree-remote") {
        return Some(remote.to_string());
    }
    let reference = origin.string("origin", "container-image-reference").ok()?;
    let (source, rest) = reference.split_once(':')?;
    match source {
        "ostree-remote-registry" | "ostree-remote-image" => {
            Some(rest.split_once(':')?.0.to_string())
        }
        _ => None,
    }
}

/// The registry image of an ostree-rs-ext image reference (`<sigverify>:<transport>:<name>`),
/// if it is pinned to a digest.
fn native_image(reference: &str) -> Option<String> {
    let image = crate::import::store::image_of_origin(reference)?;
    let name = image.strip_prefix("docker://")?;
    name.contains("@sha256:").then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_references_name_their_registry_image() {
        let pinned = "quay.io/fedora/fedora-coreos@sha256:abc";
        for reference in [
            format!("ostree-unverified-registry:{pinned}"),
            format!("ostree-unverified-image:docker://{pinned}"),
            format!("ostree-image-signed:registry:{pinned}"),
            format!("ostree-remote-registry:fedora:{pinned}"),
            format!("ostree-remote-image:fedora:docker://{pinned}"),
        ] {
            assert_eq!(
                native_image(&reference).as_deref(),
                Some(pinned),
                "{reference}"
            );
        }
        assert_eq!(
            native_image("ostree-unverified-registry:quay.io/x:latest"),
            None
        );
        assert_eq!(
            native_image("ostree-unverified-image:oci:/srv/x@sha256:abc"),
            None
        );
    }

    #[test]
    fn the_remote_that_verified_a_deployment_is_read_from_pivots_record_or_the_origin() {
        let origin = |text: &str| {
            let file = glib::KeyFile::new();
            file.load_from_data(text, glib::KeyFileFlags::NONE).unwrap();
            ostree_remote(&file)
        };
        let image = "docker://quay.io/fedora/fedora-coreos@sha256:abc";
        let reference = |source: &str| format!("[origin]\ncontainer-image-reference={source}:{image}\n");
        assert_eq!(origin(&reference("ostree-remote-image:fedora")).as_deref(), Some("fedora"));
        assert_eq!(origin(&reference("ostree-image-signed")), None);
        assert_eq!(origin(&reference("ostree-unverified-image")), None);
        let recorded = format!("{}[pivot]\nostree-remote=rhcos\n", reference("ostree-remote-image:fedora"));
        assert_eq!(origin(&recorded).as_deref(), Some("rhcos"));
    }
}
