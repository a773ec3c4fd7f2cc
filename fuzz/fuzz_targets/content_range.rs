//! `Content-Range` of a resumed blob download: any values (one per line) are refused or give a
//! range in order, and checking it against any request never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::fetch::content_range;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let values: Vec<&str> = text.split('\n').collect();
    let Ok(range) = content_range::parse(&values) else {
        return;
    };
    assert_eq!(values.len(), 1);
    assert!(range.first <= range.last);
    assert!(range.length.is_none_or(|n| range.last < n));
    for (offset, size) in [
        (0, 0),
        (range.first, range.last.wrapping_add(1)),
        (range.first, u64::MAX),
        (u64::MAX, u64::MAX),
    ] {
        let fits = content_range::check(range, offset, size).is_ok();
        assert_eq!(
            fits,
            range.first == offset
                && range.last.checked_add(1) == Some(size)
                && range.length.is_none_or(|n| n == size)
        );
    }
});
