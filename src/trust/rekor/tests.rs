//! containers/image's Rekor SET cases (`signature/internal/rekor_set_test.go`, and the
//! key+Rekor and Fulcio+Rekor signatures of `policy_eval_sigstore_test.go`), with its verdicts.

use super::*;
use crate::trust::x509::testing::{read, signature};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use openssl::ec::{EcGroup, EcKey};
use openssl::nid::Nid;
use openssl::pkey::Private;
use serde_json::{json, Value as Json};

const LOGGED: i64 = 1670870899;

fn rekor() -> RekorKeys {
    RekorKeys::parse(&read("rekor.pub")).unwrap()
}

fn test_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn public(key: &PKey<Private>) -> RekorKeys {
    RekorKeys::parse(&key.public_key_to_pem().unwrap()).unwrap()
}

/// A bundle whose `Payload` is `payload` (JSON text), its SET made by `key`.
fn bundle(key: &PKey<Private>, payload: &str) -> Vec<u8> {
    let mut signer = openssl::sign::Signer::new(MessageDigest::sha256(), key).unwrap();
    let set = STANDARD.encode(signer.sign_oneshot_to_vec(payload.as_bytes()).unwrap());
    format!(r#"{{"SignedEntryTimestamp":"{set}","Payload":{payload}}}"#).into_bytes()
}

/// The fixture's inputs: the certificate, the signature and the payload.
fn inputs() -> (Vec<u8>, String, Vec<u8>) {
    (
        read("fulcio-cert"),
        String::from_utf8(read("rekor-sig")).unwrap(),
        read("rekor-payload"),
    )
}

fn verify(keys: &RekorKeys, bundle: &[u8]) -> Result<i64> {
    let (cert, sig, payload) = inputs();
    verify_set(keys, bundle, &cert, &sig, &payload)
}

#[test]
fn the_published_set_verifies_as_in_containers_image() {
    let set = read("rekor-set");
    let mut other = public(&test_key());
    assert_eq!(verify(&rekor(), &set).unwrap(), LOGGED);
    other.extend(rekor());
    assert_eq!(verify(&other, &set).unwrap(), LOGGED);
    let mut keys = rekor();
    keys.extend(public(&test_key()));
    assert_eq!(verify(&keys, &set).unwrap(), LOGGED);
    // Another Rekor key (the policy's cosign.pub, or a fresh one).
    let err = verify(&RekorKeys::parse(&read("cosign.pub")).unwrap(), &set).unwrap_err();
    assert!(
        format!("{err:#}").contains("does not verify with a trusted Rekor key"),
        "{err:#}"
    );
    assert!(verify(&public(&test_key()), &set).is_err());
    for bad in [&b""[..], b"invalid signature", b"null", b"[]"] {
        assert!(verify(&rekor(), bad).is_err());
    }
    // Tampered: the SET, the signed entry, the signature, the payload, the certificate.
    let text = String::from_utf8(set.clone()).unwrap();
    for tampered in [
        text.replacen("MEYCIQDd", "MEYCIQDe", 1),
        text.replace("1670870899", "1670870900"),
    ] {
        assert!(verify(&rekor(), tampered.as_bytes()).is_err());
    }
    let (cert, sig, payload) = inputs();
    let truncated = sig.trim_end().strip_suffix("==").unwrap();
    assert!(verify_set(&rekor(), &set, &cert, truncated, &payload).is_err());
    let other_sig = STANDARD.encode(b"does not match");
    assert!(verify_set(&rekor(), &set, &cert, &other_sig, &payload).is_err());
    assert!(verify_set(&rekor(), &set, &cert, &sig, b"this payload does not match").is_err());
    for bad_cert in [
        &b""[..],
        b"this is not PEM",
        &[cert.clone(), cert.clone()].concat(),
    ] {
        assert!(verify_set(&rekor(), &set, bad_cert, &sig, &payload).is_err());
    }
}

#[test]
fn the_published_signatures_are_logged() {
    let (payload, annotations) = signature("dir-img-cosign-fulcio-rekor-valid/signature-1");
    let get = |k: &str| annotations.get(k).unwrap().as_bytes();
    let sig = annotations["dev.cosignproject.cosign/signature"].as_str();
    let set = get("dev.sigstore.cosign/bundle");
    let cert = get("dev.sigstore.cosign/certificate");
    assert!(verify_set(&rekor(), set, cert, sig, &payload).is_ok());
    // Key and Rekor: the logged key is cosign2.pub, re-marshalled as containers/image does.
    let (payload, annotations) = signature("dir-img-cosign-key-rekor-valid/signature-1");
    let sig = annotations["dev.cosignproject.cosign/signature"].as_str();
    let set = annotations["dev.sigstore.cosign/bundle"].as_bytes();
    let pem = |name| {
        PKey::public_key_from_pem(&read(name))
            .unwrap()
            .public_key_to_pem()
            .unwrap()
    };
    assert!(verify_set(&rekor(), set, &pem("cosign2.pub"), sig, &payload).is_ok());
    assert!(verify_set(&rekor(), set, &pem("cosign.pub"), sig, &payload).is_err());
    // That SET on another signature (dir-img-cosign-valid's, by cosign.pub).
    let (payload, annotations) = signature("dir-img-cosign-valid/signature-1");
    let other = annotations["dev.cosignproject.cosign/signature"].as_str();
    assert!(verify_set(&rekor(), set, &pem("cosign2.pub"), other, &payload).is_err());
}

#[test]
fn rekor_keys_must_be_ecdsa() {
    assert!(RekorKeys::parse(&read("cosign.pub")).is_ok());
    let rsa = RekorKeys::parse(&read("some-rsa-key.pub")).err().unwrap();
    assert!(format!("{rsa:#}").contains("not an ECDSA"), "{rsa:#}");
    assert!(RekorKeys::parse(b"not PEM").is_err());
    assert!(RekorKeys::parse(&read("fulcio-cert")).is_err());
    let ed25519 = PKey::generate_ed25519()
        .unwrap()
        .public_key_to_pem()
        .unwrap();
    assert!(RekorKeys::parse(&ed25519).is_err());
    let k1 = EcGroup::from_curve_name(Nid::SECP256K1).unwrap();
    let k1 = PKey::from_ec_key(EcKey::generate(&k1).unwrap()).unwrap();
    assert!(RekorKeys::parse(&k1.public_key_to_pem().unwrap()).is_err());
}

/// The valid hashedrekord of the fixture's signature, and the payload wrapping it.
fn hashedrekord() -> Json {
    let (cert, sig, payload) = inputs();
    json!({"apiVersion": "0.0.1", "kind": "hashedrekord", "spec": {
        "data": {"hash": {"algorithm": "sha256", "value": hex::encode(Sha256::digest(&payload))}},
        "signature": {"content": sig.trim(), "publicKey": {"content": STANDARD.encode(&cert)}}}})
}

fn entry(body: &[u8]) -> String {
    let entry = json!({"body": STANDARD.encode(body), "integratedTime": 1, "logIndex": 2, "logID": "logID"});
    entry.to_string()
}

fn at<'v>(v: &'v mut Json, path: &str) -> &'v mut serde_json::Map<String, Json> {
    v.pointer_mut(path).unwrap().as_object_mut().unwrap()
}

/// containers/image's table of signed entries that must be refused, and the leniencies of
/// Go's decoding that must be kept.
#[test]
fn signed_entries_are_judged_as_in_containers_image() {
    let key = test_key();
    let keys = public(&key);
    let check = |body: &[u8]| verify(&keys, &bundle(&key, &entry(body)));
    assert_eq!(check(hashedrekord().to_string().as_bytes()).unwrap(), 1);

    let (cert, _, payload) = inputs();
    let other_pem = test_key().public_key_to_pem().unwrap();
    type Edit = Box<dyn Fn(&mut Json)>;
    let set = |path: &'static str, field: &'static str, value: Json| -> Edit {
        Box::new(move |v| drop(at(v, path).insert(field.into(), value.clone())))
    };
    let delete = |path: &'static str, field: &'static str| -> Edit {
        Box::new(move |v| drop(at(v, path).remove(field)))
    };
    let (sig, key_path, hash) = (
        "/spec/signature",
        "/spec/signature/publicKey",
        "/spec/data/hash",
    );
    let refused: Vec<Edit> = vec![
        delete("", "apiVersion"),
        delete("", "kind"),
        delete("", "spec"),
        set("", "apiVersion", Json::Null),
        set("", "apiVersion", json!(1)),
        set("", "apiVersion", json!({})),
        set("", "apiVersion", json!("99.0.99")),
        set("", "kind", Json::Null),
        set("", "kind", json!(1)),
        set("", "kind", json!("notHashedRekord")),
        set("", "spec", Json::Null),
        set("", "spec", json!(1)),
        delete("/spec", "data"),
        delete("/spec", "signature"),
        set("/spec", "data", Json::Null),
        set("/spec", "data", json!(1)),
        delete("/spec/data", "hash"),
        set("/spec/data", "hash", Json::Null),
        set("/spec/data", "hash", json!(1)),
        delete(hash, "algorithm"),
        delete(hash, "value"),
        set(hash, "algorithm", Json::Null),
        set(hash, "algorithm", json!(1)),
        set(hash, "value", Json::Null),
        set(hash, "value", json!(1)),
        set(hash, "value", json!("a".repeat(63))),
        set(hash, "value", json!("a".repeat(64))),
        Box::new(move |v| {
            at(v, hash).insert("algorithm".into(), json!("sha512"));
            let digest = openssl::sha::sha512(&payload);
            at(v, hash).insert("value".into(), json!(hex::encode(digest)));
        }),
        set("/spec", "signature", Json::Null),
        set("/spec", "signature", json!(1)),
        delete(sig, "content"),
        delete(sig, "publicKey"),
        set(sig, "content", Json::Null),
        set(sig, "content", json!(1)),
        set(sig, "content", json!("")),
        set(sig, "content", json!("+")),
        set(sig, "content", json!(STANDARD.encode("does not match"))),
        set(sig, "publicKey", Json::Null),
        set(sig, "publicKey", json!(1)),
        delete(key_path, "content"),
        set(key_path, "content", Json::Null),
        set(key_path, "content", json!(1)),
        set(key_path, "content", json!("")),
        set(key_path, "content", json!("+")),
        set(key_path, "content", json!(STANDARD.encode("not PEM"))),
        set(
            key_path,
            "content",
            json!(STANDARD.encode([cert.clone(), cert.clone()].concat())),
        ),
        set(key_path, "content", json!(STANDARD.encode(&other_pem))),
    ];
    for (i, edit) in refused.iter().enumerate() {
        let mut body = hashedrekord();
        edit(&mut body);
        assert!(
            check(body.to_string().as_bytes()).is_err(),
            "edit {i}: {body}"
        );
    }
    // Go's encoding/json: unknown keys ignored, names case-insensitive, the last duplicate
    // wins, bytes as an array.
    let body = hashedrekord().to_string();
    let lenient = [
        body.replacen('{', r#"{"unexpected":1,"#, 1),
        body.replace("\"apiVersion\"", "\"APIVERSION\"")
            .replace("\"kind\"", "\"Kind\""),
        body.replacen('{', r#"{"apiVersion":"9.9.9","#, 1),
    ];
    for body in lenient {
        assert_eq!(check(body.as_bytes()).unwrap(), 1, "{body}");
    }
    let mut bytes_array = hashedrekord();
    let content = bytes_array
        .pointer("/spec/signature/content")
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    let content = go_base64(content.as_bytes()).unwrap();
    at(&mut bytes_array, sig).insert("content".into(), json!(content));
    assert_eq!(check(bytes_array.to_string().as_bytes()).unwrap(), 1);
    // The same duplicate is refused in the strict envelope, and in the canonical form.
    let payload = entry(hashedrekord().to_string().as_bytes());
    let duplicated = payload.replacen('{', r#"{"logID":"x","#, 1);
    assert!(verify(&keys, &bundle(&key, &duplicated)).is_err());
    assert!(verify(
        &keys,
        &bundle(
            &key,
            r#"{"logIndex":1, "integratedTime":2,"body":"abc","logID":"def","body":"ABC"}"#
        )
    )
    .is_err());
}

#[test]
fn the_envelopes_are_read_strictly() {
    let key = test_key();
    let keys = public(&key);
    let payload: Json =
        serde_json::from_str(&entry(hashedrekord().to_string().as_bytes())).unwrap();
    let signed = |p: &Json| bundle(&key, &p.to_string());
    assert_eq!(verify(&keys, &signed(&payload)).unwrap(), 1);
    let edits: [(&str, Option<Json>); 9] = [
        ("body", None),
        ("integratedTime", None),
        ("logIndex", None),
        ("logID", None),
        ("unexpected", Some(json!(1))),
        ("body", Some(json!(1))),
        ("integratedTime", Some(json!("hello"))),
        ("logIndex", Some(json!("hello"))),
        ("logID", Some(json!(1))),
    ];
    for (field, value) in edits {
        let mut p = payload.clone();
        let map = p.as_object_mut().unwrap();
        match value {
            Some(value) => drop(map.insert(field.into(), value)),
            None => drop(map.remove(field)),
        }
        assert!(verify(&keys, &signed(&p)).is_err(), "{p}");
    }
    let good = String::from_utf8(signed(&payload)).unwrap();
    for bad in [
        good.replace("SignedEntryTimestamp", "SignedEntryTimeStamp"),
        good.replacen('{', r#"{"unexpected":1,"#, 1),
        good.replacen('{', r#"{"Payload":{},"#, 1),
        format!(r#"{{"SignedEntryTimestamp":"{}"}}"#, STANDARD.encode("x")),
    ] {
        assert!(verify(&keys, bad.as_bytes()).is_err(), "{bad}");
    }
}
