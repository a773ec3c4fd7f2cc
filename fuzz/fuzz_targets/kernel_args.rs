//! The kernel-args file: parsing never panics; re-applying what parses changes no argument; it
//! produces no empty or split argument, and leaves no argument that the last line DELETEs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::sysroot::kargs::{self, Edit};

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
    // Re-applying never piles arguments up or loses any (order may change: `DELETE x` then
    // `ADD x` moves x to the end each time, as written).
    let (mut a, mut b) = (once.clone(), twice);
    a.sort();
    b.sort();
    assert_eq!(a, b, "applying {edits:?} twice changed the arguments");
    for arg in &once {
        assert!(!arg.is_empty() && !arg.contains(char::is_whitespace), "{arg:?}");
    }
    if let Some(Edit::Delete(last)) = edits.last() {
        assert!(!once.contains(last), "{last:?} deleted last but present");
    }
});
