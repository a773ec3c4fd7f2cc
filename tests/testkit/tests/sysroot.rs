use anyhow::Result;
use pivot_testkit::{TestSysroot, Tree};
use std::fs;

#[test]
fn sysroot_has_one_real_deployment_with_kargs() -> Result<()> {
    let tree = Tree::fixture("os-v1")?;
    let sysroot = TestSysroot::new("pivot-test", &tree, "1", &["console=ttyS0", "pivot.test=1"])?;
    let root = sysroot.path.clone();

    let status = sysroot.admin_status()?;
    let deployments: Vec<&str> = status
        .lines()
        .filter(|l| l.contains(&format!("pivot-test {}.", sysroot.commit_v1())))
        .collect();
    assert_eq!(deployments.len(), 1, "{status}");

    let entries = sysroot.boot_entries()?;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (name, conf) = &entries[0];
    assert!(name.ends_with(".conf"));
    assert!(
        conf.contains("options console=ttyS0 pivot.test=1 ostree="),
        "{conf}"
    );
    assert!(conf.contains("title Pivot Test OS 1"), "{conf}");

    let dep = sysroot.deployment_path(0)?;
    assert!(dep.starts_with(&root));
    assert_eq!(
        fs::read_to_string(dep.join("etc/hostname"))?,
        "pivot-test\n"
    );
    assert!(fs::read_to_string(dep.join("etc/os-release"))?.contains("VERSION=\"1\""));
    assert!(sysroot.deployment_path(1).is_err());

    let snap = sysroot.snapshot()?;
    assert_eq!(snap, sysroot.snapshot()?);
    assert!(
        snap.contains(&format!("refspec={}", sysroot.commit_v1())),
        "{snap}"
    );

    drop(sysroot);
    assert!(!root.exists(), "sysroot dir left behind");
    Ok(())
}

#[test]
fn drop_clears_immutable_deployments() -> Result<()> {
    let sysroot = TestSysroot::new("pivot-test", &Tree::fixture("os-v1")?, "1", &[])?;
    let root = sysroot.path.clone();
    let dep = sysroot.deployment_path(0)?;
    // What libostree does without mutable-deployments; skip where the fs lacks the bit.
    let status = std::process::Command::new("chattr")
        .arg("+i")
        .arg(&dep)
        .status()?;
    if status.success() {
        assert!(fs::write(dep.join("probe"), "x").is_err());
    }
    drop(sysroot);
    assert!(!root.exists(), "sysroot dir left behind");
    Ok(())
}

#[test]
fn snapshot_shows_what_a_user_sees() -> Result<()> {
    let sysroot = TestSysroot::new("demo", &Tree::fixture("os-v2")?, "2", &["quiet"])?;
    let snap = sysroot.snapshot()?;
    for part in [
        "== ostree admin status",
        "== boot/loader/entries/",
        "== ostree refs",
        "== repo objects: ",
        "== ostree/deploy/demo/deploy",
        "== origin ",
        "title Pivot Test OS 2",
    ] {
        assert!(snap.contains(part), "missing {part:?} in\n{snap}");
    }
    if std::env::var_os("PIVOT_TESTKIT_SHOW").is_some() {
        println!("{snap}");
    }
    Ok(())
}
