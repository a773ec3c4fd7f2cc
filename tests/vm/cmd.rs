//! Running host tools with a deadline: a hung tool fails the test instead of hanging CI, and its
//! output ends up in the error.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Runs `cmd` to completion within `timeout`; returns its stdout. A non-zero exit is an error
/// that carries the command line and the end of its stderr.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<String> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait(&mut child, timeout, &what);
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let status = status?;
    if !status.success() {
        bail!("{what} failed ({status}):\n{}", tail(&stderr, 30));
    }
    Ok(stdout)
}

/// Like [`run`], with stdout and stderr going to `log` (long, chatty tools like debootstrap).
pub fn run_logged(cmd: &mut Command, log: &Path, timeout: Duration) -> Result<()> {
    let what = describe(cmd);
    let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let status = wait(&mut child, timeout, &what)?;
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        bail!(
            "{what} failed ({status}); end of {}:\n{}",
            log.display(),
            tail(&text, 30)
        );
    }
    Ok(())
}

fn wait(child: &mut Child, timeout: Duration, what: &str) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for {what}"))?
        {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not finish within {timeout:?}; killed it");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    let line = parts.join(" ");
    if line.chars().count() > 300 {
        format!("`{}…`", line.chars().take(300).collect::<String>())
    } else {
        format!("`{line}`")
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
