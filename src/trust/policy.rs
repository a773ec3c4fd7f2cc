//! containers-policy.json(5): which signatures an image needs, per transport and scope.
//!
//! The file is read as the containers tools read it: unknown requirement types and fields are
//! refused (a policy pivot cannot honour must not be half-applied), and the most specific scope
//! wins. For the `docker` transport: the reference with its tag or digest, the repository, each
//! enclosing namespace, the host (with port), then `*.domain` wildcards from the most specific;
//! for `oci` and `oci-archive`: the layout's path with its tag, the path, then each enclosing
//! directory. Then the transport's `""` scope, then `default`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use serde::Deserialize;

use super::identity::SignedIdentity;
use crate::fetch::reference::{ImageRef, Transport};

/// Where the containers tools keep the policy.
pub const DEFAULT_PATH: &str = "/etc/containers/policy.json";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub default: Vec<Requirement>,
    #[serde(default)]
    pub transports: BTreeMap<String, BTreeMap<String, Vec<Requirement>>>,
}

/// One requirement; every requirement of a scope must hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum Requirement {
    // Empty structs rather than unit variants: serde lets unit variants of a tagged enum
    // carry unknown fields.
    #[serde(rename = "insecureAcceptAnything")]
    InsecureAcceptAnything {},
    #[serde(rename = "reject")]
    Reject {},
    #[serde(rename = "signedBy", rename_all = "camelCase")]
    SignedBy {
        key_type: String,
        #[serde(default)]
        key_path: Option<String>,
        #[serde(default)]
        key_paths: Option<Vec<String>>,
        /// Base64 of the keyring.
        #[serde(default)]
        key_data: Option<String>,
        #[serde(default)]
        signed_identity: Option<SignedIdentity>,
    },
    // The key fields repeat signedBy's: serde cannot flatten them into a shared struct and
    // still deny unknown fields.
    #[serde(rename = "sigstoreSigned", rename_all = "camelCase")]
    SigstoreSigned {
        #[serde(default)]
        key_path: Option<String>,
        #[serde(default)]
        key_paths: Option<Vec<String>>,
        #[serde(default)]
        key_data: Option<String>,
        #[serde(default)]
        fulcio: Option<serde_json::Value>,
        #[serde(default)]
        rekor_public_key_path: Option<String>,
        #[serde(default)]
        rekor_public_key_data: Option<String>,
        #[serde(default)]
        signed_identity: Option<SignedIdentity>,
    },
}

impl Requirement {
    /// The name containers-policy.json(5) gives the requirement's type.
    pub fn kind(&self) -> &'static str {
        match self {
            Requirement::InsecureAcceptAnything {} => "insecureAcceptAnything",
            Requirement::Reject {} => "reject",
            Requirement::SignedBy { .. } => "signedBy",
            Requirement::SigstoreSigned { .. } => "sigstoreSigned",
        }
    }
}

impl Policy {
    /// Reads and checks the policy at `path`.
    pub fn load(path: &Path) -> Result<Policy> {
        let text =
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Policy::parse(&text).with_context(|| format!("reading {}", path.display()))
    }

    pub fn parse(text: &[u8]) -> Result<Policy> {
        let policy: Policy = serde_json::from_slice(text)?;
        ensure!(
            !policy.default.is_empty(),
            "\"default\" lists no requirement (write [{{\"type\": \"reject\"}}] to refuse everything)"
        );
        for (transport, scopes) in &policy.transports {
            for (scope, requirements) in scopes {
                ensure!(
                    !requirements.is_empty(),
                    "scope {scope:?} of transport {transport:?} lists no requirement"
                );
                for requirement in requirements {
                    requirement
                        .check()
                        .with_context(|| format!("scope {scope:?} of transport {transport:?}"))?;
                }
            }
        }
        for requirement in &policy.default {
            requirement.check().context("\"default\"")?;
        }
        Ok(policy)
    }

    /// The requirements for `image` and the scope they come from (`transport scope`, or
    /// `default`).
    pub fn requirements_for(&self, image: &ImageRef) -> (String, &[Requirement]) {
        let transport = match image.transport {
            Transport::Registry => "docker",
            Transport::OciDir => "oci",
            Transport::OciArchive => "oci-archive",
        };
        if let Some(scopes) = self.transports.get(transport) {
            for scope in candidate_scopes(image) {
                if let Some(requirements) = scopes.get(&scope) {
                    return (format!("{transport} scope {scope:?}"), requirements);
                }
            }
            if let Some(requirements) = scopes.get("") {
                return (format!("{transport} default scope \"\""), requirements);
            }
        }
        ("\"default\"".into(), &self.default)
    }
}

impl Requirement {
    /// What parsing alone cannot see: a key source given exactly once, a known key type.
    fn check(&self) -> Result<()> {
        let sources = |path: &Option<String>, paths: &Option<Vec<String>>, data: &Option<String>| {
            [path.is_some(), paths.is_some(), data.is_some()]
                .iter()
                .filter(|&&given| given)
                .count()
        };
        match self {
            Requirement::SignedBy {
                key_type,
                key_path,
                key_paths,
                key_data,
                ..
            } => {
                ensure!(
                    key_type == "GPGKeys",
                    "signedBy keyType {key_type:?}: only \"GPGKeys\" is defined"
                );
                ensure!(
                    sources(key_path, key_paths, key_data) == 1,
                    "signedBy needs exactly one of keyPath, keyPaths and keyData"
                );
            }
            Requirement::SigstoreSigned {
                key_path,
                key_paths,
                key_data,
                fulcio,
                ..
            } => {
                // Keyless (fulcio) requirements are refused when an image needs them, not here:
                // a policy may hold them for images this node never pulls.
                let keys = sources(key_path, key_paths, key_data) + usize::from(fulcio.is_some());
                ensure!(
                    keys == 1,
                    "sigstoreSigned needs exactly one of keyPath, keyPaths, keyData and fulcio"
                );
            }
            Requirement::InsecureAcceptAnything {} | Requirement::Reject {} => {}
        }
        Ok(())
    }
}

/// The scopes that may name `image`, most specific first (without `""`).
fn candidate_scopes(image: &ImageRef) -> Vec<String> {
    let mut scopes = Vec::new();
    match image.transport {
        Transport::Registry => {
            let name = format!("{}/{}", image.registry, image.repository);
            if let Some(digest) = &image.digest {
                scopes.push(format!("{name}@{digest}"));
            }
            if let Some(tag) = &image.tag {
                scopes.push(format!("{name}:{tag}"));
            }
            scopes.extend(repository_scopes(image));
        }
        Transport::OciDir | Transport::OciArchive => {
            let path = image.repository.trim_end_matches('/');
            if let Some(tag) = &image.tag {
                scopes.push(format!("{path}:{tag}"));
            }
            scopes.extend(path_and_parents(path));
        }
    }
    scopes
}

/// The scopes of a registry image's repository, most specific first: `host/ns/repo`, each
/// enclosing namespace, the host, then `*.domain` wildcards (`*.example.com` for
/// `a.example.com`, then `*.com`; the port is not part of them). containers-registries.d(5)
/// matches its `docker` scopes the same way.
pub(crate) fn repository_scopes(image: &ImageRef) -> Vec<String> {
    let mut scopes = path_and_parents(&format!("{}/{}", image.registry, image.repository));
    let mut rest = image.registry.split(':').next().unwrap_or_default();
    while let Some((_, parent)) = rest.split_once('.') {
        scopes.push(format!("*.{parent}"));
        rest = parent;
    }
    scopes
}

/// `path`, then each path that encloses it (`/` for an absolute path's root).
fn path_and_parents(path: &str) -> Vec<String> {
    let mut scopes = vec![path.to_string()];
    let mut scope = path;
    while let Some((parent, _)) = scope.rsplit_once('/') {
        scopes.push(if parent.is_empty() { "/".into() } else { parent.to_string() });
        scope = parent;
    }
    scopes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    fn scope_of(policy: &str, reference: &str) -> String {
        let policy = Policy::parse(policy.as_bytes()).unwrap();
        policy.requirements_for(&image(reference)).0
    }

    const POLICY: &str = r#"{
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {
                "": [{"type": "insecureAcceptAnything"}],
                "quay.io/os/node:4.15": [{"type": "reject"}],
                "quay.io/os/node": [{"type": "reject"}],
                "quay.io/os": [{"type": "reject"}],
                "quay.io": [{"type": "reject"}],
                "*.example.com": [{"type": "reject"}],
                "*.com": [{"type": "reject"}],
                "reg.example.com:5000/ns": [{"type": "reject"}]
            },
            "oci": {"/srv/images": [{"type": "reject"}]}
        }
    }"#;

    #[test]
    fn the_most_specific_scope_wins() {
        let cases = [
            ("quay.io/os/node:4.15", "docker scope \"quay.io/os/node:4.15\""),
            ("quay.io/os/node:4.16", "docker scope \"quay.io/os/node\""),
            ("quay.io/os/other", "docker scope \"quay.io/os\""),
            ("quay.io/else/x", "docker scope \"quay.io\""),
            ("a.b.example.com/x", "docker scope \"*.example.com\""),
            ("reg.example.com:5000/ns/os", "docker scope \"reg.example.com:5000/ns\""),
            ("reg.example.com:5000/other/os", "docker scope \"*.example.com\""),
            ("mirror.org/x", "docker default scope \"\""),
            ("oci:/srv/images/os:v2", "oci scope \"/srv/images\""),
            ("oci-archive:/srv/images/os.tar", "\"default\""),
        ];
        for (reference, scope) in cases {
            assert_eq!(scope_of(POLICY, reference), scope, "{reference}");
        }
        assert_eq!(
            scope_of(r#"{"default": [{"type": "insecureAcceptAnything"}]}"#, "quay.io/x"),
            "\"default\""
        );
    }

    #[test]
    fn a_policy_pivot_cannot_honour_whole_is_refused() {
        let refused = [
            (r#"{"default": []}"#, "lists no requirement"),
            (r#"{"default": [{"type": "signedByX"}]}"#, "unknown variant"),
            (
                r#"{"default": [{"type": "reject", "extra": 1}]}"#,
                "unknown field",
            ),
            (
                r#"{"default": [{"type": "signedBy", "keyType": "X509Certificates", "keyPath": "/k"}]}"#,
                "only \"GPGKeys\"",
            ),
            (
                r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}"#,
                "exactly one of",
            ),
            (
                r#"{"default": [{"type": "sigstoreSigned", "fulcio": {}, "keyPath": "/k"}]}"#,
                "exactly one of",
            ),
            (r#"{"default": [{"type": "reject"}], "transports": {"docker": {"x": []}}}"#, "lists no requirement"),
        ];
        for (text, expected) in refused {
            let err = format!("{:#}", Policy::parse(text.as_bytes()).unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
