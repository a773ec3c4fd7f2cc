//! `Retry-After` from a registry or a FleetLock server: any value parses to nothing or to a
//! wait, and neither the retry policy nor the FleetLock wait does arithmetic on it that panics.
#![no_main]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use pivot::fetch::retry::RetryPolicy;
use pivot::fleet::fleet_lock::{self, Answer, MAX_RETRY_AFTER};

fuzz_target!(|data: &[u8]| {
    let fleet = fleet_lock::refused(429, Some(data), b"");
    let Answer::Refused { retry_after, .. } = fleet else {
        panic!("a 429 was taken for a grant");
    };
    assert!(retry_after.is_none_or(|d| d <= MAX_RETRY_AFTER));
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for now in [
        UNIX_EPOCH,
        SystemTime::now(),
        UNIX_EPOCH + Duration::from_secs(253_402_300_799),
    ] {
        let asked = pivot::fetch::retry_after::parse(text, now);
        if text.trim().bytes().all(|b| b.is_ascii_digit()) && !text.trim().is_empty() {
            assert!(asked.is_some(), "{text:?}: delay-seconds not read");
        }
        let policy = RetryPolicy::new(Duration::from_secs(120));
        for attempt in [1, 2, 40, u32::MAX] {
            if let Some(delay) = policy.next_delay(attempt, Instant::now(), asked) {
                assert!(
                    delay < Duration::from_secs(120),
                    "{text:?}: waits {delay:?}"
                );
            }
        }
    }
});
