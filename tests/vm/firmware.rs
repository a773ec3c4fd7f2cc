//! The two ways the guests boot, as nodes do:
//! - BIOS: SeaBIOS → syslinux's MBR → extlinux on /boot, reading libostree's syslinux.cfg;
//! - UEFI: OVMF (Debian's `ovmf`) → GRUB EFI (`BOOTX64.EFI`, made here with `grub-mkimage`
//!   from `grub-efi-amd64-bin`) on an ESP → /boot/grub/grub.cfg, which `grub-mkconfig` makes in
//!   the v1 OS as a node's own would be made ([`mkconfig`]): with pivot's boot counter from its
//!   package (/etc/grub.d/08_pivot_fallback_counting) and the entries script of the VM's OS
//!   (guest/15_pivot_vm_entries).
//!
//! Why GRUB reads libostree's syslinux entries (`syslinux_source`) rather than libostree's
//! grub2 backend: Debian 12's GRUB 2.06 has no `blscfg` module, and libostree's grub2 backend
//! regenerates the whole configuration with `grub-mkconfig` at every deploy (and at shutdown,
//! for a staged one), which needs `grub-probe` on the real boot devices. The syslinux backend
//! writes plain entries atomically and GRUB translates them at boot (as `blscfg` reads BLS
//! entries on Fedora), so every deployment libostree writes is an entry GRUB boots, in
//! libostree's order, and grub.cfg itself is made once. Its counter carries the boot-once
//! protocol pivot arms (src/sysroot/grubenv.rs), and its environment block lives on /boot,
//! which the guest mounts, so pivot and GRUB share it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use super::cmd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    Bios,
    Uefi,
}

pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// The ESP, appended after the root partition (partition 3, type 0xEF).
pub const ESP_SIZE: u64 = 64 * 1024 * 1024;
/// The stand-in for grub-probe while grub-mkconfig runs in the image ([`mkconfig`]).
const GRUB_PROBE: &str = include_str!("guest/grub-probe");
/// What pivot's package adds to grub.cfg: the counter's first line.
pub const COUNTER_MARK: &str = "### BEGIN /etc/grub.d/08_pivot_fallback_counting ###";
const ESP_GRUB_CFG: &str = include_str!("guest/esp-grub.cfg");
/// What GRUB EFI needs for this configuration, built into its image (no modules on the ESP).
const GRUB_MODULES: &[&str] = &[
    "part_msdos",
    "fat",
    "ext2",
    "normal",
    "configfile",
    "search",
    "search_label",
    "test",
    "echo",
    "linux",
    "loadenv",
    "syslinuxcfg",
    "serial",
    "terminal",
    "all_video",
    "reboot",
    // pivot's boot counter counts down digit by digit with it (packaging/grub).
    "regexp",
];
const TIMEOUT: Duration = Duration::from_secs(120);

/// A new environment block, as `grub-editenv create` writes it.
pub fn empty_grubenv() -> Vec<u8> {
    let mut block = b"# GRUB Environment Block\n".to_vec();
    block.resize(1024, b'#');
    block
}

/// Lays out /boot's GRUB files in `boot` (the /boot tree before it becomes a partition):
/// `grub_cfg` ([`mkconfig`]'s) and a new environment block.
pub fn write_grub_files(boot: &Path, grub_cfg: &str) -> Result<()> {
    let dir = boot.join("grub");
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("grub.cfg"), grub_cfg)?;
    fs::write(dir.join("grubenv"), empty_grubenv())?;
    Ok(())
}

/// Writes to `out` GRUB's configuration as `grub-mkconfig` makes it in the OS deployed at
/// `deployment` (its /etc/grub.d and /etc/default/grub), checked by `grub-script-check`. The image has no disk
/// yet, so in a private mount namespace grub-probe is answered by a stand-in
/// (guest/grub-probe) and /boot is an empty tmpfs: the deployment is left as it was.
pub fn mkconfig(deployment: &Path, out: &Path) -> Result<()> {
    let probe = out.with_file_name("grub-probe");
    fs::write(&probe, GRUB_PROBE)?;
    fs::set_permissions(&probe, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let script = r#"set -e
d=$1
mount --bind "$2" "$d/usr/sbin/grub-probe"
mount -t tmpfs tmpfs "$d/boot"
mkdir "$d/boot/grub"
mount --bind /dev "$d/dev"
mount -t proc proc "$d/proc"
chroot "$d" /usr/sbin/grub-mkconfig"#;
    let cfg = cmd::run(
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(deployment)
            .arg(&probe),
        TIMEOUT,
    )
    .context("running grub-mkconfig in the v1 deployment")?;
    fs::write(out, &cfg)?;
    cmd::run(Command::new("grub-script-check").arg(out), TIMEOUT)
        .context("grub-script-check of grub-mkconfig's output")?;
    anyhow::ensure!(
        cfg.contains(COUNTER_MARK) && cfg.contains("syslinux_source"),
        "grub-mkconfig wrote no boot counter or no entries:\n{cfg}"
    );
    Ok(())
}

/// The ESP image: FAT, with GRUB EFI as the removable-media loader and its stub config.
pub fn esp(scratch: &Path) -> Result<PathBuf> {
    let efi = scratch.join("BOOTX64.EFI");
    cmd::run(
        Command::new("grub-mkimage")
            .args(["-O", "x86_64-efi", "-p", "/EFI/BOOT", "-o"])
            .arg(&efi)
            .args(GRUB_MODULES),
        TIMEOUT,
    )
    .context("making GRUB's EFI image (is grub-efi-amd64-bin installed?)")?;
    let cfg = scratch.join("esp-grub.cfg");
    fs::write(&cfg, ESP_GRUB_CFG)?;
    let image = scratch.join("esp.img");
    let _ = fs::remove_file(&image);
    fs::File::create(&image)?.set_len(ESP_SIZE)?;
    let mtools = |args: &[&str]| -> Result<()> {
        cmd::run(Command::new(args[0]).args(&args[1..]), TIMEOUT)
            .map(drop)
            .with_context(|| format!("{} (is mtools installed?)", args[0]))
    };
    let img = image.display().to_string();
    mtools(&["mformat", "-i", &img, "-v", "ESP", "::"])?;
    mtools(&["mmd", "-i", &img, "::/EFI", "::/EFI/BOOT"])?;
    mtools(&[
        "mcopy",
        "-i",
        &img,
        &efi.display().to_string(),
        "::/EFI/BOOT/BOOTX64.EFI",
    ])?;
    mtools(&[
        "mcopy",
        "-i",
        &img,
        &cfg.display().to_string(),
        "::/EFI/BOOT/grub.cfg",
    ])?;
    fs::remove_file(&efi)?;
    fs::remove_file(&cfg)?;
    Ok(image)
}

/// QEMU's arguments for `firmware`; UEFI's variable store is a copy in `dir`.
pub fn qemu_args(firmware: Firmware, dir: &Path) -> Result<Vec<String>> {
    Ok(match firmware {
        Firmware::Bios => vec!["-machine".into(), "pc".into()],
        Firmware::Uefi => {
            let vars = dir.join("OVMF_VARS.fd");
            if !vars.exists() {
                fs::copy(OVMF_VARS, &vars)
                    .with_context(|| format!("copying {OVMF_VARS} (is ovmf installed?)"))?;
            }
            vec![
                "-machine".into(),
                "q35".into(),
                "-drive".into(),
                format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"),
                "-drive".into(),
                format!("if=pflash,format=raw,unit=1,file={}", vars.display()),
                // A reset powers the machine off and the harness powers it on again: OVMF under
                // TCG was seen to hang for good in a warm reset (1 in ~20), a cold boot never.
                "-no-reboot".into(),
            ]
        }
    })
}

/// An environment block as the harness reads it back (independently of pivot's writer).
#[derive(Debug)]
pub struct Grubenv(Vec<(String, String)>);

impl Grubenv {
    pub fn parse(text: &str) -> Result<Grubenv> {
        let body = text
            .strip_prefix("# GRUB Environment Block\n")
            .context("not a GRUB environment block")?;
        Ok(Grubenv(
            body.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The entry grub-mkconfig's grub.cfg boots with this block: 1 (the previous deployment) once a
    /// boot-once attempt has run out, else 0.
    pub fn next_entry(&self) -> usize {
        match (self.get("boot_success"), self.get("boot_counter")) {
            (Some("0"), Some("0" | "-1")) => 1,
            _ => 0,
        }
    }
}
