//! Trust: whether the image a pullspec resolved to may be pulled at all, decided by the policy
//! admins already write for the containers tools, before any layer is downloaded.
//!
//! - [`policy`]: containers-policy.json(5), the requirements per transport and scope;
//! - [`registries_d`]: containers-registries.d(5), where an image's signatures are kept;
//! - [`lookaside`]: fetching them;
//! - [`simple_signing`]: verifying GPG "simple signing" signatures and reading their payload;
//! - [`sigstore`]: key-based sigstore (cosign) signatures attached in the registry;
//! - [`identity`]: whether the identity a signature claims fits the image pulled;
//! - [`ostree_remote`]: OSTree commit signatures by an OSTree remote's keys (`--ostree-remote`),
//!   checked on the commit once it is imported, before it is committed or deployed.
//!
//! The decision is made on the manifest digest the registry served (the top-level one, as the
//! containers tools do): a signature vouches for that digest, and every byte pulled afterwards
//! is checked against it. No policy file: pivot pulls as before, and says so once in the log.

pub mod identity;
pub mod lookaside;
pub mod ostree_remote;
pub mod policy;
pub mod registries_d;
pub mod sigstore;
pub mod simple_signing;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use base64::Engine;

use crate::api::status::Verification;
use crate::fetch::reference::{ImageRef, Transport};
use crate::fetch::retry::RetryPolicy;
use identity::SignedIdentity;
use policy::{Policy, Requirement};
use registries_d::RegistriesD;
use crate::fetch::registry::Registry;
use sigstore::PublicKeys;
use simple_signing::{Failure, Keyring, COSIGN_TYPE, SIMPLE_SIGNING_TYPE};

/// More signatures than any image has: a lookaside store that never says "missing", or an
/// attachment with more layers, is refused.
const MAX_SIGNATURES: usize = 64;

/// The policy and signature stores pivot checks images against.
#[derive(Debug, Clone)]
pub struct Trust {
    policy: Option<(PathBuf, Policy)>,
    registries_d: RegistriesD,
    /// Where `registries_d` was read from, for messages.
    registries_d_dir: PathBuf,
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

impl Trust {
    /// Reads the policy (`--policy`, else the containers tools' default; a missing default is
    /// no policy, a missing `--policy` an error) and registries.d.
    pub fn load(policy: Option<&Path>, registries_d: Option<&Path>) -> Result<Trust> {
        let policy = match policy {
            Some(path) => Some((path.to_path_buf(), Policy::load(path)?)),
            None => {
                let path = Path::new(policy::DEFAULT_PATH);
                if path.exists() {
                    Some((path.to_path_buf(), Policy::load(path)?))
                } else {
                    tracing::info!(
                        "no {}: image signatures are not checked",
                        policy::DEFAULT_PATH
                    );
                    None
                }
            }
        };
        let dir = registries_d.unwrap_or(Path::new(registries_d::DEFAULT_DIR));
        Ok(Trust {
            policy,
            registries_d: RegistriesD::load(dir)?,
            registries_d_dir: dir.to_path_buf(),
        })
    }

    /// Checks `image` (as the pullspec names it), whose manifest digest is `digest`, against
    /// the policy. A refusal is one line naming the image, the policy's scope and requirement,
    /// and why it failed.
    pub async fn check(
        &self,
        image: &ImageRef,
        digest: &str,
        retry: &RetryPolicy,
        registry: Option<&Registry>,
    ) -> Result<Verified> {
        let Some((path, policy)) = &self.policy else {
            return Ok(Verified::NoPolicy);
        };
        let (scope, requirements) = policy.requirements_for(image);
        let refused = |requirement: &Requirement, why: String| {
            anyhow::anyhow!(
                "{image} is refused by the signature policy {} ({scope}, {}): {why}",
                path.display(),
                requirement.kind()
            )
        };
        let mut signatures: Option<Vec<Vec<u8>>> = None;
        let mut attached: Option<Attachments> = None;
        let mut keys = Vec::new();
        for requirement in requirements {
            match requirement {
                Requirement::InsecureAcceptAnything {} => {}
                Requirement::Reject {} => {
                    return Err(refused(requirement, "the policy rejects this scope".into()))
                }
                Requirement::SignedBy {
                    key_path,
                    key_paths,
                    key_data,
                    signed_identity,
                    ..
                } => {
                    let keyring: Keyring = load_keys(key_path, key_paths, key_data)
                        .map_err(|e| refused(requirement, format!("{e:#}")))?;
                    if signatures.is_none() {
                        signatures =
                            Some(self.simple_signatures(image, digest, retry, registry).await?);
                    }
                    let no_store = self
                        .registries_d
                        .storage_for(image)
                        .and_then(|s| s.lookaside())
                        .is_none();
                    if no_store && signatures.as_ref().is_some_and(Vec::is_empty) {
                        let why = format!(
                            "no signature of {digest} was found: no lookaside store is configured for {} in {}",
                            image.name(),
                            self.registries_d_dir.display()
                        );
                        return Err(refused(requirement, why));
                    }
                    let checked = signatures
                        .as_deref()
                        .unwrap_or_default()
                        .iter()
                        .map(|s| match simple_signing::verify(s, &keyring) {
                            Ok(verified) => Ok(verified),
                            Err(f @ Failure::UnknownKey(_)) => Err((1, f.to_string())),
                            Err(f) => Err((2, f.to_string())),
                        })
                        .collect();
                    let key = judge(checked, SIMPLE_SIGNING_TYPE, signed_identity, image, digest)
                        .map_err(|why| refused(requirement, why))?;
                    keys.push(key);
                }
                Requirement::SigstoreSigned {
                    key_path,
                    key_paths,
                    key_data,
                    fulcio,
                    rekor_public_key_path,
                    rekor_public_key_data,
                    signed_identity,
                } => {
                    if fulcio.is_some() {
                        let why = "keyless (Fulcio) signatures are not verified by pivot";
                        return Err(refused(requirement, why.into()));
                    }
                    if rekor_public_key_path.is_some() || rekor_public_key_data.is_some() {
                        let why = "Rekor transparency-log bundles are not verified by pivot";
                        return Err(refused(requirement, why.into()));
                    }
                    let public: PublicKeys = load_keys(key_path, key_paths, key_data)
                        .map_err(|e| refused(requirement, format!("{e:#}")))?;
                    if attached.is_none() {
                        attached = Some(self.attached(image, digest, registry).await?);
                    }
                    let attached = attached.as_ref().expect("fetched above");
                    let checked = attached
                        .signatures
                        .iter()
                        .map(|a| match public.verify(&a.payload, &a.signature) {
                            Some(key) => Ok((a.payload.clone(), key)),
                            None => Err((1, UNVERIFIED_SIGSTORE.to_string())),
                        })
                        .collect();
                    let key = judge(checked, COSIGN_TYPE, signed_identity, image, digest)
                        .map_err(|why| refused(requirement, why + &attached.note))?;
                    keys.push(key);
                }
            }
        }
        Ok(match keys.is_empty() {
            true => Verified::Accepted,
            false => Verified::Signed(keys),
        })
    }

    /// The simple-signing signatures of `digest` in `image`'s lookaside store.
    async fn simple_signatures(
        &self,
        image: &ImageRef,
        digest: &str,
        retry: &RetryPolicy,
        registry: Option<&Registry>,
    ) -> Result<Vec<Vec<u8>>> {
        if image.transport != Transport::Registry {
            return Ok(Vec::new());
        }
        let Some(base) = self
            .registries_d
            .storage_for(image)
            .and_then(|s| s.lookaside())
        else {
            return Ok(Vec::new());
        };
        lookaside::signatures(base, image, digest, retry, registry.map(Registry::http_client))
            .await
            .with_context(|| format!("reading the signatures of {image} from {base}"))
    }
}

/// The key material a requirement names, each with where it came from: `keyData` (base64),
/// else the files of `keyPath` and `keyPaths`.
fn key_sources(
    path: &Option<String>,
    paths: &Option<Vec<String>>,
    data: &Option<String>,
) -> Result<Vec<(String, Vec<u8>)>> {
    if let Some(data) = data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .context("keyData is not base64")?;
        return Ok(vec![("keyData".into(), bytes)]);
    }
    let files: Vec<(String, Vec<u8>)> = path
        .iter()
        .chain(paths.iter().flatten())
        .map(|file| {
            let bytes = std::fs::read(file).with_context(|| format!("reading key file {file}"))?;
            Ok((format!("key file {file}"), bytes))
        })
        .collect::<Result<_>>()?;
    anyhow::ensure!(!files.is_empty(), "no key file given");
    Ok(files)
}

/// The keys of a requirement, of either kind.
trait KeySet: Sized {
    fn parse(bytes: &[u8]) -> Result<Self>;
    fn extend(&mut self, other: Self);
}

impl KeySet for Keyring {
    fn parse(bytes: &[u8]) -> Result<Self> {
        Keyring::parse(bytes)
    }
    fn extend(&mut self, other: Self) {
        Keyring::extend(self, other)
    }
}

impl KeySet for PublicKeys {
    fn parse(bytes: &[u8]) -> Result<Self> {
        PublicKeys::parse(bytes)
    }
    fn extend(&mut self, other: Self) {
        PublicKeys::extend(self, other)
    }
}

/// All the keys a requirement names.
fn load_keys<K: KeySet>(
    path: &Option<String>,
    paths: &Option<Vec<String>>,
    data: &Option<String>,
) -> Result<K> {
    let mut keys: Option<K> = None;
    for (source, bytes) in key_sources(path, paths, data)? {
        let read = K::parse(&bytes).context(source)?;
        match &mut keys {
            Some(k) => k.extend(read),
            None => keys = Some(read),
        }
    }
    keys.context("no key given")
}

/// A sigstore signature carries no key id: one that does not verify may be by another key, or
/// tampered.
const UNVERIFIED_SIGSTORE: &str =
    "the signature does not verify with any key the policy trusts (another key's, or tampered)";

/// The signatures attached in the registry, and a note for a refusal when none could be.
struct Attachments {
    signatures: Vec<sigstore::Attached>,
    note: String,
}

impl Trust {
    /// The sigstore signatures attached to `digest`, if registries.d enables reading them for
    /// `image` (`use-sigstore-attachments`) and the image comes from a registry.
    async fn attached(
        &self,
        image: &ImageRef,
        digest: &str,
        registry: Option<&Registry>,
    ) -> Result<Attachments> {
        let enabled = self
            .registries_d
            .storage_for(image)
            .and_then(|s| s.use_sigstore_attachments)
            .unwrap_or(false);
        let none = |note: &str| {
            Ok(Attachments {
                signatures: Vec::new(),
                note: note.into(),
            })
        };
        match registry {
            None => none(" (an OCI layout carries no signature attachments)"),
            Some(_) if !enabled => none(" (registries.d does not set use-sigstore-attachments for it)"),
            Some(registry) => Ok(Attachments {
                signatures: sigstore::attached(registry, digest)
                    .await
                    .with_context(|| format!("reading the signatures attached to {image}"))?,
                note: String::new(),
            }),
        }
    }
}

/// A signature checked against a requirement's keys: its payload and the key that made it, or
/// why not, ranked by how much the reason tells (higher tells more).
type Checked = Result<(Vec<u8>, String), (u8, String)>;

/// Of signatures already checked against the keys (payload and key, or a ranked reason), the
/// key of the first whose payload is of type `kind`, vouches for `digest` and names an
/// identity `signed_identity` accepts for `image`; else why none does (the most telling
/// reason: a signature for the wrong image beats a bad one, which beats an unknown key).
fn judge(
    checked: Vec<Checked>,
    kind: &str,
    signed_identity: &Option<SignedIdentity>,
    image: &ImageRef,
    digest: &str,
) -> Result<String, String> {
    let identity = signed_identity
        .clone()
        .unwrap_or(SignedIdentity::MatchRepoDigestOrExact);
    if checked.is_empty() {
        return Err(format!("no signature of {digest} was found"));
    }
    let count = checked.len();
    let mut reasons: Vec<(u8, String)> = Vec::new();
    for result in checked {
        let (payload, key) = match result {
            Ok(verified) => verified,
            Err(reason) => {
                reasons.push(reason);
                continue;
            }
        };
        let payload = match simple_signing::parse_payload(&payload, kind) {
            Ok(p) => p,
            Err(e) => {
                reasons.push((3, format!("a signature by key {key} has an invalid payload: {e:#}")));
                continue;
            }
        };
        if payload.manifest_digest != digest {
            reasons.push((
                3,
                format!(
                    "a signature by key {key} is for manifest {}, not {digest}",
                    payload.manifest_digest
                ),
            ));
            continue;
        }
        match identity.accepts(image, &payload.reference) {
            Ok(()) => return Ok(key),
            Err(why) => reasons.push((3, why)),
        }
    }
    reasons.sort_by_key(|(rank, _)| std::cmp::Reverse(*rank));
    let (_, why) = reasons.swap_remove(0);
    Err(match count {
        1 => why,
        n => format!("none of {n} signatures is accepted: {why}"),
    })
}
