//! Shared set-up for pivot's integration tests: a real registry, a registries.conf that marks it
//! insecure, and a throwaway sysroot with v1 deployed.

// unsafe: handing a descriptor to the pivot under test (dup2 between fork and exec).
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

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

    /// A registry and a sysroot with `v1` (a tree in place of `os-v1`) deployed with [`KARGS`].
    pub fn with_v1(v1: &Tree) -> Env {
        let registry = Registry::start().expect("starting docker-registry");
        Env::build_with(registry, &std::env::temp_dir(), v1)
    }

    fn build(registry: Registry, dir: &Path) -> Env {
        Env::build_with(registry, dir, &fixture("os-v1"))
    }

    fn build_with(registry: Registry, dir: &Path, v1: &Tree) -> Env {
        let sysroot =
            TestSysroot::new_in(dir, STATEROOT, v1, "1", &KARGS).expect("creating a v1 sysroot");
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

    /// [`Env::pivot`] with extra environment variables, e.g. `PIVOT_LOG`.
    pub fn pivot_with_env(&self, vars: &[(&str, &str)], args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pivot"));
        cmd.arg("--sysroot").arg(&self.sysroot.path).args(args);
        self.prepare(&mut cmd);
        cmd.envs(vars.iter().copied());
        checked(cmd.output().expect("running pivot"))
    }

    /// Runs `pivot <subcommand> --sysroot <this sysroot> <args>`.
    pub fn subcommand(&self, subcommand: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pivot"));
        cmd.arg(subcommand)
            .arg("--sysroot")
            .arg(&self.sysroot.path)
            .args(args);
        self.run(cmd)
    }

    /// Starts `pivot <subcommand> --sysroot <this sysroot>` without waiting for it.
    pub fn spawn_subcommand(&self, subcommand: &str) -> std::process::Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pivot"));
        cmd.arg(subcommand).arg("--sysroot").arg(&self.sysroot.path);
        self.prepare(&mut cmd);
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting pivot")
    }

    /// [`Env::subcommand`] with extra environment variables (a proxy, say).
    pub fn subcommand_with_env(
        &self,
        subcommand: &str,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pivot"));
        cmd.arg(subcommand)
            .arg("--sysroot")
            .arg(&self.sysroot.path)
            .args(args);
        self.prepare(&mut cmd);
        cmd.envs(vars.iter().copied());
        checked(cmd.output().expect("running pivot"))
    }

    pub fn status_json(&self) -> serde_json::Value {
        let out = self.subcommand("status", &["--json"]);
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
        checked(cmd.output().expect("running pivot"))
    }

    fn prepare(&self, cmd: &mut Command) {
        cmd.env("CONTAINERS_REGISTRIES_CONF", &self.registries_conf)
            // Tests that need a longer retry budget pass --retry-timeout.
            .env("PIVOT_RETRY_TIMEOUT", "2")
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("JOURNAL_STREAM")
            .envs(pivot_testkit::pivot_test_env());
    }

    /// `ostree admin undeploy <index>`: the deployment goes, its commit stays in the repo.
    pub fn undeploy(&self, index: usize) {
        let out = Command::new("ostree")
            .args(["admin", "undeploy", &index.to_string(), "--sysroot"])
            .arg(&self.sysroot.path)
            .envs(pivot_testkit::pivot_test_env())
            .output()
            .expect("running ostree admin undeploy");
        assert!(out.status.success(), "ostree admin undeploy: {out:?}");
    }

    /// Checksums of the deployments, in boot order.
    pub fn deployed(&self) -> Vec<String> {
        self.status_json()["deployments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["checksum"].as_str().unwrap().to_string())
            .collect()
    }

    /// What the deployments were made from, in boot order: for an ostree-native image's merge
    /// commit the image's `ostree.commit`, else the deployed commit itself.
    pub fn deployed_images(&self) -> Vec<String> {
        self.deployed()
            .iter()
            .map(|c| self.image_commit(c))
            .collect()
    }

    /// The `ostree.commit` of the image whose merge commit is `commit` (as its metadata records
    /// the image config), else `commit` itself.
    pub fn image_commit(&self, commit: &str) -> String {
        let repo = ostree::Repo::new_for_path(self.sysroot.repo_path());
        repo.open(ostree::gio::Cancellable::NONE).unwrap();
        let (variant, _) = repo.load_commit(commit).unwrap();
        let metadata = ostree::glib::VariantDict::new(Some(&variant.child_value(0)));
        let config: Option<String> = metadata.lookup("ostree.container.image-config").unwrap();
        config
            .and_then(|c| serde_json::from_str::<serde_json::Value>(&c).ok())
            .and_then(|c| {
                c["config"]["Labels"]["ostree.commit"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_else(|| commit.to_string())
    }

    /// Drops the container store's refs (as `bootc` prunes images no deployment uses) and
    /// prunes the repo, so that only deployments and pivot's own refs keep commits.
    pub fn drop_store_refs(&self) {
        for args in [
            &["refs", "--delete", "ostree/container"][..],
            &["prune", "--refs-only"][..],
        ] {
            let out = Command::new("ostree")
                .args(args)
                .arg("--repo")
                .arg(self.sysroot.repo_path())
                .envs(pivot_testkit::pivot_test_env())
                .output()
                .expect("running ostree");
            assert!(out.status.success(), "ostree {args:?}: {out:?}");
        }
    }

    /// Where pivot keeps a killed run's downloads for the next one.
    pub fn downloads(&self) -> PathBuf {
        self.sysroot.repo_path().join("tmp/pivot-downloads")
    }

    /// What pivot keeps there of the layer `digest`: `partial` (its download) or `imported`
    /// (the record of its import).
    pub fn download(&self, digest: &str, ext: &str) -> PathBuf {
        self.downloads()
            .join(format!("{}.{ext}", digest.replace(':', "-")))
    }

    /// Whether the sysroot's repo holds the commit `checksum`.
    pub fn has_commit(&self, checksum: &str) -> bool {
        let repo = ostree::Repo::new_for_path(self.sysroot.repo_path());
        repo.open(ostree::gio::Cancellable::NONE).unwrap();
        repo.has_object(
            ostree::ObjectType::Commit,
            checksum,
            ostree::gio::Cancellable::NONE,
        )
        .unwrap()
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

/// What pivot printed on stderr; the test fails if that was a bug's report (see [`no_panic`]).
pub fn stderr(out: &Output) -> String {
    no_panic(out);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails the test when the run hit a bug in pivot (a panic), whatever else the test expects of
/// it: pivot's panic hook logs every panic as "internal error (a bug in pivot…"
/// (src/node/panics.rs), Rust's own report says "panicked at", and an unhandled panic exits 101.
/// Every helper here that runs pivot or reads its output checks this.
pub fn no_panic(out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(101)
            && !err.contains("internal error (a bug in pivot")
            && !err.contains("panicked at"),
        "pivot panicked ({}):\n{err}",
        out.status
    );
}

/// `out`, once [`no_panic`] has checked it.
pub fn checked(out: Output) -> Output {
    no_panic(&out);
    out
}

pub fn assert_success(out: &Output) {
    no_panic(out);
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

/// The index.json of the OCI layout `dir`.
pub fn layout_index(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&read(&dir.join("index.json"))).unwrap()
}

/// The path of the blob `digest` in the OCI layout `dir`.
pub fn layout_blob(dir: &Path, digest: &str) -> PathBuf {
    dir.join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap())
}

/// The manifest the OCI layout `dir`'s index names first.
pub fn layout_manifest(dir: &Path) -> serde_json::Value {
    let digest = layout_index(dir)["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    serde_json::from_str(&read(&layout_blob(dir, &digest))).unwrap()
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

/// Runs pivot with `args`, expects failure mentioning `needles`, and an untouched sysroot: same
/// deployments, boot entries, refs, origins, the same object files, no file added, removed or
/// changed anywhere but pivot's own temporary space and its state file, and nothing of the
/// refused image left in that temporary space either.
pub fn assert_refused(env: &Env, args: &[&str], needles: &[&str]) {
    assert_refused_leaving(env, args, needles, &[]);
}

/// [`assert_refused`], also checking that the trees under `watched` (outside the sysroot, where
/// a hostile image points its links) did not change.
pub fn assert_refused_leaving(env: &Env, args: &[&str], needles: &[&str], watched: &[&Path]) {
    let before = env.sysroot.snapshot().unwrap();
    let objects = object_files(env);
    let files = sysroot_files(env);
    let outside: Vec<_> = watched.iter().map(|d| tree_listing(d, &[])).collect();
    let out = env.pivot(args);
    assert_fails_with(&out, needles);
    assert_eq!(
        env.sysroot.snapshot().unwrap(),
        before,
        "the sysroot changed"
    );
    let now = object_files(env);
    assert_eq!(
        now.difference(&objects).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "objects were added"
    );
    assert_eq!(now, objects, "objects were removed");
    assert_eq!(
        diff(&files, &sysroot_files(env)),
        Vec::<String>::new(),
        "files changed outside pivot's temporary space"
    );
    for (dir, before) in watched.iter().zip(outside) {
        assert_eq!(
            diff(&before, &tree_listing(dir, &[])),
            Vec::<String>::new(),
            "{} changed",
            dir.display()
        );
    }
    // Nothing of the refused image is left in the repo's temporary space either.
    let tmp = env.sysroot.repo_path().join("tmp");
    let leftovers: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with("staging-"))
        .collect();
    assert!(leftovers.is_empty(), "staging left behind: {leftovers:?}");
}

/// The repo's object files, as paths relative to `objects/`.
pub fn object_files(env: &Env) -> BTreeSet<String> {
    tree_listing(&env.sysroot.repo_path().join("objects"), &[])
        .into_keys()
        .collect()
}

/// Every path of the sysroot (type, mode, size and content hash or link target), but the repo's
/// `tmp/` and pivot's state directory: the only places a refused pivot may write.
pub fn sysroot_files(env: &Env) -> BTreeMap<String, String> {
    let state = format!("ostree/deploy/{}/var/lib/pivot", env.sysroot.stateroot);
    tree_listing(&env.sysroot.path, &["ostree/repo/tmp", &state])
}

/// Lines that differ between two listings, marked `-` (gone or before) and `+` (new or after).
fn diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (path, what) in before {
        if after.get(path) != Some(what) {
            out.push(format!("- {path} {what}"));
        }
    }
    for (path, what) in after {
        if before.get(path) != Some(what) {
            out.push(format!("+ {path} {what}"));
        }
    }
    out
}

/// path (relative to `root`) → description, skipping the relative paths in `skip`.
pub fn tree_listing(root: &Path, skip: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            let rel = rel.join(entry.file_name());
            let name = rel.to_string_lossy().into_owned();
            if skip.iter().any(|s| name == *s) {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = path.symlink_metadata() else {
                continue;
            };
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.is_dir() {
                stack.push(rel.clone());
                format!("dir {mode:o}")
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap_or_default();
                format!("symlink -> {}", target.display())
            } else if meta.is_file() {
                let hash = std::fs::read(&path)
                    .map(|d| hex::encode(Sha256::digest(d)))
                    .unwrap_or_else(|e| format!("unreadable: {e}"));
                format!("file {mode:o} {} links={} {hash}", meta.len(), meta.nlink())
            } else {
                format!("special {mode:o} rdev={}", meta.rdev())
            };
            out.insert(name, what);
        }
    }
    out
}

/// `ostree fsck` of the sysroot's repo succeeds.
/// The origin file of the deployment of `commit` (serial 0).
pub fn origin_of(env: &Env, commit: &str) -> String {
    read(&env.sysroot.path.join(format!(
        "ostree/deploy/{STATEROOT}/deploy/{commit}.0.origin"
    )))
}

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
/// Makes `cmd`'s child find `fd` (open here) as its descriptor `target`: where pivot's
/// `--progress-fd target` writes.
pub fn pass_fd(cmd: &mut Command, fd: std::os::fd::RawFd, target: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: dup2 is async-signal-safe, as a pre_exec hook must be.
    unsafe {
        cmd.pre_exec(move || match libc::dup2(fd, target) {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        });
    }
}

pub fn insecure_via(env: &mut Env, proxy: &pivot_testkit::FaultProxy) {
    env.set_registries_conf(&format!(
        "[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
        proxy.host()
    ));
}

/// The manifest of `reference` (`host/repo:tag` or `@digest`) exactly as the registry serves
/// it, read by skopeo (an independent client).
pub fn raw_manifest(reference: &str) -> Vec<u8> {
    let out = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "skopeo inspect: {out:?}");
    out.stdout
}
