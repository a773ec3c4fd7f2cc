//! containers/image's Fulcio cases (`signature/fulcio_cert_test.go`), with its verdicts.

use super::*;
use crate::trust::rekor::{verify_set, RekorKeys};
use crate::trust::x509::testing::read;
use crate::trust::x509::testing::{san, tlv, Case, Extension, TestCa};

const ISSUER: &str = "https://github.com/login/oauth";
const EMAIL: &str = "mitr@redhat.com";
/// The fixture's Rekor integrated time; its certificate is valid 18:48:18–18:58:18 UTC.
const LOGGED: i64 = 1670870899;

fn root(ca: &[u8], issuer: &str, email: &str) -> FulcioRoot {
    FulcioRoot::new(ca, issuer, email).unwrap()
}

fn verify(root: &FulcioRoot, time: i64, cert: &[u8], chain: Option<&[u8]>) -> Result<PKey<Public>> {
    root.verify_at(time, cert, chain)
}

#[test]
fn the_published_fulcio_certificate_verifies_as_in_containers_image() {
    let (ca, cert, chain) = (
        read("fulcio_v1.crt.pem"),
        read("fulcio-cert"),
        read("fulcio-chain"),
    );
    let fulcio = root(&ca, ISSUER, EMAIL);
    let key = verify(&fulcio, LOGGED, &cert, Some(&chain)).unwrap();
    let expected = x509::leaf_from_pem(&cert)
        .unwrap()
        .x509
        .public_key()
        .unwrap();
    assert!(key.public_eq(&expected));
    // Go accepts both ends of the validity period, and not a second beyond.
    for (time, ok) in [
        (1670870898, true),
        (1670871498, true),
        (1670870897, false),
        (1670871499, false),
    ] {
        assert_eq!(
            verify(&fulcio, time, &cert, Some(&chain)).is_ok(),
            ok,
            "at {time}"
        );
    }
    for bad_chain in [&b"not a certificate"[..], b"", &cert] {
        assert!(verify(&fulcio, LOGGED, &cert, Some(bad_chain)).is_err());
    }
    assert!(verify(&fulcio, LOGGED, &cert, None).is_err());
    for bad_leaf in [
        &b"not a certificate"[..],
        b"",
        &[cert.clone(), cert.clone()].concat(),
    ] {
        assert!(verify(&fulcio, LOGGED, bad_leaf, Some(&chain)).is_err());
    }
    // The intermediates as the policy's CAs: no chain needed.
    let intermediates = root(&chain, ISSUER, EMAIL);
    assert!(verify(&intermediates, LOGGED, &cert, None).is_ok());
    // Another CA.
    let other = root(&read("pki_root_crts.pem"), ISSUER, EMAIL);
    assert!(verify(&other, LOGGED, &cert, Some(&chain)).is_err());
    let err = verify(
        &root(&ca, "https://example.com", EMAIL),
        LOGGED,
        &cert,
        Some(&chain),
    );
    let err = format!("{:#}", err.unwrap_err());
    assert!(
        err.contains(r#"OIDC issuer is "https://github.com/login/oauth""#),
        "{err}"
    );
    let err = verify(
        &root(&ca, ISSUER, "other@example.com"),
        LOGGED,
        &cert,
        Some(&chain),
    );
    assert!(format!("{:#}", err.unwrap_err()).contains("other@example.com"));
    assert!(FulcioRoot::new(&ca, "", EMAIL).is_err());
    assert!(FulcioRoot::new(&ca, ISSUER, "").is_err());
    assert!(FulcioRoot::new(b"no certificate", ISSUER, EMAIL).is_err());
}

#[test]
fn the_rekor_time_is_when_the_certificate_must_be_valid() {
    let keys = RekorKeys::parse(&read("rekor.pub")).unwrap();
    let (cert, chain, set) = (read("fulcio-cert"), read("fulcio-chain"), read("rekor-set"));
    let signature = String::from_utf8(read("rekor-sig")).unwrap();
    let fulcio = root(&read("fulcio_v1.crt.pem"), ISSUER, EMAIL);
    let time = verify_set(&keys, &set, &cert, &signature, &read("rekor-payload")).unwrap();
    assert!(verify(&fulcio, time, &cert, Some(&chain)).is_ok());
    assert!(verify_set(
        &keys,
        &set,
        &cert,
        &signature,
        b"this payload does not match"
    )
    .is_err());
    let other = root(
        &read("fulcio_v1.crt.pem"),
        ISSUER,
        "this-does-not-match@example.com",
    );
    assert!(verify(&other, time, &cert, Some(&chain)).is_err());
}

fn issuer_v1(value: &str) -> Extension<'static> {
    ("1.3.6.1.4.1.57264.1.1", false, value.as_bytes().to_vec())
}

fn issuer_v2(der: Vec<u8>) -> Extension<'static> {
    ("1.3.6.1.4.1.57264.1.8", false, der)
}

/// containers/image's generated-certificate cases: the extensions, and the error fragment
/// (`None`: accepted).
#[test]
fn generated_certificates_are_judged_as_in_containers_image() {
    let ca = TestCa::new();
    let fulcio = root(&ca.pem, ISSUER, "test-user@example.com");
    let email = ("2.5.29.17", false, san(&["test-user@example.com"], &[]));
    let utf8 = |s: &str| tlv(0x0c, s.as_bytes());
    // An OtherName (OID, [0] value) only, in a critical SAN.
    let other_name = tlv(
        0xa0,
        &[
            tlv(0x06, &[0x2b, 6, 1, 4, 1, 0x83, 0xbf, 0x30, 1, 7]),
            tlv(0xa0, &utf8("x")),
        ]
        .concat(),
    );
    let cases: Vec<Case> = vec![
        ("valid", vec![issuer_v1(ISSUER), email.clone()], None),
        (
            "OtherName in SAN",
            vec![
                issuer_v1(ISSUER),
                ("2.5.29.17", true, tlv(0x30, &other_name)),
            ],
            Some("e-mail addresses []"),
        ),
        (
            "unhandled critical extension",
            vec![
                issuer_v1(ISSUER),
                email.clone(),
                ("2.99999.99998.99997.99996", true, b"\x05\x00".to_vec()),
            ],
            Some("unhandled critical extension"),
        ),
        (
            "missing issuer",
            vec![email.clone()],
            Some("no OIDC issuer"),
        ),
        (
            "duplicate issuer",
            vec![
                issuer_v1("this does not match"),
                issuer_v1(ISSUER),
                email.clone(),
            ],
            Some("duplicate"),
        ),
        (
            "issuer mismatch",
            vec![issuer_v1("this does not match"), email.clone()],
            Some("OIDC issuer is"),
        ),
        (
            "issuer v2",
            vec![issuer_v2(utf8(ISSUER)), email.clone()],
            None,
        ),
        (
            "issuers v1 and v2",
            vec![issuer_v1(ISSUER), issuer_v2(utf8(ISSUER)), email.clone()],
            None,
        ),
        (
            "inconsistent v1 and v2",
            vec![
                issuer_v1(ISSUER),
                issuer_v2(utf8("this does not match")),
                email.clone(),
            ],
            Some("disagree"),
        ),
        (
            "v2 not a string",
            vec![issuer_v2(tlv(0x02, &[1])), email.clone()],
            Some("not a valid string"),
        ),
        (
            "v2 trailing data",
            vec![
                issuer_v2([utf8("https://"), utf8("example.com")].concat()),
                email.clone(),
            ],
            Some("trailing data"),
        ),
        (
            "missing email",
            vec![issuer_v1(ISSUER)],
            Some("e-mail addresses []"),
        ),
        (
            "several emails, one matches",
            vec![
                issuer_v1(ISSUER),
                (
                    "2.5.29.17",
                    false,
                    san(
                        &["a@example.com", "test-user@example.com", "c@example.com"],
                        &[],
                    ),
                ),
            ],
            None,
        ),
        (
            "email mismatch",
            vec![
                issuer_v1(ISSUER),
                ("2.5.29.17", false, san(&["a@example.com"], &[])),
            ],
            Some("test-user@example.com"),
        ),
        (
            "several emails, none matches",
            vec![
                issuer_v1(ISSUER),
                (
                    "2.5.29.17",
                    false,
                    san(&["a@example.com", "b@example.com"], &[]),
                ),
            ],
            Some("test-user@example.com"),
        ),
        // Go's key-usage rule: an extended key usage without code signing refuses.
        (
            "not for code signing",
            vec![
                issuer_v1(ISSUER),
                email.clone(),
                (
                    "2.5.29.37",
                    false,
                    tlv(0x30, &tlv(0x06, &[0x2b, 6, 1, 5, 5, 7, 3, 1])),
                ),
            ],
            Some("code signing"),
        ),
    ];
    for (name, extensions, expected) in cases {
        let leaf = ca.leaf(&extensions);
        let result = fulcio.verify_at(x509::testing::now(), &leaf, None);
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
