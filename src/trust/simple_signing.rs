//! "Simple signing" (containers-signature(5)): an OpenPGP signed message whose payload is a
//! small JSON document naming the manifest digest and the image identity it vouches for, as
//! `skopeo copy --sign-by` and `podman push --sign-by` write it.
//!
//! OpenPGP is Sequoia's (`sequoia-openpgp`, on the OpenSSL pivot already links for TLS): the
//! implementation RHEL and Fedora verify RPM signatures with (rpm-sequoia), maintained, with a
//! standard policy that refuses weak algorithms (SHA-1 signatures, short keys) by itself. Only
//! verification is used; the payload is read only after its signature verified, and then as
//! strictly as the containers tools read it (exact fields, no unknown keys).

use std::io::Read;

use anyhow::{anyhow, bail, ensure, Context, Result};
use sequoia_openpgp as openpgp;

use openpgp::cert::{Cert, CertParser};
use openpgp::parse::stream::{
    MessageLayer, MessageStructure, VerificationError, VerificationHelper, VerifierBuilder,
};
use openpgp::parse::Parse;
use openpgp::policy::StandardPolicy;
use openpgp::KeyHandle;

/// The payload's `critical.type` for simple signing.
pub const SIMPLE_SIGNING_TYPE: &str = "atomic container signature";
/// The payload's `critical.type` for sigstore (cosign) signatures.
pub const COSIGN_TYPE: &str = "cosign container image signature";

/// Keys a `signedBy` requirement trusts.
pub struct Keyring(Vec<Cert>);

impl Keyring {
    /// Reads keyrings (binary or ASCII-armored, as `gpg --export` writes them).
    pub fn parse(data: &[u8]) -> Result<Keyring> {
        let certs = CertParser::from_bytes(data)
            .context("reading an OpenPGP keyring")?
            .collect::<openpgp::Result<Vec<_>>>()
            .context("reading an OpenPGP keyring")?;
        ensure!(!certs.is_empty(), "the keyring holds no key");
        Ok(Keyring(certs))
    }

    pub fn extend(&mut self, other: Keyring) {
        self.0.extend(other.0);
    }
}

/// Why a signature did not verify, as a person should read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Made by a key the requirement does not trust.
    UnknownKey(String),
    /// Made by a trusted key, but it does not verify (tampered, or not a signature).
    BadSignature(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::UnknownKey(k) => write!(f, "signed by {k}, a key the policy does not trust"),
            Failure::BadSignature(why) => write!(f, "the signature does not verify: {why}"),
        }
    }
}

/// Verifies `message` against `keyring`; the payload and the trusted key's fingerprint.
pub fn verify(message: &[u8], keyring: &Keyring) -> Result<(Vec<u8>, String), Failure> {
    let policy = StandardPolicy::new();
    let helper = Helper {
        keyring,
        good: None,
        failure: None,
    };
    let bad = |e: anyhow::Error| Failure::BadSignature(format!("{e:#}"));
    let mut verifier = VerifierBuilder::from_bytes(message)
        .map_err(bad)?
        .with_policy(&policy, None, helper)
        .map_err(|e| {
            // with_policy already ran `check` when the message is small: its verdict wins.
            match e.downcast::<Failure>() {
                Ok(failure) => failure,
                Err(e) => bad(e),
            }
        })?;
    let mut payload = Vec::new();
    verifier
        .read_to_end(&mut payload)
        .map_err(|e| bad(e.into()))?;
    let helper = verifier.into_helper();
    match helper.good {
        Some(key) => Ok((payload, key)),
        None => Err(helper
            .failure
            .unwrap_or_else(|| Failure::BadSignature("no signature".into()))),
    }
}

impl std::error::Error for Failure {}

struct Helper<'k> {
    keyring: &'k Keyring,
    good: Option<String>,
    failure: Option<Failure>,
}

impl VerificationHelper for Helper<'_> {
    fn get_certs(&mut self, _ids: &[KeyHandle]) -> openpgp::Result<Vec<Cert>> {
        Ok(self.keyring.0.clone())
    }

    fn check(&mut self, structure: MessageStructure) -> openpgp::Result<()> {
        for layer in structure.into_iter() {
            match layer {
                MessageLayer::Compression { .. } => {}
                MessageLayer::Encryption { .. } => {
                    let failure = Failure::BadSignature("the message is encrypted".into());
                    self.failure = Some(failure.clone());
                    return Err(failure.into());
                }
                MessageLayer::SignatureGroup { results } => {
                    let mut failure = None;
                    for result in results {
                        match result {
                            Ok(good) => {
                                self.good = Some(good.ka.key().fingerprint().to_hex());
                                return Ok(());
                            }
                            Err(VerificationError::MissingKey { sig }) => {
                                let issuer = sig
                                    .get_issuers()
                                    .first()
                                    .map(|k| format!("key {}", k.to_hex()))
                                    .unwrap_or_else(|| "an unnamed key".into());
                                failure.get_or_insert(Failure::UnknownKey(issuer));
                            }
                            Err(e) => {
                                // A bad signature by a trusted key outranks an unknown key.
                                failure = Some(Failure::BadSignature(e.to_string()));
                            }
                        }
                    }
                    let failure =
                        failure.unwrap_or_else(|| Failure::BadSignature("no signature".into()));
                    self.failure = Some(failure.clone());
                    return Err(failure.into());
                }
            }
        }
        let failure = Failure::BadSignature("the message is not signed".into());
        self.failure = Some(failure.clone());
        Err(failure.into())
    }
}

/// What a signature payload vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// `critical.image.docker-manifest-digest`.
    pub manifest_digest: String,
    /// `critical.identity.docker-reference`.
    pub reference: String,
}

/// Reads a payload of type `kind`, as strictly as containers/image: no key twice, the objects
/// have exactly the fields containers-signature(5) defines, `optional` is present (an object;
/// for cosign's payloads it may be `null`) and any `creator` in it a string, any `timestamp`
/// an integer; the digest is one pivot can check.
pub fn parse_payload(bytes: &[u8], kind: &str) -> Result<Payload> {
    let super::strict_json::Strict(value) =
        serde_json::from_slice(bytes).context("the signature payload is not JSON")?;
    let top = exact_object(&value, "the payload", &["critical", "optional"], &[])?;
    match &top["optional"] {
        serde_json::Value::Object(optional) => {
            if let Some(creator) = optional.get("creator") {
                ensure!(creator.is_string(), "the payload's optional.creator is not a string");
            }
            if let Some(timestamp) = optional.get("timestamp") {
                let integral = timestamp.is_i64()
                    || timestamp.is_u64()
                    || timestamp.as_f64().is_some_and(|t| t.fract() == 0.0);
                ensure!(integral, "the payload's optional.timestamp is not an integer");
            }
        }
        serde_json::Value::Null if kind == COSIGN_TYPE => {}
        _ => bail!("the payload's \"optional\" is not an object"),
    }
    let critical = exact_object(&top["critical"], "\"critical\"", &["type", "image", "identity"], &[])?;
    let found = critical["type"].as_str().unwrap_or_default();
    ensure!(
        found == kind,
        "the payload's type is {found:?}, not {kind:?}"
    );
    let image = exact_object(&critical["image"], "\"critical.image\"", &["docker-manifest-digest"], &[])?;
    let identity = exact_object(&critical["identity"], "\"critical.identity\"", &["docker-reference"], &[])?;
    let text = |v: &serde_json::Value, what: &str| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("{what} is not a string"))
    };
    let manifest_digest = text(&image["docker-manifest-digest"], "docker-manifest-digest")?;
    super::docker_ref::check_digest(&manifest_digest)
        .map_err(|why| anyhow!("docker-manifest-digest: {why}"))?;
    Ok(Payload {
        manifest_digest,
        reference: text(&identity["docker-reference"], "docker-reference")?,
    })
}

fn exact_object<'v>(
    value: &'v serde_json::Value,
    what: &str,
    fields: &[&str],
    optional: &[&str],
) -> Result<&'v serde_json::Map<String, serde_json::Value>> {
    let object = value
        .as_object()
        .ok_or_else(|| anyhow!("{what} is not an object"))?;
    for key in object.keys() {
        ensure!(fields.contains(&key.as_str()), "{what} has an unknown field {key:?}");
    }
    for field in fields {
        ensure!(
            object.contains_key(*field) || optional.contains(field),
            "{what} lacks {field:?}"
        );
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0b7e4cbe7c5b1ff7a1e0bb3b8a0a1d7e6b9ef7f1d9c8f4e7d3b4e6c2a1b0c9d8";

    fn payload(extra: &str) -> String {
        format!(
            r#"{{"critical":{{"type":"atomic container signature","image":{{"docker-manifest-digest":"{DIGEST}"}},"identity":{{"docker-reference":"quay.io/os:1"}}{extra}}},"optional":{{"creator":"test"}}}}"#
        )
    }

    #[test]
    fn payloads_are_read_as_strictly_as_the_containers_tools_read_them() {
        let read = parse_payload(payload("").as_bytes(), SIMPLE_SIGNING_TYPE).unwrap();
        assert_eq!(read.manifest_digest, DIGEST);
        assert_eq!(read.reference, "quay.io/os:1");
        let err = parse_payload(payload(r#","extra":1"#).as_bytes(), SIMPLE_SIGNING_TYPE);
        assert!(format!("{:#}", err.unwrap_err()).contains("unknown field \"extra\""));
        let err = parse_payload(payload("").as_bytes(), COSIGN_TYPE);
        assert!(format!("{:#}", err.unwrap_err()).contains("not \"cosign"));
        let no_optional = payload("").replace(r#","optional":{"creator":"test"}"#, "");
        assert!(parse_payload(no_optional.as_bytes(), SIMPLE_SIGNING_TYPE).is_err());
        // containers/image requires "optional" in cosign's payloads too; null is allowed there.
        let cosign = no_optional.replace(SIMPLE_SIGNING_TYPE, COSIGN_TYPE);
        assert!(parse_payload(cosign.as_bytes(), COSIGN_TYPE).is_err());
        let null = payload("")
            .replace(SIMPLE_SIGNING_TYPE, COSIGN_TYPE)
            .replace(r#"{"creator":"test"}"#, "null");
        assert!(parse_payload(null.as_bytes(), COSIGN_TYPE).is_ok());
        let twice = payload("").replace(r#""creator":"test""#, r#""creator":"a","creator":"b""#);
        assert!(format!("{:#}", parse_payload(twice.as_bytes(), SIMPLE_SIGNING_TYPE).unwrap_err())
            .contains("duplicate key"));
        let float = payload("").replace(r#""creator":"test""#, r#""timestamp":1.5"#);
        assert!(parse_payload(float.as_bytes(), SIMPLE_SIGNING_TYPE).is_err());
        let bad_digest = payload("").replace(DIGEST, "sha256:abc");
        assert!(parse_payload(bad_digest.as_bytes(), SIMPLE_SIGNING_TYPE).is_err());
        assert!(parse_payload(b"[]", SIMPLE_SIGNING_TYPE).is_err());
    }

    #[test]
    fn keyrings_without_keys_are_refused() {
        assert!(Keyring::parse(b"").is_err());
        assert!(Keyring::parse(b"not a key").is_err());
    }
}
