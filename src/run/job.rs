//! The part of a pivot that runs on one blocking thread and owns the libostree objects: under
//! the sysroot lock it re-checks the deployments, imports the layers (two at a time, into one
//! repo transaction), checks free space, keeps refs and deploys.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ostree::gio;
use ostree::gio::prelude::FileExt;
use tokio::runtime::Handle;

use crate::api::progress::Step;
use crate::trust::Verified;

use crate::fetch::image::{Compression, Format, Layer, OsImage};
use crate::sysroot::deploy::{self, Deployed, OriginInfo, OriginSignature, SysrootLock};
use crate::sysroot::deployments::{self, DeploymentInfo, DOWNLOADED_REF_PREFIX};
use crate::trust::ostree_remote;

use crate::fetch::reference::ImageRef;
use crate::fetch::source::Source;
use crate::fetch::spools::Spools;
use crate::import::store;
use crate::import::{self, RepoImporter, PARALLEL_LAYERS};
use crate::node::progress::Progress;
use crate::run::local::find_at_target;
use crate::sysroot::kargs::Edit;
use crate::sysroot::space;

/// The part of a pivot that runs on one blocking thread, owning the libostree objects.
pub(crate) struct Job {
    /// The deployments as this run found them before taking the sysroot lock.
    pub(crate) seen: Vec<String>,
    pub(crate) sysroot: PathBuf,
    pub(crate) stateroot: String,
    pub(crate) pullspec: String,
    pub(crate) image: ImageRef,
    pub(crate) os: OsImage,
    pub(crate) keep: bool,
    pub(crate) download_only: bool,
    pub(crate) partial_downloads: bool,
    /// None when the commit is known to be in the repo already.
    pub(crate) source: Option<Source>,
    pub(crate) runtime: Handle,
    pub(crate) progress: Progress,
    pub(crate) kargs: Vec<Edit>,
    /// Per layer, the commit under which the store holds it whole ([`stored_layer`]): looked
    /// up once, by the space check, and read by the layer imports.
    pub(crate) stored: std::sync::OnceLock<Vec<Option<String>>>,
    /// How the signature policy accepted the image; None when this run did not check it (an
    /// image an earlier `--download-only` run pulled and checked).
    pub(crate) verified: Option<Verified>,
    /// `--ostree-remote`: the OSTree remote whose keys must have signed the image's commit.
    pub(crate) ostree_remote: Option<String>,
    /// `--lock-finalization`: stage so that only `pivot finalize` lets a reboot apply it.
    pub(crate) lock_finalization: bool,
    /// `[boot] tries`: how often GRUB boots the staged deployment before it falls back.
    pub(crate) boot_tries: u8,
}

impl Job {
    /// The commit and its new deployment (none with `--download-only`); None when another
    /// pivot deployed the target while this one waited for the lock.
    pub(crate) fn run(self) -> Result<Option<(String, Option<Deployed>)>> {
        let sysroot = crate::sysroot::namespace::sysroot(&self.sysroot);
        let _lock = SysrootLock::acquire(&sysroot)?;
        sysroot
            .load(gio::Cancellable::NONE)
            .context("loading the sysroot")?;
        // Re-checked under the lock: a concurrent pivot may have just deployed the target.
        let current = deployments::list(&sysroot)?;
        if find_at_target(
            &current,
            Some(&self.os.digest),
            self.os.commit_label.as_deref(),
        )
        .is_some()
        {
            tracing::info!("the target was deployed while waiting for the sysroot lock");
            return Ok(None);
        }
        // Anything else that changed meanwhile (another pivot deployed another target, an admin
        // ran ostree admin) makes this run's view stale: its merge deployment, what it took as
        // current. Deploying on top of that could drop the deployment just made; start over.
        let now = deployment_ids(&current);
        if now != self.seen {
            tracing::info!(
                "deployments before waiting for the lock: {}; now: {}",
                self.seen.join(", "),
                now.join(", ")
            );
            bail!("the deployments changed while waiting for the sysroot lock; run pivot again");
        }
        let repo = sysroot.repo();
        if let Some(remote) = &self.ostree_remote {
            ostree_remote::check_remote(&repo, remote)?;
        }
        let commit = match self.present(&repo)? {
            Some(commit) => {
                self.verify_present(&repo, &commit)?;
                commit
            }
            None => {
                let spooling = self.check_space(&repo)?;
                self.import(&repo, spooling)
                    .with_context(|| format!("pulling {}", self.pullspec))?
            }
        };
        space::check_boot(&self.sysroot, &self.stateroot, &repo, &commit)?;
        let mut refs = Vec::new();
        // A locked update must outlive a reboot that drops it (libostree keeps staged deployments
        // in /run): kept, and deployable again without the registry (see node::confirm).
        if self.keep || self.download_only || self.lock_finalization {
            refs.push(format!("pivot/{}", self.image.ref_name()));
        }
        if self.download_only || self.lock_finalization {
            refs.push(downloaded_ref(&self.os.digest, self.os.format));
        }
        for name in refs {
            repo.set_ref_immediate(None, &name, Some(&commit), gio::Cancellable::NONE)
                .with_context(|| format!("keeping {commit} under the ref {name}"))?;
        }
        if self.download_only {
            return Ok(Some((commit, None)));
        }
        self.progress.step(Step::Deploying);
        let origin = deploy::origin(
            &sysroot,
            &OriginInfo {
                commit: &commit,
                image: &self.image,
                digest: &self.os.digest,
                version: self.os.version.as_deref(),
                pullspec: &self.pullspec,
                format: self.os.format,
                verified: self.verified.as_ref(),
                ostree_remote: self.ostree_remote.as_deref(),
            },
        );
        let deployed = deploy::deploy(
            &sysroot,
            &self.stateroot,
            &commit,
            &origin,
            &self.kargs,
            self.lock_finalization,
            self.boot_tries,
        )
        .with_context(|| format!("deploying commit {commit}"))?;
        Ok(Some((commit, Some(deployed))))
    }

    /// The commit to deploy when the repo has all it needs already (nothing to download): the
    /// image's commit (legacy, or read back from a `--download-only` ref), or for an
    /// ostree-native image its merge commit, imported before under the same reference (by pivot,
    /// rpm-ostree or bootc), else written now on its commit when that is complete and the image
    /// has no derived layers.
    fn present(&self, repo: &ostree::Repo) -> Result<Option<String>> {
        let native = self.os.format == Format::Native && !self.os.layers.is_empty();
        if native {
            let image = self.store_image();
            let name = store::image_ref(&image)?;
            if let Some(merge) = repo.resolve_rev(&name, true)? {
                let same = store::ContainerCommit::read(repo, &merge)?
                    .is_some_and(|c| c.manifest_digest == self.os.manifest_digest);
                if same && import::verify_complete(repo, &merge).is_ok() {
                    tracing::info!(
                        "{image} is already in the repo as {merge}: nothing to download"
                    );
                    unmark_partial(repo, &merge)?;
                    return Ok(Some(merge.to_string()));
                }
            }
        }
        let Some(commit) = self.os.commit_label.as_deref() else {
            return Ok(None);
        };
        if import::verify_complete(repo, commit).is_err() {
            return Ok(None);
        }
        tracing::info!("commit {commit} is already in the repo: nothing to download");
        // A run killed right after committing the import left the mark on; it is whole.
        unmark_partial(repo, commit)?;
        if !native {
            return Ok(Some(commit.to_string()));
        }
        let tx = repo
            .auto_transaction(gio::Cancellable::NONE)
            .context("starting a repo transaction")?;
        let merge = self.write_store(repo, commit, None, &[], &store::Filtered::new())?;
        tx.commit(gio::Cancellable::NONE)
            .context("committing the image's merge commit")?;
        Ok(Some(merge))
    }

    /// With `--ostree-remote`, verifies the signed commit of an image the repo had already:
    /// `commit` itself for a legacy image, the image's own commit (the base of `commit`, its
    /// merge commit) for an ostree-native one.
    fn verify_present(&self, repo: &ostree::Repo, commit: &str) -> Result<()> {
        let Some(remote) = &self.ostree_remote else {
            return Ok(());
        };
        let signed = match self.os.format {
            Format::Legacy => Some(commit.to_string()),
            Format::Native => match &self.os.commit_label {
                Some(label) => Some(label.clone()),
                None => {
                    let first = store::layer_ref(&self.os.layers[0].descriptor.digest)?;
                    repo.resolve_rev(&first, true)?.map(|c| c.to_string())
                }
            },
        };
        let signed = signed.with_context(|| {
            format!(
                "--ostree-remote {remote}: the repo does not say which commit {} carries",
                self.pullspec
            )
        })?;
        ostree_remote::verify_commit(repo, remote, &signed)
    }

    /// The image reference of the store (see [`crate::import::store`]): the one the deployment's
    /// origin names.
    fn store_image(&self) -> String {
        let reference =
            deploy::native_reference(&self.image, &self.os.digest, OriginSignature::Unverified);
        store::image_of_origin(&reference).expect("pivot's origins name a store image")
    }

    /// Writes the store's refs and the merge commit of an ostree-native image into the open
    /// transaction: each layer's ref (layer 0 on `base`, the others on `layer_commits`), the
    /// merge commit on `derived` (the tree with the derived layers applied, checked complete
    /// given what the import vouches for) or `base`'s tree, and the image's ref on it. Returns
    /// the merge commit.
    fn write_store(
        &self,
        repo: &ostree::Repo,
        base: &str,
        derived: Option<(&ostree::RepoFile, &import::Present)>,
        layer_commits: &[(String, String)],
        filtered: &store::Filtered,
    ) -> Result<String> {
        let first = &self.os.layers[0].descriptor.digest;
        let layers = std::iter::once((first.as_str(), base))
            .chain(layer_commits.iter().map(|(d, c)| (d.as_str(), c.as_str())));
        for (digest, commit) in layers {
            repo.transaction_set_ref(None, &store::layer_ref(digest)?, Some(commit));
        }
        let root = match derived {
            Some((root, _)) => root.clone(),
            None => store::commit_root(repo, base)?,
        };
        let merge =
            store::write_merge_commit(repo, &root, &store::ImageMeta::of(&self.os), filtered)?;
        if let Some((_, present)) = derived {
            import::verify_complete_given(repo, &merge, present)?;
        }
        repo.transaction_set_ref(None, &store::image_ref(&self.store_image())?, Some(&merge));
        Ok(merge)
    }

    /// [`Self::stored`], looked up on first use.
    pub(super) fn stored(&self, repo: &ostree::Repo) -> Result<&[Option<String>]> {
        if let Some(stored) = self.stored.get() {
            return Ok(stored);
        }
        let stored = (0..self.os.layers.len())
            .map(|i| stored_layer(repo, &self.os, i))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.stored.get_or_init(|| stored))
    }

    /// Threads writing a legacy layer's objects: the cores shared among the layers imported at
    /// once. One big layer — how oscontainers ship — gets them all; with several layers each
    /// gets one (more threads would only add memory: measured in benches/pivot-bench).
    pub(super) fn writers_per_layer(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        let layers = PARALLEL_LAYERS.min(self.os.layers.len()).max(1);
        (cores / layers).max(1)
    }

    /// Whether the import of `layer` keeps checkpoints (see `import::checkpoint`).
    pub(super) fn checkpointed(&self, layer: &Layer) -> bool {
        !layer.derived && layer.compression == Compression::Gzip
    }

    /// Refuses, before any layer is downloaded, an import the repo's filesystem has no room for;
    /// whether to keep downloads for resume (wanted, and room for them too).
    fn check_space(&self, repo: &ostree::Repo) -> Result<bool> {
        // As people know it (libostree's own path for the repo is a /proc/self/fd one).
        let repo_path = self.sysroot.join("ostree/repo");
        let mut layers = Vec::new();
        for (i, l) in self.os.layers.iter().enumerate() {
            // Layers the store holds already are not fetched, and need no room; a blob the
            // image carries twice makes its objects once, and its imports share one spool.
            if self.stored(repo)?[i].is_some() || self.os.repeats_earlier_layer(i) {
                continue;
            }
            let size = l.descriptor.size.max(0) as u64;
            layers.push(space::Layer {
                size,
                spooled: Spools::held(&repo_path, &l.descriptor.digest, size),
                checkpointed: self.checkpointed(l),
            });
        }
        let remote = self.source.as_ref().is_some_and(Source::is_remote);
        space::check_repo(repo, &repo_path, &layers, self.partial_downloads && remote)
    }

    /// Streams every layer into one transaction; nothing is committed unless all layers verified
    /// and the commit is complete. On failure the transaction's temporary space is freed.
    fn import(&self, repo: &ostree::Repo, spooling: bool) -> Result<String> {
        let tmp = repo.path().path().unwrap_or_default().join("tmp");
        let imported = self.import_in_transaction(repo, spooling);
        import::remove_unheld_staging_dirs(&tmp);
        imported
    }

    fn import_in_transaction(&self, repo: &ostree::Repo, spooling: bool) -> Result<String> {
        let repo_path = repo.path().path().unwrap_or_default();
        let mut spools = Spools::new(&repo_path, &self.os, spooling);
        let imported = self.import_layers(repo, &spools);
        // A killed run keeps its downloads for the next one; a run that ends keeps nothing.
        spools.remove_all();
        imported
    }

    fn import_layers(&self, repo: &ostree::Repo, spools: &Spools) -> Result<String> {
        let tx = repo
            .auto_transaction(gio::Cancellable::NONE)
            .context("starting a repo transaction")?;
        self.adopt(repo, spools);
        // A native layer's regular files are written without libostree where it can be.
        let staging = match self.os.format {
            Format::Native => import::Staging::of_transaction(repo),
            Format::Legacy => None,
        };
        // …and moved into objects/ as the import goes, not all at the commit.
        let mut publisher = staging.as_ref().and_then(|staging| {
            let objects = repo.path().path()?.join("objects");
            import::Publisher::start(staging.clone(), &objects)
                .map_err(|e| tracing::debug!("libostree's commit moves every object: {e:#}"))
                .ok()
        });
        self.progress.step(Step::Importing);
        let sizes: Vec<(String, u64)> = self
            .os
            .layers
            .iter()
            .map(|l| (l.descriptor.digest.clone(), l.descriptor.size.max(0) as u64))
            .collect();
        self.progress.start(&self.pullspec, &self.os.digest, &sizes);
        let mut importer = RepoImporter::new(repo.clone(), self.os.format, false);
        let mut layer_commits = Vec::new();
        let mut filtered = store::Filtered::new();
        // Merged in layer order, so a later layer's config or ref wins as it would in a
        // sequential import.
        for (layer, imported) in self
            .os
            .layers
            .iter()
            .zip(self.import_each_layer(repo, spools, staging.as_ref())?)
        {
            let digest = &layer.descriptor.digest;
            if let Some(commit) = &imported.layer_commit {
                layer_commits.push((digest.clone(), commit.clone()));
            }
            if !imported.filtered().is_empty() {
                filtered.insert(digest.clone(), imported.filtered().clone());
            }
            importer.absorb(imported)?;
        }
        let (written, skipped) = importer.counts();
        let finished = importer.finish(&self.os)?;
        // Before anything of the image is committed: a refused commit leaves nothing behind.
        if let Some(remote) = &self.ostree_remote {
            ostree_remote::verify_commit(repo, remote, &finished.commit)?;
        }
        let mut commits = vec![finished.commit.clone()];
        if self.os.format == Format::Native {
            let derived = finished.derived.as_ref();
            let merge = self.write_store(
                repo,
                &finished.commit,
                derived.map(|d| (d, &finished.present)),
                &layer_commits,
                &filtered,
            )?;
            commits.insert(0, merge);
        }
        // The kernel arguments the image ships are read again when it is deployed; an image
        // whose kargs.d cannot be read is refused now, before anything of it is committed.
        crate::sysroot::kargs_d::read(repo, &commits[0])
            .context("reading the kernel arguments the image ships")?;
        // Committing moves the objects into place one by one: until it is done, the commits
        // are marked partial, so that after a kill in between neither fsck nor the next run
        // takes a commit for a whole one.
        for commit in &commits {
            repo.mark_commit_partial(commit, true)
                .context("marking the commit partial")?;
        }
        if let Some(publisher) = &mut publisher {
            publisher.stop();
            tracing::debug!("{} objects moved before the commit", publisher.published());
        }
        tx.commit(gio::Cancellable::NONE)
            .context("committing the imported objects")?;
        if let Some(publisher) = publisher {
            publisher.keep();
        }
        for commit in &commits {
            unmark_partial(repo, commit)?;
        }
        let commit = commits.swap_remove(0);
        tracing::info!("imported {commit}: {written} objects written, {skipped} already present");
        Ok(commit)
    }

    /// Takes into the open transaction what an import cut by a reboot staged of the layers
    /// it recorded (see [`import::adopt()`]). Taking them back only saves downloads: when it
    /// fails, the layers that named them are fetched again, as without it.
    fn adopt(&self, repo: &ostree::Repo, spools: &Spools) {
        let adopted = import::adopt(repo, || {
            let mut wanted = std::collections::HashSet::new();
            for layer in &self.os.layers {
                let digest = &layer.descriptor.digest;
                let checkpoint = spools.checkpoint(digest).map(|c| c.importer);
                for record in spools.imported(digest).into_iter().chain(checkpoint) {
                    wanted.extend(record.objects().iter().copied());
                }
            }
            wanted
        });
        match adopted {
            Ok(adopted) if adopted.objects > 0 || adopted.damaged > 0 => tracing::info!(
                "took {} objects an import cut by a reboot had staged ({} did not read back whole)",
                adopted.objects,
                adopted.damaged
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "{:#}: the layers it held are fetched again",
                e.context("taking back what an import before the last reboot staged")
            ),
        }
    }
}

/// The commit under which the store (see [`crate::import::store`]) keeps layer `i` of `os`, whole: a
/// component layer of an ostree-native image that an earlier import (pivot's, rpm-ostree's,
/// bootc's) left with every content object it carried. Such a layer need not be fetched. The
/// commit layer and derived layers are always fetched unless the whole image is present.
pub(crate) fn stored_layer(repo: &ostree::Repo, os: &OsImage, i: usize) -> Result<Option<String>> {
    let layer = &os.layers[i];
    if os.format != Format::Native || i == 0 || layer.derived {
        return Ok(None);
    }
    let commit = store::layer_commit(repo, &layer.descriptor.digest)?;
    Ok(commit.filter(|c| import::verify_complete(repo, c).is_ok()))
}

/// Clears the partial mark of `commit` (it is whole).
fn unmark_partial(repo: &ostree::Repo, commit: &str) -> Result<()> {
    repo.mark_commit_partial(commit, false)
        .with_context(|| format!("marking commit {commit} complete"))
}

/// The ref that keeps a `--download-only` commit, named after the image digest it came from
/// (and its format, which decides the origin the later deployment gets).
pub(crate) fn downloaded_ref(digest: &str, format: Format) -> String {
    let digest = digest.replace(':', "-");
    match format {
        Format::Legacy => format!("{DOWNLOADED_REF_PREFIX}{digest}"),
        Format::Native => format!("{DOWNLOADED_REF_PREFIX}native/{digest}"),
    }
}

/// Deployments as `stateroot/checksum.serial` (staged ones marked), in boot order.
pub(crate) fn deployment_ids(deployments: &[DeploymentInfo]) -> Vec<String> {
    deployments
        .iter()
        .map(|d| {
            format!(
                "{}/{}.{}{}",
                d.stateroot,
                d.checksum,
                d.serial,
                if d.staged { " (staged)" } else { "" }
            )
        })
        .collect()
}
