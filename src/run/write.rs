//! The step that writes: the import and the deployment of a target not deployed yet (or, with
//! `--download-only`, its commit kept for later), and what the run records of it.

use anyhow::{Context, Result};
use tokio::runtime::Handle;

use super::job::{deployment_ids, Job};
use super::{Outcome, Run};
use crate::fetch::image::OsImage;
use crate::fetch::reference::ImageRef;
use crate::fetch::source;
use crate::node::events;
use crate::trust::evidence::{self, Kept};
use crate::trust::Verified;

impl Run<'_> {
    /// Imports `os` (unless its commit is in the repo already) and deploys it, or with
    /// `--download-only` keeps it for later.
    pub(super) async fn make_deployment(
        &mut self,
        image: ImageRef,
        os: OsImage,
        source: Option<source::Source>,
        verified: Option<Verified>,
        kept: Option<Kept>,
    ) -> Result<Outcome> {
        let digest = os.digest.clone();
        let job = Job {
            seen: deployment_ids(&self.local.deployments),
            sysroot: self.opts.sysroot.clone(),
            stateroot: self.local.stateroot.clone(),
            pullspec: self.image.to_string(),
            image,
            os,
            keep: self.opts.keep,
            download_only: self.opts.download_only,
            partial_downloads: self.opts.partial_downloads,
            source,
            runtime: Handle::current(),
            progress: self.opts.progress.clone(),
            kargs: self.kargs.clone(),
            stored: Default::default(),
            verified,
            ostree_remote: self.opts.ostree_remote.clone(),
            lock_finalization: self.opts.lock_finalization,
            boot_tries: self.boot_tries,
        };
        let done = tokio::task::spawn_blocking(move || job.run()).await??;
        let Some((commit, deployed)) = done else {
            // Another pivot deployed the target while this one waited for the lock.
            return Ok(Outcome::Unchanged);
        };
        self.attempt.commit = Some(commit.clone());
        self.target.commit = commit.clone();
        if let Some(kept) = kept.filter(|_| self.opts.download_only || self.opts.lock_finalization)
        {
            let path = evidence::path(&self.local.state_dir(&self.opts.sysroot), &digest);
            kept.save(&path)
                .context("keeping the download's signatures for its deployment")?;
        }
        let Some(deployed) = deployed else {
            tracing::info!(
                "downloaded {commit}; `pivot {}` deploys it, without the registry",
                self.image.with_digest(&digest)
            );
            return Ok(Outcome::Downloaded);
        };
        events::info(
            events::DEPLOYED,
            &self.target,
            &format!(
                "{} deployment {commit}.{} of {}",
                if deployed.staged { "staged" } else { "wrote" },
                deployed.serial,
                self.image
            ),
        );
        if deployed.staged && !self.opts.lock_finalization {
            crate::node::reboot::mark_needed()?;
        }
        Ok(match deployed.staged {
            true => Outcome::Staged,
            false => Outcome::Deployed,
        })
    }
}
