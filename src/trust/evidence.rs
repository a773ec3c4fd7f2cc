//! The signatures an image was judged on, as fetched: kept with a `--download-only` download
//! so that its later deployment is judged again, under the policy in force then, without the
//! registry (`/var/lib/pivot/downloads/<digest>.json` of the stateroot). A kind of signature not
//! looked up at download time counts as none found, so a policy tightened since can only
//! refuse what the kept signatures do not satisfy; pivot then asks the registry afresh.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::sigstore::Attached;

pub const API_VERSION: &str = "pivot.openshift.io/v1";
pub const KIND: &str = "DownloadSignatures";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    /// Simple-signing signatures from the lookaside store (None: not looked up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simple: Option<Vec<Blob>>,
    /// Sigstore signatures (attached in the registry, or from the lookaside store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigstore: Option<Vec<Attached>>,
    /// Where the signatures were looked for, for refusals that find none.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One signature as stored (base64 in the file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob(#[serde(with = "super::sigstore::b64")] pub Vec<u8>);

/// The file a download's signatures are kept in.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    pub api_version: String,
    pub kind: String,
    /// The image as it was pulled (the identity the signatures were judged for).
    pub image: String,
    /// The manifest digest the signatures vouch for.
    pub manifest_digest: String,
    pub evidence: Evidence,
}

/// Where the signatures of download `digest` are kept, in the stateroot's pivot state
/// directory `state_dir` ([`crate::node::state::dir`]).
pub fn path(state_dir: &Path, digest: &str) -> PathBuf {
    state_dir
        .join("downloads")
        .join(format!("{}.json", digest.replace(':', "-")))
}

impl Kept {
    /// Writes the file atomically (a new file, then a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().context("a download record path has a directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self)?;
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }

    /// The kept signatures, None when there is no file (a download by an older pivot).
    pub fn load(path: &Path) -> Result<Option<Kept>> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let kept: Kept = serde_json::from_slice(&bytes)
                    .with_context(|| format!("reading {}", path.display()))?;
                anyhow::ensure!(
                    kept.api_version == API_VERSION && kept.kind == KIND,
                    "{} is not a {KIND} of {API_VERSION}",
                    path.display()
                );
                Ok(Some(kept))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
}
