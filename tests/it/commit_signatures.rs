//! OSTree commit signatures (`--ostree-remote NAME`): the commit an image carries must be signed
//! by a key of that remote of the sysroot's repo. Commits are signed by `ostree gpg-sign` with
//! real `gpg` keys; the remote is added by `ostree remote add --gpg-import`, as an admin does.
//! A refusal deploys nothing, leaves the sysroot as it was and counts as a failed attempt.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use crate::native::{encapsulate_signed, push_native_images};
use crate::signatures::{layer_gets, Signer};
use pivot_testkit::{CommitSigner, ImageSpec, PushedImage};

/// How a remote knows its keys.
enum Keys<'a> {
    /// `--gpg-import`: copied into the repo's keyring for the remote.
    Imported(&'a Path),
    /// `gpgkeypath`: read from the file at each verification.
    KeyPath(&'a Path),
    /// `--no-gpg-verify`.
    None,
}

/// `ostree remote add` on the sysroot's repo. The URL is never contacted.
fn add_remote(env: &Env, name: &str, keys: Keys) {
    let mut cmd = Command::new("ostree");
    cmd.arg("remote")
        .arg("add")
        .arg(format!("--repo={}", env.sysroot.repo_path().display()));
    match keys {
        Keys::Imported(key) => cmd.arg(format!("--gpg-import={}", key.display())),
        Keys::KeyPath(key) => cmd.arg(format!("--set=gpgkeypath={}", key.display())),
        Keys::None => cmd.arg("--no-gpg-verify"),
    };
    let out = cmd.args([name, "file:///nonexistent"]).output().unwrap();
    assert!(out.status.success(), "ostree remote add: {out:?}");
}

/// The remote `os`, trusting `signer`'s key.
fn trust_remote(env: &Env, signer: &Signer) {
    let key = env.dir().join("os.asc");
    signer.export(&key, true);
    add_remote(env, "os", Keys::Imported(&key));
}

fn commit_signer(signer: &Signer, tamper: bool) -> CommitSigner {
    CommitSigner {
        gnupg_home: signer.home.path().to_path_buf(),
        key: signer.fingerprint.clone(),
        tamper,
    }
}

/// `os-v2` as `tag`, its commit signed by `signer` (tampered if asked), or unsigned.
fn push_v2(env: &Env, tag: &str, signer: Option<(&Signer, bool)>) -> PushedImage {
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.commit_signer = signer.map(|(s, tamper)| commit_signer(s, tamper));
    env.push(tag, &spec)
}

fn remote_args(image: &PushedImage) -> [&str; 3] {
    ["--ostree-remote", "os", &image.by_tag]
}

#[test]
fn a_commit_signed_by_the_remotes_key_is_deployed_and_recorded_as_such() {
    let env = Env::new();
    let release = Signer::new("release");
    trust_remote(&env, &release);

    // A legacy oscontainer.
    let image = push_v2(&env, "v2-signed", Some((&release, false)));
    assert_success(&env.pivot(&remote_args(&image)));
    assert_eq!(env.deployed_images()[0], image.commit);
    let origin = origin_of(&env, &image.commit);
    assert!(origin.contains("verification=ostree-remote\n"), "{origin}");
    assert!(origin.contains("ostree-remote=os\n"), "{origin}");
    let status = env.status_json();
    assert_eq!(status["deployments"][0]["verification"], "ostree-remote");
    assert_eq!(status["deployments"][0]["ostree_remote"], "os");
    let text = env.subcommand("status", &[]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("Signature: ostree-remote (os)"),
        "{text:?}"
    );

    // An ostree-native image: the origin asks rpm-ostree and bootc to verify its updates by the
    // same remote.
    let native = Env::new();
    trust_remote(&native, &release);
    let signer = commit_signer(&release, false);
    let oci = encapsulate_signed(
        &fixture("os-v2"),
        false,
        Some("encapsulated"),
        Some(&signer),
    );
    let images = push_native_images(&native, &oci);
    let pullspec = images.pullspec(&native, "encapsulated");
    assert_success(&native.pivot(&["--ostree-remote", "os", &pullspec]));
    let deployed = native.deployed()[0].clone();
    assert_eq!(native.image_commit(&deployed), oci.commit);
    let origin = origin_of(&native, &deployed);
    let pinned = images.pinned(&native, "encapsulated");
    assert!(
        origin.contains(&format!(
            "container-image-reference=ostree-remote-image:os:docker://{pinned}\n"
        )),
        "{origin}"
    );
    assert_fsck_clean(&native);

    // The same image from an OCI layout, which carries no container signatures at all; this
    // remote reads its key from a file (gpgkeypath).
    let layout = Env::new();
    let key = layout.dir().join("release.asc");
    release.export(&key, true);
    add_remote(&layout, "os", Keys::KeyPath(&key));
    let path = format!("oci:{}", oci.path("encapsulated").display());
    assert_success(&layout.pivot(&["--ostree-remote", "os", &path]));
    let origin = origin_of(&layout, &layout.deployed()[0]);
    assert!(
        origin.contains(&format!(
            "container-image-reference=ostree-remote-image:os:{path}\n"
        )),
        "{origin}"
    );
}

#[test]
fn unsigned_tampered_and_foreign_commits_are_refused_leaving_the_sysroot_as_it_was() {
    let env = Env::new();
    let release = Signer::new("release");
    let stranger = Signer::new("stranger");
    trust_remote(&env, &release);
    let cases = [
        (push_v2(&env, "v2-unsigned", None), "carries no signatures"),
        (
            push_v2(&env, "v2-tampered", Some((&release, true))),
            "BAD signature from \"release <release@pivot.test>\"",
        ),
        (
            push_v2(&env, "v2-stranger", Some((&stranger, false))),
            "public key not found",
        ),
    ];
    for (image, why) in &cases {
        assert_refused(
            &env,
            &remote_args(image),
            &[
                &format!(
                    "commit {} is not signed by the ostree remote os: ",
                    image.commit
                ),
                why,
            ],
        );
        assert!(!env.has_commit(&image.commit), "{} was kept", image.tag);
        let status = env.status_json();
        assert_eq!(status["pivot"][STATEROOT]["last"]["outcome"], "failed");
        assert_eq!(status["deployments"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn a_remote_that_is_missing_or_verifies_nothing_is_refused_before_any_layer() {
    let env = Env::new();
    let release = Signer::new("release");
    let image = push_v2(&env, "v2-signed", Some((&release, false)));
    assert_refused(
        &env,
        &remote_args(&image),
        &["--ostree-remote os", "has no remote os"],
    );
    add_remote(&env, "os", Keys::None);
    assert_refused(
        &env,
        &remote_args(&image),
        &["--ostree-remote os", "verifies nothing"],
    );
    assert_eq!(layer_gets(&env, &image), 0);
}

#[test]
fn a_commit_the_repo_already_has_is_verified_before_it_is_deployed() {
    let env = Env::new();
    let release = Signer::new("release");
    trust_remote(&env, &release);
    let image = push_v2(&env, "v2-unsigned", None);
    // Pulled before without the remote (kept, then its deployment removed).
    assert_success(&env.pivot(&["--keep", &image.by_tag]));
    env.undeploy(0);
    let fetched = layer_gets(&env, &image);
    assert_refused(&env, &remote_args(&image), &["carries no signatures"]);
    assert_eq!(
        layer_gets(&env, &image),
        fetched,
        "a layer was fetched again"
    );
}

/// An image that adds derived layers on top of a signed commit deploys a tree the remote never
/// signed: `--ostree-remote` refuses it in one line, before any layer, leaving the sysroot as it
/// was; the same image's signed base (the `encapsulated` image) still deploys.
#[test]
fn derived_layers_on_a_signed_commit_are_refused_under_the_remote() {
    let env = Env::new();
    let release = Signer::new("release");
    trust_remote(&env, &release);
    let signer = commit_signer(&release, false);
    let oci = encapsulate_signed(&fixture("os-v2"), false, None, Some(&signer));
    let images = push_native_images(&env, &oci);
    let derived = images.pullspec(&env, "derived");
    let gets = env.registry.count_requests("GET", "/blobs/");
    assert_refused(
        &env,
        &["--ostree-remote", "os", &derived],
        &[
            "--ostree-remote os: ",
            "derived layer(s) on top of its OSTree commit",
            "would not be the one os signed",
        ],
    );
    assert_eq!(
        env.registry.count_requests("GET", "/blobs/") - gets,
        1,
        "only the image config was fetched"
    );
    assert_success(&env.pivot(&[
        "--ostree-remote",
        "os",
        &images.pullspec(&env, "encapsulated"),
    ]));
}
