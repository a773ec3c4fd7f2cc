//! The kernel-args file: parsing never panics; what parses applies idempotently, produces no
//! empty or split argument, and leaves no argument that the last line DELETEs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::kargs::{self, Edit};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(edits) = kargs::parse(text) else {
        return;
    };
    let current = "root=UUID=1 quiet console=ttyS0,115200n8 ostree=/ostree/boot.1/os/x/0";
    let once = kargs::apply(current, &edits);
    let twice = kargs::apply(&once.join(" "), &edits);
    assert_eq!(once, twice, "applying {edits:?} twice changed the result");
    for arg in &once {
        assert!(!arg.is_empty() && !arg.contains(char::is_whitespace), "{arg:?}");
    }
    if let Some(Edit::Delete(last)) = edits.last() {
        assert!(!once.contains(last), "{last:?} deleted last but present");
    }
});
