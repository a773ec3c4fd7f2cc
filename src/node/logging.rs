//! Logging: plain lines on stderr for people (colour only on a terminal); under systemd, the
//! journal directly, with the structured fields of [`crate::node::events`] (`MESSAGE_ID`,
//! `PIVOT_IMAGE`, `PIVOT_DIGEST`, `PIVOT_COMMIT`, `PIVOT_VERSION`) and no terminal escape codes.

use std::io::IsTerminal;

use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::prelude::*;

/// A multi-line message (libostree's signature report, toml's error with the quoted line) as one
/// line: a refusal is one line, in the terminal and the journal alike.
pub fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines.join("; ")
}

pub fn init() {
    let filter =
        EnvFilter::try_from_env("PIVOT_LOG").unwrap_or_else(|_| EnvFilter::new("warn,pivot=info"));
    // systemd sets JOURNAL_STREAM when stderr goes to the journal.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        if let Ok(journald) = tracing_journald::layer() {
            // Field names are written as they are (upper-cased): `message_id` is journald's
            // MESSAGE_ID, `pivot_commit` becomes PIVOT_COMMIT.
            let journald = journald
                .with_field_prefix(None)
                .with_syslog_identifier("pivot".into());
            tracing_subscriber::registry()
                .with(filter)
                .with(journald)
                .init();
            return;
        }
    }
    let stderr = std::io::stderr();
    let ansi = stderr.is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // People read the message; the event fields (ids, image, digest…) are for the journal.
        .fmt_fields(tracing_subscriber::fmt::format::debug_fn(
            |w, field, value| match field.name() {
                "message" => write!(w, "{value:?}"),
                name if name == "message_id" || name.starts_with("pivot_") => Ok(()),
                name => write!(w, " {name}={value:?}"),
            },
        ))
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .without_time()
        .init();
}
