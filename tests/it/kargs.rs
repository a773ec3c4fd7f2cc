//! Kernel arguments of the new deployment: the merge deployment's, edited by
//! /etc/pivot/kernel-args and --karg-append/--karg-delete, by whole token, in one deployment.

use crate::common::*;

/// The `options` line of the boot entry whose title names `version`, as written.
fn options_line(env: &Env, version: &str) -> String {
    let entries = env.sysroot.boot_entries().unwrap();
    let (_, entry) = entries
        .iter()
        .find(|(_, text)| text.contains(&format!("title Pivot Test OS {version}")))
        .unwrap_or_else(|| panic!("no boot entry for {version}: {entries:?}"));
    entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .expect("an options line")
        .to_string()
}

/// The words of [`options_line`] (for arguments without quoted spaces).
fn entry_options(env: &Env, version: &str) -> Vec<String> {
    options_line(env, version)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn kernel_args_file_and_flags_edit_the_new_deployment_by_whole_token() {
    let env = Env::new();
    let v2 = env.push_v2();
    let file = env.default_etc().join("pivot/kernel-args");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    // `pivot.test` and `console=ttyS0` are substrings of present args, not args: they stay.
    std::fs::write(
        &file,
        "# edits for the new OS\nADD nosmt\nDELETE pivot.test\nDELETE console=ttyS0\n",
    )
    .unwrap();

    let out = env.pivot(&[
        "--karg-append",
        "mitigations=off",
        "--karg-delete",
        "pivot.test=carried",
        &v2.by_tag,
    ]);
    assert_success(&out);

    let options = entry_options(&env, "2");
    let has = |arg: &str| options.iter().any(|o| o == arg);
    assert!(has("console=ttyS0,115200n8"), "{options:?}");
    assert!(has("nosmt") && has("mitigations=off"), "{options:?}");
    assert!(!has("pivot.test=carried"), "{options:?}");
    assert_eq!(options.iter().filter(|o| *o == "nosmt").count(), 1);
    // All edits land in the one new deployment; v1 keeps its arguments as rollback.
    assert_eq!(env.sysroot.boot_entries().unwrap().len(), 2);
    assert!(entry_options(&env, "1")
        .iter()
        .any(|o| o == "pivot.test=carried"));
    assert!(file.exists(), "the kernel-args file stays for later pivots");
}

#[test]
fn invalid_kernel_args_file_is_refused_naming_the_line_before_any_download() {
    let env = Env::new();
    let v2 = env.push_v2();
    let file = env.default_etc().join("pivot/kernel-args");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "ADD nosmt\nAPPEND quiet\n").unwrap();
    let before = env.sysroot.snapshot().unwrap();

    let out = env.pivot(&[&v2.by_tag]);
    assert_fails_with(
        &out,
        &["pivot/kernel-args", "line 2", "unknown verb \"APPEND\""],
    );
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    assert_eq!(env.registry.count_requests("GET", "/blobs/"), 0);
}

#[test]
fn karg_flag_with_a_space_is_a_usage_error() {
    let env = Env::new();
    let out = env.pivot(&["--karg-append", "a b", "example.com/os:1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("space"), "{}", stderr(&out));
}

/// `kargs = [...]` in a kargs.d file.
fn kargs_toml(args: &[&str]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!("kargs = [{}]\n", quoted.join(", "))
}

/// `tree` as version `version`, shipping `files` under /usr/lib/bootc/kargs.d.
fn with_kargs_d(
    tree: pivot_testkit::Tree,
    version: &str,
    files: &[(&str, String)],
) -> pivot_testkit::Tree {
    let mut tree = tree.with_file(
        "usr/lib/os-release",
        0o644,
        &format!("NAME=\"Pivot Test OS\"\nID=pivot-test\nVERSION_ID={version}\nPRETTY_NAME=\"Pivot Test OS {version}\"\n"),
    );
    for (name, text) in files {
        tree = tree.with_file(&format!("usr/lib/bootc/kargs.d/{name}"), 0o644, text);
    }
    tree
}

/// os-v2 as version `version`, shipping `files` under /usr/lib/bootc/kargs.d (none: no
/// kargs.d directory), pushed as tag `v<version>`.
fn push_with_kargs_d(
    env: &Env,
    version: &str,
    files: &[(&str, String)],
) -> pivot_testkit::PushedImage {
    let tree = with_kargs_d(fixture("os-v2"), version, files);
    env.push(
        &format!("v{version}"),
        &pivot_testkit::ImageSpec::new(tree, version),
    )
}

#[test]
fn kargs_d_of_each_image_is_added_changed_and_dropped_and_the_admins_own_stay() {
    let env = Env::new();
    let file = env.default_etc().join("pivot/kernel-args");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "ADD nosmt\n").unwrap();
    let other_arch = if std::env::consts::ARCH == "aarch64" {
        "x86_64"
    } else {
        "aarch64"
    };
    let v2 = push_with_kargs_d(
        &env,
        "2",
        &[
            ("10-console.toml", kargs_toml(&["console=tty0", "quiet"])),
            ("20-drop.toml", kargs_toml(&["drop.me=1"])),
            (
                "30-other-arch.toml",
                format!(
                    "{}match-architectures = [\"{other_arch}\"]\n",
                    kargs_toml(&["other.arch"])
                ),
            ),
            // Not a .toml file: not read (bootc skips it too), whatever it holds.
            ("README", "not toml [".into()),
        ],
    );
    assert_success(&env.pivot(&["--karg-append", "mitigations=off", &v2.by_tag]));
    let options = entry_options(&env, "2");
    let has = |options: &[String], arg: &str| options.iter().any(|o| o == arg);
    for arg in [
        "console=tty0",
        "quiet",
        "drop.me=1",
        "nosmt",
        "mitigations=off",
        KARGS[0],
        KARGS[1],
    ] {
        assert!(has(&options, arg), "{arg} missing: {options:?}");
    }
    assert!(!has(&options, "other.arch"), "{options:?}");

    // v3 changes one file, drops another, adds a third.
    let v3 = push_with_kargs_d(
        &env,
        "3",
        &[
            ("10-console.toml", kargs_toml(&["console=tty1", "quiet"])),
            ("40-new.toml", kargs_toml(&["added.in.v3"])),
        ],
    );
    assert_success(&env.pivot(&[&v3.by_tag]));
    let options = entry_options(&env, "3");
    for arg in [
        "console=tty1",
        "quiet",
        "added.in.v3",
        "nosmt",
        "mitigations=off",
        KARGS[0],
        KARGS[1],
    ] {
        assert!(has(&options, arg), "{arg} missing: {options:?}");
    }
    for arg in ["console=tty0", "drop.me=1"] {
        assert!(!has(&options, arg), "{arg} stayed: {options:?}");
    }
    assert_eq!(
        options.iter().filter(|o| *o == "quiet").count(),
        1,
        "{options:?}"
    );

    // Status tells where each came from.
    let status = env.status_json();
    let args = status["deployments"][0]["kernel_arguments"]
        .as_array()
        .unwrap()
        .clone();
    let source = |arg: &str| {
        let a = args
            .iter()
            .find(|a| a["arg"] == arg)
            .unwrap_or_else(|| panic!("{arg}: {args:?}"));
        (
            a["source"].as_str().unwrap().to_string(),
            a["file"].as_str().map(str::to_string),
        )
    };
    assert_eq!(
        source("console=tty1"),
        ("image".into(), Some("10-console.toml".into()))
    );
    assert_eq!(
        source("added.in.v3"),
        ("image".into(), Some("40-new.toml".into()))
    );
    assert_eq!(source("nosmt"), ("admin".into(), None));
    // --karg-append was v2's: on v3 it is carried over, as the installer's are.
    assert_eq!(source("mitigations=off"), ("carried".into(), None));
    assert_eq!(source(KARGS[1]), ("carried".into(), None));
    assert!(args.iter().any(|a| a["source"] == "libostree"), "{args:?}");
    let text = String::from_utf8(env.subcommand("status", &[]).stdout).unwrap();
    // In command-line order: `quiet` stays where it was, console=tty1 came in at the end.
    assert!(
        text.contains("Image kargs: quiet console=tty1 (10-console.toml)"),
        "{text}"
    );
    assert!(text.contains("Admin kargs: nosmt"), "{text}");
}

#[test]
fn an_image_whose_kargs_d_cannot_be_read_is_refused_before_anything_is_written() {
    let env = Env::new();
    let image = push_with_kargs_d(
        &env,
        "2",
        &[(
            "10-console.toml",
            "kargs = [\"console=tty0\"]\narch = [\"x86_64\"]\n".into(),
        )],
    );
    assert_refused(
        &env,
        &[&image.by_tag],
        &[
            "kernel arguments the image ships",
            "10-console.toml",
            "unknown field `arch`",
        ],
    );
    // A quote that is not closed would take the rest of the command line: refused, in one
    // line naming the file and the whole entry.
    let image = push_with_kargs_d(
        &env,
        "3",
        &[(
            "10-debug.toml",
            kargs_toml(&["dyndbg=\"file x +p", "nosmt"]),
        )],
    );
    assert_refused(&env, &[&image.by_tag], &[]);
    let err = stderr(&env.pivot(&[&image.by_tag]));
    let line = err
        .lines()
        .find(|l| l.contains("10-debug.toml"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("kernel arguments the image ships")
            && line.contains("kernel argument `dyndbg=\"file x +p` has an unmatched double quote"),
        "{err}"
    );
}

/// A native image of many files, refused for its kargs.d once its layers are in: pivot moved
/// most of its files into `objects/` while they imported (in batches of 1024: see
/// `import::objects::publish`), and takes every one back.
#[test]
fn a_native_image_of_many_files_refused_after_its_layers_leaves_no_object_behind() {
    let env = Env::new();
    let arch = "kargs = [\"console=tty0\"]\narch = [\"x86_64\"]\n";
    let mut tree = with_kargs_d(fixture("os-v2"), "2", &[("10-console.toml", arch.into())]);
    for i in 0..3000 {
        let path = format!("usr/share/pivot/many/{:02}/{i:04}", i % 30);
        tree = tree.with_file(&path, 0o644, &format!("file {i} of many\n"));
    }
    let oci = crate::native::encapsulate_signed(&tree, false, Some("chunked"), None);
    let image = crate::native::push_native_images(&env, &oci).pullspec(&env, "chunked");
    assert_refused(
        &env,
        &[&image],
        &["kernel arguments the image ships", "unknown field `arch`"],
    );
}

/// Each argument of deployment 0 in `pivot status --json`, with its source and kargs.d file.
fn sources(env: &Env) -> Vec<(String, String, Option<String>)> {
    env.status_json()["deployments"][0]["kernel_arguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["arg"].as_str().unwrap().to_string(),
                a["source"].as_str().unwrap().to_string(),
                a["file"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// bootc's `get_kargs`: a new image with no kargs.d directory keeps the arguments the running
/// image's listed (and the rest of the command line), where pivot used to remove them.
#[test]
fn an_image_without_kargs_d_keeps_the_arguments_the_previous_image_listed() {
    let env = Env::new();
    let v2 = push_with_kargs_d(
        &env,
        "2",
        &[("10-a.toml", kargs_toml(&["from.v2=1", "quiet"]))],
    );
    assert_success(&env.pivot(&[&v2.by_tag]));
    let v3 = push_with_kargs_d(&env, "3", &[]);
    assert_success(&env.pivot(&[&v3.by_tag]));

    let options = entry_options(&env, "3");
    for arg in ["from.v2=1", "quiet", KARGS[0], KARGS[1]] {
        assert_eq!(
            options.iter().filter(|o| *o == arg).count(),
            1,
            "{arg}: {options:?}"
        );
    }
    // v3 lists nothing: they are carried over, as the installer's are.
    assert!(sources(&env).contains(&("from.v2=1".into(), "carried".into(), None)));
}

/// bootc reads a kargs.d file only when its extension is `toml`: a file named just `.toml`
/// has none. A quoted value with spaces is one argument, written to the boot entry intact.
#[test]
fn kargs_d_skips_a_file_named_dot_toml_and_keeps_a_quoted_argument_whole() {
    let env = Env::new();
    let quoted = "dyndbg=\"file drivers/usb/* +p\"";
    let v2 = push_with_kargs_d(
        &env,
        "2",
        &[
            (".toml", kargs_toml(&["from.dot.toml"])),
            ("10-debug.toml", kargs_toml(&[quoted, "nosmt"])),
        ],
    );
    assert_success(&env.pivot(&[&v2.by_tag]));

    let line = options_line(&env, "2");
    assert!(
        line.contains(&format!(" {quoted} ")) || line.ends_with(&format!(" {quoted}")),
        "{line}"
    );
    assert!(!line.contains("from.dot.toml"), "{line}");
    let sources = sources(&env);
    assert!(
        sources.contains(&(quoted.into(), "image".into(), Some("10-debug.toml".into()))),
        "{sources:?}"
    );
    let text = String::from_utf8(env.subcommand("status", &[]).stdout).unwrap();
    assert!(
        text.contains(&format!("Image kargs: {quoted} nosmt (10-debug.toml)")),
        "{text}"
    );

    // A pivot to the same image again leaves the quoted argument as it is, once.
    let v3 = push_with_kargs_d(
        &env,
        "3",
        &[("10-debug.toml", kargs_toml(&[quoted, "nosmt"]))],
    );
    assert_success(&env.pivot(&[&v3.by_tag]));
    assert_eq!(options_line(&env, "3").matches(quoted).count(), 1);
}

/// An argument the admin added is the admin's in status, even when the image lists it too.
#[test]
fn status_names_the_admin_for_an_argument_the_image_also_lists() {
    let env = Env::new();
    let file = env.default_etc().join("pivot/kernel-args");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "ADD nosmt\n").unwrap();
    let v2 = push_with_kargs_d(&env, "2", &[("10-a.toml", kargs_toml(&["quiet", "nosmt"]))]);
    assert_success(&env.pivot(&["--karg-append", "quiet", &v2.by_tag]));

    let options = entry_options(&env, "2");
    for arg in ["quiet", "nosmt"] {
        assert_eq!(
            options.iter().filter(|o| *o == arg).count(),
            1,
            "{options:?}"
        );
    }
    let sources = sources(&env);
    for arg in ["quiet", "nosmt"] {
        assert!(
            sources.contains(&(arg.into(), "admin".into(), None)),
            "{arg}: {sources:?}"
        );
    }
    let text = String::from_utf8(env.subcommand("status", &[]).stdout).unwrap();
    assert!(text.contains("Admin kargs: quiet nosmt"), "{text}");
    assert!(!text.contains("Image kargs"), "{text}");
}
