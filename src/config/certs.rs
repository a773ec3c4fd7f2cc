//! TLS material per registry, laid out as containers-certs.d(5) says: in
//! `/etc/containers/certs.d/<host[:port]>/` (then `/etc/docker/certs.d/<host[:port]>/`), or in
//! the directory given with `--cert-dir`: `*.crt` files are extra trusted CAs (PEM), and a
//! `*.cert` with the `*.key` of the same name is a client certificate.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

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

    #[test]
    fn absent_directory_means_system_trust_only() {
        let certs = for_host("nonexistent.invalid:1", None).unwrap();
        assert!(certs.ca_pems.is_empty() && certs.client_pairs.is_empty());
    }
}
