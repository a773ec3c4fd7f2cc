//! What pivot's packages install, built the way packagers build them: packaging/install's tree
//! (the one list the .deb, the RPM and a hand install share), the RPM spec's licences and
//! bundled crates, its source and binary RPMs built (with Debian's rpm) and linted, the shipped
//! GRUB counter, and the confinement of the shipped units. The Debian package is
//! packaging_deb.rs's; the VM suite installs the same .deb with `dpkg -i` into every OS image it
//! boots.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const REPO: &str = env!("CARGO_MANIFEST_DIR");

pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{stdout}{}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        failed_tests(&stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The failed tests' sections of a `cargo test` run's output (rpmbuild's %check), repeated
/// last: a long log is cut in its middle where CI shows it, and that is where they are.
fn failed_tests(stdout: &str) -> String {
    let Some(start) = stdout.find("\nfailures:\n") else {
        return String::new();
    };
    let end = stdout[start..]
        .find("\ntest result:")
        .map_or(stdout.len(), |e| start + e);
    format!("\n== the failed tests, again:{}", &stdout[start..end])
}

pub(crate) fn assets() -> PathBuf {
    Path::new(env!("OUT_DIR")).join("assets")
}

/// Every file and directory under `root`, as absolute paths of the image.
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.insert(format!("/{}", path.strip_prefix(root).unwrap().display()));
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

fn install(zsh_dir: &str) -> (tempfile::TempDir, BTreeSet<String>) {
    let dest = tempfile::tempdir().unwrap();
    run(Command::new(Path::new(REPO).join("packaging/install"))
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_pivot"))
        .arg("--assets")
        .arg(assets())
        .arg("--zsh-dir")
        .arg(zsh_dir)
        .arg(dest.path()));
    let files = tree(dest.path());
    (dest, files)
}

/// The files pivot ships, directories left out.
pub(crate) const SHIPPED: &[&str] = &[
    "/etc/grub.d/08_pivot_fallback_counting",
    "/usr/bin/pivot",
    "/usr/lib/pivot/dracut/50-pivot-ostree.conf",
    "/usr/lib/pivot/grub/pivot-fallback-counting.cfg",
    "/usr/lib/systemd/catalog/pivot.catalog",
    "/usr/lib/systemd/system-preset/80-pivot.preset",
    "/usr/lib/systemd/system/pivot-confirm.service",
    "/usr/lib/systemd/system/pivot-reboot.service",
    "/usr/lib/systemd/system/pivot-steady-state.service",
    "/usr/lib/systemd/system/pivot.service",
    "/usr/share/bash-completion/completions/pivot",
    "/usr/share/fish/vendor_completions.d/pivot.fish",
    "/usr/share/man/man1/pivot-config.1",
    "/usr/share/man/man1/pivot-confirm.1",
    "/usr/share/man/man1/pivot-diff.1",
    "/usr/share/man/man1/pivot-finalize.1",
    "/usr/share/man/man1/pivot-rollback.1",
    "/usr/share/man/man1/pivot-status.1",
    "/usr/share/man/man1/pivot-steady-state.1",
    "/usr/share/man/man1/pivot.1",
    "/usr/share/man/man5/pivot-health.5",
    "/usr/share/man/man5/pivot.toml.5",
    "/usr/share/zsh/vendor-completions/_pivot",
];

#[test]
fn install_lays_out_what_pivot_ships() {
    let (dest, files) = install("usr/share/zsh/vendor-completions");
    let regular: BTreeSet<String> = files
        .iter()
        .filter(|f| dest.path().join(&f[1..]).is_file())
        .cloned()
        .collect();
    let expected: BTreeSet<String> = SHIPPED.iter().map(|s| s.to_string()).collect();
    assert_eq!(regular, expected);
    // The image's drop-in directories exist, empty, for image builders to fill.
    for dir in ["/usr/lib/pivot/config.d", "/usr/lib/pivot/health.d"] {
        assert!(files.contains(dir), "{dir} missing");
    }
    let mode = |p: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(dest.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("usr/bin/pivot"), 0o755);
    assert_eq!(mode("etc/grub.d/08_pivot_fallback_counting"), 0o755);
    assert_eq!(mode("usr/lib/systemd/system/pivot.service"), 0o644);
    // The preset enables the three units the package ships.
    let preset = std::fs::read_to_string(
        dest.path()
            .join("usr/lib/systemd/system-preset/80-pivot.preset"),
    )
    .unwrap();
    for unit in [
        "pivot.service",
        "pivot-confirm.service",
        "pivot-steady-state.service",
    ] {
        assert!(preset.contains(&format!("enable {unit}\n")), "{preset}");
    }
}

/// What Fedora's build root defines and Debian's rpm does not, as `rpm --define` arguments:
/// systemd-rpm-macros' two directories and its scriptlets (preset on the first install, disable
/// on removal, reload on upgrade), documentation directories named without the version, man
/// pages compressed (Debian's brp-compress needs bash, Fedora's /bin/sh), and the binary
/// stripped of its symbols too (Fedora's find-debuginfo moves them into -debuginfo; Debian's
/// brp-strip keeps them).
fn fedora_macros() -> Vec<&'static str> {
    [
        "_unitdir /usr/lib/systemd/system",
        "_presetdir /usr/lib/systemd/system-preset",
        "systemd_post() if [ $1 -eq 1 ]; then systemctl --no-reload preset %{?*} || :; fi",
        "systemd_preun() if [ $1 -eq 0 ]; then systemctl --no-reload disable --now %{?*} || :; fi",
        "systemd_postun() if [ $1 -ge 1 ]; then systemctl daemon-reload || :; fi",
        "_docdir_fmt %{NAME}",
        "__brp_compress bash %{_rpmconfigdir}/brp-compress %{_prefix}",
        "__brp_strip find %{buildroot}%{_bindir} -type f -exec %{__strip} {} +",
    ]
    .into_iter()
    .flat_map(|m| ["--define", m])
    .collect()
}

/// The preset packaging/install lays out, which the RPM leaves out (docs/packaging.md).
const PRESET: &str = "/usr/lib/systemd/system-preset/80-pivot.preset";

/// rpmspec's expansion of the spec's `%files`, as paths and globs.
fn spec_files(spec: &str) -> Vec<String> {
    let parsed = run(Command::new("rpmspec")
        .args(fedora_macros())
        .arg("-P")
        .arg(spec));
    let files = parsed.split("\n%files\n").nth(1).expect("a %files section");
    files
        .lines()
        .take_while(|l| !l.starts_with("%changelog"))
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter(|l| !l.starts_with("%license") && !l.starts_with("%doc"))
        .map(|l| l.split_whitespace().last().unwrap().to_string())
        .collect()
}

/// `pattern` (`*` within a name) matches `path`, or names a directory that holds it.
fn owns(pattern: &str, path: &str) -> bool {
    fn glob(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => {
                glob(&p[1..], s) || (!s.is_empty() && s[0] != b'/' && glob(p, &s[1..]))
            }
            (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
            _ => false,
        }
    }
    glob(pattern.as_bytes(), path.as_bytes()) || path.starts_with(&format!("{pattern}/"))
}

#[test]
fn the_rpm_spec_owns_every_installed_file_but_the_preset() {
    let spec = format!("{REPO}/packaging/pivot.spec");
    // Every file packaging/install lays out (with Fedora's zsh directory) is in %files, and
    // every %files entry is installed: rpmbuild fails on either mistake. The preset is removed
    // in %install.
    let (dest, installed) = install("usr/share/zsh/site-functions");
    let entries = spec_files(&spec);
    assert!(entries.len() > 10, "{entries:?}");
    assert!(!entries.iter().any(|e| owns(e, PRESET)), "{entries:?}");
    // Files, and pivot's own directories (the others belong to the filesystem's packages).
    let owned = installed
        .iter()
        .filter(|p| dest.path().join(&p[1..]).is_file() || p.starts_with("/usr/lib/pivot"))
        .filter(|p| *p != PRESET);
    for path in owned {
        assert!(
            entries.iter().any(|e| owns(e, path)),
            "{path} is installed but not in the spec's %files"
        );
    }
    for entry in &entries {
        assert!(
            installed.iter().any(|p| owns(entry, p)),
            "%files lists {entry}, which packaging/install does not install"
        );
    }
}

/// What `packaging/licenses WHAT` prints: computed from the lock file, for the binary as built.
fn licenses(what: &str) -> String {
    run(Command::new(format!("{REPO}/packaging/licenses")).arg(what))
}

/// The spec's bundled crates: the lines between its markers.
fn spec_bundled(spec: &str) -> &str {
    spec.split("# BEGIN bundled crates: packaging/licenses provides\n")
        .nth(1)
        .and_then(|rest| rest.split("# END bundled crates\n").next())
        .expect("the spec's bundled crates between their BEGIN and END lines")
}

#[test]
fn the_rpm_spec_declares_the_licence_and_the_bundling_of_every_crate_linked_in() {
    let spec = std::fs::read_to_string(format!("{REPO}/packaging/pivot.spec")).unwrap();
    let license = spec
        .lines()
        .find_map(|l| l.strip_prefix("License:"))
        .expect("a License tag")
        .trim();
    let spdx = licenses("spdx");
    assert_eq!(
        license,
        spdx.trim(),
        "pivot.spec's License is not the licences of what the binary links: \
         write `packaging/licenses spdx`'s output there"
    );
    assert!(license.starts_with("Apache-2.0 AND "), "{license}");
    let bundled = spec_bundled(&spec);
    assert_eq!(
        bundled,
        licenses("provides"),
        "pivot.spec's bundled crates are not those the binary links: put \
         `packaging/licenses provides`'s output between the BEGIN and END lines"
    );
    for line in bundled.lines() {
        let (name, version) = line
            .strip_prefix("Provides:       bundled(crate(")
            .and_then(|rest| rest.split_once(")) = "))
            .unwrap_or_else(|| panic!("{line}"));
        // In rpm a `-` ends the version: a pre-release is written with `~`, as cargo2rpm does.
        assert!(
            !name.is_empty() && !version.is_empty() && !version.contains('-'),
            "{line}"
        );
    }
    assert!(bundled.lines().count() > 100, "{bundled}");
}

/// Built as Koji would build them, but with Debian's rpm: the source RPM packaging/srpm makes,
/// rebuilt with `rpmbuild --rebuild` (%build, %install of what it built, %check's unit tests)
/// `--with quick`, which keeps CI's compile short (the spec says what that changes).
#[test]
fn the_source_and_binary_rpms_build_lint_clean_and_declare_what_they_bundle_and_need() {
    let out = tempfile::tempdir().unwrap();
    let srpm = run(Command::new(format!("{REPO}/packaging/srpm")).arg(out.path()));
    let srpm = srpm.trim();
    assert!(
        srpm.ends_with(".src.rpm") && Path::new(srpm).is_file(),
        "{srpm}"
    );
    let contents = run(Command::new("rpm").args(["-qlp", srpm]));
    let version = env!("CARGO_PKG_VERSION");
    for file in [
        "pivot.spec".to_string(),
        format!("pivot-{version}.tar.gz"),
        format!("pivot-{version}-vendor.tar.gz"),
    ] {
        assert!(
            contents.lines().any(|l| l == file),
            "{file} not in:\n{contents}"
        );
    }

    let top = out.path().join("rpmbuild");
    let log = run(Command::new("rpmbuild")
        .arg("--rebuild")
        // The build dependencies are Debian's packages, which rpm's database does not hold.
        .arg("--nodeps")
        .args(["--with", "quick"])
        .arg("--define")
        .arg(format!("_topdir {}", top.display()))
        .args(fedora_macros())
        .arg(srpm));
    // %check ran the library's unit tests.
    assert!(
        log.lines()
            .any(|l| l.starts_with("test result: ok.") && !l.contains(" 0 passed")),
        "{log}"
    );
    let rpms: Vec<PathBuf> = std::fs::read_dir(top.join("RPMS/x86_64"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let rpm = top.join(format!("RPMS/x86_64/pivot-{version}-1.x86_64.rpm"));
    assert_eq!(rpms, std::slice::from_ref(&rpm));
    let query = |args: &[&str]| run(Command::new("rpm").arg("-qp").args(args).arg(&rpm));

    // Every crate linked in is declared bundled, with its version.
    let provides: BTreeSet<String> = query(&["--provides"]).lines().map(String::from).collect();
    for line in licenses("provides").lines() {
        let bundled = line.trim_start_matches("Provides:").trim();
        assert!(provides.contains(bundled), "{bundled} not in {provides:?}");
    }
    // libostree and the other C libraries by their sonames (rpm reads them off the binary), and
    // the ostree package for its finalize unit and dracut module.
    let requires = query(&["--requires"]);
    for need in [
        "ostree",
        "libostree-1.so.1()(64bit)",
        "libssl.so.3()(64bit)",
    ] {
        assert!(
            requires.lines().any(|l| l == need),
            "{need} not in:\n{requires}"
        );
    }

    // It owns what packaging/install lays out but the preset, and the licence files; rpmbuild
    // itself fails on any file installed but not packaged.
    let files: BTreeSet<String> = query(&["--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"])
        .lines()
        .filter_map(|l| l.strip_prefix('-').and_then(|l| l.split_once(' ')))
        // rpm compresses the man pages.
        .map(|(_, path)| path.trim_end_matches(".gz").to_string())
        .collect();
    let mut expected: BTreeSet<String> = SHIPPED
        .iter()
        .filter(|p| **p != PRESET)
        .map(|p| p.replace("zsh/vendor-completions", "zsh/site-functions"))
        .collect();
    for file in ["LICENSE", "LICENSE.dependencies", "cargo-vendor.txt"] {
        expected.insert(format!("/usr/share/licenses/pivot/{file}"));
    }
    expected.insert("/usr/share/doc/pivot/README.md".into());
    assert_eq!(files, expected);
    let listed = query(&["-l"]);
    for dir in ["/usr/lib/pivot/config.d", "/usr/lib/pivot/health.d"] {
        assert!(listed.lines().any(|l| l == dir), "{dir} not in:\n{listed}");
    }
    // The units are preset on the first install and never restarted (no
    // %systemd_postun_with_restart).
    let scripts = query(&["--scripts"]);
    assert!(
        scripts.contains("preset pivot.service")
            && !scripts
                .lines()
                .any(|l| !l.starts_with('#') && l.contains("restart")),
        "{scripts}"
    );

    // The licence summary and the manifest were made from the vendored sources, and say what
    // the lock file says.
    let payload = out.path().join("payload");
    std::fs::create_dir(&payload).unwrap();
    run(Command::new("sh")
        .arg("-c")
        .arg("rpm2cpio \"$1\" | cpio -idm --quiet")
        .arg("sh")
        .arg(&rpm)
        .current_dir(&payload));
    let shipped = |name: &str| {
        std::fs::read_to_string(payload.join("usr/share/licenses/pivot").join(name)).unwrap()
    };
    assert_eq!(shipped("LICENSE.dependencies"), licenses("summary"));
    assert_eq!(shipped("cargo-vendor.txt"), licenses("manifest"));

    // The spec and both packages in one run, so that every filter is used.
    let lint = run(Command::new("rpmlint")
        .arg("-r")
        .arg(format!("{REPO}/packaging/pivot.rpmlintrc"))
        .arg(format!("{REPO}/packaging/pivot.spec"))
        .arg(srpm)
        .arg(&rpm));
    assert!(lint.contains("0 errors, 0 warnings"), "rpmlint:\n{lint}");
}

#[test]
fn the_grub_counter_is_one_snippet_and_yields_to_fedoras() {
    let script = format!("{REPO}/packaging/grub/08_pivot_fallback_counting");
    let snippet =
        std::fs::read_to_string(format!("{REPO}/packaging/grub/pivot-fallback-counting.cfg"))
            .unwrap();
    // What grub-mkconfig gets, with pivot installed (on PATH), is the static configurations'
    // snippet, and GRUB parses it; without pivot, nothing (packaging_deb.rs runs it after
    // `dpkg --remove`).
    let bin = Path::new(env!("CARGO_BIN_EXE_pivot")).parent().unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let written = run(Command::new("sh").arg(&script).env("PATH", &path));
    assert_eq!(written, snippet);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("snippet.cfg"), &written).unwrap();
    run(Command::new("grub-script-check").arg(dir.path().join("snippet.cfg")));
    // Without GRUB's `increment` module, which Debian's GRUB lacks (see the next test for what
    // it counts).
    assert!(!snippet
        .lines()
        .any(|l| !l.trim_start().starts_with('#') && l.contains("increment")));

    // Beside Fedora's GRUB's own counter (08_fallback_counting), pivot's writes nothing that
    // counts.
    let grub_d = dir.path().join("grub.d");
    std::fs::create_dir(&grub_d).unwrap();
    std::fs::copy(&script, grub_d.join("08_pivot_fallback_counting")).unwrap();
    let fedora = grub_d.join("08_fallback_counting");
    std::fs::write(&fedora, "#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fedora, std::fs::Permissions::from_mode(0o755)).unwrap();
    let beside = run(Command::new("sh")
        .arg(grub_d.join("08_pivot_fallback_counting"))
        .env("PATH", &path));
    assert!(
        beside.starts_with("# boot counting: ") && !beside.contains("boot_counter="),
        "{beside}"
    );
    // A Fedora script that is not executable is not run by grub-mkconfig: pivot's counts.
    std::fs::set_permissions(&fedora, std::fs::Permissions::from_mode(0o644)).unwrap();
    let alone = run(Command::new("sh")
        .arg(grub_d.join("08_pivot_fallback_counting"))
        .env("PATH", &path));
    assert_eq!(alone, snippet);
}

/// What GRUB itself does with the shipped counter at one boot, run in Debian's GRUB emulator
/// (`grub-emu`, the same GRUB 2.06 as the EFI image): the environment block holds `vars`
/// (written with `grub-editenv`, as pivot and greenboot leave it) on an ext2 disk, as on a
/// node's /boot, since GRUB's `save_env` writes only to blocks of a disk it reads itself.
/// Returns the entry GRUB would boot (`default`, 0 before the counter runs) and the block after.
fn boot_grub_with_counter(vars: &[&str]) -> (String, pivot::sysroot::grubenv::Env) {
    let dir = tempfile::tempdir().unwrap();
    let boot = dir.path().join("boot");
    std::fs::create_dir_all(boot.join("grub")).unwrap();
    let grubenv = boot.join("grub/grubenv");
    run(Command::new("grub-editenv").arg(&grubenv).arg("create"));
    if !vars.is_empty() {
        run(Command::new("grub-editenv")
            .arg(&grubenv)
            .arg("set")
            .args(vars));
    }
    let disk = dir.path().join("boot.img");
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext2", "-d"])
        .arg(&boot)
        .arg(&disk)
        .arg("2M"));
    std::fs::write(
        dir.path().join("device.map"),
        format!("(hd0) {}\n", disk.display()),
    )
    .unwrap();
    // As 00_header leaves it: the environment block's directory is $prefix, entry 0 is the
    // default; then the counter, as grub-mkconfig writes it (the same lines).
    std::fs::write(
        dir.path().join("grub.cfg"),
        format!(
            "set prefix=(hd0)/grub\nset default=0\nsource (host){REPO}/packaging/grub/pivot-fallback-counting.cfg\n\
             echo \"pivot-test: default=${{default}}\"\nhalt\n"
        ),
    )
    .unwrap();
    let out = run(Command::new("timeout")
        .arg("60")
        .arg("grub-emu")
        .arg("--directory")
        .arg(dir.path())
        .arg("--device-map")
        .arg(dir.path().join("device.map"))
        .args(["--root", "host"])
        .env("TERM", "dumb")
        .stdin(std::process::Stdio::null()));
    let out = out.replace('\r', "\n");
    assert!(!out.contains("error:"), "GRUB: {out}");
    let default = out
        .lines()
        .find_map(|l| l.split("pivot-test: default=").nth(1))
        .unwrap_or_else(|| panic!("GRUB did not get through the counter: {out}"))
        .trim()
        .to_string();
    // The block as GRUB left it on the disk.
    let saved = Command::new("debugfs")
        .args(["-R", "cat /grub/grubenv"])
        .arg(&disk)
        .output()
        .unwrap();
    assert!(saved.status.success(), "debugfs: {saved:?}");
    (
        default,
        pivot::sysroot::grubenv::Env::parse(&saved.stdout).unwrap(),
    )
}

#[test]
fn the_grub_counter_counts_any_counter_down_in_grub() {
    // Counters pivot arms (1 to 9) and larger ones greenboot may arm
    // (GREENBOOT_MAX_BOOT_ATTEMPTS): each boot one less, on the new entry (0).
    for (counter, left) in [
        ("1", "0"),
        ("3", "2"),
        ("9", "8"),
        ("10", "9"),
        ("11", "10"),
        ("100", "99"),
        ("1000", "999"),
        ("120", "119"),
        ("123456789012345678901", "123456789012345678900"),
    ] {
        let (default, env) =
            boot_grub_with_counter(&["boot_success=0", &format!("boot_counter={counter}")]);
        assert_eq!(
            (default.as_str(), env.get("boot_counter")),
            ("0", Some(left)),
            "GRUB at boot_counter={counter}"
        );
        assert_eq!(env.get("boot_success"), Some("0"));
    }
    // Run out (0), or already fallen back (-1): entry 1, the previous deployment, and -1.
    for counter in ["0", "-1"] {
        let (default, env) =
            boot_grub_with_counter(&["boot_success=0", &format!("boot_counter={counter}")]);
        assert_eq!(
            (default.as_str(), env.get("boot_counter")),
            ("1", Some("-1")),
            "GRUB at boot_counter={counter}"
        );
    }
    // A settled boot, or none armed: GRUB counts nothing and boots the default.
    for vars in [
        &["boot_success=1", "boot_counter=3"][..],
        &["boot_success=0"],
        &[],
    ] {
        let (default, env) = boot_grub_with_counter(vars);
        assert_eq!(default, "0", "{vars:?}");
        let counter = vars.iter().find_map(|v| v.strip_prefix("boot_counter="));
        assert_eq!(env.get("boot_counter"), counter, "{vars:?}");
    }
    // A target that never comes up, armed with 3 tries, as a node sees it: three boots of the
    // new entry, then the previous one.
    let mut vars = ["boot_success=0".to_string(), "boot_counter=3".to_string()];
    let mut booted = Vec::new();
    for _ in 0..4 {
        let args: Vec<&str> = vars.iter().map(String::as_str).collect();
        let (default, env) = boot_grub_with_counter(&args);
        booted.push(default);
        vars[1] = format!("boot_counter={}", env.get("boot_counter").unwrap());
    }
    assert_eq!(booted, ["0", "0", "0", "1"]);
    assert_eq!(vars[1], "boot_counter=-1");
}

/// `systemd-analyze security --offline=true`'s overall exposure of a shipped unit.
fn exposure(unit: &str) -> f64 {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(format!("{REPO}/systemd/{unit}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no rating for {unit}: {out:?}"));
    line.split(':')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

/// The bar the units are held to (docs/hardening.md says what each protection costs).
#[test]
fn the_units_are_confined_to_at_most_5_0() {
    for unit in [
        "pivot.service",
        "pivot-confirm.service",
        "pivot-steady-state.service",
        "pivot-reboot.service",
    ] {
        let rating = exposure(unit);
        assert!(
            rating <= 5.0,
            "{unit} is rated {rating} by systemd-analyze security, above the bar of 5.0"
        );
    }
    // Every unit runs only on a booted OSTree system.
    for unit in [
        "pivot.service",
        "pivot-confirm.service",
        "pivot-steady-state.service",
        "pivot-reboot.service",
    ] {
        let text = std::fs::read_to_string(format!("{REPO}/systemd/{unit}")).unwrap();
        assert!(
            text.contains("\nConditionPathExists=/run/ostree-booted\n"),
            "{unit}"
        );
    }
}

/// pivot's state is the running `/var/lib/pivot` (src/node/state.rs `dir`), which a separate
/// `/var` partition puts on another filesystem: each unit has it as its `StateDirectory=`
/// (writable under `ProtectSystem=strict`, and the unit ordered after the mount of `/var`, so
/// its conditions are checked once `/var` is there), each condition on pivot's records looks
/// there, and steady-state writes nothing else. `systemd-analyze verify` accepts them.
#[test]
fn the_units_reach_the_state_wherever_var_is() {
    let units = [
        "pivot.service",
        "pivot-confirm.service",
        "pivot-steady-state.service",
        "pivot-reboot.service",
    ];
    for unit in units {
        let text = std::fs::read_to_string(format!("{REPO}/systemd/{unit}")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for line in ["StateDirectory=pivot", "StateDirectoryMode=0700"] {
            assert!(lines.contains(&line), "{unit} lacks {line}");
        }
        for condition in lines
            .iter()
            .filter_map(|l| l.strip_prefix("ConditionPathExists="))
            .filter(|p| p.starts_with("/var"))
        {
            assert!(
                condition.starts_with("/var/lib/pivot/"),
                "{unit}: {condition} is not in its state directory"
            );
        }
    }
    let steady =
        std::fs::read_to_string(format!("{REPO}/systemd/pivot-steady-state.service")).unwrap();
    assert!(
        !steady.lines().any(|l| l.starts_with("ReadWritePaths=")),
        "steady-state writes only its state directory:\n{steady}"
    );
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(units.map(|u| format!("{REPO}/systemd/{u}")))
        .output()
        .unwrap();
    let complaints: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        // The binary is installed by the package, not on the build host.
        .filter(|l| !l.contains("/usr/bin/pivot is not executable"))
        .map(str::to_string)
        .collect();
    // Its exit status is 1 for that missing binary alone: the complaints are what count.
    assert!(
        complaints.is_empty(),
        "systemd-analyze verify: {complaints:?}"
    );
}
