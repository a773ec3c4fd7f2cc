//! `signedIdentity` of containers-policy.json(5): whether the identity a signature claims (its
//! `docker-reference`) is acceptable for the image being pulled. A valid signature for another
//! image is as bad as none: without this check, a signature for `os:4.14` would let a
//! registry serve 4.14 under the tag 4.15.

use serde::Deserialize;

use crate::fetch::reference::{ImageRef, Transport};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum SignedIdentity {
    /// The signature names the image exactly as pulled (name, tag and digest).
    #[serde(rename = "matchExact")]
    MatchExact,
    /// Pulled by digest: the signature names the same repository. Pulled by tag: exactly.
    /// The default.
    #[serde(rename = "matchRepoDigestOrExact")]
    MatchRepoDigestOrExact,
    /// The signature names the same repository, whatever the tag.
    #[serde(rename = "matchRepository")]
    MatchRepository,
    /// The signature names this reference exactly, whatever is pulled.
    #[serde(rename = "exactReference", rename_all = "camelCase")]
    ExactReference { docker_reference: String },
    /// The signature names this repository, whatever is pulled.
    #[serde(rename = "exactRepository", rename_all = "camelCase")]
    ExactRepository { docker_repository: String },
    /// A pulled name under `prefix` is read as if under `signed_prefix` (a mirror of signed
    /// images), then matched as `matchRepoDigestOrExact`.
    #[serde(rename = "remapIdentity", rename_all = "camelCase")]
    RemapIdentity {
        prefix: String,
        signed_prefix: String,
    },
}

impl SignedIdentity {
    /// Whether a signature claiming `signed` is acceptable for `image`; the error says why not.
    pub fn accepts(&self, image: &ImageRef, signed: &str) -> Result<(), String> {
        let claimed = ImageRef::parse(signed)
            .ok()
            .filter(|r| r.transport == Transport::Registry)
            .ok_or_else(|| format!("the signature names {signed:?}, not an image reference"))?;
        let mismatch = |wanted: &str| {
            Err(format!(
                "the signature is for {signed}, not {wanted} ({})",
                self.name()
            ))
        };
        let ok = match self {
            SignedIdentity::MatchExact => same_reference(image, &claimed),
            SignedIdentity::MatchRepoDigestOrExact => repo_digest_or_exact(image, &claimed),
            SignedIdentity::MatchRepository => image.name() == claimed.name(),
            SignedIdentity::ExactReference { docker_reference } => {
                match ImageRef::parse(docker_reference) {
                    Ok(wanted) if same_reference(&wanted, &claimed) => true,
                    _ => return mismatch(docker_reference),
                }
            }
            SignedIdentity::ExactRepository { docker_repository } => {
                if claimed.name() == *docker_repository {
                    true
                } else {
                    return mismatch(docker_repository);
                }
            }
            SignedIdentity::RemapIdentity {
                prefix,
                signed_prefix,
            } => match remap(image, prefix, signed_prefix) {
                Some(remapped) => {
                    if repo_digest_or_exact(&remapped, &claimed) {
                        true
                    } else {
                        return mismatch(&remapped.to_string());
                    }
                }
                None => repo_digest_or_exact(image, &claimed),
            },
        };
        if ok {
            Ok(())
        } else {
            mismatch(&image.to_string())
        }
    }

    fn name(&self) -> &'static str {
        match self {
            SignedIdentity::MatchExact => "matchExact",
            SignedIdentity::MatchRepoDigestOrExact => "matchRepoDigestOrExact",
            SignedIdentity::MatchRepository => "matchRepository",
            SignedIdentity::ExactReference { .. } => "exactReference",
            SignedIdentity::ExactRepository { .. } => "exactRepository",
            SignedIdentity::RemapIdentity { .. } => "remapIdentity",
        }
    }
}

fn same_reference(a: &ImageRef, b: &ImageRef) -> bool {
    a.name() == b.name() && a.tag == b.tag && a.digest == b.digest
}

fn repo_digest_or_exact(image: &ImageRef, claimed: &ImageRef) -> bool {
    match image.digest {
        Some(_) => image.name() == claimed.name(),
        None => {
            image.name() == claimed.name()
                && claimed.digest.is_none()
                && claimed.tag_or_latest() == image.tag_or_latest()
        }
    }
}

/// `image` with its name's `prefix` (whole path components) replaced by `signed_prefix`.
fn remap(image: &ImageRef, prefix: &str, signed_prefix: &str) -> Option<ImageRef> {
    let text = image.to_string();
    let rest = text.strip_prefix(prefix)?;
    let at_boundary = prefix.ends_with('/') || rest.starts_with(['/', ':', '@']) || rest.is_empty();
    let name_len = image.name().len();
    // The prefix must lie within the name, not reach into the tag or digest.
    if !at_boundary || prefix.len() > name_len {
        return None;
    }
    ImageRef::parse(&format!("{signed_prefix}{rest}")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn each_identity_rule_accepts_what_the_man_page_says() {
        use SignedIdentity::*;
        let by_tag = image("quay.io/os/node:4.15");
        let by_digest = image(&format!("quay.io/os/node@{DIGEST}"));
        let mirrored = image("mirror.local:5000/os/node:4.15");
        let mirrored_elsewhere = image("mirror.local:5000/osx/node:4.15");
        let cases: Vec<(SignedIdentity, &ImageRef, &str, bool)> = vec![
            (MatchRepoDigestOrExact, &by_tag, "quay.io/os/node:4.15", true),
            (MatchRepoDigestOrExact, &by_tag, "quay.io/os/node:4.14", false),
            (MatchRepoDigestOrExact, &by_tag, "quay.io/os/other:4.15", false),
            (MatchRepoDigestOrExact, &by_digest, "quay.io/os/node:4.14", true),
            (MatchRepoDigestOrExact, &by_digest, "quay.io/os/other:4.15", false),
            (MatchExact, &by_tag, "quay.io/os/node:4.15", true),
            (MatchExact, &by_digest, "quay.io/os/node:4.15", false),
            (MatchRepository, &by_tag, "quay.io/os/node:4.14", true),
            (MatchRepository, &by_tag, "quay.io/os/nodes:4.15", false),
            (
                ExactReference {
                    docker_reference: "quay.io/signed/node:1".into(),
                },
                &by_tag,
                "quay.io/signed/node:1",
                true,
            ),
            (
                ExactReference {
                    docker_reference: "quay.io/signed/node:1".into(),
                },
                &by_tag,
                "quay.io/os/node:4.15",
                false,
            ),
            (
                ExactRepository {
                    docker_repository: "quay.io/signed/node".into(),
                },
                &by_tag,
                "quay.io/signed/node:9",
                true,
            ),
            (
                RemapIdentity {
                    prefix: "mirror.local:5000/os".into(),
                    signed_prefix: "quay.io/os".into(),
                },
                &mirrored,
                "quay.io/os/node:4.15",
                true,
            ),
            (
                RemapIdentity {
                    prefix: "mirror.local:5000/os".into(),
                    signed_prefix: "quay.io/os".into(),
                },
                &mirrored_elsewhere,
                "quay.io/osx/node:4.15",
                false,
            ),
        ];
        for (rule, pulled, signed, expected) in cases {
            let got = rule.accepts(pulled, signed);
            assert_eq!(got.is_ok(), expected, "{rule:?} {pulled} {signed}: {got:?}");
        }
        let err = MatchRepoDigestOrExact
            .accepts(&by_tag, "quay.io/os/node:4.14")
            .unwrap_err();
        assert!(err.contains("the signature is for quay.io/os/node:4.14, not quay.io/os/node:4.15"), "{err}");
        assert!(MatchExact.accepts(&by_tag, "not a reference").is_err());
    }
}
