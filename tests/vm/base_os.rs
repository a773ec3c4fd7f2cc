//! The base OS: a small bootable Debian 12 made by debootstrap from Debian's packages, its
//! initramfs built by dracut with the project's `dracut/` configuration (generic, not
//! host-only), converted to the OSTree layout and committed to an archive repo. This is the slow
//! part of the image build (minutes), so it is cached under a key that hashes this file, the
//! dracut configuration and the package list.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::apt_source::AptSource;
use super::mounts::Mount;
use super::{cache, cmd};

/// What debootstrap installs. The kernel comes in a second step (see [`install_kernel`]).
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "ostree",
    "ostree-boot",
    "dracut",
    "kmod",
    // grub-mkconfig, which writes the UEFI guests' grub.cfg with pivot's shipped boot counter.
    "grub-common",
];
const KERNEL_PACKAGE: &str = "linux-image-amd64";
const DRACUT_CONF: &str = include_str!("../../dracut/50-pivot-ostree.conf");
/// Kernel module directories a QEMU guest with virtio disks and NICs never loads. Every megabyte
/// left out is a megabyte the guest's pivot need not pull and import under emulation.
const UNUSED_MODULES: &[&str] = &[
    "sound",
    "drivers/bluetooth",
    "drivers/comedi",
    "drivers/crypto",
    "drivers/gpu",
    "drivers/hid",
    "drivers/hwmon",
    "drivers/iio",
    "drivers/infiniband",
    "drivers/isdn",
    "drivers/md",
    "drivers/media",
    "drivers/mmc",
    "drivers/mtd",
    "drivers/net/can",
    "drivers/net/ethernet",
    "drivers/net/usb",
    "drivers/net/wireless",
    "drivers/net/wwan",
    "drivers/platform",
    "drivers/scsi",
    "drivers/staging",
    "drivers/target",
    "drivers/usb",
    "fs/btrfs",
    "fs/ceph",
    "fs/f2fs",
    "fs/gfs2",
    "fs/nfs",
    "fs/nfsd",
    "fs/ocfs2",
    "fs/smb",
    "fs/xfs",
    "lib/test_bpf.ko",
    "net/bluetooth",
    "net/ceph",
    "net/mac80211",
    "net/netfilter",
    "net/sunrpc",
    "net/wireless",
];

/// Files nothing in the tests reads: documentation, translations and udev's hardware database (a
/// VM's virtio devices need no vendor names).
const UNUSED_FILES: &[&str] = &[
    "usr/share/doc",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/man",
    "usr/lib/udev/hwdb.bin",
    "usr/lib/udev/hwdb.d",
];
pub const REF: &str = "base";
const STEP_TIMEOUT: Duration = Duration::from_secs(20 * 60);

pub struct BaseOs {
    /// An archive repo holding the base tree at [`REF`].
    pub repo: PathBuf,
}

pub fn get(cache: &Path) -> Result<BaseOs> {
    // Whitespace is left out of the key: reformatting this file does not rebuild the image.
    let source: String = include_str!("base_os.rs").split_whitespace().collect();
    let key = cache::key(&[
        source.as_bytes(),
        DRACUT_CONF.as_bytes(),
        PACKAGES.join(",").as_bytes(),
    ]);
    let started = Instant::now();
    let (dir, built) = cache::entry(cache, &format!("base-os-{key}"), |tmp| build(cache, tmp))?;
    if built {
        println!(
            "[vm] base OS built in {:.0?} (cached as {})",
            started.elapsed(),
            dir.display()
        );
    } else {
        println!("[vm] base OS: cached {}", dir.display());
    }
    Ok(BaseOs {
        repo: dir.join("repo"),
    })
}

fn build(cache: &Path, out: &Path) -> Result<()> {
    let source = AptSource::from_host()?;
    let rootfs = out.join("rootfs");
    let debs = cache.join("debs");
    fs::create_dir_all(&debs)?;
    timed("debootstrap", || debootstrap(&source, &rootfs, &debs, out))?;
    let kver = {
        let _binds = ChrootBinds::mount(&rootfs)?;
        timed("kernel", || install_kernel(&source, &rootfs, out))?;
        let kver = kernel_version(&rootfs)?;
        trim(&rootfs, &kver)?;
        timed("dracut", || build_initramfs(&rootfs, &kver, out))?;
        kver
    };
    to_ostree_layout(&rootfs, &kver)?;
    timed("ostree commit", || commit(&rootfs, &out.join("repo")))?;
    cache::remove_tree(&rootfs)?;
    Ok(())
}

fn timed<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let value = f().with_context(|| format!("base OS: {what}"))?;
    println!("[vm]   {what}: {:.0?}", started.elapsed());
    Ok(value)
}

fn debootstrap(source: &AptSource, rootfs: &Path, debs: &Path, logs: &Path) -> Result<()> {
    cmd::run_logged(
        Command::new("debootstrap")
            .arg("--variant=minbase")
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(format!("--cache-dir={}", debs.display()))
            .arg("bookworm")
            .arg(rootfs)
            .arg(&source.mirror)
            .envs(source.env()),
        &logs.join("debootstrap.log"),
        STEP_TIMEOUT,
    )
}

/// /proc, /sys and /dev inside the chroot, for apt's maintainer scripts and dracut.
pub struct ChrootBinds(Vec<Mount>);

impl ChrootBinds {
    pub fn mount(rootfs: &Path) -> Result<ChrootBinds> {
        let mut mounts = Vec::new();
        for dir in ["proc", "sys", "dev"] {
            mounts.push(Mount::bind(&Path::new("/").join(dir), &rootfs.join(dir))?);
        }
        Ok(ChrootBinds(mounts))
    }
}

impl Drop for ChrootBinds {
    fn drop(&mut self) {
        while let Some(m) = self.0.pop() {
            drop(m);
        }
    }
}

/// Installed after dracut so that dracut, not initramfs-tools, satisfies the kernel's
/// initramfs dependency (debootstrap would pick initramfs-tools, which conflicts with dracut).
/// `INITRD=No` skips the kernel hook's initramfs: [`build_initramfs`] makes the one we boot.
fn install_kernel(source: &AptSource, rootfs: &Path, logs: &Path) -> Result<()> {
    let conf = rootfs.join("usr/lib/dracut/dracut.conf.d/50-pivot-ostree.conf");
    fs::create_dir_all(conf.parent().unwrap())?;
    fs::write(&conf, DRACUT_CONF)?;
    cmd::run_logged(
        Command::new("chroot")
            .arg(rootfs)
            .args([
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                KERNEL_PACKAGE,
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("INITRD", "No")
            .envs(source.env()),
        &logs.join("kernel.log"),
        STEP_TIMEOUT,
    )
}

fn kernel_version(rootfs: &Path) -> Result<String> {
    let mut versions: Vec<String> = fs::read_dir(rootfs.join("usr/lib/modules"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    ensure!(
        versions.len() == 1,
        "expected one kernel in the image, found {versions:?}"
    );
    Ok(versions.remove(0))
}

/// A small image: before dracut, so the initramfs is small too.
fn trim(rootfs: &Path, kver: &str) -> Result<()> {
    let kernel_dir = rootfs.join("usr/lib/modules").join(kver).join("kernel");
    for dir in UNUSED_MODULES {
        cache::remove_tree(&kernel_dir.join(dir))?;
    }
    for path in UNUSED_FILES {
        cache::remove_tree(&rootfs.join(path))?;
    }
    Ok(())
}

fn build_initramfs(rootfs: &Path, kver: &str, logs: &Path) -> Result<()> {
    cmd::run(
        Command::new("chroot")
            .arg(rootfs)
            .args(["depmod", "-a", kver]),
        STEP_TIMEOUT,
    )?;
    // ostree looks for the initramfs beside the kernel: usr/lib/modules/<kver>/initramfs.img.
    cmd::run_logged(
        Command::new("chroot")
            .arg(rootfs)
            .args(["dracut", "--force"])
            .arg(format!("/usr/lib/modules/{kver}/initramfs.img"))
            .arg(kver),
        &logs.join("dracut.log"),
        STEP_TIMEOUT,
    )
}

/// The filesystem layout OSTree deploys: everything under /usr, /etc shipped as /usr/etc (merged
/// three ways on every deploy), /var empty (shared by all deployments, filled by tmpfiles.d),
/// and the top-level mutable directories as links into /var.
fn to_ostree_layout(rootfs: &Path, kver: &str) -> Result<()> {
    let r = |p: &str| rootfs.join(p);
    let modules = r("usr/lib/modules").join(kver);
    fs::rename(
        r("boot").join(format!("vmlinuz-{kver}")),
        modules.join("vmlinuz"),
    )
    .context("moving the kernel next to its modules")?;
    for dir in ["boot", "dev", "proc", "sys", "run", "tmp"] {
        empty_dir(&r(dir))?;
    }
    for link in ["vmlinuz", "vmlinuz.old", "initrd.img", "initrd.img.old"] {
        let _ = fs::remove_file(r(link));
    }
    // Nothing host- or mirror-specific stays in the image.
    fs::write(r("etc/apt/sources.list"), "")?;
    fs::write(r("etc/resolv.conf"), "")?;
    fs::write(r("etc/hostname"), "pivot-vm\n")?;
    // Empty: each machine gets its own (the disk builder writes one into the deployment).
    fs::write(r("etc/machine-id"), "")?;
    fs::write(r("etc/fstab"), "LABEL=boot /boot ext4 defaults 0 2\n")?;
    // The dpkg database describes /usr, so it lives there, where Debian-based OSTree builders
    // put it (and `pivot diff` reads it); /var/lib/dpkg links to it.
    fs::create_dir_all(r("usr/share/dpkg"))?;
    fs::rename(r("var/lib/dpkg"), r("usr/share/dpkg/database"))?;
    fs::rename(r("etc"), r("usr/etc"))?;
    cache::remove_tree(&r("var"))?;
    fs::create_dir(r("var"))?;
    for (dir, target) in [
        ("home", "var/home"),
        ("root", "var/roothome"),
        ("opt", "var/opt"),
        ("srv", "var/srv"),
        ("mnt", "var/mnt"),
        ("media", "run/media"),
    ] {
        cache::remove_tree(&r(dir))?;
        symlink(target, r(dir))?;
    }
    cache::remove_tree(&r("usr/local"))?;
    symlink("../var/usrlocal", r("usr/local"))?;
    fs::create_dir(r("sysroot"))?;
    symlink("sysroot/ostree", r("ostree"))?;
    fs::write(
        r("usr/lib/tmpfiles.d/pivot-vm-ostree-layout.conf"),
        "d /var/home 0755 root root -\n\
         d /var/roothome 0700 root root -\n\
         d /var/opt 0755 root root -\n\
         d /var/srv 0755 root root -\n\
         d /var/mnt 0755 root root -\n\
         d /var/usrlocal 0755 root root -\n\
         L /var/lib/dpkg - - - - ../../usr/share/dpkg/database\n",
    )?;
    Ok(())
}

fn empty_dir(dir: &Path) -> Result<()> {
    cache::remove_tree(dir)?;
    fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))
}

fn commit(rootfs: &Path, repo: &Path) -> Result<()> {
    let timeout = Duration::from_secs(10 * 60);
    cmd::run(
        Command::new("ostree")
            .arg(format!("--repo={}", repo.display()))
            .args(["init", "--mode=archive"]),
        timeout,
    )?;
    // A fast zlib level: this repo is written once per cold build and read on every run.
    cmd::run(
        Command::new("ostree")
            .arg(format!("--repo={}", repo.display()))
            .args(["config", "set", "core.zlib-level", "1"]),
        timeout,
    )?;
    let out = cmd::run(
        Command::new("ostree")
            .arg(format!("--repo={}", repo.display()))
            .args(["commit", "--branch", REF, "--subject", "pivot VM base OS"])
            .arg(format!("--tree=dir={}", rootfs.display())),
        timeout,
    )?;
    if out.trim().len() != 64 {
        bail!("ostree commit printed {out:?}, not a checksum");
    }
    Ok(())
}
