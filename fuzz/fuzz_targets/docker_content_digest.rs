//! `Docker-Content-Digest` of a blob answer, as oci-client checks it before it verifies the bytes
//! against it: any value is nothing, a digest with a known algorithm, or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(digest)) = oci_client::client::parse_digest_header(data) {
        let (algorithm, _) = digest
            .split_once(':')
            .expect("a digest names its algorithm");
        assert!(
            ["sha256", "sha384", "sha512"].contains(&algorithm),
            "{digest}"
        );
    }
});
