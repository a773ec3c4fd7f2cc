//! Deploying a commit through libostree: the sysroot lock, the merge deployment (whose /etc is
//! merged three ways and whose kernel arguments are carried over by libostree), the origin, and
//! staging (booted system: finalized at shutdown by ostree-finalize-staged) or writing the
//! deployment directly (a sysroot that is not the booted one).

use anyhow::{Context, Result};
use ostree::{gio, glib};

use std::path::Path;

use crate::sysroot::deployments::{
    NATIVE_LAYOUT_TRANSPORT, NATIVE_ORIGIN_TRANSPORT, ORIGIN_SCHEME, REMOTE_ORIGIN_TRANSPORT,
    SIGNED_ORIGIN_TRANSPORT, STAGED_LOCKED,
};
use crate::api::status::Verification;
use crate::trust::Verified;
use crate::fetch::image::Format;
use crate::sysroot::kargs::{self, Edit};
use crate::sysroot::grubenv::Armed;
use crate::sysroot::kargs_d;
use crate::fetch::reference::ImageRef;

/// The `[pivot]` key of the origin listing the kernel arguments the admin's edits added.
pub const KARGS_ADDED_KEY: &str = "kargs-added";

/// Holds the sysroot lock for as long as it lives.
pub struct SysrootLock<'s>(&'s ostree::Sysroot);

impl<'s> SysrootLock<'s> {
    pub fn acquire(sysroot: &'s ostree::Sysroot) -> Result<Self> {
        if !sysroot.try_lock().context("locking the sysroot")? {
            tracing::info!("another process holds the sysroot lock (rpm-ostree, ostree admin or pivot); waiting for it");
            sysroot.lock().context("locking the sysroot")?;
        }
        Ok(SysrootLock(sysroot))
    }
}

impl Drop for SysrootLock<'_> {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

/// What the origin file records about the image a deployment came from.
pub struct OriginInfo<'a> {
    pub commit: &'a str,
    pub image: &'a ImageRef,
    pub digest: &'a str,
    pub version: Option<&'a str>,
    /// The pullspec as the admin gave it (tag included), for people.
    pub pullspec: &'a str,
    pub format: Format,
    /// How the signature policy accepted the image, when this run checked it.
    pub verified: Option<&'a Verified>,
    /// The OSTree remote whose keys verified the commit (`--ostree-remote`).
    pub ostree_remote: Option<&'a str>,
}

/// The origin of the new deployment. For a legacy oscontainer: as rpm-ostree writes it for
/// `rebase :<commit> --custom-origin-url …`, which is how openshift/pivot recorded pivots and how
/// rpm-ostree-era tools read them back. For an ostree-native image: the
/// `container-image-reference` bootc and rpm-ostree write and read for container deployments
/// (for an OCI layout, its `oci:` or `oci-archive:` name, which cannot carry a digest). Either
/// way with pivot's own `[pivot]` group (image with digest, pullspec and version label, for
/// status).
pub fn origin(sysroot: &ostree::Sysroot, info: &OriginInfo) -> glib::KeyFile {
    let by_digest = format!("{}@{}", info.image.name(), info.digest);
    if info.format == Format::Native {
        let origin = glib::KeyFile::new();
        let signature = match (info.ostree_remote, info.verified) {
            (Some(remote), _) => OriginSignature::Remote(remote),
            (None, Some(Verified::Signed(_))) => OriginSignature::Signed,
            (None, _) => OriginSignature::Unverified,
        };
        let reference = native_reference(info.image, info.digest, signature);
        origin.set_string("origin", "container-image-reference", &reference);
        pivot_group(&origin, info, &by_digest);
        return origin;
    }
    let origin = sysroot.origin_new_from_refspec(info.commit);
    origin.set_string(
        "origin",
        "custom-url",
        &format!("{ORIGIN_SCHEME}{by_digest}"),
    );
    let description = match info.version {
        Some(v) => format!("Managed by pivot: {} (version {v})", info.pullspec),
        None => format!("Managed by pivot: {}", info.pullspec),
    };
    origin.set_string("origin", "custom-description", &description);
    pivot_group(&origin, info, &by_digest);
    origin
}

/// How an ostree-native origin asks the tools that update the node (rpm-ostree, bootc) to
/// verify what they pull, as ostree-rs-ext names its signature sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginSignature<'a> {
    /// `ostree-unverified-registry:` / `ostree-unverified-image:`.
    Unverified,
    /// `ostree-image-signed:`: by the containers policy.
    Signed,
    /// `ostree-remote-image:<remote>:`: the commit, by an OSTree remote's keys.
    Remote(&'a str),
}

/// The `container-image-reference` of an ostree-native image's deployment: the registry image
/// by digest, or an OCI layout by its path and tag (that transport cannot name a digest). An
/// image whose signature the policy required and pivot verified is `ostree-image-signed:`, as
/// rpm-ostree writes it (and rpm-ostree and bootc then verify its updates by the same policy);
/// one whose commit an OSTree remote verified is `ostree-remote-image:<remote>:`, which also
/// holds for layouts and is the one kept when both were checked (the admin named the remote).
pub fn native_reference(image: &ImageRef, digest: &str, signature: OriginSignature) -> String {
    match (image.layout_path(), signature) {
        (None, OriginSignature::Remote(remote)) => {
            format!("{REMOTE_ORIGIN_TRANSPORT}{remote}:docker://{}@{digest}", image.name())
        }
        (Some(_), OriginSignature::Remote(remote)) => format!(
            "{REMOTE_ORIGIN_TRANSPORT}{remote}:{}",
            image.with_digest_dropped()
        ),
        (None, OriginSignature::Signed) => {
            format!("{SIGNED_ORIGIN_TRANSPORT}docker://{}@{digest}", image.name())
        }
        (None, OriginSignature::Unverified) => {
            format!("{NATIVE_ORIGIN_TRANSPORT}{}@{digest}", image.name())
        }
        (Some(_), _) => format!("{NATIVE_LAYOUT_TRANSPORT}{}", image.with_digest_dropped()),
    }
}

/// pivot's own group: the image by digest, the pullspec as given and the image's version label,
/// for status.
fn pivot_group(origin: &glib::KeyFile, info: &OriginInfo, by_digest: &str) {
    origin.set_string("pivot", "image", by_digest);
    // What the group describes: rpm-ostree and bootc carry an origin's other groups over to the
    // deployments they make (see `crate::sysroot::deployments`).
    origin.set_string("pivot", "commit", info.commit);
    if let Some(verified) = info.verified {
        origin.set_string("pivot", "verification", &verified.verification().name());
        if let Verified::Signed(keys) = verified {
            origin.set_string("pivot", "signed-by", &keys.join(" "));
        }
    }
    // The commit's own signature says more than the policy's verdict on the container.
    if let Some(remote) = info.ostree_remote {
        let name = Verification::OstreeRemote.name();
        origin.set_string("pivot", "verification", &name);
        origin.set_string("pivot", "ostree-remote", remote);
    }
    origin.set_string("pivot", "pullspec", info.pullspec);
    if let Some(version) = info.version {
        origin.set_string("pivot", "version", version);
    }
}

/// The new deployment's command line, when it is not the merge deployment's (`current`):
/// the image's kargs.d change from the merge deployment's commit to `commit`
/// ([`crate::sysroot::kargs_d`]), then the admin's `edits`. None leaves libostree to carry
/// `current` over.
fn kernel_argv(
    sysroot: &ostree::Sysroot,
    merge: Option<&ostree::Deployment>,
    commit: &str,
    current: &str,
    edits: &[Edit],
) -> Result<Option<Vec<String>>> {
    let repo = sysroot.repo();
    let new = kargs_d::read(&repo, commit).context("reading the kernel arguments the image ships")?;
    let old = match merge.map(|m| m.csum()) {
        Some(old_commit) => kargs_d::read(&repo, &old_commit).unwrap_or_else(|e| {
            tracing::warn!(
                "the kernel arguments the running image ships ({old_commit}) cannot be read, so none of them is removed: {e:#}"
            );
            None
        }),
        None => None,
    }
    .unwrap_or_default();
    match &new {
        Some(new) if !new.is_empty() => {
            let listed: Vec<&str> = new.iter().map(|k| k.arg.as_str()).collect();
            tracing::info!("the image's kargs.d lists: {}", listed.join(" "));
        }
        Some(_) => {}
        None if old.is_empty() => {}
        None => tracing::info!(
            "the image has no kargs.d: the running image's kernel arguments stay, as bootc keeps them"
        ),
    }
    let updated = kargs_d::update(current, &old, new.as_deref());
    if edits.is_empty() && updated == kargs::split(current) {
        return Ok(None);
    }
    let updated = updated.join(" ");
    Ok(Some(kargs::apply(&updated, edits)))
}

pub struct Deployed {
    pub serial: i32,
    pub staged: bool,
}

/// Deploys `commit` on `stateroot`, merging from the booted deployment (or, on a sysroot that is
/// not booted, the stateroot's default one), with the merge deployment's kernel arguments
/// changed as the image's kargs.d says, then edited by `kargs`. The caller holds the lock.
pub fn deploy(
    sysroot: &ostree::Sysroot,
    stateroot: &str,
    commit: &str,
    origin: &glib::KeyFile,
    kargs: &[Edit],
    lock_finalization: bool,
    boot_tries: u8,
) -> Result<Deployed> {
    let cancellable = gio::Cancellable::NONE;
    let merge = sysroot.merge_deployment(Some(stateroot));
    let current = merge
        .as_ref()
        .and_then(|m| m.bootconfig())
        .and_then(|b| b.get("options"))
        .map(|o| o.to_string())
        .unwrap_or_default();
    let argv = kernel_argv(sysroot, merge.as_ref(), commit, &current, kargs)?;
    if let Some(argv) = &argv {
        tracing::info!("kernel arguments of the new deployment: {}", argv.join(" "));
    }
    // What the admin's edits added, for status to tell apart from what the image ships.
    let added: Vec<&str> = kargs
        .iter()
        .filter_map(|edit| match edit {
            Edit::Add(arg) => Some(arg.as_str()),
            Edit::Delete(_) => None,
        })
        .filter(|arg| argv.iter().flatten().any(|a| a == arg))
        .collect();
    if !added.is_empty() {
        origin.set_string("pivot", KARGS_ADDED_KEY, &added.join(" "));
    }
    let argv_refs: Option<Vec<&str>> = argv
        .as_ref()
        .map(|a| a.iter().map(String::as_str).collect());
    let opts = ostree::SysrootDeployTreeOpts {
        override_kernel_argv: argv_refs.as_deref(),
        // libostree leaves /run/ostree/staged-deployment-locked: ostree-finalize-staged then
        // skips the deployment at shutdown until `pivot finalize` removes the file.
        locked: lock_finalization,
        ..Default::default()
    };
    let booted = sysroot.booted_deployment().is_some();
    // libostree 2022.7 does not write the lock itself (later ones do, for `locked`): made before
    // staging, as rpm-ostree did, so that no moment has the deployment staged and unlocked.
    let lock = lock_finalization && booted;
    if lock {
        std::fs::create_dir_all(Path::new(STAGED_LOCKED).parent().expect("a parent"))
            .and_then(|()| std::fs::write(STAGED_LOCKED, b""))
            .with_context(|| format!("writing {STAGED_LOCKED}"))?;
    }
    let new = if booted {
        let staged = sysroot.stage_tree_with_options(
                Some(stateroot),
                commit,
                Some(origin),
                merge.as_ref(),
                &opts,
                cancellable,
            );
        if staged.is_err() && lock {
            let _ = std::fs::remove_file(STAGED_LOCKED);
        }
        let staged = staged.context("staging the deployment")?;
        // A locked deployment cannot boot before its unlock, which arms it then
        // ([`crate::sysroot::finalize`]).
        if !lock {
            arm_boot_once(sysroot, boot_tries, commit);
        }
        staged
    } else {
        let new = sysroot
            .deploy_tree_with_options(
                Some(stateroot),
                commit,
                Some(origin),
                merge.as_ref(),
                Some(&opts),
                cancellable,
            )
            .context("deploying the tree")?;
        // Keeps the booted and merge deployments, so the previous one stays as rollback.
        // libostree's cleanup would prune with every object name in memory: pivot prunes.
        sysroot
            .simple_write_deployment(
                Some(stateroot),
                &new,
                merge.as_ref(),
                ostree::SysrootSimpleWriteDeploymentFlags::NO_CLEAN,
                cancellable,
            )
            .context("writing the boot entries")?;
        clean_up(sysroot);
        new
    };
    Ok(Deployed {
        serial: new.deployserial(),
        staged: booted,
    })
}

/// On GRUB, the staged deployment (`commit`) boots at most `tries` times until `pivot confirm`
/// keeps it ([`crate::sysroot::grubenv`]), unless greenboot arms it itself. The deployment is
/// staged either way: a block that cannot be written costs the fallback, not the update.
pub(crate) fn arm_boot_once(sysroot: &ostree::Sysroot, tries: u8, commit: &str) {
    let Some(root) = ostree::gio::prelude::FileExt::path(&sysroot.path()) else {
        return;
    };
    // greenboot's units run from the booted system (at its shutdown), so that is the one to ask.
    let Some(booted) = sysroot.booted_deployment() else {
        return;
    };
    let system = root.join(sysroot.deployment_dirpath(&booted).as_str());
    match crate::sysroot::grubenv::arm(&root, &system, tries, commit) {
        Ok(Armed::Block(block)) => tracing::info!(
            "GRUB boots the new deployment at most {tries} time{} until pivot confirm keeps it ({})",
            if tries == 1 { "" } else { "s" },
            block.display()
        ),
        Ok(Armed::Greenboot(unit)) => tracing::info!(
            "greenboot arms GRUB's boot counter for the new deployment ({}): pivot leaves it to it",
            unit.display()
        ),
        Ok(Armed::NoBlock) => {}
        Err(e) => tracing::warn!("arming GRUB's boot-once fallback: {e:#}"),
    }
}

/// After the boot entries are written, what libostree's cleanup does: removes the deployments
/// and boot files no entry uses, then prunes the repo ([`crate::sysroot::prune`]). The deployment is in
/// place by then, so a failure here is a warning, not a failed pivot.
fn clean_up(sysroot: &ostree::Sysroot) {
    let cleaned = sysroot
        .prepare_cleanup(gio::Cancellable::NONE)
        .context("removing unused deployments")
        .and_then(|()| {
            let repo = sysroot.repo();
            let collected = crate::import::store::gc(sysroot, &repo).context("pruning the image store")?;
            if !collected.images.is_empty() || collected.layers > 0 {
                tracing::info!(
                    "dropped the refs of {} images no deployment uses ({}) and of {} layers no image needs",
                    collected.images.len(),
                    collected.images.join(", "),
                    collected.layers
                );
            }
            crate::import::memory::release_freed();
            crate::sysroot::prune::prune(sysroot, &repo).context("pruning the repo")
        });
    match cleaned {
        Ok(pruned) if pruned.objects > 0 => tracing::info!(
            "pruned {} objects ({:.1} MiB) that nothing uses any more",
            pruned.objects,
            pruned.bytes as f64 / (1 << 20) as f64
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("the deployment is written; cleaning up after it: {e:#}"),
    }
}
