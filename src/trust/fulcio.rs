//! Fulcio certificates, the keys of keyless sigstore signatures, judged as containers/image
//! judges them (`signature/fulcio_cert.go`): the signature's certificate must chain, through
//! the intermediates the signature carries (all but the chain's last certificate), to a CA the
//! policy trusts, at the time Rekor logged the signature (Fulcio certificates live minutes), for
//! code signing; it must record the OIDC issuer the policy names, and the policy's e-mail among
//! its subject alternative names. Its public key then verifies the signature.
//!
//! The chain is verified with OpenSSL, with Go's rules where they differ ([`super::x509`]: why
//! OpenSSL, and which rules). Like containers/image, a critical SAN extension holding none of
//! the names Go reads (Fulcio's OtherName identities) does not refuse the certificate. Neither
//! checks the certificate's SCT: the Rekor entry already proves the certificate was logged.

use anyhow::{bail, ensure, Result};
use openssl::pkey::{PKey, Public};

use super::x509::{self, Cert};

/// `1.3.6.1.4.1.57264.1.1`: the OIDC issuer, its raw bytes (deprecated, still written).
const ISSUER_V1: &[u8] = &[0x2b, 6, 1, 4, 1, 0x83, 0xbf, 0x30, 1, 1];
/// `1.3.6.1.4.1.57264.1.8`: the OIDC issuer, a DER string.
const ISSUER_V2: &[u8] = &[0x2b, 6, 1, 4, 1, 0x83, 0xbf, 0x30, 1, 8];

/// The `fulcio` part of a `sigstoreSigned` requirement.
pub struct FulcioRoot {
    cas: Vec<Cert>,
    oidc_issuer: String,
    subject_email: String,
}

impl FulcioRoot {
    /// `ca_pem`: the CA certificates (`caPath`/`caData`); the blocks that are not certificates
    /// are skipped, as containers/image skips them, but one at least must be.
    pub fn new(ca_pem: &[u8], oidc_issuer: &str, subject_email: &str) -> Result<FulcioRoot> {
        ensure!(
            !oidc_issuer.is_empty(),
            "the Fulcio requirement names no OIDC issuer"
        );
        ensure!(
            !subject_email.is_empty(),
            "the Fulcio requirement names no subject e-mail"
        );
        let cas = x509::pool_from_pem(ca_pem);
        ensure!(!cas.is_empty(), "the Fulcio CA data holds no certificate");
        let (oidc_issuer, subject_email) = (oidc_issuer.to_owned(), subject_email.to_owned());
        Ok(FulcioRoot {
            cas,
            oidc_issuer,
            subject_email,
        })
    }

    /// The public key of the signature's certificate `cert_pem` (one PEM certificate), if it
    /// was valid at `unix_time` (the Rekor entry's integrated time) and is for the policy's
    /// identity. `chain_pem`: the signature's `dev.sigstore.cosign/chain` annotation.
    pub fn verify_at(
        &self,
        unix_time: i64,
        cert_pem: &[u8],
        chain_pem: Option<&[u8]>,
    ) -> Result<PKey<Public>> {
        let intermediates = x509::untrusted_intermediates(chain_pem)?;
        let leaf = x509::leaf_from_pem(cert_pem)?;
        let intermediates: Vec<&Cert> = intermediates.iter().collect();
        x509::verify_chain(
            "the Fulcio certificate",
            &leaf,
            &intermediates,
            &self.cas,
            unix_time,
            true,
        )?;
        let issuer = oidc_issuer(&leaf)?;
        if issuer != self.oidc_issuer.as_bytes() {
            bail!(
                "the Fulcio certificate's OIDC issuer is {:?}, the policy requires {:?}",
                String::from_utf8_lossy(&issuer),
                self.oidc_issuer
            );
        }
        let emails = &leaf.parsed.emails;
        if !emails.contains(&self.subject_email) {
            bail!(
                "the Fulcio certificate is for the e-mail addresses {emails:?}, the policy requires {:?}",
                self.subject_email
            );
        }
        x509::signing_key("the Fulcio certificate", &leaf)
    }
}

/// The OIDC issuer Fulcio recorded: either extension, both if they agree.
fn oidc_issuer(cert: &Cert) -> Result<Vec<u8>> {
    // Certificates with duplicate extensions do not parse (x509::Cert), as in Go.
    let value = |oid: &[u8]| {
        cert.parsed
            .extensions
            .iter()
            .find(|e| e.oid == oid)
            .map(|e| &e.value)
    };
    let v1 = value(ISSUER_V1).cloned();
    let v2 = value(ISSUER_V2).map(|v| go_asn1_string(v)).transpose()?;
    match (v1, v2) {
        (Some(v1), Some(v2)) if v1 != v2 => bail!(
            "the Fulcio certificate's OIDC issuer extensions disagree: v1 {:?}, v2 {:?}",
            String::from_utf8_lossy(&v1),
            String::from_utf8_lossy(&v2)
        ),
        (Some(issuer), _) | (None, Some(issuer)) => Ok(issuer),
        (None, None) => bail!("the Fulcio certificate has no OIDC issuer extension"),
    }
}

/// Go's `asn1.Unmarshal` into a string: the string types it reads, checked as it checks them.
fn go_asn1_string(der: &[u8]) -> Result<Vec<u8>> {
    let Some((tag, text, rest)) = x509::tlv(der) else {
        bail!("the Fulcio certificate's OIDC issuer v2 extension is not DER");
    };
    ensure!(
        rest.is_empty(),
        "the Fulcio certificate's OIDC issuer v2 extension has trailing data"
    );
    let printable = |b: &u8| b.is_ascii_alphanumeric() || b" '()+,-./:=?*&".contains(b);
    let valid = match tag {
        0x0c => std::str::from_utf8(text).is_ok(), // UTF8String
        0x13 => text.iter().all(printable),        // PrintableString
        0x16 => text.is_ascii(),                   // IA5String
        0x12 => text.iter().all(|b| b.is_ascii_digit() || *b == b' '), // NumericString
        0x14 | 0x1b => true, // T61String, GeneralString: the bytes as they are
        0x1e if text.len() % 2 == 0 => {
            // BMPString: UTF-16, without a terminating NUL.
            let text = text.strip_suffix(&[0, 0]).unwrap_or(text);
            let units = text.chunks_exact(2).map(|p| match p {
                [a, b] => u16::from_be_bytes([*a, *b]),
                _ => 0xfffd,
            });
            let decoded = char::decode_utf16(units).map(|c| c.unwrap_or('\u{fffd}'));
            return Ok(decoded.collect::<String>().into_bytes());
        }
        _ => false,
    };
    ensure!(
        valid,
        "the Fulcio certificate's OIDC issuer v2 extension is not a valid string"
    );
    Ok(text.to_vec())
}

#[cfg(test)]
mod tests;
