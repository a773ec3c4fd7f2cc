//! The keys a `sigstoreSigned` policy names, of every type `openssl` makes: those
//! containers/image verifies with verify, the others are refused when they are loaded, naming
//! their type.

use base64::Engine;
use pivot_testkit::{
    cosign_payload, genpkey_pair, openssl_sign_any, run_openssl, SIGSTORE_KEY_TYPES as KEYS,
};

use super::*;

const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn attached(private: &std::path::Path) -> Attached {
    let payload = cosign_payload("example.com/os/node:4.15", DIGEST);
    let signature = openssl_sign_any(private, &payload).unwrap();
    let encoded = base64::engine::general_purpose::STANDARD.encode(signature);
    Attached {
        payload,
        annotations: BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), encoded)]),
    }
}


#[test]
fn keys_of_the_types_containers_image_verifies_with_verify_and_no_others_load() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args, refused) in KEYS {
        let (private, public) = genpkey_pair(dir.path(), name, args).unwrap();
        let parsed = PublicKeys::parse(&std::fs::read(&public).unwrap());
        match refused {
            None => {
                let keys = parsed.unwrap_or_else(|e| panic!("{name}: {e:#}"));
                let root = Root::Keys(keys, None);
                let verified = root.verify(&attached(&private));
                assert!(verified.is_ok(), "{name}: {verified:?}");
            }
            Some(why) => {
                let err = format!(
                    "{:#}",
                    parsed.err().unwrap_or_else(|| panic!("{name}: loaded"))
                );
                assert!(err.contains(why), "{name}: {err}");
                assert!(err.contains("RSA, ECDSA (P-224"), "{name}: {err}");
                assert!(!err.contains('\n'), "{name}: {err}");
            }
        }
    }
}

#[test]
fn pkcs1_rsa_public_keys_load_as_sigstore_loads_them() {
    let dir = tempfile::tempdir().unwrap();
    let (private, _) = genpkey_pair(dir.path(), "rsa", &["-algorithm", "RSA"]).unwrap();
    let private = private.display().to_string();
    let pkcs1 = run_openssl(&["rsa", "-in", &private, "-RSAPublicKey_out"]).unwrap();
    assert!(pkcs1.starts_with(b"-----BEGIN RSA PUBLIC KEY-----"));
    let keys = PublicKeys::parse(&pkcs1).unwrap();
    assert!(Root::Keys(keys, None)
        .verify(&attached(std::path::Path::new(&private)))
        .is_ok());
    // Junk before the block is skipped (Go's pem.Decode); only the first block counts.
    let junk = [b"junk\n".as_slice(), &pkcs1].concat();
    assert!(PublicKeys::parse(&junk).is_ok());
    let (_, dsa) = genpkey_pair(dir.path(), "dsa", &["-algorithm", "DSA"]).unwrap();
    let dsa = std::fs::read(dsa).unwrap();
    assert!(PublicKeys::parse(&[pkcs1.as_slice(), &dsa].concat()).is_ok());
    assert!(PublicKeys::parse(&[dsa.as_slice(), &pkcs1].concat()).is_err());
    // A SubjectPublicKeyInfo under the PKCS #1 label, and the reverse, are not read.
    let spki = run_openssl(&["rsa", "-in", &private, "-pubout"]).unwrap();
    let swap = |pem: &[u8], from: &str, to: &str| {
        String::from_utf8(pem.to_vec())
            .unwrap()
            .replace(from, to)
            .into_bytes()
    };
    assert!(PublicKeys::parse(&swap(&spki, "PUBLIC KEY", "RSA PUBLIC KEY")).is_err());
    assert!(PublicKeys::parse(&swap(&pkcs1, "RSA PUBLIC KEY", "PUBLIC KEY")).is_err());
    // Other labels, and what is not PEM.
    let err = PublicKeys::parse(&swap(&spki, "PUBLIC KEY", "CERTIFICATE"))
        .err()
        .unwrap();
    assert!(
        format!("{err:#}").contains("\"CERTIFICATE\" PEM block"),
        "{err:#}"
    );
    assert!(PublicKeys::parse(b"garbage").is_err());
    assert!(PublicKeys::parse(b"").is_err());
}

#[test]
fn compressed_ec_points_are_refused_as_go_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let (private, _) = genpkey_pair(
        dir.path(),
        "p256",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    )
    .unwrap();
    let private = private.display().to_string();
    let compressed =
        run_openssl(&["ec", "-in", &private, "-pubout", "-conv_form", "compressed"]).unwrap();
    let err = PublicKeys::parse(&compressed).err().unwrap();
    assert!(format!("{err:#}").contains("compressed point"), "{err:#}");
}
