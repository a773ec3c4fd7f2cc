//! One pivot, driven through the stages: pullspec → fetch → import → deploy → state.
//!
//! The pullspec file (`/etc/pivot/image-pullspec`, read when no pullspec is given) is removed only
//! once the node is confirmed to run its target (on the booted system: booted from it; on another
//! sysroot: its default deployment is it). Until then every run counts an attempt in the state
//! file ([`attempts`]); after [`MAX_ATTEMPTS`](crate::node::state::MAX_ATTEMPTS) runs that did
//! not end on the target, pivot stops with an error instead of pulling and rebooting again, so a
//! target that keeps failing cannot become a reboot loop. The file stays, so the failure is visible; a run with an explicit pullspec is never
//! limited, and removing the state file resets the count.

mod attempts;
mod check;
pub mod confirm;
mod downloaded;
pub(crate) mod job;
mod layer;
mod local;
mod node;
mod parallel;
pub mod rollback;
mod settle;
mod write;


use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use crate::node::events::{self, Reported, Target};
use crate::fetch::image::OsImage;
use local::Local;
pub use node::{fleet_node, fleet_node_and_config};
use node::{node_of, spread_first_request};
use crate::sysroot::kargs::{self, Edit};
pub use crate::api::outcome::Outcome;
use crate::node::progress::Progress;
use crate::fetch::reference::ImageRef;
use crate::fetch::registry::Access;
use crate::fetch::source;
use crate::api::progress::Step;
use crate::api::status::PullspecSource as Source;
use crate::trust::{Gather, Trust};
use crate::node::state::{Attempt, State, StateFile};

/// Where the first-boot pullspec lives, relative to the system's /etc.
pub const PULLSPEC_FILE: &str = "pivot/image-pullspec";

#[derive(Debug, Clone)]
pub struct Options {
    pub pullspec: Option<String>,
    pub sysroot: PathBuf,
    pub stateroot: Option<String>,
    pub keep: bool,
    /// Spool layer downloads to disk so that a killed run resumes them.
    pub partial_downloads: bool,
    /// Kernel argument edits from the command line, applied after the kernel-args file's.
    pub karg_edits: Vec<Edit>,
    /// Only report what a pivot would do (manifest and config only; nothing written).
    pub check: bool,
    /// Pull and import, deploy nothing; the commit is kept for a later (offline) pivot.
    pub download_only: bool,
    pub access: Access,
    /// `--policy`: containers-policy.json(5); None reads the containers tools' default.
    pub policy: Option<PathBuf>,
    /// `--registries.d`: containers-registries.d(5); None reads the default directory.
    pub registries_d: Option<PathBuf>,
    /// `--ostree-remote`: the image's OSTree commit must be signed by this remote's keys.
    pub ostree_remote: Option<String>,
    /// `--lock-finalization`: stage the deployment locked (booted system only).
    pub lock_finalization: bool,
    pub progress: Progress,
}

/// What a finished run reports to its caller.
pub struct Report {
    pub outcome: Outcome,
    /// The target is deployed but a pullspec-file run found the node not running it: the
    /// reboot that would start it is still owed.
    pub reboot_pending: bool,
    /// Why the attempt could not be recorded in the state file, if it could not: then the
    /// reboot-loop guard cannot count this attempt, and pivot must not reboot.
    pub unrecorded: Option<String>,
    /// The sysroot is the running system (so rebooting means something).
    pub booted: bool,
    /// The target, for the journal.
    pub target: Target,
    /// How the node reboots into what this run staged (`/etc/pivot/config.d`).
    pub config: crate::fleet::config::Config,
    /// The node, for the reboot.
    pub node: crate::fleet::Node,
    /// With `--check`: what it found.
    pub check: Option<crate::api::status::UpdateCheck>,
}

impl Options {
    /// A run that needs no registry (its image is in the repo under a download ref), with
    /// pivot's defaults otherwise.
    pub fn offline(sysroot: &Path) -> Options {
        Options {
            pullspec: None,
            sysroot: sysroot.to_path_buf(),
            stateroot: None,
            keep: false,
            partial_downloads: true,
            karg_edits: Vec::new(),
            check: false,
            download_only: false,
            access: Access {
                auth: crate::fetch::config::auth::AuthFiles::new(None),
                cert_dir: None,
                tls_verify: true,
                retry: crate::fetch::retry::RetryPolicy::new(crate::fetch::retry::DEFAULT_BUDGET),
            },
            policy: None,
            registries_d: None,
            ostree_remote: None,
            lock_finalization: false,
            progress: Progress::default(),
        }
    }
}

/// The /etc of the system on `sysroot` that runs now (or boots next).
pub fn system_etc(sysroot: &Path) -> Result<PathBuf> {
    Ok(Local::inspect(sysroot, None)?.etc)
}


/// Runs one pivot and records its outcome in the state file.
pub async fn run(opts: &Options) -> Result<Report> {
    let local = {
        let (path, stateroot) = (opts.sysroot.clone(), opts.stateroot.clone());
        tokio::task::spawn_blocking(move || Local::inspect(&path, stateroot.as_deref())).await??
    };
    // Read first: a mistake in it fails the run before anything is pulled.
    let config = crate::fleet::config::Config::load(&local.etc)?;
    // With a FleetLock, an update waits for its slot staged locked, as zincati stages it: a
    // reboot before the slot is granted (kured, an admin, the MCO) must not apply it.
    let fleet_locked = matches!(
        config.strategy,
        crate::fleet::config::Strategy::FleetLock(_)
    ) && local.booted
        && !opts.check
        && !opts.download_only;
    let locked_opts;
    let opts = match fleet_locked && !opts.lock_finalization {
        true => {
            locked_opts = Options {
                lock_finalization: true,
                ..opts.clone()
            };
            &locked_opts
        }
        false => opts,
    };
    ensure!(
        !opts.lock_finalization || local.booted,
        "--lock-finalization needs the booted system: on {}, which is not booted, the deployment is written, not staged",
        opts.sysroot.display()
    );
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

    let state_file = StateFile::in_dir(&local.state_dir(&opts.sysroot));
    let mut state = state_file.load()?;
    if source == Source::File && state.target.as_deref() != Some(&pullspec) {
        state.target = Some(pullspec.clone());
        state.attempts = 0;
    }
    let mut kargs = kargs::read_file(&local.etc)?;
    kargs.extend(opts.karg_edits.iter().cloned());
    let mut run = Run {
        opts,
        target: Target {
            image: image.name(),
            ..Default::default()
        },
        kargs,
        local: &local,
        image,
        source,
        state_file: &state_file,
        state,
        attempt: Attempt {
            locked: opts.lock_finalization,
            ..Attempt::new(&pullspec, source)
        },
        reboot_pending: false,
        unrecorded: None,
        boot_tries: config.boot_tries,
        require_policy: config.require_policy,
        found: None,
        held: false,
        waiting: false,
        fleet_locked,
    };
    // A bug (a panic) anywhere in the run ends it as a failed run.
    let result = crate::node::panics::caught(run.pivot()).await;
    run.attempt.outcome = match &result {
        Ok(outcome) => *outcome,
        Err(e) => {
            run.attempt.error = Some(format!("{e:#}"));
            Outcome::Failed
        }
    };
    let outcome = run.attempt.outcome;
    opts.progress.finish(outcome);
    let mut check = None;
    // A check changes nothing but the record of what it found (not even that of attempts).
    if opts.check {
        if let Ok(outcome @ (Outcome::UpdateAvailable | Outcome::Unchanged)) = &result {
            let found = run.found.take().filter(|_| *outcome == Outcome::UpdateAvailable);
            check = Some(crate::api::status::UpdateCheck {
                api_version: crate::api::API_VERSION.into(),
                kind: crate::api::status::CHECK_KIND.into(),
                stateroot: local.stateroot.clone(),
                checksum: local.current.checksum.clone(),
                version: local.current.version.clone(),
                update: found.clone(),
                packages: None,
                packages_unknown: None,
            });
            let saved = state_file.load().and_then(|mut state| {
                state.cached_update = found;
                state_file.save(&state)
            });
            if let Err(e) = saved {
                tracing::warn!("could not record what the check found: {e:#}");
            }
        }
    } else if !run.held && !run.waiting {
        run.state.last = Some(run.attempt);
        // The node moved (or is where it should be): an update found before is no news now.
        if result.as_ref().is_ok_and(|o| {
            o.made_deployment() || matches!(o, Outcome::Unchanged | Outcome::Confirmed)
        }) {
            run.state.cached_update = None;
        }
        if let Err(e) = state_file.save(&run.state) {
            tracing::warn!("could not record the outcome: {e:#}");
            run.unrecorded.get_or_insert(format!("{e:#}"));
        }
    }
    if let Err(e) = &result {
        events::error(events::FAILED, &run.target, &format!("{e:#}"));
    }
    events::finished(&run.target, outcome);
    match result {
        Ok(outcome) => Ok(Report {
            outcome,
            reboot_pending: run.reboot_pending,
            unrecorded: run.unrecorded,
            booted: local.booted,
            target: run.target,
            config,
            node: node_of(&opts.sysroot, &local),
            check,
        }),
        Err(e) => Err(Reported(e).into()),
    }
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
    /// What the journal events say about the target, filled in as it becomes known.
    target: Target,
    /// The kernel-args file's edits, then the command line's.
    kargs: Vec<Edit>,
    local: &'a Local,
    image: ImageRef,
    source: Source,
    state_file: &'a StateFile,
    state: State,
    attempt: Attempt,
    /// See [`Report::reboot_pending`].
    reboot_pending: bool,
    /// See [`Report::unrecorded`].
    unrecorded: Option<String>,
    /// `[boot] tries`, for GRUB's fallback when the deployment is staged.
    boot_tries: u8,
    /// pivot.toml's `signatures.require_policy`.
    require_policy: bool,
    /// What a `--check` found.
    found: Option<crate::api::status::CachedUpdate>,
    /// The target is held after a rollback: nothing was attempted.
    held: bool,
    /// The target waits staged, locked (for its FleetLock slot, or `pivot finalize`): this run
    /// attempted nothing, and the record keeps the attempt that staged it, which the unlock
    /// marks unlocked and the next boot's `pivot confirm` confirms (settling GRUB's boot-once
    /// attempt). Recorded as this run's `unchanged`, it would leave that boot nothing to
    /// confirm, and GRUB's counter armed until it fell back.
    waiting: bool,
    /// Staged locked for the FleetLock strategy, which unlocks it once the slot is granted.
    fleet_locked: bool,
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
            if let Some(rollback) = self
                .state
                .rollback
                .as_ref()
                .filter(|r| r.held.as_deref() == Some(self.attempt.pullspec.as_str()))
            {
                let by = match self.state.auto_rolled_back.contains(&rollback.from) {
                    true => "pivot rolled the node back from it by itself (see `pivot status`)",
                    false => "`pivot rollback` turned away from it",
                };
                tracing::warn!(
                    "not pivoting to {}: {by} (at {} s since the epoch); name another image in /etc/{PULLSPEC_FILE}, or run `pivot {}` to go ahead",
                    self.attempt.pullspec,
                    rollback.at,
                    self.attempt.pullspec
                );
                // The last attempt's record (how the node came back) stays what status shows.
                self.held = true;
                return Ok(Outcome::Unchanged);
            }
            if !self.opts.check {
                self.count_attempt()?;
            }
        } else if !self.opts.check {
            // An admin's own pivot lifts the hold a rollback put on the pullspec file's target.
            if let Some(rollback) = self.state.rollback.as_mut() {
                rollback.held = None;
            }
        }

        let trust = Trust::load(
            self.opts.policy.as_deref(),
            self.opts.registries_d.as_deref(),
            self.require_policy,
        )
            .context("reading the signature policy")?;
        if let Some(digest) = pinned.as_deref().filter(|_| !self.opts.check) {
            if let Some((os, verified)) = self.downloaded(digest, &trust).await? {
                tracing::info!(
                    "{} was downloaded before (--download-only): deploying it without the registry",
                    self.image
                );
                self.target.digest = os.digest.clone();
                self.target.version = os.version.clone().unwrap_or_default();
                return self
                    .make_deployment(self.image.clone(), os, None, Some(verified), None)
                    .await;
            }
        }
        let what = self.image.to_string();
        self.opts.progress.step(Step::Pulling);
        if self.source == Source::File {
            spread_first_request().await;
        }
        let (source, resolved) = source::open(&self.image, &self.opts.access)
            .await
            .with_context(|| format!("pulling {what}"))?;
        let image = self.image.with_digest(&resolved.digest);
        self.attempt.digest = Some(resolved.digest.clone());
        self.target.digest = resolved.digest.clone();
        let hit = [&resolved.digest, &resolved.manifest_digest]
            .into_iter()
            .find_map(|digest| self.local.at_target(Some(digest), None));
        if let Some(hit) = hit {
            return self.settle(hit.clone());
        }
        // A download, or a locked update kept for re-staging after a reboot, is judged again
        // when deployed from the repo: keep every signature that could be asked for then.
        let gather = match self.opts.download_only || self.opts.lock_finalization {
            true => Gather::All,
            false => Gather::Needed,
        };
        // Before anything else of the image is fetched; on the manifest pulled (an index's
        // platform manifest), as podman judges it.
        let (verified, evidence) = trust
            .check(
                &self.image,
                &resolved.manifest_digest,
                Some(resolved.json.as_bytes()),
                &self.opts.access.retry,
                source.registry(),
                gather,
            )
            .await?;
        let config = source
            .fetch_json_blob(&OsImage::config_descriptor(&resolved.manifest))
            .await
            .with_context(|| format!("pulling {what}: fetching the image config"))?;
        let os = OsImage::new(&resolved, &config).with_context(|| format!("pulling {what}"))?;
        if let Some(remote) = &self.opts.ostree_remote {
            let derived = os.layers.iter().filter(|l| l.derived).count();
            ensure!(
                derived == 0,
                "--ostree-remote {remote}: {what} adds {derived} derived layer(s) on top of its OSTree commit, so the tree deployed would not be the one {remote} signed; pull it without --ostree-remote, under a container signature policy"
            );
        }
        if let Some(hit) = self.local.at_target(None, os.commit_label.as_deref()) {
            return self.settle(hit.clone());
        }
        self.target.version = os.version.clone().unwrap_or_default();
        self.target.commit = os.commit_label.clone().unwrap_or_default();
        events::info(
            events::STARTED,
            &self.target,
            &format!(
                "pivoting to {} (version {})",
                image.pinned_or_tagged(),
                os.version.as_deref().unwrap_or("unknown")
            ),
        );

        if self.opts.check {
            return self.report_update(&image, &os).await;
        }
        let kept = downloaded::kept(&self.image, &resolved.manifest_digest, evidence);
        self.make_deployment(image, os, Some(source), Some(verified), Some(kept))
            .await
    }
}
