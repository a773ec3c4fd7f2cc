//! Rekor signed entry timestamps (SETs): the proof, in a sigstore signature's
//! `dev.sigstore.cosign/bundle` annotation, that the transparency log Rekor recorded the
//! signature at a time, checked as containers/image checks it (`signature/internal/
//! rekor_set.go`). The SET must verify with a Rekor key the policy trusts, over the RFC 8785
//! canonical JSON of the logged entry ({body, integratedTime, logID, logIndex}); the entry's
//! body must be a `hashedrekord` 0.0.1 of exactly this signature, this key or certificate (the
//! PEM blocks' bytes compared, as there) and the SHA-256 of this payload. Its integrated time is
//! when a Fulcio certificate must have been valid ([`super::fulcio`]).
//!
//! The JSON is parsed as Go parses it ([`json`]) and read with containers/image's two
//! strictnesses ([`fields`]): the bundle and the signed entry exactly (no unknown, duplicate or
//! missing key), the body as Go's `encoding/json` reads it (unknown keys ignored, names matched
//! case-insensitively), so that pivot accepts and refuses the same bundles; [`jcs`] writes the
//! canonical form. The SET signature is ECDSA, checked with OpenSSL (linked already for TLS and
//! the other sigstore keys), which like Go's `ecdsa.VerifyASN1` takes DER signatures only.

mod fields;
mod jcs;
mod json;

use anyhow::{anyhow, bail, ensure, Context, Result};
use openssl::hash::MessageDigest;
use openssl::pkey::{Id, PKey, Public};
use openssl::sign::Verifier;
use sha2::{Digest, Sha256};

use super::x509::{go_base64, go_reads_key, pem_decode};
use json::Value;

/// Rekor's public keys a policy trusts (ECDSA only, as containers/image requires).
pub struct RekorKeys(Vec<PKey<Public>>);

impl RekorKeys {
    /// One PEM public key (`rekorPublicKeyPath`/`rekorPublicKeyData`), read as sigstore reads
    /// it: the first PEM block, a `PUBLIC KEY` on a P-224/256/384/521 curve.
    pub fn parse(pem: &[u8]) -> Result<RekorKeys> {
        let (block, _) =
            pem_decode(pem).ok_or_else(|| anyhow!("the Rekor public key is not PEM"))?;
        ensure!(
            block.kind == b"PUBLIC KEY" || block.kind == b"RSA PUBLIC KEY",
            "the Rekor public key is a {:?} PEM block, not a PUBLIC KEY",
            String::from_utf8_lossy(&block.kind)
        );
        let key = PKey::public_key_from_der(&block.bytes)
            .ok()
            .filter(|k| {
                block.kind == b"PUBLIC KEY"
                    && k.public_key_to_der().ok().as_ref() == Some(&block.bytes)
            })
            .ok_or_else(|| anyhow!("the Rekor public key is not an ECDSA public key"))?;
        ensure!(
            key.id() == Id::EC,
            "the Rekor public key is not an ECDSA key"
        );
        ensure!(
            go_reads_key(&key)?,
            "the Rekor public key is on an unsupported curve"
        );
        Ok(RekorKeys(vec![key]))
    }

    pub fn extend(&mut self, other: RekorKeys) {
        self.0.extend(other.0);
    }
}

/// Verifies the `dev.sigstore.cosign/bundle` annotation value `bundle` against `keys` and that
/// the logged entry is a hashedrekord of exactly this signature (`base64_signature`, as in the
/// `dev.cosignproject.cosign/signature` annotation), this public key or certificate
/// (`key_or_cert_pem`, PEM bytes) and the SHA-256 of `payload`. Returns the integrated time
/// (Unix seconds).
pub fn verify_set(
    keys: &RekorKeys,
    bundle: &[u8],
    key_or_cert_pem: &[u8],
    base64_signature: &str,
    payload: &[u8],
) -> Result<i64> {
    let bundle = json::parse(bundle).context("the Rekor bundle is not JSON")?;
    let [timestamp, entry] = fields::exact_fields(&bundle, ["SignedEntryTimestamp", "Payload"])
        .context("the Rekor bundle is not a bundle")?;
    let mut signature = None;
    fields::bytes(timestamp, &mut signature).context("the Rekor bundle's SignedEntryTimestamp")?;
    let canonical = jcs::canonical(entry).context("canonicalizing the Rekor bundle's Payload")?;
    let signature = signature.unwrap_or_default();
    ensure!(
        keys.0
            .iter()
            .any(|key| ecdsa_verifies(key, canonical.as_bytes(), &signature)),
        "the Rekor bundle's signed entry timestamp does not verify with a trusted Rekor key"
    );

    // The signed form, not the one delivered, is what is read further.
    let entry = json::parse(canonical.as_bytes())?;
    let fields = fields::exact_fields(&entry, ["body", "integratedTime", "logIndex", "logID"]);
    let [body, time, index, id] = fields.context("the Rekor bundle's Payload")?;
    let (mut body_bytes, mut integrated, mut log_index, mut log_id) = (None, 0, 0, String::new());
    fields::bytes(body, &mut body_bytes).context("the Rekor entry's body")?;
    fields::int(time, &mut integrated).context("the Rekor entry's integratedTime")?;
    fields::int(index, &mut log_index).context("the Rekor entry's logIndex")?;
    fields::string(id, &mut log_id).context("the Rekor entry's logID")?;
    let body = json::parse(body_bytes.as_deref().unwrap_or_default())
        .context("the Rekor entry's body is not JSON")?;
    let spec = hashedrekord(&body)?;

    let signed = spec
        .signature
        .ok_or_else(|| anyhow!("the Rekor entry has no signature"))?;
    let key = signed
        .public_key
        .ok_or_else(|| anyhow!("the Rekor entry has no public key"))?;
    let logged = pem_block(
        key.content.as_deref().unwrap_or_default(),
        "the public key in the Rekor entry",
    )?;
    let given = pem_block(key_or_cert_pem, "the signature's public key or certificate")?;
    ensure!(
        logged == given,
        "the Rekor entry is for another public key or certificate"
    );
    let signature =
        go_base64(base64_signature.as_bytes()).context("the signature is not base64")?;
    ensure!(
        signed.content.unwrap_or_default() == signature,
        "the Rekor entry is for another signature"
    );

    let data = spec
        .data
        .ok_or_else(|| anyhow!("the Rekor entry has no data"))?;
    let hash = data
        .hash
        .ok_or_else(|| anyhow!("the Rekor entry has no data hash"))?;
    let algorithm = hash
        .algorithm
        .ok_or_else(|| anyhow!("the Rekor entry's hash has no algorithm"))?;
    ensure!(
        algorithm == "sha256",
        "the Rekor entry's hash is {algorithm:?}, not sha256"
    );
    let value = hash
        .value
        .ok_or_else(|| anyhow!("the Rekor entry's hash has no value"))?;
    let logged = hex::decode(&value)
        .map_err(|e| anyhow!("the Rekor entry's hash {value:?} is not hex: {e}"))?;
    ensure!(
        logged == Sha256::digest(payload).as_slice(),
        "the Rekor entry is for another payload"
    );
    Ok(integrated)
}

fn ecdsa_verifies(key: &PKey<Public>, data: &[u8], signature: &[u8]) -> bool {
    Verifier::new(MessageDigest::sha256(), key)
        .and_then(|mut v| v.verify_oneshot(signature, data))
        .unwrap_or(false)
}

/// The bytes of `pem`'s only block (type and headers are not compared, as in Go).
fn pem_block(pem: &[u8], what: &str) -> Result<Vec<u8>> {
    let (block, rest) = pem_decode(pem).ok_or_else(|| anyhow!("{what} is not PEM"))?;
    ensure!(rest.is_empty(), "{what} has data after its PEM block");
    Ok(block.bytes)
}

#[derive(Default)]
struct Spec {
    data: Option<Data>,
    signature: Option<Signature>,
}
#[derive(Default)]
struct Data {
    hash: Option<Hash>,
}
#[derive(Default)]
struct Hash {
    algorithm: Option<String>,
    value: Option<String>,
}
#[derive(Default)]
struct Signature {
    content: Option<Vec<u8>>,
    public_key: Option<PublicKey>,
}
#[derive(Default)]
struct PublicKey {
    content: Option<Vec<u8>>,
}

/// The body's hashedrekord 0.0.1 spec, read as containers/image's Rekor API types read it.
fn hashedrekord(body: &Value) -> Result<Spec> {
    let Value::Obj(entries) = body else {
        bail!("the Rekor entry is not a hashedrekord")
    };
    let mut kind = String::new();
    for (key, value) in entries.iter().filter(|(k, _)| fields::key_is(k, "kind")) {
        fields::string(value, &mut kind).with_context(|| format!("the Rekor entry's {key}"))?;
    }
    ensure!(
        kind == "hashedrekord",
        "the Rekor entry is a {kind:?}, not a hashedrekord"
    );
    let (mut api_version, mut spec) = (None, None);
    for (key, value) in entries {
        if fields::key_is(key, "apiVersion") {
            fields::opt_string(value, &mut api_version).context("the Rekor entry's apiVersion")?;
        } else if fields::key_is(key, "spec") {
            spec = Some(value);
        }
    }
    let api_version = api_version.ok_or_else(|| anyhow!("the Rekor entry has no apiVersion"))?;
    ensure!(
        api_version == "0.0.1",
        "the Rekor entry is a hashedrekord {api_version:?}, not 0.0.1"
    );
    let spec = spec.ok_or_else(|| anyhow!("the Rekor entry has no spec"))?;
    let mut read = Some(Spec::default());
    fields::object(spec, &mut read, |spec: &mut Spec, key, value| {
        if fields::key_is(key, "data") {
            fields::object(value, &mut spec.data, |data: &mut Data, key, value| {
                if !fields::key_is(key, "hash") {
                    return Ok(());
                }
                fields::object(value, &mut data.hash, |hash: &mut Hash, key, value| {
                    if fields::key_is(key, "algorithm") {
                        fields::opt_string(value, &mut hash.algorithm)
                    } else if fields::key_is(key, "value") {
                        fields::opt_string(value, &mut hash.value)
                    } else {
                        Ok(())
                    }
                })
            })
        } else if fields::key_is(key, "signature") {
            fields::object(
                value,
                &mut spec.signature,
                |signature: &mut Signature, key, value| {
                    if fields::key_is(key, "content") {
                        fields::bytes(value, &mut signature.content)
                    } else if fields::key_is(key, "publicKey") {
                        fields::object(
                            value,
                            &mut signature.public_key,
                            |k: &mut PublicKey, key, value| {
                                if fields::key_is(key, "content") {
                                    fields::bytes(value, &mut k.content)
                                } else {
                                    Ok(())
                                }
                            },
                        )
                    } else {
                        Ok(())
                    }
                },
            )
        } else {
            Ok(())
        }
    })
    .context("the Rekor entry's hashedrekord spec")?;
    Ok(read.unwrap_or_default())
}

#[cfg(test)]
mod tests;
