//! Logging: plain lines on stderr for people (colour only on a terminal); under systemd, the
//! journal directly, with structured fields (`PIVOT_IMAGE`, `PIVOT_DIGEST`, `PIVOT_COMMIT`, …)
//! and no terminal escape codes.

use std::io::IsTerminal;

use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::prelude::*;

pub fn init() {
    let filter =
        EnvFilter::try_from_env("PIVOT_LOG").unwrap_or_else(|_| EnvFilter::new("warn,pivot=info"));
    // systemd sets JOURNAL_STREAM when stderr goes to the journal.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        if let Ok(journald) = tracing_journald::layer() {
            let journald = journald
                .with_field_prefix(Some("PIVOT".into()))
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
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .without_time()
        .init();
}
