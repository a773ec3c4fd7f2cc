//! `WWW-Authenticate` of a registry's `/v2/` ping, as oci-client reads it for a token (its Bearer
//! challenge) and as pivot reads it for Basic: any value is a challenge or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((realm, service)) = oci_client::client::parse_bearer_challenge(data) {
        // A realm or service holds no more than the header did.
        assert!(realm.len() <= data.len());
        assert!(service.is_none_or(|s| s.len() <= data.len()));
    }
});
