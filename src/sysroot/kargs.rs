//! Kernel arguments of the deployment a pivot creates: the merge deployment's (libostree carries
//! them over), edited by openshift/pivot's `/etc/pivot/kernel-args` and by `--karg-append` /
//! `--karg-delete`, all inside that one new deployment.
//!
//! The file holds one edit per line, `ADD <arg>` or `DELETE <arg>`; blank lines and lines
//! starting with `#` are ignored. Matching is by whole token: `DELETE quiet` removes `quiet` and
//! never `quiet=1` or `rd.quiet` (openshift/pivot matched substrings of /proc/cmdline, so an arg
//! that was a substring of another was wrongly taken as present). `ADD` appends an arg only when
//! no token equals it; `DELETE` removes every token equal to it. The file is applied to every
//! deployment pivot creates and is left in place: re-applying it is a no-op. The command line
//! they edit is split as the kernel splits it ([`split`]), so a quoted argument an image ships
//! (`dyndbg="file x +p"`) is one token; the admin's own arguments hold no quotes.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// Relative to the system's /etc.
pub const KARGS_FILE: &str = "pivot/kernel-args";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    Add(String),
    Delete(String),
}

/// Parses the kernel-args file's text; an error names the line.
pub fn parse(text: &str) -> Result<Vec<Edit>> {
    let mut edits = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        edits.push(parse_line(line).with_context(|| format!("line {}: {line:?}", n + 1))?);
    }
    Ok(edits)
}

fn parse_line(line: &str) -> Result<Edit> {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or_default();
    let arg = words.next();
    ensure!(
        words.next().is_none(),
        "one argument per line (quote nothing; write one line per argument)"
    );
    let Some(arg) = arg else {
        bail!("{verb} needs an argument");
    };
    let arg = check_arg(arg)?;
    match verb {
        "ADD" => Ok(Edit::Add(arg)),
        "DELETE" => Ok(Edit::Delete(arg)),
        other => bail!("unknown verb {other:?}: expected ADD or DELETE"),
    }
}

/// A kernel argument as one token: no whitespace (by construction), no quotes or control bytes.
pub fn check_arg(arg: &str) -> Result<String> {
    ensure!(!arg.is_empty(), "empty kernel argument");
    ensure!(
        !arg.chars()
            .any(|c| c.is_control() || c == '"' || c.is_whitespace()),
        "kernel argument {arg:?} holds a quote, space or control character"
    );
    ensure!(
        !is_libostrees(arg),
        "the ostree= argument is libostree's to set"
    );
    Ok(arg.to_string())
}

/// Reads `<etc>/pivot/kernel-args`; a missing file means no edits.
pub fn read_file(etc: &Path) -> Result<Vec<Edit>> {
    let path = etc.join(KARGS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("not UTF-8 text"))
                .and_then(|text| parse(&text))
                .with_context(|| format!("reading {}", path.display()))?;
            Ok(text)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The arguments of command line `cmdline`, split as the kernel splits it: at ASCII whitespace
/// outside double quotes, so that `dyndbg="file x +p"` is one argument (bootc's parser,
/// `linux_kernel_cmdline` 0.1.1 `CmdlineIterBytes`, splits the same way).
pub fn split(cmdline: &str) -> Vec<&str> {
    let mut args = Vec::new();
    let mut rest = cmdline.trim_ascii_start();
    while !rest.is_empty() {
        let mut quoted = false;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                quoted ^= c == '"';
                !quoted && c.is_ascii_whitespace()
            })
            .map_or(rest.len(), |(i, _)| i);
        args.push(&rest[..end]);
        rest = rest[end..].trim_ascii_start();
    }
    args
}

/// An argument's key (`-` read as `_`) and value, without the quotes around it or its value: what
/// bootc compares (`linux_kernel_cmdline` 0.1.1 `Parameter::parse_internal` and its `PartialEq`).
fn key_value(arg: &str) -> (impl Iterator<Item = char> + '_, Option<&str>) {
    let bare = arg.strip_prefix('"').unwrap_or(arg);
    let bare = bare.strip_suffix('"').unwrap_or(bare);
    let (key, value) = match bare.split_once('=') {
        Some((key, value)) => (key, Some(value.strip_prefix('"').unwrap_or(value))),
        None => (bare, None),
    };
    (key.chars().map(|c| if c == '-' { '_' } else { c }), value)
}

/// Whether `a` and `b` are the same argument as bootc counts them: the same key, `-` and `_`
/// alike, and the same value, quotes aside (`a-b="x y"` is `a_b=x y`'s double; `a` is not `a=`'s).
pub fn same(a: &str, b: &str) -> bool {
    let ((a_key, a_value), (b_key, b_value)) = (key_value(a), key_value(b));
    a_value == b_value && a_key.eq(b_key)
}

/// Whether `arg` is libostree's `ostree=` (quoted or not), which names the deployment to boot.
pub fn is_libostrees(arg: &str) -> bool {
    let (key, value) = key_value(arg);
    value.is_some() && key.eq("ostree".chars())
}

/// `current` (split by [`split`]) with `edits` applied in order.
pub fn apply(current: &str, edits: &[Edit]) -> Vec<String> {
    let mut args: Vec<String> = split(current).into_iter().map(str::to_string).collect();
    for edit in edits {
        match edit {
            Edit::Add(arg) => {
                if !args.iter().any(|a| a == arg) {
                    args.push(arg.clone());
                }
            }
            Edit::Delete(arg) => args.retain(|a| a != arg),
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_lines_become_edits_in_order() {
        let edits = parse("# comment\n\nADD nosmt\n  DELETE quiet  \nADD console=ttyS0,115200n8\n")
            .unwrap();
        assert_eq!(
            edits,
            vec![
                Edit::Add("nosmt".into()),
                Edit::Delete("quiet".into()),
                Edit::Add("console=ttyS0,115200n8".into()),
            ]
        );
    }

    #[test]
    fn invalid_lines_are_errors_naming_the_line() {
        let cases = [
            ("ADD a\nREMOVE b\n", "line 2", "unknown verb \"REMOVE\""),
            ("ADD\n", "line 1", "ADD needs an argument"),
            ("\n\nDELETE a b\n", "line 3", "one argument per line"),
            ("add quiet\n", "line 1", "expected ADD or DELETE"),
            ("ADD a\"b\n", "line 1", "quote"),
            ("ADD ostree=/x\n", "line 1", "libostree"),
        ];
        for (text, line, why) in cases {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(line) && err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn matching_is_by_whole_token_not_substring() {
        let current = "root=UUID=1 quiet=1 rd.quiet console=ttyS0,115200n8 ostree=/ostree/boot.1/x";
        let edits = parse("DELETE quiet\nADD quiet\nADD console=ttyS0\nDELETE rd.quiet\n").unwrap();
        assert_eq!(
            apply(current, &edits).join(" "),
            "root=UUID=1 quiet=1 console=ttyS0,115200n8 ostree=/ostree/boot.1/x quiet console=ttyS0"
        );
    }

    #[test]
    fn applying_twice_changes_nothing_more() {
        let edits = parse("ADD a=1\nDELETE b\n").unwrap();
        let once = apply("b c", &edits);
        assert_eq!(apply(&once.join(" "), &edits), once);
        assert_eq!(once, vec!["c", "a=1"]);
    }

    /// Splitting as bootc splits: `linux_kernel_cmdline` 0.1.1 `src/bytes.rs::tests::`
    /// `test_iter_bytes_with_quotes`, `test_iter_bytes_extra_whitespace`,
    /// `test_iter_bytes_empty`, `test_kargs_simple`, and the kernel's unmatched quote.
    #[test]
    fn bootc_kernel_cmdline_test_iter_bytes() {
        assert_eq!(split("foo=\"bar baz\" qux"), ["foo=\"bar baz\"", "qux"]);
        assert_eq!(split("  foo   bar  "), ["foo", "bar"]);
        assert!(split("").is_empty());
        assert_eq!(
            split("foo=bar,bar2 baz=fuz wiz"),
            ["foo=bar,bar2", "baz=fuz", "wiz"]
        );
        assert_eq!(
            split("  root=UUID=1\tdyndbg=\"file x +p\" \"a b\"  quiet\n"),
            ["root=UUID=1", "dyndbg=\"file x +p\"", "\"a b\"", "quiet"]
        );
        assert!(split(" \t ").is_empty());
        // An unmatched quote runs to the end, as in the kernel.
        assert_eq!(split("a=\"b c d"), ["a=\"b c d"]);
        // Splitting is at ASCII whitespace only, as the kernel's isspace().
        assert_eq!(split("a\u{a0}b c"), ["a\u{a0}b", "c"]);
    }

    /// bootc's equality of two arguments: the cases of `linux_kernel_cmdline` 0.1.1 (the crate
    /// bootc 534c76e uses), `src/bytes.rs::tests::test_parameter_equality`.
    #[test]
    fn bootc_kernel_cmdline_test_parameter_equality() {
        assert!(!same("foo", "foobar") && !same("foobar", "foo"));
        assert!(same("a-delimited-param", "a_delimited_param"));
        assert!(same(
            "a-delimited-param=same_values",
            "a_delimited_param=same_values"
        ));
        assert!(!same(
            "a-delimited-param=different_values",
            "a_delimited_param=DiFfErEnT_valUEZ"
        ));
        assert!(!same("same_key", "same_key=but_with_a_value"));
        // Only the key's dashes are underscores.
        assert!(!same("a=b-c", "a=b_c"));
    }

    /// Quotes in bootc's comparison: `linux_kernel_cmdline` 0.1.1
    /// `src/bytes.rs::tests::test_parameter_pathological` and `test_parameter_quoted`.
    #[test]
    fn bootc_kernel_cmdline_test_parameter_pathological() {
        // A quote closed before `=` stays in the key...
        assert!(!same("\"foo\"=bar", "foo=bar"));
        // ...one closed right after it does not.
        assert!(same("\"foo=\"bar", "foo=bar"));
        assert!(same("foo=\"bar baz\"", "\"foo=bar baz\""));
        assert!(same("foo=\"bar\"", "foo=bar") && same("\"quiet\"", "quiet"));
        // Quotes inside a value are the value's.
        assert!(!same("foo=\"a\"b\"", "foo=ab"));
    }

    #[test]
    fn delete_removes_every_copy() {
        assert_eq!(
            apply("x a x", &[Edit::Delete("x".into())]),
            vec!["a".to_string()]
        );
    }
}
