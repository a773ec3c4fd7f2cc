//! Going back: the deployment before the one that runs becomes the default again, as
//! `rpm-ostree rollback` does it, by rewriting the boot order (libostree's
//! `write_deployments`); nothing is deleted, so a rollback can itself be rolled back.
//!
//! Which deployment is "the one that runs" and which is "before" it:
//! - on the booted system with an update pending (staged, or written ahead of the booted
//!   deployment), rolling back undoes the update: the booted deployment stays the default and
//!   the staged one is dropped;
//! - otherwise the next deployment of the same stateroot after the booted one (on a sysroot that
//!   is not booted: after the default one) becomes the default, and the old default follows it.

use anyhow::{Context, Result};
use ostree::gio;
use ostree::gio::prelude::FileExt;
use ostree::glib::prelude::ObjectType;

use crate::sysroot::deploy::SysrootLock;

/// What a rollback changed, as commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledBack {
    pub stateroot: String,
    /// The deployment that was (or was about to become) the default.
    pub from: String,
    /// The deployment that is the default now.
    pub to: String,
    /// Whether the sysroot is the running system (a reboot then starts `to`).
    pub booted: bool,
    /// The /etc of `to`, as it will boot.
    pub to_etc: std::path::PathBuf,
}

/// One deployment as the order computation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot<'a> {
    stateroot: &'a str,
    booted: bool,
    staged: bool,
}

/// The boot order after a rollback, as indexes into `slots` (boot order), and the indexes of
/// the deployment left (`from`) and the one that is the default now (`to`).
fn rolled_back_order(slots: &[Slot]) -> Result<(Vec<usize>, usize, usize), String> {
    let reference = slots.iter().position(|s| s.booted).unwrap_or(0);
    let Some(current) = slots.get(reference) else {
        return Err("the sysroot has no deployments".into());
    };
    // An update pending in front of the booted deployment: undo it.
    if reference > 0 {
        let order = std::iter::once(reference)
            .chain((0..slots.len()).filter(|&i| i != reference && !slots[i].staged))
            .collect();
        return Ok((order, 0, reference));
    }
    let Some(previous) = (reference + 1..slots.len()).find(|&i| {
        slots[i].stateroot == current.stateroot && !slots[i].staged
    }) else {
        return Err(format!(
            "no deployment to roll back to: stateroot {} has only the one that {}",
            current.stateroot,
            if current.booted { "runs" } else { "is the default" }
        ));
    };
    let order = std::iter::once(previous)
        .chain((0..slots.len()).filter(|&i| i != previous && !slots[i].staged))
        .collect();
    Ok((order, reference, previous))
}

/// Makes the previous deployment the default (see the module docs). Holds the sysroot lock.
pub fn rollback(sysroot: &ostree::Sysroot) -> Result<RolledBack> {
    let _lock = SysrootLock::acquire(sysroot)?;
    sysroot
        .load(gio::Cancellable::NONE)
        .context("loading the sysroot")?;
    let deployments = sysroot.deployments();
    let booted_now = sysroot.booted_deployment();
    let names: Vec<String> = deployments.iter().map(|d| d.osname().to_string()).collect();
    let slots: Vec<Slot> = deployments
        .iter()
        .zip(&names)
        .map(|(d, name)| Slot {
            stateroot: name,
            booted: booted_now.as_ref().is_some_and(|b| b.equal(d)),
            staged: d.is_staged(),
        })
        .collect();
    let (order, from, to) = rolled_back_order(&slots).map_err(anyhow::Error::msg)?;
    // The same objects, not copies: libostree 2022.7 finds the booted deployment in the new
    // list by pointer (and ostree::Deployment's inherent `clone` is ostree_deployment_clone).
    let booted = sysroot.booted_deployment();
    let new: Vec<ostree::Deployment> = order
        .iter()
        .map(|&i| Clone::clone(&deployments[i]))
        .collect();
    let describe = |list: &[ostree::Deployment]| {
        list.iter()
            .map(|d| {
                let booted = booted.as_ref().is_some_and(|b| b.as_ptr() == d.as_ptr());
                format!(
                    "{}:{}.{}{}",
                    d.osname(),
                    &d.csum()[..12],
                    d.deployserial(),
                    if booted { " (booted)" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    sysroot
        .write_deployments(&new, gio::Cancellable::NONE)
        .with_context(|| {
            format!(
                "writing the boot order [{}] (was [{}])",
                describe(&new),
                describe(&deployments)
            )
        })?;
    // The finalization lock of the staged deployment just dropped would otherwise outlive it
    // and keep a deployment staged later in this boot from ever being written.
    if booted.is_some() && slots.iter().any(|s| s.staged) {
        match std::fs::remove_file(crate::sysroot::deployments::STAGED_LOCKED) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| {
                    format!("removing {}", crate::sysroot::deployments::STAGED_LOCKED)
                })
            }
            _ => {}
        }
    }
    let root = sysroot.path().path().unwrap_or_default();
    let to_etc = root
        .join(sysroot.deployment_dirpath(&deployments[to]).as_str())
        .join("etc");
    Ok(RolledBack {
        to_etc,
        stateroot: names[to].clone(),
        from: deployments[from].csum().to_string(),
        to: deployments[to].csum().to_string(),
        booted: sysroot.booted_deployment().is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(stateroot: &str, booted: bool, staged: bool) -> Slot<'_> {
        Slot {
            stateroot,
            booted,
            staged,
        }
    }

    #[test]
    fn the_previous_deployment_of_the_stateroot_becomes_the_default() {
        // Not booted: default (0) and its predecessor (1) swap; the other OS stays where it was.
        let slots = [
            slot("os", false, false),
            slot("other", false, false),
            slot("os", false, false),
        ];
        assert_eq!(rolled_back_order(&slots), Ok((vec![2, 0, 1], 0, 2)));
        // Booted default with a rollback.
        let slots = [slot("os", true, false), slot("os", false, false)];
        assert_eq!(rolled_back_order(&slots), Ok((vec![1, 0], 0, 1)));
    }

    #[test]
    fn a_pending_update_is_undone_and_a_staged_one_dropped() {
        let slots = [
            slot("os", false, true),
            slot("os", true, false),
            slot("os", false, false),
        ];
        assert_eq!(rolled_back_order(&slots), Ok((vec![1, 2], 0, 1)));
        // Written ahead of the booted one (not staged): kept, behind it.
        let slots = [slot("os", false, false), slot("os", true, false)];
        assert_eq!(rolled_back_order(&slots), Ok((vec![1, 0], 0, 1)));
    }

    #[test]
    fn nothing_to_roll_back_to_is_an_error_naming_the_stateroot() {
        let slots = [slot("os", true, false), slot("other", false, false)];
        let err = rolled_back_order(&slots).unwrap_err();
        assert!(err.contains("stateroot os has only the one that runs"), "{err}");
        assert!(rolled_back_order(&[]).is_err());
    }
}
