//! One QEMU process booting a disk through its own bootloader (SeaBIOS → extlinux, or OVMF →
//! GRUB: see firmware.rs), with
//! - ttyS0, the console, written to `console.log`;
//! - ttyS1, where the guest's journald forwards every journal line, written to `journal.log`;
//! - a virtio-serial port for the harness's command channel (see agent.rs);
//! - user-mode networking with `restrict=on`: the guest reaches nothing but 10.0.2.100:5000,
//!   which a guestfwd connects (one `socat` per connection) to the host's 127.0.0.1:<port>.
//!
//! KVM is used only when it is real hardware virtualization and a probe boot works; otherwise TCG.
// unsafe: descriptors, mounts and locks of the VM harness (libc).
#![allow(unsafe_code)]

use std::fs;
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::firmware::{self, Firmware};

/// Where the guest finds the registry (see guest/registries.conf).
pub const GUEST_REGISTRY: &str = "10.0.2.100:5000";
/// Where the guest finds the test kit's FleetLock server, when a scenario forwards it.
pub const GUEST_FLEETLOCK: &str = "10.0.2.101:8080";
const MEMORY_MB: &str = "1536";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// Decided once per run: `PIVOT_VM_ACCEL=tcg|kvm` forces it.
    pub fn get() -> Accel {
        static ACCEL: OnceLock<Accel> = OnceLock::new();
        *ACCEL.get_or_init(|| {
            let (accel, why) = choose();
            println!("[vm] accelerator: {accel:?} ({why})");
            accel
        })
    }

    /// Scales timeouts: emulation is several times slower than KVM.
    pub fn slowdown(self) -> u32 {
        match self {
            Accel::Kvm => 1,
            Accel::Tcg => 3,
        }
    }
}

fn choose() -> (Accel, String) {
    match std::env::var("PIVOT_VM_ACCEL").as_deref() {
        Ok("tcg") => return (Accel::Tcg, "PIVOT_VM_ACCEL=tcg".into()),
        Ok("kvm") => return (Accel::Kvm, "PIVOT_VM_ACCEL=kvm".into()),
        _ => {}
    }
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or("");
    if !flags.split_whitespace().any(|f| f == "vmx" || f == "svm") {
        return (Accel::Tcg, "the CPU shows no vmx/svm".into());
    }
    // PVM-based /dev/kvm hangs or fails stock Debian kernels.
    if Path::new("/sys/module/kvm_pvm").exists() {
        return (Accel::Tcg, "/dev/kvm is kvm_pvm".into());
    }
    if fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return (Accel::Tcg, "/dev/kvm cannot be opened".into());
    }
    match probe_kvm() {
        Ok(()) => (Accel::Kvm, "probe boot under KVM worked".into()),
        Err(e) => (Accel::Tcg, format!("KVM probe failed: {e:#}")),
    }
}

/// Boots the host's own kernel under KVM with no root filesystem: reaching the "unable to mount
/// root" panic proves KVM runs a Linux kernel here.
fn probe_kvm() -> Result<()> {
    let kernel = fs::read_dir("/boot")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .context("no /boot/vmlinuz-* to probe with")?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("probe.log");
    let mut probe = Command::new("qemu-system-x86_64");
    probe
        .args([
            "-machine",
            "pc",
            "-accel",
            "kvm",
            "-m",
            "256",
            "-nodefaults",
            "-display",
            "none",
        ])
        .arg("-kernel")
        .arg(&kernel)
        .args(["-append", "console=ttyS0 panic=-1", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    die_with_parent(&mut probe);
    let mut child = probe.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let result = loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("Kernel panic") || text.contains("VFS:") {
            break Ok(());
        }
        if child.try_wait()?.is_some() {
            break Err(anyhow::anyhow!("QEMU exited before the kernel ran"));
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!("no kernel output within 20 s"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Files of one QEMU run, all in one directory.
pub struct Paths {
    pub dir: PathBuf,
    pub console: PathBuf,
    pub journal: PathBuf,
    pub agent: PathBuf,
    pub qemu_log: PathBuf,
}

impl Paths {
    pub fn new(dir: &Path) -> Paths {
        Paths {
            dir: dir.to_path_buf(),
            console: dir.join("console.log"),
            journal: dir.join("journal.log"),
            agent: dir.join("agent.sock"),
            qemu_log: dir.join("qemu.log"),
        }
    }
}

/// The QEMU process, killed when dropped.
pub struct Qemu {
    child: Child,
}

impl Qemu {
    /// `registry_port`: the host's 127.0.0.1 port behind [`GUEST_REGISTRY`].
    /// Returns once QEMU listens on the agent socket, with the host's end of it. `forwards`:
    /// more guest addresses (`ip:port`) and the host loopback ports behind them.
    pub fn start(
        disk: &Path,
        paths: &Paths,
        registry_port: u16,
        forwards: &[(&str, u16)],
        accel: Accel,
        firmware: Firmware,
    ) -> Result<(Qemu, UnixStream)> {
        let _ = fs::remove_file(&paths.agent);
        let mut netdev = "user,id=n0,restrict=on".to_string();
        for (guest, port) in
            std::iter::once((GUEST_REGISTRY, registry_port)).chain(forwards.iter().copied())
        {
            let (host, guest_port) = guest.split_once(':').expect("ip:port");
            netdev.push_str(&format!(
                ",guestfwd=tcp:{host}:{guest_port}-cmd:socat - TCP:127.0.0.1:{port}"
            ));
        }
        // Appended to: a UEFI machine's QEMU is started again after each reset.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&paths.qemu_log)?;
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(firmware::qemu_args(firmware, &paths.dir)?)
            .args(["-m", MEMORY_MB])
            .args(match accel {
                Accel::Kvm => ["-accel", "kvm", "-cpu", "host", "-smp", "2"],
                // Measured: `-cpu max` does not make the guest's pivot faster. One vCPU: two
                // guests run at a time on two host cores, and a guest with two emulated vCPUs
                // overcommits them; a vCPU preempted while holding a kernel lock leaves the other
                // spinning (CI saw soft-lockup traces, then a boot that never came up in 600 s).
                // With one, a guest boots faster here too (locked-finalization 251 → 233 s).
                Accel::Tcg => ["-accel", "tcg", "-cpu", "qemu64", "-smp", "1"],
            })
            // The host's entropy for the guest's: without it, every boot waits in
            // systemd-random-seed for the kernel's jitter entropy (1.5 s here, far longer on an
            // emulated vCPU the host starves), before local-fs.target.
            .args(["-object", "rng-random,id=rng0,filename=/dev/urandom"])
            .args(["-device", "virtio-rng-pci,rng=rng0"])
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            // cache=unsafe: the harness only reads the disk after a clean poweroff (QEMU flushes
            // on exit), and TCG guests spend much less time waiting for fsync.
            .arg("-drive")
            .arg(format!(
                "file={},if=virtio,format=qcow2,cache=unsafe",
                disk.display()
            ))
            .arg("-chardev")
            .arg(format!(
                "file,id=console,path={},append=on",
                paths.console.display()
            ))
            .args(["-serial", "chardev:console"])
            .arg("-chardev")
            .arg(format!(
                "file,id=journal,path={},append=on",
                paths.journal.display()
            ))
            .args(["-serial", "chardev:journal"])
            .args(["-device", "virtio-serial-pci"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=agent,path={},server=on,wait=off",
                paths.agent.display()
            ))
            .args([
                "-device",
                "virtserialport,chardev=agent,name=org.pivot.vm.agent",
            ])
            .args(["-netdev", &netdev])
            // romfile=: no iPXE option ROM (not installed, never network-booted).
            .args(["-device", "virtio-net-pci,netdev=n0,romfile="])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().context("starting qemu-system-x86_64")?;
        let mut qemu = Qemu { child };
        // QEMU binds the agent socket, then listens on it, once it has parsed its arguments: a
        // connect between the two is refused, so connecting is the only reliable test of ready.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match UnixStream::connect(&paths.agent) {
                Ok(stream) => return Ok((qemu, stream)),
                Err(e)
                    if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("connecting to the agent socket {}", paths.agent.display())
                    })
                }
            }
            if let Some(status) = qemu.child.try_wait()? {
                bail!(
                    "QEMU exited at start ({status}): {}",
                    fs::read_to_string(&paths.qemu_log).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "QEMU did not listen on {} within 20 s",
                    paths.agent.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status, if QEMU has exited.
    pub fn exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits for QEMU to exit on its own (the guest powered off).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.exited()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("QEMU still running {timeout:?} after the guest was told to power off")
    }
}

/// QEMU gets SIGKILL when the thread that started it dies, so a test killed by a signal (no
/// destructors run) leaves no VM behind. Machines live within one test thread.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
