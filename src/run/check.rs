//! `pivot --check`: what a pivot would change (version, commit, creation time, kernel, bytes to
//! download after what the repo already has), from the manifest and config alone; what it found
//! is remembered for `pivot status` ([`crate::api::status::CachedUpdate`]).

use anyhow::Result;

use super::{job, Outcome, Run};
use crate::api::status::{CachedUpdate, Download};
use crate::fetch::image::OsImage;
use crate::fetch::reference::ImageRef;
use crate::import;
use crate::node::state;
use crate::sysroot::deployments;

/// The label rpm-ostree and ostree-rs-ext put the kernel version in.
const KERNEL_LABEL: &str = "ostree.linux";

impl Run<'_> {
    /// `--check`: what a pivot to `os` would change, from the manifest and config alone.
    pub(super) async fn report_update(&mut self, image: &ImageRef, os: &OsImage) -> Result<Outcome> {
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
            .enumerate()
            .filter(|&(i, _)| !have && !stored[i] && !os.repeats_earlier_layer(i))
            .map(|(_, l)| l.descriptor.size.max(0) as u64)
            .collect();
        let config: serde_json::Value = serde_json::from_str(&os.config_json).unwrap_or_default();
        let label = |key: &str| config["config"]["Labels"][key].as_str().map(str::to_string);
        self.found = Some(CachedUpdate {
            image: format!("{}@{}", image.name(), os.digest),
            version: os.version.clone(),
            checked: state::now(),
            manifest_digest: Some(os.manifest_digest.clone()).filter(|d| !d.is_empty()),
            commit: os.commit_label.clone(),
            base_commit: os.base_commit.clone(),
            timestamp: config["created"].as_str().and_then(rfc3339_seconds),
            kernel: label(KERNEL_LABEL),
            download: Some(Download {
                bytes: fetched.iter().sum(),
                layers: fetched.len() as u32,
                of_layers: os.layers.len() as u32,
                commit_in_repo: have,
            }),
        });
        Ok(Outcome::UpdateAvailable)
    }
}

/// Seconds since the epoch of an RFC 3339 time (`2026-11-30T15:00:00.123Z`,
/// `2026-11-30T16:00:00+01:00`), as image configs write `created`; None when it is not one.
fn rfc3339_seconds(text: &str) -> Option<u64> {
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let zone_at = time.find(['Z', 'z', '+', '-'])?;
    let (clock, zone) = time.split_at(zone_at);
    let clock = clock.split('.').next()?;
    let mut hms = clock.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (hms.next()??, hms.next()??, hms.next()??);
    let offset = match zone {
        "Z" | "z" => 0,
        _ => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let (oh, om) = zone[1..].split_once(':')?;
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60)
        }
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from civil (proleptic Gregorian), the inverse of status's formatting.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss - offset).ok()
}

#[cfg(test)]
mod tests {
    use super::rfc3339_seconds;

    #[test]
    fn image_creation_times_read_as_unix_seconds() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds("2000-02-29T00:00:00Z"), Some(951_782_400));
        assert_eq!(rfc3339_seconds("2026-11-30T15:00:00.123456789Z"), Some(1_796_050_800));
        assert_eq!(rfc3339_seconds("2026-11-30T16:30:00+01:30"), Some(1_796_050_800));
        assert_eq!(rfc3339_seconds("2026-11-30"), None);
        assert_eq!(rfc3339_seconds("yesterday"), None);
        assert_eq!(rfc3339_seconds("2026-13-01T00:00:00Z"), None);
    }
}
