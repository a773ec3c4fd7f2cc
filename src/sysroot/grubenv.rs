//! Boot once into a new deployment, on GRUB: a target that never comes up far enough for
//! `pivot confirm` (its init fails, its kernel panics, it hangs until the watchdog or the
//! operator resets it) must land the node back on the OS it came from, not on the broken one
//! again.
//!
//! pivot speaks the GRUB environment protocol of Fedora's GRUB (its `08_fallback_counting`
//! script, "Boot Counting" in rhboot/grub2) that greenboot drives, so one GRUB snippet serves
//! whichever of the two arms the counter (pivot ships one for GRUBs without the `increment`
//! module, such as Debian's: packaging/grub, docs/boot.md):
//!
//! - staging a deployment on the booted system sets `boot_success=0`, `boot_counter` to
//!   `[boot] tries` (3 unless configured, greenboot's default) and [`MARKER`] to the staged
//!   commit, in one atomic replace of the block: the marker says the counter is pivot's;
//! - GRUB, at each boot with `boot_success=0`, counts `boot_counter` down and once it has run
//!   out boots entry 1 (on OSTree systems the previous deployment) and sets `boot_counter=-1`;
//! - `pivot confirm` settles only an attempt that carries the marker: sets `boot_success=1`,
//!   removes `boot_counter` and the marker; after a fallback (`-1`) it first makes the previous
//!   deployment the default for good, as greenboot's `rpm-ostree rollback` does.
//!
//! Why the marker: greenboot arms the same variables for every staged deployment
//! (`greenboot-grub2-set-counter.service`, at `ostree-finalize-staged`) and settles them only
//! after its own health checks (`greenboot-grub2-set-success.service`); on `-1` its
//! `greenboot-rpm-ostree-grub2-check-fallback.service` rolls back. A pivot that settled every
//! counter would switch greenboot's rollback off, and one that also rolled back on `-1` would
//! undo greenboot's rollback (two rollbacks flip back). So a counter without the marker is
//! [`BootOnce::Foreign`] and left exactly as it is.
//!
//! Why pivot does not arm at all beside greenboot ([`greenboot_counts`]): greenboot's unit arms
//! every staged deployment at shutdown anyway, after pivot, with its own
//! `GREENBOOT_MAX_BOOT_ATTEMPTS`; a marker of pivot's beside greenboot's counter would make pivot
//! settle greenboot's attempt before greenboot's health checks ran. One owner of the counter.
//!
//! The environment block is `/boot/grub2/grubenv` or `/boot/grub/grubenv` (the first that
//! exists: pivot never creates one, so nodes booted by syslinux or systemd-boot are untouched).
//! It is replaced atomically, keeping its size, which GRUB's `save_env` needs.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

const HEADER: &str = "# GRUB Environment Block\n";
/// GRUB's own size for a new block.
const BLOCK_SIZE: usize = 1024;
pub const COUNTER: &str = "boot_counter";
pub const SUCCESS: &str = "boot_success";
/// Set with the counter by pivot, to the commit it armed it for: the counter is pivot's to
/// settle. Greenboot and GRUB ignore it.
pub const MARKER: &str = "pivot_boot_once";
/// greenboot's unit that arms the counter at every `ostree-finalize-staged`, relative to a
/// system's root.
const GREENBOOT_SET_COUNTER: &str = "greenboot-grub2-set-counter.service";
/// Where GRUB keeps the block on a sysroot's /boot, in the order pivot looks.
const CANDIDATES: [&str; 2] = ["boot/grub2/grubenv", "boot/grub/grubenv"];

/// Where a boot-once attempt stands, as the environment block says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootOnce {
    /// Nothing armed (or no block).
    Idle,
    /// pivot armed it, and it is not settled yet: the boot that runs may be the new deployment.
    Pending,
    /// pivot armed it, GRUB ran out of tries and booted the previous deployment.
    FellBack,
    /// A counter armed by someone else (greenboot): theirs to settle, and theirs to roll back
    /// from on `-1`.
    Foreign,
}

/// What [`arm`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Armed {
    /// The node has no environment block: nothing to arm.
    NoBlock,
    /// greenboot arms every staged deployment itself (its unit, named): pivot left the block.
    Greenboot(PathBuf),
    /// pivot armed the block at this path.
    Block(PathBuf),
}

/// A parsed environment block: its variables in order, and its size on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    vars: Vec<(String, String)>,
    size: usize,
}

impl Env {
    pub fn parse(bytes: &[u8]) -> Result<Env> {
        let Some(body) = bytes.strip_prefix(HEADER.as_bytes()) else {
            bail!("not a GRUB environment block (no {:?} header)", HEADER.trim_end());
        };
        let mut vars = Vec::new();
        for line in body.split(|&b| b == b'\n') {
            if line.is_empty() || line[0] == b'#' {
                continue;
            }
            let line = String::from_utf8_lossy(line);
            if let Some((name, value)) = line.split_once('=') {
                vars.push((name.to_string(), unescape(value)));
            }
        }
        Ok(Env {
            vars,
            size: bytes.len().max(BLOCK_SIZE),
        })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn set(&mut self, name: &str, value: &str) {
        match self.vars.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = value.to_string(),
            None => self.vars.push((name.to_string(), value.to_string())),
        }
    }

    pub fn unset(&mut self, name: &str) {
        self.vars.retain(|(n, _)| n != name);
    }

    /// The block as GRUB writes it: header, `name=value` lines, `#` up to its size.
    pub fn render(&self) -> Result<Vec<u8>> {
        let mut out = HEADER.as_bytes().to_vec();
        for (name, value) in &self.vars {
            out.extend_from_slice(format!("{name}={}\n", escape(value)).as_bytes());
        }
        if out.len() > self.size {
            bail!("the GRUB environment does not fit its {} bytes", self.size);
        }
        out.resize(self.size, b'#');
        Ok(out)
    }

    pub fn boot_once(&self) -> BootOnce {
        let ours = self.get(MARKER).is_some();
        match (self.get(SUCCESS), self.get(COUNTER)) {
            (Some("0"), Some(_)) if !ours => BootOnce::Foreign,
            (Some("0"), Some("-1")) => BootOnce::FellBack,
            (Some("0"), Some(_)) => BootOnce::Pending,
            _ => BootOnce::Idle,
        }
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\n', "\\\n")
}

fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// The environment block of the sysroot at `root`, if it has one: the file itself, through the
/// links that lead to it (RHEL 8 and older Fedora link `/boot/grub2/grubenv` into the EFI
/// partition; replacing the link with a file would leave GRUB reading the old block).
pub fn find(root: &Path) -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(|c| resolve(root, &root.join(c)))
        .find(|p| p.is_file())
}

/// `path` with its links followed, an absolute link target taken as under `root` (the sysroot
/// may not be the running system's `/`).
fn resolve(root: &Path, path: &Path) -> PathBuf {
    let mut path = path.to_path_buf();
    // As the kernel does, within reason.
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&path) else {
            break;
        };
        path = match target.strip_prefix("/") {
            Ok(inside) => root.join(inside),
            Err(_) => path.parent().unwrap_or(root).join(target),
        };
    }
    path
}

pub fn load(path: &Path) -> Result<Env> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Env::parse(&bytes).with_context(|| format!("reading {}", path.display()))
}

/// Replaces the block at `path` atomically (temporary file, fsync, rename, fsync of /boot's
/// directory), so a power cut leaves the old block or the new one.
pub fn save(path: &Path, env: &Env) -> Result<()> {
    let bytes = env.render()?;
    let dir = path.parent().expect("grubenv has a parent");
    let tmp = dir.join(".grubenv.pivot.tmp");
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// Whether greenboot arms GRUB's counter for every staged deployment on the system whose root
/// is `system` (the booted deployment, whose units run at its shutdown): its
/// `greenboot-grub2-set-counter.service` is installed (in `/usr/lib` or `/etc`) and not masked.
/// Returns the unit file found.
pub fn greenboot_counts(system: &Path) -> Option<PathBuf> {
    let masked = system
        .join("etc/systemd/system")
        .join(GREENBOOT_SET_COUNTER);
    if std::fs::read_link(&masked).is_ok_and(|t| t == Path::new("/dev/null")) {
        return None;
    }
    ["etc/systemd/system", "usr/lib/systemd/system"]
        .iter()
        .map(|dir| system.join(dir).join(GREENBOOT_SET_COUNTER))
        .find(|unit| unit.is_file())
}

/// Arms the fallback for `commit`, the deployment just staged on the sysroot at `root` from
/// the booted system at `system`: GRUB boots it at most `tries` times until `pivot confirm`
/// settles it. Nothing is written on a node without a block, or where greenboot arms it.
pub fn arm(root: &Path, system: &Path, tries: u8, commit: &str) -> Result<Armed> {
    let Some(path) = find(root) else {
        return Ok(Armed::NoBlock);
    };
    if let Some(unit) = greenboot_counts(system) {
        return Ok(Armed::Greenboot(unit));
    }
    let mut env = load(&path)?;
    env.set(SUCCESS, "0");
    env.set(COUNTER, &tries.to_string());
    env.set(MARKER, commit);
    save(&path, &env)?;
    Ok(Armed::Block(path))
}

/// Where boot-once stands on the sysroot at `root`.
pub fn boot_once(root: &Path) -> Result<BootOnce> {
    match find(root) {
        Some(path) => Ok(load(&path)?.boot_once()),
        None => Ok(BootOnce::Idle),
    }
}

/// Ends a boot-once attempt pivot armed: this boot's entry stays the one GRUB boots, and the
/// marker goes. A counter someone else armed ([`BootOnce::Foreign`]) is left as it is; writes
/// only when pivot's marker is there. Returns what it found.
pub fn settle(root: &Path) -> Result<BootOnce> {
    let Some(path) = find(root) else {
        return Ok(BootOnce::Idle);
    };
    let mut env = load(&path)?;
    let found = env.boot_once();
    if env.get(MARKER).is_none() {
        return Ok(found);
    }
    if matches!(found, BootOnce::Pending | BootOnce::FellBack) {
        env.set(SUCCESS, "1");
        env.unset(COUNTER);
    }
    // A marker without a counter of its own (someone settled it): only the marker goes.
    env.unset(MARKER);
    save(&path, &env)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(vars: &str) -> Vec<u8> {
        let mut b = format!("{HEADER}{vars}").into_bytes();
        b.resize(BLOCK_SIZE, b'#');
        b
    }

    #[test]
    fn a_linked_block_is_written_where_the_link_leads() {
        let root = tempfile::tempdir().unwrap();
        let efi = root.path().join("boot/efi/EFI/redhat");
        std::fs::create_dir_all(&efi).unwrap();
        std::fs::create_dir_all(root.path().join("boot/grub2")).unwrap();
        let mut env = Env::parse(HEADER.as_bytes()).unwrap();
        env.set("saved_entry", "0");
        save(&efi.join("grubenv"), &env).unwrap();
        // RHEL 8's layout: a relative link; an absolute one is read inside the sysroot.
        for target in ["../efi/EFI/redhat/grubenv", "/boot/efi/EFI/redhat/grubenv"] {
            let link = root.path().join("boot/grub2/grubenv");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).unwrap();
            let Armed::Block(armed) = arm(root.path(), root.path(), 1, "c0ffee").unwrap() else {
                panic!("not armed");
            };
            assert_eq!(
                armed.canonicalize().unwrap(),
                efi.join("grubenv").canonicalize().unwrap()
            );
            assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
            let written = load(&efi.join("grubenv")).unwrap();
            assert_eq!(written.get(COUNTER), Some("1"));
            assert_eq!(written.get("saved_entry"), Some("0"));
            save(&efi.join("grubenv"), &env).unwrap();
        }
    }

    #[test]
    fn reads_and_writes_grub_editenv_blocks() {
        let bytes = block("saved_entry=0\nboot_success=1\n");
        let mut env = Env::parse(&bytes).unwrap();
        assert_eq!(env.get("saved_entry"), Some("0"));
        assert_eq!(env.render().unwrap(), bytes, "unchanged round trip");
        env.set(SUCCESS, "0");
        env.set(COUNTER, "1");
        env.set(MARKER, "c0ffee");
        let rendered = env.render().unwrap();
        assert_eq!(rendered.len(), BLOCK_SIZE);
        assert!(rendered.starts_with(
            format!(
                "{HEADER}saved_entry=0\nboot_success=0\nboot_counter=1\npivot_boot_once=c0ffee\n#"
            )
            .as_bytes()
        ));
        assert_eq!(Env::parse(&rendered).unwrap().boot_once(), BootOnce::Pending);
    }

    #[test]
    fn the_counter_says_where_an_attempt_stands() {
        let once = |vars: &str| Env::parse(&block(vars)).unwrap().boot_once();
        assert_eq!(once(""), BootOnce::Idle);
        let ours = "pivot_boot_once=c0ffee\n";
        assert_eq!(once(&format!("boot_success=1\nboot_counter=1\n{ours}")), BootOnce::Idle);
        assert_eq!(once(&format!("boot_success=0\nboot_counter=0\n{ours}")), BootOnce::Pending);
        assert_eq!(once(&format!("boot_success=0\nboot_counter=-1\n{ours}")), BootOnce::FellBack);
        // Without pivot's marker the counter is someone else's (greenboot's), whatever it says.
        assert_eq!(once("boot_success=0\nboot_counter=3\n"), BootOnce::Foreign);
        assert_eq!(once("boot_success=0\nboot_counter=-1\n"), BootOnce::Foreign);
        assert_eq!(once("boot_success=1\n"), BootOnce::Idle);
    }

    #[test]
    fn not_a_block_and_too_much_are_refused() {
        assert!(Env::parse(b"saved_entry=0\n").is_err());
        let mut env = Env::parse(&block("")).unwrap();
        env.set("long", &"x".repeat(BLOCK_SIZE));
        assert!(env.render().is_err());
    }

    #[test]
    fn arm_and_settle_touch_only_a_block_that_exists() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(arm(root.path(), root.path(), 3, "c0ffee").unwrap(), Armed::NoBlock);
        assert!(!root.path().join("boot").exists());
        let dir = root.path().join("boot/grub");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("grubenv"), block("menu_auto_hide=1\n")).unwrap();
        assert_eq!(
            arm(root.path(), root.path(), 3, "c0ffee").unwrap(),
            Armed::Block(dir.join("grubenv"))
        );
        let armed = load(&dir.join("grubenv")).unwrap();
        assert_eq!(armed.get(COUNTER), Some("3"));
        assert_eq!(armed.get(MARKER), Some("c0ffee"));
        assert_eq!(boot_once(root.path()).unwrap(), BootOnce::Pending);
        assert_eq!(settle(root.path()).unwrap(), BootOnce::Pending);
        let env = load(&dir.join("grubenv")).unwrap();
        assert_eq!(env.boot_once(), BootOnce::Idle);
        assert_eq!(env.get("menu_auto_hide"), Some("1"));
        assert_eq!(env.get(SUCCESS), Some("1"));
        assert_eq!(env.get(COUNTER), None);
        assert_eq!(env.get(MARKER), None);
        assert_eq!(std::fs::read(dir.join("grubenv")).unwrap().len(), BLOCK_SIZE);
    }

    #[test]
    fn a_counter_pivot_did_not_arm_is_left_byte_for_byte() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("boot/grub2");
        std::fs::create_dir_all(&dir).unwrap();
        for vars in ["boot_success=0\nboot_counter=2\n", "boot_success=0\nboot_counter=-1\n"] {
            let bytes = block(vars);
            std::fs::write(dir.join("grubenv"), &bytes).unwrap();
            assert_eq!(settle(root.path()).unwrap(), BootOnce::Foreign);
            assert_eq!(std::fs::read(dir.join("grubenv")).unwrap(), bytes, "{vars}");
        }
        // pivot's marker outlived its counter (someone else settled it): only the marker goes.
        std::fs::write(dir.join("grubenv"), block("boot_success=1\npivot_boot_once=c0ffee\n"))
            .unwrap();
        assert_eq!(settle(root.path()).unwrap(), BootOnce::Idle);
        let env = load(&dir.join("grubenv")).unwrap();
        assert_eq!((env.get(SUCCESS), env.get(MARKER)), (Some("1"), None));
    }

    #[test]
    fn beside_greenboot_pivot_does_not_arm() {
        let root = tempfile::tempdir().unwrap();
        let system = tempfile::tempdir().unwrap();
        let dir = root.path().join("boot/grub2");
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = block("saved_entry=0\n");
        std::fs::write(dir.join("grubenv"), &bytes).unwrap();
        let units = system.path().join("usr/lib/systemd/system");
        std::fs::create_dir_all(&units).unwrap();
        let unit = units.join(GREENBOOT_SET_COUNTER);
        std::fs::write(&unit, "[Unit]\n").unwrap();
        assert_eq!(
            arm(root.path(), system.path(), 3, "c0ffee").unwrap(),
            Armed::Greenboot(unit)
        );
        assert_eq!(std::fs::read(dir.join("grubenv")).unwrap(), bytes);
        // Masked by the admin, greenboot's unit arms nothing: pivot does.
        let etc = system.path().join("etc/systemd/system");
        std::fs::create_dir_all(&etc).unwrap();
        std::os::unix::fs::symlink("/dev/null", etc.join(GREENBOOT_SET_COUNTER)).unwrap();
        assert_eq!(greenboot_counts(system.path()), None);
        assert!(matches!(
            arm(root.path(), system.path(), 3, "c0ffee").unwrap(),
            Armed::Block(_)
        ));
    }
}
