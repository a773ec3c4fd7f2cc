//! A token service's answer (JSON, the token possibly a JWT with an `exp` claim): any body is a
//! token or an error, and the token is never cached for longer than a day, whatever it claims.
#![no_main]

use std::time::{SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((_token, until)) = oci_client::token_cache::parse_token_response(body) else {
        return;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        until.is_none_or(|t| t <= now + 24 * 3600 + 5),
        "{body:?}: cached until {until:?}"
    );
});
