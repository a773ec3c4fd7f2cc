//! The Debian package as Debian policy wants it (packaging/deb, packaging/debian): built from the
//! binary under test, judged by Debian's `lintian`, and installed, disabled, upgraded, removed,
//! reinstalled and purged by the real `dpkg` in a throwaway root whose maintainer scripts run
//! the real `deb-systemd-helper` and `systemctl`. The root is the host's `/usr` and `/etc`
//! under overlays on a tmpfs (what the scripts write lands there, never on the host) with a copy
//! of the host's dpkg database.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::packaging::{assets, run, REPO, SHIPPED};

const UNITS: [&str; 3] = [
    "pivot.service",
    "pivot-confirm.service",
    "pivot-steady-state.service",
];

/// The .deb of the pivot under test (gzip -1: a throwaway package).
fn deb(out: &Path) -> PathBuf {
    let deb = run(Command::new(Path::new(REPO).join("packaging/deb"))
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_pivot"))
        .arg("--assets")
        .arg(assets())
        .arg("--out")
        .arg(out)
        .arg("--fast"));
    let deb = PathBuf::from(deb.trim());
    assert!(deb.is_file(), "{}", deb.display());
    deb
}

#[test]
fn the_deb_names_its_libraries_licences_and_conffiles() {
    let out = tempfile::tempdir().unwrap();
    let deb = deb(out.path());
    let field = |name: &str| run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(name));
    let depends = field("Depends");
    for dep in [
        "libostree-1-1",
        "libssl3",
        "libc6",
        "libzstd1",
        "ostree-boot",
    ] {
        assert!(depends.contains(dep), "Depends: {depends}");
    }
    assert_eq!(field("Package").trim(), "pivot");
    assert!(!field("Maintainer").contains("localhost"));
    let version = field("Version");
    assert!(version.starts_with(env!("CARGO_PKG_VERSION")), "{version}");

    let control = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(control.path()));
    let read = |name: &str| std::fs::read_to_string(control.path().join(name)).unwrap();
    assert_eq!(
        read("conffiles"),
        "/etc/grub.d/08_pivot_fallback_counting\n"
    );
    let postinst = read("postinst");
    assert!(
        postinst.contains("deb-systemd-helper") && !postinst.contains(" start "),
        "{postinst}"
    );
    // md5sums lists every file but the conffile.
    let summed: BTreeSet<String> = read("md5sums")
        .lines()
        .map(|l| format!("/{}", l.split_whitespace().nth(1).unwrap()))
        .collect();

    let listed: BTreeSet<String> = run(Command::new("dpkg-deb").arg("-c").arg(&deb))
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            l.split_whitespace()
                .last()
                .map(|p| p.trim_start_matches('.').to_string())
        })
        .collect();
    // Man pages compressed, as policy asks; the copyright, changelog and lintian's overrides.
    let mut expected: BTreeSet<String> = SHIPPED
        .iter()
        .map(|s| match s.starts_with("/usr/share/man/") {
            true => format!("{s}.gz"),
            false => s.to_string(),
        })
        .collect();
    for doc in [
        "/usr/share/doc/pivot/copyright",
        "/usr/share/doc/pivot/changelog.Debian.gz",
        "/usr/share/lintian/overrides/pivot",
    ] {
        expected.insert(doc.into());
    }
    assert_eq!(listed, expected);
    let mut unsummed: BTreeSet<String> = listed.difference(&summed).cloned().collect();
    assert_eq!(
        unsummed.pop_first().as_deref(),
        Some("/etc/grub.d/08_pivot_fallback_counting")
    );
    assert!(unsummed.is_empty(), "{unsummed:?}");
}

/// The copyright file names every crate linked into the binary with its licence, and has a
/// licence paragraph for each licence it names (DEP-5): a crate whose licence it lacks fails.
#[test]
fn the_copyright_file_covers_every_linked_crate() {
    let dep5 = run(Command::new(Path::new(REPO).join("packaging/licenses")).arg("dep5"));
    let manifest = run(Command::new(Path::new(REPO).join("packaging/licenses")).arg("manifest"));
    let tree = run(Command::new("cargo")
        .current_dir(REPO)
        .args(["tree", "--locked", "--offline", "-p", "pivot"])
        .args([
            "--edges",
            "no-build,no-dev,no-proc-macro",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}"]));
    let linked: BTreeSet<String> = tree
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let (name, version) = (words.next()?, words.next()?.strip_prefix('v')?);
            (name != "pivot").then(|| format!("{name} {version}"))
        })
        .collect();
    let listed: BTreeSet<String> = manifest.lines().map(str::to_string).collect();
    assert_eq!(listed, linked);
    assert!(linked.len() > 100, "{}", linked.len());

    let paragraphs: Vec<&str> = dep5.split("\n\n").collect();
    assert!(paragraphs[0]
        .starts_with("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"));
    let mut named = BTreeSet::new();
    let mut defined = BTreeSet::new();
    for paragraph in &paragraphs[1..] {
        let license = paragraph
            .lines()
            .find_map(|l| l.strip_prefix("License: "))
            .unwrap_or_else(|| panic!("no License in:\n{paragraph}"));
        if let Some(files) = paragraph.lines().find_map(|l| l.strip_prefix("Files: ")) {
            if let Some(crate_dir) = files.strip_prefix("cargo-crates/") {
                let (name_version, _) = crate_dir.rsplit_once("/*").unwrap();
                let (name, version) = name_version.rsplit_once('-').unwrap();
                assert!(linked.contains(&format!("{name} {version}")), "{files}");
            }
            for id in license.split([' ', '(', ')']).filter(|w| !w.is_empty()) {
                if !["or", "and", "with", "exception", "LLVM"].contains(&id) {
                    named.insert(id.to_string());
                }
            }
        } else {
            assert!(paragraph.lines().count() > 1, "no text: {paragraph}");
            defined.insert(license.to_string());
        }
    }
    let crate_stanzas = paragraphs
        .iter()
        .filter(|p| p.contains("Files: cargo-crates/"))
        .count();
    assert_eq!(crate_stanzas, linked.len());
    for id in &named {
        assert!(
            defined
                .iter()
                .any(|d| d == id || d.starts_with(&format!("{id} "))),
            "{id} has no licence paragraph: {defined:?}"
        );
    }
    // The sequoia crates' LGPL and the libbz2 port's bzip2 licence, which a plain Apache-2.0
    // copyright missed.
    for id in [
        "LGPL-2+",
        "bzip2-1.0.6",
        "Unicode-3.0",
        "BSD-3-clause",
        "Zlib",
        "MIT",
    ] {
        assert!(named.contains(id), "{id} not named: {named:?}");
    }
}

/// libzstd is the system's: linked dynamically, not compiled in by zstd-sys.
#[test]
fn libzstd_is_linked_from_the_system() {
    let needed = run(Command::new("readelf").args(["-d", env!("CARGO_BIN_EXE_pivot")]));
    assert!(
        needed.contains("Shared library: [libzstd.so.1]"),
        "{needed}"
    );
}

#[test]
fn lintian_finds_nothing_beyond_the_argued_overrides() {
    let out = tempfile::tempdir().unwrap();
    let deb = deb(out.path());
    let lint = Command::new("lintian")
        .args([
            "--pedantic",
            "--fail-on",
            "error,warning",
            "--no-tag-display-limit",
        ])
        .arg(&deb)
        .output()
        .expect("running lintian (Debian's lintian package: .ci/deps test)");
    let text = String::from_utf8_lossy(&lint.stdout);
    let tags: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        lint.status.success() && tags.is_empty(),
        "lintian:\n{text}{}",
        String::from_utf8_lossy(&lint.stderr)
    );
}

/// A root for dpkg: the host's `/usr` and `/etc` under overlays on a tmpfs, a copy of its dpkg
/// database, and the rest empty. Unmounted (and so forgotten) when dropped.
struct Root {
    _dir: tempfile::TempDir,
    tmpfs: PathBuf,
    path: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Root {
    fn new() -> Root {
        let dir = tempfile::tempdir().unwrap();
        let tmpfs = dir.path().join("t");
        std::fs::create_dir(&tmpfs).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512m", "pivot-deb"])
            .arg(&tmpfs));
        let path = tmpfs.join("root");
        let mut root = Root {
            _dir: dir,
            tmpfs: tmpfs.clone(),
            path: path.clone(),
            mounts: vec![tmpfs.clone()],
        };
        for top in ["usr", "etc"] {
            let (upper, work) = (
                tmpfs.join(format!("{top}-upper")),
                tmpfs.join(format!("{top}-work")),
            );
            for d in [&upper, &work, &path.join(top)] {
                std::fs::create_dir_all(d).unwrap();
            }
            run(Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(format!(
                    "lowerdir=/{top},upperdir={},workdir={}",
                    upper.display(),
                    work.display()
                ))
                .arg(path.join(top)));
            root.mounts.push(path.join(top));
        }
        for link in ["bin", "sbin", "lib", "lib64"] {
            std::os::unix::fs::symlink(format!("usr/{link}"), path.join(link)).unwrap();
        }
        for dir in [
            "tmp",
            "run",
            "dev",
            "var/lib/systemd",
            "var/log",
            "var/cache",
            "boot",
        ] {
            std::fs::create_dir_all(path.join(dir)).unwrap();
        }
        // The maintainer scripts' one device.
        run(Command::new("mknod")
            .args(["-m", "666"])
            .arg(path.join("dev/null"))
            .args(["c", "1", "3"]));
        run(Command::new("cp")
            .arg("-a")
            .arg("/var/lib/dpkg")
            .arg(path.join("var/lib/")));
        root
    }

    /// `dpkg --root` (its dependencies are the host's to have; triggers such as man-db's
    /// left pending).
    fn dpkg(&self, args: &[&str]) -> String {
        run(Command::new("dpkg")
            .arg(format!("--root={}", self.path.display()))
            .args(["--force-depends", "--no-triggers", "--log=/dev/null"])
            .args(args))
    }

    fn chroot(&self, args: &[&str]) -> Output {
        Command::new("chroot")
            .arg(&self.path)
            .args(args)
            .output()
            .unwrap()
    }

    fn enabled(&self, unit: &str) -> bool {
        self.path
            .join("etc/systemd/system/multi-user.target.wants")
            .join(unit)
            .is_symlink()
    }

    fn enabled_units(&self) -> Vec<&'static str> {
        UNITS.into_iter().filter(|u| self.enabled(u)).collect()
    }

    /// What the root's `/etc` and `/var` hold beyond the host's (the overlay's upper layer).
    fn etc_changes(&self) -> BTreeSet<String> {
        crate::common::tree_listing(&self.tmpfs.join("etc-upper"), &[])
            .into_keys()
            .collect()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for mount in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(mount).status();
        }
    }
}

/// dpkg keeps what the admin chose, as dh_installsystemd's scripts do: the units enabled on the
/// first install, an admin's `systemctl disable` kept through an upgrade and a remove and
/// reinstall, everything enabled again after a purge; nothing started. The GRUB snippet (a
/// conffile, kept until purge) writes nothing once pivot is removed, and purge leaves nothing in
/// /etc/grub.d. No dracut configuration of the host changes.
#[test]
fn dpkg_keeps_what_the_admin_chose_and_purge_leaves_nothing() {
    let out = tempfile::tempdir().unwrap();
    let deb = deb(out.path());
    let deb = deb.to_str().unwrap();
    let root = Root::new();
    let dracut = |root: &Root| {
        ["etc/dracut.conf.d", "usr/lib/dracut/dracut.conf.d"]
            .map(|d| crate::common::tree_listing(&root.path.join(d), &[]))
    };
    let dracut_before = dracut(&root);
    let snippet = root.path.join("etc/grub.d/08_pivot_fallback_counting");

    root.dpkg(&["--install", deb]);
    assert_eq!(
        root.enabled_units(),
        UNITS,
        "the first install enables the units"
    );
    assert!(!root.enabled("pivot-reboot.service"));
    assert_eq!(
        dracut(&root),
        dracut_before,
        "a host's dracut configuration changed"
    );
    assert_eq!(
        root.dpkg(&["--verify", "pivot"]),
        "",
        "md5sums do not match the files"
    );
    let counter = root.chroot(&["/etc/grub.d/08_pivot_fallback_counting"]);
    assert!(String::from_utf8_lossy(&counter.stdout).contains("boot_counter"));

    let disabled = root.chroot(&["systemctl", "disable", "pivot.service"]);
    assert!(disabled.status.success(), "{disabled:?}");
    root.dpkg(&["--install", deb]);
    assert_eq!(
        root.enabled_units(),
        ["pivot-confirm.service", "pivot-steady-state.service"],
        "an upgrade re-enabled what the admin disabled"
    );

    root.dpkg(&["--remove", "pivot"]);
    // The units go; their links dangle until purge, as dh_installsystemd leaves them.
    assert!(!root
        .path
        .join("usr/lib/systemd/system/pivot-confirm.service")
        .exists());
    assert!(snippet.exists(), "the conffile stays until purge");
    let inert = root.chroot(&["/etc/grub.d/08_pivot_fallback_counting"]);
    assert!(
        inert.status.success() && inert.stdout.is_empty(),
        "{inert:?}"
    );
    root.dpkg(&["--install", deb]);
    assert_eq!(
        root.enabled_units(),
        ["pivot-confirm.service", "pivot-steady-state.service"],
        "a reinstall after removal restores what the admin had"
    );

    root.dpkg(&["--purge", "pivot"]);
    assert!(!snippet.exists());
    let left: Vec<String> = root
        .etc_changes()
        .into_iter()
        .filter(|p| p.contains("pivot") || p.starts_with("grub.d/"))
        .collect();
    assert!(left.is_empty(), "purge left {left:?}");
    let state = root.path.join("var/lib/systemd/deb-systemd-helper-enabled");
    let remembered = crate::common::tree_listing(&state, &[]);
    assert!(
        remembered.keys().all(|p| !p.contains("pivot")),
        "deb-systemd-helper still remembers {remembered:?}"
    );
    root.dpkg(&["--install", deb]);
    assert_eq!(
        root.enabled_units(),
        UNITS,
        "after a purge, an install starts afresh"
    );
}
