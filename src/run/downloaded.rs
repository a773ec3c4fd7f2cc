//! Deploying what an earlier `--download-only` left: its commit, complete in the repo under
//! [`downloaded_ref`], and the signatures it was judged on ([`crate::trust::evidence`]). The
//! download is judged again under the policy in force now, on those signatures, before it is
//! deployed without the registry; when they do not satisfy the policy (it was tightened, or an
//! older pivot kept none), the pull goes to the registry instead and is judged there afresh.

use anyhow::{Context, Result};

use super::job::downloaded_ref;
use super::Run;
use crate::fetch::image::{Format, OsImage};
use crate::fetch::reference::ImageRef;
use crate::import;
use crate::sysroot::deployments;
use crate::trust::evidence::{self, Evidence, Kept, API_VERSION, KIND};
use crate::trust::{Trust, Verified};

/// The record of what a download was judged on.
pub(super) fn kept(image: &ImageRef, manifest_digest: &str, evidence: Evidence) -> Kept {
    Kept {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        image: image.to_string(),
        manifest_digest: manifest_digest.to_string(),
        evidence,
    }
}

impl Run<'_> {
    /// The image `digest` as an earlier `--download-only` left it, with the verdict of the
    /// current policy on it; None when there is no such download or the kept signatures do not
    /// satisfy the policy.
    pub(super) async fn downloaded(
        &self,
        digest: &str,
        trust: &Trust,
    ) -> Result<Option<(OsImage, Verified)>> {
        let (sysroot, digest_owned) = (self.opts.sysroot.clone(), digest.to_string());
        let found = tokio::task::spawn_blocking(move || -> Result<Option<(Format, String)>> {
            let repo = deployments::open_sysroot(&sysroot)?.repo();
            for format in [Format::Legacy, Format::Native] {
                let Some(commit) = repo
                    .resolve_rev(&downloaded_ref(&digest_owned, format), true)
                    .context("reading the downloads' refs")?
                else {
                    continue;
                };
                if import::verify_complete(&repo, &commit).is_err() {
                    continue;
                }
                return Ok(Some((format, commit.to_string())));
            }
            Ok(None)
        })
        .await??;
        let Some((format, commit)) = found else {
            return Ok(None);
        };
        let path = evidence::path(&self.local.state_dir(&self.opts.sysroot), digest);
        let kept = Kept::load(&path)?;
        let (manifest_digest, evidence) = match &kept {
            Some(kept) => (kept.manifest_digest.as_str(), kept.evidence.clone()),
            None => (digest, Evidence::default()),
        };
        let verified = match trust.judge(&self.image, manifest_digest, None, &evidence) {
            Ok(verified) => verified,
            Err(why) => {
                tracing::warn!(
                    "the download of {} does not satisfy the signature policy on the signatures kept with it ({why:#}); pulling from the registry instead",
                    self.image
                );
                return Ok(None);
            }
        };
        let repo_path = self.opts.sysroot.clone();
        let commit_for_version = commit.clone();
        let version = tokio::task::spawn_blocking(move || -> Result<Option<String>> {
            let repo = deployments::open_sysroot(&repo_path)?.repo();
            deployments::commit_version(&repo, &commit_for_version)
        })
        .await??;
        let os = OsImage {
            version,
            digest: digest.to_string(),
            // The layers are not read again; the format gives the origin.
            format,
            commit_label: Some(commit),
            base_commit: None,
            layers: Vec::new(),
            manifest_digest: String::new(),
            manifest_json: String::new(),
            config_json: String::new(),
        };
        Ok(Some((os, verified)))
    }
}
