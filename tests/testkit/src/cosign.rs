//! Sigstore signatures attached in the registry the way cosign attaches them (and
//! containers/image reads them with `use-sigstore-attachments`): an OCI manifest tagged
//! `sha256-<hex>.sig` in the image's repository, one layer per signature whose blob is the
//! payload and whose `dev.cosignproject.cosign/signature` annotation is the base64 signature.
//! Debian's skopeo cannot sign this way, so the kit writes the format; the signatures themselves
//! are made by the `openssl` command, with keys it generates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use base64::Engine;

use crate::oscontainer::push_to;
use crate::push::{sha256_digest, ManifestUpload};
use crate::Registry;

const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";

/// cosign's payload for `reference` (the identity) and manifest `digest`.
pub fn cosign_payload(reference: &str, digest: &str) -> Vec<u8> {
    serde_json::json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    })
    .to_string()
    .into_bytes()
}

/// A P-256 key pair made by `openssl` in `dir`: (private key PEM path, public key PEM path).
pub fn ec_key_pair(dir: &Path, name: &str) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let out = Command::new("openssl")
        .args([
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
        ])
        .arg(&private)
        .output()
        .context("running openssl ecparam")?;
    ensure!(out.status.success(), "openssl ecparam: {out:?}");
    let out = Command::new("openssl")
        .args(["ec", "-pubout", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public)
        .output()
        .context("running openssl ec")?;
    ensure!(out.status.success(), "openssl ec: {out:?}");
    Ok((private, public))
}

/// The DER ECDSA signature of `payload` by the key at `private`, made by `openssl dgst`.
pub fn openssl_sign(private: &Path, payload: &[u8]) -> Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("payload");
    std::fs::write(&input, payload)?;
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(private)
        .arg(&input)
        .output()
        .context("running openssl dgst")?;
    ensure!(out.status.success(), "openssl dgst: {out:?}");
    Ok(out.stdout)
}

/// Key types `openssl genpkey` makes, as a `sigstoreSigned` policy may name them: (name,
/// `openssl genpkey` arguments, None: containers/image verifies with it; Some: the type pivot
/// names when it refuses to load it). For [`genpkey_pair`].
pub const SIGSTORE_KEY_TYPES: &[(&str, &[&str], Option<&str>)] = &[
    (
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        None,
    ),
    (
        "p224",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-224"],
        None,
    ),
    (
        "p256",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        None,
    ),
    (
        "p384",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
        None,
    ),
    (
        "p521",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-521"],
        None,
    ),
    ("ed25519", &["-algorithm", "ED25519"], None),
    ("dsa", &["-algorithm", "DSA"], Some("key type DSA")),
    (
        "rsa-pss",
        &["-algorithm", "RSA-PSS", "-pkeyopt", "rsa_keygen_bits:2048"],
        Some("key type RSA-PSS"),
    ),
    (
        "secp256k1",
        &[
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:secp256k1",
        ],
        Some("key type EC secp256k1"),
    ),
    (
        "brainpool",
        &[
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:brainpoolP256r1",
        ],
        Some("key type EC brainpoolP256r1"),
    ),
    (
        "explicit",
        &[
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-pkeyopt",
            "ec_param_enc:explicit",
        ],
        Some("key type EC with explicit curve parameters"),
    ),
    ("ed448", &["-algorithm", "ED448"], Some("key type Ed448")),
    ("x25519", &["-algorithm", "X25519"], Some("key type X25519")),
];

/// A key pair made by `openssl genpkey` with `args` (`-algorithm RSA-PSS`, `-algorithm EC
/// -pkeyopt ec_paramgen_curve:secp256k1`, …) in `dir`: (private key PEM path, public key PEM
/// path, a SubjectPublicKeyInfo). `-algorithm DSA` gets 2048-bit parameters generated first.
pub fn genpkey_pair(
    dir: &Path,
    name: &str,
    args: &[&str],
) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let mut genpkey: Vec<String> = vec!["genpkey".into()];
    if args == ["-algorithm", "DSA"] {
        let params = dir.join(format!("{name}.params"));
        run_openssl(&[
            "genpkey",
            "-genparam",
            "-algorithm",
            "DSA",
            "-pkeyopt",
            "dsa_paramgen_bits:2048",
            "-out",
            &params.display().to_string(),
        ])?;
        genpkey.extend(["-paramfile".into(), params.display().to_string()]);
    } else {
        genpkey.extend(args.iter().map(|a| a.to_string()));
    }
    genpkey.extend(["-out".into(), private.display().to_string()]);
    run_openssl(&genpkey.iter().map(String::as_str).collect::<Vec<_>>())?;
    run_openssl(&[
        "pkey",
        "-in",
        &private.display().to_string(),
        "-pubout",
        "-out",
        &public.display().to_string(),
    ])?;
    Ok((private, public))
}

/// Runs `openssl` with `args`; its standard output.
pub fn run_openssl(args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    ensure!(out.status.success(), "openssl {args:?}: {out:?}");
    Ok(out.stdout)
}

/// The signature of `payload` by the key at `private` as cosign makes it for its type: SHA-256
/// (`openssl dgst`) for RSA (PKCS #1 v1.5, or PSS for an RSA-PSS key), ECDSA and DSA; the
/// payload itself (`openssl pkeyutl -rawin`) for Ed25519 and Ed448.
pub fn openssl_sign_any(private: &Path, payload: &[u8]) -> Result<Vec<u8>> {
    if let Ok(signature) = openssl_sign(private, payload) {
        return Ok(signature);
    }
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("payload");
    std::fs::write(&input, payload)?;
    run_openssl(&[
        "pkeyutl",
        "-sign",
        "-rawin",
        "-inkey",
        &private.display().to_string(),
        "-in",
        &input.display().to_string(),
    ])
}

/// Attaches (in place of any attached before) one cosign signature to manifest `at` of
/// `repository`: of a payload naming `identity` at `signed`, made with the private key
/// `private` (any key type openssl signs with).
pub fn attach_cosign_signature(
    registry: &Registry,
    repository: &str,
    at: &str,
    identity: &str,
    signed: &str,
    private: &Path,
) -> Result<()> {
    let payload = cosign_payload(identity, signed);
    let signature = openssl_sign_any(private, &payload)?;
    attach_signatures(registry, repository, at, &[(payload, signature)])
}

/// Attaches `signatures` (payload, DER signature) to the manifest `digest` of `repository`.
pub fn attach_signatures(
    registry: &Registry,
    repository: &str,
    digest: &str,
    signatures: &[(Vec<u8>, Vec<u8>)],
) -> Result<()> {
    let annotated: Vec<(String, Vec<u8>, BTreeMap<String, String>)> = signatures
        .iter()
        .map(|(payload, signature)| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(signature);
            let annotations = BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), encoded)]);
            (PAYLOAD_TYPE.to_string(), payload.clone(), annotations)
        })
        .collect();
    attach_annotated(registry, repository, digest, &annotated)
}

/// Attaches signatures given as (media type, payload, layer annotations) — a signature, and
/// for keyless and PKI ones the certificate, chain and Rekor bundle — to the manifest `digest`.
pub fn attach_annotated(
    registry: &Registry,
    repository: &str,
    digest: &str,
    signatures: &[(String, Vec<u8>, BTreeMap<String, String>)],
) -> Result<()> {
    let config =
        br#"{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let layers: Vec<serde_json::Value> = signatures
        .iter()
        .map(|(media_type, payload, annotations)| {
            serde_json::json!({
                "mediaType": media_type,
                "size": payload.len(),
                "digest": sha256_digest(payload),
                "annotations": annotations
            })
        })
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "size": config.len(),
            "digest": sha256_digest(&config)
        },
        "layers": layers
    });
    let mut blobs = vec![config];
    blobs.extend(signatures.iter().map(|(_, payload, _)| payload.clone()));
    let tag = format!("{}.sig", digest.replace(':', "-"));
    push_to(
        registry,
        repository,
        &blobs,
        &[ManifestUpload {
            tag: Some(tag),
            body: serde_json::to_vec(&manifest)?,
            media_type: "application/vnd.oci.image.manifest.v1+json",
        }],
    )
}

/// A CA and a leaf certificate made by `openssl`, for PKI and Fulcio chains ([`openssl_chain`]).
#[derive(Clone, Copy, Debug)]
pub struct Chain<'a> {
    /// `genpkey` arguments of the CA's key.
    pub ca_key: &'a [&'a str],
    /// More `-addext` extensions of the CA (besides `basicConstraints=critical,CA:TRUE`).
    pub ca_extensions: &'a [&'a str],
    /// `genpkey` arguments of the leaf's key.
    pub leaf_key: &'a [&'a str],
    /// The leaf's extension lines (`openssl x509 -extfile`).
    pub leaf_extensions: &'a str,
    /// `-sigopt`s of the CA's signature on the leaf.
    pub sigopts: &'a [&'a str],
}

/// `openssl genpkey` arguments of a P-256 key.
pub const P256: &[&str] = &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];

/// Makes `chain` in `dir`: a self-signed CA `/CN=root CA` and a leaf `/CN=leaf` it signs (serial
/// 2, valid a day); (CA PEM path, leaf private key path, leaf PEM).
pub fn openssl_chain(dir: &Path, chain: &Chain) -> Result<(PathBuf, PathBuf, Vec<u8>)> {
    let path = |name: &str| dir.join(name).display().to_string();
    let (ca_key, _) = genpkey_pair(dir, "ca", chain.ca_key)?;
    let (leaf_key, _) = genpkey_pair(dir, "leaf", chain.leaf_key)?;
    let (ca_arg, leaf_arg) = (ca_key.display().to_string(), leaf_key.display().to_string());
    let (ca, csr, ext, leaf) = (
        path("ca.pem"),
        path("leaf.csr"),
        path("leaf.ext"),
        path("leaf.pem"),
    );
    let mut req = vec![
        "req",
        "-x509",
        "-new",
        "-key",
        &ca_arg,
        "-subj",
        "/CN=root CA",
        "-days",
        "1",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-out",
        &ca,
    ];
    for extension in chain.ca_extensions {
        req.extend(["-addext", extension]);
    }
    run_openssl(&req)?;
    run_openssl(&[
        "req", "-new", "-key", &leaf_arg, "-subj", "/CN=leaf", "-out", &csr,
    ])?;
    std::fs::write(&ext, chain.leaf_extensions)?;
    let mut sign = vec![
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_arg,
        "-set_serial",
        "2",
        "-days",
        "1",
        "-extfile",
        &ext,
        "-out",
        &leaf,
    ];
    for opt in chain.sigopts {
        sign.extend(["-sigopt", opt]);
    }
    run_openssl(&sign)?;
    Ok((PathBuf::from(ca), leaf_key, std::fs::read(leaf)?))
}
