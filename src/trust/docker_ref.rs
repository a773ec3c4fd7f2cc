//! Docker references as containers/image reads them (its `docker/reference` package), for the
//! policy's identities and scopes. A signature names an image the short way as often as the
//! long way (`testing/manifest:latest` is `docker.io/testing/manifest:latest`,
//! `busybox` is `docker.io/library/busybox`), and the policy compares them only after this
//! normalization; so must pivot, or a valid signature is refused and a scope never matches.
//!
//! This is the grammar of its `ParseNormalizedNamed` (a first component without `.` or `:`
//! that is not `localhost` is a path under `docker.io`; `index.docker.io` is `docker.io`; a
//! one-component `docker.io` path is under `library/`), with its limits: lowercase paths,
//! tags `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`, names of at most 255 characters, and digests of
//! an algorithm pivot can check (`sha256`, `sha384`, `sha512`, lowercase hex of its length).
//! A name that is 64 hex digits alone is refused, as there (it would read as an image ID).

use std::fmt;

/// A path component by distribution's grammar, the same for pullspecs and signed identities.
pub(crate) use crate::fetch::reference::is_path_component;

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO: &str = "library";
const NAME_MAX: usize = 255;

/// A parsed reference: always with a domain; a tag, a digest, both or neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    domain: String,
    path: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Named {
    /// `domain/path`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The path inside the registry (`library/busybox`).
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Neither a tag nor a digest.
    pub fn is_name_only(&self) -> bool {
        self.tag.is_none() && self.digest.is_none()
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Parses `s` the way containers/image's `ParseNormalizedNamed` does; the error says why not.
pub fn parse_normalized(s: &str) -> Result<Named, String> {
    if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!("{s:?} is 64 hexadecimal digits, not a repository name"));
    }
    let (domain, remainder) = split_domain(s);
    let remote = remainder.split(':').next().unwrap_or_default();
    if remote.to_lowercase() != remote {
        return Err(format!("{s:?}: a repository name must be lowercase"));
    }
    parse_full(&domain, &remainder).map_err(|why| format!("{s:?} is not a docker reference: {why}"))
}

/// Parses `s`, which must already be in its normalized (canonical) form, as containers/image's
/// `ParseNamed` does (`busybox` is refused: it reads as `docker.io/library/busybox`).
pub fn parse_canonical(s: &str) -> Result<Named, String> {
    let named = parse_normalized(s)?;
    if named.to_string() != s {
        return Err(format!("{s:?} is not in its canonical form {named}"));
    }
    Ok(named)
}

/// The reference of an image pivot pulls from registry `domain` (always explicit in a pullspec,
/// so taken as the domain even without a `.`), normalized as [`parse_normalized`] would.
pub fn from_parts(
    domain: &str,
    path: &str,
    tag: Option<&str>,
    digest: Option<&str>,
) -> Result<Named, String> {
    let domain = match domain {
        LEGACY_DEFAULT_DOMAIN => DEFAULT_DOMAIN,
        other => other,
    };
    let path = match domain == DEFAULT_DOMAIN && !path.contains('/') {
        true => format!("{OFFICIAL_REPO}/{path}"),
        false => path.to_string(),
    };
    let mut rest = path;
    if let Some(tag) = tag {
        rest = format!("{rest}:{tag}");
    }
    if let Some(digest) = digest {
        rest = format!("{rest}@{digest}");
    }
    parse_full(domain, &rest)
}

fn split_domain(s: &str) -> (String, String) {
    let (mut domain, mut remainder) = match s.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), s.to_string()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.into();
    }
    if domain == DEFAULT_DOMAIN && !remainder.contains('/') {
        remainder = format!("{OFFICIAL_REPO}/{remainder}");
    }
    (domain, remainder)
}

/// `domain` and `rest` = `path[:tag][@digest]`, each checked against the grammar.
fn parse_full(domain: &str, rest: &str) -> Result<Named, String> {
    let (name_tag, digest) = match rest.split_once('@') {
        Some((name_tag, digest)) => (name_tag, Some(digest)),
        None => (rest, None),
    };
    let (path, tag) = match name_tag.split_once(':') {
        Some((path, tag)) => (path, Some(tag)),
        None => (name_tag, None),
    };
    if !is_domain(domain) {
        return Err(format!("{domain:?} is not a registry host"));
    }
    if path.is_empty() || !path.split('/').all(is_path_component) {
        return Err(format!("{path:?} is not a repository path"));
    }
    if domain.len() + 1 + path.len() > NAME_MAX {
        return Err(format!("the name is longer than {NAME_MAX} characters"));
    }
    if let Some(tag) = tag {
        if !is_tag(tag) {
            return Err(format!("{tag:?} is not a tag"));
        }
    }
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    Ok(Named {
        domain: domain.to_string(),
        path: path.to_string(),
        tag: tag.map(str::to_string),
        digest: digest.map(str::to_string),
    })
}

/// `component ('.' component)* (':' port)?`, a component being alphanumerics with inner dashes.
pub(crate) fn is_domain(s: &str) -> bool {
    let (host, port) = match s.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (s, None),
    };
    let component = |c: &str| {
        !c.is_empty()
            && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !c.starts_with('-')
            && !c.ends_with('-')
    };
    host.split('.').all(component)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn is_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = t.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
}

/// A digest of an algorithm that is available, with lowercase hex of its length.
pub(crate) fn check_digest(d: &str) -> Result<(), String> {
    let (algorithm, hex) = d
        .split_once(':')
        .ok_or_else(|| format!("{d:?} is not a digest"))?;
    let length = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err(format!("{d:?}: digest algorithm {algorithm:?} is not supported")),
    };
    if hex.len() != length || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!("{d:?} is not a {algorithm} digest"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_normalize_as_in_containers_image() {
        let cases = [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:latest", "docker.io/library/busybox:latest"),
            ("testing/manifest:latest", "docker.io/testing/manifest:latest"),
            ("index.docker.io/busybox", "docker.io/library/busybox"),
            ("docker.io/busybox", "docker.io/library/busybox"),
            ("localhost/x", "localhost/x"),
            ("localhost:5000/x:1", "localhost:5000/x:1"),
            ("quay.io/os/node:4.15", "quay.io/os/node:4.15"),
            ("Quay.io/os/node", "Quay.io/os/node"),
            ("a/b/c", "docker.io/a/b/c"),
            ("a.b/c__d--e.f_g", "a.b/c__d--e.f_g"),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_normalized(input).unwrap().to_string(), expected, "{input}");
        }
        let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let d = parse_normalized(&format!("busybox:latest@{digest}")).unwrap();
        assert_eq!(d.tag.as_deref(), Some("latest"));
        assert_eq!(d.digest.as_deref(), Some(digest.as_str()));
        assert!(parse_canonical("busybox").is_err());
        assert!(parse_canonical("docker.io/library/busybox").is_ok());
    }

    #[test]
    fn malformed_references_are_refused() {
        let hex = "0123456789abcdef".repeat(4);
        for bad in [
            "",
            "UPPERCASE_IS_INVALID_IN_DOCKER_REFERENCES",
            "INVALID",
            "quay.io/OS/node",
            "quay.io/os/node:",
            "quay.io/os/node:-tag",
            "quay.io//node",
            "quay.io/os/-node",
            "quay.io/os/no..de",
            "quay.io/os/no_-de",
            "quay.io/os/node@sha256:abc",
            "quay.io/os/node@md5:0123456789abcdef0123456789abcdef",
            "-quay.io/os/node",
            "quay.io:x/os/node",
            hex.as_str(),
        ] {
            assert!(parse_normalized(bad).is_err(), "{bad:?} parsed");
        }
        let long = format!("quay.io/{}", "a".repeat(250));
        assert!(parse_normalized(&long).is_err());
        let tag = format!("quay.io/x:{}", "t".repeat(129));
        assert!(parse_normalized(&tag).is_err());
    }
}
