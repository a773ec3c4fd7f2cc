//! Signature policy: images are checked against containers-policy.json(5) with signatures found
//! through containers-registries.d(5), before any layer is fetched. Keys are real `gpg` keys;
//! signatures are made by `skopeo standalone-sign` (containers/image's own signer), kept in a
//! lookaside directory and served over HTTP by `python3 -m http.server`. A refusal fetches no
//! layer, leaves the sysroot as it was and is recorded as a failed attempt.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::common::*;
use pivot_testkit::{
    attach_cosign_signature, attach_signatures, cosign_payload, ec_key_pair, openssl_sign,
    PushedImage,
};

/// A throwaway GnuPG home with one signing key.
pub(crate) struct Signer {
    pub(crate) home: tempfile::TempDir,
    pub(crate) fingerprint: String,
}

impl Signer {
    pub(crate) fn new(name: &str) -> Signer {
        let home = tempfile::Builder::new()
            .prefix("pivot-gpg-")
            .tempdir()
            .unwrap();
        let signer = Signer {
            home,
            fingerprint: String::new(),
        };
        let out = signer
            .gpg()
            .args(["--batch", "--passphrase", "", "--quick-gen-key"])
            .arg(format!("{name} <{name}@pivot.test>"))
            .args(["rsa2048", "sign", "never"])
            .output()
            .unwrap();
        assert!(out.status.success(), "gpg key generation: {out:?}");
        let out = signer
            .gpg()
            .args(["--batch", "--with-colons", "--list-secret-keys"])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout).to_string();
        let fingerprint = listing
            .lines()
            .find_map(|l| l.strip_prefix("fpr:"))
            .map(|l| l.trim_matches(':').to_string())
            .expect("a fingerprint");
        Signer {
            fingerprint,
            ..signer
        }
    }

    fn gpg(&self) -> Command {
        let mut cmd = Command::new("gpg");
        cmd.env("GNUPGHOME", self.home.path());
        cmd
    }

    /// The public key, exported as `gpg --export` writes it, into `path`.
    pub(crate) fn export(&self, path: &Path, armor: bool) {
        let mut cmd = self.gpg();
        cmd.arg("--batch");
        if armor {
            cmd.arg("--armor");
        }
        let out = cmd.arg("--export").arg(&self.fingerprint).output().unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{out:?}");
        std::fs::write(path, out.stdout).unwrap();
    }

    /// A simple-signing signature of `image`'s manifest naming `identity`, by skopeo.
    pub(crate) fn sign(&self, image: &PushedImage, identity: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("manifest.json");
        std::fs::write(&manifest, raw_manifest(&image.by_digest)).unwrap();
        let signature = dir.path().join("signature");
        let out = Command::new("skopeo")
            .env("GNUPGHOME", self.home.path())
            .arg("standalone-sign")
            .arg(&manifest)
            .arg(identity)
            .arg(&self.fingerprint)
            .arg("--output")
            .arg(&signature)
            .output()
            .unwrap();
        assert!(out.status.success(), "skopeo standalone-sign: {out:?}");
        std::fs::read(signature).unwrap()
    }
}

/// A lookaside store: signatures laid out as containers-registries.d(5) says.
pub(crate) struct Lookaside {
    pub(crate) dir: tempfile::TempDir,
}

impl Lookaside {
    pub(crate) fn new() -> Lookaside {
        Lookaside {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Stores `signatures` of `image` as signature-1, signature-2, ….
    pub(crate) fn put(&self, image: &PushedImage, signatures: &[Vec<u8>]) {
        let hex = image.digest.strip_prefix("sha256:").unwrap();
        let dir = self
            .dir
            .path()
            .join(format!("{}@sha256={hex}", image.repository));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, signature) in signatures.iter().enumerate() {
            std::fs::write(dir.join(format!("signature-{}", i + 1)), signature).unwrap();
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("file://{}", self.dir.path().display())
    }
}

/// `python3 -m http.server` serving a directory on loopback.
struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    fn serve(dir: &Path) -> HttpServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1"])
            .arg(port.to_string())
            .arg("--directory")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "http.server did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        HttpServer { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A policy and registries.d naming `lookaside` for the test registry, written under the
/// environment's directory; the pivot arguments that name them.
pub(crate) fn trust_args(env: &Env, name: &str, policy: &str, lookaside: &str) -> Vec<String> {
    trust_files(env, name, policy, &format!("lookaside: {lookaside}"))
}

/// [`trust_args`] with `storage` as the registry's registries.d entry.
pub(crate) fn trust_files(env: &Env, name: &str, policy: &str, storage: &str) -> Vec<String> {
    let dir = env.dir().join(name);
    let registries_d = dir.join("registries.d");
    std::fs::create_dir_all(&registries_d).unwrap();
    std::fs::write(dir.join("policy.json"), policy).unwrap();
    std::fs::write(
        registries_d.join("pivot.yaml"),
        format!("docker:\n  {}:\n    {storage}\n", env.registry.host()),
    )
    .unwrap();
    vec![
        "--policy".into(),
        dir.join("policy.json").display().to_string(),
        "--registries.d".into(),
        registries_d.display().to_string(),
    ]
}

pub(crate) fn signed_by(key: &Path) -> String {
    format!(
        r#"{{"default": [{{"type": "reject"}}],
            "transports": {{"docker": {{"": [{{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "{}"}}]}}}}}}"#,
        key.display()
    )
}

pub(crate) fn layer_gets(env: &Env, image: &PushedImage) -> usize {
    image
        .layer_digests
        .iter()
        .map(|d| env.registry.count_requests("GET", d))
        .sum()
}

pub(crate) fn with_args<'a>(trust: &'a [String], rest: &[&'a str]) -> Vec<&'a str> {
    trust
        .iter()
        .map(String::as_str)
        .chain(rest.iter().copied())
        .collect()
}

#[test]
fn an_image_signed_by_a_trusted_key_is_pivoted_by_tag_and_by_digest() {
    let env = Env::new();
    let image = env.push_v2();
    let signer = Signer::new("release");
    let key = env.dir().join("release.asc");
    signer.export(&key, true);
    let store = Lookaside::new();
    store.put(&image, &[signer.sign(&image, &image.by_tag)]);
    let server = HttpServer::serve(store.dir.path());
    let trust = trust_args(&env, "http", &signed_by(&key), &server.url());

    let out = env.pivot(&with_args(&trust, &[&image.by_tag]));
    assert_success(&out);
    assert_eq!(env.deployed_images()[0], image.commit);
    let origin = origin_of(&env, &image.commit);
    assert!(origin.contains("verification=signed"), "{origin}");
    assert!(
        origin.contains(&format!("signed-by={}", signer.fingerprint)),
        "{origin}"
    );
    assert_eq!(
        env.status_json()["deployments"][0]["verification"],
        "signed"
    );

    // By digest, the signature naming the tag is accepted (matchRepoDigestOrExact), and a
    // binary keyring read from a file store works as well as an armored one over HTTP.
    env.undeploy(0);
    let binary = env.dir().join("release.gpg");
    signer.export(&binary, false);
    let trust = trust_args(&env, "file", &signed_by(&binary), &store.url());
    assert_success(&env.pivot(&with_args(&trust, &[&image.by_digest])));
    assert_eq!(env.deployed_images()[0], image.commit);
}

#[test]
fn unsigned_untrusted_tampered_and_misnamed_images_are_refused_before_any_layer() {
    let env = Env::new();
    let image = env.push_v2();
    let trusted = Signer::new("release");
    let stranger = Signer::new("stranger");
    let key = env.dir().join("release.gpg");
    trusted.export(&key, false);
    let store = Lookaside::new();
    let trust = trust_args(&env, "refusals", &signed_by(&key), &store.url());
    let good = trusted.sign(&image, &image.by_tag);
    let mut tampered = good.clone();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0x55;
    let other_repo = format!("{}/pivot/other:v2", env.registry.host());
    // (case, the signatures in the store, what the refusal says)
    type Case<'a> = (&'a str, Vec<Vec<u8>>, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        ("unsigned", vec![], &["no signature of", "signedBy"]),
        (
            "untrusted key",
            vec![stranger.sign(&image, &image.by_tag)],
            &["a key the policy does not trust"],
        ),
        ("tampered", vec![tampered], &["does not verify"]),
        (
            "identity mismatch",
            vec![trusted.sign(&image, &other_repo)],
            &["the signature is for", "pivot/other:v2"],
        ),
    ];
    for (case, signatures, needles) in cases {
        store.put(&image, &signatures);
        let mut needles = needles.to_vec();
        needles.push("is refused by the signature policy");
        assert_refused(&env, &with_args(&trust, &[&image.by_tag]), &needles);
        assert_eq!(layer_gets(&env, &image), 0, "{case}: a layer was fetched");
        let last = &env.status_json()["pivot"][STATEROOT]["last"];
        assert_eq!(last["outcome"], "failed", "{case}");
    }

    // `reject` as the default, whatever is signed.
    store.put(&image, &[good]);
    let reject = trust_args(
        &env,
        "reject",
        r#"{"default": [{"type": "reject"}]}"#,
        &store.url(),
    );
    assert_refused(
        &env,
        &with_args(&reject, &[&image.by_tag]),
        &["\"default\"", "reject", "rejects this scope"],
    );
    assert_eq!(layer_gets(&env, &image), 0);

    // signedBy with no lookaside configured: containers/image's built-in default store is
    // read, and the refusal says where the signatures were looked for.
    let nowhere = trust_files(
        &env,
        "nowhere",
        &signed_by(&key),
        "use-sigstore-attachments: false",
    );
    assert_refused(
        &env,
        &with_args(&nowhere, &[&image.by_tag]),
        &[
            "no signature of",
            "looked for in: lookaside file:///var/lib/containers/sigstore",
        ],
    );
    assert_eq!(layer_gets(&env, &image), 0);
}

/// `--download-only` keeps the signatures it was judged on; the later deployment is judged
/// again under the policy in force then: the same policy deploys without the registry, a
/// tightened one refuses as a pull would, and nothing is deployed.
#[test]
fn a_download_is_judged_again_under_the_policy_in_force_when_it_is_deployed() {
    let mut env = Env::new();
    let image = env.push_v2();
    let release = Signer::new("release");
    let other = Signer::new("other");
    let (key, other_key) = (env.dir().join("release.gpg"), env.dir().join("other.gpg"));
    release.export(&key, false);
    other.export(&other_key, false);
    let store = Lookaside::new();
    store.put(&image, &[release.sign(&image, &image.by_tag)]);
    let signed = trust_args(&env, "release", &signed_by(&key), &store.url());
    let tightened = trust_args(&env, "other", &signed_by(&other_key), &store.url());
    let open = trust_args(
        &env,
        "open",
        r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        &store.url(),
    );

    // Downloaded under an open policy: the signature in the store is kept all the same.
    assert_success(&env.pivot(&with_args(&open, &["--download-only", &image.by_tag])));
    let kept = env
        .sysroot
        .path
        .join(format!("ostree/deploy/{STATEROOT}/var/lib/pivot/downloads"))
        .join(format!("{}.json", image.digest.replace(':', "-")));
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    assert_eq!(record["kind"], "DownloadSignatures");
    assert_eq!(record["evidence"]["simple"].as_array().unwrap().len(), 1);

    // A tightened policy: the kept signature is not by its key; the registry is asked and
    // refuses the same way; nothing is deployed.
    let pinned = image.by_digest.clone();
    assert_refused(
        &env,
        &with_args(&tightened, &[&pinned]),
        &[
            "is refused by the signature policy",
            "a key the policy does not trust",
        ],
    );
    let out = env.pivot(&with_args(&tightened, &[&pinned]));
    assert!(
        stderr(&out)
            .contains("does not satisfy the signature policy on the signatures kept with it"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        layer_gets(&env, &image),
        1,
        "only the download fetched the layer"
    );

    // Under the policy that trusts the key, the kept signature suffices without the registry.
    env.registry.stop();
    assert_success(&env.pivot(&with_args(&signed, &[&pinned])));
    assert_eq!(env.deployed_images()[0], image.commit);
    assert!(origin_of(&env, &image.commit).contains("verification=signed"));
}

#[test]
fn an_insecure_accept_anything_scope_admits_an_unsigned_image_the_default_rejects() {
    let env = Env::new();
    let image = env.push_v2();
    let policy = format!(
        r#"{{"default": [{{"type": "reject"}}],
            "transports": {{"docker": {{"{}/pivot": [{{"type": "insecureAcceptAnything"}}]}}}}}}"#,
        env.registry.host()
    );
    let store = Lookaside::new();
    let trust = trust_args(&env, "accept", &policy, &store.url());
    assert_success(&env.pivot(&with_args(&trust, &[&image.by_tag])));
    assert_eq!(env.deployed_images()[0], image.commit);
    assert!(origin_of(&env, &image.commit).contains("verification=accepted"));
}

#[test]
fn a_named_policy_that_is_missing_or_malformed_is_refused_in_one_line() {
    let env = Env::new();
    let image = env.push_v2();
    let missing = PathBuf::from("/nonexistent/policy.json");
    assert_refused(
        &env,
        &["--policy", missing.to_str().unwrap(), &image.by_tag],
        &["reading the signature policy", "/nonexistent/policy.json"],
    );
    let bad = env.dir().join("bad-policy.json");
    std::fs::write(
        &bad,
        r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}"#,
    )
    .unwrap();
    assert_refused(
        &env,
        &["--policy", bad.to_str().unwrap(), &image.by_tag],
        &["bad-policy.json", "exactly one of keyPath"],
    );
    assert_eq!(layer_gets(&env, &image), 0);
}

pub(crate) fn sigstore_signed(key: &Path) -> String {
    format!(
        r#"{{"default": [{{"type": "reject"}}],
            "transports": {{"docker": {{"": [{{"type": "sigstoreSigned", "keyPath": "{}"}}]}}}}}}"#,
        key.display()
    )
}

#[test]
fn a_sigstore_signature_attached_in_the_registry_is_verified_with_the_policys_key() {
    let env = Env::new();
    let image = env.push_v2();
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = ec_key_pair(keys.path(), "cosign").unwrap();
    let (stranger, _) = ec_key_pair(keys.path(), "stranger").unwrap();
    let payload = cosign_payload(&image.by_tag, &image.digest);
    let attach = |signatures: &[(Vec<u8>, Vec<u8>)]| {
        attach_signatures(&env.registry, &image.repository, &image.digest, signatures).unwrap()
    };
    let trust = trust_files(
        &env,
        "sigstore",
        &sigstore_signed(&public),
        "use-sigstore-attachments: true",
    );

    // None attached yet; then one by another key; then one for another image.
    assert_refused(
        &env,
        &with_args(&trust, &[&image.by_tag]),
        &["sigstoreSigned", "no signature of"],
    );
    attach(&[(payload.clone(), openssl_sign(&stranger, &payload).unwrap())]);
    assert_refused(
        &env,
        &with_args(&trust, &[&image.by_tag]),
        &["does not verify with any key the policy trusts"],
    );
    let other = cosign_payload(
        &format!("{}/pivot/other:v2", env.registry.host()),
        &image.digest,
    );
    attach(&[(other.clone(), openssl_sign(&private, &other).unwrap())]);
    assert_refused(
        &env,
        &with_args(&trust, &[&image.by_tag]),
        &["the signature is for", "pivot/other:v2"],
    );
    // Attachments are read only where registries.d says so.
    attach(&[(payload.clone(), openssl_sign(&private, &payload).unwrap())]);
    let unset = trust_args(
        &env,
        "unset",
        &sigstore_signed(&public),
        "file:///nonexistent",
    );
    assert_refused(
        &env,
        &with_args(&unset, &[&image.by_tag]),
        &["does not set use-sigstore-attachments"],
    );
    assert_eq!(layer_gets(&env, &image), 0, "a refusal fetched a layer");

    assert_success(&env.pivot(&with_args(&trust, &[&image.by_tag])));
    assert_eq!(env.deployed_images()[0], image.commit);
    let origin = origin_of(&env, &image.commit);
    assert!(origin.contains("verification=signed"), "{origin}");
    assert!(origin.contains("signed-by=sha256:"), "{origin}");
}

/// An image signed by a fresh trusted key, its signature in a lookaside served over HTTP: the
/// pivot arguments that require it, and what has to live while they are used.
pub(crate) struct SignedOverHttp {
    pub(crate) args: Vec<String>,
    /// `127.0.0.1:<port>` of the lookaside server.
    pub(crate) host: String,
    _server: HttpServer,
    _store: Lookaside,
}

pub(crate) fn signed_over_http(env: &Env, image: &PushedImage) -> SignedOverHttp {
    let signer = Signer::new("release");
    let key = env.dir().join("release.asc");
    signer.export(&key, true);
    let store = Lookaside::new();
    store.put(image, &[signer.sign(image, &image.by_tag)]);
    let server = HttpServer::serve(store.dir.path());
    SignedOverHttp {
        args: trust_args(env, "http", &signed_by(&key), &server.url()),
        host: format!("127.0.0.1:{}", server.port),
        _server: server,
        _store: store,
    }
}

/// A signature may name the manifest by another digest algorithm than the registry's sha256:
/// containers/image hashes the manifest with the algorithm the signature names
/// (`manifest.MatchesDigest`), so a `sha512:` (or `sha384:`) signature of the same manifest is
/// good, and one of other bytes is not.
#[test]
fn a_signature_naming_the_manifest_by_sha512_is_accepted_as_containers_image_does() {
    let env = Env::new();
    let image = env.push_v2();
    let cosign = Cosign::new(&env, "sigstore");
    let manifest = raw_manifest(&image.by_digest);
    let hashed = |algorithm: &str, bytes: &[u8]| {
        let path = cosign.keys.path().join("hashed");
        std::fs::write(&path, bytes).unwrap();
        let out = Command::new(format!("{algorithm}sum"))
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        format!("{algorithm}:{}", text.split_whitespace().next().unwrap())
    };

    cosign.attach(
        &env,
        &image,
        &hashed("sha512", b"another manifest"),
        &image.digest,
    );
    assert_refused(
        &env,
        &with_args(&cosign.trust, &[&image.by_tag]),
        &["is for manifest sha512:"],
    );
    cosign.attach(&env, &image, &hashed("sha512", &manifest), &image.digest);
    assert_success(&env.pivot(&with_args(&cosign.trust, &[&image.by_tag])));
    assert_eq!(env.deployed_images()[0], image.commit);
}

/// A cosign key pair made for a test, and the pivot arguments of a policy that requires its
/// signature, attached in the registry.
pub(crate) struct Cosign {
    pub(crate) keys: tempfile::TempDir,
    private: PathBuf,
    pub(crate) trust: Vec<String>,
}

impl Cosign {
    pub(crate) fn new(env: &Env, name: &str) -> Cosign {
        let keys = tempfile::tempdir().unwrap();
        let (private, public) = ec_key_pair(keys.path(), "cosign").unwrap();
        let trust = trust_files(
            env,
            name,
            &sigstore_signed(&public),
            "use-sigstore-attachments: true",
        );
        Cosign {
            keys,
            private,
            trust,
        }
    }

    /// Attaches (in place of any before) this key's signature of `image` at `signed`, to the
    /// manifest `at`.
    pub(crate) fn attach(&self, env: &Env, image: &PushedImage, signed: &str, at: &str) {
        let (registry, repository) = (&env.registry, &image.repository);
        attach_cosign_signature(
            registry,
            repository,
            at,
            &image.by_tag,
            signed,
            &self.private,
        )
        .unwrap();
    }
}
