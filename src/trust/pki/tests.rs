//! containers/image's PKI cases (`signature/pki_cert_test.go`), with its verdicts.

use super::*;
use crate::trust::x509::testing::{read, signature};
use std::path::Path;

use crate::trust::x509::testing::{san, tlv, Case, Extension, TestCa};

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

/// The leaf's extensions containers/image's cases start from.
fn valid_names() -> Extension<'static> {
    ("2.5.29.17", false, san(&["test-user@example.com"], &[HOST]))
}

fn refused(result: Result<PKey<Public>>, name: &str, fragment: &str) {
    let err = format!(
        "{:#}",
        result.err().unwrap_or_else(|| panic!("{name}: accepted"))
    );
    assert!(err.contains(fragment), "{name}: {err}");
    assert!(!err.contains('\n'), "{name}: {err}");
}

/// Go's parser reads the extended key usages as a SEQUENCE of OIDs and the subject alternative
/// names as a SEQUENCE: anything else does not parse, and the certificate is refused.
#[test]
fn malformed_extended_key_usages_and_names_are_refused_as_go_refuses_them() {
    let ca = TestCa::new();
    let pki = PkiRoot::new(&ca.pem, None, Some("test-user@example.com"), None).unwrap();
    let code_signing = tlv(0x06, &[0x2b, 6, 1, 5, 5, 7, 3, 3]);
    let eku = |value: Vec<u8>| ("2.5.29.37", false, value);
    let cases: Vec<(&str, Vec<Extension>, Option<&str>)> = vec![
        ("code signing", vec![eku(tlv(0x30, &code_signing))], None),
        (
            "an OCTET STRING among the usages",
            vec![eku(tlv(
                0x30,
                &[code_signing.clone(), tlv(0x04, b"x")].concat(),
            ))],
            Some("malformed extended key usage"),
        ),
        (
            "a SET of usages",
            vec![eku(tlv(0x31, &code_signing))],
            Some("malformed extended key usage"),
        ),
        (
            "a usage OID not in minimal base 128",
            vec![eku(tlv(
                0x30,
                &tlv(0x06, &[0x2b, 6, 1, 5, 5, 7, 3, 0x80, 3]),
            ))],
            Some("malformed extended key usage"),
        ),
        (
            // 1.3.6.1.4.1.2147483648: OpenSSL reads any arc, Go none from 2^31.
            "a usage OID with an arc of 2^31",
            vec![eku(tlv(
                0x30,
                &[
                    code_signing.clone(),
                    tlv(0x06, &[0x2b, 6, 1, 4, 1, 0x88, 0x80, 0x80, 0x80, 0]),
                ]
                .concat(),
            ))],
            Some("malformed extended key usage"),
        ),
        (
            "an empty usage OID",
            vec![eku(tlv(0x30, &tlv(0x06, &[])))],
            Some("malformed extended key usage"),
        ),
        (
            "names in a SET",
            vec![(
                "2.5.29.17",
                false,
                tlv(0x31, &tlv(0x81, b"test-user@example.com")),
            )],
            Some("malformed subject alternative names"),
        ),
        (
            "names in a [0]",
            vec![(
                "2.5.29.17",
                false,
                tlv(0xa0, &tlv(0x81, b"test-user@example.com")),
            )],
            Some("malformed subject alternative names"),
        ),
    ];
    for (name, mut extensions, expected) in cases {
        if !name.starts_with("names") {
            extensions.push(valid_names());
        }
        let result = pki.verify(&ca.leaf(&extensions), None);
        match expected {
            None => assert!(result.is_ok(), "{name}: {:#}", result.unwrap_err()),
            Some(fragment) => refused(result, name, fragment),
        }
    }
}

/// A leaf whose key containers/image's verifier does not take (DSA, which Go 1.23 parses;
/// RSA-PSS, which Go parses as no key) chains, and then refuses the signature.
#[test]
fn leaves_with_keys_containers_image_does_not_verify_with_are_refused() {
    let ca = TestCa::new();
    let pki = PkiRoot::new(&ca.pem, None, Some("test-user@example.com"), None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, args, fragment) in [
        ("dsa", &["-algorithm", "DSA"][..], Some("key type DSA")),
        (
            "rsa-pss",
            &["-algorithm", "RSA-PSS"],
            Some("key type RSA-PSS"),
        ),
        ("rsa", &["-algorithm", "RSA"], None),
        ("ed25519", &["-algorithm", "ED25519"], None),
    ] {
        let (private, _) = pivot_testkit::genpkey_pair(dir.path(), name, args).unwrap();
        let key = PKey::private_key_from_pem(&std::fs::read(private).unwrap()).unwrap();
        let result = pki.verify(&ca.leaf_with_key(&key, &[valid_names()]), None);
        match fragment {
            None => assert!(result.is_ok(), "{name}: {:#}", result.unwrap_err()),
            Some(fragment) => {
                refused(
                    result,
                    name,
                    "the PKI certificate cannot verify the signature",
                );
                let err = pki.verify(&ca.leaf_with_key(&key, &[valid_names()]), None);
                refused(err, name, fragment);
            }
        }
    }
}

/// A CA made by `openssl req` with the key `genpkey` makes from `ca_args`, and a leaf it signs
/// with `sigopts` (`openssl x509 -req -sigopt …`): (CA PEM, leaf PEM).
fn openssl_chain(dir: &Path, ca_args: &[&str], sigopts: &[&str]) -> (Vec<u8>, Vec<u8>) {
    openssl_chain_with(dir, ca_args, &[], sigopts)
}

/// [`openssl_chain`], the CA with these more `-addext` extensions.
fn openssl_chain_with(
    dir: &Path,
    ca_args: &[&str],
    ca_extensions: &[&str],
    sigopts: &[&str],
) -> (Vec<u8>, Vec<u8>) {
    let leaf_extensions = format!("subjectAltName=email:test-user@example.com,DNS:{HOST}\n");
    let chain = pivot_testkit::OpensslChain {
        ca_key: ca_args,
        ca_extensions,
        leaf_key: pivot_testkit::P256,
        leaf_extensions: &leaf_extensions,
        sigopts,
    };
    let (ca, _, leaf) = pivot_testkit::openssl_chain(dir, &chain).unwrap();
    (std::fs::read(ca).unwrap(), leaf)
}

/// A chain case: its name, the CA's `genpkey` arguments, the leaf's `-sigopt`s, the expected
/// error fragment (`None`: accepted).
type ChainCase<'a> = (&'a str, &'a [&'a str], &'a [&'a str], Option<&'a str>);

/// RSA-PSS certificate signatures Go verifies: SHA-256/384/512, MGF1 with the same hash, the
/// salt as long as the hash; and only with an RSA (`rsaEncryption`) issuer key, not an RSA-PSS
/// one, which Go parses as no key.
#[test]
fn rsa_pss_certificate_signatures_are_judged_as_go_judges_them() {
    let rsa: &[&str] = &["-algorithm", "RSA"];
    let pss: &[&str] = &["-algorithm", "RSA-PSS"];
    let cases: &[ChainCase] = &[
        ("PKCS #1 v1.5", rsa, &[], None),
        (
            "PSS, SHA-256, salt 32",
            rsa,
            &["rsa_padding_mode:pss", "rsa_pss_saltlen:32"],
            None,
        ),
        (
            "PSS, SHA-256, salt 20",
            rsa,
            &["rsa_padding_mode:pss", "rsa_pss_saltlen:20"],
            Some("RSA-PSS parameters Go refuses"),
        ),
        (
            "PSS, SHA-256, MGF1 with SHA-384",
            rsa,
            &[
                "rsa_padding_mode:pss",
                "rsa_pss_saltlen:32",
                "rsa_mgf1_md:sha384",
            ],
            Some("RSA-PSS parameters Go refuses"),
        ),
        (
            "PSS by an RSA-PSS key",
            pss,
            &["rsa_padding_mode:pss", "rsa_pss_saltlen:32"],
            Some("certificate 1 of the chain has a key of type RSA-PSS"),
        ),
    ];
    for (name, ca_args, sigopts, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf) = openssl_chain(dir.path(), ca_args, sigopts);
        let pki = PkiRoot::new(&ca, None, Some("test-user@example.com"), None).unwrap();
        let result = pki.verify(&leaf, None);
        match expected {
            None => assert!(result.is_ok(), "{name}: {:#}", result.unwrap_err()),
            Some(fragment) => refused(result, name, fragment),
        }
    }
}

/// A root Go cannot parse (its extended key usages or names malformed) is no root: Go's
/// `AppendCertsFromPEM` skips it, and nothing chains to it.
#[test]
fn roots_with_malformed_extended_key_usages_or_names_are_skipped_as_go_skips_them() {
    let ec: &[&str] = &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    let email = "72:65:6c:65:61:73:65:40:78:2e:63:6f:6d"; // release@x.com
    let cases: &[(&str, &[&str], bool)] = &[
        ("well-formed", &["2.5.29.37=DER:30:0a:06:08:2b:06:01:05:05:07:03:03"], true),
        (
            "usages not OIDs",
            &["2.5.29.37=DER:30:0d:06:08:2b:06:01:05:05:07:03:03:04:01:78"],
            false,
        ),
        ("usages in a SET", &["2.5.29.37=DER:31:0a:06:08:2b:06:01:05:05:07:03:03"], false),
        (
            "a usage arc of 2^31",
            &["2.5.29.37=DER:30:16:06:08:2b:06:01:05:05:07:03:03:06:0a:2b:06:01:04:01:88:80:80:80:00"],
            false,
        ),
        ("names in a SET", &[&format!("2.5.29.17=DER:31:0f:81:0d:{email}")], false),
    ];
    for (name, ca_extensions, accepted) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf) = openssl_chain_with(dir.path(), ec, ca_extensions, &[]);
        let result = PkiRoot::new(&ca, None, Some("test-user@example.com"), None)
            .and_then(|pki| pki.verify(&leaf, None));
        assert_eq!(result.is_ok(), *accepted, "{name}");
    }
}
