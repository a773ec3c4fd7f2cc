//! `sigstoreSigned` keys and certificates of the types containers/image loads, and the others:
//! keys and certificates made by the `openssl` command, signatures attached in the registry as
//! cosign attaches them. A key containers/image cannot load or verify with refuses every
//! signature, also beside a good key in `keyPaths`, in one line naming the key's type; a
//! refusal fetches no layer and leaves the sysroot as it was (`assert_refused`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::common::*;
use crate::signatures::{layer_gets, trust_files, with_args};
use pivot_testkit::{
    attach_annotated, attach_cosign_signature, cosign_payload, genpkey_pair, openssl_sign_any,
    run_openssl, PushedImage,
};

const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const EMAIL: &str = "release@example.com";

fn key_paths(keys: &[&Path]) -> String {
    let keys: Vec<String> = keys
        .iter()
        .map(|k| format!("{:?}", k.display().to_string()))
        .collect();
    format!(
        r#"{{"default": [{{"type": "reject"}}],
            "transports": {{"docker": {{"": [{{"type": "sigstoreSigned", "keyPaths": [{}]}}]}}}}}}"#,
        keys.join(", ")
    )
}

fn pki_policy(roots: &Path) -> String {
    format!(
        r#"{{"default": [{{"type": "reject"}}],
            "transports": {{"docker": {{"": [{{"type": "sigstoreSigned",
                "pki": {{"caRootsPath": "{}", "subjectEmail": "{EMAIL}"}}}}]}}}}}}"#,
        roots.display()
    )
}

/// The refusal is one line, the error pivot logs, and it names `what`.
fn refused_in_one_line(env: &Env, args: &[&str], what: &str) {
    assert_refused(env, args, &["sigstoreSigned", what]);
    let err = stderr(&env.pivot(args));
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(what)).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].trim_start().starts_with("ERROR "), "{err}");
    assert!(
        lines[0].contains("is refused by the signature policy"),
        "{err}"
    );
}

fn sign_and_attach(env: &Env, image: &PushedImage, private: &Path) {
    let (repository, digest) = (&image.repository, &image.digest);
    attach_cosign_signature(
        &env.registry,
        repository,
        digest,
        &image.by_tag,
        digest,
        private,
    )
    .unwrap();
}

#[test]
fn keys_containers_image_does_not_load_refuse_every_signature_and_pkcs1_rsa_verifies() {
    let env = Env::new();
    let image = env.push_v2();
    let dir = tempfile::tempdir().unwrap();
    let (good, good_pub) = genpkey_pair(
        dir.path(),
        "good",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    )
    .unwrap();
    let trust = |name: &str, keys: &[&Path]| {
        trust_files(
            &env,
            name,
            &key_paths(keys),
            "use-sigstore-attachments: true",
        )
    };

    // Each type containers/image does not verify with, though the signature by it is valid.
    let mut dsa_pub = PathBuf::new();
    let refused = ["dsa", "rsa-pss", "secp256k1", "brainpool", "explicit"];
    for (name, args, what) in pivot_testkit::SIGSTORE_KEY_TYPES
        .iter()
        .filter(|(name, _, _)| refused.contains(name))
    {
        let what = what.expect("a type containers/image refuses");
        let (private, public) = genpkey_pair(dir.path(), name, args).unwrap();
        sign_and_attach(&env, &image, &private);
        let args = trust(name, &[&public]);
        refused_in_one_line(&env, &with_args(&args, &[&image.by_tag]), what);
        if *name == "dsa" {
            dsa_pub = public;
        }
    }

    // A good key and a valid signature by it: refused while another configured key cannot be
    // loaded (garbage, or a type containers/image does not verify with), as containers/image
    // loads every key before it verifies.
    sign_and_attach(&env, &image, &good);
    let garbage = dir.path().join("garbage.pub");
    std::fs::write(&garbage, "not a key\n").unwrap();
    let args = trust("garbage", &[&good_pub, &garbage]);
    refused_in_one_line(
        &env,
        &with_args(&args, &[&image.by_tag]),
        "not a PEM public key",
    );
    let args = trust("with-dsa", &[&dsa_pub, &good_pub]);
    refused_in_one_line(&env, &with_args(&args, &[&image.by_tag]), "key type DSA");
    assert_eq!(layer_gets(&env, &image), 0, "a refusal fetched a layer");

    // An `RSA PUBLIC KEY` (PKCS #1), as `openssl rsa -RSAPublicKey_out` writes it, verifies.
    let (rsa, _) = genpkey_pair(dir.path(), "rsa", &["-algorithm", "RSA"]).unwrap();
    let pkcs1 = dir.path().join("rsa-pkcs1.pub");
    let rsa_arg = rsa.display().to_string();
    std::fs::write(
        &pkcs1,
        run_openssl(&["rsa", "-in", &rsa_arg, "-RSAPublicKey_out"]).unwrap(),
    )
    .unwrap();
    assert!(std::fs::read_to_string(&pkcs1)
        .unwrap()
        .contains("BEGIN RSA PUBLIC KEY"));
    sign_and_attach(&env, &image, &rsa);
    let args = trust("pkcs1", &[&pkcs1, &good_pub]);
    assert_success(&env.pivot(&with_args(&args, &[&image.by_tag])));
    assert_eq!(env.deployed_images()[0], image.commit);
}

/// A CA (P-256, `openssl req`) and a leaf for [`EMAIL`] with the key `genpkey` makes from
/// `leaf_args` and the extensions lines `extensions` (`openssl x509 -extfile`); (CA PEM path,
/// leaf private key, leaf PEM).
fn pki_chain(dir: &Path, leaf_args: &[&str], extensions: &str) -> (PathBuf, PathBuf, Vec<u8>) {
    let chain = pivot_testkit::OpensslChain {
        ca_key: pivot_testkit::P256,
        ca_extensions: &[],
        leaf_key: leaf_args,
        leaf_extensions: extensions,
        sigopts: &[],
    };
    pivot_testkit::openssl_chain(dir, &chain).unwrap()
}

#[test]
fn pki_certificates_go_does_not_parse_or_verify_with_are_refused() {
    let env = Env::new();
    let image = env.push_v2();
    let san = format!("subjectAltName=email:{EMAIL}\n");
    let ec: &[&str] = &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    let code_signing = "06:08:2b:06:01:05:05:07:03:03";
    let cases = [
        (
            "dsa-leaf",
            &["-algorithm", "DSA"][..],
            san.clone(),
            Some("key type DSA"),
        ),
        (
            "rsa-pss-leaf",
            &["-algorithm", "RSA-PSS"],
            san.clone(),
            Some("key type RSA-PSS"),
        ),
        (
            "eku-not-oids",
            ec,
            format!("{san}2.5.29.37=DER:30:0d:{code_signing}:04:01:78\n"),
            Some("malformed extended key usage"),
        ),
        (
            // 1.3.6.1.4.1.2147483648 among the usages: OpenSSL reads it, Go cannot.
            "eku-arc-of-2^31",
            ec,
            format!(
                "{san}2.5.29.37=DER:30:16:{code_signing}:06:0a:2b:06:01:04:01:88:80:80:80:00\n"
            ),
            Some("malformed extended key usage"),
        ),
        (
            "san-in-a-set",
            ec,
            // A SET holding the e-mail, where Go reads a SEQUENCE.
            format!(
                "2.5.29.17=DER:31:{:02x}:81:{:02x}:{}\n",
                EMAIL.len() + 2,
                EMAIL.len(),
                EMAIL
                    .bytes()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":")
            ),
            Some("malformed subject alternative names"),
        ),
        (
            "valid",
            ec,
            format!("{san}2.5.29.37=DER:30:0a:{code_signing}\n"),
            None,
        ),
    ];
    for (name, leaf_args, extensions, what) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf_key, leaf) = pki_chain(dir.path(), leaf_args, &extensions);
        let payload = cosign_payload(&image.by_tag, &image.digest);
        let signature = openssl_sign_any(&leaf_key, &payload).unwrap();
        let annotations = BTreeMap::from([
            (
                "dev.cosignproject.cosign/signature".to_string(),
                base64::engine::general_purpose::STANDARD.encode(signature),
            ),
            (
                "dev.sigstore.cosign/certificate".to_string(),
                String::from_utf8(leaf).unwrap(),
            ),
        ]);
        attach_annotated(
            &env.registry,
            &image.repository,
            &image.digest,
            &[(PAYLOAD_TYPE.to_string(), payload, annotations)],
        )
        .unwrap();
        let policy = env.dir().join(format!("{name}-roots.pem"));
        std::fs::copy(&ca, &policy).unwrap();
        let args = trust_files(
            &env,
            name,
            &pki_policy(&policy),
            "use-sigstore-attachments: true",
        );
        let args = with_args(&args, &[&image.by_tag]);
        match what {
            Some(what) => refused_in_one_line(&env, &args, what),
            None => {
                assert_eq!(layer_gets(&env, &image), 0, "a refusal fetched a layer");
                assert_success(&env.pivot(&args));
            }
        }
    }
}
