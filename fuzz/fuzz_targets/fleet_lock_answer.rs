//! A FleetLock server's (or a gateway's) refusal: any status, `Retry-After` and body is a
//! refusal whose texts are one short line each and whose wait is bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::fleet::fleet_lock::{refused, Answer, MAX_RETRY_AFTER};

fuzz_target!(|data: &[u8]| {
    let Some((&[hi, lo, split], rest)) = data.split_first_chunk::<3>() else {
        return;
    };
    let status = 300 + u16::from_be_bytes([hi, lo]) % 700;
    let (header, body) = rest.split_at(usize::from(split).min(rest.len()));
    let header = (split != 0xff).then_some(header);
    let Answer::Refused {
        kind,
        why,
        retry_after,
        ..
    } = refused(status, header, body)
    else {
        panic!("a refusal was taken for a grant");
    };
    for text in kind.iter().chain([&why]) {
        assert!(
            text.chars().count() <= 200 && !text.chars().any(char::is_control),
            "{text:?}"
        );
    }
    assert!(retry_after.is_none_or(|d| d <= MAX_RETRY_AFTER));
});
