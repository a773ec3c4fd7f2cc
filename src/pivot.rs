//! The pivot pipeline: pullspec → registry → import → deploy → state.
//!
//! The pullspec file (`/etc/pivot/image-pullspec`, read when no pullspec is given) is removed only
//! once the node is confirmed to run its target (on the booted system: booted from it; on another
//! sysroot: its default deployment is it). Until then every run counts an attempt in the state
//! file; after [`MAX_ATTEMPTS`] runs that did not end on the target, pivot stops with an error
//! instead of pulling and rebooting again, so a target that keeps failing cannot become a reboot
//! loop. The file stays, so the failure is visible; a run with an explicit pullspec is never
//! limited, and removing the state file resets the count.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::FileExt;
use tokio::runtime::Handle;

use crate::blob_reader::BlobReader;
use crate::config::registries::RegistriesConf;
use crate::deploy::{self, Deployed, OriginInfo, SysrootLock};
use crate::deployments::{self, DeploymentInfo};
use crate::image::OsImage;
use crate::import::{self, RepoImporter};
use crate::progress::Progress;
use crate::reference::ImageRef;
use crate::registry::{self, Access, Registry};
use crate::space;
use crate::state::{Attempt, State, StateFile, MAX_ATTEMPTS};

/// Where the first-boot pullspec lives, relative to the system's /etc.
pub const PULLSPEC_FILE: &str = "pivot/image-pullspec";

#[derive(Debug, Clone)]
pub struct Options {
    pub pullspec: Option<String>,
    pub sysroot: PathBuf,
    pub stateroot: Option<String>,
    pub keep: bool,
    pub access: Access,
    pub progress: Progress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new deployment was staged (booted system) or written (other sysroot).
    Changed { staged: bool },
    /// Nothing to do. `reboot_pending`: the target is deployed but a pullspec-file run found the
    /// node not running it, so the pending reboot is still owed.
    Unchanged { reboot_pending: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Argument,
    File,
}

/// The sysroot as found before any work starts.
struct Local {
    deployments: Vec<DeploymentInfo>,
    /// The sysroot is the running system.
    booted: bool,
    stateroot: String,
    /// What runs now (booted system) or boots next (other sysroot) on `stateroot`.
    current: DeploymentInfo,
    /// That system's /etc.
    etc: PathBuf,
}

impl Local {
    fn inspect(sysroot_path: &Path, stateroot: Option<&str>) -> Result<Local> {
        let sysroot = deployments::open_sysroot(sysroot_path)?;
        let deployments = deployments::list(&sysroot)?;
        let booted = deployments.iter().find(|d| d.booted).cloned();
        let stateroot = match (stateroot, &booted) {
            (Some(s), _) => s.to_string(),
            (None, Some(b)) => b.stateroot.clone(),
            (None, None) => match deployments.iter().find(|d| !d.staged) {
                Some(d) => d.stateroot.clone(),
                None => bail!(
                    "{} has no deployment: pivot moves an existing OSTree system to a new image",
                    sysroot_path.display()
                ),
            },
        };
        let current = booted
            .clone()
            .filter(|b| b.stateroot == stateroot)
            .or_else(|| {
                deployments
                    .iter()
                    .find(|d| !d.staged && d.stateroot == stateroot)
                    .cloned()
            })
            .with_context(|| format!("stateroot {stateroot:?} has no deployment to merge from"))?;
        let is_booted = booted.is_some();
        let etc = if is_booted && sysroot_path == Path::new("/") {
            PathBuf::from("/etc")
        } else {
            current.path.join("etc")
        };
        Ok(Local {
            deployments,
            booted: is_booted,
            stateroot,
            current,
            etc,
        })
    }

    /// The booted, staged or default deployment that came from `digest` or is `commit`.
    fn at_target(&self, digest: Option<&str>, commit: Option<&str>) -> Option<&DeploymentInfo> {
        find_at_target(&self.deployments, digest, commit)
    }

    fn is_current(&self, d: &DeploymentInfo) -> bool {
        d.stateroot == self.current.stateroot
            && d.checksum == self.current.checksum
            && d.serial == self.current.serial
    }
}

fn find_at_target<'d>(
    deployments: &'d [DeploymentInfo],
    digest: Option<&str>,
    commit: Option<&str>,
) -> Option<&'d DeploymentInfo> {
    deployments
        .iter()
        .filter(|d| d.booted || d.staged || d.default)
        .find(|d| {
            digest.is_some_and(|x| d.image_digest() == Some(x))
                || commit.is_some_and(|c| d.checksum == c)
        })
}

/// What a finished run reports to its caller.
pub struct Report {
    pub outcome: Outcome,
    /// The sysroot is the running system (so rebooting means something).
    pub booted: bool,
}

/// Runs one pivot and records its outcome in the state file.
pub async fn run(opts: &Options) -> Result<Report> {
    let local = {
        let (path, stateroot) = (opts.sysroot.clone(), opts.stateroot.clone());
        tokio::task::spawn_blocking(move || Local::inspect(&path, stateroot.as_deref())).await??
    };
    let (pullspec, source) = match &opts.pullspec {
        Some(p) => (p.trim().to_string(), Source::Argument),
        None => (read_pullspec_file(&local.etc)?, Source::File),
    };
    let image = ImageRef::parse(&pullspec).with_context(|| match source {
        Source::Argument => format!("invalid pullspec {pullspec:?}"),
        Source::File => format!(
            "invalid pullspec in {}",
            local.etc.join(PULLSPEC_FILE).display()
        ),
    })?;

    let state_file = StateFile::for_stateroot(&opts.sysroot, &local.stateroot);
    let mut state = state_file.load()?;
    if source == Source::File && state.target.as_deref() != Some(&pullspec) {
        state.target = Some(pullspec.clone());
        state.attempts = 0;
    }
    let mut run = Run {
        opts,
        local: &local,
        image,
        source,
        state_file: &state_file,
        state,
        attempt: Attempt::new(
            &pullspec,
            match source {
                Source::Argument => "argument",
                Source::File => "file",
            },
        ),
    };
    let result = run.pivot().await;
    match &result {
        Ok(_) => {}
        Err(e) => {
            run.attempt.outcome = "failed".into();
            run.attempt.error = Some(format!("{e:#}"));
        }
    }
    opts.progress.finish(&run.attempt.outcome);
    run.state.last = Some(run.attempt);
    if let Err(e) = state_file.save(&run.state) {
        tracing::warn!("could not record the outcome: {e:#}");
    }
    Ok(Report {
        outcome: result?,
        booted: local.booted,
    })
}

fn read_pullspec_file(etc: &Path) -> Result<String> {
    let path = etc.join(PULLSPEC_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no pullspec given and {} does not exist", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let spec = text.trim();
    ensure!(!spec.is_empty(), "{} is empty", path.display());
    Ok(spec.to_string())
}

struct Run<'a> {
    opts: &'a Options,
    local: &'a Local,
    image: ImageRef,
    source: Source,
    state_file: &'a StateFile,
    state: State,
    attempt: Attempt,
}

impl Run<'_> {
    async fn pivot(&mut self) -> Result<Outcome> {
        // A pinned digest that is already deployed needs no registry at all.
        let pinned = self.image.digest.clone();
        if let Some(hit) = self.local.at_target(pinned.as_deref(), None) {
            if self.source == Source::Argument || self.local.is_current(hit) {
                return self.settle(hit.clone());
            }
        }
        if self.source == Source::File {
            // The node runs what pivot deployed for this very pullspec: confirmed, even if the
            // registry is out of reach now (a moved tag is the cluster's next pivot, not this one).
            if self.local.current.pullspec.as_deref() == Some(self.image.to_string().as_str()) {
                let current = self.local.current.clone();
                return self.settle(current);
            }
            self.count_attempt()?;
        }

        let conf = RegistriesConf::load_default()?;
        let what = self.image.to_string();
        self.opts.progress.step("pulling");
        let (registry, resolved) = registry::open(&self.image, &conf, &self.opts.access)
            .await
            .with_context(|| format!("pulling {what}"))?;
        let image = self.image.with_digest(&resolved.digest);
        self.attempt.digest = Some(resolved.digest.clone());
        if let Some(hit) = self.local.at_target(Some(&resolved.digest), None) {
            return self.settle(hit.clone());
        }
        let config = registry
            .fetch_json_blob(&OsImage::config_descriptor(&resolved.manifest))
            .await
            .with_context(|| format!("pulling {what}: fetching the image config"))?;
        let os = OsImage::new(&resolved, &config).with_context(|| format!("pulling {what}"))?;
        if let Some(hit) = self.local.at_target(None, os.commit_label.as_deref()) {
            return self.settle(hit.clone());
        }
        tracing::info!(
            image = %image.name(),
            digest = %os.digest,
            version = os.version.as_deref().unwrap_or(""),
            "pivoting to {} (version {})",
            image.pinned_or_tagged(),
            os.version.as_deref().unwrap_or("unknown")
        );

        let job = Job {
            seen: deployment_ids(&self.local.deployments),
            sysroot: self.opts.sysroot.clone(),
            stateroot: self.local.stateroot.clone(),
            pullspec: self.image.to_string(),
            image,
            os,
            keep: self.opts.keep,
            registry,
            runtime: Handle::current(),
            progress: self.opts.progress.clone(),
        };
        let done = tokio::task::spawn_blocking(move || job.run()).await??;
        let Some((commit, deployed)) = done else {
            // Another pivot deployed the target while this one waited for the lock.
            return Ok(Outcome::Unchanged {
                reboot_pending: false,
            });
        };
        self.attempt.commit = Some(commit.clone());
        self.attempt.outcome = if deployed.staged {
            "staged"
        } else {
            "deployed"
        }
        .into();
        tracing::info!(
            commit = %commit,
            digest = self.attempt.digest.as_deref().unwrap_or(""),
            "{} deployment {commit}.{} of {}",
            if deployed.staged { "staged" } else { "wrote" },
            deployed.serial,
            self.image
        );
        if deployed.staged {
            crate::reboot::mark_needed()?;
        }
        Ok(Outcome::Changed {
            staged: deployed.staged,
        })
    }

    /// The target is already deployed as `hit`.
    fn settle(&mut self, hit: DeploymentInfo) -> Result<Outcome> {
        self.attempt.commit = Some(hit.checksum.clone());
        if self.local.is_current(&hit) {
            tracing::info!(commit = %hit.checksum, "already at target {}: nothing to do", self.image);
            self.attempt.outcome = "unchanged".into();
            if self.source == Source::File {
                self.confirm()?;
            }
            return Ok(Outcome::Unchanged {
                reboot_pending: false,
            });
        }
        tracing::info!(
            commit = %hit.checksum,
            "target {} is already deployed ({}); it takes effect at the next boot",
            self.image,
            if hit.staged { "staged" } else { "default" }
        );
        self.attempt.outcome = "unchanged".into();
        Ok(Outcome::Unchanged {
            reboot_pending: self.source == Source::File && self.local.booted,
        })
    }

    /// The node runs the pullspec file's target: the file has done its job.
    fn confirm(&mut self) -> Result<()> {
        let path = self.local.etc.join(PULLSPEC_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!("removed {}: the node runs its target", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        self.state.target = None;
        self.state.attempts = 0;
        self.attempt.outcome = "confirmed".into();
        Ok(())
    }

    /// Counts a pullspec-file run that starts without the node on its target.
    fn count_attempt(&mut self) -> Result<()> {
        if self.state.attempts >= MAX_ATTEMPTS {
            let last = self
                .state
                .last
                .as_ref()
                .and_then(|a| a.error.clone())
                .unwrap_or_else(|| "the node did not boot into it".into());
            bail!(
                "giving up on {} after {MAX_ATTEMPTS} attempts (last: {last}); run `pivot {}` by hand, or remove {} to try again",
                self.image,
                self.image,
                self.state_file.path().display()
            );
        }
        self.state.attempts += 1;
        tracing::info!(
            "pivot attempt {}/{MAX_ATTEMPTS} to {}",
            self.state.attempts,
            self.image
        );
        let mut snapshot = self.state.clone();
        snapshot.last = Some(self.attempt.clone());
        // Saved before any work, so a run that dies (or reboots) still counts.
        self.state_file.save(&snapshot)
    }
}

/// The part of a pivot that runs on one blocking thread, owning the libostree objects.
struct Job {
    /// The deployments as this run found them before taking the sysroot lock.
    seen: Vec<String>,
    sysroot: PathBuf,
    stateroot: String,
    pullspec: String,
    image: ImageRef,
    os: OsImage,
    keep: bool,
    registry: Registry,
    runtime: Handle,
    progress: Progress,
}

impl Job {
    fn run(self) -> Result<Option<(String, Deployed)>> {
        let sysroot = ostree::Sysroot::new(Some(&gio::File::for_path(&self.sysroot)));
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
        let commit = match self.os.commit_label.as_deref() {
            Some(c) if import::verify_complete(&repo, c).is_ok() => {
                tracing::info!(commit = %c, "commit {c} is already in the repo: nothing to download");
                // A run killed right after committing the import left the mark on; it is whole.
                repo.mark_commit_partial(c, false)
                    .with_context(|| format!("marking commit {c} complete"))?;
                c.to_string()
            }
            _ => {
                self.check_space(&repo)?;
                self.import(&repo)
                    .with_context(|| format!("pulling {}", self.pullspec))?
            }
        };
        space::check_boot(&self.sysroot, &self.stateroot, &repo, &commit)?;
        if self.keep {
            let name = format!("pivot/{}", self.image.repository);
            repo.set_ref_immediate(None, &name, Some(&commit), gio::Cancellable::NONE)
                .with_context(|| format!("keeping {commit} under the ref {name}"))?;
        }
        self.progress.step("deploying");
        let origin = deploy::origin(
            &sysroot,
            &OriginInfo {
                commit: &commit,
                name: &self.image.name(),
                digest: &self.os.digest,
                version: self.os.version.as_deref(),
                pullspec: &self.pullspec,
            },
        );
        let deployed = deploy::deploy(&sysroot, &self.stateroot, &commit, &origin)
            .with_context(|| format!("deploying commit {commit}"))?;
        Ok(Some((commit, deployed)))
    }

    /// Refuses, before any layer is downloaded, an import the repo's filesystem has no room for.
    fn check_space(&self, repo: &ostree::Repo) -> Result<()> {
        // As people know it (libostree's own path for the repo is a /proc/self/fd one).
        let repo_path = self.sysroot.join("ostree/repo");
        let spools = repo_path.join(Spools::DIR);
        let layers: Vec<space::Layer> = self
            .os
            .layers
            .iter()
            .map(|l| {
                let size = l.descriptor.size.max(0) as u64;
                let spooled = std::fs::metadata(spools.join(spool_name(&l.descriptor.digest)))
                    .map(|m| m.len())
                    .unwrap_or(0);
                space::Layer {
                    size,
                    spooled: if spooled <= size { spooled } else { 0 },
                }
            })
            .collect();
        space::check_repo(repo, &repo_path, &layers)
    }

    /// Streams every layer into one transaction; nothing is committed unless all layers verified
    /// and the commit is complete. On failure the transaction's temporary space is freed.
    fn import(&self, repo: &ostree::Repo) -> Result<String> {
        let tmp = repo.path().path().unwrap_or_default().join("tmp");
        let before = import::staging_dirs(&tmp);
        let imported = self.import_in_transaction(repo);
        if imported.is_err() {
            import::remove_new_staging_dirs(&tmp, &before);
        }
        imported
    }

    fn import_in_transaction(&self, repo: &ostree::Repo) -> Result<String> {
        let spools = Spools::new(repo, &self.os);
        let imported = self.import_layers(repo, &spools);
        // A killed run keeps its downloads for the next one; a run that ends keeps nothing.
        spools.remove_all();
        imported
    }

    fn import_layers(&self, repo: &ostree::Repo, spools: &Spools) -> Result<String> {
        let tx = repo
            .auto_transaction(gio::Cancellable::NONE)
            .context("starting a repo transaction")?;
        let mut importer = RepoImporter::new(repo);
        let count = self.os.layers.len();
        self.progress.step("importing");
        let sizes: Vec<(String, u64)> = self
            .os
            .layers
            .iter()
            .map(|l| (l.descriptor.digest.clone(), l.descriptor.size.max(0) as u64))
            .collect();
        self.progress.start(&self.pullspec, &self.os.digest, &sizes);
        for (i, layer) in self.os.layers.iter().enumerate() {
            let digest = &layer.descriptor.digest;
            let context = || format!("fetching layer {}/{count} {digest}", i + 1);
            let spool = spools.path(digest);
            let reader = BlobReader::open(
                &self.runtime,
                &self.registry,
                &layer.descriptor,
                spool.as_deref(),
            )
            .with_context(context)?
            .with_progress(self.progress.clone(), i);
            importer
                .import_blob(reader, layer.compression)
                .with_context(context)?;
            // The spool stays until the transaction commits: a run killed before that replays
            // this layer from disk instead of downloading it again.
        }
        let (written, skipped) = (importer.objects_written, importer.objects_skipped);
        let commit = importer.finish(self.os.commit_label.as_deref())?;
        // Committing moves the objects into place one by one: until it is done, the commit is
        // marked partial, so that after a kill in between neither fsck nor the next run takes
        // the commit for a whole one.
        repo.mark_commit_partial(&commit, true)
            .context("marking the commit partial")?;
        tx.commit(gio::Cancellable::NONE)
            .context("committing the imported objects")?;
        repo.mark_commit_partial(&commit, false)
            .context("marking the commit complete")?;
        tracing::info!(commit = %commit, "imported {commit}: {written} objects written, {skipped} already present");
        Ok(commit)
    }
}

/// Layer downloads, partial or whole, under the repo's `tmp/pivot-downloads/`, kept until the
/// import commits or fails, so that a run that is killed can be resumed by the next one.
struct Spools {
    dir: PathBuf,
}

impl Spools {
    const DIR: &'static str = "tmp/pivot-downloads";

    /// Drops what earlier runs left for other images.
    fn new(repo: &ostree::Repo, os: &OsImage) -> Spools {
        let dir = repo.path().path().unwrap_or_default().join(Self::DIR);
        let wanted: Vec<String> = os
            .layers
            .iter()
            .map(|l| spool_name(&l.descriptor.digest))
            .collect();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !wanted.iter().any(|w| entry.file_name() == w.as_str()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Spools { dir }
    }

    fn path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.dir.join(spool_name(digest)))
    }

    fn remove_all(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Deployments as `stateroot/checksum.serial` (staged ones marked), in boot order.
fn deployment_ids(deployments: &[DeploymentInfo]) -> Vec<String> {
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

fn spool_name(digest: &str) -> String {
    format!("{}.partial", digest.replace(':', "-"))
}
