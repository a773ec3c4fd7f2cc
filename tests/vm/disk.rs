//! The bootable disk: v1 deployed by libostree (the `ostree admin` CLI) into a sysroot directory
//! once per run, then, per scenario, a copy of it with that scenario's /etc edits (what Ignition
//! would write before the first boot) laid out as an MBR disk: p1 /boot (ext4, read by extlinux
//! or GRUB), p2 the root filesystem, for UEFI p3 the ESP (see firmware.rs), and converted to
//! qcow2.
//!
//! With [`EtcEdits::separate_var`], `/var` is a partition of its own after those (ext4, label
//! `var`), as Fedora CoreOS and RHCOS allow: v1's /etc/fstab mounts it, so systemd mounts it over
//! the deployment's `/var` at boot (ostree-system-generator then makes no `var.mount` of its
//! own), and the stateroot's `/var` on the root filesystem is left as the image had it, read by
//! nothing. The partition starts as a copy of that `/var`.
//!
//! The bootloader reads what libostree writes: /boot/syslinux/syslinux.cfg links to
//! ../loader/syslinux.cfg, which ostree's syslinux backend rewrites on every deploy (and which
//! `ostree-finalize-staged` rewrites in the guest at shutdown).

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::firmware::{self, Firmware};
use super::mounts::Mount;
use super::os_commits::{OsCommits, V1_REF};
use super::{cache, cmd};

pub const STATEROOT: &str = "debian";
pub const KARGS: &[&str] = &["root=LABEL=root", "rw", "console=ttyS0,115200n8"];
const MIB: u64 = 1024 * 1024;
pub const BOOT_OFFSET: u64 = MIB;
pub const BOOT_SIZE: u64 = 384 * MIB;
pub const ROOT_OFFSET: u64 = BOOT_OFFSET + BOOT_SIZE;
const DISK_SIZE: u64 = 6 * 1024 * MIB;
pub const ROOT_SIZE: u64 = DISK_SIZE - ROOT_OFFSET;
/// The size of a separate `/var` ([`EtcEdits::separate_var`]), after the root (and the ESP).
const VAR_SIZE: u64 = 1024 * MIB;
/// The label of a separate `/var`, which its fstab line names.
pub const VAR_LABEL: &str = "var";
/// That fstab line.
const VAR_FSTAB: &str = "# /var on a partition of its own, as Fedora CoreOS and RHCOS allow.\nLABEL=var /var ext4 defaults 0 2\n";
const SYSLINUX_MODULES: &str = "/usr/lib/syslinux/modules/bios";
const MBR_CODE: &str = "/usr/lib/syslinux/mbr/mbr.bin";
const TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// Without it libostree marks deployments immutable and the work directory cannot be removed.
pub const OSTREE_ENV: (&str, &str) = ("OSTREE_SYSROOT_DEBUG", "mutable-deployments");

/// ostree's syslinux backend keeps the lines before its entries. `SERIAL` puts the bootloader on
/// the serial console; menu.c32 parses ostree's labels, which contain spaces (plain ldlinux would
/// append the extra words to the kernel command line).
const SYSLINUX_HEADER: &str = "SERIAL 0 115200\nUI menu.c32\nPROMPT 0\nTIMEOUT 10\n";

/// A sysroot directory with v1 deployed on [`STATEROOT`].
pub fn deploy_v1(work: &Path, commits: &OsCommits) -> Result<PathBuf> {
    let sysroot = work.join("sysroot");
    fs::create_dir_all(&sysroot)?;
    let s = format!("--sysroot={}", sysroot.display());
    let repo = format!("--repo={}", sysroot.join("ostree/repo").display());
    ostree(&["admin", "init-fs", &sysroot.display().to_string()])?;
    ostree(&["admin", "os-init", &s, STATEROOT])?;
    // A plain directory is no bootloader ostree can detect: name it.
    ostree(&[&repo, "config", "set", "sysroot.bootloader", "syslinux"])?;
    // /sysroot mounted read-only, as Fedora CoreOS, RHCOS and anaconda's installs have it
    // (ostree-prepare-root reads it at every boot); /boot is read-only too (guest/fstab).
    ostree(&[&repo, "config", "set", "sysroot.readonly", "true"])?;
    let boot = sysroot.join("boot");
    fs::create_dir_all(boot.join("loader.0"))?;
    fs::create_dir_all(boot.join("syslinux"))?;
    symlink("loader.0", boot.join("loader"))?;
    symlink("../loader/syslinux.cfg", boot.join("syslinux/syslinux.cfg"))?;
    fs::write(boot.join("loader.0/syslinux.cfg"), SYSLINUX_HEADER)?;
    for module in ["menu.c32", "libutil.c32", "libcom32.c32"] {
        fs::copy(
            Path::new(SYSLINUX_MODULES).join(module),
            boot.join("syslinux").join(module),
        )
        .with_context(|| format!("copying {module} (is syslinux-common installed?)"))?;
    }
    ostree(&[
        &repo,
        "pull-local",
        &commits.repo.display().to_string(),
        V1_REF,
    ])?;
    let mut deploy = vec![
        "admin".to_string(),
        "deploy".into(),
        s,
        format!("--os={STATEROOT}"),
    ];
    deploy.extend(KARGS.iter().map(|k| format!("--karg={k}")));
    deploy.push(V1_REF.into());
    ostree(&deploy.iter().map(String::as_str).collect::<Vec<_>>())?;
    // The UEFI disks' grub.cfg, made once in the deployment, beside the sysroot.
    firmware::mkconfig(&deployment_dir(&sysroot)?, &grub_cfg_path(&sysroot))?;
    Ok(sysroot)
}

/// Where [`deploy_v1`] keeps grub-mkconfig's grub.cfg for the UEFI disks of `sysroot`.
fn grub_cfg_path(sysroot: &Path) -> PathBuf {
    sysroot.with_file_name("grub.cfg")
}

fn ostree(args: &[&str]) -> Result<String> {
    cmd::run(
        Command::new("ostree")
            .args(args)
            .env(OSTREE_ENV.0, OSTREE_ENV.1),
        TIMEOUT,
    )
}

/// What a scenario puts into v1's /etc before the first boot, and the origin v1 was deployed
/// with if not `ostree admin deploy`'s.
#[derive(Default)]
pub struct EtcEdits {
    /// (path relative to /etc, contents)
    pub files: Vec<(String, String)>,
    /// The deployment's .origin file, replacing the one naming the ref v1 was deployed from.
    pub origin: Option<String>,
    /// Paths of `files` made executable (mode 0755).
    pub executables: Vec<String>,
    /// `/var` on a partition of its own, mounted by v1's /etc/fstab (see the module).
    pub separate_var: bool,
}

impl EtcEdits {
    pub fn file(mut self, path: &str, contents: &str) -> Self {
        self.files.push((path.to_string(), contents.to_string()));
        self
    }

    /// An executable file, such as a health check.
    pub fn executable(mut self, path: &str, contents: &str) -> Self {
        self.executables.push(path.to_string());
        self.file(path, contents)
    }

    pub fn origin(mut self, contents: &str) -> Self {
        self.origin = Some(contents.to_string());
        self
    }

    /// `/var` on a partition of its own (see the module).
    pub fn separate_var(mut self) -> Self {
        self.separate_var = true;
        self
    }
}

/// Builds `qcow2` from a copy of `sysroot` with `edits` applied to the deployment's /etc.
pub fn build(
    sysroot: &Path,
    edits: &EtcEdits,
    firmware: Firmware,
    scratch: &Path,
    qcow2: &Path,
) -> Result<()> {
    let copy = scratch.join("sysroot");
    cache::remove_tree(&copy)?;
    cmd::run(
        Command::new("cp").arg("-a").arg(sysroot).arg(&copy),
        TIMEOUT,
    )?;
    let deployment = deployment_dir(&copy)?;
    if let Some(origin) = &edits.origin {
        fs::write(format!("{}.origin", deployment.display()), origin)?;
    }
    let etc = deployment.join("etc");
    // Each machine its own id, written where the first boot would otherwise create one.
    fs::write(etc.join("machine-id"), format!("{}\n", random_hex(16)?))?;
    for (path, contents) in &edits.files {
        let file = etc.join(path);
        fs::create_dir_all(file.parent().unwrap())?;
        fs::write(&file, contents).with_context(|| format!("writing {}", file.display()))?;
        if edits.executables.contains(path) {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&file, fs::Permissions::from_mode(0o755))?;
        }
    }
    if edits.separate_var {
        let fstab = etc.join("fstab");
        let mut text = fs::read_to_string(&fstab).context("reading v1's /etc/fstab")?;
        text.push_str(VAR_FSTAB);
        fs::write(&fstab, text)?;
    }
    // The separate /var's contents: the stateroot's /var as the image has it, which stays on
    // the root filesystem too.
    let var = scratch.join("var");
    cache::remove_tree(&var)?;
    if edits.separate_var {
        cmd::run(
            Command::new("cp")
                .arg("-a")
                .arg(copy.join("ostree/deploy").join(STATEROOT).join("var"))
                .arg(&var),
            TIMEOUT,
        )?;
    }
    // /boot becomes its own partition: the root filesystem keeps an empty mount point.
    let boot = scratch.join("boot");
    cache::remove_tree(&boot)?;
    fs::rename(copy.join("boot"), &boot)?;
    fs::create_dir(copy.join("boot"))?;
    if firmware == Firmware::Uefi {
        let grub_cfg = fs::read_to_string(grub_cfg_path(sysroot))?;
        firmware::write_grub_files(&boot, &grub_cfg)?;
    }

    let raw = scratch.join("disk.raw");
    let _ = fs::remove_file(&raw);
    let esp = match firmware {
        Firmware::Bios => None,
        Firmware::Uefi => Some(firmware::esp(scratch)?),
    };
    let var_offset = DISK_SIZE + esp.as_ref().map_or(0, |_| firmware::ESP_SIZE);
    let size = var_offset + if edits.separate_var { VAR_SIZE } else { 0 };
    fs::File::create(&raw)?.set_len(size)?;
    if let Some(esp) = &esp {
        let mut out = fs::OpenOptions::new().write(true).open(&raw)?;
        out.seek(SeekFrom::Start(DISK_SIZE))?;
        std::io::copy(&mut fs::File::open(esp)?, &mut out)?;
        fs::remove_file(esp)?;
    }
    mkfs(
        &raw,
        ROOT_OFFSET,
        ROOT_SIZE,
        &["-L", "root", "-d", &copy.display().to_string()],
    )?;
    if edits.separate_var {
        mkfs(
            &raw,
            var_offset,
            VAR_SIZE,
            &["-L", VAR_LABEL, "-d", &var.display().to_string()],
        )?;
    }
    // syslinux 6.04 cannot read ext4 with 64bit or metadata_csum.
    mkfs(
        &raw,
        BOOT_OFFSET,
        BOOT_SIZE,
        &["-L", "boot", "-O", "^64bit,^metadata_csum"],
    )?;
    {
        // Filled through a mount, not `mkfs -d`: mkfs -d leaves zero blocks as holes, and
        // extlinux then fails to load the kernel ("I/O error").
        let mount = Mount::partition(
            &raw,
            BOOT_OFFSET,
            BOOT_SIZE,
            &scratch.join("boot-mnt"),
            false,
        )?;
        cmd::run(
            Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", boot.display()))
                .arg(mount.path()),
            TIMEOUT,
        )?;
        cmd::run(
            Command::new("extlinux")
                .arg("--install")
                .arg(mount.path().join("syslinux")),
            TIMEOUT,
        )?;
    }
    let var_partition = edits.separate_var.then_some((var_offset, VAR_SIZE));
    write_mbr(&raw, esp.is_some(), var_partition)?;
    cmd::run(
        Command::new("qemu-img")
            .args(["convert", "-O", "qcow2"])
            .arg(&raw)
            .arg(qcow2),
        TIMEOUT,
    )?;
    fs::remove_file(&raw)?;
    cache::remove_tree(&copy)?;
    cache::remove_tree(&boot)?;
    cache::remove_tree(&var)?;
    Ok(())
}

/// The one deployment directory of [`STATEROOT`] in a freshly deployed sysroot.
fn deployment_dir(sysroot: &Path) -> Result<PathBuf> {
    let dir = sysroot.join("ostree/deploy").join(STATEROOT).join("deploy");
    let found: Vec<PathBuf> = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    ensure!(
        found.len() == 1,
        "expected one deployment in {}, found {found:?}",
        dir.display()
    );
    Ok(found[0].clone())
}

fn mkfs(raw: &Path, offset: u64, size: u64, args: &[&str]) -> Result<()> {
    cmd::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .args(args)
            .arg("-E")
            .arg(format!("offset={offset}"))
            .arg(raw)
            .arg(format!("{}k", size / 1024)),
        TIMEOUT,
    )
    .map(drop)
}

/// syslinux's MBR boot code and a DOS partition table: p1 (active) /boot, p2 root, with `esp`
/// p3 the EFI system partition, and with `var` (offset, size) a separate /var after them.
fn write_mbr(raw: &Path, esp: bool, var: Option<(u64, u64)>) -> Result<()> {
    let code = fs::read(MBR_CODE).with_context(|| format!("reading {MBR_CODE}"))?;
    let mut mbr = [0u8; 512];
    mbr[..440].copy_from_slice(&code[..440]);
    let mut partitions = vec![
        (true, 0x83, BOOT_OFFSET, BOOT_SIZE),
        (false, 0x83, ROOT_OFFSET, ROOT_SIZE),
    ];
    if esp {
        partitions.push((false, 0xef, DISK_SIZE, firmware::ESP_SIZE));
    }
    if let Some((offset, size)) = var {
        partitions.push((false, 0x83, offset, size));
    }
    for (i, (active, kind, offset, size)) in partitions.into_iter().enumerate() {
        let e = &mut mbr[446 + 16 * i..446 + 16 * (i + 1)];
        e[0] = if active { 0x80 } else { 0 };
        // CHS fields saturated: everything reads the LBA fields.
        e[1..4].copy_from_slice(&[0xfe, 0xff, 0xff]);
        e[4] = kind;
        e[5..8].copy_from_slice(&[0xfe, 0xff, 0xff]);
        e[8..12].copy_from_slice(&u32::try_from(offset / 512)?.to_le_bytes());
        e[12..16].copy_from_slice(&u32::try_from(size / 512)?.to_le_bytes());
    }
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    let mut file = fs::OpenOptions::new().write(true).open(raw)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&mbr)?;
    Ok(())
}

/// The separate /var of the raw disk `raw` ([`EtcEdits::separate_var`]), as (offset, size): the
/// Linux partition after the root filesystem, if the partition table has one.
pub fn var_partition(raw: &Path) -> Result<Option<(u64, u64)>> {
    let mut mbr = [0u8; 512];
    fs::File::open(raw)?.read_exact(&mut mbr)?;
    Ok((0..4).find_map(|i| {
        let e = &mbr[446 + 16 * i..446 + 16 * (i + 1)];
        let sectors = |at: usize| u64::from(u32::from_le_bytes(e[at..at + 4].try_into().unwrap()));
        let (offset, size) = (sectors(8) * 512, sectors(12) * 512);
        (e[4] == 0x83 && offset >= DISK_SIZE).then_some((offset, size))
    }))
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex::encode(buf))
}
