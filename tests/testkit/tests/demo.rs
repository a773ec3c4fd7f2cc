//! pivot-demo, the README's first command, run with the real pivot binary.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pivot that `cargo test --workspace` builds beside pivot-demo.
fn real_pivot() -> PathBuf {
    let pivot = Path::new(env!("CARGO_BIN_EXE_pivot-demo")).with_file_name("pivot");
    assert!(
        pivot.exists(),
        "{} is missing: run `cargo test --workspace`, which builds it",
        pivot.display()
    );
    pivot
}

fn demo(args: &[&str]) -> Result<(i32, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_pivot-demo"))
        .args(args)
        .env("PIVOT_BIN", real_pivot())
        .env_remove("JOURNAL_STREAM")
        .output()
        .context("running pivot-demo")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.code().unwrap_or(-1), text))
}

/// The sysroot path pivot-demo printed.
fn sysroot_of(output: &str) -> Option<PathBuf> {
    let line = output.lines().find(|l| l.starts_with("sysroot:"))?;
    Some(PathBuf::from(line.split_whitespace().nth(1)?))
}

/// The `ostree commit` line pivot-demo printed for the pushed image.
fn image_commit(output: &str) -> Option<String> {
    let line = output
        .lines()
        .find(|l| l.trim_start().starts_with("ostree commit"))?;
    Some(line.split_whitespace().nth(2)?.to_string())
}

#[test]
fn demo_pivots_a_throwaway_sysroot_to_v2_and_cleans_up() -> Result<()> {
    let (code, out) = demo(&[])?;
    assert_eq!(code, 0, "{out}");
    let commit = image_commit(&out).context("no commit line")?;
    assert!(out.contains(" (default)\n"), "{out}");
    assert!(out.contains(&format!("Commit: {commit}\n")), "{out}");
    assert!(
        out.contains("Version: 2") && out.contains("(rollback)"),
        "{out}"
    );
    let sysroot = sysroot_of(&out).context("no sysroot line")?;
    assert!(!sysroot.exists(), "sysroot left behind without --keep-dir");
    Ok(())
}

#[test]
fn demo_keep_dir_leaves_the_pivoted_sysroot_for_inspection() -> Result<()> {
    let (code, out) = demo(&["--keep-dir"])?;
    assert_eq!(code, 0, "{out}");
    let sysroot = sysroot_of(&out).context("no sysroot line")?;
    let status = Command::new("ostree")
        .args(["admin", "status", "--sysroot"])
        .arg(&sysroot)
        .output()?;
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("Version: 2") && status.contains("Version: 1"),
        "{status}"
    );
    let kept_registry = out
        .lines()
        .find(|l| l.starts_with("kept registry:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(PathBuf::from)
        .context("no kept registry line")?;
    std::fs::remove_dir_all(&kept_registry)?;
    std::fs::remove_dir_all(sysroot.parent().context("sysroot parent")?)?;
    Ok(())
}
