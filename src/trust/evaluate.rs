//! One requirement judged on the signatures fetched for an image, as containers/image judges
//! it (`signature/policy_eval_*.go`): a signature requirement holds when at least one signature
//! verifies with what it trusts, vouches for the manifest digest, and names an identity its
//! `signedIdentity` accepts. What containers/image does not implement either (`keyType`s other
//! than `GPGKeys`, `signedBaseLayer`) refuses the image, naming why. Key files are read when an
//! image needs them, so a policy that names keys of other scopes' images does not stop pulls.

use anyhow::{Context, Result};

use super::evidence::Evidence;
use super::fulcio::FulcioRoot;
use super::identity::SignedIdentity;
use super::pki::PkiRoot;
use super::policy::{decode_data, KeyType, Requirement, SigstoreSigned};
use super::rekor::RekorKeys;
use super::sigstore::{PublicKeys, Root};
use super::simple_signing::{self, Failure, Keyring, COSIGN_TYPE, SIMPLE_SIGNING_TYPE};
use crate::fetch::reference::ImageRef;

/// Whether `requirement` holds for `image` at `digest` (whose manifest is `manifest`, when at
/// hand): None (no signature needed), the key of the signature that satisfied it, or why not.
pub fn requirement(
    requirement: &Requirement,
    image: &ImageRef,
    digest: &str,
    manifest: Option<&[u8]>,
    evidence: &Evidence,
) -> Result<Option<String>, String> {
    let signed = Signed { digest, manifest };
    let notes = || match evidence.notes.is_empty() {
        true => String::new(),
        false => format!(" (looked for in: {})", evidence.notes.join("; ")),
    };
    match requirement {
        Requirement::InsecureAcceptAnything {} => Ok(None),
        Requirement::Reject {} => Err("the policy rejects this scope".into()),
        Requirement::SignedBaseLayer { .. } => Err(
            "signedBaseLayer is not implemented (containers/image refuses it the same way)".into(),
        ),
        Requirement::SignedBy(r) => {
            if r.key_type != KeyType::GPGKeys {
                return Err(format!(
                    "keyType {:?} is not implemented (containers/image refuses it the same way)",
                    r.key_type
                ));
            }
            let keyring: Keyring = load(&r.key_path, &r.key_paths, &r.key_data, &None, "key")
                .map_err(|e| format!("{e:#}"))?;
            let checked = evidence
                .simple
                .iter()
                .flatten()
                .map(|blob| match simple_signing::verify(&blob.0, &keyring) {
                    Ok(verified) => Ok(verified),
                    Err(f @ Failure::UnknownKey(_)) => Err((1, f.to_string())),
                    Err(f) => Err((2, f.to_string())),
                })
                .collect();
            judge(checked, SIMPLE_SIGNING_TYPE, &r.signed_identity, image, &signed)
                .map(Some)
                .map_err(|why| why + &notes())
        }
        Requirement::SigstoreSigned(r) => {
            let root = sigstore_root(r).map_err(|e| format!("{e:#}"))?;
            let checked = evidence
                .sigstore
                .iter()
                .flatten()
                .map(|sig| root.verify(sig).map(|key| (sig.payload.clone(), key)))
                .collect();
            judge(checked, COSIGN_TYPE, &r.signed_identity, image, &signed)
                .map(Some)
                .map_err(|why| why + &notes())
        }
    }
}

/// What a `sigstoreSigned` requirement trusts, its keys and certificates read.
fn sigstore_root(r: &SigstoreSigned) -> Result<Root> {
    let rekor = || -> Result<RekorKeys> {
        load(
            &r.rekor_public_key_path,
            &r.rekor_public_key_paths,
            &r.rekor_public_key_data,
            &r.rekor_public_key_datas,
            "Rekor public key",
        )
    };
    if let Some(f) = &r.fulcio {
        let ca = one_source(&f.ca_path, &f.ca_data, "fulcio CA")?;
        let root = FulcioRoot::new(
            &ca,
            f.oidc_issuer.as_deref().unwrap_or_default(),
            f.subject_email.as_deref().unwrap_or_default(),
        )?;
        return Ok(Root::Fulcio(root, rekor()?));
    }
    if let Some(p) = &r.pki {
        let roots = one_source(&p.ca_roots_path, &p.ca_roots_data, "pki CA roots")?;
        let intermediates = match (&p.ca_intermediates_path, &p.ca_intermediates_data) {
            (None, None) => None,
            (path, data) => Some(one_source(path, data, "pki intermediates")?),
        };
        let root = PkiRoot::new(
            &roots,
            intermediates.as_deref(),
            p.subject_email.as_deref(),
            p.subject_hostname.as_deref(),
        )?;
        return Ok(Root::Pki(root));
    }
    let keys: PublicKeys = load(&r.key_path, &r.key_paths, &r.key_data, &r.key_datas, "key")?;
    let rekor = match r.has_rekor() {
        true => Some(rekor()?),
        false => None,
    };
    Ok(Root::Keys(keys, rekor))
}

/// The bytes of a single-source field pair (`caPath` / `caData`).
fn one_source(path: &Option<String>, data: &Option<String>, what: &str) -> Result<Vec<u8>> {
    match (path, data) {
        (_, Some(data)) => decode_data(what, data),
        (Some(path), None) => {
            std::fs::read(path).with_context(|| format!("reading the {what} file {path}"))
        }
        (None, None) => anyhow::bail!("no {what} given"),
    }
}

/// The keys of a requirement, of any kind.
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

impl KeySet for RekorKeys {
    fn parse(bytes: &[u8]) -> Result<Self> {
        RekorKeys::parse(bytes)
    }
    fn extend(&mut self, other: Self) {
        RekorKeys::extend(self, other)
    }
}

/// All the keys a requirement names: `…Data`/`…Datas` (base64), else the files of
/// `…Path`/`…Paths`.
fn load<K: KeySet>(
    path: &Option<String>,
    paths: &Option<Vec<String>>,
    data: &Option<String>,
    datas: &Option<Vec<String>>,
    what: &str,
) -> Result<K> {
    let mut sources: Vec<(String, Vec<u8>)> = Vec::new();
    for d in data.iter().chain(datas.iter().flatten()) {
        sources.push((format!("{what} data"), decode_data(what, d)?));
    }
    for file in path.iter().chain(paths.iter().flatten()) {
        let bytes =
            std::fs::read(file).with_context(|| format!("reading the {what} file {file}"))?;
        sources.push((format!("{what} file {file}"), bytes));
    }
    let mut keys: Option<K> = None;
    for (source, bytes) in sources {
        let read = K::parse(&bytes).context(source)?;
        match &mut keys {
            Some(k) => k.extend(read),
            None => keys = Some(read),
        }
    }
    keys.with_context(|| format!("no {what} given"))
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
    signed: &Signed,
) -> Result<String, String> {
    let digest = signed.digest;
    let identity = signed_identity.clone().unwrap_or_default();
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
        if !signed.is(&payload.manifest_digest) {
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

/// The manifest a signature must vouch for: its digest, and its bytes when at hand.
struct Signed<'a> {
    digest: &'a str,
    manifest: Option<&'a [u8]>,
}

impl Signed<'_> {
    /// Whether `named` (a payload's `docker-manifest-digest`, checked well-formed) names this
    /// manifest: as containers/image's `manifest.MatchesDigest`, by hashing the manifest with
    /// the algorithm `named` uses (sha256, sha384 or sha512), so a signature may name the
    /// manifest by another algorithm than the registry's digest.
    fn is(&self, named: &str) -> bool {
        if named == self.digest {
            return true;
        }
        let Some(manifest) = self.manifest else {
            return false;
        };
        use sha2::Digest;
        let hex = match named.split_once(':') {
            Some(("sha256", _)) => hex::encode(sha2::Sha256::digest(manifest)),
            Some(("sha384", _)) => hex::encode(sha2::Sha384::digest(manifest)),
            Some(("sha512", _)) => hex::encode(sha2::Sha512::digest(manifest)),
            _ => return false,
        };
        named.split_once(':').is_some_and(|(_, h)| h == hex)
    }
}
