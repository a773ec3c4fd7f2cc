//! `signedIdentity` of containers-policy.json(5): whether the identity a signature claims (its
//! `docker-reference`) is acceptable for the image being pulled. A valid signature for another
//! image is as bad as none: without this check, a signature for `os:4.14` would let a
//! registry serve 4.14 under the tag 4.15.
//!
//! The rules are containers/image's (`signature/policy_reference_match.go`), on references
//! normalized as it normalizes them ([`super::docker_ref`]). Two of them matter most:
//! a signature that names a repository alone (`host/repo`, what cosign writes) is accepted
//! only by `matchRepository` and `exactRepository`; and an image pulled by tag needs a
//! signature naming that tag (`matchRepoDigestOrExact`, the default), by digest one naming the
//! repository with any tag or digest. Policies are checked when read: an `exactReference`
//! without tag or digest, an unparsable `exactRepository`, or a `remapIdentity` prefix that is
//! not a host or a host-rooted name make the whole policy invalid, as there.

use serde::Deserialize;

use super::docker_ref::{self, Named};
use crate::fetch::reference::{ImageRef, Transport};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum SignedIdentity {
    /// The signature names the image exactly as pulled (name, tag and digest).
    #[serde(rename = "matchExact")]
    MatchExact {},
    /// Pulled by digest: the signature names the same repository (with a tag or digest).
    /// Pulled by tag: exactly. The default.
    #[serde(rename = "matchRepoDigestOrExact")]
    MatchRepoDigestOrExact {},
    /// The signature names the same repository, whatever the tag (or none).
    #[serde(rename = "matchRepository")]
    MatchRepository {},
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

impl Default for SignedIdentity {
    fn default() -> Self {
        SignedIdentity::MatchRepoDigestOrExact {}
    }
}

/// The docker reference policies match against for `image`, as containers/image forms it for
/// a pull: the tag (`latest` when none is given), or the digest alone (pivot pulls by digest
/// when a pullspec names both). None for OCI layouts, which have no docker identity.
pub fn image_reference(image: &ImageRef) -> Option<Named> {
    if image.transport != Transport::Registry {
        return None;
    }
    let tag = match &image.digest {
        Some(_) => None,
        None => Some(image.tag_or_latest()),
    };
    docker_ref::from_parts(
        &image.registry,
        &image.repository,
        tag,
        image.digest.as_deref(),
    )
    .ok()
}

impl SignedIdentity {
    /// What containers/image refuses when it reads the policy.
    pub fn check(&self) -> Result<(), String> {
        match self {
            SignedIdentity::ExactReference { docker_reference } => {
                let named = docker_ref::parse_normalized(docker_reference)
                    .map_err(|why| format!("exactReference dockerReference: {why}"))?;
                if named.is_name_only() {
                    return Err(format!(
                        "exactReference dockerReference {docker_reference:?} has neither a tag nor a digest"
                    ));
                }
            }
            SignedIdentity::ExactRepository { docker_repository } => {
                docker_ref::parse_normalized(docker_repository)
                    .map_err(|why| format!("exactRepository dockerRepository: {why}"))?;
            }
            SignedIdentity::RemapIdentity {
                prefix,
                signed_prefix,
            } => {
                for p in [prefix, signed_prefix] {
                    if !valid_prefix(p) {
                        return Err(format!("remapIdentity prefix {p:?} is not a registry host or a name under one"));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether a signature claiming `signed` is acceptable for `image`; the error says why not.
    pub fn accepts(&self, image: &ImageRef, signed: &str) -> Result<(), String> {
        let refused = |wanted: &str| {
            Err(format!(
                "the signature is for {signed}, not {wanted} ({})",
                self.name()
            ))
        };
        let claimed = match docker_ref::parse_normalized(signed) {
            Ok(claimed) => claimed,
            Err(why) => return Err(format!("the signature names {signed:?}: {why}")),
        };
        let intended = match self {
            SignedIdentity::ExactReference { .. } | SignedIdentity::ExactRepository { .. } => None,
            _ => match image_reference(image) {
                Some(intended) => Some(intended),
                None => {
                    return Err(format!(
                        "{image} has no docker reference to match the signature's identity against ({})",
                        self.name()
                    ))
                }
            },
        };
        let ok = match (self, intended) {
            (SignedIdentity::MatchExact {}, Some(intended)) => exact(&intended, &claimed),
            (SignedIdentity::MatchRepoDigestOrExact {}, Some(intended)) => {
                repo_digest_or_exact(&intended, &claimed)
            }
            (SignedIdentity::MatchRepository {}, Some(intended)) => {
                intended.name() == claimed.name()
            }
            (SignedIdentity::ExactReference { docker_reference }, _) => {
                match docker_ref::parse_normalized(docker_reference) {
                    Ok(wanted) if exact(&wanted, &claimed) => true,
                    _ => return refused(docker_reference),
                }
            }
            (SignedIdentity::ExactRepository { docker_repository }, _) => {
                match docker_ref::parse_normalized(docker_repository) {
                    Ok(wanted) if wanted.name() == claimed.name() => true,
                    _ => return refused(docker_repository),
                }
            }
            (
                SignedIdentity::RemapIdentity {
                    prefix,
                    signed_prefix,
                },
                Some(intended),
            ) => match remap(&intended, prefix, signed_prefix) {
                Some(remapped) if repo_digest_or_exact(&remapped, &claimed) => true,
                Some(remapped) => return refused(&remapped.to_string()),
                None => false,
            },
            (_, None) => false,
        };
        match ok {
            true => Ok(()),
            false => refused(
                &image_reference(image).map_or_else(|| image.to_string(), |r| r.to_string()),
            ),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            SignedIdentity::MatchExact {} => "matchExact",
            SignedIdentity::MatchRepoDigestOrExact {} => "matchRepoDigestOrExact",
            SignedIdentity::MatchRepository {} => "matchRepository",
            SignedIdentity::ExactReference { .. } => "exactReference",
            SignedIdentity::ExactRepository { .. } => "exactRepository",
            SignedIdentity::RemapIdentity { .. } => "remapIdentity",
        }
    }
}

/// Both name a tag or digest, and the same ones.
fn exact(a: &Named, b: &Named) -> bool {
    !a.is_name_only() && !b.is_name_only() && a == b
}

fn repo_digest_or_exact(intended: &Named, claimed: &Named) -> bool {
    if claimed.is_name_only() {
        return false;
    }
    match (&intended.tag, &intended.digest) {
        (Some(_), _) => intended == claimed,
        (None, Some(_)) => intended.name() == claimed.name(),
        (None, None) => false,
    }
}

/// A host (`example.com:5000`) or a name rooted at one (`example.com/ns`), by the grammar
/// alone: the prefix is compared with names as they are spelled, not normalized.
fn valid_prefix(p: &str) -> bool {
    match p.split_once('/') {
        None => docker_ref::is_domain(p),
        Some((domain, path)) => {
            docker_ref::is_domain(domain) && path.split('/').all(docker_ref::is_path_component)
        }
    }
}

/// `intended` with its name's `prefix` (the whole name, or whole leading components) replaced
/// by `signed_prefix`; `intended` itself when the prefix does not apply; None when the result
/// is not a canonical reference.
fn remap(intended: &Named, prefix: &str, signed_prefix: &str) -> Option<Named> {
    let name = intended.name();
    let applies = name == prefix
        || (name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'/'));
    if !applies {
        return Some(intended.clone());
    }
    let text = intended.to_string();
    let remapped = format!("{signed_prefix}{}", &text[prefix.len()..]);
    docker_ref::parse_canonical(&remapped).ok()
}

#[cfg(test)]
mod tests;
