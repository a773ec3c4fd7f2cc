//! Trust: whether the image a pullspec resolved to may be pulled at all, decided by the policy
//! admins already write for the containers tools, before any layer is downloaded, with the
//! verdicts containers/image gives (its published fixtures are the tests' judge).
//!
//! - [`policy`]: containers-policy.json(5), the requirements per transport and scope;
//! - [`docker_ref`], [`identity`]: references normalized as there, and whether the identity a
//!   signature claims fits the image pulled;
//! - [`registries_d`]: containers-registries.d(5), where an image's signatures are kept;
//! - [`lookaside`]: fetching them; [`simple_signing`]: GPG "simple signing" signatures;
//! - [`sigstore`]: cosign signatures attached in the registry, by key, keyless
//!   ([`fulcio`] + [`rekor`]) or by the admin's CA ([`pki`]);
//! - [`evaluate`]: judging the signatures against a scope's requirements;
//! - [`evidence`]: the signatures a `--download-only` download keeps for its deployment;
//! - [`ostree_remote`]: OSTree commit signatures by an OSTree remote's keys (`--ostree-remote`),
//!   checked on the commit once it is imported, before it is committed or deployed.
//!
//! The decision is made on the manifest pivot pulls: for an index, the platform's manifest
//! (its digest and its signatures), as `podman pull` judges the instance it copies; a
//! signature of the index alone does not admit it there either. Every byte pulled afterwards
//! is checked against that digest. Through a registries.conf mirror, the signatures are looked
//! up where containers/image looks: registries.d and attachments of the mirror's reference,
//! while identities are matched against the name pulled. No policy file (truly absent, not a
//! dangling link or an unreadable file): pivot pulls as before, and says so once in the log.

pub mod docker_ref;
pub mod evaluate;
pub mod evidence;
pub mod fulcio;
pub mod identity;
pub mod lookaside;
pub mod ostree_remote;
pub mod pki;
pub mod policy;
pub mod registries_d;
pub mod rekor;
pub mod sigstore;
pub mod simple_signing;
pub mod strict_json;
pub mod x509;

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use crate::api::status::Verification;
use crate::fetch::reference::{ImageRef, Transport};
use crate::fetch::registry::Registry;
use crate::fetch::retry::RetryPolicy;
use evidence::{Blob, Evidence};
use policy::{Policy, Requirement};
use registries_d::RegistriesD;

/// More signatures than any image has: a lookaside store that never says "missing", or an
/// attachment with more layers, is refused.
const MAX_SIGNATURES: usize = 64;

/// The policy and signature stores pivot checks images against.
#[derive(Debug, Clone)]
pub struct Trust {
    policy: Option<(PathBuf, Policy)>,
    registries_d: RegistriesD,
}

/// How an image passed the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// There is no policy file: nothing was checked.
    NoPolicy,
    /// The policy accepts the image without a signature.
    Accepted,
    /// Signatures by these keys (fingerprints) were verified, one per signature requirement.
    Signed(Vec<String>),
}

impl Verified {
    /// What origins record and `pivot status` shows of it.
    pub fn verification(&self) -> Verification {
        match self {
            Verified::NoPolicy => Verification::NoPolicy,
            Verified::Accepted => Verification::Accepted,
            Verified::Signed(_) => Verification::Signed,
        }
    }
}

/// What to fetch: only what the scope's requirements read, or everything registries.d points
/// at (for a download, whose deployment may be judged under another policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    Needed,
    All,
}

impl Trust {
    /// Reads the policy (`--policy`, else the containers tools' default) and registries.d.
    /// Only a default path that does not exist at all means "no policy": a dangling symlink,
    /// an unreadable file or a broken one is an error, never a policy silently dropped. With
    /// `require_policy` (pivot.toml's `signatures.require_policy`), no policy is an error too.
    pub fn load(
        policy: Option<&Path>,
        registries_d: Option<&Path>,
        require_policy: bool,
    ) -> Result<Trust> {
        let default = Path::new(policy::DEFAULT_PATH);
        Trust::load_with(policy.ok_or(default), registries_d, require_policy)
    }

    /// [`Trust::load`], the policy given (`Ok`) or at a default path (`Err`).
    fn load_with(
        policy: Result<&Path, &Path>,
        registries_d: Option<&Path>,
        require_policy: bool,
    ) -> Result<Trust> {
        let policy = match policy {
            Ok(path) => Some((path.to_path_buf(), Policy::load(path)?)),
            Err(path) => {
                let found = default_policy(path)?;
                if found.is_none() {
                    ensure!(
                        !require_policy,
                        "there is no {}, and signatures.require_policy (pivot.toml) requires one: install the policy images must satisfy, or name one with --policy",
                        path.display()
                    );
                    tracing::info!("no {}: image signatures are not checked", path.display());
                }
                found.map(|p| (path.to_path_buf(), p))
            }
        };
        let dir = registries_d.unwrap_or(Path::new(registries_d::DEFAULT_DIR));
        Ok(Trust {
            policy,
            registries_d: RegistriesD::load(dir)?,
        })
    }

    /// Checks `image` (as the pullspec names it), whose manifest digest is `digest`, against
    /// the policy, fetching the signatures it needs from `registry` (the source pulled from: a
    /// mirror's, through one) and the lookaside store; returns the verdict and what it was
    /// judged on. A refusal is one line naming the image, the policy's scope and requirement,
    /// and why it failed.
    pub async fn check(
        &self,
        image: &ImageRef,
        digest: &str,
        manifest: Option<&[u8]>,
        retry: &RetryPolicy,
        registry: Option<&Registry>,
        gather: Gather,
    ) -> Result<(Verified, Evidence)> {
        let Some((_, policy)) = &self.policy else {
            return Ok((Verified::NoPolicy, Evidence::default()));
        };
        let (_, requirements) = policy.requirements_for(image);
        let needs = |kind: &str| {
            gather == Gather::All
                || requirements.iter().any(|r| match r {
                    Requirement::SignedBy(_) => kind == "simple",
                    Requirement::SigstoreSigned(_) => kind == "sigstore",
                    _ => false,
                })
        };
        let mut evidence = Evidence::default();
        if image.transport == Transport::Registry {
            let source = registry.map_or(image, Registry::image);
            if needs("simple") || needs("sigstore") {
                let (simple, sigstore, note) =
                    self.lookaside(source, digest, retry, registry).await?;
                evidence.notes.push(note);
                if needs("simple") {
                    evidence.simple = Some(simple);
                }
                if needs("sigstore") {
                    evidence.sigstore = Some(sigstore);
                }
            }
            if needs("sigstore") {
                let enabled = self
                    .registries_d
                    .use_sigstore_attachments(source)
                    .unwrap_or(false);
                match registry {
                    Some(registry) if enabled => {
                        let attached = sigstore::attached(registry, digest)
                            .await
                            .with_context(|| format!("reading the signatures attached to {image}"))?;
                        evidence.sigstore.get_or_insert_with(Vec::new).extend(attached);
                    }
                    _ => evidence.notes.push(format!(
                        "registries.d does not set use-sigstore-attachments for {}",
                        source.name()
                    )),
                }
            }
        } else {
            evidence.notes.push("an OCI layout carries no signatures".into());
        }
        let verified = self.judge(image, digest, manifest, &evidence)?;
        Ok((verified, evidence))
    }

    /// Judges `image` at `digest` on signatures already fetched (`evidence`).
    pub fn judge(
        &self,
        image: &ImageRef,
        digest: &str,
        manifest: Option<&[u8]>,
        evidence: &Evidence,
    ) -> Result<Verified> {
        let Some((path, policy)) = &self.policy else {
            return Ok(Verified::NoPolicy);
        };
        let (scope, requirements) = policy.requirements_for(image);
        // containers/image cannot parse such a name at all (an IPv6 host, a name over 255
        // characters): which of its scopes would apply, a tag- or digest-specific one
        // included, cannot be known, so any requirement the policy makes of registry images
        // refuses it.
        if image.transport == Transport::Registry
            && identity::image_reference(image).is_none()
            && policy.requires_anything_of_registry_images()
        {
            bail!(
                "{image} is refused by the signature policy {}: containers/image cannot parse this name (an IPv6 host, or a name over 255 characters), so no scope of the policy can be matched to it, and the policy requires signatures or refusals of registry images",
                path.display()
            );
        }
        let mut keys = Vec::new();
        for requirement in requirements {
            match evaluate::requirement(requirement, image, digest, manifest, evidence) {
                Ok(Some(key)) => keys.push(key),
                Ok(None) => {}
                Err(why) => bail!(
                    "{image} is refused by the signature policy {} ({scope}, {}): {why}",
                    path.display(),
                    requirement.kind()
                ),
            }
        }
        Ok(match keys.is_empty() {
            true => Verified::Accepted,
            false => Verified::Signed(keys),
        })
    }

    /// The signatures of `digest` in the lookaside store registries.d names for `source` (the
    /// built-in default when none is set, as in containers/image): simple-signing ones and
    /// sigstore ones, and where they were looked for.
    async fn lookaside(
        &self,
        source: &ImageRef,
        digest: &str,
        retry: &RetryPolicy,
        registry: Option<&Registry>,
    ) -> Result<(Vec<Blob>, Vec<sigstore::Attached>, String)> {
        let base = self.registries_d.lookaside_for(source);
        let path = identity::image_reference(source)
            .map_or_else(|| source.repository.clone(), |r| r.path().to_string());
        let blobs = lookaside::signatures(
            &base,
            &path,
            digest,
            retry,
            registry.map(Registry::http_client),
        )
        .await
        .with_context(|| format!("reading the signatures of {source} from {base}"))?;
        let (mut simple, mut attached) = (Vec::new(), Vec::new());
        for blob in blobs {
            if blob.starts_with(b"\x00sigstore-json\n") {
                // Other attachment kinds are passed over, as containers/image does.
                if let Ok(sig) = sigstore::from_blob(&blob) {
                    attached.push(sig);
                }
            } else {
                let bytes = blob
                    .strip_prefix(b"\x00simple-signing\n")
                    .map(<[u8]>::to_vec)
                    .unwrap_or(blob);
                simple.push(Blob(bytes));
            }
        }
        Ok((simple, attached, format!("lookaside {base}")))
    }
}

/// The policy at the default `path`: None only when nothing is there at all.
fn default_policy(path: &Path) -> Result<Option<Policy>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        Ok(meta) if meta.file_type().is_symlink() && !path.exists() => {
            bail!("{} is a symlink to nothing: restore the policy it pointed to", path.display())
        }
        Ok(_) => Ok(Some(Policy::load(path)?)),
    }
}

#[cfg(test)]
pub(crate) fn fixtures_dir() -> PathBuf {
    pivot_testkit::containers_image_fixtures()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_policy_that_is_not_there_at_all_means_no_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.json");
        assert!(default_policy(&path).unwrap().is_none());
        std::os::unix::fs::symlink(dir.path().join("gone.json"), &path).unwrap();
        let err = format!("{:#}", default_policy(&path).unwrap_err());
        assert!(err.contains("symlink to nothing"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(default_policy(&path).is_err(), "a directory is not a policy");
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "{").unwrap();
        assert!(default_policy(&path).is_err());
        std::fs::write(&path, r#"{"default": [{"type": "reject"}]}"#).unwrap();
        assert!(default_policy(&path).unwrap().is_some());
    }

    /// No policy file at all: images are pulled unchecked, unless pivot.toml's
    /// `signatures.require_policy` says a policy is required; a policy given is read either way.
    #[test]
    fn no_policy_file_is_refused_when_a_policy_is_required() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("policy.json");
        let image = ImageRef::parse("quay.io/os/node:4.15").unwrap();
        let digest = format!("sha256:{}", "a".repeat(64));
        let open = Trust::load_with(Err(&absent), Some(dir.path()), false).unwrap();
        assert_eq!(open.judge(&image, &digest, None, &Evidence::default()).unwrap(), Verified::NoPolicy);
        let err = Trust::load_with(Err(&absent), Some(dir.path()), true).err().unwrap();
        assert!(format!("{err:#}").contains("signatures.require_policy"), "{err:#}");
        std::fs::write(&absent, r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).unwrap();
        let given = Trust::load_with(Err(&absent), Some(dir.path()), true).unwrap();
        assert_eq!(given.judge(&image, &digest, None, &Evidence::default()).unwrap(), Verified::Accepted);
    }

    /// A name containers/image cannot parse never falls through to a broader scope: any
    /// requirement the policy makes of registry images refuses it; a policy that accepts
    /// everything still accepts it.
    #[test]
    fn names_containers_image_cannot_parse_are_refused_where_signatures_are_required() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.json");
        let judge = |policy: &str, image: &str| {
            std::fs::write(&path, policy).unwrap();
            let trust = Trust::load(Some(&path), Some(dir.path()), false).unwrap();
            let image = ImageRef::parse(image).unwrap();
            trust.judge(&image, &format!("sha256:{}", "a".repeat(64)), None, &Evidence::default())
        };
        let accept = r#"{"default": [{"type": "insecureAcceptAnything"}]}"#;
        // Only the tag-specific scope of the image requires a signature.
        let tagged = r#"{"default": [{"type": "insecureAcceptAnything"}],
            "transports": {"docker": {"[::1]:5000/os:v2": [{"type": "reject"}]}}}"#;
        let long = format!("reg.example/{}:v2", "a".repeat(250));
        for image in ["[::1]:5000/os:v2", long.as_str()] {
            assert!(judge(accept, image).is_ok(), "{image}");
            let err = format!("{:#}", judge(tagged, image).unwrap_err());
            assert!(err.contains("cannot parse this name") && !err.contains('\n'), "{err}");
            let reject = r#"{"default": [{"type": "reject"}]}"#;
            assert!(judge(reject, image).is_err(), "{image}");
        }
        // A name it parses gets its own scope's verdict.
        assert!(judge(tagged, "reg.example/os:v2").is_ok());
    }
}
