//! pivot's verdicts against containers/image's own: its published signature fixtures
//! (`signature/fixtures`, brought by `.ci/signature-fixtures` from Debian's package of
//! containers/image) served by the test registry, judged by the pivot binary, compared with the
//! verdicts containers/image's tests give for the same files (`policy_eval_signedby_test.go`,
//! `policy_eval_sigstore_test.go`, `mechanism_test.go`), case by case.
//!
//! The fixture manifests name blobs containers/image does not publish, so no registry accepts a
//! push of them; they are placed into the registry's storage and served from there
//! ([`pivot_testkit::Registry::store_manifest`]). GPG signatures are read from a lookaside
//! store, cosign signatures from attachments pushed as cosign pushes them. containers/image's
//! tests name the image by fixture identities (`testing/manifest:latest`,
//! `192.168.64.2:5000/…`, never contacted); pivot pulls it from the loopback registry, so the
//! policies match those identities with `exactReference` / `exactRepository`, which for an
//! image of that name are `matchExact` / `matchRepository`. An accepted image goes on to fetch
//! its config, which does not exist: that failure, not a refusal, is the sign of acceptance.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::common::*;

fn fixtures() -> PathBuf {
    pivot_testkit::containers_image_fixtures()
}

/// The verdicts seen.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Verdict {
    Accepted,
    Refused,
}

/// One containers/image case: the fixture image (a `dir-img-*` directory, or a manifest and
/// loose signature files), the requirement, and containers/image's verdict.
struct Case {
    name: &'static str,
    manifest: &'static str,
    /// Files under the fixtures holding the signatures, in order.
    signatures: Vec<&'static str>,
    requirement: String,
    expected: Verdict,
}

fn gpg(key: &str, identity: &str) -> String {
    format!(
        r#"{{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "{}",
            "signedIdentity": {{"type": "exactReference", "dockerReference": "{identity}"}}}}"#,
        fixtures().join(key).display()
    )
}

fn sigstore(trust: &str, identity: &str) -> String {
    format!(r#"{{"type": "sigstoreSigned", {trust}, "signedIdentity": {identity}}}"#)
}

/// `matchRepository` for an image named `name`.
fn repo(name: &str) -> String {
    format!(r#"{{"type": "exactRepository", "dockerRepository": "{name}"}}"#)
}

/// `matchExact` for an image named `name`.
fn exact(name: &str) -> String {
    format!(r#"{{"type": "exactReference", "dockerReference": "{name}"}}"#)
}

fn path(file: &str) -> String {
    fixtures().join(file).display().to_string()
}

fn key(file: &str) -> String {
    format!(r#""keyPath": "{}""#, path(file))
}

fn fulcio(issuer: &str, email: &str, rekor: &str) -> String {
    format!(
        r#""fulcio": {{"caPath": "{}", "oidcIssuer": "{issuer}", "subjectEmail": "{email}"}}, "rekorPublicKeyPath": "{}""#,
        path("fulcio_v1.crt.pem"),
        path(rekor)
    )
}

fn pki(email: &str) -> String {
    format!(
        r#""pki": {{"caRootsPath": "{}", "caIntermediatesPath": "{}", "subjectEmail": "{email}"}}"#,
        path("pki_root_crts.pem"),
        path("pki_intermediate_crts.pem")
    )
}

const SAMPLE: &str = "192.168.64.2:5000/cosign-signed-single-sample";
const KEY_REKOR: &str = "192.168.64.2:5000/cosign-signed/key-1";
const FULCIO_REKOR: &str = "192.168.64.2:5000/cosign-signed/fulcio-rekor-1";
const ISSUER: &str = "https://github.com/login/oauth";

fn cases() -> Vec<Case> {
    use Verdict::*;
    let manifest = "image.manifest.json";
    let valid = "dir-img-valid/manifest.json";
    let cosign = "dir-img-cosign-valid/manifest.json";
    let keyless = "dir-img-cosign-fulcio-rekor-valid/manifest.json";
    let tm = "testing/manifest:latest";
    let case =
        |name, manifest, signatures: Vec<&'static str>, requirement: String, expected| Case {
            name,
            manifest,
            signatures,
            requirement,
            expected,
        };
    vec![
        // GPG simple signing (policy_eval_signedby_test.go, mechanism_test.go).
        case(
            "gpg-valid",
            valid,
            vec!["dir-img-valid/signature-1"],
            gpg("public-key.gpg", tm),
            Accepted,
        ),
        case(
            "gpg-unsigned",
            "dir-img-unsigned/manifest.json",
            vec![],
            gpg("public-key.gpg", tm),
            Refused,
        ),
        case(
            "gpg-other-tag",
            valid,
            vec!["dir-img-valid/signature-1"],
            gpg("public-key.gpg", "testing/manifest:notlatest"),
            Refused,
        ),
        case(
            "gpg-valid-2",
            "dir-img-valid-2/manifest.json",
            vec!["dir-img-valid-2/signature-1", "dir-img-valid-2/signature-2"],
            gpg("public-key.gpg", tm),
            Accepted,
        ),
        case(
            "gpg-valid-2-other-tag",
            "dir-img-valid-2/manifest.json",
            vec!["dir-img-valid-2/signature-1", "dir-img-valid-2/signature-2"],
            gpg("public-key.gpg", "testing/manifest:notlatest"),
            Refused,
        ),
        case(
            "gpg-mixed",
            "dir-img-mixed/manifest.json",
            vec!["dir-img-mixed/signature-1", "dir-img-mixed/signature-2"],
            gpg("public-key.gpg", tm),
            Accepted,
        ),
        case(
            "gpg-subkey",
            "dir-img-valid-subkey/manifest.json",
            vec!["dir-img-valid-subkey/signature-1"],
            gpg("public-key-with-subkey.gpg", tm),
            Accepted,
        ),
        case(
            "gpg-revoked-subkey",
            manifest,
            vec!["subkey-revoked.signature"],
            gpg("public-key-with-revoked-subkey.gpg", tm),
            Refused,
        ),
        case(
            "gpg-subkey-loose",
            manifest,
            vec!["subkey.signature"],
            gpg("public-key-with-subkey.gpg", tm),
            Accepted,
        ),
        case(
            "gpg-modified-manifest",
            "dir-img-modified-manifest/manifest.json",
            vec!["dir-img-modified-manifest/signature-1"],
            gpg("public-key.gpg", tm),
            Refused,
        ),
        case(
            "gpg-digest-error",
            "dir-img-manifest-digest-error/manifest.json",
            vec!["dir-img-manifest-digest-error/signature-1"],
            gpg("public-key.gpg", tm),
            Refused,
        ),
        case(
            "gpg-expired",
            manifest,
            vec!["expired.signature"],
            gpg("public-key.gpg", tm),
            Refused,
        ),
        case(
            "gpg-unknown-key",
            manifest,
            vec!["unknown-key.signature"],
            gpg("public-key.gpg", "testing/manifest"),
            Refused,
        ),
        case(
            "gpg-corrupt",
            manifest,
            vec!["corrupt.signature"],
            gpg("public-key.gpg", "testing/manifest"),
            Refused,
        ),
        case(
            "gpg-invalid-blob",
            manifest,
            vec!["invalid-blob.signature"],
            gpg("public-key.gpg", "testing/manifest"),
            Refused,
        ),
        case(
            "gpg-unsigned-literal",
            manifest,
            vec!["unsigned-literal.signature"],
            gpg("public-key.gpg", "testing/manifest"),
            Refused,
        ),
        case(
            "gpg-unsigned-encrypted",
            manifest,
            vec!["unsigned-encrypted.signature"],
            gpg("public-key.gpg", "testing/manifest"),
            Refused,
        ),
        case(
            "gpg-invalid-reference",
            manifest,
            vec!["invalid-reference.signature"],
            gpg("public-key.gpg", "testing/manifest"),
            Refused,
        ),
        case(
            "gpg-keypaths",
            valid,
            vec!["dir-img-valid/signature-1"],
            format!(
                r#"{{"type": "signedBy", "keyType": "GPGKeys", "keyPaths": ["{}", "{}"],
                "signedIdentity": {{"type": "exactReference", "dockerReference": "{tm}"}}}}"#,
                path("public-key-2.gpg"),
                path("public-key-1.gpg")
            ),
            Accepted,
        ),
        // Cosign with a key (policy_eval_sigstore_test.go).
        case(
            "cosign-valid",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(&key("cosign.pub"), &repo(SAMPLE)),
            Accepted,
        ),
        case(
            "cosign-other-key",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(&key("cosign2.pub"), &repo(SAMPLE)),
            Refused,
        ),
        case(
            "cosign-keypaths",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(
                &format!(
                    r#""keyPaths": ["{}", "{}"]"#,
                    path("cosign2.pub"),
                    path("cosign.pub")
                ),
                &repo(SAMPLE),
            ),
            Accepted,
        ),
        case(
            "cosign-other-repo",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(&key("cosign.pub"), &repo("this/does-not")),
            Refused,
        ),
        case(
            "cosign-valid-2",
            "dir-img-cosign-valid-2/manifest.json",
            vec![
                "dir-img-cosign-valid-2/signature-1",
                "dir-img-cosign-valid-2/signature-2",
            ],
            sigstore(&key("cosign.pub"), &repo(SAMPLE)),
            Accepted,
        ),
        case(
            "cosign-mixed",
            "dir-img-cosign-mixed/manifest.json",
            vec![
                "dir-img-cosign-mixed/signature-1",
                "dir-img-cosign-mixed/signature-2",
            ],
            sigstore(&key("cosign.pub"), &repo(SAMPLE)),
            Accepted,
        ),
        case(
            "cosign-modified-manifest",
            "dir-img-cosign-modified-manifest/manifest.json",
            vec!["dir-img-cosign-modified-manifest/signature-1"],
            sigstore(&key("cosign.pub"), &repo(SAMPLE)),
            Refused,
        ),
        case(
            "cosign-digest-error",
            "dir-img-cosign-manifest-digest-error/manifest.json",
            vec!["dir-img-cosign-manifest-digest-error/signature-1"],
            sigstore(&key("cosign.pub"), &repo(SAMPLE)),
            Refused,
        ),
        case(
            "cosign-other-attachment",
            "dir-img-cosign-other-attachment/manifest.json",
            vec!["dir-img-cosign-other-attachment/signature-1"],
            sigstore(&key("cosign.pub"), &repo(SAMPLE)),
            Refused,
        ),
        case(
            "cosign-unsigned",
            "dir-img-unsigned/manifest.json",
            vec![],
            sigstore(&key("cosign.pub"), &repo("testing/manifest")),
            Refused,
        ),
        case(
            "cosign-gpg-signed",
            valid,
            vec!["dir-img-valid/signature-1"],
            sigstore(&key("cosign.pub"), &repo("testing/manifest")),
            Refused,
        ),
        case(
            "cosign-with-tag",
            "dir-img-cosign-valid-with-tag/manifest.json",
            vec!["dir-img-cosign-valid-with-tag/signature-1"],
            sigstore(
                &key("cosign.pub"),
                &exact("192.168.64.2:5000/skopeo-signed:tag"),
            ),
            Accepted,
        ),
        case(
            "cosign-with-other-tag",
            "dir-img-cosign-valid-with-tag/manifest.json",
            vec!["dir-img-cosign-valid-with-tag/signature-1"],
            sigstore(
                &key("cosign.pub"),
                &exact("192.168.64.2:5000/skopeo-signed:othertag"),
            ),
            Refused,
        ),
        // A repository-only identity (what cosign writes) under matchExact: refused.
        case(
            "cosign-repository-only-exact",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(&key("cosign.pub"), &exact(&format!("{SAMPLE}:latest"))),
            Refused,
        ),
        // Key + Rekor.
        case(
            "key-rekor",
            "dir-img-cosign-key-rekor-valid/manifest.json",
            vec!["dir-img-cosign-key-rekor-valid/signature-1"],
            sigstore(
                &format!(
                    r#"{}, "rekorPublicKeyPath": "{}""#,
                    key("cosign2.pub"),
                    path("rekor.pub")
                ),
                &repo(KEY_REKOR),
            ),
            Accepted,
        ),
        case(
            "key-rekor-keypaths",
            "dir-img-cosign-key-rekor-valid/manifest.json",
            vec!["dir-img-cosign-key-rekor-valid/signature-1"],
            sigstore(
                &format!(
                    r#""keyPaths": ["{}", "{}"], "rekorPublicKeyPath": "{}""#,
                    path("cosign.pub"),
                    path("cosign2.pub"),
                    path("rekor.pub")
                ),
                &repo(KEY_REKOR),
            ),
            Accepted,
        ),
        case(
            "key-rekor-wrong-rekor-key",
            "dir-img-cosign-key-rekor-valid/manifest.json",
            vec!["dir-img-cosign-key-rekor-valid/signature-1"],
            sigstore(
                &format!(
                    r#"{}, "rekorPublicKeyPath": "{}""#,
                    key("cosign2.pub"),
                    path("cosign.pub")
                ),
                &repo(KEY_REKOR),
            ),
            Refused,
        ),
        case(
            "key-rekor-without-bundle",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(
                &format!(
                    r#"{}, "rekorPublicKeyPath": "{}""#,
                    key("cosign.pub"),
                    path("rekor.pub")
                ),
                &repo(SAMPLE),
            ),
            Refused,
        ),
        // Fulcio + Rekor.
        case(
            "fulcio-rekor",
            keyless,
            vec!["dir-img-cosign-fulcio-rekor-valid/signature-1"],
            sigstore(
                &fulcio(ISSUER, "mitr@redhat.com", "rekor.pub"),
                &repo(FULCIO_REKOR),
            ),
            Accepted,
        ),
        case(
            "fulcio-other-email",
            keyless,
            vec!["dir-img-cosign-fulcio-rekor-valid/signature-1"],
            sigstore(
                &fulcio(ISSUER, "this-does-not-match@example.com", "rekor.pub"),
                &repo(FULCIO_REKOR),
            ),
            Refused,
        ),
        case(
            "fulcio-other-issuer",
            keyless,
            vec!["dir-img-cosign-fulcio-rekor-valid/signature-1"],
            sigstore(
                &fulcio(
                    "https://github.com/login/oauth2",
                    "mitr@redhat.com",
                    "rekor.pub",
                ),
                &repo(FULCIO_REKOR),
            ),
            Refused,
        ),
        case(
            "fulcio-wrong-rekor-key",
            keyless,
            vec!["dir-img-cosign-fulcio-rekor-valid/signature-1"],
            sigstore(
                &fulcio(ISSUER, "mitr@redhat.com", "cosign.pub"),
                &repo(FULCIO_REKOR),
            ),
            Refused,
        ),
        case(
            "fulcio-key-signed",
            cosign,
            vec!["dir-img-cosign-valid/signature-1"],
            sigstore(
                &fulcio(ISSUER, "mitr@redhat.com", "rekor.pub"),
                &repo(SAMPLE),
            ),
            Refused,
        ),
        // PKI.
        case(
            "pki",
            "dir-img-cosign-pki-valid/manifest.json",
            vec!["dir-img-cosign-pki-valid/signature-1"],
            sigstore(&pki("qiwan@redhat.com"), &repo("localhost:5000/test")),
            Accepted,
        ),
        case(
            "pki-other-email",
            "dir-img-cosign-pki-valid/manifest.json",
            vec!["dir-img-cosign-pki-valid/signature-1"],
            sigstore(
                &pki("this-does-not-match@example.com"),
                &repo("localhost:5000/test"),
            ),
            Refused,
        ),
    ]
}

/// Lays out `case` in the registry and the lookaside under `cimage/<name>`; returns the
/// pullspec, the policy file and how many signatures were attached in the registry.
fn serve(env: &Env, store: &Path, case: &Case) -> (String, PathBuf, usize) {
    let repository = format!("cimage/{}", case.name);
    let manifest = std::fs::read(fixtures().join(case.manifest)).unwrap();
    let digest = env
        .registry
        .store_manifest(&repository, "latest", &manifest)
        .unwrap();
    let mut attached = Vec::new();
    let dir = store.join(format!(
        "{repository}@sha256={}",
        &digest["sha256:".len()..]
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut n = 0;
    for file in &case.signatures {
        let blob = std::fs::read(fixtures().join(file)).unwrap();
        match blob.strip_prefix(b"\x00sigstore-json\n") {
            Some(json) => {
                let v: serde_json::Value = serde_json::from_slice(json).unwrap();
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(v["payload"].as_str().unwrap())
                    .unwrap();
                let annotations: BTreeMap<String, String> =
                    serde_json::from_value(v["annotations"].clone()).unwrap();
                let media_type = v["mimeType"].as_str().unwrap().to_string();
                attached.push((media_type, payload, annotations));
            }
            None => {
                n += 1;
                std::fs::write(dir.join(format!("signature-{n}")), blob).unwrap();
            }
        }
    }
    if !attached.is_empty() {
        pivot_testkit::attach_annotated(&env.registry, &repository, &digest, &attached).unwrap();
    }
    let policy = env.dir().join(format!("{}.json", case.name));
    std::fs::write(
        &policy,
        format!(
            r#"{{"default": [{{"type": "reject"}}],
                "transports": {{"docker": {{"{}/{repository}": [{}]}}}}}}"#,
            env.registry.host(),
            case.requirement
        ),
    )
    .unwrap();
    let pullspec = format!("{}/{repository}:latest", env.registry.host());
    (pullspec, policy, attached.len())
}

#[test]
fn containers_images_signature_fixtures_get_containers_images_verdicts() {
    let env = Env::new();
    let store = tempfile::tempdir().unwrap();
    let registries_d = env.dir().join("registries.d");
    std::fs::create_dir_all(&registries_d).unwrap();
    std::fs::write(
        registries_d.join("fixtures.yaml"),
        format!(
            "docker:\n  {}:\n    lookaside: file://{}\n    use-sigstore-attachments: true\n",
            env.registry.host(),
            store.path().display()
        ),
    )
    .unwrap();
    let mut wrong = Vec::new();
    for case in cases() {
        let (pullspec, policy, attached) = serve(&env, store.path(), &case);
        let before = env.registry.count_requests("GET", "/blobs/");
        let out = env.pivot(&[
            "--policy",
            policy.to_str().unwrap(),
            "--registries.d",
            registries_d.to_str().unwrap(),
            &pullspec,
        ]);
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "{}: the fixture image has no blobs: {err}",
            case.name
        );
        // Past the policy, the config is fetched (and found missing); a refusal stops before,
        // by the policy or earlier (containers/image's schema 1 fixtures are refused as such).
        let verdict = match err.contains("fetching the image config") {
            true => Verdict::Accepted,
            false => Verdict::Refused,
        };
        if verdict == Verdict::Refused {
            // Only the attached signatures' payloads; no config, no layer.
            let blob_gets = env.registry.count_requests("GET", "/blobs/") - before;
            assert!(
                blob_gets <= attached,
                "{}: a refusal fetched {blob_gets} blobs",
                case.name
            );
        }
        if verdict != case.expected {
            wrong.push(format!(
                "{}: containers/image says {:?}, pivot {verdict:?}: {err}",
                case.name, case.expected
            ));
        }
    }
    assert!(wrong.is_empty(), "verdicts differ:\n{}", wrong.join("\n"));
}
