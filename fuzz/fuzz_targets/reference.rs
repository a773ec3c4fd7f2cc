//! Pullspecs: parsing never panics, and what parses prints back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::fetch::reference::ImageRef;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(image) = ImageRef::parse(text) else {
        return;
    };
    let printed = image.to_string();
    let again = ImageRef::parse(&printed).unwrap_or_else(|e| {
        panic!("{text:?} parsed, but its printed form {printed:?} does not: {e:#}")
    });
    assert_eq!(
        again, image,
        "{text:?} does not survive printing as {printed:?}"
    );
    ImageRef::parse(&image.pinned_or_tagged()).expect("pinned_or_tagged() parses");
});
