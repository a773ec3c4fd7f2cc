//! The packaging outputs generated from the command line at build time (build.rs): man pages
//! and shell completions.

use std::path::Path;
use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pivot"))
        .args(args)
        .output()
        .unwrap();
    crate::common::no_panic(&out);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn asset(path: &str) -> String {
    let path = Path::new(env!("OUT_DIR")).join("assets").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn man_page_documents_every_option_and_the_exit_status() {
    let man = asset("man/pivot.1");
    assert!(man.contains(".TH pivot 1"), "{man}");
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
    // A page a subcommand, none for clap's `help`.
    let status = asset("man/pivot-status.1");
    assert!(status.contains("\\-\\-json"), "{status}");
    let pages = std::fs::read_dir(Path::new(env!("OUT_DIR")).join("assets/man")).unwrap();
    let mut names: Vec<String> = pages
        .map(|p| p.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "pivot-config.1",
            "pivot-confirm.1",
            "pivot-diff.1",
            "pivot-finalize.1",
            "pivot-rollback.1",
            "pivot-status.1",
            "pivot-steady-state.1",
            "pivot.1"
        ]
    );
}

#[test]
fn completions_are_generated_for_bash_zsh_and_fish() {
    assert!(asset("completions/pivot.bash").contains("--karg-append"));
    assert!(asset("completions/_pivot").contains("#compdef pivot"));
    assert!(asset("completions/pivot.fish").contains("karg-append"));
}

/// The long options `text` names as `--name` (a word after two dashes).
fn long_options(text: &str) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let name: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.len() > 1 && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            found.insert(name);
        }
    }
    found
}

#[test]
fn the_options_table_in_the_docs_lists_exactly_the_options_of_help() {
    let help = long_options(&run(&["--help"]));
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/usage.md")).unwrap();
    // The table: its rows start with the option, in backquotes.
    let table: String = docs
        .lines()
        .filter(|l| l.starts_with("| `-"))
        .map(|l| l.split(" | ").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let documented = long_options(&table);
    let mut help = help;
    help.remove("help");
    help.remove("version");
    assert_eq!(
        documented, help,
        "docs/usage.md's options table and --help differ"
    );
}

/// Every journal event pivot defines (src/node/events.rs) has its entry in the journal catalog
/// (systemd/pivot.catalog), as journalctl itself reads it.
#[test]
fn the_journal_catalog_explains_every_event() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let events = std::fs::read_to_string(repo.join("src/node/events.rs")).unwrap();
    let ids: std::collections::BTreeSet<String> = events
        .lines()
        .filter_map(|l| l.strip_prefix("pub const ")?.split('"').nth(1))
        .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
        .collect();
    assert!(ids.len() >= 11, "{ids:?}");

    let root = tempfile::tempdir().unwrap();
    let catalogs = root.path().join("usr/lib/systemd/catalog");
    std::fs::create_dir_all(&catalogs).unwrap();
    std::fs::copy(
        repo.join("systemd/pivot.catalog"),
        catalogs.join("pivot.catalog"),
    )
    .unwrap();
    let journalctl = |arg: &str| {
        let out = std::process::Command::new("journalctl")
            .arg(format!("--root={}", root.path().display()))
            .arg(arg)
            .output()
            .unwrap();
        assert!(out.status.success(), "journalctl {arg}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    journalctl("--update-catalog");
    let listed: std::collections::BTreeSet<String> = journalctl("--list-catalog")
        .lines()
        .filter(|l| l.contains(" pivot: "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(listed, ids);
}
