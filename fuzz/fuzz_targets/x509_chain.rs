//! Certificates and chains (the `dev.sigstore.cosign/certificate` and `…/chain` annotations):
//! no bytes panic the Fulcio and PKI checks, against a small CA made for this target with
//! `openssl` (EC P-256 root, valid 2026–2056; the seeds hold leaves issued through an
//! intermediate). The first byte picks the check: even, Fulcio at 2030-01-01 for
//! `fuzz@example.com` by `https://issuer.example.com`; odd, PKI now for that e-mail and
//! `host.example.com`. The rest is the certificate, then, after a NUL byte, the chain.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pivot::trust::fulcio::FulcioRoot;
use pivot::trust::pki::PkiRoot;

const ROOT: &str = "-----BEGIN CERTIFICATE-----
MIIBmjCCAUGgAwIBAgIUKkWoyVs1OOyf584ct41o9TuK+/cwCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPcGl2b3QgZnV6eiByb290MCAXDTI2MTIwNjAyMzMxMVoYDzIw
NTYxMTI4MDIzMzExWjAaMRgwFgYDVQQDDA9waXZvdCBmdXp6IHJvb3QwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAASvopY6cup+/6Q9g03cg9ogxPpxfAqTL/lDZFo9
ydhrdgS8oAyNx5k7k2DWmFZkSJRProlTXnYI0Uwccqaz+OWCo2MwYTAdBgNVHQ4E
FgQU+5cWvuDtuJx8yaXgOv1edr9Ud3UwHwYDVR0jBBgwFoAU+5cWvuDtuJx8yaXg
Ov1edr9Ud3UwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAgQwCgYIKoZI
zj0EAwIDRwAwRAIgMeFHg2uyQt6YVvGBFvikdLtCvOpupaCtGqhs4Ds4KwQCIDqX
LUB0n43VccZDRINzhUBsNLYqKlfkjYM2y5M8owLz
-----END CERTIFICATE-----
";
const ISSUER: &str = "https://issuer.example.com";
const EMAIL: &str = "fuzz@example.com";
const HOST: &str = "host.example.com";
/// 2030-01-01T00:00:00Z.
const FULCIO_TIME: i64 = 1893456000;

fn roots() -> &'static (FulcioRoot, PkiRoot) {
    static ROOTS: OnceLock<(FulcioRoot, PkiRoot)> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let fulcio = FulcioRoot::new(ROOT.as_bytes(), ISSUER, EMAIL).unwrap();
        let pki = PkiRoot::new(ROOT.as_bytes(), None, Some(EMAIL), Some(HOST)).unwrap();
        (fulcio, pki)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (cert, chain) = match rest.iter().position(|&b| b == 0) {
        Some(nul) => (&rest[..nul], Some(&rest[nul + 1..])),
        None => (rest, None),
    };
    let (fulcio, pki) = roots();
    let _ = if pick & 1 == 0 {
        fulcio.verify_at(FULCIO_TIME, cert, chain)
    } else {
        pki.verify(cert, chain)
    };
});
