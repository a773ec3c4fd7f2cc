//! Where debootstrap downloads from: the host's own apt configuration, read at run time, so no
//! mirror or proxy is ever written into this repository.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::cmd;

const SUITE: &str = "bookworm";

pub struct AptSource {
    /// The first `deb` URI that serves bookworm main.
    pub mirror: String,
    /// apt's `Acquire::http::Proxy`, if set.
    pub proxy: Option<String>,
}

impl AptSource {
    pub fn from_host() -> Result<AptSource> {
        let mirror = match std::env::var("PIVOT_VM_MIRROR") {
            Ok(m) if !m.is_empty() => m,
            _ => host_mirror()?,
        };
        Ok(AptSource {
            mirror,
            proxy: host_proxy()?,
        })
    }

    /// Environment for tools that download (debootstrap, apt-get in the chroot).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match &self.proxy {
            Some(p) => vec![("http_proxy", p.clone()), ("HTTP_PROXY", p.clone())],
            None => Vec::new(),
        }
    }
}

/// apt reads sources.list, then sources.list.d in name order.
fn source_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("list" | "sources")
                )
            })
            .collect();
        more.sort();
        files.extend(more);
    }
    files
}

fn host_mirror() -> Result<String> {
    for file in source_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let found = if file.extension().is_some_and(|e| e == "sources") {
            from_deb822(&text)
        } else {
            from_one_line(&text)
        };
        if let Some(uri) = found {
            return Ok(uri);
        }
    }
    bail!(
        "no apt source serves `deb … {SUITE} main` in {}; set PIVOT_VM_MIRROR to a Debian mirror URL",
        source_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// `deb [options] URI SUITE COMPONENT…` lines.
fn from_one_line(text: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace().peekable();
        if words.next() != Some("deb") {
            continue;
        }
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            // Options run up to the word that ends with ']'.
            for w in words.by_ref() {
                if w.ends_with(']') {
                    break;
                }
            }
        }
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        if suite == SUITE && words.any(|c| c == "main") {
            return Some(uri.to_string());
        }
    }
    None
}

/// deb822 stanzas: `Types:`, `URIs:`, `Suites:`, `Components:`, `Enabled:`.
fn from_deb822(text: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let field = |name: &str| -> Vec<&str> {
            stanza
                .lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| {
                    let (key, value) = l.split_once(':')?;
                    key.trim()
                        .eq_ignore_ascii_case(name)
                        .then(|| value.split_whitespace().collect())
                })
                .unwrap_or_default()
        };
        let enabled = field("Enabled").first().is_none_or(|v| *v != "no");
        if enabled
            && field("Types").contains(&"deb")
            && field("Suites").contains(&SUITE)
            && field("Components").contains(&"main")
        {
            if let Some(uri) = field("URIs").first() {
                return Some(uri.to_string());
            }
        }
    }
    None
}

fn host_proxy() -> Result<Option<String>> {
    if !Path::new("/usr/bin/apt-config").exists() {
        return Ok(None);
    }
    let dump = cmd::run(
        Command::new("apt-config").arg("dump"),
        Duration::from_secs(30),
    )
    .context("reading apt's proxy settings")?;
    Ok(dump.lines().find_map(|line| {
        let value = line.strip_prefix("Acquire::http::Proxy ")?;
        let value = value.trim().trim_end_matches(';').trim_matches('"');
        (!value.is_empty() && value != "DIRECT" && value != "false").then(|| value.to_string())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_bookworm_main_in_both_formats() {
        let one =
            "deb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main contrib\n";
        assert_eq!(
            from_one_line(one).as_deref(),
            Some("http://m.example/debian")
        );
        let stanzas = "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
                       Types: deb deb-src\nURIs: http://m.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n";
        assert_eq!(
            from_deb822(stanzas).as_deref(),
            Some("http://m.example/debian")
        );
    }
}
