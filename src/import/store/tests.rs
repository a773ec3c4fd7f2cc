use super::*;

#[test]
fn refs_are_escaped_as_ostree_rs_ext_escapes_them() {
    // The examples of ostree-rs-ext's own documentation and tests.
    assert_eq!(
        layer_ref("sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae")
            .unwrap(),
        "ostree/container/blob/sha256_3A_2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
    );
    assert_eq!(
        escape_for_ref("registry:quay.io/coreos/fedora:latest").unwrap(),
        "registry_3A_quay_2E_io/coreos/fedora_3A_latest"
    );
    assert_eq!(
        escape_for_ref("docker://127.0.0.1:5000/a_b@sha256:ab").unwrap(),
        "docker_3A__2F__2F_127_2E_0_2E_0_2E_1_3A_5000/a__b_40_sha256_3A_ab"
    );
    for s in [
        "localhost:5000/foo:latest",
        "/foo/bar/foo.oci-archive",
        "docker://quay.io/exampleos/blah:latest",
        "oci:/tmp/x y/é:tag",
        "a//b/",
    ] {
        assert_eq!(
            unescape_ref(&escape_for_ref(s).unwrap()).as_deref(),
            Some(s)
        );
    }
    assert!(escape_for_ref("").is_err());
    assert!(escape_for_ref("a\0b").is_err());
    assert_eq!(unescape_ref("bad_zz_"), None);
}

#[test]
fn origins_name_their_image_as_ostree_rs_ext_parses_them() {
    let pinned = "quay.io/os/node@sha256:abc";
    for origin in [
        format!("ostree-unverified-registry:{pinned}"),
        format!("ostree-unverified-image:docker://{pinned}"),
        format!("ostree-unverified-image:registry:{pinned}"),
        format!("ostree-image-signed:registry:{pinned}"),
        format!("ostree-remote-registry:fedora:{pinned}"),
        format!("ostree-remote-image:fedora:docker://{pinned}"),
    ] {
        assert_eq!(
            image_of_origin(&origin),
            Some(format!("docker://{pinned}")),
            "{origin}"
        );
    }
    assert_eq!(
        image_of_origin("ostree-unverified-image:oci:/srv/os:2").as_deref(),
        Some("oci:/srv/os:2")
    );
    assert_eq!(image_of_origin("ostree-unverified-image:ftp:x"), None);
    assert_eq!(image_of_origin("pivot://quay.io/x"), None);
    assert_eq!(image_of_origin("ostree-unverified-image:docker:x"), None);
}

#[test]
fn object_set_dirtrees_serialize_as_glib_serializes_them() {
    for count in [0usize, 1, 2, 3, 700, 2000] {
        let mut sums: Vec<[u8; 32]> = (0..count)
            .map(|i| {
                let mut c = [0u8; 32];
                c[..8].copy_from_slice(&(i as u64 * 7919).to_be_bytes());
                c[31] = i as u8;
                c
            })
            .collect();
        sums.sort_unstable();
        let files: Vec<(String, Vec<u8>)> =
            sums.iter().map(|c| (hex::encode(c), c.to_vec())).collect();
        let dirs: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
        let expected = (files, dirs).to_variant();
        // A repeated object is named once.
        let repeated = sums.iter().flat_map(|c| [c, c]);
        assert_eq!(
            object_set_dirtree(repeated),
            expected.data(),
            "{count} files"
        );
    }
}

#[test]
fn the_image_is_dated_by_its_manifest_then_its_config() {
    let manifest =
        r#"{"annotations":{"org.opencontainers.image.created":"2024-01-02T03:04:05Z"}}"#;
    let config = r#"{"created":"2023-01-01T00:00:00Z"}"#;
    assert_eq!(image_created(manifest, config), Some(1_704_164_645));
    assert_eq!(image_created("{}", config), Some(1_672_531_200));
    assert_eq!(image_created("{}", "{}"), None);
    assert_eq!(image_created("{}", r#"{"created":"yesterday"}"#), None);
}
