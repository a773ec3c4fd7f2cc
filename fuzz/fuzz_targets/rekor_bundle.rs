//! Rekor bundles (the `dev.sigstore.cosign/bundle` annotation): no bytes panic the check, made
//! with containers/image's published inputs (Rekor key, Fulcio certificate, signature,
//! payload). The first byte picks what the rest is. Even: the bundle itself; only Rekor's own
//! SET can verify, so one that does carries the published integrated time. Odd: the signed
//! entry, which a key made for this run signs into a bundle (verified with that key), so that
//! the entry and its body are reached whenever the input is canonical JSON.
#![no_main]

use std::sync::OnceLock;

use base64::Engine;
use libfuzzer_sys::fuzz_target;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::sign::Signer;
use pivot::trust::rekor::{verify_set, RekorKeys};

/// containers/image's `signature/internal/testdata/rekor.pub`.
const REKOR_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE2G2Y+2tabdTV5BcGiBIx0a9fAFwr
kBbmLSGtks4L3qX6yYY0zufBnhC8Ur/iy55GhWP/9A/bY2LhC30M9+RYtw==
-----END PUBLIC KEY-----
";
/// Its `rekor-cert` (the Fulcio certificate the published SET logs).
const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----
MIICnTCCAiOgAwIBAgIUG45uaC2z8VvuOwzzm79RPfckoxwwCgYIKoZIzj0EAwMw
NzEVMBMGA1UEChMMc2lnc3RvcmUuZGV2MR4wHAYDVQQDExVzaWdzdG9yZS1pbnRl
cm1lZGlhdGUwHhcNMjIxMjEyMTg0ODE4WhcNMjIxMjEyMTg1ODE4WjAAMFkwEwYH
KoZIzj0CAQYIKoZIzj0DAQcDQgAEJBurkhSRmHukHVh3VA8nYuSWqZ4ltafDwyWl
c3c9NaLovmu+NC4NiUtMLifL/P3nqedbnctKBuYmfISGiZlVyKOCAUIwggE+MA4G
A1UdDwEB/wQEAwIHgDATBgNVHSUEDDAKBggrBgEFBQcDAzAdBgNVHQ4EFgQUAmvG
4K6lNk/sk/f4aiahjYRqR+cwHwYDVR0jBBgwFoAU39Ppz1YkEZb5qNjpKFWixi4Y
ZD8wHQYDVR0RAQH/BBMwEYEPbWl0ckByZWRoYXQuY29tMCwGCisGAQQBg78wAQEE
Hmh0dHBzOi8vZ2l0aHViLmNvbS9sb2dpbi9vYXV0aDCBiQYKKwYBBAHWeQIEAgR7
BHkAdwB1AN09MGrGxxEyYxkeHJlnNwKiSl643jyt/4eKcoAvKe6OAAABhQeqlwUA
AAQDAEYwRAIgVi2SvN5ReGYiOShY8LFSRG5D6oATKqHb6kN/DJh2rAUCIANS6Aqp
xaXiHwTHUr3xPSGa5i6hywmbbRC6N0kIeDM6MAoGCCqGSM49BAMDA2gAMGUCMCLu
cZtESIN0lm64Co/bZ68CCRkWlktX4mmJiRhKi9c9QD62C5SuZhc0vvo6MOKmTQIx
AIo/MozZeoU7rdNj0pZKuBeCmMqmJaDSsw19tKi/b1pEmuw+Sf2BI25GgIbKztG1
9w==
-----END CERTIFICATE-----
";
/// Its `rekor-sig` and `rekor-payload`.
const SIGNATURE: &str = "MEQCIEJc96e041VAhKA03SvfCYbWodIMIQPyAtWyDP4FnPqpAiAaIS60EjhRDhSanoFsoIy8fKqqKeW5ps/tLXSGpayi2g==";
const PAYLOAD: &str = r#"{"critical":{"identity":{"docker-reference":"192.168.64.2:5000/test-repo-2100826901021538654/alpine"},"image":{"docker-manifest-digest":"sha256:fa93b01658e3a5a1686dc3ae55f170d8de487006fb53a28efcd12ab0710a2e5f"},"type":"cosign container image signature"},"optional":null}"#;
/// The published SET's integrated time.
const INTEGRATED_TIME: i64 = 1670870899;

struct Keys {
    rekor: RekorKeys,
    signer: PKey<Private>,
    signer_public: RekorKeys,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let signer = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        let signer_public = RekorKeys::parse(&signer.public_key_to_pem().unwrap()).unwrap();
        let rekor = RekorKeys::parse(REKOR_KEY.as_bytes()).unwrap();
        Keys {
            rekor,
            signer,
            signer_public,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let keys = keys();
    let check = |rekor: &RekorKeys, bundle: &[u8]| {
        verify_set(
            rekor,
            bundle,
            CERTIFICATE.as_bytes(),
            SIGNATURE,
            PAYLOAD.as_bytes(),
        )
    };
    if pick & 1 == 0 {
        if let Ok(time) = check(&keys.rekor, rest) {
            assert_eq!(time, INTEGRATED_TIME);
        }
    } else {
        let mut signer = Signer::new(MessageDigest::sha256(), &keys.signer).unwrap();
        let set = signer.sign_oneshot_to_vec(rest).unwrap();
        let set = base64::engine::general_purpose::STANDARD.encode(set);
        let head = format!(r#"{{"SignedEntryTimestamp":"{set}","Payload":"#);
        let bundle = [head.as_bytes(), rest, b"}"].concat();
        let _ = check(&keys.signer_public, &bundle);
    }
});
