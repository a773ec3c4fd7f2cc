//! Health checks: executables under `/etc/pivot/health.d/`, greenboot's idea in pivot's own
//! directory. `pivot confirm` runs them at the first boot of a target pivot deployed, before
//! kubelet, so that a target that boots but cannot serve (its network does not come up, its
//! container runtime does not start) is rolled back instead of stranding the node
//! ([`crate::run::confirm`]).
//!
//! A check is an executable regular file (or a link to one) whose name does not start with `.`;
//! the checks run one at a time in name order, each with its own time bound, with
//! `PIVOT_TARGET_COMMIT` and `PIVOT_TARGET_IMAGE` in their environment. Exit 0 passes; anything
//! else (a non-zero status, a signal, the time bound, an exec failure) fails, and the first
//! failure ends the run: what follows cannot change the verdict. Files that are not executable
//! are skipped with a warning, as a packaging mistake must not roll back a fleet.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Relative to the system's `/etc`.
#[cfg(test)]
const HEALTH_DIR: &str = "pivot/health.d";
/// The drop-in directory of checks, under `/usr/lib/pivot` and `/etc/pivot`.
const HEALTH_D: &str = "health.d";
/// How long one check may run unless `[health] timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The end of a failed check's output kept for the state file, the journal and status.
const TAIL_BYTES: usize = 2048;

/// A check that did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The check's file name.
    pub check: String,
    /// "exited with status 1", "killed by signal 9", "timed out after 300 s", ...
    pub how: String,
    /// The end of its combined stdout and stderr, lossily decoded, trimmed.
    pub output_tail: String,
}

impl Failure {
    /// One line for the state file and the journal.
    pub fn summary(&self) -> String {
        let tail = crate::node::logging::one_line(&self.output_tail);
        if tail.is_empty() {
            format!("health check {} {}", self.check, self.how)
        } else {
            format!("health check {} {}: {tail}", self.check, self.how)
        }
    }
}

/// The checks of the system whose `/etc` is `etc`: `/usr/lib/pivot/health.d` (an image's own)
/// and `/etc/pivot/health.d` (the admin's, replacing or masking those by name; see
/// [`crate::node::drop_ins`]), in the order they run.
pub fn list(etc: &Path) -> Result<Vec<PathBuf>> {
    let mut checks = Vec::new();
    for path in crate::node::drop_ins::list(etc, HEALTH_D)? {
        // Following links, as a check may be a link into /usr.
        let Ok(meta) = std::fs::metadata(&path) else {
            tracing::warn!("skipping health check {}: a dangling link", path.display());
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if meta.permissions().mode() & 0o111 == 0 {
            tracing::warn!("skipping health check {}: not executable", path.display());
            continue;
        }
        checks.push(path);
    }
    Ok(checks)
}

/// What the checks run against.
pub struct CheckEnv {
    pub commit: String,
    pub image: String,
    pub timeout: Duration,
}

/// Runs the checks under `etc` in order; the first failure, or `None` when all pass (or there
/// are none).
pub fn run(etc: &Path, ctx: &CheckEnv) -> Result<Option<Failure>> {
    for check in list(etc)? {
        let name = check
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let started = Instant::now();
        match run_one(&check, &name, ctx)? {
            Some(failure) => return Ok(Some(failure)),
            None => tracing::info!(
                "health check {name} passed in {:.1} s",
                started.elapsed().as_secs_f64()
            ),
        }
    }
    Ok(None)
}

fn run_one(check: &Path, name: &str, ctx: &CheckEnv) -> Result<Option<Failure>> {
    // stdout and stderr into one pipe, read on a thread so a chatty check never blocks on it.
    // Close-on-exec (std's pipe is): a child another thread forks before `command` is dropped
    // must not inherit the write end, or the read below waits for that child too.
    let (reader, writer) = std::io::pipe().context("creating a pipe for a health check")?;
    let mut command = Command::new(check);
    command
        .env("PIVOT_TARGET_COMMIT", &ctx.commit)
        .env("PIVOT_TARGET_IMAGE", &ctx.image)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer.try_clone()?))
        .stderr(Stdio::from(writer))
        // Its own process group, so the time bound ends whatever it started.
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Ok(Some(Failure {
                check: name.to_string(),
                how: format!("could not be started ({e})"),
                output_tail: String::new(),
            }))
        }
    };
    drop(command);
    let (sender, collector) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(tail_of(reader)));
    let deadline = Instant::now() + ctx.timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let how = match status {
        Some(status) if status.success() => None,
        Some(status) => Some(match (status.code(), status.signal()) {
            (Some(code), _) => format!("failed (exit status {code})"),
            (None, Some(signal)) => format!("failed (killed by signal {signal})"),
            _ => format!("failed ({status})"),
        }),
        None => {
            kill_group(child.id());
            let _ = child.wait();
            Some(format!(
                "timed out after {} s",
                ctx.timeout.as_secs_f64().round()
            ))
        }
    };
    // A daemon the check left behind in another session may hold the pipe open: its output
    // is not worth waiting for.
    let output_tail = collector.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
    Ok(how.map(|how| Failure {
        check: name.to_string(),
        how,
        output_tail,
    }))
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The last [`TAIL_BYTES`] of what `reader` yields until every writer has closed.
fn tail_of(mut reader: impl Read) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * TAIL_BYTES {
                    tail.drain(..tail.len() - TAIL_BYTES);
                }
            }
        }
    }
    if tail.len() > TAIL_BYTES {
        tail.drain(..tail.len() - TAIL_BYTES);
    }
    String::from_utf8_lossy(&tail).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etc_with(checks: &[(&str, &str, u32)]) -> tempfile::TempDir {
        let etc = tempfile::tempdir().unwrap();
        let dir = etc.path().join(HEALTH_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        // Written by `install`, not by this process: a test thread that forks while this one
        // holds a script open for writing would make its exec fail with ETXTBSY.
        let sources = tempfile::tempdir().unwrap();
        for (name, script, mode) in checks {
            let source = sources.path().join(name);
            std::fs::write(&source, script).unwrap();
            let status = Command::new("install")
                .arg(format!("--mode={mode:o}"))
                .arg(&source)
                .arg(dir.join(name))
                .status()
                .unwrap();
            assert!(status.success());
        }
        etc
    }

    fn ctx(timeout: Duration) -> CheckEnv {
        CheckEnv {
            commit: "c0ffee".into(),
            image: "registry.example/os".into(),
            timeout,
        }
    }

    #[test]
    fn checks_run_in_name_order_until_the_first_failure() {
        let etc = etc_with(&[
            ("20-net", "#!/bin/sh\necho \"$PIVOT_TARGET_COMMIT\" >> \"$0.ran\"\necho no route to the API server >&2\nexit 3\n", 0o755),
            ("10-ok", "#!/bin/sh\necho ok > \"$0.ran\"\n", 0o755),
            ("30-never", "#!/bin/sh\ntouch \"$0.ran\"\n", 0o755),
            ("05-docs.txt", "not a check", 0o644),
            (".hidden", "#!/bin/sh\nexit 1\n", 0o755),
        ]);
        let failure = run(etc.path(), &ctx(Duration::from_secs(30)))
            .unwrap()
            .expect("20-net fails");
        assert_eq!(failure.check, "20-net");
        assert_eq!(failure.how, "failed (exit status 3)");
        assert_eq!(failure.output_tail, "no route to the API server");
        assert_eq!(
            failure.summary(),
            "health check 20-net failed (exit status 3): no route to the API server"
        );
        let dir = etc.path().join(HEALTH_DIR);
        assert!(dir.join("10-ok.ran").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("20-net.ran")).unwrap(),
            "c0ffee\n"
        );
        assert!(!dir.join("30-never.ran").exists(), "checks after a failure do not run");
    }

    #[test]
    fn no_directory_or_only_passing_checks_pass() {
        let etc = tempfile::tempdir().unwrap();
        assert_eq!(run(etc.path(), &ctx(Duration::from_secs(5))).unwrap(), None);
        let etc = etc_with(&[("ok", "#!/bin/sh\necho fine\n", 0o700)]);
        assert_eq!(run(etc.path(), &ctx(Duration::from_secs(5))).unwrap(), None);
    }

    #[test]
    fn a_hung_check_is_killed_with_what_it_started_at_its_time_bound() {
        // The background sleep holds the output pipe: only killing the group ends the read.
        let etc = etc_with(&[(
            "hang",
            "#!/bin/sh\necho waiting for the network\nsleep 600 &\nsleep 600\n",
            0o755,
        )]);
        // Bound long enough for a loaded machine to start the shell and reach its echo.
        let started = Instant::now();
        let failure = run(etc.path(), &ctx(Duration::from_secs(2)))
            .unwrap()
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(20));
        assert_eq!(failure.how, "timed out after 2 s");
        assert_eq!(failure.output_tail, "waiting for the network");
    }

    #[test]
    fn long_output_keeps_its_end_and_a_bad_interpreter_fails() {
        let etc = etc_with(&[(
            "loud",
            "#!/bin/sh\nseq 1 5000\necho the last line\nexit 1\n",
            0o755,
        )]);
        let failure = run(etc.path(), &ctx(Duration::from_secs(30)))
            .unwrap()
            .unwrap();
        assert!(failure.output_tail.len() <= TAIL_BYTES);
        assert!(failure.output_tail.ends_with("5000\nthe last line"));
        let etc = etc_with(&[("broken", "#!/nonexistent/interpreter\n", 0o755)]);
        let failure = run(etc.path(), &ctx(Duration::from_secs(5)))
            .unwrap()
            .unwrap();
        assert!(failure.how.starts_with("could not be started"), "{failure:?}");
    }
}
