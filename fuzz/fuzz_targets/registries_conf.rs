//! registries.conf: parsing and resolving an image's sources never panic, and every source is a
//! valid pullspec. The first line of the input is the pullspec, the rest the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::fetch::config::registries::RegistriesConf;
use pivot::fetch::reference::ImageRef;

const IMAGES: [&str; 3] = [
    "quay.io/openshift/os:4.2",
    "registry.example.com:5000/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "localhost/os",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, conf) = text.split_once('\n').unwrap_or(("", text));
    let Ok(conf) = RegistriesConf::parse(conf) else {
        return;
    };
    let own = ImageRef::parse(first).ok();
    for image in IMAGES
        .iter()
        .map(|s| ImageRef::parse(s).unwrap())
        .chain(own)
    {
        if let Ok(sources) = conf.sources(&image) {
            assert!(!sources.is_empty(), "no source for {image}");
            for source in sources {
                let printed = source.image.to_string();
                ImageRef::parse(&printed)
                    .unwrap_or_else(|e| panic!("source {printed:?} of {image} is invalid: {e:#}"));
                assert_eq!(
                    source.image.digest, image.digest,
                    "a source lost the digest"
                );
            }
        }
        let _ = conf.is_insecure(&image);
    }
});
