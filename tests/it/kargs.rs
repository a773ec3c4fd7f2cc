//! Kernel arguments of the new deployment: the merge deployment's, edited by
//! /etc/pivot/kernel-args and --karg-append/--karg-delete, by whole token, in one deployment.

use crate::common::*;

/// The `options` line of the boot entry whose title names `version`.
fn entry_options(env: &Env, version: &str) -> Vec<String> {
    let entries = env.sysroot.boot_entries().unwrap();
    let (_, entry) = entries
        .iter()
        .find(|(_, text)| text.contains(&format!("title Pivot Test OS {version}")))
        .unwrap_or_else(|| panic!("no boot entry for {version}: {entries:?}"));
    entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .expect("an options line")
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
