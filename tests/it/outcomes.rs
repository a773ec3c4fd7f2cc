//! How runs end, as programs read it: the same outcome in the state file (through `pivot status
//! --json`) and at the end of the `--progress-fd` stream, for every way a run can end; and a
//! run that cannot record its attempt does not reboot.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;

const FD: i32 = 200;

/// Runs pivot with `args` and the progress stream on fd 200; returns its output and the
/// stream's last event.
fn run_with_progress(env: &Env, args: &[&str]) -> (Output, serde_json::Value) {
    let path = env.dir().join("progress.jsonl");
    let file = std::fs::File::create(&path).unwrap();
    let fd = file.as_raw_fd();
    let mut cmd = env.command(&[&["--progress-fd", &FD.to_string()], args].concat());
    pass_fd(&mut cmd, fd, FD);
    let out = crate::common::checked(cmd.output().unwrap());
    let text = read(&path);
    let last = text.lines().last().unwrap_or_else(|| panic!("no events"));
    (out, serde_json::from_str(last).unwrap())
}

/// The last run's outcome as `pivot status --json` reads it from the state file.
fn recorded(env: &Env) -> serde_json::Value {
    env.status_json()["pivot"][STATEROOT]["last"]["outcome"].clone()
}

fn write_pullspec_file(env: &Env, pullspec: &str) {
    let etc = env.default_etc();
    std::fs::create_dir_all(etc.join("pivot")).unwrap();
    std::fs::write(etc.join("pivot/image-pullspec"), format!("{pullspec}\n")).unwrap();
}

#[test]
fn every_outcome_reads_the_same_in_the_state_status_and_progress_stream() {
    let env = Env::new();
    let v2 = env.push_v2();
    let mut seen = Vec::new();
    let mut expect = |out: &Output, done: &serde_json::Value, outcome: &str, recorded: bool| {
        assert_eq!(done["event"], "done", "{done}");
        assert_eq!(done["outcome"], outcome, "{}", stderr(out));
        if recorded {
            assert_eq!(self::recorded(&env), outcome);
        }
        seen.push(outcome.to_string());
    };

    // A check of a newer image: no "running" at its end.
    let (out, done) = run_with_progress(&env, &["--check", &v2.by_tag]);
    expect(&out, &done, "update-available", false);
    // Downloaded, then deployed from the download.
    let (out, done) = run_with_progress(&env, &["--download-only", &v2.by_digest]);
    assert_success(&out);
    expect(&out, &done, "downloaded", true);
    let (out, done) = run_with_progress(&env, &[&v2.by_digest]);
    assert_success(&out);
    expect(&out, &done, "deployed", true);
    // Again: nothing to do; a check at target says the same.
    let (out, done) = run_with_progress(&env, &[&v2.by_digest]);
    expect(&out, &done, "unchanged", true);
    let (out, done) = run_with_progress(&env, &["--check", &v2.by_digest]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    expect(&out, &done, "unchanged", false);
    // A failure.
    let missing = format!("{}/pivot/os:missing", env.registry.host());
    let (out, done) = run_with_progress(&env, &[&missing]);
    assert_eq!(out.status.code(), Some(1));
    expect(&out, &done, "failed", true);

    // `confirmed`: the node runs what a pullspec-file run deployed. (`staged` needs a booted
    // system: the VM scenarios read it; `running` is what a killed run leaves: the crash tests.)
    write_pullspec_file(&env, &v2.by_digest);
    let (out, done) = run_with_progress(&env, &[]);
    expect(&out, &done, "confirmed", true);

    // Every value the status documents, but those only a booted system or a kill produce, and
    // `rolled-back`, which only `pivot confirm` records (tests/it/health.rs).
    let mut documented: Vec<String> = pivot::api::outcome::Outcome::ALL
        .iter()
        .map(|o| o.to_string())
        .filter(|o| o != "staged" && o != "running" && o != "rolled-back")
        .collect();
    documented.sort();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, documented);
}

/// A read-only bind mount of a directory over itself, undone when dropped: a state directory
/// even root cannot write.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> ReadOnly {
        std::fs::create_dir_all(dir).unwrap();
        let run = |args: &[&str]| {
            let status = std::process::Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .status()
                .unwrap();
            assert!(status.success(), "mount {args:?}");
        };
        run(&["--bind"]);
        let guard = ReadOnly(dir.to_path_buf());
        run(&["-o", "remount,ro,bind"]);
        guard
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_run_that_cannot_record_its_attempt_deploys_but_does_not_reboot() {
    let env = Env::new();
    let v2 = env.push_v2();
    write_pullspec_file(&env, &v2.by_tag);
    let state_dir = env
        .sysroot
        .path
        .join(format!("ostree/deploy/{STATEROOT}/var/lib/pivot"));
    let _ro = ReadOnly::mount(&state_dir);

    let out = env.pivot(&["--reboot"]);
    assert_fails_with(
        &out,
        &[
            "not rebooting: this attempt could not be recorded",
            "Read-only file system",
            "reboot loop",
        ],
    );
    // It deployed: the record is what keeps a reboot from looping, not the deployment.
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    assert!(
        stderr(&out).contains("could not record the attempt"),
        "{}",
        stderr(&out)
    );
}
