//! The hand-over: once pivot has deployed an ostree-native image, the cluster updates the node
//! with rpm-ostree or bootc, which read the repo through ostree-rs-ext's container store. Here
//! ostree-rs-ext itself (tests/ext-fixtures) judges what pivot left: the image is listed, the
//! origin's reference finds it with the deployed commit, importing it again is a no-op, and the
//! next version needs only the layers that changed. And the other way round: a node whose image
//! ostree-rs-ext deployed (as `bootc switch` leaves it) is at target for pivot, and pivot's next
//! pivot reuses its layers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use ostree::gio;
use pivot_testkit::{encapsulate, ext_fixtures_tool, ext_judge, skopeo_push, ImageSpec, Tree};
use serde_json::{json, Value};

/// An image ostree-rs-ext wrote into an `oci:` directory.
struct Image {
    /// Its `ostree.commit`.
    commit: String,
    dir: PathBuf,
}

impl Image {
    /// The digests of its layers, in order.
    fn layers(&self) -> Vec<String> {
        layout_manifest(&self.dir)["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    }

    fn push(&self, env: &Env, tag: &str) -> String {
        skopeo_push(
            &self.dir,
            &format!("{}/pivot/native:{tag}", env.registry.host()),
        )
        .unwrap()
    }
}

/// Commits `tree` as `version` and has ostree-rs-ext encapsulate it as `name` (`chunked`,
/// `derived`, `encapsulated`) under `work/<version>`.
fn ext_image(work: &Path, tree: &Tree, version: &str, name: &str) -> Image {
    let dir = work.join(version);
    let repo_path = dir.join("repo");
    let repo = ostree::Repo::new_for_path(&repo_path);
    std::fs::create_dir_all(&repo_path).unwrap();
    repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE)
        .unwrap();
    let commit = pivot_testkit::commit_tree(&repo, tree, Some("os"), version).unwrap();
    let tool = ext_fixtures_tool(false).unwrap();
    encapsulate(&tool, &repo_path, "os", &dir.join("oci"), Some(name)).unwrap();
    Image {
        commit,
        dir: dir.join("oci").join(name),
    }
}

/// v2, and v3: v2 with one more file under `usr/share` (so some chunks change, others not).
fn v3_tree() -> Tree {
    fixture("os-v2").with_file("usr/share/pivot/v3-marker", 0o644, "v3\n")
}

/// `tree` with a minimal SELinux policy libostree reads (config, file contexts, a policy file
/// it only checksums): derived files get labels from it.
fn with_policy(tree: Tree) -> Tree {
    let contexts = "/.*\tsystem_u:object_r:default_t:s0\n\
                    /\tsystem_u:object_r:root_t:s0\n\
                    /usr(/.*)?\tsystem_u:object_r:usr_t:s0\n\
                    /usr/share/derived(/.*)?\tsystem_u:object_r:derived_t:s0\n";
    tree.with_file(
        "usr/etc/selinux/config",
        0o644,
        "SELINUX=enforcing\nSELINUXTYPE=test\n",
    )
    .with_file(
        "usr/etc/selinux/test/contexts/files/file_contexts",
        0o644,
        contexts,
    )
    .with_file("usr/etc/selinux/test/policy/policy.33", 0o644, "policy\n")
}

/// The `security.selinux` label `ostree ls -X` shows for `path` in `commit`.
fn label(env: &Env, commit: &str, path: &str) -> Option<String> {
    let out = Command::new("ostree")
        .arg(format!("--repo={}", env.sysroot.repo_path().display()))
        .args(["ls", "-X", commit, path])
        .output()
        .unwrap();
    assert!(out.status.success(), "ostree ls: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let (_, rest) = text.split_once("b'security.selinux', b'")?;
    Some(rest.split_once('\'')?.0.to_string())
}

/// ostree-rs-ext's answer (see tests/ext-fixtures) about `env`'s repo.
fn judge(env: &Env, args: &[&str]) -> Value {
    let tool = ext_fixtures_tool(false).unwrap();
    let repo = env.sysroot.repo_path();
    let mut all = vec![args[0], repo.to_str().unwrap()];
    all.extend(&args[1..]);
    ext_judge(&tool, &all, &env.registries_conf).unwrap()
}

fn sorted(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// ostree-rs-ext's deployment of `image` on `env`'s sysroot (as `bootc switch` or
/// `rpm-ostree rebase` make it); its answer.
fn ext_deploy(env: &Env, image: &str) -> Value {
    let tool = ext_fixtures_tool(false).unwrap();
    let sysroot = env.sysroot.path.to_str().unwrap();
    ext_judge(
        &tool,
        &["deploy", sysroot, STATEROOT, image],
        &env.registries_conf,
    )
    .unwrap()
}

/// The store's layer refs of the repo at `repo`, ref → commit.
fn layer_refs(repo: &Path) -> Vec<(String, String)> {
    let ostree = |args: &[&str]| {
        let out = Command::new("ostree")
            .arg(format!("--repo={}", repo.display()))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ostree {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let mut refs: Vec<(String, String)> = ostree(&["refs", "ostree/container/blob"])
        .lines()
        .map(|r| {
            let name = format!("ostree/container/blob/{r}");
            let commit = ostree(&["rev-parse", &name]).trim().to_string();
            (name, commit)
        })
        .collect();
    refs.sort();
    assert!(!refs.is_empty(), "no layer refs in {}", repo.display());
    refs
}

/// Blob requests the registry served for each of `layers`.
fn blob_gets(env: &Env, layers: &[String]) -> Vec<usize> {
    layers
        .iter()
        .map(|d| env.registry.count_requests("GET", &format!("/blobs/{d}")))
        .collect()
}

/// Pivots to `image` (tagged `v3`) and checks the registry served exactly the layers in
/// `changed`, and that pivot's summary counts only those as fetched.
fn pivot_fetching_only(env: &Env, image: &Image, changed: &BTreeSet<String>) {
    let before = blob_gets(env, &image.layers());
    let host = env.registry.host();
    let out = env.pivot(&[&format!("{host}/pivot/native:v3")]);
    assert_success(&out);
    let (mut fetched, mut present) = (0, 0);
    for layer in layout_manifest(&image.dir)["layers"].as_array().unwrap() {
        let size = layer["size"].as_u64().unwrap();
        match changed.contains(layer["digest"].as_str().unwrap()) {
            true => fetched += size,
            false => present += size,
        }
    }
    let summary = format!("fetched {} in ", pivot::node::progress::human(fetched));
    let here = format!(
        "; {} of the image's layers were here already",
        pivot::node::progress::human(present)
    );
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains(&summary) && l.ends_with(&here)),
        "{err}"
    );
    let fetched = blob_gets(env, &image.layers());
    for ((layer, before), after) in image.layers().iter().zip(before).zip(fetched) {
        match changed.contains(layer) {
            true => assert!(after > before, "changed layer {layer} was not fetched"),
            false => assert_eq!(after, before, "unchanged layer {layer} was fetched again"),
        }
    }
}

/// Layers of `next` that `previous` does not have: what an update must fetch.
fn changed(previous: &Image, next: &Image) -> BTreeSet<String> {
    let had: BTreeSet<String> = previous.layers().into_iter().collect();
    let changed: BTreeSet<String> = next
        .layers()
        .into_iter()
        .filter(|l| !had.contains(l))
        .collect();
    assert!(
        !changed.is_empty() && changed.len() < next.layers().len(),
        "v3 should share some chunks with v2 and not others: {changed:?} of {:?}",
        next.layers()
    );
    changed
}

/// Chunked v2 and v3 written by ostree-rs-ext and pushed as `pivot/native:v2` and `:v3` to a
/// fresh environment's registry.
struct Versions {
    /// Holds the `oci:` directories (bind it, or they go).
    _work: tempfile::TempDir,
    v2: Image,
    v3: Image,
    /// The layers of v3 that v2 does not have.
    changed: BTreeSet<String>,
    env: Env,
    host: String,
    d2: String,
    d3: String,
}

fn chunked_v2_and_v3() -> Versions {
    let work = tempfile::tempdir().unwrap();
    let v2 = ext_image(work.path(), &fixture("os-v2"), "2", "chunked");
    let v3 = ext_image(work.path(), &v3_tree(), "3", "chunked");
    let env = Env::new();
    Versions {
        changed: changed(&v2, &v3),
        host: env.registry.host(),
        d2: v2.push(&env, "v2"),
        d3: v3.push(&env, "v3"),
        _work: work,
        v2,
        v3,
        env,
    }
}

#[test]
fn a_native_pivot_hands_over_to_ostree_rs_ext_and_pruning_keeps_the_store_whole() {
    let Versions {
        v2,
        v3,
        changed,
        env,
        host,
        d2,
        d3,
        _work,
    } = chunked_v2_and_v3();

    // The node comes from the legacy world: a legacy oscontainer deployed by pivot (of another
    // commit than the native image's: the same commit would already be the target).
    let legacy_tree = fixture("os-v2").with_file("usr/share/pivot/legacy", 0o644, "legacy\n");
    let legacy = env.push("v2-legacy", &ImageSpec::new(legacy_tree, "2"));
    assert_success(&env.pivot(&[&legacy.by_tag]));
    // Its origin is rpm-ostree's custom origin: a checksum refspec, the custom URL and text.
    let origin = origin_of(&env, &legacy.commit);
    for line in [
        format!("refspec={}", legacy.commit),
        format!(
            "custom-url=pivot://{}/{}@{}",
            host, legacy.repository, legacy.digest
        ),
        format!(
            "custom-description=Managed by pivot: {} (version 2)",
            legacy.by_tag
        ),
    ] {
        assert!(
            origin.lines().any(|l| l == line),
            "{line:?} not in:\n{origin}"
        );
    }
    assert!(!origin.contains("container-image-reference"), "{origin}");

    // Legacy to native.
    assert_success(&env.pivot(&[&format!("{host}/pivot/native:v2")]));
    let status = env.status_json();
    let deployed = &status["deployments"][0];
    let merge = deployed["checksum"].as_str().unwrap().to_string();
    assert_ne!(
        merge, v2.commit,
        "the deployment is the image's merge commit, as ostree-rs-ext deploys it"
    );
    let image = format!("docker://{host}/pivot/native@{d2}");
    assert!(origin_of(&env, &merge).contains(&format!(
        "container-image-reference=ostree-unverified-registry:{host}/pivot/native@{d2}\n"
    )));

    // ostree-rs-ext lists the image and finds it by the origin's reference.
    let query = judge(&env, &["query", &image]);
    assert_eq!(query["images"], json!([image]), "{query}");
    assert_eq!(query["image"]["manifest_digest"], d2.as_str(), "{query}");
    assert_eq!(query["image"]["merge_commit"], merge.as_str(), "{query}");
    assert_eq!(query["image"]["base_commit"], v2.commit.as_str(), "{query}");
    assert_eq!(query["image"]["version"], "2", "{query}");
    // Importing it again (bootc upgrade, rpm-ostree upgrade) has nothing to do.
    let prepared = judge(&env, &["prepare", &image]);
    assert_eq!(prepared["present"], true, "{prepared}");
    assert_eq!(prepared["merge_commit"], merge.as_str(), "{prepared}");
    // The next version needs only the chunks that changed.
    let next = format!("docker://{host}/pivot/native:v3");
    let prepared = judge(&env, &["prepare", &next]);
    assert_eq!(prepared["present"], false, "{prepared}");
    assert_eq!(sorted(&prepared["fetch"]), changed, "{prepared}");

    // The layers' refs hold the very commits ostree-rs-ext's own import writes (object sets
    // included: the same trees, byte for byte).
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new("ostree")
        .args(["init", "--mode=bare", "--repo"])
        .arg(scratch.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let tool = ext_fixtures_tool(false).unwrap();
    let scratch_repo = scratch.path().to_str().unwrap();
    ext_judge(
        &tool,
        &["import", scratch_repo, &image],
        &env.registries_conf,
    )
    .unwrap();
    assert_eq!(
        layer_refs(&env.sysroot.repo_path()),
        layer_refs(scratch.path()),
        "pivot's layer refs differ from ostree-rs-ext's"
    );

    // pivot status shows what bootc status shows of it.
    assert_eq!(deployed["manifest_digest"], d2.as_str(), "{status:#}");
    assert_eq!(deployed["version"], "2");
    assert!(deployed["timestamp"].as_u64().is_some(), "{status:#}");
    let text = String::from_utf8_lossy(&env.subcommand("status", &[]).stdout).into_owned();
    assert!(text.contains(&format!("Digest: {d2}")), "{text}");
    assert!(text.contains("Timestamp: "), "{text}");
    assert_fsck_clean(&env);

    // pivot's own next pivot reuses the chunks too.
    pivot_fetching_only(&env, &v3, &changed);
    let v3_image = format!("docker://{host}/pivot/native@{d3}");
    let merge3 = env.deployed()[0].clone();
    let query = judge(&env, &["query", &v3_image]);
    assert_eq!(query["image"]["merge_commit"], merge3.as_str(), "{query}");
    assert_eq!(
        sorted(&query["images"]),
        BTreeSet::from([image.clone(), v3_image.clone()]),
        "both deployments' images stay"
    );
    assert_eq!(judge(&env, &["prepare", &v3_image])["present"], true);
    assert_fsck_clean(&env);

    // Back to the legacy oscontainer: native v2 rolls off, so its image ref goes, and with it
    // the refs of the chunks only v2 had; v3's store stays whole.
    assert_success(&env.pivot(&[&legacy.by_tag]));
    let query = judge(&env, &["query", &v3_image]);
    assert_eq!(query["images"], json!([v3_image]), "{query}");
    assert_eq!(judge(&env, &["prepare", &v3_image])["present"], true);
    let only_v2: BTreeSet<String> = v2
        .layers()
        .into_iter()
        .filter(|l| !v3.layers().contains(l))
        .collect();
    let prepared = judge(&env, &["prepare", &image]);
    assert_eq!(prepared["present"], false, "{prepared}");
    assert_eq!(sorted(&prepared["fetch"]), only_v2, "{prepared}");
    assert_fsck_clean(&env);

    // From the legacy deployment, the rebase rpm-ostree and bootc do (ostree-rs-ext's deploy)
    // takes the native image from the store, and pivot status reads what it made.
    let rebased = ext_deploy(&env, &v3_image);
    assert_eq!(rebased["merge_commit"], merge3.as_str());
    let status = env.status_json();
    let first = &status["deployments"][0];
    assert_eq!(first["checksum"], merge3.as_str(), "{status:#}");
    assert_eq!(
        first["image"],
        format!("{host}/pivot/native@{d3}").as_str(),
        "{status:#}"
    );
    assert_eq!(first["version"], "3", "{status:#}");
    assert_eq!(
        read(&env.deployment(0).join("usr/share/pivot/v3-marker")),
        "v3\n"
    );
}

#[test]
fn a_node_ostree_rs_ext_deployed_is_at_target_for_pivot_and_its_layers_are_reused() {
    let Versions {
        v2,
        v3,
        changed,
        env,
        host,
        d2,
        _work,
        ..
    } = chunked_v2_and_v3();

    // As `bootc switch` / `rpm-ostree rebase` leave it: deployed by tag.
    let deployed = ext_deploy(&env, &format!("docker://{host}/pivot/native:v2"));
    let merge = deployed["merge_commit"].as_str().unwrap();
    let status = env.status_json();
    let first = &status["deployments"][0];
    assert_eq!(first["checksum"], merge, "{status:#}");
    assert_eq!(first["manifest_digest"], d2.as_str(), "{status:#}");
    assert_eq!(
        first["image"],
        format!("{host}/pivot/native:v2@{d2}").as_str(),
        "{status:#}"
    );
    assert_eq!(first["version"], "2", "{status:#}");

    // Asked for that image, pivot is at target: nothing fetched, nothing changed.
    let before = env.sysroot.snapshot().unwrap();
    let gets = blob_gets(&env, &v2.layers());
    let out = env.pivot(&["--unchanged-exit-77", &format!("{host}/pivot/native:v2")]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    assert_eq!(blob_gets(&env, &v2.layers()), gets);

    // The next version: --check counts only the changed chunks, and only they are fetched.
    let out = env.pivot(&["--check", &format!("{host}/pivot/native:v3")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    let kept = v3.layers().len() - changed.len();
    assert!(
        report.contains(&format!(
            " in {} of {} layers (the others are in the repo)",
            changed.len(),
            changed.len() + kept
        )),
        "{report}"
    );
    pivot_fetching_only(&env, &v3, &changed);
    assert_eq!(
        read(&env.deployment(0).join("usr/share/pivot/v3-marker")),
        "v3\n"
    );
    assert_fsck_clean(&env);
}

/// A layer the store holds but no longer whole (an object of its set deleted, as a damaged disk
/// or a hand-run prune leaves it) vouches for nothing: the update fetches that layer again, along
/// with the changed ones, and deploys the whole tree.
#[test]
fn a_stored_layer_that_lost_an_object_is_fetched_again_by_the_update() {
    let Versions {
        v2,
        v3,
        mut changed,
        env,
        host,
        _work,
        ..
    } = chunked_v2_and_v3();
    assert_success(&env.pivot(&[&format!("{host}/pivot/native:v2")]));

    // A component layer v3 shares with v2, and one content object of its set.
    let repo = env.sysroot.repo_path();
    let shared = v3.layers()[1..]
        .iter()
        .find(|l| !changed.contains(*l) && v2.layers().contains(l))
        .expect("a component layer v2 and v3 share")
        .clone();
    let (_, set) = layer_refs(&repo)
        .into_iter()
        .find(|(name, _)| name.ends_with(&shared.replace(':', "_3A_")))
        .expect("the shared layer's ref");
    let ls = Command::new("ostree")
        .arg(format!("--repo={}", repo.display()))
        .args(["ls", "--nul-filenames-only", &set, "/"])
        .output()
        .unwrap();
    assert!(ls.status.success(), "{ls:?}");
    let object = ls
        .stdout
        .split(|b| *b == 0)
        .map(|name| {
            String::from_utf8_lossy(name)
                .trim_start_matches('/')
                .to_string()
        })
        .find(|name| name.len() == 64)
        .expect("a content object in the layer's set");
    std::fs::remove_file(repo.join(format!("objects/{}/{}.file", &object[..2], &object[2..])))
        .unwrap();

    changed.insert(shared);
    pivot_fetching_only(&env, &v3, &changed);
    assert_eq!(
        read(&env.deployment(0).join("usr/share/pivot/v3-marker")),
        "v3\n"
    );
    assert_fsck_clean(&env);
}

#[test]
fn derived_and_layout_images_hand_over() {
    let work = tempfile::tempdir().unwrap();
    let v2 = ext_image(work.path(), &with_policy(fixture("os-v2")), "2", "derived");
    let v3 = ext_image(work.path(), &with_policy(v3_tree()), "3", "derived");
    let derived_layer = v2.layers().last().unwrap().clone();
    assert_eq!(
        v3.layers().last(),
        Some(&derived_layer),
        "ext-fixtures writes the same derived layer on any base"
    );
    let env = Env::new();
    let host = env.registry.host();
    let d2 = v2.push(&env, "derived-v2");
    v3.push(&env, "derived-v3");

    // Downloaded only: libostree deploys a tree with an SELinux policy only where the tree has
    // semodule to rebuild it (which these small trees do not).
    let out = env.pivot(&[
        "--download-only",
        &format!("{host}/pivot/native:derived-v2"),
    ]);
    assert_success(&out);
    let image = format!("docker://{host}/pivot/native@{d2}");
    let query = judge(&env, &["query", &image]);
    let merge = query["image"]["merge_commit"].as_str().unwrap().to_string();
    let kept = Command::new("ostree")
        .arg(format!("--repo={}", env.sysroot.repo_path().display()))
        .args([
            "rev-parse",
            &format!("pivot/downloaded/native/{}", d2.replace(':', "-")),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&kept.stdout).trim(),
        merge,
        "{kept:?}"
    );
    assert_eq!(query["image"]["base_commit"], v2.commit.as_str(), "{query}");
    assert_eq!(judge(&env, &["prepare", &image])["present"], true);
    // What the derived layer added is labeled from the base's policy.
    let derived_t = Some("system_u:object_r:derived_t:s0".to_string());
    assert_eq!(label(&env, &merge, "/usr/share/derived/added"), derived_t);
    assert_eq!(label(&env, &merge, "/usr/share/derived"), derived_t);
    let usr_t = Some("system_u:object_r:usr_t:s0".to_string());
    assert_eq!(label(&env, &merge, "/usr/etc/derived.conf"), usr_t);

    // ostree-rs-ext reuses pivot's commit of the derived layer on another base, with the same
    // result as applying the layer itself: the file added, etc/ in usr/etc, the whiteout
    // honoured, the same labels.
    let next = format!("docker://{host}/pivot/native:derived-v3");
    let prepared = judge(&env, &["prepare", &next]);
    assert!(
        sorted(&prepared["reused"]).contains(&derived_layer),
        "{prepared}"
    );
    let imported = judge(&env, &["import", &next]);
    let commit = imported["imported"].as_str().unwrap();
    let cat = |path: &str| {
        let out = Command::new("ostree")
            .arg(format!("--repo={}", env.sysroot.repo_path().display()))
            .args(["cat", commit, path])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert_eq!(
        cat("/usr/share/derived/added").as_deref(),
        Some("derived\n")
    );
    assert_eq!(
        cat("/usr/etc/derived.conf").as_deref(),
        Some("derived=yes\n")
    );
    assert_eq!(cat("/usr/share/pivot/v2-marker"), None, "whiteout ignored");
    assert_eq!(cat("/usr/share/pivot/v3-marker").as_deref(), Some("v3\n"));
    // ostree-rs-ext labels the derived files as pivot did.
    assert_eq!(label(&env, commit, "/usr/share/derived/added"), derived_t);
    assert_eq!(label(&env, commit, "/usr/etc/derived.conf"), usr_t);
    assert_fsck_clean(&env);

    // Writing a deployment prunes the store: the image ostree-rs-ext imported goes (nothing
    // deploys it), the downloaded one stays (pivot's download ref keeps it), layers and all.
    let legacy = env.push_v2();
    assert_success(&env.pivot(&[&legacy.by_tag]));
    let query = judge(&env, &["query", &image]);
    assert_eq!(query["images"], json!([image]), "{query}");
    assert_eq!(judge(&env, &["prepare", &image])["present"], true);
    assert_fsck_clean(&env);

    // An `oci:` layout: the origin's `oci:<path>` names the image in the store.
    let env = Env::new();
    let layout = ext_image(
        &work.path().join("layout"),
        &fixture("os-v2"),
        "2",
        "chunked",
    );
    assert_success(&env.pivot(&[&format!("oci:{}", layout.dir.display())]));
    let image = format!("oci:{}", layout.dir.display());
    let query = judge(&env, &["query", &image]);
    assert_eq!(query["images"], json!([image]), "{query}");
    assert_eq!(query["image"]["merge_commit"], env.deployed()[0].as_str());
    let prepared = judge(&env, &["prepare", &image]);
    assert_eq!(prepared["present"], true, "{prepared}");
    assert_fsck_clean(&env);
}

/// rpm-ostree and bootc carry an origin's other groups over to the deployments they make: a
/// `[pivot]` group on a deployment of another commit describes an image that is not deployed
/// there, and `pivot status` ignores it (here v2's group, carried onto v1's deployment).
#[test]
fn a_pivot_group_carried_onto_another_deployment_is_ignored() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    let v1 = env.sysroot.commit_v1().to_string();
    let v2_origin = origin_of(&env, &v2.commit);
    assert!(
        v2_origin.contains(&format!("commit={}", v2.commit)),
        "{v2_origin}"
    );
    // v1's own origin, with v2's [pivot] group added, as rpm-ostree would carry it over.
    let group = &v2_origin[v2_origin.find("[pivot]").unwrap()..];
    let group = match group[1..].find("\n[") {
        Some(end) => &group[..end + 2],
        None => group,
    };
    let v1_origin = env
        .sysroot
        .path
        .join(format!("ostree/deploy/{STATEROOT}/deploy/{v1}.0.origin"));
    let carried = format!("{}\n{group}", read(&v1_origin));
    std::fs::write(&v1_origin, carried).unwrap();
    let status = env.status_json();
    let deployments = status["deployments"].as_array().unwrap();
    let of = |commit: &str| {
        deployments
            .iter()
            .find(|d| d["checksum"] == commit)
            .unwrap_or_else(|| panic!("{commit} not in {status}"))
            .clone()
    };
    let (v1_status, v2_status) = (of(&v1), of(&v2.commit));
    assert!(
        v2_status["image"]
            .as_str()
            .is_some_and(|i| i.contains(&v2.digest)),
        "{v2_status}"
    );
    assert!(
        !v1_status.to_string().contains(&v2.digest),
        "v1 is described by v2's image: {v1_status}"
    );
    assert_eq!(v1_status["version"], "1", "{v1_status}");
}
