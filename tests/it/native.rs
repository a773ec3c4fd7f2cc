//! ostree-native container images (CoreOS, RHCOS, bootc), written by an independent producer:
//! ostree-rs-ext's own encapsulation (`tests/ext-fixtures`, built here), pushed to the test
//! registry by skopeo, and deployed by pivot into a throwaway sysroot.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use ostree::gio;
use pivot_testkit::{
    encapsulate as encapsulate_with, ext_fixtures_tool, skopeo_push, Compression, RawImage,
    RawKind, RawLayer, RawTar,
};

/// The images ext-fixtures wrote from `os-v2`, pushed as `pivot/native:<name>`.
pub(crate) struct NativeImages {
    commit: String,
    /// name (`encapsulated`, `chunked`, `derived`) → manifest digest as pushed
    digests: BTreeMap<String, String>,
}

impl NativeImages {
    pub(crate) fn pullspec(&self, env: &Env, name: &str) -> String {
        format!("{}/pivot/native:{name}", env.registry.host())
    }

    pub(crate) fn pinned(&self, env: &Env, name: &str) -> String {
        format!(
            "{}/pivot/native@{}",
            env.registry.host(),
            self.digests[name]
        )
    }
}

/// `oci:` directories written by ostree-rs-ext from `os-v2` (version 2).
pub(crate) struct OciDirs {
    pub(crate) commit: String,
    /// name → manifest digest, as ext-fixtures printed them
    digests: BTreeMap<String, String>,
    dir: tempfile::TempDir,
}

impl OciDirs {
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("oci").join(name)
    }
}

/// Commits `os-v2` (version 2) and encapsulates it with ostree-rs-ext.
fn encapsulate_v2() -> OciDirs {
    encapsulate(&fixture("os-v2"), false, None)
}

/// Commits `tree` (version 2) and encapsulates it with ostree-rs-ext (a `release` build of it),
/// as all three images or `only` one.
fn encapsulate(tree: &pivot_testkit::Tree, release: bool, only: Option<&str>) -> OciDirs {
    encapsulate_signed(tree, release, only, None)
}

/// [`encapsulate`], the commit signed by `signer` first.
pub(crate) fn encapsulate_signed(
    tree: &pivot_testkit::Tree,
    release: bool,
    only: Option<&str>,
    signer: Option<&pivot_testkit::CommitSigner>,
) -> OciDirs {
    let dir = tempfile::tempdir().unwrap();
    let repo_path = dir.path().join("repo");
    let repo = ostree::Repo::new_for_path(&repo_path);
    repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE)
        .unwrap();
    let commit = pivot_testkit::commit_tree(&repo, tree, Some("os"), "2").unwrap();
    if let Some(signer) = signer {
        pivot_testkit::sign_commit(&repo_path, &commit, signer).unwrap();
    }

    let tool = ext_fixtures_tool(release).unwrap();
    let digests = encapsulate_with(&tool, &repo_path, "os", &dir.path().join("oci"), only)
        .unwrap()
        .into_iter()
        .collect();
    OciDirs {
        commit,
        digests,
        dir,
    }
}

/// Pushes the `oci:` directories to `env`'s registry with skopeo, as `pivot/native:<name>`.
pub(crate) fn push_native_images(env: &Env, oci: &OciDirs) -> NativeImages {
    let digests = oci
        .digests
        .keys()
        .map(|name| {
            let dest = format!("{}/pivot/native:{name}", env.registry.host());
            (name.clone(), skopeo_push(&oci.path(name), &dest).unwrap())
        })
        .collect();
    NativeImages {
        commit: oci.commit.clone(),
        digests,
    }
}

/// Deploys `name` and checks the deployment is v2's commit, with v2's files and a native origin.
fn assert_deploys(env: &Env, images: &NativeImages, name: &str) {
    let out = env.pivot(&[&images.pullspec(env, name)]);
    assert_success(&out);
    let status = env.status_json();
    let new = &status["deployments"][0];
    let deployed = new["checksum"].as_str().unwrap();
    // The image's merge commit (see crate::store), made from its commit.
    assert_eq!(env.image_commit(deployed), images.commit, "{status:#}");
    assert_ne!(deployed, images.commit, "{status:#}");
    assert_eq!(new["version"], "2");
    assert_eq!(
        new["image"],
        format!(
            "{}/pivot/native@{}",
            env.registry.host(),
            images.digests[name]
        )
        .as_str()
    );
    let deployment = env.deployment(0);
    assert_eq!(read(&deployment.join("usr/share/pivot/v2-marker")), "v2\n");
    assert!(read(&deployment.join("usr/lib/os-release")).contains("VERSION=\"2\""));
    let origin = origin_of(env, deployed);
    assert!(
        origin.contains(&format!(
            "container-image-reference=ostree-unverified-registry:{}\n",
            images.pinned(env, name)
        )),
        "{origin}"
    );
    assert!(origin.contains("[pivot]"), "{origin}");
    assert_fsck_clean(env);
}

#[test]
fn native_images_deploy_encapsulated_chunked_and_derived() {
    // One registry and one set of images (building and running ostree-rs-ext is the slow part);
    // each case on its own sysroot.
    let oci = encapsulate_v2();
    let env = Env::new();
    let images = push_native_images(&env, &oci);
    assert_eq!(
        images.digests.keys().collect::<Vec<_>>(),
        ["chunked", "derived", "encapsulated"]
    );

    // Encapsulated (one layer); pivoting again to it is a no-op.
    assert_deploys(&env, &images, "encapsulated");
    let before = env.sysroot.snapshot().unwrap();
    let out = env.pivot(&[&images.pullspec(&env, "encapsulated")]);
    assert_success(&out);
    assert_eq!(
        env.sysroot.snapshot().unwrap(),
        before,
        "a second pivot changed the sysroot"
    );
    let out = env.subcommand("status", &[]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&images.pinned(&env, "encapsulated")),
        "{text}"
    );

    // Chunked (commit layer + component layers up to ostree.final-diffid), on a fresh sysroot.
    let chunked = Env::new();
    let images = push_native_images(&chunked, &oci);
    let layers = manifest_layers(&chunked, "chunked");
    assert!(layers > 2, "the chunked image has {layers} layers");
    assert_deploys(&chunked, &images, "chunked");

    // Derived (a container build's layer on top): applied as a new commit on v2's, with the
    // whiteout honoured and etc/ carried as usr/etc/.
    let derived = Env::new();
    let images = push_native_images(&derived, &oci);
    let out = derived.pivot(&["--check", &images.pullspec(&derived, "derived")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(&format!(
            "made at import from {} and the derived layers",
            images.commit
        )),
        "{report}"
    );
    let out = derived.pivot(&[&images.pullspec(&derived, "derived")]);
    assert_success(&out);
    let status = derived.status_json();
    let new = &status["deployments"][0];
    let commit = new["checksum"].as_str().unwrap().to_string();
    assert_ne!(commit, images.commit, "the derived layer was not applied");
    assert_eq!(new["version"], "2");
    assert_eq!(new["image"], images.pinned(&derived, "derived").as_str());
    let deployment = derived.deployment(0);
    assert_eq!(
        read(&deployment.join("usr/share/derived/added")),
        "derived\n"
    );
    assert!(
        !deployment.join("usr/share/pivot/v2-marker").exists(),
        "the whiteout was not honoured"
    );
    assert!(read(&deployment.join("usr/lib/os-release")).contains("VERSION=\"2\""));
    assert_eq!(
        read(&deployment.join("usr/etc/derived.conf")),
        "derived=yes\n"
    );
    assert_eq!(read(&deployment.join("etc/derived.conf")), "derived=yes\n");
    let origin = origin_of(&derived, &commit);
    assert!(
        origin.contains(&format!(
            "container-image-reference=ostree-unverified-registry:{}\n",
            images.pinned(&derived, "derived")
        )),
        "{origin}"
    );
    assert_fsck_clean(&derived);
    // The same image again is a no-op, and a pivot of it elsewhere makes the same commit.
    let before = derived.sysroot.snapshot().unwrap();
    assert_success(&derived.pivot(&[&images.pullspec(&derived, "derived")]));
    assert_eq!(derived.sysroot.snapshot().unwrap(), before);
    let again = Env::new();
    let images = push_native_images(&again, &oci);
    assert_success(&again.pivot(&[&images.pullspec(&again, "derived")]));
    assert_eq!(
        again.status_json()["deployments"][0]["checksum"],
        commit.as_str()
    );
}

#[test]
fn native_images_deploy_from_oci_layouts_and_downloads_keep_their_format() {
    let oci = encapsulate_v2();
    // The `oci:` directory ostree-rs-ext wrote, with no registry involved.
    let env = Env::new();
    let path = oci.path("chunked");
    let out = env.pivot(&[&format!("oci:{}", path.display())]);
    assert_success(&out);
    let status = env.status_json();
    let new = &status["deployments"][0];
    let deployed = new["checksum"].as_str().unwrap().to_string();
    assert_eq!(env.image_commit(&deployed), oci.commit, "{status:#}");
    assert_eq!(
        new["image"],
        format!("oci:{}@{}", path.display(), oci.digests["chunked"]).as_str()
    );
    let origin = origin_of(&env, &deployed);
    assert!(
        origin.contains(&format!(
            "container-image-reference=ostree-unverified-image:oci:{}\n",
            path.display()
        )),
        "{origin}"
    );
    assert_eq!(
        read(&env.deployment(0).join("usr/share/pivot/v2-marker")),
        "v2\n"
    );
    assert_fsck_clean(&env);

    // A native download deployed later, without the registry, gets the native origin.
    let mut env = Env::new();
    let images = push_native_images(&env, &oci);
    let out = env.pivot(&["--download-only", &images.pullspec(&env, "encapsulated")]);
    assert_success(&out);
    let pinned = images.pinned(&env, "encapsulated");
    env.registry.stop();
    assert_success(&env.pivot(&[&pinned]));
    let origin = origin_of(&env, &env.deployed()[0]);
    assert!(
        origin.contains(&format!(
            "container-image-reference=ostree-unverified-registry:{pinned}\n"
        )),
        "{origin}"
    );
    assert!(!origin.contains("custom-url"), "{origin}");
}

/// The one layer of the `encapsulated` oci dir, as raw tar members.
fn encapsulated_layer(oci: &OciDirs) -> RawTar {
    let dir = oci.dir.path().join("oci/encapsulated");
    let manifest = layout_manifest(&dir);
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let gz = std::fs::File::open(layout_blob(&dir, layers[0]["digest"].as_str().unwrap())).unwrap();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut raw = RawTar::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path_bytes().into_owned();
        let mode = entry.header().mode().unwrap();
        assert_eq!(
            entry.header().uid().unwrap(),
            0,
            "the fixture's files are root's"
        );
        let link = || String::from_utf8(entry.link_name_bytes().unwrap().into_owned()).unwrap();
        let kind = match entry.header().entry_type() {
            tar::EntryType::Directory => RawKind::Dir,
            tar::EntryType::Symlink => RawKind::Symlink(link()),
            tar::EntryType::Link => RawKind::HardLink(link()),
            tar::EntryType::Regular => {
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                RawKind::File(data)
            }
            other => panic!("unexpected member type {other:?}"),
        };
        raw = raw.entry(name, mode, kind);
    }
    raw
}

/// The member of `layer` holding the content object of usr/share/pivot/v2-marker ("v2\n", which
/// the node does not have), and that object's checksum.
fn v2_marker_object(layer: &RawTar) -> (Vec<u8>, String) {
    let object = layer
        .entries
        .iter()
        .find(|e| {
            e.name.starts_with(b"sysroot/ostree/repo/objects/")
                && e.name.ends_with(b".file")
                && matches!(&e.kind, RawKind::File(d) if d == b"v2\n")
        })
        .expect("the v2-marker object");
    let name = String::from_utf8_lossy(&object.name).into_owned();
    let checksum = name
        .trim_start_matches("sysroot/ostree/repo/objects/")
        .trim_end_matches(".file")
        .replace('/', "");
    (object.name.clone(), checksum)
}

/// Pushes `layer` as an ostree-native image of `oci`'s commit with that one layer, as `tag`.
fn push_encapsulated(env: &Env, oci: &OciDirs, layer: &RawTar, tag: &str) -> String {
    let mut image = RawImage::new(vec![RawLayer::new(layer, Compression::Gzip).unwrap()], None);
    image.config = RawImage::config_with_labels(serde_json::json!({
        "ostree.commit": oci.commit,
        "containers.bootc": "1",
    }));
    image
        .push(&env.registry, "pivot/native", tag)
        .unwrap()
        .by_tag
}

#[test]
fn a_native_object_whose_content_does_not_match_its_name_is_refused() {
    let oci = encapsulate_v2();
    let mut layer = encapsulated_layer(&oci);
    let (object, checksum) = v2_marker_object(&layer);
    let entry = layer.entries.iter_mut().find(|e| e.name == object).unwrap();
    entry.kind = RawKind::File(b"v3\n".to_vec());

    let env = Env::new();
    let image = push_encapsulated(&env, &oci, &layer, "corrupt");
    assert_refused(
        &env,
        &[&image],
        &[&checksum, "its content does not match its name"],
    );
}

/// A content object the commit names that no layer carries: pivot does not look up again what
/// its layers brought, but it still finds this one missing, and deploys nothing.
#[test]
fn a_native_image_whose_layers_lack_an_object_of_its_commit_is_refused_naming_it() {
    let oci = encapsulate_v2();
    let mut layer = encapsulated_layer(&oci);
    // The object goes with the link to its xattrs before it and the tree's hard links to it.
    let (object, checksum) = v2_marker_object(&layer);
    let xattrs_link = [&object[..], b"-xattrs-link"].concat();
    layer.entries.retain(|e| {
        e.name != object
            && e.name != xattrs_link
            && !matches!(&e.kind, RawKind::HardLink(l) if l.as_bytes() == object)
    });

    let env = Env::new();
    let image = push_encapsulated(&env, &oci, &layer, "incomplete");
    let expected = format!(
        "commit {} is incomplete: file object {checksum} is missing",
        oci.commit
    );
    assert_refused(&env, &[&image], &[&expected]);
}

/// The config of an ostree-native image of `commit` whose layers have `diff_ids`, its own ending
/// at `final_diffid`, with a history entry per layer as ostree-rs-ext's importer requires.
fn native_config(commit: &str, final_diffid: &str, diff_ids: &[String]) -> Vec<u8> {
    let history: Vec<_> = diff_ids
        .iter()
        .map(|d| serde_json::json!({ "created_by": format!("layer {d}") }))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Labels": {
            "ostree.commit": commit,
            "ostree.final-diffid": final_diffid,
            "containers.bootc": "1",
        } },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "history": history,
    }))
    .unwrap()
}

/// An image whose `ostree.final-diffid` names two layers: the commit's layer, then the same empty
/// chunk twice, as ostree-rs-ext 0.15.3's chunking writes one when a component it is given owns
/// no object (its packing leaves a chunk empty beside the empty last one). Which layers are the
/// image's own is ambiguous: ostree-rs-ext's importer refuses it, and so does pivot, in one line,
/// the sysroot untouched.
#[test]
fn an_image_naming_two_layers_by_its_final_diffid_is_refused_as_ostree_rs_ext_refuses_it() {
    let oci = encapsulate(&fixture("os-v2"), false, Some("encapsulated"));
    // Uncompressed: a layer's digest is its diffid.
    let layers = vec![
        RawLayer::new(&encapsulated_layer(&oci), Compression::None).unwrap(),
        RawLayer::new(&RawTar::new(), Compression::None).unwrap(),
        RawLayer::new(&RawTar::new(), Compression::None).unwrap(),
    ];
    let diff_ids: Vec<String> = layers.iter().map(RawLayer::digest).collect();
    let mut image = RawImage::new(layers, None);
    image.config = native_config(&oci.commit, &diff_ids[2], &diff_ids);

    let env = Env::new();
    let pushed = image
        .push(&env.registry, "pivot/native", "two-finals")
        .unwrap();
    assert_refused(
        &env,
        &[&pushed.by_tag],
        &["ostree.final-diffid", "names 2 layers", "ambiguous"],
    );
    // The peer's own importer, into a repo of its own.
    let scratch = tempfile::tempdir().unwrap();
    let repo = ostree::Repo::new_for_path(scratch.path());
    repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE)
        .unwrap();
    let tool = ext_fixtures_tool(false).unwrap();
    let refused = pivot_testkit::ext_judge(
        &tool,
        &[
            "import",
            scratch.path().to_str().unwrap(),
            &format!("docker://{}", pushed.by_tag),
        ],
        &env.registries_conf,
    )
    .unwrap_err();
    assert!(
        format!("{refused:#}").contains("Multiple entries"),
        "{refused:#}"
    );
}

/// A derived image whose build made the same layer twice (two build steps with the same
/// result; OCI allows it): both are applied. The two are imported one after the other, the
/// second from the first's download spool when there is one (see `largest_first` in
/// `src/run/job.rs`).
#[test]
fn a_derived_layer_that_appears_twice_is_applied_and_pivots() {
    let oci = encapsulate(&fixture("os-v2"), false, Some("encapsulated"));
    let commit_layer = RawLayer::new(&encapsulated_layer(&oci), Compression::None).unwrap();
    // About 4 MiB of layer: the image's largest, so that both copies would start together.
    let data = noise(8 << 20);
    let tar = RawTar::new()
        .dir("usr/")
        .dir("usr/share/")
        .dir("usr/share/twice/")
        .file("usr/share/twice/data", 0o644, &data);
    let twice = RawLayer::new(&tar, Compression::Gzip).unwrap();
    let diff_ids = [
        commit_layer.digest(),
        pivot_testkit::sha256_digest(&tar.to_tar().unwrap()),
    ];
    let (twice_digest, twice_size) = (twice.digest(), twice.blob.len() as u64);
    let mut image = RawImage::new(vec![commit_layer, twice.clone(), twice], None);
    let all = [&diff_ids[..], &diff_ids[1..]].concat();
    image.config = native_config(&oci.commit, &diff_ids[0], &all);

    // With download spools the second copy replays the first's; without, it is fetched again.
    for (args, downloads) in [(&[][..], 1), (&["--partial-downloads=false"][..], 2)] {
        let mut env = Env::new();
        image.push(&env.registry, "pivot/native", "twice").unwrap();
        let proxy = pivot_testkit::FaultProxy::start(&env.registry.host()).unwrap();
        insecure_via(&mut env, &proxy);
        let pullspec = format!("{}/pivot/native:twice", proxy.host());
        let out = env.pivot(&[args, &[pullspec.as_str()]].concat());
        assert_success(&out);
        let deployment = env.deployment(0);
        assert_eq!(read(&deployment.join("usr/share/twice/data")), data);
        assert_fsck_clean(&env);
        assert_eq!(
            proxy.body_bytes_sent(&twice_digest),
            downloads * twice_size,
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// The layer count of `pivot/native:<name>` in the registry.
fn manifest_layers(env: &Env, name: &str) -> usize {
    let raw = raw_manifest(&format!("{}/pivot/native:{name}", env.registry.host()));
    let manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    manifest["layers"].as_array().unwrap().len()
}

/// Benchmark (`cargo test --release --test it native:: -- --ignored --nocapture`): the import of a
/// chunked ostree-native image of about 100 MB, by pivot (`--download-only`: pull and import,
/// no deployment) and by ostree-rs-ext's `ImageImporter` (what rpm-ostree and bootc run, through
/// skopeo's image proxy), each into a fresh sysroot's repo, alternately.
#[test]
#[ignore]
fn bench_native_import_pivot_vs_ostree_ext() {
    let mut tree = fixture("os-v2");
    for d in 0..30 {
        for f in 0..50 {
            let text = format!("{d}/{f}\n{}", noise(64 << 10));
            tree = tree.with_file(&format!("usr/share/bench/d{d:02}/f{f:02}"), 0o644, &text);
        }
    }
    let oci = encapsulate(&tree, true, Some("chunked"));
    let (mut pivot_times, mut ext_times) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let env = Env::new();
        push_native_images(&env, &oci);
        let pullspec = format!("{}/pivot/native:chunked", env.registry.host());
        let start = std::time::Instant::now();
        assert_success(&env.pivot(&["--download-only", &pullspec]));
        pivot_times.push(start.elapsed().as_secs_f64());

        let env = Env::new();
        push_native_images(&env, &oci);
        let start = std::time::Instant::now();
        let out = Command::new(ext_fixtures_tool(true).unwrap())
            .arg("pull")
            .arg(env.sysroot.repo_path())
            .arg(format!("{}/pivot/native:chunked", env.registry.host()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ext_times.push(start.elapsed().as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (p, e) = (median(&mut pivot_times), median(&mut ext_times));
    println!(
        "native import (chunked, ~100 MB): pivot {p:.2} s, ostree-ext {e:.2} s (pivot/ostree-ext {:.2}); all: pivot {pivot_times:?}, ostree-ext {ext_times:?}",
        p / e
    );
}
