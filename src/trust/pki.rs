//! Signatures by certificates of the admin's own CA (the `pki` part of a `sigstoreSigned`
//! requirement), judged as containers/image judges them (`signature/pki_cert.go`): the
//! signature's certificate must chain, through the intermediates the policy trusts and those
//! the signature carries (all but its chain's last certificate), to a root the policy trusts,
//! now (there is no Rekor time here), for code signing; and name the policy's subject: its
//! e-mail among the certificate's SAN e-mail addresses, its hostname as Go's
//! `VerifyHostname` matches it (SAN DNS names, a leading `*.` wildcard, IP addresses against
//! SAN IPs, never the subject's common name).
//!
//! The chain is verified with OpenSSL, with Go's rules where they differ ([`super::x509`]: why
//! OpenSSL, and which rules). The hostname is matched here, not by OpenSSL's `X509_check_host`,
//! whose wildcards and common-name fallback differ from Go's.

use std::net::IpAddr;

use anyhow::{bail, ensure, Context, Result};
use openssl::pkey::{PKey, Public};

use super::x509::{self, Cert};

/// The `pki` part of a `sigstoreSigned` requirement.
pub struct PkiRoot {
    roots: Vec<Cert>,
    intermediates: Vec<Cert>,
    subject_email: Option<String>,
    subject_hostname: Option<String>,
}

impl PkiRoot {
    /// `roots_pem`: the CA roots (`caRootsPath`/`caRootsData`; blocks that are not certificates
    /// are skipped as containers/image skips them, one at least must be); `intermediates_pem`:
    /// `caIntermediatesPath`/`caIntermediatesData`, every block a certificate. An empty subject
    /// is no subject; one at least is required.
    pub fn new(
        roots_pem: &[u8],
        intermediates_pem: Option<&[u8]>,
        subject_email: Option<&str>,
        subject_hostname: Option<&str>,
    ) -> Result<PkiRoot> {
        let roots = x509::pool_from_pem(roots_pem);
        ensure!(
            !roots.is_empty(),
            "the PKI CA roots data holds no certificate"
        );
        let intermediates = match intermediates_pem {
            Some(pem) => x509::certs_from_pem(pem).context("reading the PKI CA intermediates")?,
            None => Vec::new(),
        };
        let given = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
        let (subject_email, subject_hostname) = (given(subject_email), given(subject_hostname));
        ensure!(
            subject_email.is_some() || subject_hostname.is_some(),
            "the PKI requirement names neither a subject e-mail nor a subject hostname"
        );
        Ok(PkiRoot {
            roots,
            intermediates,
            subject_email,
            subject_hostname,
        })
    }

    /// The public key of the signature's certificate `cert_pem` (one PEM certificate), if it is
    /// valid now and for the policy's subject. `chain_pem`: the signature's
    /// `dev.sigstore.cosign/chain` annotation.
    pub fn verify(&self, cert_pem: &[u8], chain_pem: Option<&[u8]>) -> Result<PKey<Public>> {
        let untrusted = x509::untrusted_intermediates(chain_pem)?;
        let leaf = x509::leaf_from_pem(cert_pem)?;
        let intermediates: Vec<&Cert> = self.intermediates.iter().chain(&untrusted).collect();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        let now = i64::try_from(now.as_secs())?;
        x509::verify_chain(
            "the PKI certificate",
            &leaf,
            &intermediates,
            &self.roots,
            now,
            false,
        )?;
        if let Some(email) = &self.subject_email {
            let emails = &leaf.parsed.emails;
            ensure!(
                emails.contains(email),
                "the PKI certificate is for the e-mail addresses {emails:?}, the policy requires {email:?}"
            );
        }
        if let Some(hostname) = &self.subject_hostname {
            if !hostname_matches(&leaf.parsed.dns_names, &leaf.parsed.ips, hostname) {
                bail!(
                    "the PKI certificate is for the hosts {:?}, the policy requires {hostname:?}",
                    leaf.parsed.dns_names
                );
            }
        }
        x509::signing_key("the PKI certificate", &leaf)
    }
}

/// Go's `Certificate.VerifyHostname`, on the certificate's SAN DNS names and IP addresses.
fn hostname_matches(dns_names: &[String], ips: &[Vec<u8>], host: &str) -> bool {
    let ip = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = ip.parse::<IpAddr>() {
        return ips.iter().any(|candidate| {
            let candidate = match <[u8; 4]>::try_from(candidate.as_slice()) {
                Ok(v4) => Some(IpAddr::from(v4)),
                Err(_) => <[u8; 16]>::try_from(candidate.as_slice())
                    .ok()
                    .map(IpAddr::from),
            };
            candidate.is_some_and(|c| c.to_canonical() == ip.to_canonical())
        });
    }
    let host = host.to_ascii_lowercase();
    let valid_host = valid_hostname(&host, false);
    dns_names.iter().any(|name| {
        let name = name.to_ascii_lowercase();
        if valid_host && valid_hostname(&name, true) {
            wildcard_match(&name, host.strip_suffix('.').unwrap_or(&host))
        } else {
            !matches!(name.as_str(), "" | ".") && !matches!(host.as_str(), "" | ".") && name == host
        }
    })
}

/// Go's `validHostname`: labels of letters, digits, `-` (not first) and `_`; a pattern may
/// start with a `*` label, an input may end with a dot.
fn valid_hostname(host: &str, pattern: bool) -> bool {
    let host = if pattern {
        host
    } else {
        host.strip_suffix('.').unwrap_or(host)
    };
    if host.is_empty() || host == "*" {
        return false;
    }
    host.split('.').enumerate().all(|(i, label)| {
        !label.is_empty()
            && ((pattern && i == 0 && label == "*")
                || label
                    .char_indices()
                    .all(|(j, c)| c.is_ascii_alphanumeric() || c == '_' || (c == '-' && j != 0)))
    })
}

/// Go's `matchHostnames`: equal label by label, the pattern's first label may be `*`.
fn wildcard_match(pattern: &str, host: &str) -> bool {
    if pattern.is_empty()
        || host.is_empty()
        || pattern.split('.').count() != host.split('.').count()
    {
        return false;
    }
    pattern
        .split('.')
        .zip(host.split('.'))
        .enumerate()
        .all(|(i, (p, h))| (i == 0 && p == "*") || p == h)
}

#[cfg(test)]
mod tests;
