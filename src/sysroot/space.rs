//! Free-space checks made before pivot writes anything big, so that a node short of space is
//! refused early with numbers instead of failing halfway with ENOSPC:
//!
//! - **The repo**, before any layer is downloaded (skipped when the commit is already there):
//!   the objects the layers become, estimated as [`EXPANSION`] × the layers' size, plus the
//!   download spools of the layers in flight (a layer's bytes are kept from its download until
//!   it is imported, or only those since its last checkpoint, for a killed run to resume: see
//!   `crate::fetch::spools`; a layer an earlier run imported or spooled needs only the rest). When the
//!   objects fit but the spools do not, the pivot goes on without spools (a killed run then
//!   downloads again) rather than being refused: resuming is worth disk only where there is disk
//!   to spare. An oscontainer's layers hold an archive repo whose file objects are
//!   zlib-compressed (the layer compression gains little on top), while the node's bare repo stores files as they are: OS content
//!   typically inflates 2–3× through zlib, so 3× is generous without refusing what fits. Objects
//!   the repo already shares with the image are not known in advance, so they count too. The
//!   repo's own `min-free-space` reserve is subtracted from what is free.
//! - **/boot**, after the import and before deploying (only then is the kernel known): the
//!   target's kernel, initramfs and devicetree (from `/usr/lib/modules/<kver>/`), unless /boot
//!   already holds that exact set for the stateroot (same boot checksum), plus a small margin for
//!   the boot entries.
//!
//! The estimate is only that: an image that compresses better than [`EXPANSION`] can still
//! meet ENOSPC mid-import, which leaves the sysroot as it was (the transaction is dropped).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ostree::gio;
use ostree::gio::prelude::*;
use sha2::{Digest, Sha256};

use crate::sysroot::commit_files::{children, content, file_type, regular_file};

use crate::node::progress::human;
use crate::import::PARALLEL_LAYERS;

/// Bytes of objects per byte of (compressed) layer.
pub const EXPANSION: f64 = 3.0;
/// Room for the boot entries and bootloader configuration written with a new kernel.
const BOOT_MARGIN: u64 = 256 << 10;

/// Bytes the filesystem holding `path` has free for unprivileged writers (the conservative
/// count: root may also use the filesystem's reserved blocks).
pub fn free_bytes(path: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(path)
        .with_context(|| format!("reading the free space of {}", path.display()))?;
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// One layer to import: its size, how much of it a spool already holds, and whether its import
/// keeps checkpoints (then its spool only holds the bytes since the last one:
/// [`crate::import::spool_bound`]).
#[derive(Debug, Clone, Copy)]
pub struct Layer {
    pub size: u64,
    pub spooled: u64,
    pub checkpointed: bool,
}

/// What an import needs in the repo's filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// The objects the layers become.
    pub objects: u64,
    /// The most the download spools grow by at once.
    pub spools: u64,
}

/// What importing `layers` needs, at `factor` bytes of objects per byte of layer. A layer's
/// spool lives from its download to the end of its import, and layers are imported
/// [`PARALLEL_LAYERS`] at a time: the spools need at most the largest such layers' rest (or,
/// for a layer with checkpoints, what its spool holds at most).
pub fn repo_needs(layers: &[Layer], factor: f64) -> Needs {
    let total: u64 = layers.iter().map(|l| l.size).sum();
    let mut rest: Vec<u64> = layers
        .iter()
        .map(|l| {
            let rest = l.size.saturating_sub(l.spooled);
            if l.checkpointed {
                rest.min(crate::import::spool_bound(l.size))
            } else {
                rest
            }
        })
        .collect();
    rest.sort_unstable_by(|a, b| b.cmp(a));
    Needs {
        objects: (total as f64 * factor).ceil() as u64,
        spools: rest.iter().take(PARALLEL_LAYERS).sum(),
    }
}

/// Refuses an import that cannot fit in the repo's filesystem. With `spooling` (downloads kept
/// for resume), true when the spools fit beside the objects, false when only the objects do.
pub fn check_repo(
    repo: &ostree::Repo,
    repo_path: &Path,
    layers: &[Layer],
    spooling: bool,
) -> Result<bool> {
    let mut needs = repo_needs(layers, EXPANSION);
    if !spooling {
        needs.spools = 0;
    }
    let reserve = repo.min_free_space_bytes().unwrap_or(0);
    let free = free_bytes(repo_path)?.saturating_sub(reserve);
    tracing::debug!(?needs, free, reserve, "space for the import");
    if needs.objects.saturating_add(needs.spools) <= free {
        return Ok(spooling);
    }
    if needs.objects <= free {
        tracing::warn!(
            "{} free in {}: room for the image's objects (about {}), not for keeping its {} of \
             downloads as well; going on without partial downloads (a killed pivot downloads again)",
            human(free),
            repo_path.display(),
            human(needs.objects),
            human(needs.spools)
        );
        return Ok(false);
    }
    let beyond = match reserve {
        0 => String::new(),
        r => format!(" beyond the repo's min-free-space reserve of {}", human(r)),
    };
    bail!(
        "not enough space in {}: the image needs about {}, {} free{beyond}",
        repo_path.display(),
        human(needs.objects),
        human(free)
    );
}

/// Refuses a deployment whose kernel cannot be installed into `<sysroot>/boot`.
pub fn check_boot(
    sysroot: &Path,
    stateroot: &str,
    repo: &ostree::Repo,
    commit: &str,
) -> Result<()> {
    let Some(kernel) = BootFiles::of_commit(repo, commit)? else {
        tracing::debug!("no kernel under /usr/lib/modules in {commit}: /boot not checked");
        return Ok(());
    };
    let boot = sysroot.join("boot");
    if kernel.installed_in(repo, &boot, stateroot)? {
        tracing::debug!("the kernel of {commit} is already in {}", boot.display());
        return Ok(());
    }
    let needed = kernel.size() + BOOT_MARGIN;
    let free = free_bytes(&boot)?;
    tracing::debug!(needed, free, "space in /boot");
    if needed > free {
        bail!(
            "not enough space in {}: the kernel and initramfs of {commit} need about {}, {} free",
            boot.display(),
            human(needed),
            human(free)
        );
    }
    Ok(())
}

/// What libostree copies into /boot for a commit with a `/usr/lib/modules/<kver>/vmlinuz`.
struct BootFiles {
    kver: String,
    /// vmlinuz, then the initramfs and devicetree if there are: the files (and order) of
    /// libostree's boot checksum.
    files: Vec<(gio::File, u64)>,
    /// A `dtb/` directory: its checksum is not recomputed here, so the kernel is never taken
    /// as already installed.
    has_dtb_dir: bool,
}

impl BootFiles {
    /// Looks for the kernel as libostree does: the first `usr/lib/modules/*/` with a regular
    /// `vmlinuz`.
    fn of_commit(repo: &ostree::Repo, commit: &str) -> Result<Option<BootFiles>> {
        let cancellable = gio::Cancellable::NONE;
        let (root, _) = repo
            .read_commit(commit, cancellable)
            .with_context(|| format!("reading commit {commit}"))?;
        let modules = root.resolve_relative_path("usr/lib/modules");
        let Some(dirs) = children(&modules)? else {
            return Ok(None);
        };
        for (kver, kind) in dirs {
            if kind != gio::FileType::Directory {
                continue;
            }
            let dir = modules.child(&kver);
            let Some(vmlinuz) = regular_file(&dir.child("vmlinuz"))? else {
                continue;
            };
            let mut files = vec![vmlinuz];
            for name in ["initramfs.img", "initramfs"] {
                if let Some(initramfs) = regular_file(&dir.child(name))? {
                    files.push(initramfs);
                    break;
                }
            }
            let mut has_dtb_dir = false;
            if let Some(devicetree) = regular_file(&dir.child("devicetree"))? {
                files.push(devicetree);
            } else {
                has_dtb_dir = matches!(
                    file_type(&dir.child("dtb"))?,
                    Some(gio::FileType::Directory)
                );
            }
            return Ok(Some(BootFiles {
                kver,
                files,
                has_dtb_dir,
            }));
        }
        Ok(None)
    }

    fn size(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }

    /// libostree keeps each kernel under `<boot>/ostree/<stateroot>-<bootcsum>/`; the checksum
    /// (sha256 over the files in order) is computed only when a kernel of the same size is
    /// there.
    fn installed_in(&self, repo: &ostree::Repo, boot: &Path, stateroot: &str) -> Result<bool> {
        if self.has_dtb_dir {
            return Ok(false);
        }
        let prefix = format!("{stateroot}-");
        let kernel_name = format!("vmlinuz-{}", self.kver);
        let candidates: Vec<PathBuf> = std::fs::read_dir(boot.join("ostree"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .filter(|dir| {
                std::fs::metadata(dir.join(&kernel_name)).is_ok_and(|m| m.len() == self.files[0].1)
            })
            .collect();
        if candidates.is_empty() {
            return Ok(false);
        }
        let bootcsum = self.bootcsum(repo)?;
        let wanted = boot.join("ostree").join(format!("{prefix}{bootcsum}"));
        Ok(candidates.contains(&wanted))
    }

    fn bootcsum(&self, repo: &ostree::Repo) -> Result<String> {
        let mut hasher = Sha256::new();
        for (file, _) in &self.files {
            let mut input = content(repo, file)
                .with_context(|| format!("reading {}", file.uri()))?
                .into_read();
            let mut buf = vec![0; 1 << 16];
            loop {
                let n = input
                    .read(&mut buf)
                    .with_context(|| format!("reading {}", file.uri()))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_expanded_objects_and_the_downloads_in_flight_apart() {
        let layer = |size, spooled| Layer {
            size,
            spooled,
            checkpointed: false,
        };
        let layers = [layer(100, 0), layer(300, 100), layer(50, 0)];
        // 450 × 3 of objects; the two largest downloads still to come, 200 and 100 bytes, are
        // spooled at once (a layer's spool is dropped once it is imported).
        let needs = |factor| repo_needs(&layers, factor);
        assert_eq!(
            needs(3.0),
            Needs {
                objects: 1350,
                spools: 300
            }
        );
        assert_eq!(
            needs(0.0),
            Needs {
                objects: 0,
                spools: 300
            }
        );
        // A layer with checkpoints holds only the bytes since its last one.
        let big = 1 << 30;
        let checkpointed = Layer {
            size: big,
            spooled: 0,
            checkpointed: true,
        };
        let needs = repo_needs(&[checkpointed, layer(big, 0)], 0.0);
        assert_eq!(needs.spools, big + crate::import::spool_bound(big));
        assert!(crate::import::spool_bound(big) < big / 16);
    }

    #[test]
    fn free_space_is_read_from_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }
}
