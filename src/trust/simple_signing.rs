//! "Simple signing" (containers-signature(5)): an OpenPGP signed message whose payload is a
//! small JSON document naming the manifest digest and the image identity it vouches for, as
//! `skopeo copy --sign-by` and `podman push --sign-by` write it.
//!
//! OpenPGP is Sequoia's (`sequoia-openpgp`, on the OpenSSL pivot already links for TLS): the
//! implementation RHEL and Fedora verify RPM signatures with (rpm-sequoia), maintained, with a
//! standard policy that refuses weak algorithms (SHA-1 signatures, short keys) by itself. Only
//! verification is used; the payload is read only after its signature verified, and then as
//! strictly as the containers tools read it (exact fields, no unknown keys).
//!
//! A signature is judged as containers/image judges it with gpgme
//! (`signature/mechanism_gpgme.go`, `gpgmeSigningMechanism.Verify`): the blob must hold exactly
//! one signature (gpgme's result lists every signature packet, good, bad or by an unknown key,
//! and containers/image refuses any count but one), and that signature's summary must be valid
//! but for trust, which the policy decides: no error status, so neither an expired signature
//! (gpg's `EXPSIG`), nor a key that has expired (`EXPKEYSIG`) or been revoked (`REVKEYSIG`)
//! by the time of verification. gpg judges a key's expiry and revocation *now*, whatever the
//! signature's date and whatever the revocation's reason: a key that expired since it signed,
//! or that was revoked as superseded or retired (a "soft" revocation, which Sequoia's own
//! verifier only holds against signatures made after it), refuses the signature; so does an
//! expired or revoked signing subkey. Sequoia checks the signature as of its creation time
//! (and its own expiry now); pivot then checks the certificate and the signing key as of now.

use std::io::Read;
use std::time::SystemTime;

use anyhow::{anyhow, bail, ensure, Context, Result};
use sequoia_openpgp as openpgp;

use openpgp::cert::amalgamation::ValidAmalgamation;
use openpgp::cert::{Cert, CertParser};
use openpgp::parse::stream::{
    MessageLayer, MessageStructure, VerificationError, VerificationHelper, VerifierBuilder,
};
use openpgp::parse::Parse;
use openpgp::policy::{Policy, StandardPolicy};
use openpgp::types::RevocationStatus;
use openpgp::{Fingerprint, KeyHandle};

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
    /// Made by a trusted key that is not valid now: expired or revoked, the key or its
    /// signing subkey (the key's fingerprint, and why).
    InvalidKey(String, String),
    /// The blob holds more than one signature; containers/image accepts exactly one.
    SignatureCount(usize),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::UnknownKey(k) => write!(f, "signed by {k}, a key the policy does not trust"),
            Failure::BadSignature(why) => write!(f, "the signature does not verify: {why}"),
            Failure::InvalidKey(key, why) => write!(f, "signed by key {key}, which {why}"),
            Failure::SignatureCount(n) => write!(
                f,
                "the signature blob holds {n} signatures, more than one (containers/image \
                 accepts exactly one)"
            ),
        }
    }
}

/// Verifies `message` against `keyring`; the payload and the trusted key's fingerprint.
pub fn verify(message: &[u8], keyring: &Keyring) -> Result<(Vec<u8>, String), Failure> {
    verify_at(message, keyring, SystemTime::now())
}

/// [`verify`] as of `now`: the signature must be alive then, and the key valid then.
fn verify_at(
    message: &[u8],
    keyring: &Keyring,
    now: SystemTime,
) -> Result<(Vec<u8>, String), Failure> {
    let policy = StandardPolicy::new();
    let helper = Helper {
        keyring,
        policy: &policy,
        now,
        good: None,
        failure: None,
    };
    let bad = |e: anyhow::Error| Failure::BadSignature(format!("{e:#}"));
    let mut verifier = VerifierBuilder::from_bytes(message)
        .map_err(bad)?
        .with_policy(&policy, Some(now), helper)
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
    policy: &'k dyn Policy,
    now: SystemTime,
    good: Option<String>,
    failure: Option<Failure>,
}

impl VerificationHelper for Helper<'_> {
    fn get_certs(&mut self, _ids: &[KeyHandle]) -> openpgp::Result<Vec<Cert>> {
        Ok(self.keyring.0.clone())
    }

    fn check(&mut self, structure: MessageStructure) -> openpgp::Result<()> {
        let verdict = self.judge(structure);
        if let Err(failure) = &verdict {
            self.failure = Some(failure.clone());
        }
        verdict.map_err(Into::into)
    }
}

impl Helper<'_> {
    /// The verdict on the message's structure: its one signature good by a key valid now.
    fn judge(&mut self, structure: MessageStructure) -> Result<(), Failure> {
        let mut results = Vec::new();
        for layer in structure.into_iter() {
            match layer {
                MessageLayer::Compression { .. } => {}
                MessageLayer::Encryption { .. } => {
                    return Err(Failure::BadSignature("the message is encrypted".into()));
                }
                MessageLayer::SignatureGroup { results: group } => results.extend(group),
            }
        }
        // gpgme lists every signature of the message; containers/image wants exactly one.
        let result = match results.len() {
            0 => return Err(Failure::BadSignature("the message is not signed".into())),
            1 => results.pop().expect("one result"),
            n => return Err(Failure::SignatureCount(n)),
        };
        match result {
            Ok(good) => {
                let fingerprint = good.ka.key().fingerprint();
                valid_now(good.ka.cert(), &fingerprint, self.policy, self.now)?;
                self.good = Some(fingerprint.to_hex());
                Ok(())
            }
            Err(VerificationError::MissingKey { sig }) => {
                let issuer = sig
                    .get_issuers()
                    .first()
                    .map(|k| format!("key {}", k.to_hex()))
                    .unwrap_or_else(|| "an unnamed key".into());
                Err(Failure::UnknownKey(issuer))
            }
            Err(VerificationError::BadKey { ka, error, .. }) => {
                // Unusable when it signed (expired, revoked, not for signing): say why as of
                // now when that is why, else Sequoia's reason.
                let fingerprint = ka.key().fingerprint();
                valid_now(ka.cert(), &fingerprint, self.policy, self.now)?;
                Err(Failure::BadSignature(format!("{error:#}")))
            }
            Err(e) => Err(Failure::BadSignature(e.to_string())),
        }
    }
}

/// Whether `cert` and its key `signer` are valid at `now`, as gpg judges a key when it verifies:
/// neither expired nor revoked, for whatever reason, and the key still a signing key.
fn valid_now(
    cert: &Cert,
    signer: &Fingerprint,
    policy: &dyn Policy,
    now: SystemTime,
) -> Result<(), Failure> {
    let invalid = |why: String| Failure::InvalidKey(cert.fingerprint().to_hex(), why);
    let valid = cert
        .with_policy(policy, now)
        .map_err(|e| invalid(format!("is not valid now: {e}")))?;
    valid
        .alive()
        .map_err(|_| invalid(expired(valid.primary_key().key_expiration_time())))?;
    if let RevocationStatus::Revoked(revocations) = valid.revocation_status() {
        return Err(invalid(revoked(&revocations)));
    }
    let is_subkey = signer != &cert.fingerprint();
    let subkey = |why: String| match is_subkey {
        true => invalid(format!(
            "has a signing subkey {} that {why}",
            signer.to_hex()
        )),
        false => invalid(why),
    };
    let key = valid
        .keys()
        .key_handle(signer.clone())
        .next()
        .ok_or_else(|| subkey("is not bound to it now".into()))?;
    if key.alive().is_err() {
        return Err(subkey(expired(key.key_expiration_time())));
    }
    if let RevocationStatus::Revoked(revocations) = key.revocation_status() {
        return Err(subkey(revoked(&revocations)));
    }
    if !key.for_signing() {
        return Err(subkey("is no longer a signing key".into()));
    }
    Ok(())
}

fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    crate::node::status::format_utc(secs)
}

fn expired(when: Option<SystemTime>) -> String {
    match when {
        Some(t) => format!(
            "expired on {} (a key must be valid when the image is pulled)",
            utc(t)
        ),
        None => "has expired (a key must be valid when the image is pulled)".into(),
    }
}

fn revoked(revocations: &[&openpgp::packet::Signature]) -> String {
    let Some(revocation) = revocations.first() else {
        return "is revoked".into();
    };
    let reason = match revocation.reason_for_revocation() {
        Some((reason, message)) if !message.is_empty() => {
            format!("{reason}: {}", String::from_utf8_lossy(message))
        }
        Some((reason, _)) => reason.to_string(),
        None => "no reason given".into(),
    };
    match revocation.signature_creation_time() {
        Some(t) => format!("was revoked on {} ({reason})", utc(t)),
        None => format!("is revoked ({reason})"),
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
            // Go's json leaves a field as it was for `null`, without an error: null passes.
            if let Some(creator) = optional.get("creator") {
                ensure!(
                    creator.is_string() || creator.is_null(),
                    "the payload's optional.creator is not a string"
                );
            }
            if let Some(timestamp) = optional.get("timestamp") {
                // Go reads it into a float64 and requires its int64 conversion to be equal:
                // an integer in int64's range once rounded to a double (2^63 and 1e300 are not).
                const TWO_63: f64 = 9_223_372_036_854_775_808.0;
                let integral = timestamp.is_null()
                    || timestamp
                        .as_f64()
                        .is_some_and(|t| t.fract() == 0.0 && (-TWO_63..TWO_63).contains(&t));
                ensure!(integral, "the payload's optional.timestamp is not an int64 integer");
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
        // `optional.timestamp` as Go's `int64(float64)` round trip judges it (signature/simple.go).
        let stamped = |t: &str| payload("").replace(r#""creator":"test""#, &format!(r#""timestamp":{t}"#));
        for t in ["1.5", "1e300", "-1e300", "9223372036854775807", "9223372036854775808", "18446744073709551615", "1e400", "\"1\"", "[]"] {
            assert!(parse_payload(stamped(t).as_bytes(), SIMPLE_SIGNING_TYPE).is_err(), "{t}");
        }
        for t in ["0", "-1", "1700000000", "1.7e9", "1e18", "-9223372036854775808", "9223372036854774784", "null"] {
            assert!(parse_payload(stamped(t).as_bytes(), SIMPLE_SIGNING_TYPE).is_ok(), "{t}");
        }
        let bad_digest = payload("").replace(DIGEST, "sha256:abc");
        assert!(parse_payload(bad_digest.as_bytes(), SIMPLE_SIGNING_TYPE).is_err());
        assert!(parse_payload(b"[]", SIMPLE_SIGNING_TYPE).is_err());
    }

    mod validity {
        use std::time::{Duration, SystemTime};

        use openpgp::cert::prelude::*;
        use openpgp::serialize::stream::{LiteralWriter, Message, Signer};
        use openpgp::serialize::Serialize;
        use openpgp::types::{KeyFlags, ReasonForRevocation};

        use super::super::*;

        const DAY: Duration = Duration::from_secs(86_400);
        const HOUR: Duration = Duration::from_secs(3_600);

        fn made() -> SystemTime {
            SystemTime::UNIX_EPOCH + 20_000 * DAY
        }

        /// A certificate made at [`made`] with a signing subkey; the primary key expires
        /// after `primary`, the subkey after `subkey`.
        fn cert(primary: Option<Duration>, subkey: Option<Duration>) -> Cert {
            CertBuilder::new()
                .add_userid("release <release@pivot.test>")
                .set_creation_time(made())
                .set_validity_period(primary)
                .add_subkey(KeyFlags::empty().set_signing(), subkey, None)
                .generate()
                .unwrap()
                .0
        }

        /// `payload` signed at `at` by the signing subkeys of `certs`, in one message.
        fn sign(certs: &[&Cert], at: SystemTime) -> Vec<u8> {
            let policy = StandardPolicy::new();
            let mut keys = certs.iter().map(|c| {
                c.keys()
                    .unencrypted_secret()
                    .with_policy(&policy, at)
                    .for_signing()
                    .next()
                    .unwrap()
                    .key()
                    .clone()
                    .into_keypair()
                    .unwrap()
            });
            let mut out = Vec::new();
            let message = Message::new(&mut out);
            let mut signer = Signer::new(message, keys.next().unwrap()).unwrap();
            for key in keys {
                signer = signer.add_signer(key).unwrap();
            }
            let signer = signer.creation_time(at).build().unwrap();
            let mut literal = LiteralWriter::new(signer).build().unwrap();
            std::io::Write::write_all(&mut literal, b"payload").unwrap();
            literal.finalize().unwrap();
            out
        }

        fn keyring(certs: &[&Cert]) -> Keyring {
            let mut bytes = Vec::new();
            for cert in certs {
                cert.serialize(&mut bytes).unwrap();
            }
            Keyring::parse(&bytes).unwrap()
        }

        fn says(verdict: Result<(Vec<u8>, String), Failure>) -> String {
            match verdict {
                Ok(_) => "accepted".into(),
                Err(failure) => failure.to_string(),
            }
        }

        #[test]
        fn a_key_is_judged_as_of_now_not_as_of_the_signature() {
            let signed = made() + HOUR;
            let expiring = cert(Some(DAY), None);
            let message = sign(&[&expiring], signed);
            let keys = keyring(&[&expiring]);
            assert_eq!(says(verify_at(&message, &keys, signed + HOUR)), "accepted");
            let later = says(verify_at(&message, &keys, made() + 2 * DAY));
            assert!(later.contains("which expired on"), "{later}");

            let subkey = cert(None, Some(DAY));
            let message = sign(&[&subkey], signed);
            let keys = keyring(&[&subkey]);
            assert_eq!(says(verify_at(&message, &keys, signed + HOUR)), "accepted");
            let later = says(verify_at(&message, &keys, made() + 2 * DAY));
            assert!(later.contains("has a signing subkey") && later.contains("expired on"));

            // A soft revocation made after the signature refuses it from then on.
            let superseded = cert(None, None);
            let message = sign(&[&superseded], signed);
            let mut primary = superseded
                .primary_key()
                .key()
                .clone()
                .parts_into_secret()
                .unwrap()
                .into_keypair()
                .unwrap();
            let revocation = CertRevocationBuilder::new()
                .set_reason_for_revocation(ReasonForRevocation::KeySuperseded, b"new key")
                .unwrap()
                .set_signature_creation_time(signed + HOUR)
                .unwrap()
                .build(&mut primary, &superseded, None)
                .unwrap();
            let revoked = superseded.insert_packets(revocation).unwrap().0;
            let keys = keyring(&[&revoked]);
            assert_eq!(
                says(verify_at(&message, &keys, signed + HOUR / 2)),
                "accepted"
            );
            let later = says(verify_at(&message, &keys, signed + 2 * HOUR));
            assert!(
                later.contains("was revoked on") && later.contains("superseded"),
                "{later}"
            );
        }

        #[test]
        fn a_message_with_more_than_one_signature_is_refused() {
            let signed = made() + HOUR;
            let (first, second) = (cert(None, None), cert(None, None));
            let keys = keyring(&[&first, &second]);
            let one = sign(&[&first], signed);
            assert_eq!(says(verify_at(&one, &keys, signed + HOUR)), "accepted");
            let two = sign(&[&first, &second], signed);
            assert_eq!(
                verify_at(&two, &keys, signed + HOUR).unwrap_err(),
                Failure::SignatureCount(2)
            );
            // Counted good or not: the second key unknown to the policy.
            let keys = keyring(&[&first]);
            assert_eq!(
                verify_at(&two, &keys, signed + HOUR).unwrap_err(),
                Failure::SignatureCount(2)
            );
        }
    }

    #[test]
    fn keyrings_without_keys_are_refused() {
        assert!(Keyring::parse(b"").is_err());
        assert!(Keyring::parse(b"not a key").is_err());
    }
}
