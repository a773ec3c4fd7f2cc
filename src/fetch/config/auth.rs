//! Registry credentials in containers-auth.json(5) format.
//!
//! Looked up, first match wins, in: `--authfile PATH` (alone, when given), else
//! `$REGISTRY_AUTH_FILE`, `/run/ostree/auth.json`, `/etc/ostree/auth.json`,
//! `/usr/lib/ostree/auth.json` (ostree's order: runtime, then admin, then vendor), and the kubelet
//! pull secret `/var/lib/kubelet/config.json`. Within a file the most specific key wins:
//! `host[:port]/path/to/repo`, then shorter paths, then `host[:port]`; Docker's legacy
//! `https://host/v1/` keys are accepted. Only `auth` (base64 `user:password`) entries are used.
//!
//! Credentials are kept in [`Credentials`], whose `Debug` never shows the password, and are never
//! logged; only the file they came from is.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// Default places, after `$REGISTRY_AUTH_FILE`.
pub const DEFAULT_FILES: [&str; 4] = [
    "/run/ostree/auth.json",
    "/etc/ostree/auth.json",
    "/usr/lib/ostree/auth.json",
    "/var/lib/kubelet/config.json",
];

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// The file they were read from.
    pub source: PathBuf,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Credentials({} from {})",
            self.username,
            self.source.display()
        )
    }
}

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::HashMap<String, Entry>,
}

#[derive(Deserialize)]
struct Entry {
    auth: Option<String>,
}

/// Which auth files to read.
#[derive(Debug, Clone)]
pub struct AuthFiles {
    files: Vec<PathBuf>,
    /// An explicitly named file must exist.
    explicit: bool,
}

impl AuthFiles {
    /// `--authfile` if given, else the documented search list.
    pub fn new(authfile: Option<&Path>) -> AuthFiles {
        match authfile {
            Some(path) => AuthFiles {
                files: vec![path.to_path_buf()],
                explicit: true,
            },
            None => {
                let mut files: Vec<PathBuf> = std::env::var_os("REGISTRY_AUTH_FILE")
                    .map(PathBuf::from)
                    .into_iter()
                    .collect();
                files.extend(DEFAULT_FILES.iter().map(PathBuf::from));
                AuthFiles {
                    files,
                    explicit: false,
                }
            }
        }
    }

    /// Credentials for `name` (`host[:port]/path`), if any file has them.
    pub fn lookup(&self, name: &str) -> Result<Option<Credentials>> {
        for file in &self.files {
            let text = match std::fs::read_to_string(file) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.explicit => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("reading auth file {}", file.display()))
                }
            };
            if let Some(creds) = lookup_in(&text, name, file)
                .with_context(|| format!("reading auth file {}", file.display()))?
            {
                return Ok(Some(creds));
            }
        }
        Ok(None)
    }
}

/// Credentials for `name` in the text of one auth file (`source` is recorded with them).
pub fn lookup_in(text: &str, name: &str, source: &Path) -> Result<Option<Credentials>> {
    let file: AuthFile = serde_json::from_str(text)
        .map_err(|e| anyhow!("not a valid auth file: {}", json_error(&e)))?;
    let normalized: Vec<(String, &Entry)> = file
        .auths
        .iter()
        .map(|(key, entry)| (normalize_key(key), entry))
        .collect();
    // Most specific first: the full name, then each parent namespace, then the host.
    let mut candidate = name;
    loop {
        if let Some((_, entry)) = normalized.iter().find(|(k, _)| k == candidate) {
            return decode(entry, candidate, source).map(Some);
        }
        match candidate.rsplit_once('/') {
            Some((parent, _)) => candidate = parent,
            None => return Ok(None),
        }
    }
}

/// serde_json's message without the file's content: its data errors quote the value that did not
/// fit (`invalid type: string "<credentials>" …`), so of those only the position is kept.
fn json_error(e: &serde_json::Error) -> String {
    match e.classify() {
        serde_json::error::Category::Data => format!(
            "unexpected JSON structure at line {} column {}",
            e.line(),
            e.column()
        ),
        _ => e.to_string(),
    }
}

/// `https://quay.io/v1/` → `quay.io`.
fn normalize_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let key = key.trim_end_matches('/');
    let key = key
        .strip_suffix("/v1")
        .or_else(|| key.strip_suffix("/v2"))
        .unwrap_or(key);
    key.to_string()
}

fn decode(entry: &Entry, key: &str, source: &Path) -> Result<Credentials> {
    use base64::Engine as _;
    let Some(auth) = &entry.auth else {
        bail!("the entry for {key} has no \"auth\" field");
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| anyhow!("the \"auth\" of {key} is not base64"))?;
    let text =
        String::from_utf8(bytes).map_err(|_| anyhow!("the \"auth\" of {key} is not UTF-8"))?;
    let Some((username, password)) = text.split_once(':') else {
        bail!("the \"auth\" of {key} is not of the form user:password");
    };
    Ok(Credentials {
        username: username.to_string(),
        password: password.to_string(),
        source: source.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn auth(user_pass: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    }

    #[test]
    fn most_specific_key_wins() {
        let text = format!(
            r#"{{"auths": {{
                "quay.io": {{"auth": "{}"}},
                "quay.io/openshift": {{"auth": "{}"}},
                "https://index.docker.io/v1/": {{"auth": "{}"}}
            }}}}"#,
            auth("host:h"),
            auth("ns:n"),
            auth("legacy:l")
        );
        let src = Path::new("/x.json");
        let c = lookup_in(&text, "quay.io/openshift/os", src)
            .unwrap()
            .unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("ns", "n"));
        let c = lookup_in(&text, "quay.io/other/os", src).unwrap().unwrap();
        assert_eq!(c.username, "host");
        let c = lookup_in(&text, "index.docker.io/library/os", src)
            .unwrap()
            .unwrap();
        assert_eq!(c.username, "legacy");
        assert!(lookup_in(&text, "registry.example.com/os", src)
            .unwrap()
            .is_none());
    }

    #[test]
    fn passwords_may_contain_colons() {
        let text = format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            auth("u:p:w")
        );
        let c = lookup_in(&text, "r.io/os", Path::new("/a"))
            .unwrap()
            .unwrap();
        assert_eq!(c.password, "p:w");
    }

    #[test]
    fn errors_and_debug_never_show_the_secret() {
        let secret = "s3cr3t-Pa55";
        let c = Credentials {
            username: "u".into(),
            password: secret.into(),
            source: "/a".into(),
        };
        assert!(!format!("{c:?}").contains(secret));
        let bad = format!(r#"{{"auths": {{"r.io": {{"auth": "{secret}"}}}}}}"#);
        let err = format!(
            "{:#}",
            lookup_in(&bad, "r.io/os", Path::new("/a")).unwrap_err()
        );
        assert!(!err.contains(secret), "{err}");
        // Regression (fuzzing): serde_json quotes a value of the wrong type in its message.
        for misplaced in [
            format!(r#"{{"auths": {{"r.io": "{secret}"}}}}"#),
            format!(r#"{{"auths": {{"r.io": {{"auth": ["{secret}"]}}}}}}"#),
            format!(r#"["{secret}"]"#),
        ] {
            let err = format!(
                "{:#}",
                lookup_in(&misplaced, "r.io/os", Path::new("/a")).unwrap_err()
            );
            assert!(!err.contains(secret), "{err}");
            assert!(err.contains("unexpected JSON structure at line 1"), "{err}");
        }
        let broken = format!(r#"{{"auths": {{"r.io": {{"auth": "{secret}""#);
        let err = format!(
            "{:#}",
            lookup_in(&broken, "r.io/os", Path::new("/a")).unwrap_err()
        );
        assert!(!err.contains(secret), "{err}");
    }

    #[test]
    fn explicit_authfile_must_exist_but_defaults_may_be_absent() {
        let err = AuthFiles::new(Some(Path::new("/nonexistent/auth.json")))
            .lookup("r.io/os")
            .unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/auth.json"));
    }
}
