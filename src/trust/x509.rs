//! X.509 for the certificate-based sigstore requirements ([`super::fulcio`], [`super::pki`]):
//! PEM read as Go's `encoding/pem` reads it ([`pem`]), certificates as `crypto/x509` parses
//! them, and chains judged as Go's `Certificate.Verify` judges them, since that is what
//! containers/image asks.
//!
//! OpenSSL builds and checks the chain (signatures, validity at the given time, CA basic
//! constraints, path lengths, name constraints): pivot links it already for TLS and sigstore
//! keys, and its verifier is the one the distribution maintains. Where Go decides differently,
//! Go's rule is applied here on the DER ([`der`]): the certificate must parse as Go parses it
//! (DER only, no duplicate extensions, no negative serial, ASCII SAN names, Go's EC curves,
//! extended key usages a SEQUENCE of OIDs Go's `cryptobyte` reads, SANs a SEQUENCE), the
//! critical extensions must be ones Go understands, every certificate of the chain that
//! restricts extended key usages must allow code signing (OpenSSL 3.0 has no code-signing
//! purpose), signatures use the algorithms Go verifies (RSA-PSS with the parameters Go names),
//! by RSA, ECDSA or Ed25519 issuer keys (Go's `checkSignature`), the last second of validity
//! counts, and the leaf's key is one containers/image verifies signatures with
//! ([`sigstore_verifies`]).

mod der;
mod pem;
#[cfg(test)]
pub(super) mod testing;

use std::cmp::Ordering;

use anyhow::{anyhow, bail, ensure, Context, Result};
use base64::Engine;
use openssl::asn1::Asn1Time;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Public};
use openssl::stack::Stack;
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::verify::{X509VerifyFlags, X509VerifyParam};
use openssl::x509::{X509StoreContext, X509VerifyResult, X509};

pub(super) use der::tlv;
pub(super) use pem::pem_decode;

/// `X509_V_ERR_CERT_HAS_EXPIRED`.
const CERT_HAS_EXPIRED: i32 = 10;

/// Go's `base64.StdEncoding`: padding required, non-zero trailing bits and CR/LF tolerated.
pub(super) fn go_base64(text: &[u8]) -> Result<Vec<u8>> {
    const ENGINE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let text: Vec<u8> = text
        .iter()
        .copied()
        .filter(|c| !matches!(c, b'\r' | b'\n'))
        .collect();
    ENGINE
        .decode(text)
        .map_err(|e| anyhow!("invalid base64: {e}"))
}

/// Whether `key`, if EC, is one Go's x509 parser reads: a named P-224/256/384/521 curve and an
/// uncompressed point.
pub(super) fn go_reads_key(key: &PKey<Public>) -> Result<bool> {
    if key.id() != Id::EC {
        return Ok(true);
    }
    let ec = key.ec_key()?;
    let group = ec.group();
    let named = matches!(
        group.curve_name(),
        Some(Nid::SECP224R1 | Nid::X9_62_PRIME256V1 | Nid::SECP384R1 | Nid::SECP521R1)
    );
    let mut ctx = openssl::bn::BigNumContext::new()?;
    let form = openssl::ec::PointConversionForm::UNCOMPRESSED;
    let point = ec.public_key().to_bytes(group, form, &mut ctx)?;
    let spki = key.public_key_to_der()?;
    Ok(named && der::spki_has_named_curve(&spki) && spki.ends_with(&point))
}

/// The key types a sigstore signature is verified with, as containers/image verifies them:
/// `sigstore/sigstore` v1.9.5's `signature.LoadVerifier` (containers/image's go.mod) takes RSA
/// (PKCS #1 v1.5), ECDSA and Ed25519 keys and nothing else, and the ECDSA keys Go's
/// `x509.ParsePKIXPublicKey`/`ParseCertificate` return are on P-224, P-256, P-384 or P-521,
/// named, with an uncompressed point. Go also parses DSA (still in Go 1.23, containers/image's
/// `go` version) and X25519 keys, and certificates with RSA-PSS keys (a nil key): the verifier
/// refuses all three, so every signature is refused. Else why not, naming the key's type.
/// (P-224 is accepted: Go parses it and the verifier takes any ECDSA key.)
pub(super) fn sigstore_verifies(key: &PKey<Public>) -> Result<()> {
    let verifies = match key.id() {
        Id::RSA | Id::ED25519 => true,
        Id::EC => go_reads_key(key)?,
        _ => false,
    };
    ensure!(
        verifies,
        "key type {}: containers/image verifies sigstore signatures with RSA, ECDSA (P-224, \
         P-256, P-384, P-521) and Ed25519 keys only",
        key_type(key)
    );
    Ok(())
}

/// The type of `key`, for messages: `RSA`, `DSA`, `RSA-PSS`, `ECDSA P-256`, `EC secp256k1`, …
pub(super) fn key_type(key: &PKey<Public>) -> String {
    let id = key.id();
    let name = match id {
        Id::RSA => "RSA",
        Id::RSA_PSS => "RSA-PSS",
        Id::DSA => "DSA",
        Id::DH | Id::DHX => "Diffie-Hellman",
        Id::ED25519 => "Ed25519",
        Id::ED448 => "Ed448",
        Id::X25519 => "X25519",
        Id::X448 => "X448",
        Id::EC => return ec_key_type(key),
        _ => return format!("unknown (OpenSSL type {})", id.as_raw()),
    };
    name.to_owned()
}

fn ec_key_type(key: &PKey<Public>) -> String {
    let spki = key.public_key_to_der().unwrap_or_default();
    if !der::spki_has_named_curve(&spki) {
        return "EC with explicit curve parameters".into();
    }
    let curve = key.ec_key().ok().and_then(|ec| ec.group().curve_name());
    let go_name = match curve {
        Some(Nid::SECP224R1) => "P-224",
        Some(Nid::X9_62_PRIME256V1) => "P-256",
        Some(Nid::SECP384R1) => "P-384",
        Some(Nid::SECP521R1) => "P-521",
        Some(nid) => return format!("EC {}", nid.short_name().unwrap_or("unnamed curve")),
        None => return "EC (unknown curve)".into(),
    };
    match go_reads_key(key) {
        Ok(true) => format!("ECDSA {go_name}"),
        _ => format!("ECDSA {go_name} (compressed point)"),
    }
}

/// A certificate as Go parsed it, with what Go's checks read from it.
pub(super) struct Cert {
    pub x509: X509,
    pub parsed: der::Parsed,
}

impl Cert {
    /// `x509.ParseCertificate`.
    pub fn from_der(bytes: &[u8]) -> Result<Cert> {
        let x509 = X509::from_der(bytes).map_err(|e| anyhow!("not a certificate: {e}"))?;
        ensure!(
            x509.to_der()? == bytes,
            "not a DER certificate, or trailing data after it"
        );
        ensure!(
            (0..=2).contains(&x509.version()),
            "unsupported certificate version"
        );
        ensure!(
            !x509.serial_number().to_bn()?.is_negative(),
            "negative serial number"
        );
        ensure!(
            go_reads_key(&x509.public_key()?)?,
            "unsupported elliptic-curve public key"
        );
        let parsed = der::parse(bytes, x509.version() == 2)?;
        Ok(Cert { x509, parsed })
    }
}

/// `cryptoutils.UnmarshalCertificatesFromPEM`: every PEM block, whatever its type, must be a
/// certificate.
pub(super) fn certs_from_pem(pem: &[u8]) -> Result<Vec<Cert>> {
    let mut rest = pem::trim_space(pem);
    let mut certs = Vec::new();
    while !rest.is_empty() {
        let (block, after) = pem_decode(rest).ok_or_else(|| anyhow!("not PEM data"))?;
        certs.push(Cert::from_der(&block.bytes)?);
        rest = after;
    }
    Ok(certs)
}

/// `CertPool.AppendCertsFromPEM`: the `CERTIFICATE` blocks without headers that parse.
pub(super) fn pool_from_pem(pem: &[u8]) -> Vec<Cert> {
    let mut rest = pem;
    let mut certs = Vec::new();
    while let Some((block, after)) = pem_decode(rest) {
        rest = after;
        if block.kind == b"CERTIFICATE" && !block.has_headers {
            certs.extend(Cert::from_der(&block.bytes).ok());
        }
    }
    certs
}

/// The signature's certificate: exactly one.
pub(super) fn leaf_from_pem(pem: &[u8]) -> Result<Cert> {
    let mut certs = certs_from_pem(pem).context("parsing the signature's certificate")?;
    ensure!(
        certs.len() <= 1,
        "the signature carries several certificates, not one"
    );
    certs
        .pop()
        .ok_or_else(|| anyhow!("the signature carries no certificate"))
}

/// The signature's chain as containers/image uses it: all but its last certificate (the root,
/// which only the policy may supply).
pub(super) fn untrusted_intermediates(chain_pem: Option<&[u8]>) -> Result<Vec<Cert>> {
    let mut certs = match chain_pem {
        Some(pem) if !pem.is_empty() => {
            certs_from_pem(pem).context("parsing the signature's certificate chain")?
        }
        _ => return Ok(Vec::new()),
    };
    certs.pop();
    Ok(certs)
}

/// Whether `leaf` (`what`, for messages) chains through `intermediates` to one of `roots` at
/// `time` (Unix seconds) for code signing, as Go's `Verify` decides it. `tolerate_san`: a
/// critical SAN without any name Go reads is accepted on the leaf (as containers/image does
/// for Fulcio).
pub(super) fn verify_chain(
    what: &str,
    leaf: &Cert,
    intermediates: &[&Cert],
    roots: &[Cert],
    time: i64,
    tolerate_san: bool,
) -> Result<()> {
    if let Some(oid) = leaf.parsed.unhandled_critical(tolerate_san) {
        bail!("{what} has an unhandled critical extension ({oid})");
    }
    let refused = |(why, depth): (X509VerifyResult, u32)| {
        anyhow!(
            "{what} does not verify: {} (certificate {depth} of the chain)",
            why.error_string()
        )
    };
    let chain = match openssl_verify(leaf, intermediates, roots, time)? {
        Ok(chain) => chain,
        // Go's certificates are valid through their notAfter second; OpenSSL's are not.
        Err((why, _, Some(cert))) if why.as_raw() == CERT_HAS_EXPIRED && ends_at(&cert, time)? => {
            let retry = openssl_verify(leaf, intermediates, roots, time.saturating_sub(1))?;
            retry.map_err(|(why, depth, _)| refused((why, depth)))?
        }
        Err((why, depth, _)) => return Err(refused((why, depth))),
    };
    let last = chain.len().saturating_sub(1);
    for (depth, x509) in chain.iter().enumerate() {
        let cert = Cert::from_der(&x509.to_der()?)?;
        if let Some(oid) = cert.parsed.unhandled_critical(depth == 0 && tolerate_san) {
            bail!("{what} does not verify: certificate {depth} of the chain has an unhandled critical extension ({oid})");
        }
        ensure!(
            cert.parsed.allows_code_signing(),
            "{what} does not verify: certificate {depth} of the chain does not allow code signing (extended key usage)"
        );
        let algorithm = x509.signature_algorithm().object().nid();
        ensure!(
            depth == last || go_verifies(algorithm),
            "{what} does not verify: certificate {depth} of the chain is signed with {}, which Go refuses",
            algorithm.long_name().unwrap_or("an unknown algorithm")
        );
        ensure!(
            depth == last || algorithm != Nid::RSASSAPSS || cert.parsed.go_pss_parameters(),
            "{what} does not verify: certificate {depth} of the chain is signed with RSA-PSS \
             parameters Go refuses (it takes SHA-256, SHA-384 or SHA-512, MGF1 with the same \
             hash, a salt as long as the hash, trailer field 1)"
        );
        // Go's checkSignature verifies with RSA, ECDSA and Ed25519 keys only: an issuer with a
        // DSA key, or an RSA-PSS one (which Go parses as no key), signs nothing Go accepts.
        if depth > 0 {
            let key = x509.public_key()?;
            ensure!(
                matches!(key.id(), Id::RSA | Id::EC | Id::ED25519),
                "{what} does not verify: certificate {depth} of the chain has a key of type {}, \
                 which Go verifies no certificate with",
                key_type(&key)
            );
        }
    }
    Ok(())
}

/// The key of `leaf` (`what`, for messages), once trusted, if containers/image verifies
/// signatures with its type ([`sigstore_verifies`]): a DSA or RSA-PSS leaf chains as well as any
/// other in Go, and is refused when its key is loaded.
pub(super) fn signing_key(what: &str, leaf: &Cert) -> Result<PKey<Public>> {
    let key = leaf
        .x509
        .public_key()
        .map_err(|e| anyhow!("{what} has a public key Go does not read: {e}"))?;
    sigstore_verifies(&key).with_context(|| format!("{what} cannot verify the signature"))?;
    Ok(key)
}

/// The verified chain, leaf first; or why not, at which depth, on which certificate.
type Verdict = std::result::Result<Vec<X509>, (X509VerifyResult, u32, Option<X509>)>;

fn openssl_verify(
    leaf: &Cert,
    intermediates: &[&Cert],
    roots: &[Cert],
    time: i64,
) -> Result<Verdict> {
    let mut param = X509VerifyParam::new()?;
    param.set_time(time);
    // Go trusts whatever the policy lists as an anchor, self-signed or not, and decides itself
    // which critical extensions it understands (checked on the chain afterwards).
    param.set_flags(X509VerifyFlags::PARTIAL_CHAIN | X509VerifyFlags::IGNORE_CRITICAL)?;
    // Level 1 refuses SHA-1 and MD5 signatures and keys under 80 bits, as Go does.
    param.set_auth_level(1);
    let mut store = X509StoreBuilder::new()?;
    for root in roots {
        store.add_cert(root.x509.clone())?;
    }
    store.set_param(&param)?;
    let store = store.build();
    let mut untrusted = Stack::new()?;
    for cert in intermediates {
        untrusted.push(cert.x509.clone())?;
    }
    let mut ctx = X509StoreContext::new()?;
    Ok(ctx.init(&store, &leaf.x509, &untrusted, |ctx| {
        if ctx.verify_cert()? {
            let chain = ctx
                .chain()
                .map(|c| c.iter().map(|x| x.to_owned()).collect());
            return Ok(chain.ok_or((X509VerifyResult::APPLICATION_VERIFICATION, 0, None)));
        }
        let cert = ctx.current_cert().map(|c| c.to_owned());
        Ok(Err((ctx.error(), ctx.error_depth(), cert)))
    })?)
}

fn ends_at(cert: &X509, time: i64) -> Result<bool> {
    let time = Asn1Time::from_unix(time)?;
    Ok(cert.not_after().compare(&time)? == Ordering::Equal)
}

/// The signature algorithms Go's `checkSignature` accepts (besides SHA-1 ones, refused).
fn go_verifies(nid: Nid) -> bool {
    matches!(
        nid,
        Nid::SHA256WITHRSAENCRYPTION
            | Nid::SHA384WITHRSAENCRYPTION
            | Nid::SHA512WITHRSAENCRYPTION
            | Nid::RSASSAPSS
            | Nid::ECDSA_WITH_SHA256
            | Nid::ECDSA_WITH_SHA384
            | Nid::ECDSA_WITH_SHA512
    ) || nid.as_raw() == Id::ED25519.as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_is_read_as_go_reads_it() {
        let cert = testing::read("fulcio-cert");
        assert_eq!(certs_from_pem(&cert).unwrap().len(), 1);
        let junk = [b"junk before\n".as_slice(), &cert, b"\n\n \t"].concat();
        assert_eq!(certs_from_pem(&junk).unwrap().len(), 1);
        assert!(certs_from_pem(&[cert.as_slice(), b"trailing junk"].concat()).is_err());
        assert_eq!(
            certs_from_pem(&[cert.clone(), cert.clone()].concat())
                .unwrap()
                .len(),
            2
        );
        assert!(certs_from_pem(b"").unwrap().is_empty());
        assert!(certs_from_pem(b"not a certificate").is_err());
        let crlf = String::from_utf8(cert.clone())
            .unwrap()
            .replace('\n', "\r\n");
        assert_eq!(certs_from_pem(crlf.as_bytes()).unwrap().len(), 1);
        // Any block type is parsed as a certificate; the pool takes only CERTIFICATE blocks.
        let renamed = String::from_utf8(cert)
            .unwrap()
            .replace("CERTIFICATE", "PUBLIC KEY");
        assert_eq!(certs_from_pem(renamed.as_bytes()).unwrap().len(), 1);
        assert!(pool_from_pem(renamed.as_bytes()).is_empty());
        assert_eq!(pool_from_pem(&testing::read("fulcio-chain")).len(), 2);
    }

    #[test]
    fn certificates_with_trailing_data_are_refused() {
        let (block, _) = pem_decode(&testing::read("pki-cert")).unwrap();
        assert!(Cert::from_der(&block.bytes).is_ok());
        assert!(Cert::from_der(&[block.bytes.as_slice(), &[0]].concat()).is_err());
    }
}
