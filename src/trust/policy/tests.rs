use super::*;

fn image(s: &str) -> ImageRef {
    ImageRef::parse(s).unwrap()
}

fn scope_of(policy: &str, reference: &str) -> String {
    let policy = Policy::parse(policy.as_bytes()).unwrap();
    policy.requirements_for(&image(reference)).0
}

const POLICY: &str = r#"{
    "default": [{"type": "reject"}],
    "transports": {
        "docker": {
            "": [{"type": "insecureAcceptAnything"}],
            "quay.io/os/node:4.15": [{"type": "reject"}],
            "quay.io/os/node": [{"type": "reject"}],
            "quay.io/os": [{"type": "reject"}],
            "quay.io": [{"type": "reject"}],
            "*.example.com": [{"type": "reject"}],
            "*.com": [{"type": "reject"}],
            "reg.example.com:5000/ns": [{"type": "reject"}],
            "docker.io/library/busybox": [{"type": "reject"}]
        },
        "oci": {"/srv/images": [{"type": "reject"}]}
    }
}"#;

#[test]
fn the_most_specific_scope_wins() {
    let cases = [
        ("quay.io/os/node:4.15", "docker scope \"quay.io/os/node:4.15\""),
        ("quay.io/os/node:4.16", "docker scope \"quay.io/os/node\""),
        ("quay.io/os/other", "docker scope \"quay.io/os\""),
        ("quay.io/else/x", "docker scope \"quay.io\""),
        ("a.b.example.com/x", "docker scope \"*.example.com\""),
        ("reg.example.com:5000/ns/os", "docker scope \"reg.example.com:5000/ns\""),
        ("reg.example.com:5000/other/os", "docker scope \"*.example.com\""),
        ("mirror.org/x", "docker default scope \"\""),
        // Scopes are matched on the normalized name, as containers/image does.
        ("docker.io/busybox:1", "docker scope \"docker.io/library/busybox\""),
        ("index.docker.io/library/busybox", "docker scope \"docker.io/library/busybox\""),
        ("oci:/srv/images/os:v2", "oci scope \"/srv/images\""),
        ("oci-archive:/srv/images/os.tar", "\"default\""),
    ];
    for (reference, scope) in cases {
        assert_eq!(scope_of(POLICY, reference), scope, "{reference}");
    }
    assert_eq!(
        scope_of(r#"{"default": [{"type": "insecureAcceptAnything"}]}"#, "quay.io/x"),
        "\"default\""
    );
}

#[test]
fn the_root_is_never_a_layout_scope() {
    // containers/image refuses "/" as a scope; an image at /os must fall to "" then default.
    let policy = r#"{"default": [{"type": "reject"}],
        "transports": {"oci": {"": [{"type": "insecureAcceptAnything"}]}}}"#;
    assert_eq!(scope_of(policy, "oci:/os"), "oci default scope \"\"");
    let refused = r#"{"default": [{"type": "reject"}],
        "transports": {"oci": {"/": [{"type": "insecureAcceptAnything"}]}}}"#;
    let err = format!("{:#}", Policy::parse(refused.as_bytes()).unwrap_err());
    assert!(err.contains("default scope"), "{err}");
}

#[test]
fn every_requirement_containers_image_parses_is_parsed() {
    let k = "a2V5"; // base64 of "key"
    let policy = format!(
        r#"{{"default": [{{"type": "reject"}}], "transports": {{"docker": {{
        "a.example/gpg": [{{"type": "signedBy", "keyType": "GPGKeys", "keyPaths": ["/k1", "/k2"]}}],
        "a.example/gpg2": [{{"type": "signedBy", "keyType": "signedByGPGKeys", "keyData": "{k}"}}],
        "a.example/x509": [{{"type": "signedBy", "keyType": "X509Certificates", "keyPath": "/c"}}],
        "a.example/x509ca": [{{"type": "signedBy", "keyType": "signedByX509CAs", "keyPath": "/c"}}],
        "a.example/base": [{{"type": "signedBaseLayer", "baseLayerIdentity": {{"type": "exactRepository", "dockerRepository": "quay.io/base"}}}}],
        "a.example/keys": [{{"type": "sigstoreSigned", "keyDatas": ["{k}", "{k}"], "rekorPublicKeyPaths": ["/r1", "/r2"]}}],
        "a.example/keyrekor": [{{"type": "sigstoreSigned", "keyPath": "/k", "rekorPublicKeyData": "{k}"}}],
        "a.example/fulcio": [{{"type": "sigstoreSigned",
            "fulcio": {{"caPath": "/ca", "oidcIssuer": "https://oidc", "subjectEmail": "a@b"}},
            "rekorPublicKeyPath": "/r", "signedIdentity": {{"type": "matchRepository"}}}}],
        "a.example/pki": [{{"type": "sigstoreSigned",
            "pki": {{"caRootsData": "{k}", "caIntermediatesPath": "/i", "subjectHostname": "h.example"}},
            "signedIdentity": {{"type": "remapIdentity", "prefix": "a.example", "signedPrefix": "b.example"}}}}]
    }}}}}}"#
    );
    let parsed = Policy::parse(policy.as_bytes()).unwrap();
    let (_, reqs) = parsed.requirements_for(&image("a.example/pki:1"));
    assert_eq!(reqs[0].kind(), "sigstoreSigned");
    let (_, reqs) = parsed.requirements_for(&image("a.example/base:1"));
    assert_eq!(reqs[0].kind(), "signedBaseLayer");
}

#[test]
fn a_policy_containers_image_refuses_is_refused_whole() {
    let refused = [
        (r#"{"default": []}"#, "lists no requirement"),
        (r#"{"default": [{"type": "signedByX"}]}"#, "unknown variant"),
        (r#"{"default": [{"type": "reject", "extra": 1}]}"#, "unknown field"),
        (
            r#"{"default": [{"type": "reject"}], "default": [{"type": "reject"}]}"#,
            "duplicate field",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker": {"a": [{"type": "reject"}], "a": [{"type": "reject"}]}}}"#,
            "duplicate key",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker": {}, "docker": {}}}"#,
            "duplicate key",
        ),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k", "keyPath": "/j"}]}"#,
            "duplicate field",
        ),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "PGP", "keyPath": "/k"}]}"#,
            "unknown variant",
        ),
        (r#"{"default": [{"type": "signedBy", "keyPath": "/k"}]}"#, "keyType"),
        (r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}"#, "exactly one of"),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": ""}]}"#,
            "exactly one of",
        ),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyData": "!!"}]}"#,
            "not base64",
        ),
        // Present counts, whatever the value: containers/image's gotKeyPath.
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "", "keyData": "AA=="}]}"#,
            "exactly one of",
        ),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": null, "keyData": "AA=="}]}"#,
            "exactly one of",
        ),
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": null}]}"#,
            "exactly one of",
        ),
        // A null identity is a match of no known type there.
        (
            r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k", "signedIdentity": null}]}"#,
            "signedIdentity",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/k", "signedIdentity": null}]}"#,
            "signedIdentity",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/c", "oidcIssuer": "i", "subjectEmail": "e"}, "keyPath": "/k", "rekorPublicKeyPath": "/r"}]}"#,
            "exactly one of",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/c", "oidcIssuer": "i", "subjectEmail": "e"}}]}"#,
            "needs a Rekor public key",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "fulcio": {"caPath": "/c", "oidcIssuer": "i"}, "rekorPublicKeyPath": "/r"}]}"#,
            "subjectEmail",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "pki": {"caRootsPath": "/c", "subjectEmail": "e"}, "rekorPublicKeyPath": "/r"}]}"#,
            "takes no Rekor",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "pki": {"caRootsPath": "/c"}}]}"#,
            "subjectEmail or subjectHostname",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/k", "rekorPublicKeyPath": "/r", "rekorPublicKeyData": "a2V5"}]}"#,
            "at most one of",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "keyDatas": []}]}"#,
            "keyDatas lists nothing",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/k", "signedIdentity": {"type": "exactReference", "dockerReference": "quay.io/os"}}]}"#,
            "neither a tag nor a digest",
        ),
        (
            r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/k", "signedIdentity": {"type": "matchExact", "x": 1}}]}"#,
            "unknown field",
        ),
        (
            r#"{"default": [{"type": "signedBaseLayer"}]}"#,
            "baseLayerIdentity",
        ),
        (r#"{"default": [{"type": "reject"}], "transports": {"docker": {"x": []}}}"#, "lists no requirement"),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"oci": {"relative/path": [{"type": "reject"}]}}}"#,
            "not an absolute path",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"oci": {"/srv//images/": [{"type": "reject"}]}}}"#,
            "canonical form",
        ),
        (
            r#"{"default": [{"type": "reject"}], "transports": {"docker-archive": {"/x": [{"type": "reject"}]}}}"#,
            "no scopes",
        ),
    ];
    for (text, expected) in refused {
        let err = format!("{:#}", Policy::parse(text.as_bytes()).unwrap_err());
        assert!(err.contains(expected), "{text}: {err}");
    }
}

/// containers/image's own example policy (its `signature/fixtures/policy.json`) parses, as it
/// does there; and containers/image's own valid-policy test data is refused nowhere.
#[test]
fn containers_images_own_policy_fixture_parses() {
    let path = crate::trust::fixtures_dir().join("policy.json");
    let policy = Policy::load(&path).unwrap();
    let (scope, reqs) = policy.requirements_for(&image("example.com/hardened/x:1"));
    assert_eq!(scope, "docker scope \"example.com/hardened\"");
    assert_eq!(
        reqs.iter().map(Requirement::kind).collect::<Vec<_>>(),
        ["signedBy", "signedBy", "signedBaseLayer"]
    );
}
