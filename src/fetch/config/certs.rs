//! TLS material per registry, laid out as containers-certs.d(5) says: in
//! `/etc/containers/certs.d/<host[:port]>/` (then `/etc/docker/certs.d/<host[:port]>/`), or in
//! the directory given with `--cert-dir`: `*.crt` files are extra trusted CAs (PEM), and a
//! `*.cert` with the `*.key` of the same name is a client certificate.
//!
//! A TLS handshake presents one client certificate: with several pairs, the first in name order.
//! Its key may be PKCS#8, PKCS#1 RSA or SEC1 EC PEM; it is handed on as PKCS#8, the only form
//! native-tls takes.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use openssl::pkey::{PKey, Private};
use openssl::x509::X509;

pub const CERTS_D: [&str; 2] = ["/etc/containers/certs.d", "/etc/docker/certs.d"];

#[derive(Debug, Default, Clone)]
pub struct RegistryCerts {
    /// PEM bundles of extra trusted CAs.
    pub ca_pems: Vec<Vec<u8>>,
    /// (certificate PEM path, key PEM path) pairs.
    pub client_pairs: Vec<(PathBuf, PathBuf)>,
    /// The directory they came from.
    pub dir: Option<PathBuf>,
}

/// The certificates for `host` (`host[:port]`): from `cert_dir` when given, else certs.d.
pub fn for_host(host: &str, cert_dir: Option<&Path>) -> Result<RegistryCerts> {
    let dir = match cert_dir {
        Some(dir) => Some(dir.to_path_buf()),
        None => CERTS_D
            .iter()
            .map(|d| Path::new(d).join(host))
            .find(|d| d.is_dir()),
    };
    let Some(dir) = dir else {
        return Ok(RegistryCerts::default());
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading certificate directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut certs = RegistryCerts {
        dir: Some(dir.clone()),
        ..Default::default()
    };
    for path in entries {
        match path.extension().and_then(|x| x.to_str()) {
            Some("crt") => certs.ca_pems.push(
                std::fs::read(&path)
                    .with_context(|| format!("reading CA certificate {}", path.display()))?,
            ),
            Some("cert") => {
                let key = path.with_extension("key");
                anyhow::ensure!(
                    key.is_file(),
                    "client certificate {} has no matching key {}",
                    path.display(),
                    key.display()
                );
                certs.client_pairs.push((path, key));
            }
            _ => {}
        }
    }
    Ok(certs)
}

/// A client certificate read and checked, ready to present.
#[derive(Clone)]
pub struct ClientCert {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// The certificate, then any intermediates, PEM.
    pub cert_chain_pem: Vec<u8>,
    /// The private key as PKCS#8 PEM, whatever PEM form the file had.
    pub key_pkcs8_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ClientCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl RegistryCerts {
    /// The client certificate to present: the first pair in name order, read and checked.
    pub fn client_cert(&self) -> Result<Option<ClientCert>> {
        self.client_pairs
            .first()
            .map(|(cert, key)| load_client_cert(cert, key))
            .transpose()
    }
}

/// Reads a `*.cert`/`*.key` pair, converts the key to PKCS#8 and checks that it belongs to the
/// certificate; every error names the file at fault.
pub fn load_client_cert(cert_path: &Path, key_path: &Path) -> Result<ClientCert> {
    let cert_chain_pem = std::fs::read(cert_path)
        .with_context(|| format!("reading client certificate {}", cert_path.display()))?;
    let leaf = X509::stack_from_pem(&cert_chain_pem)
        .ok()
        .and_then(|chain| chain.into_iter().next())
        .ok_or_else(|| anyhow!("not a PEM certificate"))
        .with_context(|| format!("reading client certificate {}", cert_path.display()))?;
    let key_pem = std::fs::read(key_path)
        .with_context(|| format!("reading client key {}", key_path.display()))?;
    let key = parse_private_key(&key_pem)
        .with_context(|| format!("reading client key {}", key_path.display()))?;
    let matches = leaf
        .public_key()
        .map(|public| public.public_eq(&key))
        .unwrap_or(false);
    ensure!(
        matches,
        "client key {} does not belong to the certificate {}",
        key_path.display(),
        cert_path.display()
    );
    let key_pkcs8_pem = key
        .private_key_to_pem_pkcs8()
        .with_context(|| format!("converting client key {} to PKCS#8", key_path.display()))?;
    Ok(ClientCert {
        cert_path: cert_path.to_path_buf(),
        key_path: key_path.to_path_buf(),
        cert_chain_pem,
        key_pkcs8_pem,
    })
}

/// An unencrypted private key in PEM: PKCS#8 (`BEGIN PRIVATE KEY`), PKCS#1 RSA
/// (`BEGIN RSA PRIVATE KEY`) or SEC1 EC (`BEGIN EC PRIVATE KEY`).
fn parse_private_key(pem: &[u8]) -> Result<PKey<Private>> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
        || text.contains("Proc-Type: 4,ENCRYPTED")
    {
        bail!("the key is encrypted; pivot runs unattended and needs it unencrypted");
    }
    // A passphrase callback that gives none: OpenSSL must never prompt on a terminal.
    PKey::private_key_from_pem_callback(pem, |_| Ok(0))
        .map_err(|_| anyhow!("not a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC, unencrypted)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cert_dir_yields_cas_and_client_pairs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), "CA").unwrap();
        std::fs::write(dir.path().join("client.cert"), "C").unwrap();
        std::fs::write(dir.path().join("client.key"), "K").unwrap();
        std::fs::write(dir.path().join("README"), "ignored").unwrap();
        let certs = for_host("r.io", Some(dir.path())).unwrap();
        assert_eq!(certs.ca_pems, vec![b"CA".to_vec()]);
        assert_eq!(certs.client_pairs.len(), 1);
    }

    #[test]
    fn client_cert_without_key_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("client.cert"), "C").unwrap();
        let err = for_host("r.io", Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains("client.key"), "{err}");
    }

    /// A self-signed certificate for `key`, PEM.
    fn cert_for(key: &PKey<Private>) -> Vec<u8> {
        use openssl::{asn1::Asn1Time, hash::MessageDigest, x509::X509NameBuilder};
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "pivot-node").unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(key).unwrap();
        b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
            .unwrap();
        b.sign(key, MessageDigest::sha256()).unwrap();
        b.build().to_pem().unwrap()
    }

    fn rsa_key() -> (PKey<Private>, Vec<u8>) {
        let rsa = openssl::rsa::Rsa::generate(2048).unwrap();
        let pkcs1 = rsa.private_key_to_pem().unwrap();
        (PKey::from_rsa(rsa).unwrap(), pkcs1)
    }

    fn ec_key() -> (PKey<Private>, Vec<u8>) {
        let group =
            openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
        let ec = openssl::ec::EcKey::generate(&group).unwrap();
        let sec1 = ec.private_key_to_pem().unwrap();
        (PKey::from_ec_key(ec).unwrap(), sec1)
    }

    fn write_pair(dir: &Path, stem: &str, cert: &[u8], key: &[u8]) -> (PathBuf, PathBuf) {
        let (c, k) = (
            dir.join(format!("{stem}.cert")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (c, k)
    }

    #[test]
    fn pkcs1_rsa_and_sec1_ec_keys_become_pkcs8_of_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        for (stem, (key, pem), header) in [
            ("rsa", rsa_key(), "-----BEGIN RSA PRIVATE KEY-----"),
            ("ec", ec_key(), "-----BEGIN EC PRIVATE KEY-----"),
        ] {
            assert!(String::from_utf8_lossy(&pem).starts_with(header));
            let (c, k) = write_pair(dir.path(), stem, &cert_for(&key), &pem);
            let loaded = load_client_cert(&c, &k).unwrap();
            assert!(
                loaded
                    .key_pkcs8_pem
                    .starts_with(b"-----BEGIN PRIVATE KEY-----"),
                "{stem}"
            );
            let back = PKey::private_key_from_pem(&loaded.key_pkcs8_pem).unwrap();
            assert!(back.public_eq(&key), "{stem}: another key came out");
        }
    }

    #[test]
    fn pkcs8_key_is_taken_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (key, _) = ec_key();
        let pkcs8 = key.private_key_to_pem_pkcs8().unwrap();
        let (c, k) = write_pair(dir.path(), "client", &cert_for(&key), &pkcs8);
        let loaded = load_client_cert(&c, &k).unwrap();
        assert_eq!(loaded.key_pkcs8_pem, pkcs8);
        assert!(!format!("{loaded:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn bad_pem_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let (key, pem) = ec_key();
        let cert = cert_for(&key);
        let err = |c: &Path, k: &Path| format!("{:#}", load_client_cert(c, k).unwrap_err());

        let (c, k) = write_pair(dir.path(), "garbage-key", &cert, b"not a key");
        assert_eq!(
            err(&c, &k),
            format!(
                "reading client key {}: not a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC, unencrypted)",
                k.display()
            )
        );

        // A certificate where the key should be.
        let (c, k) = write_pair(dir.path(), "swapped", &cert, &cert);
        let e = err(&c, &k);
        assert!(
            e.starts_with(&format!(
                "reading client key {}: not a PEM private key",
                k.display()
            )),
            "{e}"
        );

        let (c, k) = write_pair(
            dir.path(),
            "garbage-cert",
            b"-----BEGIN CERTIFICATE-----
",
            &pem,
        );
        assert_eq!(
            err(&c, &k),
            format!(
                "reading client certificate {}: not a PEM certificate",
                c.display()
            )
        );

        let (other, _) = ec_key();
        let (c, k) = write_pair(dir.path(), "mismatch", &cert_for(&other), &pem);
        let e = err(&c, &k);
        assert!(e.contains("does not belong to the certificate"), "{e}");
        assert!(e.contains(&k.display().to_string()) && e.contains(&c.display().to_string()));

        let encrypted = key
            .private_key_to_pem_pkcs8_passphrase(openssl::symm::Cipher::aes_128_cbc(), b"pw")
            .unwrap();
        let (c, k) = write_pair(dir.path(), "encrypted", &cert, &encrypted);
        let e = err(&c, &k);
        assert!(
            e.contains("encrypted") && e.contains(&k.display().to_string()),
            "{e}"
        );

        let missing = dir.path().join("absent.key");
        let e = err(&c, &missing);
        assert!(
            e.starts_with(&format!("reading client key {}", missing.display())),
            "{e}"
        );
    }

    #[test]
    fn the_first_pair_in_name_order_is_presented() {
        let dir = tempfile::tempdir().unwrap();
        let (first, first_pem) = ec_key();
        let (second, second_pem) = ec_key();
        write_pair(dir.path(), "b-node", &cert_for(&second), &second_pem);
        write_pair(dir.path(), "a-node", &cert_for(&first), &first_pem);
        let certs = for_host("r.io", Some(dir.path())).unwrap();
        assert_eq!(certs.client_pairs.len(), 2);
        let chosen = certs.client_cert().unwrap().unwrap();
        assert_eq!(chosen.cert_path, dir.path().join("a-node.cert"));
        assert!(PKey::private_key_from_pem(&chosen.key_pkcs8_pem)
            .unwrap()
            .public_eq(&first));
    }

    #[test]
    fn absent_directory_means_system_trust_only() {
        let certs = for_host("nonexistent.invalid:1", None).unwrap();
        assert!(certs.ca_pems.is_empty() && certs.client_pairs.is_empty());
    }
}
