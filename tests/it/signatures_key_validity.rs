//! GPG signatures judged as containers/image judges them with gpgme: the key (and the signing
//! subkey) must be valid when the image is pulled, not only when it signed, and a signature
//! blob must hold exactly one signature. Keys and signatures are made in the past with
//! `gpg --faked-system-time` (skopeo signs through gpgme, so the signing home's gpg.conf fakes
//! the time for it), and `skopeo standalone-verify` (Debian's skopeo 1.9.3, containers/image on
//! gpgme) is the oracle: for every case pivot's verdict must be skopeo's. A refusal is one line
//! naming why, fetches no layer and leaves the sysroot as it was.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::*;
use crate::signatures::{layer_gets, signed_by, trust_args, with_args, Lookaside};
use pivot_testkit::PushedImage;

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// A throwaway GnuPG home whose keys are made at times in the past.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::Builder::new()
            .prefix("pivot-gpg-")
            .tempdir()
            .unwrap();
        Home { dir }
    }

    /// gpg as of `at` (Unix seconds).
    fn gpg(&self, at: u64) -> Command {
        let mut cmd = Command::new("gpg");
        cmd.env("GNUPGHOME", self.dir.path())
            .arg("--faked-system-time")
            .arg(at.to_string());
        cmd
    }

    fn run(&self, mut cmd: Command) -> String {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A new primary key made at `at` (`usage`: `sign` or `cert`; `expiry`: `never`, `2d`…);
    /// its fingerprint.
    fn key(&self, at: u64, name: &str, usage: &str, expiry: &str) -> String {
        let mut cmd = self.gpg(at);
        cmd.args(["--batch", "--status-fd", "1", "--passphrase", ""])
            .arg("--quick-gen-key")
            .arg(format!("{name} <{name}@pivot.test>"))
            .args(["rsa2048", usage, expiry]);
        let status = self.run(cmd);
        status
            .lines()
            .find_map(|l| l.strip_prefix("[GNUPG:] KEY_CREATED P "))
            .map(|l| l.trim().to_string())
            .expect("a fingerprint")
    }

    /// A signing subkey of `primary` made at `at`, expiring after `expiry`; its fingerprint
    /// (what gpgme names as the signer of what it signs).
    fn signing_subkey(&self, at: u64, primary: &str, expiry: &str) -> String {
        let mut cmd = self.gpg(at);
        cmd.args(["--batch", "--status-fd", "1", "--passphrase", ""])
            .args(["--quick-add-key", primary, "rsa2048", "sign", expiry]);
        let status = self.run(cmd);
        status
            .lines()
            .find_map(|l| l.strip_prefix("[GNUPG:] KEY_CREATED S "))
            .map(|l| l.trim().to_string())
            .expect("a fingerprint")
    }

    /// Revokes `key` at `at` with reason `reason` (gpg's menu: 1 compromised, 2 superseded,
    /// 3 no longer used): `gpg --gen-revoke`, then the certificate imported.
    fn revoke(&self, at: u64, key: &str, reason: u8) {
        let certificate = self.dir.path().join("revocation.asc");
        let mut cmd = self.gpg(at);
        cmd.args(["--no-tty", "--command-fd", "0", "--status-fd", "2"])
            .args(["--pinentry-mode", "loopback", "--passphrase", "", "--armor"])
            .arg("--output")
            .arg(&certificate)
            .args(["--gen-revoke", key])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("y\n{reason}\nrevoked by pivot's tests\n\ny\n").as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "gpg --gen-revoke: {out:?}");
        let mut import = self.gpg(at);
        import.args(["--batch", "--import"]).arg(&certificate);
        self.run(import);
    }

    /// Every public key of the home, binary, into `path`.
    fn export(&self, path: &Path) {
        let out = Command::new("gpg")
            .env("GNUPGHOME", self.dir.path())
            .args(["--batch", "--export"])
            .output()
            .unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{out:?}");
        std::fs::write(path, out.stdout).unwrap();
    }

    /// A simple-signing signature of `manifest` naming `identity` by `key`, made at `at` by
    /// `skopeo standalone-sign` (gpgme runs gpg, whose gpg.conf fakes the time).
    fn sign(&self, at: u64, manifest: &Path, identity: &str, key: &str) -> Vec<u8> {
        let conf = self.dir.path().join("gpg.conf");
        std::fs::write(&conf, format!("faked-system-time {at}\n")).unwrap();
        let signature = self.dir.path().join("signature");
        let out = Command::new("skopeo")
            .env("GNUPGHOME", self.dir.path())
            .arg("standalone-sign")
            .arg(manifest)
            .arg(identity)
            .arg(key)
            .arg("--output")
            .arg(&signature)
            .output()
            .unwrap();
        std::fs::remove_file(&conf).unwrap();
        assert!(out.status.success(), "skopeo standalone-sign: {out:?}");
        std::fs::read(signature).unwrap()
    }

    /// `signature`'s payload re-signed at `at` by every one of `keys`, in one message.
    fn sign_by_all(&self, at: u64, signature: &[u8], keys: &[&str]) -> Vec<u8> {
        let dir = self.dir.path();
        std::fs::write(dir.join("one"), signature).unwrap();
        let mut decrypt = self.gpg(at);
        decrypt
            .args(["--batch", "--output"])
            .arg(dir.join("payload"))
            .arg("--decrypt")
            .arg(dir.join("one"));
        self.run(decrypt);
        let mut sign = self.gpg(at);
        sign.args(["--batch", "--passphrase", "", "--pinentry-mode", "loopback"]);
        for key in keys {
            sign.args(["--local-user", key]);
        }
        sign.arg("--output")
            .arg(dir.join("many"))
            .arg("--sign")
            .arg(dir.join("payload"));
        self.run(sign);
        std::fs::read(dir.join("many")).unwrap()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The image's manifest, as the registry serves it, in a file.
fn manifest_file(env: &Env, image: &PushedImage) -> PathBuf {
    let path = env.dir().join("manifest.json");
    std::fs::write(&path, raw_manifest(&image.by_digest)).unwrap();
    path
}

/// skopeo's verdict (containers/image on gpgme) on `signature`, the keys of `keyring`
/// trusted, `key` expected: accepted, or its error.
fn skopeo_verdict(
    manifest: &Path,
    identity: &str,
    key: &str,
    keyring: &Path,
    signature: &[u8],
) -> Result<(), String> {
    let home = Home::new();
    let mut import = Command::new("gpg");
    import
        .env("GNUPGHOME", home.dir.path())
        .args(["--batch", "--import"])
        .arg(keyring);
    home.run(import);
    let file = home.dir.path().join("signature");
    std::fs::write(&file, signature).unwrap();
    let out = Command::new("skopeo")
        .env("GNUPGHOME", home.dir.path())
        .arg("standalone-verify")
        .arg(manifest)
        .arg(identity)
        .arg(key)
        .arg(&file)
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(()),
        false => Err(stderr(&out)),
    }
}

/// One case: the key file the policy trusts, the fingerprint skopeo expects (of the signing
/// key: a subkey's own, as gpgme reports it), the signature,
/// what skopeo's refusal says (None: it accepts) and what pivot's refusal must say.
struct Case {
    name: &'static str,
    keyring: PathBuf,
    key: String,
    signature: Vec<u8>,
    skopeo_says: Option<&'static str>,
    pivot_says: &'static [&'static str],
}

#[test]
fn keys_expired_or_revoked_since_they_signed_and_blobs_of_two_signatures_are_refused_as_skopeo_refuses_them(
) {
    let env = Env::new();
    let image = env.push_v2();
    let manifest = manifest_file(&env, &image);
    let identity = image.by_tag.clone();
    // Keys made a month ago; signatures an hour after.
    let made = now() - 30 * DAY;
    let signed = made + HOUR;
    let mut cases = Vec::new();
    let mut case = |name: &'static str,
                    home: &Home,
                    key: String,
                    signature: Vec<u8>,
                    skopeo_says,
                    pivot_says| {
        let keyring = env.dir().join(format!("{name}.gpg"));
        home.export(&keyring);
        cases.push(Case {
            name,
            keyring,
            key,
            signature,
            skopeo_says,
            pivot_says,
        });
    };

    // A key that expired two days after it signed.
    let home = Home::new();
    let key = home.key(made, "expired", "sign", "2d");
    let signature = home.sign(signed, &manifest, &identity, &key);
    let says: &[&str] = &["expired on", "a key must be valid when the image is pulled"];
    case(
        "expired-key",
        &home,
        key,
        signature,
        Some("Invalid GPG signature"),
        says,
    );

    // Keys revoked after they signed: as superseded (a soft revocation, reason 2) and as
    // compromised (a hard one, reason 1).
    let revoked: [(&str, &str, u8, &'static [&'static str]); 2] = [
        (
            "soft-revoked-key",
            "superseded",
            2,
            &["was revoked on", "Key is superseded"],
        ),
        (
            "hard-revoked-key",
            "compromised",
            1,
            &["was revoked on", "Key material has been compromised"],
        ),
    ];
    for (name, uid, reason, says) in revoked {
        let home = Home::new();
        let key = home.key(made, uid, "sign", "never");
        let signature = home.sign(signed, &manifest, &identity, &key);
        home.revoke(signed + HOUR, &key, reason);
        case(
            name,
            &home,
            key,
            signature,
            Some("Invalid GPG signature"),
            says,
        );
    }

    // A primary key valid forever whose signing subkey expired two days after it signed.
    let home = Home::new();
    let key = home.key(made, "subkey", "cert", "never");
    let subkey = home.signing_subkey(made, &key, "2d");
    let signature = home.sign(signed, &manifest, &identity, &key);
    let says: &[&str] = &["has a signing subkey", "expired on"];
    case(
        "expired-subkey",
        &home,
        subkey,
        signature,
        Some("Invalid GPG signature"),
        says,
    );

    // Two trusted keys, both valid, signing one message.
    let home = Home::new();
    let first = home.key(made, "first", "sign", "never");
    let second = home.key(made, "second", "sign", "never");
    let one = home.sign(signed, &manifest, &identity, &first);
    let signature = home.sign_by_all(signed, &one, &[&first, &second]);
    let says: &[&str] = &["holds 2 signatures, more than one"];
    case(
        "two-signatures",
        &home,
        first,
        signature,
        Some("signature count 2"),
        says,
    );

    // Still accepted: a valid key, and a valid signing subkey, that signed a month ago.
    let home = Home::new();
    let key = home.key(made, "valid", "sign", "never");
    let signature = home.sign(signed, &manifest, &identity, &key);
    case("valid-key", &home, key, signature, None, &[]);
    let home = Home::new();
    let key = home.key(made, "valid-subkey", "cert", "never");
    let subkey = home.signing_subkey(made, &key, "never");
    let signature = home.sign(signed, &manifest, &identity, &key);
    case("valid-subkey", &home, subkey, signature, None, &[]);

    let store = Lookaside::new();
    let mut wrong = Vec::new();
    for case in cases {
        let name = case.name;
        let skopeo = skopeo_verdict(
            &manifest,
            &identity,
            &case.key,
            &case.keyring,
            &case.signature,
        );
        // skopeo refuses for the reason the case is about, not another.
        match (&skopeo, case.skopeo_says) {
            (Ok(()), None) => {}
            (Err(why), Some(says)) => assert!(why.contains(says), "{name}: skopeo says {why}"),
            (verdict, _) => panic!("{name}: skopeo's verdict is {verdict:?}"),
        }
        store.put(&image, &[case.signature]);
        let trust = trust_args(&env, name, &signed_by(&case.keyring), &store.url());
        let args = with_args(&trust, &[&image.by_tag]);
        let before = env.sysroot.snapshot().unwrap();
        let gets = layer_gets(&env, &image);
        let out = env.pivot(&args);
        let err = stderr(&out);
        match (skopeo.is_ok(), out.status.success()) {
            (true, true) => {
                assert_eq!(env.deployed_images()[0], image.commit, "{name}");
                env.undeploy(0);
                continue;
            }
            (true, false) => {
                wrong.push(format!("{name}: skopeo accepts, pivot refuses: {err}"));
                continue;
            }
            (false, true) => {
                wrong.push(format!("{name}: skopeo refuses, pivot accepts"));
                env.undeploy(0);
                continue;
            }
            (false, false) => {}
        }
        let mut needles = case.pivot_says.to_vec();
        needles.push("is refused by the signature policy");
        let lines: Vec<_> = err
            .lines()
            .filter(|l| l.contains("is refused by the signature policy"))
            .collect();
        if lines.len() != 1 || !needles.iter().all(|n| lines[0].contains(n)) {
            wrong.push(format!(
                "{name}: the refusal is not one line naming {needles:?}: {err}"
            ));
        }
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert_eq!(
            layer_gets(&env, &image),
            gets,
            "{name}: a layer was fetched"
        );
        assert_eq!(
            env.sysroot.snapshot().unwrap(),
            before,
            "{name}: the sysroot changed"
        );
    }
    assert!(
        wrong.is_empty(),
        "pivot is not skopeo:\n{}",
        wrong.join("\n")
    );
}
