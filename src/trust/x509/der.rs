//! What Go's `crypto/x509` reads from a certificate beyond OpenSSL's API: its extensions, as
//! Go parses and judges them, on the DER itself. It reads hostile bytes: no indexing, every
//! length checked.

use anyhow::{anyhow, bail, ensure, Result};

/// One DER element: tag, contents, and what follows. Low tag numbers only (all X.509 uses).
pub(crate) fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // DER: the long form only from 128, on as few bytes as it takes.
        let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
        if bytes.is_empty() || bytes.len() > 4 || bytes.first() == Some(&0) {
            return None;
        }
        let len = bytes.iter().fold(0usize, |n, &b| n << 8 | usize::from(b));
        if len < 0x80 {
            return None;
        }
        (len, rest)
    };
    let (contents, rest) = rest.split_at_checked(len)?;
    Some((tag, contents, rest))
}

/// The elements of a constructed value's contents.
pub(crate) fn elements(mut contents: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    while !contents.is_empty() {
        let (tag, value, rest) = tlv(contents)?;
        out.push((tag, value));
        contents = rest;
    }
    Some(out)
}

/// Whether a SubjectPublicKeyInfo names its curve (Go refuses explicit parameters).
pub(crate) fn spki_has_named_curve(spki: &[u8]) -> bool {
    let algorithm = tlv(spki)
        .and_then(|(_, c, _)| elements(c))
        .and_then(|e| e.first().copied());
    let parts = algorithm.and_then(|(_, c)| elements(c)).unwrap_or_default();
    matches!(parts.as_slice(), [(0x06, _), (0x06, _)])
}

pub(crate) struct Extension {
    pub oid: Vec<u8>,
    pub critical: bool,
    pub value: Vec<u8>,
}

/// What Go's x509 parser reads from a certificate's extensions.
#[derive(Default)]
pub(crate) struct Parsed {
    pub extensions: Vec<Extension>,
    pub emails: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<Vec<u8>>,
    uris: usize,
    extended_key_usages: Option<Vec<Vec<u8>>>,
    /// The contents of the certificate's signature AlgorithmIdentifier.
    signature_algorithm: Vec<u8>,
    /// Name constraints of a form Go does not check.
    unhandled_name_constraints: bool,
}

/// `id-ce` (2.5.29) OIDs.
const fn ce(n: u8) -> [u8; 3] {
    [0x55, 0x1d, n]
}
const AUTHORITY_INFO_ACCESS: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 1, 1];
const CODE_SIGNING: &[u8] = &[0x2b, 6, 1, 5, 5, 7, 3, 3];
const ANY_EXTENDED_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25, 0];

/// Reads a certificate Go would parse (its extensions only in a v3 certificate, as Go does).
pub(crate) fn parse(cert: &[u8], v3: bool) -> Result<Parsed> {
    let malformed = || anyhow!("malformed certificate");
    let (_, body, _) = tlv(cert).ok_or_else(malformed)?;
    let parts = elements(body).ok_or_else(malformed)?;
    let [(0x30, tbs), (0x30, outer_algorithm), (0x03, _)] = parts.as_slice() else {
        bail!(malformed());
    };
    let fields = elements(tbs).ok_or_else(malformed)?;
    let mut fields = fields.iter().skip_while(|(tag, _)| *tag == 0xa0).skip(1);
    let inner_algorithm = fields.next().ok_or_else(malformed)?;
    ensure!(
        inner_algorithm.1 == *outer_algorithm,
        "inner and outer signature algorithms differ"
    );
    let mut parsed = Parsed {
        signature_algorithm: outer_algorithm.to_vec(),
        ..Parsed::default()
    };
    let Some((_, extensions)) = fields.find(|(tag, _)| *tag == 0xa3).filter(|_| v3) else {
        return Ok(parsed);
    };
    let (_, list, _) = tlv(extensions).ok_or_else(malformed)?;
    for (_, extension) in elements(list).ok_or_else(malformed)? {
        let parts = elements(extension).ok_or_else(malformed)?;
        let (oid, critical, value) = match parts.as_slice() {
            [(0x06, oid), (0x04, value)] => (oid, false, value),
            [(0x06, oid), (0x01, [b @ (0 | 0xff)]), (0x04, value)] => (oid, *b == 0xff, value),
            _ => bail!("malformed certificate extension"),
        };
        ensure!(go_oid(oid), "malformed certificate extension identifier");
        ensure!(
            !parsed.extensions.iter().any(|e| e.oid == *oid),
            "the certificate contains duplicate extensions ({})",
            oid_string(oid)
        );
        let incorrectly_critical = [&ce(14)[..], &ce(35), AUTHORITY_INFO_ACCESS].contains(oid);
        ensure!(
            !(critical && incorrectly_critical),
            "{} marked critical",
            oid_string(oid)
        );
        if *oid == ce(17) {
            parsed.read_subject_alt_names(value)?;
        } else if *oid == ce(37) {
            // Go: a SEQUENCE of OBJECT IDENTIFIERs, or the certificate does not parse.
            let list = tlv(value)
                .filter(|(tag, _, _)| *tag == 0x30)
                .and_then(|(_, c, _)| elements(c))
                .filter(|list| list.iter().all(|(tag, oid)| *tag == 0x06 && go_oid(oid)));
            let list = list.ok_or_else(|| anyhow!("malformed extended key usage"))?;
            parsed.extended_key_usages = Some(list.iter().map(|(_, oid)| oid.to_vec()).collect());
        } else if *oid == ce(30) {
            parsed.unhandled_name_constraints = name_constraints_unhandled(value)?;
        }
        parsed.extensions.push(Extension {
            oid: oid.to_vec(),
            critical,
            value: value.to_vec(),
        });
    }
    Ok(parsed)
}

impl Parsed {
    fn read_subject_alt_names(&mut self, value: &[u8]) -> Result<()> {
        // Go: a SEQUENCE of names, or the certificate does not parse.
        let names = tlv(value)
            .filter(|(tag, _, _)| *tag == 0x30)
            .and_then(|(_, c, _)| elements(c));
        for (tag, name) in names.ok_or_else(|| anyhow!("malformed subject alternative names"))? {
            let ascii = || {
                let text = std::str::from_utf8(name).ok().filter(|t| t.is_ascii());
                text.map(str::to_owned)
                    .ok_or_else(|| anyhow!("a subject alternative name is not ASCII"))
            };
            match tag {
                0x81 => self.emails.push(ascii()?),
                0x82 => self.dns_names.push(ascii()?),
                0x86 => {
                    ascii()?;
                    self.uris += 1;
                }
                0x87 => {
                    ensure!(
                        matches!(name.len(), 4 | 16),
                        "an IP address name of {} bytes",
                        name.len()
                    );
                    self.ips.push(name.to_vec());
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The first critical extension Go does not understand; `tolerate_san`: a SAN with no name
    /// Go reads counts as understood.
    pub fn unhandled_critical(&self, tolerate_san: bool) -> Option<String> {
        let no_names = self.emails.is_empty()
            && self.dns_names.is_empty()
            && self.ips.is_empty()
            && self.uris == 0;
        let understood = |oid: &[u8]| match oid {
            [0x55, 0x1d, 17] => tolerate_san || !no_names,
            [0x55, 0x1d, 30] => !self.unhandled_name_constraints,
            [0x55, 0x1d, n] => [14, 15, 19, 31, 32, 33, 35, 36, 37, 54].contains(n),
            _ => oid == AUTHORITY_INFO_ACCESS,
        };
        let e = self
            .extensions
            .iter()
            .find(|e| e.critical && !understood(&e.oid))?;
        Some(oid_string(&e.oid))
    }

    /// Go's extended-key-usage rule for one certificate of a chain, asked for code signing.
    pub fn allows_code_signing(&self) -> bool {
        self.extended_key_usages.as_ref().is_none_or(|usages| {
            usages.is_empty()
                || usages
                    .iter()
                    .any(|u| u == CODE_SIGNING || u == ANY_EXTENDED_KEY_USAGE)
        })
    }
}

/// An OBJECT IDENTIFIER's contents as Go's `cryptobyte` reads them
/// (`ReadASN1ObjectIdentifier`): not empty, every arc in minimal base 128 and under 2^31.
pub(crate) fn go_oid(oid: &[u8]) -> bool {
    let mut arc: u32 = 0;
    let mut start = true;
    for &b in oid {
        if start && b == 0x80 {
            return false;
        }
        if arc >= 1 << (31 - 7) {
            return false;
        }
        arc = arc << 7 | u32::from(b & 0x7f);
        start = b & 0x80 == 0;
        if start {
            arc = 0;
        }
    }
    !oid.is_empty() && start
}

/// `sha256`, `sha384`, `sha512` (2.16.840.1.101.3.4.2.1-3) and their hash lengths.
const PSS_HASHES: [([u8; 9], u8); 3] = [
    ([0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 1], 32),
    ([0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 2], 48),
    ([0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 3], 64),
];
/// `id-mgf1` (1.2.840.113549.1.1.8).
const MGF1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 8];

impl Parsed {
    /// Whether the certificate's RSASSA-PSS parameters are the ones Go's
    /// `getSignatureAlgorithmFromAI` names (any other is an unknown algorithm to it): SHA-256,
    /// -384 or -512 (parameters absent or NULL), MGF1 with the same hash, a salt as long as the
    /// hash, the trailer field 1 (absent or explicit).
    pub fn go_pss_parameters(&self) -> bool {
        let params = elements(&self.signature_algorithm)
            .and_then(|parts| match parts.as_slice() {
                [(0x06, _), (0x30, params)] => elements(params),
                _ => None,
            })
            .unwrap_or_default();
        let algorithm = |explicit: &[u8]| -> Option<(Vec<u8>, bool)> {
            let (tag, contents, rest) = tlv(explicit)?;
            let parts = elements(contents).filter(|_| tag == 0x30 && rest.is_empty())?;
            match parts.as_slice() {
                [(0x06, oid)] => Some((oid.to_vec(), true)),
                [(0x06, oid), (0x05, [])] => Some((oid.to_vec(), true)),
                [(0x06, oid), (_, _)] => Some((oid.to_vec(), false)),
                _ => None,
            }
        };
        let (hash, mgf, salt, trailer) = match params.as_slice() {
            [(0xa0, h), (0xa1, m), (0xa2, s)] => (h, m, s, None),
            [(0xa0, h), (0xa1, m), (0xa2, s), (0xa3, t)] => (h, m, s, Some(t)),
            _ => return false,
        };
        let Some((hash, true)) = algorithm(hash) else {
            return false;
        };
        // MGF1's parameter is itself an AlgorithmIdentifier: the same hash.
        let mgf_hash = tlv(mgf).and_then(|(tag, contents, rest)| {
            let parts = elements(contents).filter(|_| tag == 0x30 && rest.is_empty())?;
            match parts.as_slice() {
                [(0x06, oid), (0x30, _)] if *oid == MGF1 => {
                    let (_, _, after) = tlv(contents)?;
                    algorithm(after)
                }
                _ => None,
            }
        });
        let Some((mgf_hash, true)) = mgf_hash else {
            return false;
        };
        let int = |explicit: &[u8]| match tlv(explicit) {
            Some((0x02, [n], [])) if *n < 0x80 => Some(*n),
            _ => None,
        };
        let trailer_ok = trailer.is_none_or(|t| int(t) == Some(1));
        PSS_HASHES.iter().any(|(oid, len)| {
            hash == oid && mgf_hash == hash && int(salt) == Some(*len) && trailer_ok
        })
    }
}

/// Go marks name constraints it cannot check (other than DNS, IP, e-mail, URI) as unhandled.
fn name_constraints_unhandled(value: &[u8]) -> Result<bool> {
    let invalid = || anyhow!("invalid name constraints");
    let (_, subtrees, rest) = tlv(value).ok_or_else(invalid)?;
    ensure!(rest.is_empty(), invalid());
    let mut unhandled = false;
    let mut any = false;
    for (tag, list) in elements(subtrees).ok_or_else(invalid)? {
        ensure!(tag == 0xa0 || tag == 0xa1, invalid());
        for (_, subtree) in elements(list).ok_or_else(invalid)? {
            let (base, _, _) = tlv(subtree).ok_or_else(invalid)?;
            unhandled |= !matches!(base, 0x81 | 0x82 | 0x86 | 0x87);
            any = true;
        }
    }
    ensure!(any, "empty name constraints");
    Ok(unhandled)
}

/// An OID's dotted form, for messages.
pub(crate) fn oid_string(oid: &[u8]) -> String {
    let mut arcs = Vec::new();
    let mut n: u64 = 0;
    for &b in oid {
        n = n.saturating_mul(128) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (n / 40).min(2);
                arcs.extend([first, n - first * 40]);
            } else {
                arcs.push(n);
            }
            n = 0;
        }
    }
    arcs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_bytes_do_not_panic() {
        for input in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x80",
            b"\x30\x81\x05abcde",
            b"\x1f\x01\x00",
            b"\x30\x03\x30\x01",
        ] {
            assert!(parse(input, true).is_err());
            assert!(tlv(input).is_none_or(|(_, _, rest)| rest.is_empty()));
        }
        assert_eq!(
            oid_string(&[0x2b, 6, 1, 4, 1, 0x83, 0xbf, 0x30, 1, 1]),
            "1.3.6.1.4.1.57264.1.1"
        );
    }
}
