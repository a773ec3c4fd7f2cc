//! containers-policy.json and registries.d: parsing either never panics; a policy that parses
//! gives every image a scope with at least one requirement, and a registries.d configuration
//! that parses gives a lookup without panicking. The first byte picks the parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pivot::fetch::reference::ImageRef;
use pivot::trust::policy::Policy;
use pivot::trust::registries_d::RegistriesD;

const IMAGES: [&str; 4] = [
    "quay.io/openshift/os:4.2",
    "registry.example.com:5000/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "a.b.example.com/os",
    "oci:/srv/images/os:v1",
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let images = IMAGES.map(|i| ImageRef::parse(i).unwrap());
    if pick & 1 == 0 {
        if let Ok(policy) = Policy::parse(input) {
            for image in &images {
                let (scope, requirements) = policy.requirements_for(image);
                assert!(!scope.is_empty() && !requirements.is_empty());
            }
        }
    } else if let Ok(text) = std::str::from_utf8(input) {
        let mut conf = RegistriesD::default();
        if conf.add(text).is_ok() {
            for image in &images[..3] {
                let _ = (conf.lookaside_for(image), conf.use_sigstore_attachments(image));
            }
        }
    }
});
