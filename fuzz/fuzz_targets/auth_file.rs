//! containers-auth.json: looking credentials up never panics, and an error never repeats a
//! value of the file (credentials must not reach logs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::fetch::config::auth::lookup_in;
use std::path::Path;

const NAMES: [&str; 3] = [
    "quay.io/openshift/os",
    "registry.example.com:5000/a",
    "quay.io",
];

/// What an error may say without repeating the file: the name looked up, the file's path and
/// the fixed wording of pivot's and serde_json's syntax messages. A value that happens to be
/// part of these is no leak.
const SAID_ANYWAY: &[&str] = &[
    "/fuzz/auth.json",
    "not a valid auth file: unexpected JSON structure at line column",
    "the entry for has no \"auth\" field",
    "the \"auth\" of is not base64 is not UTF-8 is not of the form user:password",
    "EOF while parsing a list EOF while parsing an object EOF while parsing a string",
    "EOF while parsing a value expected `:` expected `,` or `]` expected `,` or `}`",
    "expected ident expected value expected `\"` invalid escape invalid number",
    "number out of range invalid unicode code point key must be a string",
    "control character (\\u0000-\\u001F) found while parsing a string",
    "invalid value: expected key to be a number in quotes",
    "float key must be finite (got NaN or +/-inf) lone leading surrogate in hex escape",
    "trailing comma trailing characters unexpected end of hex escape recursion limit exceeded",
];

/// Every string value (not key) in the JSON, however deep.
fn values(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|v| values(v, out)),
        serde_json::Value::Object(o) => o.values().for_each(|v| values(v, out)),
        _ => {}
    }
}

/// `text` with every byte inside every string value (not key) replaced by `Z` (`Y` where the
/// byte was a `Z`): the same JSON shape at the same byte positions, none of the values. What
/// an error about this text says is wording, never a value of the original.
fn without_values(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        let end = end.min(bytes.len());
        let after = bytes[(end + 1).min(bytes.len())..]
            .iter()
            .find(|b| !b.is_ascii_whitespace());
        if after != Some(&b':') {
            for (o, b) in out[start..end].iter_mut().zip(&bytes[start..end]) {
                *o = if *b == b'Z' { b'Y' } else { b'Z' };
            }
        }
        i = end + 1;
    }
    String::from_utf8(out).expect("ASCII replacements of whole strings")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut secrets = Vec::new();
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(text) {
        values(&json, &mut secrets);
    }
    // Short values are too likely to occur in any message by chance.
    secrets.retain(|s| s.len() >= 8);
    let blanked = without_values(text);
    let path = Path::new("/fuzz/auth.json");
    for name in NAMES {
        match lookup_in(text, name, path) {
            Ok(Some(creds)) => {
                let shown = format!("{creds:?}");
                assert!(
                    creds.password.len() < 8 || !shown.contains(&creds.password),
                    "Debug shows the password: {shown}"
                );
            }
            Ok(None) => {}
            Err(e) => {
                let message = format!("{e:#}");
                // A value may occur in the message by coincidence with its wording, the name
                // or the position numbers; then the message about the same file without its
                // values says it too.
                let wording = match lookup_in(&blanked, name, path) {
                    Err(e) => format!("{e:#}"),
                    Ok(_) => String::new(),
                };
                let harmless = |s: &str| {
                    name.contains(s)
                        || wording.contains(s)
                        || SAID_ANYWAY.iter().any(|t| t.contains(s))
                };
                for secret in secrets.iter().filter(|s| !harmless(s)) {
                    assert!(
                        !message.contains(secret.as_str()),
                        "error repeats {secret:?}: {message}"
                    );
                }
            }
        }
    }
});
