//! `pivot --check`: what a pivot would change (version, commit, bytes to download after what
//! the repo already has), from the manifest and config alone; what it found is remembered for
//! `pivot status`.

use anyhow::Result;

use super::{job, Outcome, Run};
use crate::fetch::image::OsImage;
use crate::fetch::reference::ImageRef;
use crate::import;
use crate::node::state;
use crate::sysroot::deployments;

impl Run<'_> {
    /// `--check`: what a pivot to `os` would change, on stdout, from the manifest and config alone.
    pub(super) async fn report_update(&mut self, image: &ImageRef, os: &OsImage) -> Result<Outcome> {
        self.found = Some(state::CachedUpdate {
            image: format!("{}@{}", image.name(), os.digest),
            version: os.version.clone(),
            checked: state::now(),
        });
        let (sysroot, target) = (self.opts.sysroot.clone(), os.clone());
        let (have, stored) = tokio::task::spawn_blocking(move || -> Result<(bool, Vec<bool>)> {
            let repo = deployments::open_sysroot(&sysroot)?.repo();
            let commit = target.commit_label.as_deref();
            let have = commit.is_some_and(|c| import::verify_complete(&repo, c).is_ok());
            let stored = (0..target.layers.len())
                .map(|i| Ok(job::stored_layer(&repo, &target, i)?.is_some()))
                .collect::<Result<_>>()?;
            Ok((have, stored))
        })
        .await??;
        let fetched: Vec<u64> = os
            .layers
            .iter()
            .zip(&stored)
            .filter(|(_, stored)| !have && !**stored)
            .map(|(l, _)| l.descriptor.size.max(0) as u64)
            .collect();
        let bytes: u64 = fetched.iter().sum();
        let current = &self.local.current;
        println!("update available: {}", image.pinned_or_tagged());
        println!(
            "  version: {} (now {})",
            os.version.as_deref().unwrap_or("unknown"),
            current.version.as_deref().unwrap_or("unknown")
        );
        let commit = match (&os.commit_label, &os.base_commit) {
            (Some(c), _) => c.clone(),
            (None, Some(base)) => format!("made from {base} and the derived layers"),
            (None, None) => "named by the image's repository".into(),
        };
        println!("  commit:  {commit} (now {})", current.checksum);
        let reused = stored.iter().filter(|s| **s).count();
        println!(
            "  download: {} in {} layer(s){}",
            crate::node::progress::human(bytes),
            fetched.len(),
            if have {
                ", the commit is already in the repo".to_string()
            } else if reused > 0 {
                format!(", {reused} layer(s) already in the repo")
            } else {
                String::new()
            }
        );
        Ok(Outcome::UpdateAvailable)
    }
}
