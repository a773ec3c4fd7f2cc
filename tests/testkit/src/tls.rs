//! A certificate authority made at test time, for TLS registries, client
//! certificates and token signing.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::fs;
use std::path::{Path, PathBuf};

/// A self-signed ECDSA P-256 CA; every certificate it issues is PEM.
pub struct TestCa {
    name: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its PKCS#8 private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> Result<TestCa> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "pivot testkit");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().context("generating CA key")?;
        let issuer = CertifiedIssuer::self_signed(params, key)
            .with_context(|| format!("self-signing CA {name}"))?;
        Ok(TestCa {
            name: name.to_string(),
            issuer,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn ca_der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// A TLS server certificate; each SAN that parses as an IP address becomes
    /// an IP SAN, the rest DNS SANs (e.g. `&["127.0.0.1", "localhost"]`).
    pub fn server_cert(&self, sans: &[&str]) -> Result<CertKey> {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans.clone())
            .with_context(|| format!("server certificate SANs {sans:?}"))?;
        let cn = sans.first().map(String::as_str).unwrap_or("server");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, "server")
    }

    /// A TLS client certificate with subject CN `cn`.
    pub fn client_cert(&self, cn: &str) -> Result<CertKey> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, "client")
    }

    /// A TLS client certificate with an RSA key written in the traditional
    /// PKCS#1 form (`BEGIN RSA PRIVATE KEY`, as `openssl genrsa -traditional`
    /// makes it) instead of PKCS#8.
    pub fn client_cert_rsa_pkcs1(&self, cn: &str) -> Result<CertKey> {
        let rsa = openssl::rsa::Rsa::generate(2048).context("generating RSA client key")?;
        let pkcs1 = rsa
            .private_key_to_pem()
            .context("writing RSA key as PKCS#1")?;
        let pkcs8 = openssl::pkey::PKey::from_rsa(rsa)
            .and_then(|key| key.private_key_to_pem_pkcs8())
            .context("writing RSA key as PKCS#8")?;
        let key =
            KeyPair::from_pem(&String::from_utf8(pkcs8)?).context("loading RSA client key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = self.issue_for(params, &key, "RSA client")?;
        Ok(CertKey {
            key_pem: String::from_utf8(pkcs1)?,
            ..cert
        })
    }

    /// A leaf for signing (JWTs): digitalSignature only, no extended key usage.
    pub fn signing_cert(&self, cn: &str) -> Result<CertKey> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(params, "signing")
    }

    /// Writes `<dir>/<host>/ca.crt` (containers-certs.d(5) layout; `host` is
    /// "127.0.0.1:PORT") and returns `<dir>/<host>`.
    pub fn write_certs_d(&self, dir: &Path, host: &str) -> Result<PathBuf> {
        let host_dir = dir.join(host);
        fs::create_dir_all(&host_dir)
            .with_context(|| format!("creating {}", host_dir.display()))?;
        write(&host_dir.join("ca.crt"), &self.ca_pem())?;
        Ok(host_dir)
    }

    fn issue(&self, params: CertificateParams, what: &str) -> Result<CertKey> {
        let key = KeyPair::generate().with_context(|| format!("generating {what} key"))?;
        self.issue_for(params, &key, what)
    }

    fn issue_for(&self, params: CertificateParams, key: &KeyPair, what: &str) -> Result<CertKey> {
        let cert = params
            .signed_by(key, &self.issuer)
            .with_context(|| format!("signing {what} certificate with CA {}", self.name))?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl CertKey {
    /// Writes `<dir>/<host>/client.cert` and `client.key`: certs.d(5) pairs a
    /// `*.cert` with the `*.key` of the same stem. Returns `<dir>/<host>`.
    pub fn write_client_certs_d(&self, dir: &Path, host: &str) -> Result<PathBuf> {
        let host_dir = dir.join(host);
        fs::create_dir_all(&host_dir)
            .with_context(|| format!("creating {}", host_dir.display()))?;
        write(&host_dir.join("client.cert"), &self.cert_pem)?;
        write(&host_dir.join("client.key"), &self.key_pem)?;
        Ok(host_dir)
    }
}

pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The DER bytes of the first PEM block in `pem`.
pub(crate) fn pem_to_der(pem: &str) -> Result<Vec<u8>> {
    use base64::Engine;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .context("decoding PEM body")
}
