//! Boot once into a new deployment, on GRUB: a target that never comes up far enough for
//! `pivot confirm` (its init fails, its kernel panics, it hangs until the watchdog or the
//! operator resets it) must land the node back on the OS it came from, not on the broken one
//! again.
//!
//! pivot speaks greenboot's GRUB environment protocol, so a node's GRUB config needs one
//! snippet whichever of the two arms it (Fedora and RHEL ship it as `08_fallback_counting`;
//! docs/boot.md has a version for GRUBs without the `increment` module, such as Debian's):
//!
//! - staging a deployment on the booted system sets `boot_success=0` and `boot_counter` to
//!   `[boot] tries` (3 unless configured, greenboot's default);
//! - GRUB, at each boot with `boot_success=0`, counts `boot_counter` down and once it has run
//!   out boots entry 1 (on OSTree systems the previous deployment) and sets `boot_counter=-1`;
//! - `pivot confirm`, at every boot, settles it: sets `boot_success=1` and removes
//!   `boot_counter`; after a fallback (`-1`) it first makes the previous deployment the default
//!   for good, as greenboot's `rpm-ostree rollback` does.
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
/// Where GRUB keeps the block on a sysroot's /boot, in the order pivot looks.
const CANDIDATES: [&str; 2] = ["boot/grub2/grubenv", "boot/grub/grubenv"];

/// Where a boot-once attempt stands, as the environment block says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootOnce {
    /// Nothing armed (or no block).
    Idle,
    /// Armed, or tried once and not settled yet: the boot that runs may be the new deployment.
    Pending,
    /// GRUB ran out of tries and booted the previous deployment.
    FellBack,
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
        match (self.get(SUCCESS), self.get(COUNTER)) {
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

/// Arms the fallback for the deployment just staged: GRUB boots it at most `tries` times.
/// Returns the block armed, if the node has one.
pub fn arm(root: &Path, tries: u8) -> Result<Option<PathBuf>> {
    let Some(path) = find(root) else {
        return Ok(None);
    };
    let mut env = load(&path)?;
    env.set(SUCCESS, "0");
    env.set(COUNTER, &tries.to_string());
    save(&path, &env)?;
    Ok(Some(path))
}

/// Where boot-once stands on the sysroot at `root`.
pub fn boot_once(root: &Path) -> Result<BootOnce> {
    match find(root) {
        Some(path) => Ok(load(&path)?.boot_once()),
        None => Ok(BootOnce::Idle),
    }
}

/// Ends a boot-once attempt: this boot's entry stays the one GRUB boots. Writes only when an
/// attempt was armed.
pub fn settle(root: &Path) -> Result<()> {
    let Some(path) = find(root) else {
        return Ok(());
    };
    let mut env = load(&path)?;
    if env.boot_once() == BootOnce::Idle {
        return Ok(());
    }
    env.set(SUCCESS, "1");
    env.unset(COUNTER);
    save(&path, &env)
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
            let armed = arm(root.path(), 1).unwrap().unwrap();
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
        let rendered = env.render().unwrap();
        assert_eq!(rendered.len(), BLOCK_SIZE);
        assert!(rendered.starts_with(
            format!("{HEADER}saved_entry=0\nboot_success=0\nboot_counter=1\n#").as_bytes()
        ));
        assert_eq!(Env::parse(&rendered).unwrap().boot_once(), BootOnce::Pending);
    }

    #[test]
    fn the_counter_says_where_an_attempt_stands() {
        let once = |vars: &str| Env::parse(&block(vars)).unwrap().boot_once();
        assert_eq!(once(""), BootOnce::Idle);
        assert_eq!(once("boot_success=1\nboot_counter=1\n"), BootOnce::Idle);
        assert_eq!(once("boot_success=0\nboot_counter=0\n"), BootOnce::Pending);
        assert_eq!(once("boot_success=0\nboot_counter=-1\n"), BootOnce::FellBack);
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
        assert_eq!(arm(root.path(), 3).unwrap(), None);
        assert!(!root.path().join("boot").exists());
        let dir = root.path().join("boot/grub");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("grubenv"), block("menu_auto_hide=1\n")).unwrap();
        assert_eq!(arm(root.path(), 3).unwrap(), Some(dir.join("grubenv")));
        assert_eq!(load(&dir.join("grubenv")).unwrap().get(COUNTER), Some("3"));
        assert_eq!(boot_once(root.path()).unwrap(), BootOnce::Pending);
        settle(root.path()).unwrap();
        let env = load(&dir.join("grubenv")).unwrap();
        assert_eq!(env.boot_once(), BootOnce::Idle);
        assert_eq!(env.get("menu_auto_hide"), Some("1"));
        assert_eq!(env.get(SUCCESS), Some("1"));
        assert_eq!(env.get(COUNTER), None);
        assert_eq!(std::fs::read(dir.join("grubenv")).unwrap().len(), BLOCK_SIZE);
    }
}
