//! The sysroot as a run finds it before any work starts: its deployments, which of them runs
//! now (or boots next), that system's /etc, and which deployment is already at a target.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::sysroot::deployments::{self, DeploymentInfo};

/// The sysroot as found before any work starts.
pub(super) struct Local {
    pub(super) deployments: Vec<DeploymentInfo>,
    /// The sysroot is the running system.
    pub(super) booted: bool,
    pub(super) stateroot: String,
    /// What runs now (booted system) or boots next (other sysroot) on `stateroot`.
    pub(super) current: DeploymentInfo,
    /// That system's /etc.
    pub(super) etc: PathBuf,
}

impl Local {
    pub(super) fn inspect(sysroot_path: &Path, stateroot: Option<&str>) -> Result<Local> {
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
    pub(super) fn at_target(&self, digest: Option<&str>, commit: Option<&str>) -> Option<&DeploymentInfo> {
        find_at_target(&self.deployments, digest, commit)
    }

    /// pivot's state directory for the run's stateroot of `sysroot` (this run's sysroot):
    /// [`crate::node::state::dir`], told which stateroot runs.
    pub(super) fn state_dir(&self, sysroot: &Path) -> PathBuf {
        crate::node::state::dir(
            sysroot,
            deployments::booted_stateroot(&self.deployments),
            &self.stateroot,
        )
    }

    pub(super) fn is_current(&self, d: &DeploymentInfo) -> bool {
        d.stateroot == self.current.stateroot
            && d.checksum == self.current.checksum
            && d.serial == self.current.serial
    }
}

pub(crate) fn find_at_target<'d>(
    deployments: &'d [DeploymentInfo],
    digest: Option<&str>,
    commit: Option<&str>,
) -> Option<&'d DeploymentInfo> {
    deployments
        .iter()
        .filter(|d| d.booted || d.staged || d.default)
        .find(|d| {
            digest.is_some_and(|x| d.has_digest(x)) || commit.is_some_and(|c| d.has_commit(c))
        })
}
