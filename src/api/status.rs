//! `pivot status --json`: the deployments and pivot's last attempt per stateroot.
//!
//! Its JSON Schema, generated from these types, is `docs/status.schema.json`. Version 1 of the
//! shape (`--format-version 1`, the default and only one) is these fields; fields are only added,
//! and a field that changes meaning or goes away gets a new format version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::outcome::Outcome;

/// `kind` of the status document.
pub const KIND: &str = "PivotStatus";
/// The newest `--format-version` of the status document.
pub const FORMAT_VERSION: u32 = 1;

/// The status document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Status {
    /// Always `pivot.openshift.io/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always `PivotStatus`.
    pub kind: String,
    /// The shape's version (`--format-version`): 1.
    pub version: u32,
    /// The sysroot read (`/` on a node).
    pub sysroot: String,
    /// Every deployment, in boot order.
    pub deployments: Vec<Deployment>,
    /// Pivot's record, per stateroot that has one.
    pub pivot: BTreeMap<String, PivotState>,
}

impl Status {
    /// Keeps only the booted deployment (`--booted`).
    pub fn retain_booted(&mut self) {
        self.deployments.retain(|d| d.booted);
    }
}

/// One deployment of the sysroot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Deployment {
    pub stateroot: String,
    /// The deployed commit.
    pub checksum: String,
    pub serial: i32,
    /// The commit's `version` metadata, else the image's `version` label recorded at pivot time.
    pub version: Option<String>,
    /// `host/path@sha256:…` this deployment was pivoted from, if pivot (or openshift/pivot) made
    /// it; for an ostree-native deployment (whoever made it), its image with the manifest digest.
    pub image: Option<String>,
    /// For an ostree-native deployment: the digest of the manifest its commit was made from
    /// (`ostree.manifest-digest` of the merge commit, as bootc status shows it).
    pub manifest_digest: Option<String>,
    /// For an ostree-native deployment: when the image was made (its merge commit's time), in
    /// seconds since the epoch.
    pub timestamp: Option<u64>,
    pub booted: bool,
    pub staged: bool,
    /// Staged with `--lock-finalization`: a reboot applies it only after `pivot finalize`.
    #[serde(default)]
    pub finalization_locked: bool,
    /// First in boot order: what the bootloader starts next (a staged deployment, once finalized
    /// at shutdown, goes before it).
    pub default: bool,
    /// The bootloader's next entry after the default one.
    pub rollback: bool,
    /// How the image passed the signature policy, when the origin says.
    pub verification: Option<Verification>,
    /// The OSTree remote whose keys verified the deployment's commit (pivot's `--ostree-remote`,
    /// or the remote an `ostree-remote-*` origin names).
    pub ostree_remote: Option<String>,
    /// The kernel command line of its boot entry, in order, each argument with where it came
    /// from.
    #[serde(default)]
    pub kernel_arguments: Vec<KernelArgument>,
}

/// One argument of a deployment's kernel command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KernelArgument {
    pub arg: String,
    pub source: KargSource,
    /// For `image`: the kargs.d file that lists it (`10-console.toml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// Where a kernel argument of a deployment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum KargSource {
    /// The deployment's image lists it in `/usr/lib/bootc/kargs.d`.
    Image,
    /// Pivot added it for the admin when it made this deployment (`/etc/pivot/kernel-args`,
    /// `--karg-append`).
    Admin,
    /// libostree's own (`ostree=`).
    Libostree,
    /// Carried over from the deployment this one was made from: the installer's or bootloader's,
    /// an earlier pivot's edits, `rpm-ostree kargs`.
    Carried,
}

/// How a deployment's image passed the signature policy, as its origin records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Verification {
    /// Signatures by trusted keys were verified (pivot's record, or an `ostree-image-signed:`
    /// origin).
    Signed,
    /// The policy's scope accepts the image without a signature.
    Accepted,
    /// There was no policy file when pivot pulled it.
    NoPolicy,
    /// Pulled without signature verification (an `ostree-unverified-*` origin).
    Unverified,
    /// Verified by an OSTree remote's keys (an `ostree-remote-*` origin).
    OstreeRemote,
}

impl Verification {
    /// The value as the JSON document spells it (and pivot's origins record it).
    pub fn name(self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => name,
            _ => unreachable!("a unit variant serializes to a string"),
        }
    }

    /// The value `name` spells, if it is one.
    pub fn from_name(name: &str) -> Option<Verification> {
        serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
    }
}

/// Pivot's record for one stateroot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PivotState {
    /// The pullspec from `/etc/pivot/image-pullspec` being pursued.
    pub target: Option<String>,
    /// Runs for `target` that started without the node running it yet.
    pub attempts: u32,
    /// The last run, whatever its pullspec.
    pub last: Option<Attempt>,
    /// The last `pivot rollback` on this stateroot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<Rollback>,
    /// What the last `pivot --check` found, while it is news: cleared by a check that finds
    /// none and by a pivot that ends on a target (bootc's `cachedUpdate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_update: Option<CachedUpdate>,
    /// The last health check that failed at the first boot of a target, until a later target
    /// passes its checks.
    pub health: Option<HealthFailure>,
}

/// A health check (`/etc/pivot/health.d`) that failed on a target pivot deployed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HealthFailure {
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The target's commit.
    pub commit: String,
    /// The check's file name under `/etc/pivot/health.d`.
    pub check: String,
    /// How it failed: `failed (exit status 1)`, `timed out after 300 s`, ...
    pub how: String,
    /// The end of its output (stdout and stderr), at most 2 KiB.
    pub output_tail: String,
    /// The commit pivot rolled back to, or none when it did not (it rolls back from a target
    /// once only, or there was no deployment to go back to).
    pub rolled_back_to: Option<String>,
}

/// An update `pivot --check` found available: what its manifest and config say, and what a
/// pivot to it would download.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CachedUpdate {
    /// `host/path@sha256:…`.
    pub image: String,
    /// The image's `version` label.
    pub version: Option<String>,
    /// When it was checked, in seconds since the Unix epoch.
    pub checked: u64,
    /// The digest of the platform manifest (the same as the image's, unless it names an index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// The OSTree commit the image names (its `ostree.commit` or `com.coreos.ostree-commit`
    /// label), when it names the commit that would be deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// For an ostree-native image with derived layers: the commit they apply on (the commit
    /// deployed is made at import).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// When the image was made (its config's `created`), in seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// The kernel version the image says it boots (its `ostree.linux` label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// What a pivot to it would download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<Download>,
}

/// What a pivot would download: the layers whose content the repo does not hold yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Download {
    /// Their bytes, as the manifest gives them (compressed).
    pub bytes: u64,
    /// How many layers that is.
    pub layers: u32,
    /// Of how many the image has.
    pub of_layers: u32,
    /// The image's commit is complete in the repo already (an earlier download or deployment):
    /// nothing is downloaded.
    pub commit_in_repo: bool,
}

/// `kind` of the `pivot --check --json` document.
pub const CHECK_KIND: &str = "PivotUpdateCheck";

/// The `pivot --check --json` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UpdateCheck {
    /// Always `pivot.openshift.io/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always `PivotUpdateCheck`.
    pub kind: String,
    /// The stateroot checked.
    pub stateroot: String,
    /// The commit the stateroot runs now (the booted deployment's, else its default one's).
    pub checksum: String,
    /// Its version.
    pub version: Option<String>,
    /// The update, or none when the node is at the image already.
    pub update: Option<CachedUpdate>,
    /// With `--diff`: the packages the update changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<super::diff::PackageDiff>,
    /// With `--diff`, when the packages cannot be compared (a commit that carries no package
    /// list pivot reads): why. `packages` is then absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_unknown: Option<String>,
}

/// A `pivot rollback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Rollback {
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The commit of the deployment that was the default (or about to become it).
    pub from: String,
    /// The commit of the deployment made the default.
    pub to: String,
    /// The `/etc/pivot/image-pullspec` target the rollback turned away from: the first-boot
    /// pivot does not pursue it again until the file names another one (or an admin runs
    /// `pivot` by hand).
    pub held: Option<String>,
}

/// One pivot run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Attempt {
    pub pullspec: String,
    pub source: PullspecSource,
    /// When the run started, in seconds since the Unix epoch.
    pub started: u64,
    pub outcome: Outcome,
    /// The image's manifest digest, once known.
    pub digest: Option<String>,
    /// The OSTree commit deployed, once known.
    pub commit: Option<String>,
    /// Why the run failed.
    pub error: Option<String>,
}

/// Where a run's pullspec came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PullspecSource {
    /// `/etc/pivot/image-pullspec` (first boot).
    File,
    /// The command line.
    Argument,
}

#[cfg(test)]
mod tests {
    use super::Verification::{self, *};

    #[test]
    fn verification_names_read_back_and_are_the_documents_spelling() {
        for v in [Signed, Accepted, NoPolicy, Unverified, OstreeRemote] {
            assert_eq!(Verification::from_name(&v.name()), Some(v));
        }
        assert_eq!(NoPolicy.name(), "no-policy");
        assert_eq!(OstreeRemote.name(), "ostree-remote");
        assert_eq!(Verification::from_name("trusted"), None);
    }
}
