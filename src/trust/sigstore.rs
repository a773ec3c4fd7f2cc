//! Sigstore (cosign) signatures attached in the registry: the manifest tagged
//! `sha256-<hex>.sig` in the image's repository, each layer a payload (the same JSON shape as
//! simple signing, type `cosign container image signature`) with its signature, base64 DER, in
//! the `dev.cosignproject.cosign/signature` annotation; keyless and PKI signatures add the
//! signing certificate (`dev.sigstore.cosign/certificate`), its chain
//! (`dev.sigstore.cosign/chain`) and the Rekor bundle (`dev.sigstore.cosign/bundle`).
//!
//! Which key a signature must verify with is [`Root`]'s business: the policy's public keys
//! (optionally each bound by a Rekor entry), or the certificate's key once it chains to the
//! policy's Fulcio CA (with a Rekor entry dating it) or to its PKI roots. The payload signature
//! is then checked with SHA-256 whatever the key, as containers/image does (sigstore's
//! hard-coded hash, P-384 and P-521 keys included); Ed25519 signs the payload itself.
//! OpenSSL (already linked for TLS) does the cryptography.
//!
//! The policy's keys are read as containers/image reads them (`signature/
//! policy_eval_sigstore.go`, `prepareTrustRoot`: sigstore's `UnmarshalPEMToPublicKey`), and
//! only the types its verifier takes are kept (`signature/internal/sigstore_payload.go`,
//! `verifySigstorePayloadBlobSignature`: sigstore's `LoadVerifier`, for every key before any
//! signature): [`PublicKeys::parse`]. One that fails refuses every signature.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, ensure, Context, Result};
use oci_spec::image::ImageManifest;
use openssl::hash::MessageDigest;
use openssl::pkey::{Id, PKey, Public};
use openssl::rsa::Rsa;
use openssl::sign::Verifier;
use serde::{Deserialize, Serialize};

use super::fulcio::FulcioRoot;
use super::pki::PkiRoot;
use super::rekor::{self, RekorKeys};
use super::x509;
use super::MAX_SIGNATURES;
use crate::fetch::image::to_oci;
use crate::fetch::registry::Registry;

pub const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
pub const CHAIN_ANNOTATION: &str = "dev.sigstore.cosign/chain";

/// One attached signature: its payload and the layer's annotations, as served (nothing in it
/// is trusted until [`Root::verify`] says so). Kept with a `--download-only` download.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    #[serde(with = "b64")]
    pub payload: Vec<u8>,
    pub annotations: BTreeMap<String, String>,
}

pub(crate) mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// The policy's public keys (`cosign.pub`).
pub struct PublicKeys(pub Vec<PKey<Public>>);

impl PublicKeys {
    /// One key (`keyPath`, one of `keyPaths`, `keyData`, one of `keyDatas`), read as
    /// containers/image reads it: `cryptoutils.UnmarshalPEMToPublicKey` of sigstore/sigstore
    /// v1.9.5 takes the first PEM block, a `PUBLIC KEY` (SubjectPublicKeyInfo, Go's
    /// `x509.ParsePKIXPublicKey`) or an `RSA PUBLIC KEY` (PKCS #1, `x509.ParsePKCS1PublicKey`);
    /// then `signature.LoadVerifier` takes only the types [`x509::sigstore_verifies`] lists.
    /// A key that fails either refuses every signature: containers/image loads all the
    /// verifiers before it tries one, so that a broken fallback key is fixed before it is
    /// needed. The DER must be the one OpenSSL writes back, as DER-strict as Go's parsers.
    pub fn parse(pem: &[u8]) -> Result<PublicKeys> {
        let (block, _) = x509::pem_decode(pem).ok_or_else(|| anyhow!("not a PEM public key"))?;
        let key = match block.kind.as_slice() {
            b"PUBLIC KEY" => {
                let key = PKey::public_key_from_der(&block.bytes)
                    .map_err(|e| anyhow!("not a public key Go reads: {e}"))?;
                x509::sigstore_verifies(&key)?;
                ensure!(
                    key.public_key_to_der()? == block.bytes,
                    "the {} public key is not in the DER form Go reads",
                    x509::key_type(&key)
                );
                key
            }
            b"RSA PUBLIC KEY" => {
                let rsa = Rsa::public_key_from_der_pkcs1(&block.bytes)
                    .map_err(|e| anyhow!("not a PKCS #1 RSA public key: {e}"))?;
                // Go: n and e positive, e under 2^31, nothing after the DER.
                ensure!(
                    !rsa.n().is_negative()
                        && rsa.n().num_bits() > 0
                        && !rsa.e().is_negative()
                        && (1..=31).contains(&rsa.e().num_bits())
                        && rsa.public_key_to_der_pkcs1()? == block.bytes,
                    "the PKCS #1 RSA public key is not one Go reads"
                );
                PKey::from_rsa(rsa)?
            }
            kind => bail!(
                "a {:?} PEM block, not a PUBLIC KEY or an RSA PUBLIC KEY",
                String::from_utf8_lossy(kind)
            ),
        };
        Ok(PublicKeys(vec![key]))
    }

    pub fn extend(&mut self, other: PublicKeys) {
        self.0.extend(other.0);
    }
}

/// What a `sigstoreSigned` requirement trusts.
pub enum Root {
    /// The policy's keys; with Rekor keys, a signature also needs a Rekor entry for its key.
    Keys(PublicKeys, Option<RekorKeys>),
    /// A Fulcio certificate, dated by its Rekor entry.
    Fulcio(FulcioRoot, RekorKeys),
    Pki(PkiRoot),
}

/// A name for records and messages: the `sha256:` of the key's DER (SubjectPublicKeyInfo).
pub fn key_name(key: &PKey<Public>) -> String {
    key.public_key_to_der()
        .map(|der| crate::fetch::registry::sha256_digest(&der))
        .unwrap_or_else(|_| "an unnamed key".into())
}

impl Root {
    /// The key that made `sig`, once everything the root requires of it holds; else why not,
    /// ranked (2: it is not a valid signature by what the policy trusts; 1: by another key).
    pub fn verify(&self, sig: &Attached) -> Result<String, (u8, String)> {
        let annotation = |key: &str| sig.annotations.get(key).map(String::as_str);
        let missing = |key: &str| (2, format!("the signature has no {key} annotation"));
        let signature =
            annotation(SIGNATURE_ANNOTATION).ok_or_else(|| missing(SIGNATURE_ANNOTATION))?;
        let raw = super::x509::go_base64(signature.as_bytes())
            .map_err(|e| (2, format!("the signature is not base64: {e:#}")))?;
        let keys: Vec<PKey<Public>> = match self {
            Root::Keys(keys, None) => keys.0.clone(),
            Root::Keys(keys, Some(rekor)) => {
                let bundle =
                    annotation(BUNDLE_ANNOTATION).ok_or_else(|| missing(BUNDLE_ANNOTATION))?;
                let mut failures = Vec::new();
                let bound = keys.0.iter().find(|key| {
                    let pem = key.public_key_to_pem().unwrap_or_default();
                    match rekor::verify_set(rekor, bundle.as_bytes(), &pem, signature, &sig.payload)
                    {
                        Ok(_) => true,
                        Err(e) => {
                            failures.push(format!("{e:#}"));
                            false
                        }
                    }
                });
                match bound {
                    Some(key) => vec![key.clone()],
                    None => {
                        return Err((
                            2,
                            format!(
                                "no trusted key matches the Rekor entry: {}",
                                failures.join("; ")
                            ),
                        ))
                    }
                }
            }
            Root::Fulcio(fulcio, rekor) => {
                let bundle =
                    annotation(BUNDLE_ANNOTATION).ok_or_else(|| missing(BUNDLE_ANNOTATION))?;
                let cert = annotation(CERTIFICATE_ANNOTATION)
                    .ok_or_else(|| missing(CERTIFICATE_ANNOTATION))?;
                let time = rekor::verify_set(
                    rekor,
                    bundle.as_bytes(),
                    cert.as_bytes(),
                    signature,
                    &sig.payload,
                )
                .map_err(|e| (2, format!("{e:#}")))?;
                let chain = annotation(CHAIN_ANNOTATION).map(str::as_bytes);
                vec![fulcio
                    .verify_at(time, cert.as_bytes(), chain)
                    .map_err(|e| (2, format!("{e:#}")))?]
            }
            Root::Pki(pki) => {
                let cert = annotation(CERTIFICATE_ANNOTATION)
                    .ok_or_else(|| missing(CERTIFICATE_ANNOTATION))?;
                let chain = annotation(CHAIN_ANNOTATION).map(str::as_bytes);
                vec![pki
                    .verify(cert.as_bytes(), chain)
                    .map_err(|e| (2, format!("{e:#}")))?]
            }
        };
        keys.iter()
            .find(|key| verify_with(key, &sig.payload, &raw).unwrap_or(false))
            .map(key_name)
            .ok_or_else(|| (1, UNVERIFIED.to_string()))
    }
}

/// A sigstore signature carries no key id: one that does not verify may be by another key, or
/// tampered.
const UNVERIFIED: &str =
    "the signature does not verify with any key the policy trusts (another key's, or tampered)";

fn verify_with(key: &PKey<Public>, payload: &[u8], signature: &[u8]) -> Result<bool> {
    let mut verifier = match key.id() {
        Id::ED25519 => Verifier::new_without_digest(key)?,
        _ => Verifier::new(MessageDigest::sha256(), key)?,
    };
    Ok(verifier.verify_oneshot(signature, payload)?)
}

/// The signatures attached to manifest `digest` in `registry`'s repository (none when there is
/// no attachment); attachments of other kinds are left out.
pub async fn attached(registry: &Registry, digest: &str) -> Result<Vec<Attached>> {
    let tag = format!("{}.sig", digest.replace(':', "-"));
    let Some(bytes) = registry.tagged_manifest(&tag).await? else {
        return Ok(Vec::new());
    };
    let manifest: ImageManifest = serde_json::from_slice(&bytes)
        .with_context(|| format!("the signature attachment {tag} is not an image manifest"))?;
    ensure!(
        manifest.layers().len() <= MAX_SIGNATURES,
        "the signature attachment {tag} has more than {MAX_SIGNATURES} layers"
    );
    let mut found = Vec::new();
    for layer in manifest.layers() {
        if layer.media_type().to_string() != PAYLOAD_TYPE {
            continue;
        }
        let payload = registry
            .fetch_json_blob(&to_oci(layer))
            .await
            .with_context(|| format!("fetching a signature payload of {tag}"))?;
        let annotations = layer
            .annotations()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        found.push(Attached {
            payload,
            annotations,
        });
    }
    Ok(found)
}

/// A signature blob in containers/image's format (`\0sigstore-json\n` and a JSON object with
/// `mimeType`, `payload` and `annotations`), as its lookaside stores and `dir:` images keep
/// sigstore signatures.
pub fn from_blob(blob: &[u8]) -> Result<Attached> {
    let json = blob
        .strip_prefix(b"\x00sigstore-json\n")
        .ok_or_else(|| anyhow!("not a sigstore signature blob"))?;
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Blob {
        mime_type: String,
        #[serde(with = "b64")]
        payload: Vec<u8>,
        annotations: BTreeMap<String, String>,
    }
    let blob: Blob = serde_json::from_slice(json).context("reading a sigstore signature blob")?;
    ensure!(
        blob.mime_type == PAYLOAD_TYPE,
        "a sigstore signature blob of type {:?}",
        blob.mime_type
    );
    Ok(Attached {
        payload: blob.payload,
        annotations: blob.annotations,
    })
}

#[cfg(test)]
mod tests;
