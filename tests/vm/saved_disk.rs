//! The disk after the guest powered off, read on the host: converted to raw, its partitions
//! mounted read-only through loop devices (root, with /boot mounted on it, and a separate /var
//! beside it when the disk has one), so the OSTree sysroot can be inspected with `ostree admin
//! status`, `pivot status --sysroot` and the bootloader files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::cmd;
use super::disk::{self, BOOT_OFFSET, BOOT_SIZE, OSTREE_ENV, ROOT_OFFSET, ROOT_SIZE, STATEROOT};
use super::mounts::Mount;

const TIMEOUT: Duration = Duration::from_secs(120);

pub struct SavedDisk {
    // Unmounted in reverse order: /var and /boot first.
    var: Option<Mount>,
    boot: Option<Mount>,
    root: Option<Mount>,
    raw: PathBuf,
}

impl SavedDisk {
    pub fn open(qcow2: &Path, scratch: &Path) -> Result<SavedDisk> {
        let raw = scratch.join("saved-disk.raw");
        cmd::run(
            Command::new("qemu-img")
                .args(["convert", "-O", "raw"])
                .arg(qcow2)
                .arg(&raw),
            TIMEOUT,
        )
        .context("converting the saved disk")?;
        let root = Mount::partition(
            &raw,
            ROOT_OFFSET,
            ROOT_SIZE,
            &scratch.join("saved-root"),
            true,
        )?;
        let boot = Mount::partition(
            &raw,
            BOOT_OFFSET,
            BOOT_SIZE,
            &root.path().join("boot"),
            true,
        )?;
        let var = match disk::var_partition(&raw)? {
            Some((offset, size)) => Some(Mount::partition(
                &raw,
                offset,
                size,
                &scratch.join("saved-var"),
                true,
            )?),
            None => None,
        };
        Ok(SavedDisk {
            var,
            boot: Some(boot),
            root: Some(root),
            raw,
        })
    }

    pub fn sysroot(&self) -> &Path {
        self.root.as_ref().unwrap().path()
    }

    /// The /var the guest booted with: a separate /var partition, or the stateroot's shared
    /// /var.
    pub fn var(&self) -> PathBuf {
        match &self.var {
            Some(var) => var.path().to_path_buf(),
            None => self.stateroot_var(),
        }
    }

    /// The stateroot's /var on the root filesystem (with a separate /var, what nothing mounts).
    pub fn stateroot_var(&self) -> PathBuf {
        self.sysroot()
            .join("ostree/deploy")
            .join(STATEROOT)
            .join("var")
    }

    pub fn read(&self, path: &str) -> Result<String> {
        let full = self.sysroot().join(path);
        std::fs::read_to_string(&full)
            .with_context(|| format!("reading {} on the saved disk", path))
    }

    pub fn ostree_admin_status(&self) -> Result<String> {
        cmd::run(
            Command::new("ostree")
                .args(["admin", "status"])
                .arg(format!("--sysroot={}", self.sysroot().display()))
                .env(OSTREE_ENV.0, OSTREE_ENV.1),
            TIMEOUT,
        )
    }

    /// The .origin file of the one deployment of `commit` on [`STATEROOT`].
    pub fn origin(&self, commit: &str) -> Result<String> {
        let dir = self
            .sysroot()
            .join("ostree/deploy")
            .join(STATEROOT)
            .join("deploy");
        let found: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.starts_with(&format!("{commit}.")) && name.ends_with(".origin")
            })
            .collect();
        anyhow::ensure!(
            found.len() == 1,
            "expected one origin of {commit} on the saved disk, found {found:?}"
        );
        std::fs::read_to_string(&found[0])
            .with_context(|| format!("reading {}", found[0].display()))
    }

    /// `pivot status --json` of the host's pivot binary on this sysroot.
    pub fn pivot_status(&self, pivot: &Path) -> Result<serde_json::Value> {
        let out = cmd::run(
            Command::new(pivot)
                .args(["status", "--json", "--sysroot"])
                .arg(self.sysroot())
                .env_remove("JOURNAL_STREAM"),
            TIMEOUT,
        )?;
        serde_json::from_str(&out).context("parsing pivot status --json")
    }

    /// What extlinux reads: /boot/syslinux/syslinux.cfg, through ostree's symlinks.
    pub fn syslinux_cfg(&self) -> Result<String> {
        self.read("boot/syslinux/syslinux.cfg")
    }

    /// Boot ids in the persistent journal, oldest first.
    pub fn journal_boots(&self) -> Result<Vec<String>> {
        let out = self.journalctl(&["--list-boots", "--no-pager"])?;
        // "IDX BOOT ID FIRST ENTRY LAST ENTRY"
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|id| id.len() == 32)
            .map(str::to_string)
            .collect())
    }

    /// One boot's journal, `boot_id` with or without dashes.
    pub fn journal(&self, boot_id: &str) -> Result<String> {
        self.journalctl(&[
            "-b",
            &boot_id.replace('-', ""),
            "-o",
            "short-monotonic",
            "--no-pager",
        ])
    }

    fn journalctl(&self, args: &[&str]) -> Result<String> {
        cmd::run(
            Command::new("journalctl")
                .arg("-D")
                .arg(self.var().join("log/journal"))
                .args(args),
            TIMEOUT,
        )
    }
}

impl Drop for SavedDisk {
    fn drop(&mut self) {
        drop(self.var.take());
        drop(self.boot.take());
        drop(self.root.take());
        let _ = std::fs::remove_file(&self.raw);
    }
}
