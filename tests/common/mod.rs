//! Shared set-up for pivot's integration tests: a real registry, a registries.conf that marks it
//! insecure, and a throwaway sysroot with v1 deployed.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pivot_testkit::{push_oscontainer, ImageSpec, PushedImage, Registry, TestSysroot, Tree};

pub const STATEROOT: &str = "pivot-test";
pub const KARGS: [&str; 2] = ["console=ttyS0,115200n8", "pivot.test=carried"];

pub struct Env {
    pub registry: Registry,
    pub sysroot: TestSysroot,
    conf_dir: tempfile::TempDir,
    pub registries_conf: PathBuf,
}

impl Env {
    /// A registry and a sysroot with `os-v1` deployed with [`KARGS`].
    pub fn new() -> Env {
        Env::with_registry(Registry::start().expect("starting docker-registry"))
    }

    /// A registry and a v1 sysroot made under `dir` (e.g. on a [`pivot_testkit::Tmpfs`]).
    pub fn new_in(dir: &Path) -> Env {
        Env::build(Registry::start().expect("starting docker-registry"), dir)
    }

    /// `registry` (plain HTTP ones are marked insecure) and a v1 sysroot.
    pub fn with_registry(registry: Registry) -> Env {
        Env::build(registry, &std::env::temp_dir())
    }

    fn build(registry: Registry, dir: &Path) -> Env {
        let sysroot = TestSysroot::new_in(dir, STATEROOT, &fixture("os-v1"), "1", &KARGS)
            .expect("creating a v1 sysroot");
        let conf_dir = tempfile::tempdir().unwrap();
        let registries_conf = if registry.is_tls() {
            let path = conf_dir.path().join("registries.conf");
            std::fs::write(&path, "").unwrap();
            path
        } else {
            registry.registries_conf(conf_dir.path()).unwrap()
        };
        Env {
            registry,
            sysroot,
            conf_dir,
            registries_conf,
        }
    }

    pub fn push(&self, tag: &str, spec: &ImageSpec) -> PushedImage {
        push_oscontainer(&self.registry, "pivot/os", tag, spec).expect("pushing an oscontainer")
    }

    /// `os-v2` with default settings, tagged `v2`.
    pub fn push_v2(&self) -> PushedImage {
        self.push("v2", &ImageSpec::new(fixture("os-v2"), "2"))
    }

    /// A directory that lives as long as this environment, for config files.
    pub fn dir(&self) -> &Path {
        self.conf_dir.path()
    }

    /// Replaces the registries.conf pivot reads.
    pub fn set_registries_conf(&mut self, text: &str) {
        let path = self.conf_dir.path().join("registries-custom.conf");
        std::fs::write(&path, text).unwrap();
        self.registries_conf = path;
    }

    /// Runs the pivot binary on this sysroot; `args` come after `--sysroot`.
    pub fn pivot(&self, args: &[&str]) -> Output {
        self.run(self.command(args))
    }

    /// The pivot command [`Env::pivot`] runs, for a test to start it its own way.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pivot"));
        cmd.arg("--sysroot").arg(&self.sysroot.path).args(args);
        self.prepare(&mut cmd);
        cmd
    }

    pub fn status_json(&self) -> serde_json::Value {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pivot"));
        cmd.args(["status", "--json", "--sysroot"])
            .arg(&self.sysroot.path);
        let out = self.run(cmd);
        assert_success(&out);
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    }

    /// Starts pivot without waiting for it.
    pub fn spawn_pivot(&self, args: &[&str]) -> std::process::Child {
        self.command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting pivot")
    }

    fn run(&self, mut cmd: Command) -> Output {
        self.prepare(&mut cmd);
        cmd.output().expect("running pivot")
    }

    fn prepare(&self, cmd: &mut Command) {
        cmd.env("CONTAINERS_REGISTRIES_CONF", &self.registries_conf)
            // Tests that need a longer retry budget pass --retry-timeout.
            .env("PIVOT_RETRY_TIMEOUT", "2")
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("JOURNAL_STREAM")
            .envs(pivot_testkit::pivot_test_env());
    }

    /// The deployment directory at `index` in boot order.
    pub fn deployment(&self, index: usize) -> PathBuf {
        self.sysroot.deployment_path(index).unwrap()
    }

    /// The /etc of the deployment that boots next.
    pub fn default_etc(&self) -> PathBuf {
        self.deployment(0).join("etc")
    }
}

pub fn fixture(name: &str) -> Tree {
    Tree::fixture(name).expect("reading a fixture tree")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "pivot failed ({}):\n{}",
        out.status,
        stderr(out)
    );
}

/// Asserts pivot failed with exit code 1 and a message containing every one of `needles`.
pub fn assert_fails_with(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected failure, got {}:\n{err}",
        out.status
    );
    for needle in needles {
        assert!(err.contains(needle), "expected {needle:?} in:\n{err}");
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `len` bytes of hex text from a xorshift generator: compresses only about 2:1.
pub fn noise(len: usize) -> String {
    noise_seeded(0, len)
}

/// Like [`noise`], a different text for each `seed`, so that files made from it do not dedupe.
pub fn noise_seeded(seed: u64, len: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut text = String::with_capacity(len + 16);
    while text.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("{x:016x}"));
    }
    text.truncate(len);
    text
}

/// `ostree fsck` of the sysroot's repo succeeds.
pub fn assert_fsck_clean(env: &Env) {
    let fsck = Command::new("ostree")
        .args(["fsck", "--repo"])
        .arg(env.sysroot.repo_path())
        .output()
        .expect("running ostree fsck");
    assert!(
        fsck.status.success(),
        "ostree fsck failed:\n{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}

/// Points pivot at `proxy` (plain HTTP) instead of the registry.
pub fn insecure_via(env: &mut Env, proxy: &pivot_testkit::FaultProxy) {
    env.set_registries_conf(&format!(
        "[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
        proxy.host()
    ));
}
