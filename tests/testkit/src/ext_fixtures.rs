//! ostree-native images from an independent producer: ostree-rs-ext's encapsulation, run by the
//! `ext-fixtures` tool (tests/ext-fixtures, its own cargo workspace, built on first use under
//! target/ext-fixtures), and skopeo, which pushes the `oci:` directories it writes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

/// pivot's checkout (this crate lives in tests/testkit).
fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the ext-fixtures tool (`release`: optimised, for benchmarks) and returns its path.
pub fn ext_fixtures_tool(release: bool) -> Result<PathBuf> {
    let root = project_root();
    let target = root.join("target/ext-fixtures");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet"])
        .args(release.then_some("--release"))
        .arg("--manifest-path")
        .arg(root.join("tests/ext-fixtures/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .context("running cargo for tests/ext-fixtures")?;
    ensure!(status.success(), "building tests/ext-fixtures failed");
    Ok(target
        .join(if release { "release" } else { "debug" })
        .join("ext-fixtures"))
}

/// Runs `tool` on the commit `rev` of the OSTree repo `repo`: `oci:` directories under `out`
/// (all three, or only `only`), returned as (name, manifest digest).
pub fn encapsulate(
    tool: &Path,
    repo: &Path,
    rev: &str,
    out: &Path,
    only: Option<&str>,
) -> Result<Vec<(String, String)>> {
    let output = Command::new(tool)
        .arg(repo)
        .arg(rev)
        .arg(out)
        .args(only)
        .output()
        .with_context(|| format!("running {}", tool.display()))?;
    if !output.status.success() {
        bail!(
            "ext-fixtures failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8(output.stdout)?
        .lines()
        .map(|l| {
            let (name, digest) = l
                .split_once(' ')
                .with_context(|| format!("ext-fixtures printed {l:?}, not NAME DIGEST"))?;
            Ok((name.to_string(), digest.to_string()))
        })
        .collect()
}

/// Pushes the `oci:` directory `dir` to `dest` (`host/repository:tag` on a plain-HTTP
/// registry) with skopeo; returns the manifest digest as pushed.
pub fn skopeo_push(dir: &Path, dest: &str) -> Result<String> {
    let scratch = tempfile::tempdir()?;
    let digest_file = scratch.path().join("digest");
    let output = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false", "--digestfile"])
        .arg(&digest_file)
        .arg(format!("oci:{}", dir.display()))
        .arg(format!("docker://{dest}"))
        .output()
        .context("running skopeo")?;
    ensure!(
        output.status.success(),
        "skopeo copy of {} to {dest} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(std::fs::read_to_string(&digest_file)?.trim().to_string())
}

/// Asks ostree-rs-ext about a repo or sysroot (`query`, `prepare`, `import`, `deploy`: see
/// tests/ext-fixtures), the judge of the store pivot leaves for rpm-ostree and bootc; its JSON
/// answer. `registries_conf` names the plain-HTTP test registry insecure for skopeo's proxy.
pub fn ext_judge(tool: &Path, args: &[&str], registries_conf: &Path) -> Result<serde_json::Value> {
    let output = Command::new(tool)
        .args(args)
        .env("CONTAINERS_REGISTRIES_CONF", registries_conf)
        .envs(crate::pivot_test_env())
        .output()
        .with_context(|| format!("running {}", tool.display()))?;
    ensure!(
        output.status.success(),
        "ext-fixtures {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).with_context(|| format!("ext-fixtures printed {stdout:?}"))
}
