//! containers-policy.json(5): which signatures an image needs, per transport and scope.
//!
//! The file is read as containers/image reads it (`signature/policy_config*.go`): every
//! requirement type and field it knows parses (`signedBaseLayer`, all four `keyType`s,
//! `keyPaths`/`keyDatas`, `fulcio`, `pki`, `rekorPublicKey*`), with its checks (exactly one key
//! source, Fulcio only with a Rekor key, PKI never with one, …); an unknown type or field, a
//! duplicate key, bad base64, or a scope its transport refuses makes the whole policy invalid,
//! as there, because a policy half-understood must not be half-applied. What pivot cannot
//! verify (the key types containers/image does not implement either, `signedBaseLayer`)
//! refuses only the images whose scope requires it, when they are pulled ([`super::Trust`]).
//!
//! The most specific scope wins. For `docker`: the normalized reference with its tag or digest,
//! the repository, each enclosing namespace, the host (with port), then `*.domain` wildcards;
//! for `oci` and `oci-archive`: the layout's path (symlinks resolved) and each enclosing
//! directory, never `/`. Then the transport's `""` scope, then `default`. containers/image
//! validates no `docker` scope (a malformed one never matches, as there) and path scopes must
//! be absolute, clean, and not `/`.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::identity::{self, SignedIdentity};
use crate::fetch::reference::{ImageRef, Transport};

/// Where the containers tools keep the policy.
pub const DEFAULT_PATH: &str = "/etc/containers/policy.json";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub default: Vec<Requirement>,
    #[serde(default)]
    transports: StrictMap<StrictMap<Vec<Requirement>>>,
}

/// A JSON object whose keys may appear once only (containers/image refuses duplicates).
#[derive(Debug, Clone)]
struct StrictMap<V>(BTreeMap<String, V>);

impl<V> Default for StrictMap<V> {
    fn default() -> Self {
        StrictMap(BTreeMap::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for StrictMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Strict<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Strict<V> {
            type Value = StrictMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((key, value)) = map.next_entry::<String, V>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!("duplicate key {key:?}")));
                    }
                    out.insert(key, value);
                }
                Ok(StrictMap(out))
            }
        }
        d.deserialize_map(Strict(PhantomData))
    }
}

/// `signedBy`'s `keyType`s: containers/image parses all four and verifies only `GPGKeys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum KeyType {
    GPGKeys,
    #[serde(rename = "signedByGPGKeys")]
    SignedByGPGKeys,
    X509Certificates,
    #[serde(rename = "signedByX509CAs")]
    SignedByX509CAs,
}

/// Keyless signatures: a Fulcio certificate for an OIDC identity, logged in Rekor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fulcio {
    pub ca_path: Option<String>,
    pub ca_data: Option<String>,
    pub oidc_issuer: Option<String>,
    pub subject_email: Option<String>,
}

/// Signatures by certificates of the admin's own CA (`pki`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pki {
    pub ca_roots_path: Option<String>,
    pub ca_roots_data: Option<String>,
    pub ca_intermediates_path: Option<String>,
    pub ca_intermediates_data: Option<String>,
    pub subject_email: Option<String>,
    pub subject_hostname: Option<String>,
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
    #[serde(rename = "signedBy")]
    SignedBy(SignedBy),
    #[serde(rename = "signedBaseLayer", rename_all = "camelCase")]
    SignedBaseLayer { base_layer_identity: SignedIdentity },
    #[serde(rename = "sigstoreSigned")]
    SigstoreSigned(Box<SigstoreSigned>),
}

/// `signedBy`: simple-signing (GPG) signatures.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignedBy {
    pub key_type: KeyType,
    /// Present (even `""` or `null`) counts as given, as there: `gotKeyPath` in
    /// `prSignedBy.UnmarshalJSON`.
    #[serde(default, deserialize_with = "present")]
    pub key_path: Option<String>,
    pub key_paths: Option<Vec<String>>,
    /// Base64 of the keyring.
    pub key_data: Option<String>,
    #[serde(default, deserialize_with = "identity_not_null")]
    pub signed_identity: Option<SignedIdentity>,
}

/// A field that is there, whatever its value: `null` reads as the type's zero value, as Go's
/// decoder leaves it.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d).map(|v| Some(v.unwrap_or_default()))
}

/// `signedIdentity`, which may be left out but not be `null` (containers/image reads `null`
/// as a match of no known type and refuses the policy).
fn identity_not_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SignedIdentity>, D::Error> {
    match Option::<SignedIdentity>::deserialize(d)? {
        Some(identity) => Ok(Some(identity)),
        None => Err(serde::de::Error::custom(
            "signedIdentity is null, which is no identity match (leave it out for the default)",
        )),
    }
}

/// `sigstoreSigned`: cosign signatures, by key (with or without Rekor), keyless or by PKI.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SigstoreSigned {
    pub key_path: Option<String>,
    pub key_paths: Option<Vec<String>>,
    pub key_data: Option<String>,
    pub key_datas: Option<Vec<String>>,
    pub fulcio: Option<Fulcio>,
    pub pki: Option<Pki>,
    pub rekor_public_key_path: Option<String>,
    pub rekor_public_key_paths: Option<Vec<String>>,
    pub rekor_public_key_data: Option<String>,
    pub rekor_public_key_datas: Option<Vec<String>>,
    #[serde(default, deserialize_with = "identity_not_null")]
    pub signed_identity: Option<SignedIdentity>,
}

impl SigstoreSigned {
    /// Whether a Rekor public key is named.
    pub fn has_rekor(&self) -> bool {
        nonempty(&self.rekor_public_key_path)
            || self.rekor_public_key_paths.is_some()
            || self.rekor_public_key_data.is_some()
            || self.rekor_public_key_datas.is_some()
    }
}

impl Requirement {
    /// The name containers-policy.json(5) gives the requirement's type.
    pub fn kind(&self) -> &'static str {
        match self {
            Requirement::InsecureAcceptAnything {} => "insecureAcceptAnything",
            Requirement::Reject {} => "reject",
            Requirement::SignedBy(_) => "signedBy",
            Requirement::SignedBaseLayer { .. } => "signedBaseLayer",
            Requirement::SigstoreSigned(_) => "sigstoreSigned",
        }
    }
}

impl Policy {
    /// Reads and checks the policy at `path`.
    pub fn load(path: &Path) -> Result<Policy> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Policy::parse(&text).with_context(|| format!("reading {}", path.display()))
    }

    pub fn parse(text: &[u8]) -> Result<Policy> {
        let policy: Policy = serde_json::from_slice(text)?;
        ensure!(
            !policy.default.is_empty(),
            "\"default\" lists no requirement (write [{{\"type\": \"reject\"}}] to refuse everything)"
        );
        for (transport, scopes) in &policy.transports.0 {
            for (scope, requirements) in &scopes.0 {
                if !scope.is_empty() {
                    check_scope(transport, scope)
                        .with_context(|| format!("transport {transport:?}"))?;
                }
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

    /// Whether any scope that may apply to a registry image (the `docker` transport's or the
    /// default) requires more than `insecureAcceptAnything`.
    pub fn requires_anything_of_registry_images(&self) -> bool {
        let lax = |rs: &[Requirement]| {
            rs.iter()
                .all(|r| matches!(r, Requirement::InsecureAcceptAnything {}))
        };
        !lax(&self.default)
            || self
                .transports
                .0
                .get("docker")
                .is_some_and(|scopes| scopes.0.values().any(|rs| !lax(rs)))
    }

    /// The requirements for `image` and the scope they come from (`transport scope`, or
    /// `default`).
    pub fn requirements_for(&self, image: &ImageRef) -> (String, &[Requirement]) {
        let transport = match image.transport {
            Transport::Registry => "docker",
            Transport::OciDir => "oci",
            Transport::OciArchive => "oci-archive",
        };
        if let Some(scopes) = self.transports.0.get(transport) {
            for scope in candidate_scopes(image) {
                if let Some(requirements) = scopes.0.get(&scope) {
                    return (format!("{transport} scope {scope:?}"), requirements);
                }
            }
            if let Some(requirements) = scopes.0.get("") {
                return (format!("{transport} default scope \"\""), requirements);
            }
        }
        ("\"default\"".into(), &self.default)
    }
}

/// A scope its transport accepts, by containers/image's rules for the transports it has.
fn check_scope(transport: &str, scope: &str) -> Result<()> {
    match transport {
        "oci" | "oci-archive" | "dir" | "sif" => {
            ensure!(scope.starts_with('/'), "scope {scope:?} is not an absolute path");
            ensure!(scope != "/", "scope \"/\": use the default scope \"\" instead");
            let clean = clean_path(scope);
            ensure!(clean == scope, "scope {scope:?} is not in canonical form (write {clean:?})");
        }
        "docker-archive" | "tarball" => {
            bail!("scope {scope:?}: this transport has no scopes but the default \"\"")
        }
        "docker-daemon" if super::docker_ref::check_digest(scope).is_ok() => {
            bail!("scope {scope:?}: a digest is not a docker-daemon scope")
        }
        _ => {}
    }
    Ok(())
}

/// Go's `filepath.Clean` for an absolute path: no empty, `.` or `..` components, no trailing `/`.
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// A base64 field (`keyData`, `caData`, …), decoded as Go decodes a JSON `[]byte` (line breaks
/// skipped).
pub fn decode_data(field: &str, data: &str) -> Result<Vec<u8>> {
    super::x509::go_base64(data.as_bytes()).with_context(|| format!("{field} is not base64"))
}

/// How many of `sources` are given (an empty path counts as not given, as there).
fn given(sources: &[bool]) -> usize {
    sources.iter().filter(|&&g| g).count()
}

fn nonempty(s: &Option<String>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

impl Requirement {
    /// What parsing alone cannot see: containers/image's rules on which fields go together.
    fn check(&self) -> Result<()> {
        match self {
            Requirement::SignedBy(r) => {
                // As `prSignedBy.UnmarshalJSON`: exactly one of the three present, and an
                // empty keyPath is none (`newPRSignedBy` counts only a non-empty one).
                ensure!(
                    given(&[r.key_path.is_some(), r.key_paths.is_some(), r.key_data.is_some()]) == 1
                        && r.key_path.as_ref().is_none_or(|p| !p.is_empty()),
                    "signedBy needs exactly one of keyPath, keyPaths and keyData"
                );
                if let Some(data) = &r.key_data {
                    decode_data("keyData", data)?;
                }
                check_identity(r.signed_identity.as_ref())?;
            }
            Requirement::SignedBaseLayer {
                base_layer_identity,
            } => check_identity(Some(base_layer_identity))?,
            Requirement::SigstoreSigned(r) => r.check()?,
            Requirement::InsecureAcceptAnything {} | Requirement::Reject {} => {}
        }
        Ok(())
    }
}

impl SigstoreSigned {
    fn check(&self) -> Result<()> {
        for (name, list) in [
            ("keyPaths", &self.key_paths),
            ("keyDatas", &self.key_datas),
            ("rekorPublicKeyPaths", &self.rekor_public_key_paths),
            ("rekorPublicKeyDatas", &self.rekor_public_key_datas),
        ] {
            ensure!(list.as_ref().is_none_or(|l| !l.is_empty()), "{name} lists nothing");
        }
        let keys = [
            nonempty(&self.key_path),
            self.key_paths.is_some(),
            self.key_data.is_some(),
            self.key_datas.is_some(),
            self.fulcio.is_some(),
            self.pki.is_some(),
        ];
        ensure!(
            given(&keys) == 1,
            "sigstoreSigned needs exactly one of keyPath, keyPaths, keyData, keyDatas, fulcio and pki"
        );
        let rekor = given(&[
            nonempty(&self.rekor_public_key_path),
            self.rekor_public_key_paths.is_some(),
            self.rekor_public_key_data.is_some(),
            self.rekor_public_key_datas.is_some(),
        ]);
        ensure!(
            rekor <= 1,
            "sigstoreSigned takes at most one of rekorPublicKeyPath, rekorPublicKeyPaths, rekorPublicKeyData and rekorPublicKeyDatas"
        );
        ensure!(
            self.fulcio.is_none() || rekor == 1,
            "sigstoreSigned with fulcio needs a Rekor public key (rekorPublicKeyPath, …)"
        );
        ensure!(
            self.pki.is_none() || rekor == 0,
            "sigstoreSigned with pki takes no Rekor public key"
        );
        let datas = [
            ("keyData", self.key_data.as_slice()),
            ("rekorPublicKeyData", self.rekor_public_key_data.as_slice()),
            ("keyDatas", self.key_datas.as_deref().unwrap_or_default()),
            ("rekorPublicKeyDatas", self.rekor_public_key_datas.as_deref().unwrap_or_default()),
        ];
        for (name, values) in datas {
            for data in values {
                decode_data(name, data)?;
            }
        }
        if let Some(f) = &self.fulcio {
            f.check()?;
        }
        if let Some(p) = &self.pki {
            p.check()?;
        }
        check_identity(self.signed_identity.as_ref())
    }
}

fn check_identity(identity: Option<&SignedIdentity>) -> Result<()> {
    match identity.map(SignedIdentity::check) {
        Some(Err(why)) => bail!("signedIdentity: {why}"),
        _ => Ok(()),
    }
}

impl Fulcio {
    fn check(&self) -> Result<()> {
        ensure!(
            given(&[nonempty(&self.ca_path), self.ca_data.is_some()]) == 1,
            "fulcio needs exactly one of caPath and caData"
        );
        if let Some(data) = &self.ca_data {
            decode_data("fulcio caData", data)?;
        }
        ensure!(nonempty(&self.oidc_issuer), "fulcio needs oidcIssuer");
        ensure!(nonempty(&self.subject_email), "fulcio needs subjectEmail");
        Ok(())
    }
}

impl Pki {
    fn check(&self) -> Result<()> {
        ensure!(
            given(&[nonempty(&self.ca_roots_path), self.ca_roots_data.is_some()]) == 1,
            "pki needs exactly one of caRootsPath and caRootsData"
        );
        ensure!(
            given(&[nonempty(&self.ca_intermediates_path), self.ca_intermediates_data.is_some()]) <= 1,
            "pki takes at most one of caIntermediatesPath and caIntermediatesData"
        );
        for (name, data) in [
            ("pki caRootsData", &self.ca_roots_data),
            ("pki caIntermediatesData", &self.ca_intermediates_data),
        ] {
            if let Some(data) = data {
                decode_data(name, data)?;
            }
        }
        ensure!(
            nonempty(&self.subject_email) || nonempty(&self.subject_hostname),
            "pki needs subjectEmail or subjectHostname"
        );
        Ok(())
    }
}

/// The scopes that may name `image`, most specific first (without `""`).
pub(crate) fn candidate_scopes(image: &ImageRef) -> Vec<String> {
    match image.transport {
        Transport::Registry => {
            let mut scopes = Vec::new();
            if let Some(named) = identity::image_reference(image) {
                scopes.push(named.to_string());
            }
            scopes.extend(repository_scopes(image));
            scopes
        }
        Transport::OciDir | Transport::OciArchive => {
            let path = Path::new(&image.repository);
            let resolved = std::fs::canonicalize(path)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| image.repository.trim_end_matches('/').to_string());
            path_and_parents(&resolved)
        }
    }
}

/// The scopes of a registry image's repository, most specific first: `host/ns/repo`
/// (normalized: `docker.io/library/busybox`), each enclosing namespace, the host, then
/// `*.domain` wildcards (`*.example.com` for `a.example.com`, then `*.com`; the port is not
/// part of them). containers-registries.d(5) matches its `docker` scopes the same way.
pub(crate) fn repository_scopes(image: &ImageRef) -> Vec<String> {
    let (name, host) = match identity::image_reference(image) {
        Some(named) => (named.name(), named.domain().to_string()),
        None => (image.name(), image.registry.clone()),
    };
    let mut scopes = Vec::new();
    let mut scope = name.as_str();
    loop {
        scopes.push(scope.to_string());
        match scope.rsplit_once('/') {
            Some((parent, _)) => scope = parent,
            None => break,
        }
    }
    let mut rest = host.split(':').next().unwrap_or_default();
    while let Some((_, parent)) = rest.split_once('.') {
        scopes.push(format!("*.{parent}"));
        rest = parent;
    }
    scopes
}

/// `path`, then each directory that encloses it, never `/` (containers/image refuses `/` as a
/// scope: it would shadow `""`).
fn path_and_parents(path: &str) -> Vec<String> {
    let mut scopes = Vec::new();
    let mut scope = path;
    while !scope.is_empty() && scope != "/" {
        scopes.push(scope.to_string());
        match scope.rsplit_once('/') {
            Some((parent, _)) => scope = parent,
            None => break,
        }
    }
    scopes
}

#[cfg(test)]
mod tests;
