//! Crash safety: pivot is killed with SIGKILL at random points of the pull, the import and the
//! deployment, and after every kill the node must still boot (every boot entry's kernel,
//! initramfs and deployment exist), its repo must pass `ostree fsck`, and nothing may stand in
//! the way of the next run. After all kills one plain run converges to the target without
//! fetching again what earlier runs already verified.
//!
//! Kill points come from a seeded generator over an uninterrupted pivot of the same image
//! (timed, and driven by pivot's `--progress-fd` events: a byte count, a step). The seed is
//! printed; `PIVOT_CRASH_SEED=<seed>` replays a run.
//!
//! The sysroot lives on a tmpfs: libostree freezes and thaws /boot's filesystem while it writes
//! boot entries, and a process killed between the two would leave that filesystem frozen until
//! libostree's watchdog thaws it — the host's own filesystem, were the sysroot under /tmp.
// unsafe: descriptors and locks set up for the pivot under test (libc).
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use pivot_testkit::{Fault, FaultProxy, ImageSpec, PushedImage, Tmpfs};

/// Kills per run of the test, the last one late in the import.
const KILLS: usize = 20;
/// Files of noise added to os-v2: enough objects for the import and the checkout to take time.
const FILES: usize = 2000;
const FILE_SIZE: usize = 4096;
const LAYERS: usize = 4;
/// The layers are served at this rate, so the import lasts a second or two.
const THROTTLE: u64 = 3 << 20;
/// Every manifest request waits this long: the pull step is long enough to be hit.
const MANIFEST_DELAY: Duration = Duration::from_millis(300);
/// The fd number pivot gets for `--progress-fd`.
const PROGRESS_FD: i32 = 200;

#[test]
fn pivot_killed_anywhere_leaves_a_bootable_node_and_the_next_run_converges() {
    let started = Instant::now();
    let seed = std::env::var("PIVOT_CRASH_SEED")
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("PIVOT_CRASH_SEED is a number")
        })
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crash test seed: PIVOT_CRASH_SEED={seed}");
    let mut rng = Rng(seed);

    let tmpfs = Tmpfs::mount(512 << 20).expect("mounting a tmpfs for the sysroot");
    let mut env = Env::new_in(tmpfs.path());
    let image = push_big_v2(&env);
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(Fault::delay("/manifests/", MANIFEST_DELAY).always());
    proxy.add_fault(Fault::throttle("/blobs/", THROTTLE).always());
    insecure_via(&mut env, &proxy);
    let pullspec = format!("{}/pivot/os@{}", proxy.host(), image.digest);
    let layer_bytes = |proxy: &FaultProxy| -> u64 {
        image
            .layer_digests
            .iter()
            .map(|d| proxy.body_bytes_sent(d))
            .sum()
    };
    eprintln!("image set up in {:.1} s", started.elapsed().as_secs_f64());

    // An uninterrupted pivot, timed, gives the scale kill points are drawn on.
    let baseline = PivotRun::start(&env, &pullspec).until(Trigger::Never);
    assert_eq!(
        baseline.ended,
        Ended::Exited(Some(0)),
        "{}",
        baseline.stderr
    );
    let total = baseline.total.expect("a start event with the image's size");
    let t_import = baseline.at_importing.expect("an importing step");
    let t_deploy = baseline.at_deploying.expect("a deploying step");
    let t_end = baseline.elapsed;
    eprintln!(
        "uninterrupted: {total} bytes in {LAYERS} layers; importing at {:.2} s, deploying at {:.2} s, done at {:.2} s",
        t_import.as_secs_f64(),
        t_deploy.as_secs_f64(),
        t_end.as_secs_f64()
    );
    assert!(
        t_end >= Duration::from_secs(1),
        "an uninterrupted pivot took only {t_end:?}: too short to kill at chosen points"
    );
    assert_eq!(layer_bytes(&proxy), total);
    undeploy_target(&env, &image);

    // The kill points: the pull, byte offsets of the import, any time, the deployment, and
    // between the deployment and the state file; in random order, then one late in the import.
    // Within the measured deployment, with a margin for runs that deploy faster.
    let deploy_time = (t_end.saturating_sub(t_deploy) * 4 / 5).max(Duration::from_millis(20));
    let mut triggers = Vec::new();
    for _ in 0..3 {
        triggers.push(Trigger::After(rng.duration(Duration::ZERO, t_import)));
    }
    for _ in 0..8 {
        triggers.push(Trigger::Bytes(
            rng.below(total),
            rng.duration(Duration::ZERO, JITTER),
        ));
    }
    for _ in 0..3 {
        triggers.push(Trigger::After(rng.duration(t_import, t_end)));
    }
    for _ in 0..4 {
        triggers.push(Trigger::Deploying(
            rng.duration(Duration::ZERO, deploy_time),
        ));
    }
    triggers.push(Trigger::BeforeStateSave);
    rng.shuffle(&mut triggers);
    assert_eq!(triggers.len(), KILLS - 1);

    let mut phases = std::collections::BTreeMap::<&str, usize>::new();
    let mut kills = 0;
    let mut i = 0;
    let mut late_tries = 0;
    let last_kill = loop {
        let trigger = match triggers.get(i) {
            Some(t) => *t,
            // A run that ended before its kill point is made up for.
            None if kills < KILLS - 1 => {
                Trigger::Bytes(rng.below(total), rng.duration(Duration::ZERO, JITTER))
            }
            // Last, a kill late in the import; tried again, earlier, if it came too late (a
            // layer replayed from an earlier run's spool outruns the throttle's estimate).
            None => {
                late_tries += 1;
                let fraction = 0.5 + rng.below(400) as f64 / 1000.0;
                Trigger::LastLayer(fraction / f64::from(late_tries))
            }
        };
        assert!(
            i < KILLS + 12,
            "too many runs ended before their kill point; replay with PIVOT_CRASH_SEED={seed}"
        );
        i += 1;
        // A kill after the import leaves the commit in the repo, and the next run then has
        // nothing to download: a kill point on the download's timeline would never come.
        if trigger.needs_the_import() {
            forget_undeployed_target(&env, &image);
        }
        let run = PivotRun::start(&env, &pullspec).until(trigger);
        let phase = run.phase();
        eprintln!(
            "kill {i:2}: {trigger:?} → {:?} at {:.2} s, in {phase} ({} of {total} bytes)",
            run.ended,
            run.elapsed.as_secs_f64(),
            run.done_bytes
        );
        let context = format!(
            "after kill {i} ({trigger:?}, in {phase}); replay with PIVOT_CRASH_SEED={seed}\n{}",
            run.stderr
        );
        assert_node_sound(&env, &image, &context);
        match run.ended {
            Ended::Killed => {
                kills += 1;
                *phases.entry(phase).or_default() += 1;
            }
            // The trigger came too late for this run (it reused earlier runs' work).
            Ended::Exited(code) => assert_eq!(code, Some(0), "{context}"),
        }
        if trigger == Trigger::BeforeStateSave {
            assert_eq!(run.ended, Ended::Killed, "{context}");
            assert_eq!(
                env.deployed_images()[0],
                image.commit,
                "the deployment was made before the kill: {context}"
            );
            let out = env.pivot(&["--unchanged-exit-77", &pullspec]);
            assert_eq!(out.status.code(), Some(77), "{context}\n{}", stderr(&out));
            assert!(
                stderr(&out).contains("already at target"),
                "{}",
                stderr(&out)
            );
            assert_eq!(
                env.status_json()["pivot"][STATEROOT]["last"]["outcome"],
                "unchanged"
            );
        }
        // Progress events lag the import: whether a layer was still in flight at the kill is
        // read from what the run kept (a layer whose import finished has a record instead of
        // its download; its ref comes only when the transaction commits).
        let late = run.ended == Ended::Killed
            && phase == "importing"
            && run.done_bytes < total
            && a_layer_was_in_flight(&env, &image);
        if matches!(trigger, Trigger::LastLayer(_)) {
            if late {
                break run;
            }
            // Too late: what earlier runs kept would be replayed at once again. The next try
            // downloads afresh, at the proxy's pace.
            let _ = std::fs::remove_dir_all(env.downloads());
        }
        if env.deployed_images()[0] == image.commit {
            undeploy_target(&env, &image);
        }
    };
    eprintln!("{kills} kills, by phase: {phases:?}");
    assert!(kills >= KILLS, "only {kills} runs were killed");
    for phase in ["pulling", "importing", "deploying", "deployed"] {
        assert!(
            phases.contains_key(phase),
            "no kill landed in {phase}: {phases:?}; replay with PIVOT_CRASH_SEED={seed}"
        );
    }

    // The last kill came late in the import: the next run fetches only what was missing.
    let spooled = last_kill.done_bytes;
    assert!(spooled > total / 2, "killed at {spooled} of {total} bytes");
    let sent_before = layer_bytes(&proxy);
    let out = env.pivot(&[&pullspec]);
    assert_success(&out);
    let sent = layer_bytes(&proxy) - sent_before;
    eprintln!(
        "converging run: {sent} layer bytes fetched ({spooled} of {total} were kept by the killed run)"
    );
    assert!(
        sent < total,
        "the converging run fetched {sent} bytes: the whole image ({total}) again"
    );
    assert!(
        sent <= total - spooled + total / 100,
        "the converging run fetched {sent} bytes; only {} were missing",
        total - spooled
    );
    // The layer in flight at the kill resumes (the last one, or one imported beside it that
    // finished after it).
    let err = stderr(&out);
    assert!(
        image
            .layer_digests
            .iter()
            .any(|d| err.contains(&format!("resuming {d}"))),
        "{err}"
    );
    assert_converged(&env, &image, "after the converging run");
    let tmp = env.sysroot.repo_path().join("tmp");
    let staging = pivot::import::staging::staging_dirs(&tmp);
    assert!(staging.is_empty(), "staging dirs left: {staging:?}");
    eprintln!("crash test took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn a_layer_imported_before_a_kill_is_not_kept_twice_and_is_fetched_again_once_its_objects_are_gone()
{
    let tmpfs = Tmpfs::mount(512 << 20).expect("mounting a tmpfs for the sysroot");
    let mut env = Env::new_in(tmpfs.path());
    let (image, proxy, pullspec, run) = killed_in_the_last_layer(&mut env);
    assert_eq!(run.phase(), "importing", "{}", run.stderr);
    assert_node_sound(&env, &image, "after the kill");

    // The layers imported before the kill are kept as records of their staged objects, not as
    // downloads: only the layers in flight take disk beside the objects.
    let kept = |digest: &str, ext: &str| env.download(digest, ext).exists();
    let imported = recorded_layers(&env, &image);
    for digest in &image.layer_digests {
        assert!(
            !(kept(digest, "imported") && kept(digest, "partial")),
            "{digest} is both imported and still spooled"
        );
    }
    assert!(
        imported.len() >= LAYERS - pivot::import::PARALLEL_LAYERS,
        "only {} of {LAYERS} layers were recorded as imported while the last one downloaded",
        imported.len()
    );
    assert!(kept(&image.layer_digests[LAYERS - 1], "partial"));

    // When the staged objects are gone (a power cut before any reached the disk), the recorded
    // layers are fetched again, and the pivot completes.
    remove_staging_dirs(&env);
    let sent_before = layer_bytes_sent(&proxy, &image);
    let out = env.pivot(&[&pullspec]);
    assert_success(&out);
    let err = stderr(&out);
    for (i, digest) in image.layer_digests.iter().enumerate() {
        if imported.contains(&digest) {
            assert!(
                err.contains(&format!(
                    "{digest} was imported by an earlier run, but object"
                )),
                "{err}"
            );
            assert!(
                proxy.body_bytes_sent(digest) > sent_before[i],
                "{digest} was not fetched again"
            );
        }
    }
    assert_converged(&env, &image, "after the converging run");
}

#[test]
fn a_kill_inside_a_layer_keeps_only_the_download_after_its_last_checkpoint_and_the_next_run_resumes_there(
) {
    let tmpfs = Tmpfs::mount(512 << 20).expect("mounting a tmpfs for the sysroot");
    let env = Env::new_in(tmpfs.path());
    let image = env.push("v2-one-layer", &ImageSpec::new(one_layer_tree(), "2"));
    kill_inside_the_layer_and_resume(env, &image);
}

#[test]
fn a_native_image_killed_inside_its_layer_resumes_from_its_last_checkpoint() {
    let tmpfs = Tmpfs::mount(512 << 20).expect("mounting a tmpfs for the sysroot");
    let env = Env::new_in(tmpfs.path());
    let image = push_native_one_layer(&env, &one_layer_tree());
    kill_inside_the_layer_and_resume(env, &image);
}

/// os-v2 plus 32 MiB of noise (19 MiB gzipped): in a single-layer image, where a whole spool
/// would cost most.
fn one_layer_tree() -> pivot_testkit::Tree {
    let mut tree = fixture("os-v2");
    for i in 0..8192 {
        let path = format!("usr/share/pivot/bulk/{:02}/{i:05}", i % 50);
        tree = tree.with_file(&path, 0o644, &noise_seeded(i as u64 + 1, FILE_SIZE));
    }
    tree
}

/// Commits `tree` and has ostree-rs-ext encapsulate it (one layer), pushed by skopeo.
fn push_native_one_layer(env: &Env, tree: &pivot_testkit::Tree) -> PushedImage {
    let dir = tempfile::tempdir().unwrap();
    let repo_path = dir.path().join("repo");
    let repo = ostree::Repo::new_for_path(&repo_path);
    repo.create(ostree::RepoMode::Archive, ostree::gio::Cancellable::NONE)
        .unwrap();
    let commit = pivot_testkit::commit_tree(&repo, tree, Some("os"), "2").unwrap();
    let tool = pivot_testkit::ext_fixtures_tool(false).unwrap();
    let oci = dir.path().join("oci");
    pivot_testkit::encapsulate(&tool, &repo_path, "os", &oci, Some("encapsulated")).unwrap();
    let oci = oci.join("encapsulated");
    let manifest = layout_manifest(&oci);
    let layer_digests: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(layer_digests.len(), 1, "{manifest}");
    let repository = "pivot/native".to_string();
    let by_tag = format!("{}/{repository}:one-layer", env.registry.host());
    let digest = pivot_testkit::skopeo_push(&oci, &by_tag).unwrap();
    PushedImage {
        by_digest: format!("{}/{repository}@{digest}", env.registry.host()),
        repository,
        tag: "one-layer".into(),
        manifest_digest: digest.clone(),
        digest,
        commit,
        config_digest: manifest["config"]["digest"].as_str().unwrap().to_string(),
        layer_sizes: manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["size"].as_u64().unwrap())
            .collect(),
        layer_digests,
        by_tag,
    }
}

/// Kills pivot inside `image`'s single layer and checks that only the download since the last
/// checkpoint is on disk, that the next run resumes there and completes; then that a run whose
/// staged objects are gone (a reboot) fetches the layer again instead.
fn kill_inside_the_layer_and_resume(mut env: Env, image: &PushedImage) {
    let digest = &image.layer_digests[0];
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(Fault::throttle("/blobs/", THROTTLE).always());
    insecure_via(&mut env, &proxy);
    let pullspec = format!("{}/{}@{}", proxy.host(), image.repository, image.digest);
    let kill_at = Trigger::Bytes(12 << 20, Duration::ZERO);

    let run = PivotRun::start(&env, &pullspec).until(kill_at);
    assert_eq!(run.ended, Ended::Killed, "{}", run.stderr);
    assert_eq!(run.phase(), "importing", "{}", run.stderr);
    assert_node_sound(&env, image, "after the kill");
    let total = run.total.expect("a start event with the image's size");

    // The bytes before the last checkpoint are freed; the file keeps its length, so the next
    // run knows where the download stopped.
    assert!(env.download(digest, "checkpoint").exists());
    let spool = std::fs::metadata(env.download(digest, "partial")).unwrap();
    let on_disk = std::os::unix::fs::MetadataExt::blocks(&spool) * 512;
    eprintln!(
        "killed at {} of {total} bytes; spool {} bytes long, {on_disk} on disk",
        run.done_bytes,
        spool.len()
    );
    assert!(
        spool.len() >= 11 << 20,
        "only {} bytes were spooled",
        spool.len()
    );
    // The image is the one layer.
    assert!(
        on_disk <= pivot::import::spool_bound(total),
        "{on_disk} bytes of the layer's {} downloaded are still on disk",
        spool.len()
    );

    // The checkpoint vouches for the download up to the bytes it had read (synced before it);
    // what was spooled after them is fetched again.
    let checkpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.download(digest, "checkpoint")).unwrap())
            .unwrap();
    let vouched = checkpoint["point"]["blob"]["read"].as_u64().unwrap();
    assert!(vouched <= spool.len() && spool.len() - vouched <= 8 << 20);
    let sent_before = proxy.body_bytes_sent(digest);
    let out = env.pivot(&[&pullspec]);
    assert_success(&out);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{digest} resumes from a checkpoint at byte")),
        "{err}"
    );
    let sent = proxy.body_bytes_sent(digest) - sent_before;
    assert!(
        sent <= total - vouched + total / 100,
        "the resumed run fetched {sent} bytes; only {} were missing",
        total - vouched
    );
    // Its summary counts what came from the registry, not what the earlier run kept.
    let summary = format!("fetched {} in ", pivot::node::progress::human(sent));
    let kept = "of the image's layers were here already";
    assert!(
        err.lines()
            .any(|l| l.contains(&summary) && l.ends_with(kept)),
        "{err}"
    );
    assert_converged(&env, image, "after the resumed run");

    // After a reboot the objects staged before the checkpoint are gone: the checkpoint is
    // useless, and the layer is fetched again from its start.
    undeploy_target(&env, image);
    let run = PivotRun::start(&env, &pullspec).until(kill_at);
    assert_eq!(run.ended, Ended::Killed, "{}", run.stderr);
    assert!(env.download(digest, "checkpoint").exists());
    remove_staging_dirs(&env);
    let out = env.pivot(&[&pullspec]);
    assert_success(&out);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "{digest} was partly imported by an earlier run, but object"
        )),
        "{err}"
    );
    assert!(!err.contains("resumes from a checkpoint"), "{err}");
    assert_eq!(
        env.deployed_images(),
        [image.commit.clone(), env.sysroot.commit_v1().to_string()]
    );
    assert_node_sound(&env, image, "after the run that could not resume");
}

#[test]
fn a_killed_runs_staging_directory_does_not_outlive_the_next_run_unless_its_lock_is_held() {
    let mut env = Env::new();
    let (image, _proxy, pullspec, _) = killed_in_the_last_layer(&mut env);
    let tmp = env.sysroot.repo_path().join("tmp");
    let left = pivot::import::staging::staging_dirs(&tmp);
    let locks: Vec<_> = left
        .iter()
        .map(|n| tmp.join(n))
        .filter(|p| p.to_string_lossy().ends_with("-lock"))
        .collect();
    assert!(
        !locks.is_empty(),
        "the killed run left no lock file: {left:?}"
    );
    assert!(locks.iter().all(|l| !pivot::import::staging::lock_held(l)));
    // The node rebooted: libostree reuses a staging directory only in the boot that made it.
    for name in &left {
        let name = name.to_string_lossy();
        let rest = name.strip_prefix("staging-").unwrap();
        let other_boot = format!(
            "staging-00000000-0000-0000-0000-000000000000{}",
            &rest[36..]
        );
        std::fs::rename(tmp.join(&*name), tmp.join(other_boot)).unwrap();
    }
    // Another program's transaction, going on: its lock is held.
    let busy = tmp.join("staging-11111111-1111-1111-1111-111111111111-busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("object"), b"in use").unwrap();
    let held =
        File::create(tmp.join("staging-11111111-1111-1111-1111-111111111111-busy-lock")).unwrap();
    // SAFETY: a zeroed flock is a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: an open descriptor and a pointer to a live flock.
    let locked = unsafe { libc::fcntl(held.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    assert_eq!(locked, 0);

    let out = env.pivot(&[&pullspec]);
    assert_success(&out);
    assert_eq!(env.deployed_images()[0], image.commit);
    let left: Vec<String> = pivot::import::staging::staging_dirs(&tmp)
        .into_iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        [
            "staging-11111111-1111-1111-1111-111111111111-busy",
            "staging-11111111-1111-1111-1111-111111111111-busy-lock"
        ],
        "the killed run's staging directory outlived the next run, or a held one was removed"
    );
    assert!(busy.join("object").exists());
    drop(held);
}

/// Pushes the big image behind a throttling proxy, and kills a pivot of it halfway through its
/// last layer: the image, the proxy, the pullspec through it, and the killed run.
pub(crate) fn killed_in_the_last_layer(
    env: &mut Env,
) -> (PushedImage, FaultProxy, String, Outcome) {
    let image = push_big_v2(env);
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(Fault::throttle("/blobs/", THROTTLE).always());
    insecure_via(env, &proxy);
    let pullspec = format!("{}/pivot/os@{}", proxy.host(), image.digest);
    let run = PivotRun::start(env, &pullspec).until(Trigger::LastLayer(0.5));
    assert_eq!(run.ended, Ended::Killed, "{}", run.stderr);
    (image, proxy, pullspec, run)
}

/// Removes the repo's staging directories, as a reboot makes libostree pass them over.
fn remove_staging_dirs(env: &Env) {
    let tmp = env.sysroot.repo_path().join("tmp");
    for dir in pivot::import::staging::staging_dirs(&tmp) {
        let path = tmp.join(dir);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
}

/// Extra delay after a byte trigger, so kills do not all land right after a progress event.
const JITTER: Duration = Duration::from_millis(250);

/// os-v2 plus [`FILES`] files of distinct noise, in [`LAYERS`] layers.
fn push_big_v2(env: &Env) -> PushedImage {
    let mut tree = fixture("os-v2");
    for i in 0..FILES {
        let path = format!("usr/share/pivot/bulk/{:02}/{i:05}", i % 50);
        tree = tree.with_file(&path, 0o644, &noise_seeded(i as u64 + 1, FILE_SIZE));
    }
    let mut spec = ImageSpec::new(tree, "2");
    spec.layers = LAYERS;
    env.push("v2-big", &spec)
}

/// Takes the sysroot back to v1 alone: undeploys the target and prunes its commit, so the next
/// run imports it again.
fn undeploy_target(env: &Env, image: &PushedImage) {
    assert_eq!(env.deployed_images()[0], image.commit);
    env.undeploy(0);
    env.drop_store_refs();
    assert_eq!(env.deployed(), [env.sysroot.commit_v1().to_string()]);
    assert!(
        !env.has_commit(&image.commit),
        "undeploying pruned the target's commit"
    );
}

/// The run after the kills deployed the target (v1 kept as rollback) on a sound node, and kept
/// no download.
pub(crate) fn assert_converged(env: &Env, image: &PushedImage, context: &str) {
    assert_eq!(
        env.deployed_images(),
        [image.commit.clone(), env.sysroot.commit_v1().to_string()]
    );
    assert_node_sound(env, image, context);
    assert!(!env.downloads().exists());
}

/// The layers of `image` a killed run recorded as imported (their objects staged).
pub(crate) fn recorded_layers<'a>(env: &Env, image: &'a PushedImage) -> Vec<&'a String> {
    image
        .layer_digests
        .iter()
        .filter(|d| env.download(d, "imported").exists())
        .collect()
}

/// The body bytes the proxy has sent of each layer of `image`.
pub(crate) fn layer_bytes_sent(proxy: &FaultProxy, image: &PushedImage) -> Vec<u64> {
    image
        .layer_digests
        .iter()
        .map(|d| proxy.body_bytes_sent(d))
        .collect()
}

/// Whether a killed run left a layer's download to resume (a layer in flight at the kill).
fn a_layer_was_in_flight(env: &Env, image: &PushedImage) -> bool {
    image
        .layer_digests
        .iter()
        .any(|d| std::fs::metadata(env.download(d, "partial")).is_ok_and(|m| m.len() > 0))
}

/// Prunes the target's commit when a killed run imported it but did not deploy it, so the next
/// run imports it again.
fn forget_undeployed_target(env: &Env, image: &PushedImage) {
    if !env.has_commit(&image.commit) || env.deployed().contains(&image.commit) {
        return;
    }
    let out = std::process::Command::new("ostree")
        .args(["prune", "--refs-only", "--repo"])
        .arg(env.sysroot.repo_path())
        .envs(pivot_testkit::pivot_test_env())
        .output()
        .expect("running ostree prune");
    assert!(out.status.success(), "ostree prune: {out:?}");
    assert!(
        !env.has_commit(&image.commit),
        "pruning left the undeployed target's commit"
    );
}

/// What must hold after any kill: the node boots (every boot entry's kernel, initramfs and
/// deployment exist, and one of them is v1 or the target), the repo is consistent, the
/// sysroot lock is free, pivot's state is readable.
pub(crate) fn assert_node_sound(env: &Env, image: &PushedImage, context: &str) {
    let root = &env.sysroot.path;
    let entries = env.sysroot.boot_entries().expect("reading boot entries");
    assert!(!entries.is_empty(), "no boot entry left {context}");
    let commits = [env.sysroot.commit_v1(), image.commit.as_str()];
    for (name, text) in &entries {
        let field = |key: &str| -> String {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key} ")))
                .unwrap_or_else(|| panic!("no {key} in {name} {context}:\n{text}"))
                .trim()
                .to_string()
        };
        for key in ["linux", "initrd"] {
            let path = field(key);
            assert!(
                root.join("boot")
                    .join(path.trim_start_matches('/'))
                    .is_file(),
                "{name}: {key} {path} is missing {context}"
            );
        }
        let options = field("options");
        let ostree = options
            .split(' ')
            .find_map(|o| o.strip_prefix("ostree="))
            .unwrap_or_else(|| panic!("{name} has no ostree= {context}: {options}"));
        let deployment = root.join(ostree.trim_start_matches('/'));
        let resolved = deployment
            .canonicalize()
            .unwrap_or_else(|e| panic!("{name}: ostree={ostree} does not resolve ({e}) {context}"));
        assert!(
            resolved.starts_with(root.canonicalize().unwrap()),
            "{name}: ostree={ostree} leads out of the sysroot: {}",
            resolved.display()
        );
        assert!(
            resolved.join("usr/lib/os-release").is_file(),
            "{name}: deployment {} is not a complete tree {context}",
            resolved.display()
        );
        let dir = resolved.file_name().unwrap().to_string_lossy().into_owned();
        let deployed = env.image_commit(dir.split('.').next().unwrap());
        assert!(
            commits.contains(&deployed.as_str()),
            "{name}: deployment {dir} is neither v1 nor the target {context}"
        );
    }
    assert!(
        entries.len() <= 2,
        "{} boot entries {context}: {entries:?}",
        entries.len()
    );
    assert_fsck_clean(env);
    let sysroot = ostree::Sysroot::new(Some(&ostree::gio::File::for_path(root)));
    assert!(
        sysroot.try_lock().expect("trying the sysroot lock"),
        "the sysroot lock is still held {context}"
    );
    sysroot.unlock();
    // Readable state and deployments.
    env.status_json();
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Trigger {
    /// Let the run finish.
    Never,
    /// SIGKILL this long after the start.
    After(Duration),
    /// SIGKILL once a progress event reports this many bytes of the image, plus a delay.
    Bytes(u64, Duration),
    /// SIGKILL this long after the deploying step began.
    Deploying(Duration),
    /// SIGKILL at about this fraction of the last layer's download (estimated from the first
    /// progress event of that layer and the proxy's rate).
    LastLayer(f64),
    /// Hold pivot in its write of the `done` event (it blocks on a full progress pipe), which
    /// comes after the deployment is written and before the state file is: SIGKILL there.
    BeforeStateSave,
}

impl Trigger {
    /// Whether the kill point lies on the download's and the import's timeline.
    fn needs_the_import(&self) -> bool {
        matches!(
            self,
            Trigger::After(_) | Trigger::Bytes(..) | Trigger::LastLayer(_)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Killed,
    Exited(Option<i32>),
}

/// One pivot process with its progress events on a pipe.
struct PivotRun {
    child: Child,
    events: File,
    /// Another open file description of the pipe's write end, non-blocking, to fill the pipe.
    filler: File,
    stderr_path: tempfile::NamedTempFile,
    started: Instant,
}

/// How a run went.
pub(crate) struct Outcome {
    ended: Ended,
    elapsed: Duration,
    pub(crate) stderr: String,
    total: Option<u64>,
    done_bytes: u64,
    at_importing: Option<Duration>,
    at_deploying: Option<Duration>,
    /// The `done` event was held back: the run was past its deployment.
    held_at_done: bool,
}

impl Outcome {
    /// Where the kill landed, from the last event seen.
    pub(crate) fn phase(&self) -> &'static str {
        if self.held_at_done {
            "deployed"
        } else if self.at_deploying.is_some() {
            "deploying"
        } else if self.at_importing.is_some() {
            "importing"
        } else {
            "pulling"
        }
    }
}

impl PivotRun {
    fn start(env: &Env, pullspec: &str) -> PivotRun {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two new descriptors that this function then owns.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the two descriptors pipe2 just made, owned by nothing else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let filler = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", write_end.as_raw_fd()))
            .expect("reopening the pipe's write end");
        let stderr_path = tempfile::NamedTempFile::new().unwrap();
        let fd_arg = PROGRESS_FD.to_string();
        let mut cmd = env.command(&["--progress-fd", &fd_arg, "--retry-timeout", "60", pullspec]);
        cmd.stdout(Stdio::null())
            .stderr(stderr_path.reopen().unwrap());
        pass_fd(&mut cmd, write_end.as_raw_fd(), PROGRESS_FD);
        let started = Instant::now();
        let child = cmd.spawn().expect("starting pivot");
        drop(write_end);
        PivotRun {
            child,
            events: File::from(read_end),
            filler,
            stderr_path,
            started,
        }
    }

    /// Follows the run's events until `trigger` fires (then SIGKILL) or the run ends.
    fn until(mut self, trigger: Trigger) -> Outcome {
        let mut out = Outcome {
            ended: Ended::Killed,
            elapsed: Duration::ZERO,
            stderr: String::new(),
            total: None,
            done_bytes: 0,
            at_importing: None,
            at_deploying: None,
            held_at_done: false,
        };
        let mut pending = Vec::new();
        let mut fire_at: Option<Instant> = match trigger {
            Trigger::After(d) => Some(self.started + d),
            _ => None,
        };
        let mut reading = true;
        let mut held_since: Option<Instant> = None;
        let deadline = self.started + Duration::from_secs(120);
        loop {
            let now = Instant::now();
            assert!(now < deadline, "pivot did not finish in 120 s");
            if fire_at.is_some_and(|t| now >= t) {
                break;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                // Events written just before the exit.
                self.read_events(&mut pending, &mut out, trigger, &mut fire_at);
                out.ended = Ended::Exited(status.code());
                out.elapsed = self.started.elapsed();
                out.stderr = std::fs::read_to_string(self.stderr_path.path()).unwrap_or_default();
                return out;
            }
            if let Some(since) = held_since {
                // Where /proc does not tell, the write has long blocked after a few seconds
                // (nothing is left to do but write `done`).
                if self.blocked_on_the_pipe() || since.elapsed() > Duration::from_secs(5) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if !reading {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let wait = fire_at
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(Duration::from_millis(20))
                .min(Duration::from_millis(20));
            let mut pfd = libc::pollfd {
                fd: self.events.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as i32) };
            if pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                let step = self.read_events(&mut pending, &mut out, trigger, &mut fire_at);
                if step == Some("deploying") && trigger == Trigger::BeforeStateSave {
                    // Stop reading and fill the pipe: pivot's next event (`done`) blocks.
                    self.fill_pipe();
                    out.held_at_done = true;
                    held_since = Some(Instant::now());
                    reading = false;
                }
                if pfd.revents & libc::POLLHUP != 0 && pfd.revents & libc::POLLIN == 0 {
                    reading = false;
                }
            }
        }
        // SAFETY: signalling our own child, which has not been waited for.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let status = self.child.wait().unwrap();
        out.elapsed = self.started.elapsed();
        if !out.held_at_done {
            // What pivot reported before it died tells where it was.
            self.read_events(&mut pending, &mut out, Trigger::Never, &mut None);
        }
        out.stderr = std::fs::read_to_string(self.stderr_path.path()).unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        out.ended = match status.signal() {
            Some(libc::SIGKILL) => Ended::Killed,
            _ => Ended::Exited(status.code()),
        };
        out
    }

    /// Reads what is available; updates `out` and arms `fire_at`. Returns the last step seen.
    fn read_events(
        &mut self,
        pending: &mut Vec<u8>,
        out: &mut Outcome,
        trigger: Trigger,
        fire_at: &mut Option<Instant>,
    ) -> Option<&'static str> {
        let mut buf = [0u8; 1 << 16];
        let mut last_step = None;
        let mut pfd = libc::pollfd {
            fd: self.events.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Only what is there now: never block on a pipe whose writer may be gone or stuck.
        // SAFETY: one valid pollfd.
        while unsafe { libc::poll(&mut pfd, 1, 0) } > 0 && pfd.revents & libc::POLLIN != 0 {
            let n = self.events.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
        }
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let event: serde_json::Value =
                serde_json::from_slice(&line).expect("a JSON Lines progress event");
            let now = self.started.elapsed();
            match event["event"].as_str() {
                Some("step") => {
                    let step = match event["step"].as_str() {
                        Some("importing") => {
                            out.at_importing.get_or_insert(now);
                            "importing"
                        }
                        Some("deploying") => {
                            out.at_deploying.get_or_insert(now);
                            if let Trigger::Deploying(d) = trigger {
                                *fire_at = Some(self.started + now + d);
                            }
                            "deploying"
                        }
                        _ => "pulling",
                    };
                    last_step = Some(step);
                    if step == "deploying" && trigger == Trigger::BeforeStateSave {
                        // Nothing after this event may be read.
                        pending.clear();
                        return last_step;
                    }
                }
                Some("start") => out.total = event["total"].as_u64(),
                Some("bytes") => {
                    out.done_bytes = event["total_done"].as_u64().unwrap_or(0);
                    match trigger {
                        Trigger::Bytes(at, delay) if out.done_bytes >= at && fire_at.is_none() => {
                            *fire_at = Some(Instant::now() + delay);
                        }
                        Trigger::LastLayer(fraction)
                            if event["layer"].as_u64() == Some(LAYERS as u64 - 1)
                                && fire_at.is_none() =>
                        {
                            let left = event["size"].as_u64().unwrap_or(0)
                                - event["done"].as_u64().unwrap_or(0);
                            let secs = fraction * left as f64 / THROTTLE as f64;
                            *fire_at = Some(Instant::now() + Duration::from_secs_f64(secs));
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        last_step
    }

    fn fill_pipe(&mut self) {
        let chunk = [b'#'; 4096];
        loop {
            match self.filler.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the progress pipe: {e}"),
            }
        }
        // Writes smaller than a page may still fit: fill to the last byte.
        while self.filler.write(b"#").is_ok() {}
    }

    /// A thread of pivot sleeps in a write to the (full) progress pipe.
    fn blocked_on_the_pipe(&self) -> bool {
        let tasks = Path::new("/proc")
            .join(self.child.id().to_string())
            .join("task");
        std::fs::read_dir(tasks)
            .into_iter()
            .flatten()
            .flatten()
            .any(|task| {
                std::fs::read_to_string(task.path().join("wchan"))
                    .is_ok_and(|w| w.contains("pipe_write"))
            })
    }
}

/// splitmix64: small, seedable, good enough to pick kill points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn duration(&mut self, from: Duration, to: Duration) -> Duration {
        let span = to.saturating_sub(from).as_micros() as u64;
        from + Duration::from_micros(self.below(span + 1))
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}
