//! Rebooting through systemd, and the `/run/pivot/reboot-needed` flag that makes a later
//! `pivot --reboot` in the same boot reboot even when it has nothing left to change.

use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::events::{self, Target};

pub const REBOOT_NEEDED: &str = "/run/pivot/reboot-needed";

pub fn mark_needed() -> Result<()> {
    let path = Path::new(REBOOT_NEEDED);
    std::fs::create_dir_all(path.parent().unwrap())
        .and_then(|_| std::fs::write(path, b""))
        .with_context(|| format!("writing {REBOOT_NEEDED}"))
}

pub fn is_needed() -> bool {
    Path::new(REBOOT_NEEDED).exists()
}

/// Asks systemd for an orderly reboot, which also runs ostree-finalize-staged.
pub fn reboot(target: &Target) -> Result<()> {
    events::info(
        events::REBOOTING,
        target,
        "rebooting into the new deployment",
    );
    let status = std::process::Command::new("systemctl")
        .arg("reboot")
        .status()
        .context("running systemctl reboot")?;
    ensure!(status.success(), "systemctl reboot failed: {status}");
    Ok(())
}
