//! A booted VM as the scenarios see it: QEMU plus the command channel, with every boot tracked by
//! its boot id and timed, and the base checks run after each boot.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::agent::{Agent, Output};
use super::checks;
use super::firmware::Firmware;
use super::qemu::{Accel, Paths, Qemu};

/// One boot of the machine, as announced by the guest agent.
#[derive(Clone, Debug)]
pub struct Boot {
    /// 1 for the first boot of this machine.
    pub n: usize,
    pub id: String,
    /// From power-on (or the reboot before it) to the agent's hello.
    pub secs: f64,
}

pub struct Machine {
    qemu: Qemu,
    agent: Agent,
    /// How QEMU was started, to start it again after a UEFI guest's reset (see firmware.rs).
    launch: Launch,
    paths: Paths,
    dir: PathBuf,
    accel: Accel,
    pub boots: Vec<Boot>,
    /// When the boot being waited for started: power-on, or the previous boot's reboot.
    since: Instant,
    /// Console length (bytes) when that boot started: only newer text is checked.
    console_mark: usize,
    /// Units this scenario expects to fail (e.g. pivot.service when the registry is down).
    pub expected_failures: Vec<&'static str>,
}

/// QEMU's arguments, kept for a cold restart.
struct Launch {
    disk: PathBuf,
    firmware: Firmware,
    registry_port: u16,
    forwards: Vec<(String, u16)>,
}

impl Machine {
    /// Powers on a VM booting `disk`; logs and sockets go to `dir`.
    pub fn start(dir: &Path, disk: &Path, registry_port: u16) -> Result<Machine> {
        Machine::start_forwarding(dir, disk, Firmware::Bios, registry_port, &[])
    }

    /// [`Machine::start`], with more guest addresses forwarded to host loopback ports.
    pub fn start_forwarding(
        dir: &Path,
        disk: &Path,
        firmware: Firmware,
        registry_port: u16,
        forwards: &[(&str, u16)],
    ) -> Result<Machine> {
        let accel = Accel::get();
        let paths = Paths::new(dir);
        let (qemu, stream) = Qemu::start(disk, &paths, registry_port, forwards, accel, firmware)?;
        let agent = Agent::new(stream)?;
        let launch = Launch {
            disk: disk.to_path_buf(),
            firmware,
            registry_port,
            forwards: forwards.iter().map(|(g, p)| (g.to_string(), *p)).collect(),
        };
        Ok(Machine {
            qemu,
            agent,
            launch,
            paths,
            dir: dir.to_path_buf(),
            accel,
            boots: Vec::new(),
            since: Instant::now(),
            console_mark: 0,
            expected_failures: Vec::new(),
        })
    }

    /// A timeout scaled for the accelerator (`secs` is what KVM needs).
    pub fn scaled(&self, secs: u64) -> Duration {
        Duration::from_secs(secs * u64::from(self.accel.slowdown()))
    }

    pub fn boot(&self) -> &Boot {
        self.boots.last().expect("the machine has booted")
    }

    /// Waits for the next boot (a boot id not seen before) to bring up its agent. Fails early
    /// on a panic or emergency shell on the console, or when QEMU exits.
    pub fn wait_boot(&mut self, timeout: Duration) -> Result<Boot> {
        self.wait_boot_past(None, timeout)
    }

    fn wait_boot_past(&mut self, broken: Option<&str>, timeout: Duration) -> Result<Boot> {
        let deadline = Instant::now() + timeout;
        let mut broken_seen = false;
        let mut restart_seen = false;
        loop {
            if let Some(status) = self.qemu.exited()? {
                // A UEFI guest's reset ends QEMU (-no-reboot): power it on again.
                ensure!(
                    self.launch.firmware == Firmware::Uefi && status.success(),
                    "QEMU exited ({status}) while waiting for boot {}",
                    self.boots.len() + 1
                );
                self.power_on_again()?;
                continue;
            }
            let console = self.console_since(self.console_mark);
            let mut fatal = checks::fatal_lines(&console);
            if let Some(broken) = broken {
                broken_seen |= console.contains(broken);
                fatal.retain(|l| !l.contains(broken));
            }
            ensure!(
                fatal.is_empty(),
                "boot {}: {}",
                self.boots.len() + 1,
                fatal.join(" / ")
            );
            // A reboot the guest started itself: this boot's time counts from the restart.
            if !restart_seen && console.contains("reboot: Restarting system") {
                restart_seen = true;
                self.since = Instant::now();
            }
            if Instant::now() > deadline {
                bail!(
                    "boot {} did not bring up the agent within {timeout:?}",
                    self.boots.len() + 1
                );
            }
            let step = (Instant::now() + Duration::from_secs(2)).min(deadline);
            let hello = match self.agent.next_hello(step) {
                Ok(hello) => hello,
                // The socket closes as QEMU exits: the exit is handled above, once it is seen.
                Err(e) if self.launch.firmware == Firmware::Uefi => {
                    if !self.qemu_exits_soon()? {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some((id, at)) = hello else {
                continue;
            };
            if self.boots.iter().any(|b| b.id == id) {
                continue;
            }
            if let Some(broken) = broken {
                ensure!(
                    broken_seen,
                    "boot {} came up without the broken boot before it ({broken:?} never on the console)",
                    self.boots.len() + 1
                );
            }
            let boot = Boot {
                n: self.boots.len() + 1,
                id,
                secs: at.duration_since(self.since).as_secs_f64(),
            };
            println!(
                "[vm]   boot {} ({}) up in {:.1} s [{:?}]",
                boot.n, boot.id, boot.secs, self.accel
            );
            self.since = at;
            self.console_mark = self.console_len();
            self.boots.push(boot.clone());
            // The agent starts before the local filesystems (DefaultDependencies=no, so that it
            // answers on a boot that goes wrong later): a boot is up once they are mounted too,
            // /boot among them, which every libostree read in the guest needs. A first command
            // sent at the agent's hello raced /boot's fsck and mount on a slow boot (`pivot
            // status`: "/run/ostree-booted found, but no /boot/loader directory").
            let mounted = self.run("systemctl start local-fs.target", self.scaled(120))?;
            ensure!(
                mounted.rc == 0,
                "boot {}: the local filesystems did not mount:\n{}",
                boot.n,
                mounted.text
            );
            return Ok(boot);
        }
    }

    /// Whether QEMU exits within a few seconds (its agent socket having closed).
    fn qemu_exits_soon(&mut self) -> Result<bool> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.qemu.exited()?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(false)
    }

    /// Starts QEMU again on the same disk and variable store: a cold boot after a reset.
    fn power_on_again(&mut self) -> Result<()> {
        let forwards: Vec<(&str, u16)> = self
            .launch
            .forwards
            .iter()
            .map(|(g, p)| (g.as_str(), *p))
            .collect();
        let (qemu, stream) = Qemu::start(
            &self.launch.disk,
            &self.paths,
            self.launch.registry_port,
            &forwards,
            self.accel,
            self.launch.firmware,
        )?;
        self.qemu = qemu;
        self.agent = Agent::new(stream)?;
        Ok(())
    }

    /// Runs `script` in the current boot; returns its output and exit code.
    pub fn run(&mut self, script: &str, timeout: Duration) -> Result<Output> {
        let boot = self.boot().id.clone();
        self.agent.run(&boot, script, timeout)
    }

    /// Runs `script`, which must succeed; returns its output.
    pub fn sh(&mut self, script: &str) -> Result<String> {
        let timeout = self.scaled(60);
        let out = self.run(script, timeout)?;
        ensure!(
            out.rc == 0,
            "`{script}` exited with {} in the guest:\n{}",
            out.rc,
            out.text
        );
        Ok(out.text)
    }

    /// The checks every boot must pass; saves the boot's journal as an artefact.
    pub fn base_checks(&mut self) -> Result<()> {
        let n = self.boot().n;
        let timeout = self.scaled(200);
        let state = self.run("systemctl is-system-running --wait", timeout)?;
        let journal = self.run(
            "journalctl -b -o short-monotonic --no-pager",
            self.scaled(60),
        )?;
        let file = self.dir.join(format!("journal-boot{n}.txt"));
        fs::write(&file, &journal.text)?;
        let failed =
            self.sh("systemctl list-units --failed --plain --no-legend | awk '{print $1}'")?;
        let unexpected: Vec<&str> = failed
            .lines()
            .filter(|u| !u.is_empty() && !self.expected_failures.contains(u))
            .collect();
        ensure!(
            unexpected.is_empty(),
            "boot {n}: failed units {unexpected:?} (system state: {})",
            state.text.trim()
        );
        let modes = self.run(
            "systemctl is-active emergency.target rescue.target",
            self.scaled(30),
        )?;
        ensure!(
            !modes.text.lines().any(|l| l.trim() == "active"),
            "boot {n}: emergency or rescue mode is active"
        );
        checks::journal_ok(&format!("boot {n}"), &journal.text, &self.expected_failures)?;
        ensure!(
            matches!(state.text.trim(), "running" | "degraded"),
            "boot {n}: system state {:?}",
            state.text.trim()
        );
        // The node mounts them read-only as Fedora CoreOS does (disk.rs): whatever pivot did
        // this boot, it wrote them in its own mount namespace only.
        let read_only = self.run(
            "for m in /sysroot /boot; do findmnt -no OPTIONS $m | grep -qw ro || echo \"$m not ro\"; \
             touch $m/.pivot-vm-probe 2>/dev/null && echo \"$m writable\"; done; \
             grep -q 'sysroot.readonly configuration value: 1' <(journalctl -b -o cat) \
               || echo 'ostree-prepare-root did not read sysroot.readonly'",
            self.scaled(30),
        )?;
        ensure!(
            read_only.text.trim().is_empty(),
            "boot {n}: {}",
            read_only.text.trim()
        );
        Ok(())
    }

    /// `systemctl reboot`, then waits for the next boot.
    pub fn reboot(&mut self, timeout: Duration) -> Result<Boot> {
        self.reboot_by("systemctl reboot", timeout)
    }

    /// Sends `script`, which reboots the guest (its answer may never come), and waits for the
    /// next boot.
    pub fn reboot_by(&mut self, script: &str, timeout: Duration) -> Result<Boot> {
        let boot = self.boot().id.clone();
        self.since = Instant::now();
        self.console_mark = self.console_len();
        self.agent.send(&boot, script)?;
        self.wait_boot(timeout)
    }

    /// [`Machine::reboot_by`] into a boot expected to die with console line `broken` (a kernel
    /// panic, say) and restart by itself before any agent comes up; waits for the boot after
    /// it. The line must appear, and only lines containing it are excused.
    pub fn reboot_through_broken(
        &mut self,
        script: &str,
        broken: &str,
        timeout: Duration,
    ) -> Result<Boot> {
        let boot = self.boot().id.clone();
        self.since = Instant::now();
        self.console_mark = self.console_len();
        self.agent.send(&boot, script)?;
        self.wait_boot_past(Some(broken), timeout)
    }

    /// Runs `trigger` in the guest (a script that returns when the moment has come), then resets
    /// the machine at once as a power cut would (sysrq `b`: no sync, no unmount, no shutdown
    /// units), and waits for the next boot.
    pub fn hard_reset_after(&mut self, trigger: &str, timeout: Duration) -> Result<Boot> {
        let boot = self.boot().id.clone();
        self.since = Instant::now();
        self.console_mark = self.console_len();
        self.agent
            .send(&boot, &format!("{trigger}; echo b > /proc/sysrq-trigger"))?;
        self.wait_boot(timeout)
    }

    /// `systemctl poweroff`, then waits for QEMU to exit, so the disk is complete.
    pub fn poweroff(&mut self) -> Result<()> {
        let boot = self.boot().id.clone();
        self.agent.send(&boot, "systemctl poweroff")?;
        let timeout = self.scaled(60);
        self.qemu.wait_exit(timeout).context("powering off")
    }

    /// Console text after byte `mark`.
    fn console_since(&self, mark: usize) -> String {
        let bytes = fs::read(&self.paths.console).unwrap_or_default();
        String::from_utf8_lossy(bytes.get(mark..).unwrap_or_default()).into_owned()
    }

    fn console_len(&self) -> usize {
        fs::metadata(&self.paths.console)
            .map(|m| m.len() as usize)
            .unwrap_or(0)
    }
}
