//! `pivot status`: the deployments and pivot's last attempt, for people or as JSON. The JSON
//! document's types are [`crate::api::status`] (schema: `docs/status.schema.json`); this module
//! fills them from the sysroot and the state files, and lays them out for people.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::Result;

use crate::api::status::{
    self, Attempt, Deployment, KargSource, PivotState, PullspecSource, Status, Verification,
};
use crate::api::API_VERSION;
use crate::node::state::{self as state_file, StateFile, MAX_ATTEMPTS};
use crate::sysroot::deployments::{self, DeploymentInfo};
use crate::sysroot::kargs;

pub fn read(sysroot_path: &Path) -> Result<Status> {
    let sysroot = deployments::open_sysroot(sysroot_path)?;
    let deployments = deployments::list(&sysroot)?;
    let repo = sysroot.repo();
    let mut pivot = BTreeMap::new();
    let mut stateroots: Vec<&str> = deployments.iter().map(|d| d.stateroot.as_str()).collect();
    stateroots.dedup();
    for stateroot in stateroots {
        let file = StateFile::for_stateroot(
            sysroot_path,
            deployments::booted_stateroot(&deployments),
            stateroot,
        );
        if file.path().exists() {
            pivot.insert(stateroot.to_string(), published(file.load()?));
        }
    }
    Ok(Status {
        api_version: API_VERSION.into(),
        kind: status::KIND.into(),
        version: status::FORMAT_VERSION,
        sysroot: sysroot_path.display().to_string(),
        deployments: deployments.iter().map(|d| deployment(&repo, d)).collect(),
        pivot,
    })
}

/// A deployment as the status document shows it.
fn deployment(repo: &ostree::Repo, d: &DeploymentInfo) -> Deployment {
    Deployment {
        stateroot: d.stateroot.clone(),
        checksum: d.checksum.clone(),
        serial: d.serial,
        version: d.version.clone(),
        image: d.image.clone(),
        manifest_digest: d.manifest_digest.clone(),
        timestamp: d.timestamp,
        booted: d.booted,
        staged: d.staged,
        finalization_locked: d.finalization_locked,
        default: d.default,
        rollback: d.rollback,
        verification: d.verification,
        ostree_remote: d.ostree_remote.clone(),
        kernel_arguments: kernel_arguments(repo, d),
    }
}

/// A deployment's command line with each argument's source ([`KargSource`]): libostree's
/// `ostree=`, else the admin's where pivot recorded the admin adding it (even when the image
/// lists it too: the admin asked for it), else its image's kargs.d, else carried over.
/// Arguments are compared as bootc compares them ([`kargs::same`]).
fn kernel_arguments(repo: &ostree::Repo, d: &DeploymentInfo) -> Vec<status::KernelArgument> {
    let Some(options) = &d.options else {
        return Vec::new();
    };
    let image = crate::sysroot::kargs_d::read(repo, &d.checksum)
        .unwrap_or_else(|e| {
            tracing::debug!("kargs.d of {}: {e:#}", d.checksum);
            None
        })
        .unwrap_or_default();
    kargs::split(options)
        .into_iter()
        .map(|arg| {
            let listed = image.iter().find(|k| kargs::same(&k.arg, arg));
            let (source, file) = if kargs::is_libostrees(arg) {
                (KargSource::Libostree, None)
            } else if d.kargs_added.iter().any(|a| kargs::same(a, arg)) {
                (KargSource::Admin, None)
            } else if let Some(listed) = listed {
                (KargSource::Image, Some(listed.file.clone()))
            } else {
                (KargSource::Carried, None)
            };
            status::KernelArgument {
                arg: arg.to_string(),
                source,
                file,
            }
        })
        .collect()
}

/// The state file's record, as the status document shows it.
pub(crate) fn published(state: state_file::State) -> PivotState {
    PivotState {
        target: state.target,
        attempts: state.attempts,
        last: state.last.map(|a| Attempt {
            pullspec: a.pullspec,
            source: a.source,
            started: a.started,
            outcome: a.outcome,
            digest: a.digest,
            commit: a.commit,
            error: a.error,
        }),
        rollback: state.rollback.map(|r| status::Rollback {
            at: r.at,
            from: r.from,
            to: r.to,
            held: r.held,
        }),
        cached_update: state.cached_update,
        health: state.health.map(|h| status::HealthFailure {
            at: h.at,
            commit: h.commit,
            check: h.check,
            how: h.how,
            output_tail: h.output_tail,
            rolled_back_to: h.rolled_back_to,
        }),
    }
}

/// The human view, laid out like `rpm-ostree status`: deployments in boot order (● marks the
/// booted one), then each stateroot's last pivot.
pub fn render(status: &Status) -> String {
    let mut out = String::new();
    let shown = &status.deployments;
    if shown.is_empty() {
        out.push_str("No deployments.\n");
    } else {
        out.push_str("Deployments:\n");
    }
    for (i, d) in shown.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mark = if d.booted { '●' } else { ' ' };
        let flags: Vec<&str> = [
            (d.booted, "booted"),
            (d.staged, "staged"),
            (d.finalization_locked, "finalization locked"),
            (d.default, "default"),
            (d.rollback, "rollback"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect();
        let title = match &d.image {
            Some(image) => format!("{}{image}", crate::sysroot::deployments::ORIGIN_SCHEME),
            None => format!("{}:{}", d.stateroot, d.checksum),
        };
        let flags = match flags.is_empty() {
            true => String::new(),
            false => format!(" ({})", flags.join(", ")),
        };
        let _ = writeln!(out, "{mark} {title}{flags}");
        field(
            &mut out,
            "Version",
            d.version.as_deref().unwrap_or("(none)"),
        );
        if let Some(digest) = &d.manifest_digest {
            field(&mut out, "Digest", digest);
        }
        if let Some(timestamp) = d.timestamp {
            field(&mut out, "Timestamp", &format_utc(timestamp));
        }
        match (d.verification, &d.ostree_remote) {
            (Some(Verification::OstreeRemote), Some(remote)) => {
                field(&mut out, "Signature", &format!("ostree-remote ({remote})"))
            }
            (Some(verification), _) => field(&mut out, "Signature", &verification.name()),
            (None, _) => {}
        }
        kernel_argument_fields(&mut out, &d.kernel_arguments);
        field(&mut out, "Commit", &d.checksum);
        field(
            &mut out,
            "Stateroot",
            &format!("{} (serial {})", d.stateroot, d.serial),
        );
    }
    for (stateroot, state) in &status.pivot {
        if let Some(update) = &state.cached_update {
            let _ = writeln!(out, "\nUpdate available ({stateroot}): {}", update.image);
            update_fields(&mut out, update, None);
            field(&mut out, "Checked", &format_utc(update.checked));
        }
        if let Some(rollback) = &state.rollback {
            let _ = writeln!(
                out,
                "\nLast rollback ({stateroot}): {}",
                format_utc(rollback.at)
            );
            field(&mut out, "To", &rollback.to);
            field(&mut out, "From", &rollback.from);
            if let Some(held) = &rollback.held {
                field(&mut out, "Holding", &format!("{held} (until /etc/pivot/image-pullspec changes)"));
            }
        }
        if let Some(health) = &state.health {
            let _ = writeln!(
                out,
                "\nFailed health check ({stateroot}): {}",
                format_utc(health.at)
            );
            field(&mut out, "Check", &format!("{} {}", health.check, health.how));
            field(&mut out, "Commit", &health.commit);
            match &health.rolled_back_to {
                Some(to) => field(&mut out, "Rolled back to", to),
                None => field(&mut out, "Rolled back to", "(none: the node stays on it)"),
            }
            for line in health.output_tail.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev() {
                field(&mut out, "Output", line);
            }
        }
        let Some(last) = &state.last else { continue };
        let _ = writeln!(out, "\nLast pivot ({stateroot}): {}", last.outcome);
        let source = match last.source {
            PullspecSource::File => "from /etc/pivot/image-pullspec",
            PullspecSource::Argument => "given on the command line",
        };
        field(
            &mut out,
            "Pullspec",
            &format!("{} ({source})", last.pullspec),
        );
        field(&mut out, "Started", &format_utc(last.started));
        if let Some(digest) = &last.digest {
            field(&mut out, "Digest", digest);
        }
        if let Some(commit) = &last.commit {
            field(&mut out, "Commit", commit);
        }
        if state.attempts > 0 {
            field(
                &mut out,
                "Attempts",
                &format!(
                    "{}/{MAX_ATTEMPTS} at {}",
                    state.attempts,
                    state.target.as_deref().unwrap_or("?")
                ),
            );
        }
        if let Some(error) = &last.error {
            field(&mut out, "Error", error);
        }
    }
    out
}

/// `pivot --check`'s report, for people: the update's fields, each with what the node runs now.
pub fn render_check(check: &status::UpdateCheck) -> String {
    let mut out = String::new();
    match &check.update {
        Some(update) => {
            let _ = writeln!(out, "Update available ({}): {}", check.stateroot, update.image);
            update_fields(&mut out, update, Some(check));
            if let Some(why) = &check.packages_unknown {
                field(&mut out, "Packages", &format!("unknown: {why}"));
            }
        }
        // rpm-ostree upgrade --check's words (src/app/rpmostree-builtin-upgrade.cxx).
        None => out.push_str("No updates available.\n"),
    }
    out
}

/// What an update brings: version, commit, creation time, kernel, download size; with `now`,
/// the running version and commit beside them.
fn update_fields(out: &mut String, update: &status::CachedUpdate, now: Option<&status::UpdateCheck>) {
    let version = update.version.as_deref().unwrap_or("(none)");
    match now {
        Some(now) => field(
            out,
            "Version",
            &format!("{version} (now {})", now.version.as_deref().unwrap_or("(none)")),
        ),
        None => field(out, "Version", version),
    }
    if let Some(digest) = update.manifest_digest.as_ref().filter(|d| !update.image.ends_with(d.as_str())) {
        field(out, "Digest", digest);
    }
    let commit = match (&update.commit, &update.base_commit) {
        (Some(commit), _) => commit.clone(),
        (None, Some(base)) => format!("made at import from {base} and the derived layers"),
        (None, None) => "named by the image's repository".into(),
    };
    match now {
        Some(now) => field(out, "Commit", &format!("{commit} (now {})", now.checksum)),
        None => field(out, "Commit", &commit),
    }
    if let Some(timestamp) = update.timestamp {
        field(out, "Timestamp", &format_utc(timestamp));
    }
    match &update.kernel {
        Some(kernel) => field(out, "Kernel", kernel),
        None => field(out, "Kernel", "unknown (the image has no ostree.linux label)"),
    }
    if let Some(download) = &update.download {
        let text = match download {
            d if d.commit_in_repo => "nothing: the commit is in the repo already".to_string(),
            d => format!(
                "{} in {} of {} layer{}{}",
                crate::node::progress::human(d.bytes),
                d.layers,
                d.of_layers,
                if d.of_layers == 1 { "" } else { "s" },
                if d.layers < d.of_layers { " (the others are in the repo)" } else { "" }
            ),
        };
        field(out, "Download", &text);
    }
}

/// The arguments the image ships (by kargs.d file) and those pivot added for the admin; the
/// rest of the command line (the installer's, libostree's) is in the JSON document.
fn kernel_argument_fields(out: &mut String, args: &[status::KernelArgument]) {
    let mut files: Vec<&str> = args.iter().filter_map(|a| a.file.as_deref()).collect();
    files.sort_unstable();
    files.dedup();
    for file in files {
        let listed: Vec<&str> = args
            .iter()
            .filter(|a| a.source == KargSource::Image && a.file.as_deref() == Some(file))
            .map(|a| a.arg.as_str())
            .collect();
        field(out, "Image kargs", &format!("{} ({file})", listed.join(" ")));
    }
    let admin: Vec<&str> = args
        .iter()
        .filter(|a| a.source == KargSource::Admin)
        .map(|a| a.arg.as_str())
        .collect();
    if !admin.is_empty() {
        field(out, "Admin kargs", &admin.join(" "));
    }
}

/// A `Name: value` line, names right-aligned as rpm-ostree does.
fn field(out: &mut String, name: &str, value: &str) {
    let _ = writeln!(out, "{name:>15}: {value}");
}

/// `YYYY-MM-DD HH:MM:SS UTC` from Unix seconds (civil-from-days, proleptic Gregorian).
pub(crate) fn format_utc(secs: u64) -> String {
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

#[cfg(test)]
mod golden {
    //! The human and JSON views against files under tests/golden/ (`PIVOT_BLESS=1` rewrites them
    //! after a deliberate change; review the diff).

    use std::path::PathBuf;

    use super::*;

    fn deployment(serial: i32, version: &str, image: Option<&str>) -> Deployment {
        Deployment {
            stateroot: "fedora-coreos".into(),
            checksum: version.repeat(64 / version.len()),
            serial,
            version: Some(version.into()),
            image: image.map(str::to_string),
            manifest_digest: None,
            timestamp: None,
            booted: false,
            staged: false,
            finalization_locked: false,
            default: false,
            rollback: false,
            verification: None,
            ostree_remote: None,
            kernel_arguments: Vec::new(),
        }
    }

    /// A node that booted v2, has v3 staged after two attempts at it, and v1 as rollback.
    fn sample() -> Status {
        let mut v3 = deployment(0, "3", None);
        v3.image = Some(format!("quay.io/os/node@sha256:{}", "c".repeat(64)));
        // An ostree-native image: its merge commit records the manifest digest and the time.
        v3.manifest_digest = Some(format!("sha256:{}", "e".repeat(64)));
        v3.timestamp = Some(1_795_000_000);
        v3.staged = true;
        v3.finalization_locked = true;
        v3.verification = Some(Verification::OstreeRemote);
        v3.ostree_remote = Some("rhcos".into());
        let karg = |arg: &str, source, file: Option<&str>| status::KernelArgument {
            arg: arg.into(),
            source,
            file: file.map(str::to_string),
        };
        v3.kernel_arguments = vec![
            karg("root=UUID=6d2b", KargSource::Carried, None),
            karg("console=ttyS0,115200n8", KargSource::Image, Some("10-console.toml")),
            karg("nosmt", KargSource::Admin, None),
            karg("mitigations=auto", KargSource::Image, Some("20-cpu.toml")),
            karg("ostree=/ostree/boot.1/fedora-coreos/3/0", KargSource::Libostree, None),
        ];
        let mut v2 = deployment(0, "2", None);
        v2.image = Some(format!("quay.io/os/node@sha256:{}", "b".repeat(64)));
        v2.booted = true;
        v2.default = true;
        v2.verification = Some(Verification::Signed);
        let mut v1 = deployment(1, "1", None);
        v1.rollback = true;
        let last = Attempt {
            pullspec: "quay.io/os/node:4.15".into(),
            source: PullspecSource::File,
            started: 1_796_050_800,
            outcome: crate::api::outcome::Outcome::Failed,
            digest: Some(format!("sha256:{}", "d".repeat(64))),
            commit: None,
            error: Some(
                "pulling quay.io/os/node:4.15: fetching layer 1/2 sha256:dd…: digest mismatch"
                    .into(),
            ),
        };
        let state = PivotState {
            target: Some("quay.io/os/node:4.15".into()),
            attempts: 2,
            last: Some(last),
            rollback: Some(status::Rollback {
                at: 1_795_600_000,
                from: "4".repeat(64),
                to: "2".repeat(64),
                held: None,
            }),
            cached_update: Some(status::CachedUpdate {
                image: format!("quay.io/os/node@sha256:{}", "f".repeat(64)),
                version: Some("4".into()),
                checked: 1_796_051_000,
                manifest_digest: Some(format!("sha256:{}", "f".repeat(64))),
                commit: Some("6".repeat(64)),
                base_commit: None,
                timestamp: Some(1_796_040_000),
                kernel: Some("6.1.0-28-amd64".into()),
                download: Some(status::Download {
                    bytes: 48_234_496,
                    layers: 2,
                    of_layers: 7,
                    commit_in_repo: false,
                }),
            }),
            health: Some(status::HealthFailure {
                at: 1_795_500_000,
                commit: "5".repeat(64),
                check: "50-kubelet-deps".into(),
                how: "failed (exit status 1)".into(),
                output_tail: "crio.service: inactive\nno route to api.cluster:6443".into(),
                rolled_back_to: Some("2".repeat(64)),
            }),
        };
        Status {
            api_version: API_VERSION.into(),
            kind: status::KIND.into(),
            version: status::FORMAT_VERSION,
            sysroot: "/".into(),
            deployments: vec![v3, v2, v1],
            pivot: BTreeMap::from([("fedora-coreos".to_string(), state)]),
        }
    }

    fn check(name: &str, actual: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        if std::env::var_os("PIVOT_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, actual).unwrap();
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (PIVOT_BLESS=1 writes it)", path.display()));
        assert_eq!(actual, expected, "{} differs", path.display());
    }

    #[test]
    fn human_status_matches_golden_file() {
        check("status.txt", &render(&sample()));
    }

    #[test]
    fn booted_only_status_matches_golden_file() {
        let mut status = sample();
        status.retain_booted();
        check("status-booted.txt", &render(&status));
    }

    #[test]
    fn json_status_matches_golden_file() {
        let json = serde_json::to_string_pretty(&sample()).unwrap() + "\n";
        check("status.json", &json);
    }

    /// A file whose arguments are apart on the command line (an update appended one) gets one
    /// line, and an argument the admin added is the admin's, not under its image's file.
    #[test]
    fn each_kargs_d_file_gets_one_line_and_the_admins_are_apart() {
        let karg = |arg: &str, source, file: Option<&str>| status::KernelArgument {
            arg: arg.into(),
            source,
            file: file.map(str::to_string),
        };
        let args = [
            karg("quiet", KargSource::Image, Some("10-a.toml")),
            karg("nosmt", KargSource::Admin, None),
            karg("x=1", KargSource::Image, Some("20-b.toml")),
            karg("dyndbg=\"file x +p\"", KargSource::Image, Some("10-a.toml")),
        ];
        let mut out = String::new();
        kernel_argument_fields(&mut out, &args);
        assert_eq!(
            out,
            "    Image kargs: quiet dyndbg=\"file x +p\" (10-a.toml)\n    \
             Image kargs: x=1 (20-b.toml)\n    Admin kargs: nosmt\n"
        );
    }

    /// A program reading `pivot status --json` with the published types gets the document
    /// back, and the fields the schema requires are all there.
    #[test]
    fn the_json_document_reads_back_through_the_published_types() {
        let json = serde_json::to_string(&sample()).unwrap();
        let read: Status = serde_json::from_str(&json).unwrap();
        assert_eq!(read, sample());
        let schema = serde_json::to_value(schemars::schema_for!(Status)).unwrap();
        let document: serde_json::Value = serde_json::from_str(&json).unwrap();
        for field in schema["required"].as_array().unwrap() {
            let field = field.as_str().unwrap();
            assert!(document.get(field).is_some(), "{field} missing");
        }
    }
}
