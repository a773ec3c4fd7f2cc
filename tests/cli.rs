//! The packaging outputs generated from the command line: man page and shell completions.

use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pivot"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn man_page_documents_every_option_and_the_exit_status() {
    let man = run(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH pivot 1"),
        "{man}"
    );
    for option in [
        "reboot",
        "check",
        "karg\\-append",
        "partial\\-downloads",
        "cert\\-dir",
    ] {
        assert!(
            man.contains(&format!("\\-\\-{option}")),
            "--{option} missing"
        );
    }
    assert!(man.contains("Exit status") && man.contains("77"), "{man}");
}

#[test]
fn completions_are_generated_for_bash_and_zsh() {
    assert!(run(&["completions", "bash"]).contains("--karg-append"));
    assert!(run(&["completions", "zsh"]).contains("#compdef pivot"));
}
