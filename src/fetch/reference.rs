//! Image references (pullspecs), in the spelling of containers-transports(5):
//!
//! - `[docker://]host[:port]/path[:tag][@sha256:<64 hex>]`: an image in a registry. The registry
//!   host is always explicit: a node must never guess which registry an OS comes from, so
//!   `fedora:latest`-style short names are refused rather than expanded to docker.io.
//! - `oci:DIR[:tag]` and `oci-archive:FILE[:tag]`: an OCI image layout in a directory, or in a
//!   tar file of one (for air-gapped sites and bare metal without a registry). As in
//!   containers-transports, the path ends at the first `:`, and without a tag the layout must
//!   hold one image. pivot also takes `oci:DIR@sha256:…` (the index entry with that digest),
//!   which is how it records what it deployed. Relative paths are made absolute.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

/// containers-transports(5) names pivot does not read, refused by name rather than misparsed.
const OTHER_TRANSPORTS: [&str; 5] = [
    "docker-archive",
    "docker-daemon",
    "containers-storage",
    "dir",
    "ostree",
];

/// Where an image is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Registry,
    /// `oci:`: an OCI image layout directory.
    OciDir,
    /// `oci-archive:`: a tar file holding an OCI image layout.
    OciArchive,
}

impl Transport {
    /// The layout transports, each spelled as its prefix.
    const LAYOUTS: [Transport; 2] = [Transport::OciDir, Transport::OciArchive];

    /// The `transport:` prefix of a layout's pullspec.
    fn prefix(self) -> &'static str {
        match self {
            Transport::Registry => "",
            Transport::OciDir => "oci:",
            Transport::OciArchive => "oci-archive:",
        }
    }
}

/// A parsed pullspec. `digest` wins over `tag` when both are given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub transport: Transport,
    /// `host[:port]` (empty for a layout)
    pub registry: String,
    /// `path/to/repo` inside the registry; for a layout, its absolute path
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 lowercase hex>`
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses a pullspec, naming the offending part when it is malformed.
    pub fn parse(input: &str) -> Result<ImageRef> {
        let spec = input.trim();
        ensure!(!spec.is_empty(), "empty image reference");
        for transport in Transport::LAYOUTS {
            if let Some(rest) = spec.strip_prefix(transport.prefix()) {
                return parse_layout(spec, rest, transport);
            }
        }
        let rest = spec.strip_prefix("docker://").unwrap_or(spec);
        let other = match (rest.split_once("://"), rest.split_once(':')) {
            (Some((transport, _)), _) => Some(transport),
            (None, Some((transport, _))) if OTHER_TRANSPORTS.contains(&transport) => {
                Some(transport)
            }
            _ => None,
        };
        if let Some(transport) = other {
            bail!("unsupported transport {transport:?} in {spec:?}: pivot reads registries (docker://), oci: and oci-archive:");
        }
        ensure!(
            !rest.chars().any(char::is_whitespace),
            "image reference {spec:?} contains white space"
        );

        let (name_tag, digest) = match rest.split_once('@') {
            Some((name_tag, digest)) => (name_tag, Some(parse_digest(digest)?)),
            None => (rest, None),
        };
        let (registry, path_tag) = name_tag.split_once('/').ok_or_else(|| {
            anyhow::anyhow!(
                "image reference {spec:?} has no registry host: write it as host[:port]/path[:tag][@sha256:…]"
            )
        })?;
        validate_registry(registry)?;

        // A ':' after the last '/' separates the tag; the host part was already split off.
        let (repository, tag) = match path_tag.rsplit_once(':') {
            Some((repo, tag)) => (repo, Some(tag)),
            None => (path_tag, None),
        };
        validate_repository(repository)?;
        if let Some(tag) = tag {
            validate_tag(tag)?;
        }
        Ok(ImageRef {
            transport: Transport::Registry,
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// `host[:port]/path` (or `oci:/path`, `oci-archive:/path`), the name without tag or digest.
    pub fn name(&self) -> String {
        match self.transport {
            // A registry host named like a transport (`oci:5000`) keeps its `docker://`, so
            // that the name reads back as the same image.
            Transport::Registry
                if Transport::LAYOUTS
                    .iter()
                    .any(|t| self.registry.starts_with(t.prefix())) =>
            {
                format!("docker://{}/{}", self.registry, self.repository)
            }
            Transport::Registry => format!("{}/{}", self.registry, self.repository),
            layout => format!("{}{}", layout.prefix(), self.repository),
        }
    }

    /// The path of an OCI layout (`None` for a registry image).
    pub fn layout_path(&self) -> Option<&Path> {
        (self.transport != Transport::Registry).then(|| Path::new(&self.repository))
    }

    /// A name for the image usable in an OSTree ref: the repository, or for a layout
    /// `local/<file name>`.
    pub fn ref_name(&self) -> String {
        match self.layout_path() {
            None => self.repository.clone(),
            Some(path) => {
                let file = path.file_name().unwrap_or_default().to_string_lossy();
                let safe: String = file
                    .chars()
                    .map(|c| match c {
                        'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                        _ => '_',
                    })
                    .collect();
                format!("local/{}", safe.trim_start_matches(['-', '_']))
            }
        }
    }

    /// The same image pinned to `digest` (the tag is kept for people to read).
    pub fn with_digest(&self, digest: &str) -> ImageRef {
        ImageRef {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// The pullspec without its digest (the tag kept): what a transport that cannot pin by
    /// digest is told.
    pub fn with_digest_dropped(&self) -> ImageRef {
        ImageRef {
            digest: None,
            ..self.clone()
        }
    }

    /// `name@digest` when pinned, else `name:tag` (`latest` when no tag was given to a
    /// registry image; a layout without a tag is named alone: its only image).
    pub fn pinned_or_tagged(&self) -> String {
        match (&self.digest, &self.tag, self.transport) {
            (Some(d), _, _) => format!("{}@{d}", self.name()),
            (None, None, Transport::OciDir | Transport::OciArchive) => self.name(),
            (None, _, _) => format!("{}:{}", self.name(), self.tag_or_latest()),
        }
    }

    pub fn tag_or_latest(&self) -> &str {
        self.tag.as_deref().unwrap_or("latest")
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// `oci:DIR[:tag][@digest]` or `oci-archive:FILE[:tag][@digest]`, `rest` after the transport.
fn parse_layout(spec: &str, rest: &str, transport: Transport) -> Result<ImageRef> {
    let (path_tag, digest) = match rest.rsplit_once('@') {
        Some((path_tag, digest)) if digest.starts_with("sha256:") => {
            (path_tag, Some(parse_digest(digest)?))
        }
        _ => (rest, None),
    };
    let (path, tag) = match path_tag.split_once(':') {
        Some((path, tag)) => (path, Some(tag)),
        None => (path_tag, None),
    };
    let kind = &transport.prefix()[..transport.prefix().len() - 1];
    ensure!(!path.is_empty(), "{kind} reference {spec:?} names no path");
    // A control character (NUL, CR, …) is never part of a path someone means, and surrounding
    // whitespace is trimmed from pullspecs: such a path would not read back as itself.
    ensure!(
        !path.chars().any(char::is_control),
        "{kind} reference {spec:?} contains a control character"
    );
    if let Some(tag) = tag {
        validate_tag(tag)?;
    }
    let path = std::path::absolute(PathBuf::from(path))
        .with_context(|| format!("making the path of {spec:?} absolute"))?;
    let repository = path
        .to_str()
        .with_context(|| format!("the path of {spec:?} is not UTF-8"))?
        .to_string();
    // `dir /.` is `dir ` once made absolute: its trailing space would be trimmed on reading back.
    ensure!(
        !repository.ends_with(char::is_whitespace),
        "{kind} reference {spec:?} names a path ending in whitespace"
    );
    Ok(ImageRef {
        transport,
        registry: String::new(),
        repository,
        tag: tag.map(str::to_string),
        digest,
    })
}

/// Accepts only `sha256:` followed by 64 lowercase hex digits.
pub fn parse_digest(digest: &str) -> Result<String> {
    let Some((algo, hex)) = digest.split_once(':') else {
        bail!("digest {digest:?} is not of the form sha256:<64 hex digits>");
    };
    ensure!(
        algo == "sha256",
        "digest algorithm {algo:?} is not supported (only sha256)"
    );
    ensure!(
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "digest {digest:?} must have exactly 64 lowercase hex digits after sha256:"
    );
    Ok(digest.to_string())
}

fn validate_registry(registry: &str) -> Result<()> {
    ensure!(!registry.is_empty(), "registry host is empty");
    let (host, port) = if let Some(v6) = registry.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| anyhow::anyhow!("registry host {registry:?} has an unclosed '['"))?;
        ensure!(
            !addr.is_empty() && addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':'),
            "registry host {registry:?} is not a valid IPv6 address"
        );
        (addr, after.strip_prefix(':'))
    } else {
        match registry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (registry, None),
        }
    };
    if !registry.starts_with('[') {
        ensure!(
            host.split('.').all(|label| {
                !label.is_empty()
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            }),
            "registry host {host:?} is not a valid host name"
        );
        // Without a dot, a port or "localhost", the first path element is a repository
        // namespace, not a host (docker's rule); say so instead of looking up a bogus host.
        ensure!(
            host.contains('.') || port.is_some() || host == "localhost",
            "{host:?} is not a registry host (no dot, no port, not localhost): write the registry explicitly, e.g. quay.io/{host}/…"
        );
    }
    if let Some(port) = port {
        let ok = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && matches!(port.parse::<u32>(), Ok(1..=65535));
        ensure!(ok, "registry port {port:?} is not a number from 1 to 65535");
    }
    Ok(())
}

fn validate_repository(repository: &str) -> Result<()> {
    ensure!(!repository.is_empty(), "repository path is empty");
    for component in repository.split('/') {
        ensure!(
            is_path_component(component),
            "repository path component {component:?} is invalid: use lowercase letters, digits and single '.', '_', '__' or '-' separators"
        );
    }
    Ok(())
}

/// distribution's grammar: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
pub(crate) fn is_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        let valid = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
        if !valid {
            return false;
        }
    }
    true
}

fn validate_tag(tag: &str) -> Result<()> {
    let b = tag.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    ensure!(
        ok,
        "tag {tag:?} is invalid: up to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_host_port_path_tag_and_digest() {
        let r = ImageRef::parse(&format!("docker://127.0.0.1:5000/os/node:v2@{D}")).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "os/node");
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(r.pinned_or_tagged(), format!("127.0.0.1:5000/os/node@{D}"));
        assert_eq!(r.to_string(), format!("127.0.0.1:5000/os/node:v2@{D}"));
    }

    #[test]
    fn tagless_reference_means_latest() {
        let r = ImageRef::parse("quay.io/openshift/os").unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.pinned_or_tagged(), "quay.io/openshift/os:latest");
    }

    #[test]
    fn surrounding_whitespace_is_trimmed() {
        let r = ImageRef::parse("  localhost/os:1\n").unwrap();
        assert_eq!(r.name(), "localhost/os");
    }

    #[test]
    fn ipv6_registry_is_accepted() {
        let r = ImageRef::parse("[::1]:5000/os").unwrap();
        assert_eq!(r.registry, "[::1]:5000");
    }

    fn err(spec: &str) -> String {
        format!("{:#}", ImageRef::parse(spec).unwrap_err())
    }

    #[test]
    fn malformed_references_name_the_bad_part() {
        assert!(err("").contains("empty"));
        assert!(err("fedora:latest").contains("no registry host"));
        assert!(err("library/fedora").contains("\"library\" is not a registry host"));
        assert!(err("docker-archive:/tmp/x").contains("unsupported transport \"docker-archive\""));
        assert!(err("oci:").contains("oci reference \"oci:\" names no path"));
        assert!(err("oci:\r/.").contains("contains a control character"));
        assert!(err("oci:/srv/os\t:v2").contains("contains a control character"));
        assert!(err("oci:[fd /.").contains("ending in whitespace"));
        assert!(err("oci-archive::v1").contains("names no path"));
        assert!(err("oci:/srv/os:-bad").contains("tag \"-bad\""));
        assert!(err("oci:/srv/os@sha256:abc").contains("64 lowercase hex"));
        assert!(err("quay.io:99999/os").contains("port \"99999\""));
        assert!(err("quay.io:/os").contains("port \"\""));
        assert!(err("quay.io/Os/Node").contains("component \"Os\""));
        assert!(err("quay.io/os//node").contains("component \"\""));
        assert!(err("quay.io/os:-bad").contains("tag \"-bad\""));
        assert!(err("quay.io/os@sha256:abc").contains("64 lowercase hex"));
        assert!(err("quay.io/os@md5:abc").contains("algorithm \"md5\""));
        assert!(err(&format!(
            "quay.io/os@{}",
            D.to_uppercase().replace("SHA", "sha")
        ))
        .contains("64 lowercase hex"));
        assert!(err("qu ay.io/os").contains("white space"));
        assert!(err("bad_host.io/os").contains("\"bad_host.io\" is not a valid host name"));
    }

    #[test]
    fn layouts_take_a_path_a_tag_and_a_digest() {
        let r = ImageRef::parse("oci:/srv/images/os:v2").unwrap();
        assert_eq!(r.transport, Transport::OciDir);
        assert_eq!(r.layout_path(), Some(Path::new("/srv/images/os")));
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.to_string(), "oci:/srv/images/os:v2");
        assert_eq!(r.pinned_or_tagged(), "oci:/srv/images/os:v2");
        assert_eq!(r.ref_name(), "local/os");

        let r = ImageRef::parse(&format!("oci-archive:/media/usb/os image.tar@{D}")).unwrap();
        assert_eq!(r.transport, Transport::OciArchive);
        assert_eq!(r.repository, "/media/usb/os image.tar");
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(
            r.pinned_or_tagged(),
            format!("oci-archive:/media/usb/os image.tar@{D}")
        );
        assert_eq!(r.ref_name(), "local/os_image_tar");
        // Parsing what it prints gives the same reference back.
        assert_eq!(ImageRef::parse(&r.to_string()).unwrap(), r);
    }

    #[test]
    fn a_registry_host_named_like_a_transport_keeps_its_scheme() {
        let r = ImageRef::parse("docker://oci:5000/os").unwrap();
        assert_eq!(r.transport, Transport::Registry);
        assert_eq!(r.to_string(), "docker://oci:5000/os");
        assert_eq!(ImageRef::parse(&r.to_string()).unwrap(), r);
        assert_eq!(
            ImageRef::parse("oci:5000/os").unwrap().transport,
            Transport::OciDir
        );
    }

    #[test]
    fn untagged_layout_names_its_only_image() {
        let r = ImageRef::parse("oci:/srv/os").unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.pinned_or_tagged(), "oci:/srv/os");
    }

    #[test]
    fn relative_layout_paths_are_made_absolute() {
        let r = ImageRef::parse("oci:images/os").unwrap();
        let expected = std::env::current_dir().unwrap().join("images/os");
        assert_eq!(r.layout_path(), Some(expected.as_path()));
    }

    #[test]
    fn separators_follow_distribution_grammar() {
        assert!(is_path_component("a.b_c__d---e"));
        assert!(!is_path_component("a..b"));
        assert!(!is_path_component("a___b"));
        assert!(!is_path_component("-a"));
    }
}
