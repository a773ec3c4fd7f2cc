//! The two OS versions under test, committed on top of the cached base OS on every run (a few
//! seconds), because they carry the pivot binary just built:
//! - v1: base + pivot, pivot.service, the kubelet stand-in, the harness's agent and guest config;
//! - v2: v1 + a visible change (os-release VERSION and a marker file) and new defaults of two
//!   /etc files.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::base_os::{self, BaseOs};
use super::cmd;

pub const V1_REF: &str = "pivot-vm/v1";
pub const V2_REF: &str = "pivot-vm/v2";
/// Contents of /usr/share/pivot-vm/release in each version.
pub const V1_RELEASE: &str = "v1";
pub const V2_RELEASE: &str = "v2";
/// os-release VERSION of v2 (v1 keeps Debian's).
pub const V2_OS_VERSION: &str = "12 (bookworm) pivot-vm v2";
const TIMEOUT: Duration = Duration::from_secs(5 * 60);

pub struct OsCommits {
    /// Archive repo with both refs (objects hard-linked from the base OS cache).
    pub repo: PathBuf,
    pub v1: String,
    pub v2: String,
}

/// (path in the image, mode, contents) of the files the harness adds to v1.
fn guest_files() -> Vec<(&'static str, u32, &'static [u8])> {
    vec![
        (
            "usr/lib/systemd/system/pivot.service",
            0o644,
            include_bytes!("../../systemd/pivot.service"),
        ),
        (
            "usr/lib/systemd/system/pivot-confirm.service",
            0o644,
            include_bytes!("../../systemd/pivot-confirm.service"),
        ),
        (
            "usr/lib/systemd/system/pivot-steady-state.service",
            0o644,
            include_bytes!("../../systemd/pivot-steady-state.service"),
        ),
        (
            "usr/lib/systemd/system/kubelet.service",
            0o644,
            include_bytes!("guest/kubelet.service"),
        ),
        (
            "usr/libexec/kubelet-standin",
            0o755,
            include_bytes!("guest/kubelet-standin"),
        ),
        (
            "usr/lib/systemd/system/pivot-vm-agent.service",
            0o644,
            include_bytes!("guest/pivot-vm-agent.service"),
        ),
        (
            "usr/libexec/pivot-vm-agent",
            0o755,
            include_bytes!("guest/pivot-vm-agent"),
        ),
        (
            "usr/lib/systemd/network/80-pivot-vm.network",
            0o644,
            include_bytes!("guest/80-pivot-vm.network"),
        ),
        (
            "usr/lib/systemd/journald.conf.d/50-pivot-vm.conf",
            0o644,
            include_bytes!("guest/50-pivot-vm-journald.conf"),
        ),
        (
            "usr/etc/containers/registries.conf",
            0o644,
            include_bytes!("guest/registries.conf"),
        ),
        ("usr/share/pivot-vm/release", 0o644, V1_RELEASE.as_bytes()),
        (ETC_UNTOUCHED, 0o644, V1_ETC_DEFAULT.as_bytes()),
        (ETC_ADMIN_EDITED, 0o644, V1_ETC_DEFAULT.as_bytes()),
    ]
}

/// Two default files in /usr/etc that v2 changes: an admin edits the second before the first
/// boot, so a three-way /etc merge gives v2's first and the admin's second.
pub const ETC_UNTOUCHED: &str = "usr/etc/pivot-vm/untouched.conf";
pub const ETC_ADMIN_EDITED: &str = "usr/etc/pivot-vm/admin-edited.conf";
pub const V1_ETC_DEFAULT: &str = "default of v1\n";
pub const V2_ETC_DEFAULT: &str = "default of v2\n";

/// Units enabled the vendor way (links in /usr/lib), so /etc holds no harness state.
const ENABLED: &[(&str, &str)] = &[
    ("multi-user.target.wants", "pivot.service"),
    ("multi-user.target.wants", "pivot-confirm.service"),
    ("multi-user.target.wants", "pivot-steady-state.service"),
    ("multi-user.target.wants", "kubelet.service"),
    ("multi-user.target.wants", "pivot-vm-agent.service"),
    ("multi-user.target.wants", "systemd-networkd.service"),
    (
        "network-online.target.wants",
        "systemd-networkd-wait-online.service",
    ),
];

pub fn build(work: &Path, base: &BaseOs, pivot_bin: &Path) -> Result<OsCommits> {
    let repo = work.join("os-repo");
    ostree(&repo, &["init", "--mode=archive"])?;
    ostree(&repo, &["config", "set", "core.zlib-level", "1"])?;
    // Same filesystem and mode: pull-local hard-links the base objects instead of copying.
    ostree(
        &repo,
        &["pull-local", &base.repo.display().to_string(), base_os::REF],
    )?;

    let v1_dir = work.join("v1-overlay");
    for (path, mode, contents) in guest_files() {
        write(&v1_dir.join(path), mode, contents)?;
    }
    let pivot = v1_dir.join("usr/bin/pivot");
    fs::create_dir_all(pivot.parent().unwrap())?;
    // The debug build is ~130 MB, nearly all debug info; the image needs none of it.
    cmd::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(pivot_bin)
            .arg(&pivot),
        TIMEOUT,
    )?;
    for (wants, unit) in ENABLED {
        let dir = v1_dir.join("usr/lib/systemd/system").join(wants);
        fs::create_dir_all(&dir)?;
        symlink(format!("../{unit}"), dir.join(unit))?;
    }
    let v1 = commit(&repo, V1_REF, base_os::REF, &v1_dir, "1")?;

    let v2_dir = work.join("v2-overlay");
    let os_release = ostree(&repo, &["cat", V1_REF, "/usr/lib/os-release"])?;
    let os_release: String = os_release
        .lines()
        .map(|l| match l.starts_with("VERSION=") {
            true => format!("VERSION=\"{V2_OS_VERSION}\"\n"),
            false => format!("{l}\n"),
        })
        .collect();
    write(
        &v2_dir.join("usr/lib/os-release"),
        0o644,
        os_release.as_bytes(),
    )?;
    write(
        &v2_dir.join("usr/share/pivot-vm/release"),
        0o644,
        V2_RELEASE.as_bytes(),
    )?;
    for file in [ETC_UNTOUCHED, ETC_ADMIN_EDITED] {
        write(&v2_dir.join(file), 0o644, V2_ETC_DEFAULT.as_bytes())?;
    }
    let v2 = commit(&repo, V2_REF, V1_REF, &v2_dir, "2")?;
    Ok(OsCommits { repo, v1, v2 })
}

/// Commits `overlay` on top of `parent_ref` (later trees win), with metadata `version`.
fn commit(
    repo: &Path,
    branch: &str,
    parent_ref: &str,
    overlay: &Path,
    version: &str,
) -> Result<String> {
    let out = ostree(
        repo,
        &[
            "commit",
            "--branch",
            branch,
            "--subject",
            &format!("pivot VM test OS {version}"),
            &format!("--add-metadata-string=version={version}"),
            &format!("--tree=ref={parent_ref}"),
            &format!("--tree=dir={}", overlay.display()),
        ],
    )?;
    Ok(out.trim().to_string())
}

pub fn ostree(repo: &Path, args: &[&str]) -> Result<String> {
    cmd::run(
        Command::new("ostree")
            .arg(format!("--repo={}", repo.display()))
            .args(args),
        TIMEOUT,
    )
}

fn write(path: &Path, mode: u32, contents: &[u8]) -> Result<()> {
    fs::create_dir_all(path.parent().unwrap())?;
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}
