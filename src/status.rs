//! `pivot status`: the deployments and pivot's last attempt, for people or as JSON.
//!
//! JSON shape (stable; fields may be added):
//! ```json
//! { "sysroot": "/",
//!   "deployments": [ { "stateroot": "fedora-coreos", "checksum": "<64 hex>", "serial": 0,
//!                      "version": "2" | null, "image": "host/path@sha256:…" | null,
//!                      "booted": bool, "staged": bool, "default": bool, "rollback": bool } ],
//!   "pivot": { "<stateroot>": { "target": "<pullspec>" | null, "attempts": 1,
//!              "last": { "pullspec": "…", "source": "file" | "argument", "started": <unix s>,
//!                        "outcome": "running" | "staged" | "deployed" | "unchanged" | "confirmed" | "failed",
//!                        "digest": …, "commit": …, "error": "…" | null } | null } } }
//! ```

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::deployments::{self, DeploymentInfo};
use crate::state::{State, StateFile, MAX_ATTEMPTS};

#[derive(Debug, Serialize)]
pub struct Status {
    pub sysroot: String,
    pub deployments: Vec<DeploymentInfo>,
    pub pivot: BTreeMap<String, State>,
}

pub fn read(sysroot_path: &Path) -> Result<Status> {
    let sysroot = deployments::open_sysroot(sysroot_path)?;
    let deployments = deployments::list(&sysroot)?;
    let mut pivot = BTreeMap::new();
    let mut stateroots: Vec<&str> = deployments.iter().map(|d| d.stateroot.as_str()).collect();
    stateroots.dedup();
    for stateroot in stateroots {
        let file = StateFile::for_stateroot(sysroot_path, stateroot);
        if file.path().exists() {
            pivot.insert(stateroot.to_string(), file.load()?);
        }
    }
    Ok(Status {
        sysroot: sysroot_path.display().to_string(),
        deployments,
        pivot,
    })
}

pub fn render(status: &Status) -> String {
    let mut out = String::new();
    if status.deployments.is_empty() {
        out.push_str("No deployments.\n");
    }
    for d in &status.deployments {
        let mark = if d.booted { '●' } else { ' ' };
        let flags: Vec<&str> = [
            (d.booted, "booted"),
            (d.staged, "staged"),
            (d.default, "default"),
            (d.rollback, "rollback"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect();
        let flags = if flags.is_empty() {
            String::new()
        } else {
            format!(" ({})", flags.join(", "))
        };
        let _ = writeln!(
            out,
            "{mark} {} {}.{}{flags}",
            d.stateroot, d.checksum, d.serial
        );
        let _ = writeln!(
            out,
            "    Version: {}",
            d.version.as_deref().unwrap_or("(none)")
        );
        if let Some(image) = &d.image {
            let _ = writeln!(out, "    Image:   {image}");
        }
    }
    for (stateroot, state) in &status.pivot {
        let Some(last) = &state.last else { continue };
        let _ = writeln!(
            out,
            "Last pivot ({stateroot}): {} {} from {} at {}",
            last.outcome,
            last.pullspec,
            last.source,
            format_utc(last.started)
        );
        if state.attempts > 0 {
            let _ = writeln!(
                out,
                "    Attempts: {}/{MAX_ATTEMPTS} at {}",
                state.attempts,
                state.target.as_deref().unwrap_or("?")
            );
        }
        if let Some(error) = &last.error {
            let _ = writeln!(out, "    Error:   {error}");
        }
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC` from Unix seconds (civil-from-days, proleptic Gregorian).
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting_matches_known_instants() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(1_796_050_800), "2026-11-30 15:00:00 UTC");
    }
}
