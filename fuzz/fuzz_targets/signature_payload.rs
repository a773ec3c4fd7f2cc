//! Signature payloads (simple signing and cosign): parsing never panics, and a payload that
//! parses is of its type and names the digest and reference it contains.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::trust::simple_signing::{parse_payload, COSIGN_TYPE, SIMPLE_SIGNING_TYPE};

fuzz_target!(|data: &[u8]| {
    for kind in [SIMPLE_SIGNING_TYPE, COSIGN_TYPE] {
        if let Ok(payload) = parse_payload(data, kind) {
            let value: serde_json::Value = serde_json::from_slice(data).unwrap();
            let critical = &value["critical"];
            assert_eq!(critical["type"], kind);
            assert_eq!(critical["image"]["docker-manifest-digest"], payload.manifest_digest.as_str());
            assert_eq!(critical["identity"]["docker-reference"], payload.reference.as_str());
        }
    }
});
