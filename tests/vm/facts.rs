//! What the scenarios read about a node, live in the guest or from its saved disk, as plain data.

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::machine::Machine;

/// A deployment as `pivot status --json` lists it.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub checksum: String,
    pub version: Option<String>,
    pub image: Option<String>,
    pub booted: bool,
    pub staged: bool,
    pub default: bool,
    pub rollback: bool,
}

pub fn deployments(status: &Value) -> Result<Vec<Deployment>> {
    let list = status["deployments"]
        .as_array()
        .context("pivot status has no deployments")?;
    list.iter()
        .map(|d| {
            Ok(Deployment {
                checksum: d["checksum"]
                    .as_str()
                    .context("deployment without checksum")?
                    .to_string(),
                version: d["version"].as_str().map(str::to_string),
                image: d["image"].as_str().map(str::to_string),
                booted: d["booted"].as_bool().unwrap_or(false),
                staged: d["staged"].as_bool().unwrap_or(false),
                default: d["default"].as_bool().unwrap_or(false),
                rollback: d["rollback"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// pivot's state for the stateroot: `{target, attempts, last: {outcome, error, …}}`.
pub fn pivot_state<'v>(status: &'v Value, stateroot: &str) -> &'v Value {
    &status["pivot"][stateroot]
}

/// `pivot status --json` in the guest.
pub fn guest_status(m: &mut Machine) -> Result<Value> {
    let out = m.sh("pivot status --json")?;
    serde_json::from_str(&out).with_context(|| format!("parsing pivot status --json: {out}"))
}

/// The deployment the running system booted, `<commit>.<serial>`, from the kernel's `ostree=`
/// argument (a link under /sysroot/ostree/boot.N to the deployment directory).
pub fn booted_by_karg(m: &mut Machine) -> Result<String> {
    let out = m.sh(
        "arg=$(tr ' ' '\\n' </proc/cmdline | sed -n 's/^ostree=//p'); basename \"$(readlink -f /sysroot$arg)\"",
    )?;
    Ok(out.trim().to_string())
}

/// The deployment that is the running root, by device and inode, as libostree finds the booted
/// deployment: right even once a rollback in this boot has rewritten the links `ostree=` names.
pub fn booted_by_root(m: &mut Machine) -> Result<String> {
    let out = m.sh(
        "root=$(stat -c %d:%i /); for d in /sysroot/ostree/deploy/*/deploy/*; do \
         [ -d \"$d\" ] && [ \"$(stat -c %d:%i \"$d\")\" = \"$root\" ] && basename \"$d\"; done; true",
    )?;
    Ok(out.trim().to_string())
}

/// One line of the kubelet stand-in's record (guest/kubelet-standin).
#[derive(Debug, Clone)]
pub struct KubeletStart {
    /// Without dashes, as the journal writes boot ids.
    pub boot: String,
    pub deployment: String,
    pub version: String,
    pub uptime_us: u64,
    /// `ActiveState/Result` of pivot.service when kubelet started.
    pub pivot: String,
    /// When pivot.service's process exited (monotonic µs), 0 if it never ran.
    pub pivot_exit_us: u64,
}

pub fn kubelet_starts(text: &str) -> Result<Vec<KubeletStart>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_start)
        .collect()
}

fn parse_start(line: &str) -> Result<KubeletStart> {
    let field = |key: &str| -> Result<String> {
        let start = line
            .find(&format!("{key}="))
            .with_context(|| format!("no {key}= in kubelet record {line:?}"))?
            + key.len()
            + 1;
        let rest = &line[start..];
        Ok(match rest.strip_prefix('"') {
            Some(quoted) => quoted.split('"').next().unwrap_or("").to_string(),
            None => rest.split(' ').next().unwrap_or("").to_string(),
        })
    };
    let number = |key: &str| -> Result<u64> {
        let v = field(key)?;
        if v.is_empty() {
            return Ok(0);
        }
        v.parse()
            .with_context(|| format!("{key}={v:?} in {line:?}"))
    };
    Ok(KubeletStart {
        boot: field("boot")?.replace('-', ""),
        deployment: field("deployment")?,
        version: field("version")?,
        uptime_us: number("uptime_us")?,
        pivot: field("pivot")?,
        pivot_exit_us: number("pivot_exit_us")?,
    })
}

/// Checks that kubelet started once in `boot`, on `commit`, and only after pivot.service ended.
pub fn kubelet_started_after_pivot(
    starts: &[KubeletStart],
    boot: &str,
    commit: &str,
) -> Result<()> {
    let boot = boot.replace('-', "");
    let here: Vec<&KubeletStart> = starts.iter().filter(|s| s.boot == boot).collect();
    ensure!(
        here.len() == 1,
        "kubelet started {} times in boot {boot}: {starts:?}",
        here.len()
    );
    let s = here[0];
    ensure!(
        s.deployment.starts_with(&format!("{commit}.")),
        "kubelet ran on deployment {}, not on commit {commit}",
        s.deployment
    );
    if s.pivot.starts_with("activating") || s.pivot.starts_with("active/") {
        bail!("kubelet started while pivot.service was {}", s.pivot);
    }
    ensure!(
        s.pivot_exit_us == 0 || s.pivot_exit_us <= s.uptime_us,
        "kubelet started at {} µs, before pivot.service ended at {} µs",
        s.uptime_us,
        s.pivot_exit_us
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_records() {
        let line = "boot=b8ca8b15-71d6-4404-a322-75d43d9df09f deployment=8be4.0 version=\"12 (bookworm)\" \
                    uptime_us=27050000 pivot=inactive/success pivot_exit_us=26000000";
        let starts = kubelet_starts(line).unwrap();
        assert_eq!(starts[0].boot, "b8ca8b1571d64404a32275d43d9df09f");
        assert_eq!(starts[0].version, "12 (bookworm)");
        assert!(kubelet_started_after_pivot(
            &starts,
            "b8ca8b15-71d6-4404-a322-75d43d9df09f",
            "8be4"
        )
        .is_ok());
    }
}
