//! Compact JWS (JWT) signing for the token server: ES256 over the
//! base64url header and claims, with the signing certificate in `x5c`.

use crate::tls::pem_to_der;
use anyhow::Result;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};

/// ES256 JWS signing with the leaf's key; the leaf goes in the `x5c` header.
pub(crate) struct Signer {
    key: EcdsaKeyPair,
    x5c: String,
    rng: SystemRandom,
}

impl Signer {
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<Signer> {
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            &pem_to_der(key_pem)?,
            &rng,
        )
        .map_err(|e| anyhow::anyhow!("loading token signing key: {e}"))?;
        Ok(Signer {
            key,
            x5c: STANDARD.encode(pem_to_der(cert_pem)?),
            rng,
        })
    }

    pub fn sign(&self, claims: &Value) -> Result<String> {
        let header = json!({ "typ": "JWT", "alg": "ES256", "x5c": [self.x5c] });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        // FIXED signing gives the JWS r||s form, not DER.
        let sig = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|e| anyhow::anyhow!("signing token: {e}"))?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        ))
    }
}
