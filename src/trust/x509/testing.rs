//! For the tests: containers/image's published fixtures (`.ci/signature-fixtures`), and a
//! throwaway CA for the cases containers/image generates certificates for.

use std::collections::BTreeMap;
use std::path::PathBuf;

use openssl::asn1::{Asn1Integer, Asn1Object, Asn1OctetString, Asn1Time};
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::BasicConstraints;
use openssl::x509::{X509Extension, X509Name, X509};

fn dir() -> PathBuf {
    pivot_testkit::containers_image_fixtures()
}

pub fn read(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "containers/image fixture {}: {e}: run .ci/signature-fixtures",
            path.display()
        )
    })
}

/// A signature in containers/image's blob format: its payload and annotations.
pub fn signature(name: &str) -> (Vec<u8>, BTreeMap<String, String>) {
    let blob = read(name);
    let json = blob
        .strip_prefix(b"\x00sigstore-json\n")
        .expect("a sigstore blob");
    let value: serde_json::Value = serde_json::from_slice(json).unwrap();
    let payload = super::go_base64(value["payload"].as_str().unwrap().as_bytes()).unwrap();
    (
        payload,
        serde_json::from_value(value["annotations"].clone()).unwrap(),
    )
}

/// An extension to add: (OID, critical, DER value).
pub type Extension<'a> = (&'a str, bool, Vec<u8>);
/// A containers/image case: its name, the leaf's extensions, the expected error fragment
/// (`None`: accepted).
pub type Case<'a> = (&'a str, Vec<Extension<'a>>, Option<&'a str>);

/// DER: one element.
pub fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
    let len = contents.len();
    let mut out = vec![tag];
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend(contents);
    out
}

/// A subject alternative name value with these e-mails and DNS names.
pub fn san(emails: &[&str], dns_names: &[&str]) -> Vec<u8> {
    let names = emails.iter().map(|e| tlv(0x81, e.as_bytes()));
    let names = names.chain(dns_names.iter().map(|d| tlv(0x82, d.as_bytes())));
    tlv(0x30, &names.collect::<Vec<_>>().concat())
}

pub struct TestCa {
    pub pem: Vec<u8>,
    cert: X509,
    key: PKey<Private>,
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn name(cn: &str) -> X509Name {
    let mut name = X509Name::builder().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
    name.build()
}

fn builder(subject: &X509Name, key: &PKey<Private>, now: i64) -> openssl::x509::X509Builder {
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = Asn1Integer::from_bn(&BigNum::from_u32(rand_serial()).unwrap()).unwrap();
    b.set_serial_number(&serial).unwrap();
    b.set_subject_name(subject).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::from_unix(now - 60).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(now + 3600).unwrap())
        .unwrap();
    b
}

fn rand_serial() -> u32 {
    let mut bytes = [0u8; 4];
    openssl::rand::rand_bytes(&mut bytes).unwrap();
    u32::from_be_bytes(bytes) | 1
}

pub fn now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    since.as_secs() as i64
}

impl TestCa {
    pub fn new() -> TestCa {
        let key = key();
        let subject = name("root CA");
        let mut b = builder(&subject, &key, now());
        b.set_issuer_name(&subject).unwrap();
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        TestCa {
            pem: cert.to_pem().unwrap(),
            cert,
            key,
        }
    }

    /// A leaf, PEM, with these extensions: (OID, critical, DER value).
    pub fn leaf(&self, extensions: &[Extension]) -> Vec<u8> {
        self.leaf_with_key(&key(), extensions)
    }

    /// [`TestCa::leaf`] for the public half of `key`.
    pub fn leaf_with_key(&self, key: &PKey<Private>, extensions: &[Extension]) -> Vec<u8> {
        let mut b = builder(&name("leaf"), key, now());
        b.set_issuer_name(self.cert.subject_name()).unwrap();
        for (oid, critical, value) in extensions {
            let oid = Asn1Object::from_str(oid).unwrap();
            let value = Asn1OctetString::new_from_bytes(value).unwrap();
            b.append_extension(X509Extension::new_from_der(&oid, *critical, &value).unwrap())
                .unwrap();
        }
        b.sign(&self.key, MessageDigest::sha256()).unwrap();
        b.build().to_pem().unwrap()
    }
}
