//! Rebooting through systemd, and the `/run/pivot/reboot-needed` flag that makes a later
//! `pivot --reboot` in the same boot reboot even when it has nothing left to change.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{ensure, Context, Result};

use crate::node::events::{self, Target};

pub const REBOOT_NEEDED: &str = "/run/pivot/reboot-needed";

pub fn mark_needed() -> Result<()> {
    mark_needed_at(Path::new(REBOOT_NEEDED))
}

/// Creates the flag `path` (mode 0600) in a directory of mode 0700.
fn mark_needed_at(path: &Path) -> Result<()> {
    crate::node::state::private_dir(path.parent().expect("the flag has a parent"))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub fn is_needed() -> bool {
    Path::new(REBOOT_NEEDED).exists()
}

/// Asks systemd for an orderly reboot, which also runs ostree-finalize-staged.
pub fn reboot(target: &Target, why: &str) -> Result<()> {
    events::info(events::REBOOTING, target, why);
    let status = std::process::Command::new("systemctl")
        .arg("reboot")
        .status()
        .context("running systemctl reboot")?;
    ensure!(status.success(), "systemctl reboot failed: {status}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_flag_is_private_to_root() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("run/pivot/reboot-needed");
        mark_needed_at(&flag).unwrap();
        mark_needed_at(&flag).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&flag), 0o600);
        assert_eq!(mode(flag.parent().unwrap()), 0o700);
    }
}
