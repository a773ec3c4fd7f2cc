//! Everything the scenarios share, built once per test run (the base OS comes from the cache):
//! the v1/v2 commits with the pivot binary under test, the v1 sysroot, and the v2 oscontainer
//! layer; on first use, v2 as an ostree-native image too. The scratch space lives in the cache directory (same filesystem as the cached repo, so
//! pulls hard-link) and is removed when the test process exits.
// unsafe: descriptors, mounts and locks of the VM harness (libc).
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use super::os_commits::{self, OsCommits};
use super::oscontainer::{self, OsLayer};
use super::qemu::Accel;
use super::{base_os, cache, disk};

pub struct Images {
    pub commits: OsCommits,
    /// A sysroot directory with v1 deployed, copied into each scenario's disk.
    pub sysroot: PathBuf,
    pub v2_layer: OsLayer,
    /// The pivot binary under test (its unstripped build, used on the host too).
    pub pivot: PathBuf,
    work: PathBuf,
    native_v2: OnceLock<Result<PathBuf, String>>,
}

impl Images {
    /// v2 as an ostree-native image, as CoreOS images are made: ostree-rs-ext's chunked
    /// encapsulation of the v2 commit (tests/ext-fixtures), an `oci:` directory. Written on first
    /// use, so only the scenarios that pull it pay for it.
    pub fn native_v2(&self) -> Result<&Path> {
        self.native_v2
            .get_or_init(|| {
                let started = Instant::now();
                let out = self.work.join("native-v2");
                let chunked = out.join("chunked");
                let layers = pivot_testkit::ext_fixtures_tool(false).and_then(|tool| {
                    pivot_testkit::encapsulate(
                        &tool,
                        &self.commits.repo,
                        os_commits::V2_REF,
                        &out,
                        Some("chunked"),
                    )?;
                    oci_layers(&chunked)
                });
                match layers {
                    Ok(layers) if layers > 2 => {
                        println!(
                            "[vm] v2 encapsulated by ostree-rs-ext (chunked, {layers} layers) in {:.0?}",
                            started.elapsed()
                        );
                        Ok(chunked)
                    }
                    Ok(layers) => Err(format!("the chunked image has {layers} layers")),
                    Err(e) => Err(format!("{e:#}")),
                }
            })
            .as_deref()
            .map_err(|e| anyhow!("encapsulating v2 as an ostree-native image failed: {e}"))
    }
}

/// Builds the images on first use; every scenario sees the same result (or the same error).
pub fn get() -> Result<&'static Images> {
    static IMAGES: OnceLock<Result<Images, String>> = OnceLock::new();
    IMAGES
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("building the VM images failed: {e}"))
}

/// The layer count of the one image in the `oci:` directory `dir`.
fn oci_layers(dir: &Path) -> Result<usize> {
    let json = |path: PathBuf| -> Result<serde_json::Value> {
        let text = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(serde_json::from_slice(&text)?)
    };
    let blob = |digest: &serde_json::Value| {
        let hex = digest.as_str().unwrap_or_default();
        dir.join("blobs/sha256")
            .join(hex.trim_start_matches("sha256:"))
    };
    let index = json(dir.join("index.json"))?;
    let manifest = json(blob(&index["manifests"][0]["digest"]))?;
    manifest["layers"]
        .as_array()
        .map(Vec::len)
        .context("the manifest has no layers")
}

fn build() -> Result<Images> {
    preflight()?;
    let started = Instant::now();
    let cache = cache::dir();
    let work = work_dir(&cache)?;
    // Decided (and printed) up front, before the long build.
    let _ = Accel::get();
    let base = base_os::get(&cache)?;
    // PIVOT_VM_PIVOT: put another build (e.g. target/release/pivot) into the images.
    let pivot = std::env::var_os("PIVOT_VM_PIVOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_pivot")));
    let step = Instant::now();
    let commits = os_commits::build(&work, &base, &pivot).context("committing v1 and v2")?;
    let sysroot = disk::deploy_v1(&work, &commits).context("deploying v1")?;
    let v2_layer = oscontainer::build_v2_layer(&work, &commits)
        .context("building the v2 oscontainer layer")?;
    println!(
        "[vm] v1 {} / v2 {}: commits, sysroot and v2 layer ({} MB) in {:.0?}; images ready after {:.0?}",
        &commits.v1[..12],
        &commits.v2[..12],
        v2_layer.size >> 20,
        step.elapsed(),
        started.elapsed()
    );
    Ok(Images {
        commits,
        sysroot,
        v2_layer,
        pivot,
        work,
        native_v2: OnceLock::new(),
    })
}

/// `<cache>/work/run-<pid>`; directories of runs whose process is gone are removed first.
fn work_dir(cache: &Path) -> Result<PathBuf> {
    let runs = cache.join("work");
    std::fs::create_dir_all(&runs)?;
    for entry in std::fs::read_dir(&runs)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("run-")
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            cache::remove_tree(&entry.path())?;
        }
    }
    let work = runs.join(format!("run-{}", std::process::id()));
    cache::remove_tree(&work)?;
    std::fs::create_dir_all(&work)?;
    WORK.set(work.clone()).ok();
    // SAFETY: registers a plain function without captures to run at process exit.
    unsafe { libc::atexit(remove_work_dir) };
    Ok(work)
}

static WORK: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_work_dir() {
    if let Some(work) = WORK.get() {
        let _ = cache::remove_tree(work);
    }
}

/// Host tools the harness needs, and the Debian packages that provide them.
const TOOLS: &[(&str, &str)] = &[
    ("/usr/sbin/debootstrap", "debootstrap"),
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    ("/usr/bin/qemu-img", "qemu-utils"),
    ("/usr/bin/extlinux", "extlinux"),
    ("/usr/lib/syslinux/mbr/mbr.bin", "syslinux-common"),
    ("/usr/lib/syslinux/modules/bios/menu.c32", "syslinux-common"),
    ("/usr/bin/socat", "socat"),
    ("/usr/bin/ostree", "ostree"),
    ("/usr/bin/objcopy", "binutils"),
    ("/usr/sbin/mkfs.ext4", "e2fsprogs"),
    ("/usr/sbin/losetup", "mount"),
    ("/usr/bin/docker-registry", "docker-registry"),
    ("/usr/bin/skopeo", "skopeo"),
    ("/usr/bin/journalctl", "systemd"),
];

fn preflight() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the VM tests need root (debootstrap, chroot, loop devices and mounts)");
    }
    let missing: Vec<String> = TOOLS
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(path, package)| format!("{path} (apt-get install {package})"))
        .collect();
    if !missing.is_empty() {
        bail!("missing host tools: {}", missing.join(", "));
    }
    Ok(())
}
