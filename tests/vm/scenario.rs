//! One scenario's run: its artefact directory, its timing, and the failure report. When a
//! scenario fails (error or panic) the report names the artefacts, which are kept, and shows the
//! console and journal lines that explain the failure; when it passes they are removed (unless
//! PIVOT_VM_KEEP=1).

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

use anyhow::Result;

use super::cache;

pub struct Scenario {
    pub name: &'static str,
    pub dir: PathBuf,
}

/// Runs `body` as scenario `name`; panics with the failure report if it fails.
pub fn run(name: &'static str, body: impl FnOnce(&Scenario) -> Result<()>) {
    hold_run_lock();
    // Two scenarios at a time (the test harness's threads permitting): an emulated guest (one
    // vCPU, see qemu.rs) keeps a core busy while it boots and leaves it idle while the harness
    // builds or reads disks, so two interleave well on two cores; the boot timeouts allow three
    // times what KVM needs. PIVOT_VM_PARALLEL=1 runs them one by one.
    let _slot = Slots::take();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("pivot-vm")
        .join(name);
    cache::remove_tree(&dir).expect("clearing the artefact directory");
    fs::create_dir_all(&dir).expect("creating the artefact directory");
    let scenario = Scenario { name, dir };
    println!(
        "[vm] scenario {name}: artefacts in {}",
        scenario.dir.display()
    );
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| body(&scenario)));
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("{e:#}")),
        Err(panic) => Some(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into()),
        ),
    };
    let elapsed = started.elapsed();
    match error {
        None => {
            // Straight to the process's stderr: the test harness captures print!, and CI's log
            // should show every scenario's time.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "[vm] scenario {name}: passed in {elapsed:.0?}"
            );
            if std::env::var_os("PIVOT_VM_KEEP").is_none() {
                let _ = cache::remove_tree(&scenario.dir);
            }
        }
        Some(error) => panic!("{}", report(&scenario, &error, elapsed)),
    }
}

/// A counting semaphore of scenario slots.
struct Slots;

static FREE: Mutex<Option<usize>> = Mutex::new(None);
static FREED: Condvar = Condvar::new();

impl Slots {
    fn take() -> Slots {
        let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
        if free.is_none() {
            let n = std::env::var("PIVOT_VM_PARALLEL")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or(2);
            *free = Some(n);
        }
        while *free == Some(0) {
            free = FREED.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free = free.map(|n| n - 1);
        Slots
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
        *free = free.map(|n| n + 1);
        FREED.notify_one();
    }
}

/// One VM test process at a time per cache: two would share artefact directories and compete
/// for the CPU their boot timeouts assume. Held until the process exits (a second run waits).
fn hold_run_lock() {
    static RUN_LOCK: OnceLock<cache::Lock> = OnceLock::new();
    RUN_LOCK.get_or_init(|| {
        cache::Lock::acquire(&cache::dir(), "vm-run").expect("taking the VM run lock")
    });
}

fn report(s: &Scenario, error: &str, elapsed: std::time::Duration) -> String {
    let mut out = format!(
        "VM scenario {} failed after {elapsed:.0?}:\n  {error}\n\nArtefacts (kept): {}\n",
        s.name,
        s.dir.display()
    );
    if let Ok(entries) = fs::read_dir(&s.dir) {
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        out += &format!("  {}\n", names.join("  "));
    }
    let console = clean(&read(&s.dir.join("console.log")));
    let alarming: Vec<&str> = console
        .lines()
        .filter(|l| {
            [
                "FAILED",
                "panic",
                "emergency",
                "rescue",
                "Error",
                "error",
                "Timed out",
                // The kernel's own alarms: what a guest that stops making progress prints.
                "BUG:",
                "WARNING:",
                "INFO:",
                "rcu:",
                "watchdog:",
                "hung_task",
            ]
            .iter()
            .any(|w| l.contains(w))
        })
        .collect();
    out += &format!(
        "\n--- console.log: failure lines (last 20) ---\n{}\n",
        last(&alarming.join("\n"), 20)
    );
    out += &format!(
        "\n--- console.log (last 25 lines) ---\n{}\n",
        last(&console, 25)
    );
    let journal = clean(&read(&s.dir.join("journal.log")));
    let telling: Vec<&str> = journal
        .lines()
        .filter(|l| {
            [
                "pivot",
                "kubelet",
                "Failed",
                "error",
                "ostree",
                "panic",
                "emergency",
            ]
            .iter()
            .any(|w| l.contains(w))
        })
        .collect();
    out += &format!(
        "\n--- journal.log: pivot, kubelet, ostree and failure lines (last 60) ---\n{}\n",
        last(&telling.join("\n"), 60)
    );
    out += &format!(
        "\n--- journal.log (last 30 lines) ---\n{}\n",
        last(&journal, 30)
    );
    out
}

fn read(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Drops terminal escape sequences (the bootloader menu draws with them) and carriage returns.
fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // CSI: parameters up to a final byte in @..~
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn last(text: &str, n: usize) -> String {
    super::cmd::tail(text, n)
}
