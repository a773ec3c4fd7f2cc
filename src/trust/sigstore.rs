//! Sigstore signatures made with a key (cosign's format): attached in the registry as the
//! manifest tagged `sha256-<hex>.sig` in the image's repository, each layer a payload (the
//! same JSON shape as simple signing, type `cosign container image signature`) with its
//! signature, base64 DER, in the `dev.cosignproject.cosign/signature` annotation.
//!
//! Verification uses OpenSSL (already linked for TLS) with the policy's public keys (PEM,
//! `cosign generate-key-pair`'s `cosign.pub` or any SubjectPublicKeyInfo): ECDSA P-256/384/521
//! with SHA-256/384/512 as sigstore pairs them, RSA with SHA-256, Ed25519. Keyless signatures
//! (Fulcio certificates, Rekor bundles) are not verified: a policy requiring them refuses.

use anyhow::{anyhow, ensure, Context, Result};
use base64::Engine;
use oci_spec::image::ImageManifest;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Public};
use openssl::sign::Verifier;

use super::MAX_SIGNATURES;
use crate::fetch::image::to_oci;
use crate::fetch::registry::Registry;

const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// One attached signature.
pub struct Attached {
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// The public keys of a `sigstoreSigned` requirement.
pub struct PublicKeys(Vec<PKey<Public>>);

impl PublicKeys {
    pub fn parse(pem: &[u8]) -> Result<PublicKeys> {
        let key = PKey::public_key_from_pem(pem).context("reading a PEM public key")?;
        Ok(PublicKeys(vec![key]))
    }


    pub fn extend(&mut self, other: PublicKeys) {
        self.0.extend(other.0);
    }

    /// The key whose signature over `payload` `signature` is, named for records by the
    /// `sha256:` of its DER (SubjectPublicKeyInfo).
    pub fn verify(&self, payload: &[u8], signature: &[u8]) -> Option<String> {
        let key = self
            .0
            .iter()
            .find(|key| verify_with(key, payload, signature).unwrap_or(false))?;
        let der = key.public_key_to_der().ok()?;
        Some(crate::fetch::registry::sha256_digest(&der))
    }
}

fn verify_with(key: &PKey<Public>, payload: &[u8], signature: &[u8]) -> Result<bool> {
    let digest = match key.id() {
        Id::EC => match key.ec_key()?.group().curve_name() {
            Some(Nid::SECP384R1) => Some(MessageDigest::sha384()),
            Some(Nid::SECP521R1) => Some(MessageDigest::sha512()),
            _ => Some(MessageDigest::sha256()),
        },
        Id::ED25519 => None,
        _ => Some(MessageDigest::sha256()),
    };
    let mut verifier = match digest {
        Some(digest) => Verifier::new(digest, key)?,
        None => Verifier::new_without_digest(key)?,
    };
    Ok(verifier.verify_oneshot(signature, payload)?)
}

/// The signatures attached to manifest `digest` in `registry`'s repository (none when there is
/// no attachment).
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
        let Some(signature) = layer
            .annotations()
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
        else {
            continue;
        };
        let signature = base64::engine::general_purpose::STANDARD
            .decode(signature.trim())
            .map_err(|e| anyhow!("a signature in {tag} is not base64: {e}"))?;
        let payload = registry
            .fetch_json_blob(&to_oci(layer))
            .await
            .with_context(|| format!("fetching a signature payload of {tag}"))?;
        found.push(Attached { payload, signature });
    }
    Ok(found)
}
