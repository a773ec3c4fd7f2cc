//! Credentials in the formats the registry and the clients read: htpasswd
//! (bcrypt) and containers-auth.json(5).

use anyhow::{ensure, Context, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Low bcrypt cost: these hashes only guard loopback test registries, and
/// distribution checks one per request.
const BCRYPT_COST: u32 = 5;

/// One `user:$2b$...` line; distribution (Go's x/crypto/bcrypt) accepts $2b$.
pub fn htpasswd_line(user: &str, pass: &str) -> Result<String> {
    ensure!(!user.contains(':'), "htpasswd user {user:?} contains ':'");
    let hash = bcrypt::hash(pass, BCRYPT_COST).context("bcrypt-hashing a password")?;
    Ok(format!("{user}:{hash}"))
}

/// The value of an `Authorization: Basic ...` header, also the `auth` field
/// of an auth.json entry.
pub fn basic_auth(user: &str, pass: &str) -> String {
    STANDARD.encode(format!("{user}:{pass}"))
}

/// Writes a containers-auth.json(5) file:
/// `{"auths": {"<key>": {"auth": "base64(user:pass)"}}}` for each
/// `(key, user, pass)`; a key is "127.0.0.1:PORT" or "127.0.0.1:PORT/namespace".
pub fn write_auth_json(path: &Path, entries: &[(&str, &str, &str)]) -> Result<()> {
    let mut auths = Map::new();
    for (key, user, pass) in entries {
        auths.insert(key.to_string(), json!({ "auth": basic_auth(user, pass) }));
    }
    let text = serde_json::to_string_pretty(&json!({ "auths": Value::Object(auths) }))
        .context("serializing auth.json")?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Splits an `Authorization: Basic` value into (user, pass).
pub(crate) fn parse_basic(header: &str) -> Option<(String, String)> {
    let (scheme, b64) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_round_trips_and_htpasswd_verifies() -> Result<()> {
        assert_eq!(basic_auth("user", "pa:ss"), "dXNlcjpwYTpzcw==");
        assert_eq!(
            parse_basic("Basic dXNlcjpwYTpzcw=="),
            Some(("user".into(), "pa:ss".into()))
        );
        assert_eq!(parse_basic("Bearer abc"), None);
        let line = htpasswd_line("user", "secret")?;
        let hash = line.strip_prefix("user:").context("user prefix")?;
        assert!(hash.starts_with("$2b$05$"), "{hash}");
        assert!(bcrypt::verify("secret", hash)?);
        Ok(())
    }
}
