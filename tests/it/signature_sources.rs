//! Where signatures are looked for, and which manifest and identity they must name, as
//! containers/image decides: through a registries.conf mirror (the mirror's registries.d
//! settings and attachments, the name pulled as identity), for an index (the platform
//! manifest pulled, as `podman pull` judges it), for cosign's repository-only identities under
//! each `signedIdentity`, and with requirements for other registries' scopes that pivot never
//! needs to read. Real keys (`gpg`, `openssl`), a real registry, signatures by skopeo.

use pivot_testkit::{attach_cosign_signature, ec_key_pair, ImageSpec, Registry};

use crate::common::*;
use crate::signatures::{
    layer_gets, signed_by, trust_args, trust_files, with_args, Cosign, Lookaside, Signer,
};

#[test]
fn through_a_mirror_signatures_come_from_the_mirror_and_name_the_image_pulled() {
    let mut primary = Registry::start().unwrap();
    let mirror = Registry::start().unwrap();
    let mut env = Env::with_registry(Registry::start().unwrap());
    let spec = ImageSpec::new(fixture("os-v2"), "2");
    let on_primary = pivot_testkit::push_oscontainer(&primary, "pivot/os", "v2", &spec).unwrap();
    let on_mirror = pivot_testkit::push_oscontainer(&mirror, "mirrored/os", "v2", &spec).unwrap();
    primary.stop();
    env.set_registries_conf(&format!(
        "[[registry]]\nprefix = \"{p}/pivot\"\nlocation = \"{p}/pivot\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{m}/mirrored\"\ninsecure = true\n",
        p = primary.host(),
        m = mirror.host()
    ));
    let signer = Signer::new("release");
    let key = env.dir().join("release.gpg");
    signer.export(&key, false);
    let store = Lookaside::new();
    // registries.d for the mirror's name, as containers/image reads it for a mirror's pull.
    let dir = env.dir().join("mirror-trust");
    let registries_d = dir.join("registries.d");
    std::fs::create_dir_all(&registries_d).unwrap();
    std::fs::write(dir.join("policy.json"), signed_by(&key)).unwrap();
    std::fs::write(
        registries_d.join("mirror.yaml"),
        format!(
            "docker:\n  {}:\n    lookaside: {}\n",
            mirror.host(),
            store.url()
        ),
    )
    .unwrap();
    let trust = [
        "--policy".to_string(),
        dir.join("policy.json").display().to_string(),
        "--registries.d".to_string(),
        registries_d.display().to_string(),
    ];

    // A signature naming the mirror's own reference is for another image.
    store.put(&on_mirror, &[signer.sign(&on_mirror, &on_mirror.by_tag)]);
    assert_refused(
        &env,
        &with_args(&trust, &[&on_primary.by_tag]),
        &["the signature is for", "mirrored/os:v2"],
    );
    assert_eq!(layer_gets(&env, &on_mirror), 0);
    // One naming the image as pulled, in the mirror's lookaside: accepted.
    store.put(&on_mirror, &[signer.sign(&on_mirror, &on_primary.by_tag)]);
    let out = env.pivot(&with_args(&trust, &[&on_primary.by_tag]));
    assert_success(&out);
    assert!(stderr(&out).contains("from mirror"), "{}", stderr(&out));
    assert_eq!(env.deployed_images()[0], on_mirror.commit);
    assert!(origin_of(&env, &on_mirror.commit).contains("verification=signed"));

    // Configured for the primary's name only: containers/image looks under the mirror's, and
    // finds the built-in default store empty.
    env.undeploy(0);
    let primary_only = trust_args(&env, "primary-only", &signed_by(&key), &store.url());
    let conf = env.dir().join("primary-only/registries.d/pivot.yaml");
    std::fs::write(
        &conf,
        format!(
            "docker:\n  {}:\n    lookaside: {}\n",
            primary.host(),
            store.url()
        ),
    )
    .unwrap();
    assert_refused(
        &env,
        &with_args(&primary_only, &[&on_primary.by_tag]),
        &["no signature of", "file:///var/lib/containers/sigstore"],
    );
}

#[test]
fn an_index_is_judged_by_the_platform_manifest_pulled() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.index = true;
    let image = env.push("v2-index", &spec);
    assert_ne!(image.digest, image.manifest_digest);
    let cosign = Cosign::new(&env, "index");
    let sign = |digest: &str| cosign.attach(&env, &image, digest, digest);

    // Signed at the index only (cosign's default): podman refuses the platform image, so does
    // pivot.
    sign(&image.digest);
    assert_refused(
        &env,
        &with_args(&cosign.trust, &[&image.by_tag]),
        &["no signature of", &image.manifest_digest],
    );
    assert_eq!(layer_gets(&env, &image), 0);
    // The platform manifest signed (`cosign sign --recursive`): accepted.
    sign(&image.manifest_digest);
    assert_success(&env.pivot(&with_args(&cosign.trust, &[&image.by_tag])));
    assert_eq!(env.deployed_images()[0], image.commit);
}

/// cosign names the repository alone. containers/image accepts that only where any tag of the
/// repository would do; pulled by tag or by digest alike.
#[test]
fn a_repository_only_identity_is_accepted_only_by_repository_rules() {
    let env = Env::new();
    let image = env.push_v2();
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = ec_key_pair(keys.path(), "cosign").unwrap();
    let repository = format!("{}/{}", env.registry.host(), image.repository);
    let digest = &image.digest;
    attach_cosign_signature(
        &env.registry,
        &image.repository,
        digest,
        &repository,
        digest,
        &private,
    )
    .unwrap();
    let rules = [
        ("default", String::new(), false),
        (
            "matchRepoDigestOrExact",
            r#", "signedIdentity": {"type": "matchRepoDigestOrExact"}"#.to_string(),
            false,
        ),
        (
            "matchExact",
            r#", "signedIdentity": {"type": "matchExact"}"#.to_string(),
            false,
        ),
        (
            "remapIdentity",
            format!(
                r#", "signedIdentity": {{"type": "remapIdentity", "prefix": "{repository}", "signedPrefix": "{repository}"}}"#
            ),
            false,
        ),
        (
            "matchRepository",
            r#", "signedIdentity": {"type": "matchRepository"}"#.to_string(),
            true,
        ),
        (
            "exactRepository",
            format!(
                r#", "signedIdentity": {{"type": "exactRepository", "dockerRepository": "{repository}"}}"#
            ),
            true,
        ),
    ];
    for (name, identity, accepted) in rules {
        let policy = format!(
            r#"{{"default": [{{"type": "reject"}}],
                "transports": {{"docker": {{"": [{{"type": "sigstoreSigned", "keyPath": "{}"{identity}}}]}}}}}}"#,
            public.display()
        );
        let trust = trust_files(&env, name, &policy, "use-sigstore-attachments: true");
        for pullspec in [&image.by_tag, &image.by_digest] {
            let out = env.pivot(&with_args(&trust, &["--check", pullspec]));
            match accepted {
                true => assert_success(&out),
                false => assert_fails_with(
                    &out,
                    &[
                        "is refused by the signature policy",
                        &format!("the signature is for {repository}, not"),
                    ],
                ),
            }
        }
    }
    assert_eq!(layer_gets(&env, &image), 0, "--check fetches no layer");
}

/// An OpenShift node's policy holds keyless and PKI requirements for the release registries;
/// pulling from a registry its policy accepts reads none of their keys and CAs (which need not
/// exist on this node) and is not held up by them.
#[test]
fn requirements_for_other_registries_do_not_stand_in_the_way() {
    let env = Env::new();
    let image = env.push_v2();
    let policy = format!(
        r#"{{"default": [{{"type": "reject"}}],
            "transports": {{"docker": {{
                "quay.io/openshift-release-dev": [{{"type": "sigstoreSigned",
                    "pki": {{"caRootsPath": "/nonexistent/roots.pem", "subjectEmail": "release@example.com"}},
                    "signedIdentity": {{"type": "matchRepoDigestOrExact"}}}}],
                "registry.redhat.io": [{{"type": "sigstoreSigned",
                    "fulcio": {{"caPath": "/nonexistent/fulcio.pem", "oidcIssuer": "https://oidc.example.com", "subjectEmail": "a@example.com"}},
                    "rekorPublicKeyPath": "/nonexistent/rekor.pub"}}],
                "registry.access.redhat.com": [{{"type": "signedBy", "keyType": "X509Certificates", "keyPath": "/nonexistent"}},
                    {{"type": "signedBaseLayer", "baseLayerIdentity": {{"type": "matchRepository"}}}}],
                "{}": [{{"type": "insecureAcceptAnything"}}]
            }}}}}}"#,
        env.registry.host()
    );
    let store = Lookaside::new();
    let trust = trust_args(&env, "openshift", &policy, &store.url());
    assert_success(&env.pivot(&with_args(&trust, &[&image.by_tag])));
    assert_eq!(env.deployed_images()[0], image.commit);
    assert!(origin_of(&env, &image.commit).contains("verification=accepted"));
}
