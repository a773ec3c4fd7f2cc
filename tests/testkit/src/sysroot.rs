//! Throwaway OSTree sysroots with one real deployment, made by the ostree CLI.

use crate::commit::commit_tree;
use crate::tree::Tree;
use anyhow::{bail, Context, Result};
use ostree::gio;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Environment for anything touching a test sysroot: no immutable bit on
/// deployments, so they can be deleted without chattr.
pub fn pivot_test_env() -> Vec<(String, String)> {
    vec![(
        "OSTREE_SYSROOT_DEBUG".to_string(),
        "mutable-deployments".to_string(),
    )]
}

pub struct TestSysroot {
    pub path: PathBuf,
    pub stateroot: String,
    dir: Option<tempfile::TempDir>,
    commit: String,
}

impl TestSysroot {
    /// `path` is `<tempdir>/sysroot`; the tree is deployed with `kargs`.
    pub fn new(stateroot: &str, tree: &Tree, version: &str, kargs: &[&str]) -> Result<TestSysroot> {
        TestSysroot::new_in(&std::env::temp_dir(), stateroot, tree, version, kargs)
    }

    /// Like [`TestSysroot::new`], with the temporary directory made under `parent` (a
    /// filesystem of the test's choosing, e.g. a [`crate::Tmpfs`]).
    pub fn new_in(
        parent: &Path,
        stateroot: &str,
        tree: &Tree,
        version: &str,
        kargs: &[&str],
    ) -> Result<TestSysroot> {
        let dir = tempfile::Builder::new()
            .prefix("pivot-sysroot-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a sysroot temp dir in {}", parent.display()))?;
        let path = dir.path().join("sysroot");
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut me = TestSysroot {
            path: path.clone(),
            stateroot: stateroot.to_string(),
            dir: Some(dir),
            commit: String::new(),
        };
        let mut init = ostree_cmd();
        init.args(["admin", "init-fs"]).arg(&path);
        run(init)?;
        me.admin("os-init", &[stateroot])?;
        // init-fs makes boot/ today; be sure, since BLS entries land under it.
        fs::create_dir_all(path.join("boot")).context("creating boot/")?;

        let repo = ostree::Repo::new_for_path(path.join("ostree/repo"));
        repo.open(gio::Cancellable::NONE)
            .context("opening sysroot repo")?;
        me.commit = commit_tree(&repo, tree, None, version)?;

        let mut args = vec!["--os".to_string(), stateroot.to_string()];
        args.extend(kargs.iter().map(|k| format!("--karg={k}")));
        args.push(me.commit.clone());
        me.admin("deploy", &args)?;
        Ok(me)
    }

    /// The commit deployed by `new`.
    pub fn commit_v1(&self) -> &str {
        &self.commit
    }

    pub fn repo_path(&self) -> PathBuf {
        self.path.join("ostree/repo")
    }

    /// Deployment directory, `index` in `ostree admin status` order.
    pub fn deployment_path(&self, index: usize) -> Result<PathBuf> {
        let sysroot = self.load()?;
        let deployments = sysroot.deployments();
        let d = deployments
            .get(index)
            .with_context(|| format!("no deployment {index}; there are {}", deployments.len()))?;
        Ok(self.path.join(sysroot.deployment_dirpath(d).as_str()))
    }

    pub fn admin_status(&self) -> Result<String> {
        self.admin("status", &[] as &[&str])
    }

    pub fn boot_entries(&self) -> Result<Vec<(String, String)>> {
        let dir = self.path.join("boot/loader/entries");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".conf") {
                let text = fs::read_to_string(e.path())
                    .with_context(|| format!("reading {}", e.path().display()))?;
                out.push((name, text));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Everything a user would notice, as text, for before/after comparisons.
    pub fn snapshot(&self) -> Result<String> {
        let mut s = String::new();
        let _ = writeln!(s, "== ostree admin status\n{}", self.admin_status()?);
        for (name, text) in self.boot_entries()? {
            let _ = writeln!(s, "== boot/loader/entries/{name}\n{text}");
        }
        let mut refs = ostree_cmd();
        refs.args(["refs", "--repo"]).arg(self.repo_path());
        let refs = run(refs)?;
        let _ = writeln!(s, "== ostree refs\n{refs}");
        let objects = count_files(&self.repo_path().join("objects"))?;
        let _ = writeln!(s, "== repo objects: {objects}");
        let deploy_dir = self.deploy_dir();
        let mut names: Vec<String> = fs::read_dir(&deploy_dir)
            .with_context(|| format!("listing {}", deploy_dir.display()))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("listing {}", deploy_dir.display()))?;
        names.sort();
        let rel = format!("ostree/deploy/{}/deploy", self.stateroot);
        let _ = writeln!(s, "== {rel}\n{}", names.join("\n"));
        for name in names.iter().filter(|n| n.ends_with(".origin")) {
            let text = fs::read_to_string(deploy_dir.join(name))
                .with_context(|| format!("reading origin {name}"))?;
            let _ = writeln!(s, "== origin {name}\n{text}");
        }
        Ok(s)
    }

    /// Keeps the sysroot on disk after drop; returns its path.
    pub fn into_kept_path(mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        self.path.clone()
    }

    fn deploy_dir(&self) -> PathBuf {
        self.path
            .join("ostree/deploy")
            .join(&self.stateroot)
            .join("deploy")
    }

    fn load(&self) -> Result<ostree::Sysroot> {
        let sysroot = ostree::Sysroot::new(Some(&gio::File::for_path(&self.path)));
        sysroot
            .load(gio::Cancellable::NONE)
            .with_context(|| format!("loading sysroot {}", self.path.display()))?;
        Ok(sysroot)
    }

    /// `ostree admin <cmd> --sysroot <path> <args>`.
    fn admin<S: AsRef<OsStr>>(&self, cmd: &str, args: &[S]) -> Result<String> {
        let mut c = ostree_cmd();
        c.args(["admin", cmd, "--sysroot"])
            .arg(&self.path)
            .args(args);
        run(c)
    }
}

impl Drop for TestSysroot {
    fn drop(&mut self) {
        if self.dir.is_none() {
            return;
        }
        // A deployment made without the debug env would be immutable; clear that
        // so the temp dir can go. Errors (nothing to clear) do not matter.
        if let Ok(entries) = fs::read_dir(self.deploy_dir()) {
            for e in entries.flatten() {
                let _ = Command::new("chattr")
                    .arg("-i")
                    .arg(e.path())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

/// `ostree` with [`pivot_test_env`] applied.
fn ostree_cmd() -> Command {
    let mut cmd = Command::new("ostree");
    cmd.envs(pivot_test_env());
    cmd
}

/// Runs `cmd`; returns its stdout, or an error carrying its output.
fn run(mut cmd: Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{shown}: non-UTF-8 output"))
}

fn count_files(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let ft = e.file_type().context("file type")?;
        n += if ft.is_dir() {
            count_files(&e.path())?
        } else {
            1
        };
    }
    Ok(n)
}
