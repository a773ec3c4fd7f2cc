//! The two OS versions under test, committed on top of the cached base OS on every run (a few
//! seconds), because they carry the pivot binary just built:
//! - v1: base + pivot's Debian package (packaging/deb, of the pivot under test, installed with
//!   `dpkg -i` as an image builder would: its units enabled by its preset), the kubelet
//!   stand-in, the harness's agent and guest config;
//! - v2: v1 + a visible change (os-release VERSION and a marker file) and new defaults of two
//!   /etc files.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::base_os::{self, BaseOs};
use super::{cache, cmd};

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
        ("usr/etc/fstab", 0o644, include_bytes!("guest/fstab")),
        (
            "usr/etc/default/grub",
            0o644,
            include_bytes!("guest/grub-default"),
        ),
        (
            "usr/etc/grub.d/15_pivot_vm_entries",
            0o755,
            include_bytes!("guest/15_pivot_vm_entries"),
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

/// The harness's units, enabled the vendor way (links in /usr/lib), so /etc holds no harness
/// state. pivot's are enabled by its package.
const ENABLED: &[(&str, &str)] = &[
    ("multi-user.target.wants", "kubelet.service"),
    ("multi-user.target.wants", "pivot-vm-agent.service"),
    ("multi-user.target.wants", "systemd-networkd.service"),
    (
        "network-online.target.wants",
        "systemd-networkd-wait-online.service",
    ),
];

/// Debian's defaults the test OS disables, as an image builder trims what its nodes do not need:
/// e2scrub_reap runs LVM's tools at every boot, on the one emulated vCPU pivot-confirm needs,
/// and a boot that pivot ends by rebooting (a failed health check) killed it mid-run, a failed
/// unit the scenario then saw.
const DISABLED: &[&str] = &[
    "usr/etc/systemd/system/multi-user.target.wants/e2scrub_reap.service",
    "usr/etc/systemd/system/timers.target.wants/e2scrub_all.timer",
];

/// The kernel argument v2's `/usr/lib/bootc/kargs.d` lists.
pub const V2_IMAGE_KARG: &str = "pivot.vm.image=v2";

pub fn build(work: &Path, base: &BaseOs, pivot_bin: &Path) -> Result<OsCommits> {
    let repo = work.join("os-repo");
    ostree(&repo, &["init", "--mode=archive"])?;
    ostree(&repo, &["config", "set", "core.zlib-level", "1"])?;
    // Same filesystem and mode: pull-local hard-links the base objects instead of copying.
    ostree(
        &repo,
        &["pull-local", &base.repo.display().to_string(), base_os::REF],
    )?;

    let v1_dir = work.join("v1-root");
    cache::remove_tree(&v1_dir)?;
    ostree(
        &repo,
        &["checkout", base_os::REF, &v1_dir.display().to_string()],
    )?;
    for (path, mode, contents) in guest_files() {
        write(&v1_dir.join(path), mode, contents)?;
    }
    for (wants, unit) in ENABLED {
        let dir = v1_dir.join("usr/lib/systemd/system").join(wants);
        fs::create_dir_all(&dir)?;
        symlink(format!("../{unit}"), dir.join(unit))?;
    }
    for link in DISABLED {
        fs::remove_file(v1_dir.join(link)).with_context(|| format!("disabling {link}"))?;
    }
    let deb = package(work, pivot_bin)?;
    install_package(&v1_dir, &deb)?;
    let v1 = commit(&repo, V1_REF, &[&format!("dir={}", v1_dir.display())], "1")?;
    cache::remove_tree(&v1_dir)?;

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
    // The kernel argument v2 ships itself, in bootc's format.
    write(
        &v2_dir.join("usr/lib/bootc/kargs.d/10-pivot-vm.toml"),
        0o644,
        format!("kargs = [\"{V2_IMAGE_KARG}\"]\n").as_bytes(),
    )?;
    let v2 = commit(
        &repo,
        V2_REF,
        &[
            &format!("ref={V1_REF}"),
            &format!("dir={}", v2_dir.display()),
        ],
        "2",
    )?;
    Ok(OsCommits { repo, v1, v2 })
}

/// Commits `trees` (`--tree=` values: later trees win), with metadata `version`.
fn commit(repo: &Path, branch: &str, trees: &[&str], version: &str) -> Result<String> {
    let mut args = vec![
        "commit".to_string(),
        "--branch".into(),
        branch.into(),
        "--subject".into(),
        format!("pivot VM test OS {version}"),
        format!("--add-metadata-string=version={version}"),
    ];
    args.extend(trees.iter().map(|t| format!("--tree={t}")));
    let out = ostree(repo, &args.iter().map(String::as_str).collect::<Vec<_>>())?;
    Ok(out.trim().to_string())
}

/// pivot's Debian package of `pivot_bin` (packaging/deb), with the man pages and completions
/// its build wrote. The debug build is ~130 MB, nearly all debug info: the package gets it
/// stripped of that.
fn package(work: &Path, pivot_bin: &Path) -> Result<PathBuf> {
    let stripped = work.join("pivot");
    cmd::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(pivot_bin)
            .arg(&stripped),
        TIMEOUT,
    )?;
    let deb = cmd::run(
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/deb"))
            .arg("--binary")
            .arg(&stripped)
            .arg("--assets")
            .arg(concat!(env!("OUT_DIR"), "/assets"))
            .arg("--out")
            .arg(work)
            .arg("--fast"),
        TIMEOUT,
    )
    .context("building pivot's Debian package")?;
    Ok(PathBuf::from(deb.trim()))
}

/// `dpkg -i` of `deb` into the OS tree `root`, which has the OSTree layout: /etc is /usr/etc
/// and the dpkg database lives in /usr (base_os.rs), so both are linked where dpkg looks for
/// them while it runs, and /var is left empty again.
fn install_package(root: &Path, deb: &Path) -> Result<()> {
    let etc = root.join("etc");
    symlink("usr/etc", &etc)?;
    fs::create_dir_all(root.join("var/lib"))?;
    symlink("../../usr/share/dpkg/database", root.join("var/lib/dpkg"))?;
    let installed = {
        let _binds = base_os::ChrootBinds::mount(root)?;
        cmd::run(
            Command::new("dpkg")
                .arg(format!("--root={}", root.display()))
                .arg("--install")
                .arg(deb),
            TIMEOUT,
        )
    };
    fs::remove_file(&etc)?;
    cache::remove_tree(&root.join("var"))?;
    fs::create_dir(root.join("var"))?;
    installed.context("dpkg --install of pivot's package")?;
    Ok(())
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
