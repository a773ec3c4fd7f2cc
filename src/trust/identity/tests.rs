//! The identity rules against containers/image's own tables of verdicts
//! (`signature/policy_reference_match_test.go`), transcribed as data: pairs of references and
//! whether each rule accepts a signature naming the second for an image pulled as the first.
//! Pivot never pulls a name alone (no tag means `latest`) and judges a pullspec with both a
//! tag and a digest by its digest, so image references of those two shapes are left out.

use super::*;

const RHEL: &str = "registry.access.redhat.com/rhel7/rhel:7.2.3";
const RHEL_UNTAGGED: &str = "registry.access.redhat.com/rhel7/rhel";
const D: &str = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const D2: &str = "@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn cat(a: &str, b: &str) -> String {
    format!("{a}{b}")
}

/// containers/image's `prmExactMatchTestTable` (symmetric).
fn exact_table() -> Vec<(String, String, bool)> {
    let rows: Vec<(String, String, bool)> = vec![
        ("busybox:latest".into(), "busybox:latest".into(), true),
        (RHEL.into(), RHEL.into(), true),
        (cat("busybox", D), cat("busybox", D), true),
        ("library/busybox:latest".into(), "busybox:latest".into(), true),
        ("docker.io/library/busybox:latest".into(), "busybox:latest".into(), true),
        (cat("library/busybox", D), cat("busybox", D), true),
        ("busybox:latest".into(), "busybox:notlatest".into(), false),
        ("busybox:latest".into(), "notbusybox:latest".into(), false),
        ("busybox:latest".into(), "hostname/library/busybox:notlatest".into(), false),
        ("hostname/library/busybox:latest".into(), "busybox:notlatest".into(), false),
        ("busybox:latest".into(), RHEL.into(), false),
        (cat("busybox", D), cat("notbusybox", D), false),
        ("busybox:latest".into(), cat("busybox", D), false),
        (cat("busybox", D), cat("busybox", D2), false),
        ("busybox".into(), "busybox:latest".into(), false),
        ("busybox".into(), cat("busybox", D), false),
        ("busybox".into(), "busybox".into(), false),
        (cat("busybox:latest", D), cat("busybox:latest", D), true),
        (cat("busybox:latest", D), cat("busybox:latest", D2), false),
        (cat("busybox:latest", D), cat("busybox:notlatest", D), false),
        (cat("busybox:latest", D), cat("busybox", D), false),
        (cat("busybox:latest", D), "busybox:latest".into(), false),
        ("UPPERCASE_IS_INVALID_IN_DOCKER_REFERENCES".into(), "busybox:latest".into(), false),
        ("".into(), "UPPERCASE_IS_INVALID_IN_DOCKER_REFERENCES".into(), false),
        ("INVALID".into(), "INVALID".into(), false),
    ];
    rows
}

/// containers/image's `prmRepositoryMatchTestTable` (symmetric).
fn repository_table() -> Vec<(String, String, bool)> {
    vec![
        ("busybox:latest".into(), "busybox:latest".into(), true),
        (RHEL.into(), RHEL.into(), true),
        (cat("busybox", D), cat("busybox", D), true),
        ("library/busybox:latest".into(), "busybox:latest".into(), true),
        ("docker.io/library/busybox:latest".into(), "busybox:latest".into(), true),
        (cat("library/busybox", D), cat("busybox", D), true),
        ("busybox:latest".into(), "busybox:notlatest".into(), true),
        (cat(RHEL, "tagsuffix"), RHEL.into(), true),
        ("library/busybox:latest".into(), "busybox:notlatest".into(), true),
        ("busybox:latest".into(), "library/busybox:notlatest".into(), true),
        ("docker.io/library/busybox:notlatest".into(), "busybox:latest".into(), true),
        ("busybox:notlatest".into(), "docker.io/library/busybox:latest".into(), true),
        ("busybox:latest".into(), cat("busybox", D), true),
        (cat("busybox", D), cat("busybox", D2), true),
        ("busybox".into(), "busybox:notlatest".into(), true),
        (RHEL.into(), RHEL_UNTAGGED.into(), true),
        ("busybox".into(), cat("busybox", D), true),
        ("library/busybox".into(), "busybox".into(), true),
        ("docker.io/library/busybox".into(), "busybox".into(), true),
        ("busybox:latest".into(), "notbusybox:latest".into(), false),
        ("hostname/library/busybox:latest".into(), "busybox:notlatest".into(), false),
        ("busybox:latest".into(), RHEL.into(), false),
        (cat("busybox", D), cat("notbusybox", D), false),
        (cat("busybox:latest", D), cat("busybox:latest", D), true),
        (cat("busybox:latest", D), cat("busybox:latest", D2), true),
        (cat("busybox:latest", D), cat("busybox:notlatest", D), true),
        (cat("busybox:latest", D), cat("busybox", D), true),
        (cat("busybox:latest", D), "busybox:latest".into(), true),
        ("UPPERCASE_IS_INVALID_IN_DOCKER_REFERENCES".into(), "busybox:latest".into(), false),
        ("".into(), "UPPERCASE_IS_INVALID_IN_DOCKER_REFERENCES".into(), false),
        ("INVALID".into(), "INVALID".into(), false),
    ]
}

/// containers/image's `matchRepoDigestOrExactTestTable` (image, signature).
fn repo_digest_or_exact_table() -> Vec<(String, String, bool)> {
    vec![
        ("busybox:latest".into(), "busybox:notlatest".into(), false),
        (cat(RHEL, "tagsuffix"), RHEL.into(), false),
        ("library/busybox:latest".into(), "busybox:notlatest".into(), false),
        ("busybox:latest".into(), "library/busybox:notlatest".into(), false),
        ("docker.io/library/busybox:notlatest".into(), "busybox:latest".into(), false),
        ("busybox:notlatest".into(), "docker.io/library/busybox:latest".into(), false),
        ("busybox".into(), "busybox:latest".into(), false),
        ("busybox:latest".into(), "busybox".into(), false),
        ("busybox".into(), cat("busybox", D), false),
        (cat("busybox", D), "busybox".into(), false),
        (RHEL.into(), RHEL_UNTAGGED.into(), false),
        ("busybox".into(), "busybox".into(), false),
        ("busybox:latest".into(), cat("busybox", D), false),
        (cat("busybox", D), "busybox:latest".into(), true),
        (cat("busybox", D), cat("busybox", D2), true),
        (cat("busybox:latest", D), "busybox:latest".into(), false),
        (cat("busybox:latest", D), "busybox:notlatest".into(), false),
        ("busybox:latest".into(), cat("busybox:latest", D), false),
        (cat("busybox:latest", D), cat("busybox:latest", D2), false),
        (cat("busybox:latest", D), cat("busybox:notlatest", D2), false),
    ]
}

/// The image as pivot would pull it, for the image references pivot can pull.
fn pulled(reference: &str) -> Option<ImageRef> {
    let named = docker_ref::parse_normalized(reference).ok()?;
    if named.is_name_only() || (named.tag.is_some() && named.digest.is_some()) {
        return None;
    }
    Some(ImageRef::parse(&named.to_string()).expect("a normalized reference is a pullspec"))
}

/// Runs `rule` on (image, signature) and returns how many rows were judged.
fn judge(rule: &SignedIdentity, rows: &[(String, String, bool)], symmetric: bool) -> usize {
    let mut judged = 0;
    for (a, b, expected) in rows {
        let mut pairs = vec![(a, b)];
        if symmetric {
            pairs.push((b, a));
        }
        for (image, signed) in pairs {
            let Some(image) = pulled(image) else { continue };
            let got = rule.accepts(&image, signed);
            assert_eq!(got.is_ok(), *expected, "{rule:?}: image {image}, signature {signed}: {got:?}");
            judged += 1;
        }
    }
    judged
}

#[test]
fn match_exact_as_containers_image() {
    assert!(judge(&SignedIdentity::MatchExact {}, &exact_table(), true) > 20);
}

#[test]
fn match_repository_as_containers_image() {
    assert!(judge(&SignedIdentity::MatchRepository {}, &repository_table(), true) > 30);
}

#[test]
fn match_repo_digest_or_exact_as_containers_image() {
    let rule = SignedIdentity::MatchRepoDigestOrExact {};
    let accepted: Vec<_> = exact_table().into_iter().filter(|r| r.2).collect();
    let refused: Vec<_> = repository_table().into_iter().filter(|r| !r.2).collect();
    let n = judge(&rule, &accepted, true)
        + judge(&rule, &refused, true)
        + judge(&rule, &repo_digest_or_exact_table(), false);
    assert!(n > 25, "{n}");
}

#[test]
fn exact_reference_and_repository_as_containers_image() {
    for (a, b, expected) in exact_table() {
        for (wanted, signed) in [(&a, &b), (&b, &a)] {
            let rule = SignedIdentity::ExactReference {
                docker_reference: wanted.clone(),
            };
            let image = ImageRef::parse("quay.io/anything/else:1").unwrap();
            assert_eq!(rule.accepts(&image, signed).is_ok(), expected, "{wanted} {signed}");
        }
    }
    for (a, b, expected) in repository_table() {
        for (wanted, signed) in [(&a, &b), (&b, &a)] {
            let rule = SignedIdentity::ExactRepository {
                docker_repository: wanted.clone(),
            };
            let image = ImageRef::parse("quay.io/anything/else:1").unwrap();
            assert_eq!(rule.accepts(&image, signed).is_ok(), expected, "{wanted} {signed}");
        }
    }
}

/// What cosign writes: a repository without tag or digest. containers/image accepts it only
/// where any tag of the repository is acceptable.
#[test]
fn a_repository_only_signature_passes_only_repository_rules() {
    let by_tag = ImageRef::parse("quay.io/os/node:4.15").unwrap();
    let by_digest = ImageRef::parse(&format!("quay.io/os/node{D}")).unwrap();
    let remap = SignedIdentity::RemapIdentity {
        prefix: "quay.io/os".into(),
        signed_prefix: "quay.io/os".into(),
    };
    let rules = [
        (SignedIdentity::MatchRepoDigestOrExact {}, false),
        (SignedIdentity::MatchExact {}, false),
        (remap, false),
        (SignedIdentity::MatchRepository {}, true),
        (
            SignedIdentity::ExactRepository {
                docker_repository: "quay.io/os/node".into(),
            },
            true,
        ),
    ];
    for (rule, expected) in rules {
        for image in [&by_tag, &by_digest] {
            let got = rule.accepts(image, "quay.io/os/node");
            assert_eq!(got.is_ok(), expected, "{rule:?} {image}: {got:?}");
        }
    }
    let err = SignedIdentity::default()
        .accepts(&by_tag, "quay.io/os/node")
        .unwrap_err();
    assert!(err.contains("the signature is for quay.io/os/node, not quay.io/os/node:4.15"), "{err}");
}

#[test]
fn remap_identity_as_containers_image() {
    // containers/image's TestPRMRemapIdentityRefMatchesPrefix: whether the prefix applies.
    let prefix_cases = [
        ("docker.io/image", "docker.io", true),
        ("docker.io/image", "example.com", false),
        ("example.com:5000/image", "example.com:5000", true),
        ("example.com:50000/image", "example.com:5000", false),
        ("example.com:5000/image", "example.com", false),
        ("example.com/foo", "example.com", true),
        ("example.com/foo/bar", "example.com", true),
        ("example.com/foo/bar:baz", "example.com", true),
        ("docker.io/ns/image", "docker.io/library", false),
        ("docker.io/libraryy/image", "docker.io/library", false),
        ("docker.io/library/busybox", "docker.io/library", true),
        ("example.com/ns/image", "example.com/ns", true),
        ("example.com/ns2/image", "example.com/ns", false),
        ("example.com:5000/ns/image", "example.com/ns", false),
        ("docker.io/library/busybox", "docker.io/library/busybox", true),
        ("docker.io/library/busybox2", "docker.io/library/busybox", false),
        ("example.com/ns/imagee", "example.com/ns/image", false),
        ("example.com/ns/image:tag", "example.com/ns/image", true),
    ];
    for (reference, prefix, applies) in prefix_cases {
        let named = docker_ref::parse_normalized(reference).unwrap();
        let signed = "docker.io/library/signed-prefix";
        let got = remap(&named, prefix, signed).unwrap();
        assert_eq!(got != named, applies, "{reference} {prefix}");
    }
    let rule = |prefix: &str, signed: &str| SignedIdentity::RemapIdentity {
        prefix: prefix.into(),
        signed_prefix: signed.into(),
    };
    let mirrored = ImageRef::parse("mirror.example/ns/image:tag").unwrap();
    let r = rule("mirror.example", "vendor.example");
    assert!(r.accepts(&mirrored, "vendor.example/ns/image:tag").is_ok());
    assert!(r.accepts(&mirrored, "vendor.example/ns/image:other").is_err());
    assert!(r.accepts(&mirrored, "mirror.example/ns/image:tag").is_err());
    let elsewhere = ImageRef::parse("different.com/ns/image:tag").unwrap();
    assert!(r.accepts(&elsewhere, "different.com/ns/image:tag").is_ok());
    // Remapped into something that is not a canonical reference: nothing matches.
    let odd = rule("mirror.example", "docker.io");
    assert!(odd.accepts(&mirrored, "docker.io/ns/image:tag").is_ok());
    let short = ImageRef::parse("mirror.example/image:tag").unwrap();
    assert!(odd.accepts(&short, "docker.io/library/image:tag").is_err());
}

#[test]
fn policies_containers_image_refuses_are_refused() {
    let bad = [
        SignedIdentity::ExactReference {
            docker_reference: "quay.io/os/node".into(),
        },
        SignedIdentity::ExactReference {
            docker_reference: "UPPERCASE".into(),
        },
        SignedIdentity::ExactRepository {
            docker_repository: "quay.io/OS".into(),
        },
        SignedIdentity::RemapIdentity {
            prefix: "quay.io/os:tag".into(),
            signed_prefix: "quay.io/x".into(),
        },
        SignedIdentity::RemapIdentity {
            prefix: "quay.io".into(),
            signed_prefix: "-bad".into(),
        },
    ];
    for rule in bad {
        assert!(rule.check().is_err(), "{rule:?}");
    }
    let good = [
        SignedIdentity::ExactReference {
            docker_reference: "busybox:latest".into(),
        },
        SignedIdentity::ExactRepository {
            docker_repository: "busybox".into(),
        },
        SignedIdentity::RemapIdentity {
            prefix: "docker.io/busybox".into(),
            signed_prefix: "example.com:5000".into(),
        },
    ];
    for rule in good {
        assert!(rule.check().is_ok(), "{rule:?}");
    }
}

#[test]
fn an_oci_layout_has_no_identity_to_match() {
    let layout = ImageRef::parse("oci:/srv/images/os:v2").unwrap();
    let err = SignedIdentity::default()
        .accepts(&layout, "quay.io/os/node:v2")
        .unwrap_err();
    assert!(err.contains("no docker reference"), "{err}");
    let exact = SignedIdentity::ExactReference {
        docker_reference: "quay.io/os/node:v2".into(),
    };
    assert!(exact.accepts(&layout, "quay.io/os/node:v2").is_ok());
}
