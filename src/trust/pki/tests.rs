//! containers/image's PKI cases (`signature/pki_cert_test.go`), with its verdicts.

use super::*;
use crate::trust::x509::testing::{read, signature};
use crate::trust::x509::testing::{san, Case, TestCa};

const EMAIL: &str = "qiwan@redhat.com";
const HOST: &str = "myhost.example.com";

#[test]
fn the_published_pki_certificate_verifies_as_in_containers_image() {
    let (roots, intermediates) = (read("pki_root_crts.pem"), read("pki_intermediate_crts.pem"));
    let (cert, chain) = (read("pki-cert"), read("pki-chain"));
    let pki = PkiRoot::new(&roots, Some(&intermediates), Some(EMAIL), Some(HOST)).unwrap();
    let key = pki.verify(&cert, Some(&chain)).unwrap();
    assert!(key.public_eq(
        &x509::leaf_from_pem(&cert)
            .unwrap()
            .x509
            .public_key()
            .unwrap()
    ));
    assert!(pki.verify(&cert, Some(b"not a certificate")).is_err());
    assert!(pki.verify(b"not a certificate", Some(&chain)).is_err());
    // Intermediates: in neither the signature nor the policy, in either.
    let bare = PkiRoot::new(&roots, None, Some(EMAIL), None).unwrap();
    assert!(bare.verify(&cert, Some(b"")).is_err());
    assert!(bare.verify(&cert, None).is_err());
    assert!(bare.verify(&cert, Some(&chain)).is_ok());
    assert!(PkiRoot::new(&roots, Some(&intermediates), None, Some(HOST))
        .unwrap()
        .verify(&cert, None)
        .is_ok());
    // The subjects.
    for (email, host) in [
        (Some("other@example.com"), Some(HOST)),
        (Some(EMAIL), Some("other.example.com")),
        (None, Some("MYHOST.example.com.")),
        (None, Some("*.example.com")),
    ] {
        let pki = PkiRoot::new(&roots, Some(&intermediates), email, host).unwrap();
        assert_eq!(
            pki.verify(&cert, Some(&chain)).is_ok(),
            host == Some("MYHOST.example.com."),
            "{email:?} {host:?}"
        );
    }
    // The Fulcio CA is not this PKI's.
    let fulcio = PkiRoot::new(&read("fulcio_v1.crt.pem"), None, Some(EMAIL), None).unwrap();
    assert!(fulcio.verify(&cert, Some(&chain)).is_err());
    // The published signature's own certificate and chain.
    let (_, annotations) = signature("dir-img-cosign-pki-valid/signature-1");
    let cert = annotations["dev.sigstore.cosign/certificate"].as_bytes();
    assert!(pki
        .verify(
            cert,
            Some(annotations["dev.sigstore.cosign/chain"].as_bytes())
        )
        .is_ok());
    assert!(PkiRoot::new(&roots, None, None, None).is_err());
    assert!(PkiRoot::new(&roots, None, Some(""), Some("")).is_err());
    assert!(PkiRoot::new(b"", None, Some(EMAIL), None).is_err());
    assert!(PkiRoot::new(&roots, Some(b"not a certificate"), Some(EMAIL), None).is_err());
}

/// containers/image's generated-certificate cases (a leaf with `test-user@example.com` and
/// `myhost.example.com` unless the case says otherwise).
#[test]
fn generated_certificates_are_judged_as_in_containers_image() {
    let ca = TestCa::new();
    let pki = PkiRoot::new(
        &ca.pem,
        Some(&read("pki_intermediate_crts.pem")),
        Some("test-user@example.com"),
        Some(HOST),
    )
    .unwrap();
    let names = |emails: &[&str], hosts: &[&str]| ("2.5.29.17", false, san(emails, hosts));
    let user = "test-user@example.com";
    // As containers/image writes it: a primitive [0] holding "otherName".
    let other_name = [&[0x30, 0x0b, 0x80, 0x09][..], b"otherName"].concat();
    let cases: Vec<Case> = vec![
        ("valid", vec![names(&[user], &[HOST])], None),
        (
            "OtherName in SAN",
            vec![("2.5.29.17", true, other_name)],
            Some("unhandled critical extension"),
        ),
        (
            "unhandled critical extension",
            vec![
                names(&[user], &[HOST]),
                ("2.99999.99998.99997.99996", true, b"\x05\x00".to_vec()),
            ],
            Some("unhandled critical extension"),
        ),
        (
            "missing hostname",
            vec![names(&[user], &[])],
            Some("myhost.example.com"),
        ),
        (
            "several hostnames, one matches",
            vec![names(&[user], &["a.example.com", HOST, "c.example.com"])],
            None,
        ),
        (
            "hostname mismatch",
            vec![names(&[user], &["this-does-not-match.example.com"])],
            Some("hosts"),
        ),
        (
            "several hostnames, none matches",
            vec![names(&[user], &["a.example.com", "b.example.com"])],
            Some("hosts"),
        ),
        ("wildcard", vec![names(&[user], &["*.example.com"])], None),
        (
            "missing email",
            vec![names(&[], &[HOST])],
            Some("test-user@example.com"),
        ),
        (
            "several emails, one matches",
            vec![names(&["a@example.com", user, "c@example.com"], &[HOST])],
            None,
        ),
        (
            "email mismatch",
            vec![names(&["a@example.com"], &[HOST])],
            Some("test-user@example.com"),
        ),
        (
            "several emails, none matches",
            vec![names(&["a@example.com", "b@example.com"], &[HOST])],
            Some("test-user@example.com"),
        ),
    ];
    for (name, extensions, expected) in cases {
        let leaf = ca.leaf(&extensions);
        let result = pki.verify(&leaf, Some(&read("pki-chain")));
        match expected {
            None => assert!(result.is_ok(), "{name}: {:#}", result.unwrap_err()),
            Some(fragment) => {
                let err = format!(
                    "{:#}",
                    result.err().unwrap_or_else(|| panic!("{name}: accepted"))
                );
                assert!(err.contains(fragment), "{name}: {err}");
            }
        }
    }
}

#[test]
fn hostnames_match_as_in_go() {
    let ips = [vec![192, 0, 2, 1], [[0; 15].as_slice(), &[1]].concat()];
    for (name, host, matches) in [
        ("example.com", "EXAMPLE.com", true),
        ("example.com", "example.com.", true),
        ("*.example.com", "a.example.com", true),
        ("*.example.com", "a.b.example.com", false),
        ("*.example.com", "example.com", false),
        ("a*.example.com", "ab.example.com", false),
        ("a*.example.com", "a*.example.com", true),
        ("_srv.example.com", "_srv.example.com", true),
        ("example.com.", "example.com.", true),
        ("", "", false),
        ("192.0.2.1", "192.0.2.1", true), // IP addresses match IP SANs only: this one does
        ("x", "::ffff:192.0.2.1", true),
        ("x", "[::1]", true),
        ("x", "192.0.2.2", false),
    ] {
        assert_eq!(
            hostname_matches(&[name.to_owned()], &ips, host),
            matches,
            "{name} {host}"
        );
    }
    assert!(!hostname_matches(
        &["192.0.2.1".to_owned()],
        &[],
        "192.0.2.1"
    ));
}
