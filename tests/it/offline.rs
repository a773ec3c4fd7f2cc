//! Offline image sources: `oci:DIR[:tag]` and `oci-archive:FILE[:tag]`, made from the registry's
//! image by skopeo (an independent writer of both), deployed with the registry stopped, and
//! verified like a registry's: a changed byte or a wrong size is refused and changes nothing.

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use pivot_testkit::PushedImage;

/// Copies `image` out of the registry with skopeo to `dest` (`oci:…` or `oci-archive:…`).
fn skopeo_copy(image: &PushedImage, dest: &str) {
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{}", image.by_tag))
        .arg(dest)
        .output()
        .expect("running skopeo");
    assert!(
        out.status.success(),
        "skopeo copy to {dest} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// v2 copied into an `oci:` directory as `:v2`, and the registry stopped.
fn v2_in_a_layout(env: &mut Env) -> (PushedImage, tempfile::TempDir, PathBuf) {
    let v2 = env.push_v2();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("os");
    skopeo_copy(&v2, &format!("oci:{}:v2", dir.display()));
    env.registry.stop();
    (v2, tmp, dir)
}

#[test]
fn an_oci_directory_deploys_without_a_registry() {
    let mut env = Env::new();
    let (v2, _tmp, dir) = v2_in_a_layout(&mut env);
    // skopeo kept the manifest as the registry served it: the same digest names the image.
    assert_eq!(
        layout_index(&dir)["manifests"][0]["digest"],
        v2.digest.as_str()
    );

    let spec = format!("oci:{}:v2", dir.display());
    let out = env.pivot(&[&spec]);
    assert_success(&out);
    let status = env.status_json();
    let new = &status["deployments"][0];
    assert_eq!(new["checksum"], v2.commit.as_str(), "{status:#}");
    assert_eq!(new["version"], "2");
    let pinned = format!("oci:{}@{}", dir.display(), v2.digest);
    assert_eq!(new["image"], pinned.as_str());
    assert_eq!(
        read(&env.deployment(0).join("usr/share/pivot/v2-marker")),
        "v2\n"
    );
    let origin = origin_of(&env, &v2.commit);
    assert!(
        origin.contains(&format!("custom-url=pivot://{pinned}\n")),
        "{origin}"
    );
    // Nothing was spooled: the layout is the copy on disk.
    assert!(!env.downloads().exists());
    assert_fsck_clean(&env);

    // The same image again, by tag or by the digest status shows: nothing to do.
    for again in [spec.as_str(), pinned.as_str()] {
        let before = env.sysroot.snapshot().unwrap();
        let out = env.pivot(&["--unchanged-exit-77", again]);
        assert_eq!(out.status.code(), Some(77), "{again}: {}", stderr(&out));
        assert_eq!(env.sysroot.snapshot().unwrap(), before);
    }
}

#[test]
fn an_oci_archive_deploys_in_place() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("os.tar");
    skopeo_copy(&v2, &format!("oci-archive:{}:v2", archive.display()));
    env.registry.stop();
    let before = std::fs::read(&archive).unwrap();

    // One image in the archive: no tag needed.
    let out = env.pivot(&[&format!("oci-archive:{}", archive.display())]);
    assert_success(&out);
    let status = env.status_json();
    assert_eq!(status["deployments"][0]["checksum"], v2.commit.as_str());
    assert_eq!(
        status["deployments"][0]["image"],
        format!("oci-archive:{}@{}", archive.display(), v2.digest).as_str()
    );
    assert_eq!(
        std::fs::read(&archive).unwrap(),
        before,
        "the archive changed"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "the archive was unpacked beside itself");
    assert_fsck_clean(&env);
}

#[test]
fn a_changed_byte_in_a_layout_blob_is_refused_and_changes_nothing() {
    let mut env = Env::new();
    let (v2, _tmp, dir) = v2_in_a_layout(&mut env);
    let layer = layout_blob(&dir, &v2.layer_digests[0]);
    let mut bytes = std::fs::read(&layer).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&layer, &bytes).unwrap();
    let spec = format!("oci:{}:v2", dir.display());
    assert_refused(&env, &[&spec], &["digest mismatch", &v2.layer_digests[0]]);

    // A blob of another size than its descriptor says is refused before it is read.
    bytes.truncate(middle);
    std::fs::write(&layer, &bytes).unwrap();
    assert_refused(&env, &[&spec], &["its descriptor declares"]);

    // A manifest that does not hash to its index entry's digest (of the same size).
    let manifest = layout_blob(&dir, &v2.digest);
    let text = read(&manifest).replacen("schemaVersion", "schemaversion", 1);
    std::fs::write(&manifest, text).unwrap();
    assert_refused(&env, &[&spec], &["digest mismatch", &v2.digest]);
}

#[test]
fn layout_mistakes_are_named() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    let v3 = env.push("v3", &pivot_testkit::ImageSpec::new(fixture("os-v2"), "3"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("os");
    skopeo_copy(&v2, &format!("oci:{}:v2", dir.display()));
    skopeo_copy(&v3, &format!("oci:{}:v3", dir.display()));
    let archive = tmp.path().join("os.tar");
    skopeo_copy(&v2, &format!("oci-archive:{}:v2", archive.display()));
    env.registry.stop();
    let d = dir.display();

    // Two images and no tag: which one?
    assert_refused(
        &env,
        &[&format!("oci:{d}")],
        &[
            "holds 2 images; name one with :TAG or @DIGEST",
            "v2 (",
            "v3 (",
        ],
    );
    assert_refused(
        &env,
        &[&format!("oci:{d}:v4")],
        &[&format!("oci:{d}:v4 is not in oci:{d}"), "v2 (", "v3 ("],
    );
    assert_refused(
        &env,
        &[&format!("oci:{d}/nowhere")],
        &["opening the OCI layout", "nowhere"],
    );
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    assert_refused(
        &env,
        &[&format!("oci:{}", plain.display())],
        &["is not an OCI image layout", "oci-layout"],
    );
    assert_refused(
        &env,
        &[&format!("oci:{}", archive.display())],
        &["is not a directory", "oci-archive:"],
    );
    let gz = tmp.path().join("os.tar.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -c {} > {}", archive.display(), gz.display()))
        .status()
        .unwrap();
    assert!(status.success());
    assert_refused(
        &env,
        &[&format!("oci-archive:{}", gz.display())],
        &["gzip-compressed", "plain tar"],
    );
    assert_refused(
        &env,
        &[&format!("oci-archive:{}", dir.join("index.json").display())],
        &["tar archive"],
    );
}
