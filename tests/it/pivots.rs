//! pivot against a real registry and real libostree sysroots: the paths that succeed.

use crate::common::*;
use pivot_testkit::{CommitLabel, Compression, ImageSpec, ManifestFormat};

#[test]
fn pivot_deploys_v2_with_etc_merge_kargs_boot_entry_and_rollback() {
    let env = Env::new();
    let v2 = env.push_v2();
    let v1_commit = env.sysroot.commit_v1().to_string();
    // Admin edits in v1's /etc: a changed file and a new one.
    let etc = env.default_etc();
    std::fs::write(etc.join("hostname"), "node-7\n").unwrap();
    std::fs::write(etc.join("admin-note.conf"), "set by the admin\n").unwrap();

    let out = env.pivot(&[&v2.by_tag]);
    assert_success(&out);

    // The new deployment is the default, v1 the rollback.
    let status = env.status_json();
    let deployments = status["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 2, "{status:#}");
    let (new, old) = (&deployments[0], &deployments[1]);
    assert_eq!(new["checksum"], v2.commit.as_str());
    assert_eq!(new["stateroot"], STATEROOT);
    assert_eq!(new["version"], "2");
    assert_eq!(
        new["image"],
        format!("{}/pivot/os@{}", env.registry.host(), v2.digest).as_str()
    );
    assert_eq!(
        (new["default"].as_bool(), new["rollback"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(
        (new["booted"].as_bool(), new["staged"].as_bool()),
        (Some(false), Some(false))
    );
    assert_eq!(old["checksum"], v1_commit.as_str());
    assert_eq!(old["version"], "1");
    assert_eq!(
        (old["default"].as_bool(), old["rollback"].as_bool()),
        (Some(false), Some(true))
    );
    let last = &status["pivot"][STATEROOT]["last"];
    assert_eq!(last["outcome"], "deployed");
    assert_eq!(last["digest"], v2.digest.as_str());
    assert_eq!(last["commit"], v2.commit.as_str());
    assert_eq!(last["source"], "argument");

    // The origin records the image the way rpm-ostree-era tools read it.
    let origin = read(&env.sysroot.path.join(format!(
        "ostree/deploy/{STATEROOT}/deploy/{}.0.origin",
        v2.commit
    )));
    assert!(
        origin.contains(&format!("refspec={}\n", v2.commit)),
        "{origin}"
    );
    assert!(
        origin.contains(&format!(
            "custom-url=pivot://{}/pivot/os@{}\n",
            env.registry.host(),
            v2.digest
        )),
        "{origin}"
    );
    assert!(
        origin.contains("custom-description=Managed by pivot: "),
        "{origin}"
    );

    // libostree wrote a BLS entry for v2 with the carried kernel arguments.
    let entries = env.sysroot.boot_entries().unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let (_, entry) = entries
        .iter()
        .find(|(_, text)| text.contains("title Pivot Test OS 2"))
        .expect("a boot entry for v2");
    let field = |key: &str| -> String {
        entry
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in {entry}"))
            .to_string()
    };
    let options = field("options");
    for karg in KARGS {
        assert!(
            options.split(' ').any(|o| o == karg),
            "{karg} not carried: {options}"
        );
    }
    assert!(options.contains("ostree=/ostree/boot."), "{options}");
    assert!(
        options.ends_with(&format!("/{STATEROOT}/{}/0", bootcsum_of(&field("linux")))),
        "{options}"
    );
    for key in ["linux", "initrd"] {
        let path = field(key);
        assert!(
            path.starts_with(&format!("/ostree/{STATEROOT}-")),
            "{key} {path}"
        );
        assert!(
            env.sysroot.path.join("boot").join(&path[1..]).is_file(),
            "{key} {path} missing in /boot"
        );
    }
    assert!(field("linux").ends_with("/vmlinuz-6.1.0-pivot"));
    assert!(field("initrd").ends_with("/initramfs-6.1.0-pivot.img"));

    // /etc merged three ways: admin changes kept, v2's new default taken where untouched.
    let new_etc = env.default_etc();
    assert_eq!(read(&new_etc.join("hostname")), "node-7\n");
    assert_eq!(read(&new_etc.join("admin-note.conf")), "set by the admin\n");
    assert!(read(&new_etc.join("pivot-test.conf")).contains("feature-v2=on"));
    assert!(env
        .deployment(0)
        .join("usr/share/pivot/v2-marker")
        .is_file());

    // The sysroot's repo is consistent.
    assert_fsck_clean(&env);
}

/// `ostree=/ostree/boot.N/<stateroot>/<bootcsum>/<serial>` names the kernel's boot checksum.
fn bootcsum_of(linux: &str) -> String {
    let dir = linux
        .trim_start_matches("/ostree/")
        .split('/')
        .next()
        .unwrap();
    dir.rsplit('-').next().unwrap().to_string()
}

#[test]
fn already_at_target_is_a_noop_without_contacting_the_registry() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_digest]));
    let before = env.sysroot.snapshot().unwrap();
    env.registry.stop();

    let out = env.pivot(&[&v2.by_digest]);
    assert_success(&out);
    assert!(
        stderr(&out).contains("already at target"),
        "{}",
        stderr(&out)
    );
    let out = env.pivot(&["--unchanged-exit-77", &v2.by_digest]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
}

#[test]
fn tag_is_resolved_once_then_everything_goes_by_digest() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));

    let by_tag = env
        .registry
        .count_requests("GET", "/v2/pivot/os/manifests/v2")
        + env
            .registry
            .count_requests("HEAD", "/v2/pivot/os/manifests/v2");
    assert_eq!(
        by_tag,
        1,
        "tag manifest requests:\n{:?}",
        env.registry.requests()
    );
    // Every other read names a digest.
    for request in env.registry.requests() {
        let read = request.method == "GET" || request.method == "HEAD";
        if read
            && request.path.starts_with("/v2/pivot/")
            && !request.path.ends_with("/manifests/v2")
        {
            assert!(request.path.contains("sha256:"), "{request:?}");
        }
    }
    // A second run by tag resolves the tag again (it may have moved), and finds nothing to do.
    let out = env.pivot(&["--unchanged-exit-77", &v2.by_tag]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
}

#[test]
fn docker_manifest_list_resolves_to_the_host_platform() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.format = ManifestFormat::DockerV2S2;
    spec.index = true;
    let image = env.push("v2-docker", &spec);
    assert_success(&env.pivot(&[&image.by_tag]));
    let status = env.status_json();
    assert_eq!(status["deployments"][0]["checksum"], image.commit.as_str());
    // The origin names the list's digest: the one the pullspec resolves to.
    assert!(status["deployments"][0]["image"]
        .as_str()
        .unwrap()
        .ends_with(&image.digest));
}

#[test]
fn oci_index_with_zstd_layers_split_across_layers_is_imported() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.compression = Compression::Zstd;
    spec.index = true;
    spec.layers = 3;
    let image = env.push("v2-zstd", &spec);
    assert_success(&env.pivot(&[&image.by_digest]));
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        image.commit.as_str()
    );
}

#[test]
fn uncompressed_layers_and_single_ref_fallback_are_imported() {
    let env = Env::new();
    let mut spec = ImageSpec::new(fixture("os-v2"), "2");
    spec.compression = Compression::None;
    spec.commit_label = CommitLabel::Omit;
    let image = env.push("v2-plain", &spec);
    assert_success(&env.pivot(&[&image.by_tag]));
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        image.commit.as_str()
    );
}

#[test]
fn pullspec_file_drives_the_pivot_and_is_removed_once_the_target_runs() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    let v1_etc = env.default_etc();
    std::fs::create_dir_all(v1_etc.join("pivot")).unwrap();
    std::fs::write(
        v1_etc.join("pivot/image-pullspec"),
        format!("  {}\n", v2.by_tag),
    )
    .unwrap();

    assert_success(&env.pivot(&[]));
    let status = env.status_json();
    assert_eq!(status["deployments"][0]["checksum"], v2.commit.as_str());
    assert_eq!(status["pivot"][STATEROOT]["attempts"], 1);
    assert_eq!(status["pivot"][STATEROOT]["last"]["source"], "file");
    // The file came along in the /etc merge: the next boot checks it took effect.
    let v2_file = env.default_etc().join("pivot/image-pullspec");
    assert!(v2_file.exists());

    // Next run (the next boot): the node is on the target, so the file has done its job —
    // known from the deployment's origin, without the registry.
    env.registry.stop();
    let out = env.pivot(&["--unchanged-exit-77"]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
    assert!(
        !v2_file.exists(),
        "the pullspec file is removed once the target runs"
    );
    let status = env.status_json();
    assert_eq!(status["pivot"][STATEROOT]["last"]["outcome"], "confirmed");
    assert_eq!(status["pivot"][STATEROOT]["attempts"], 0);
    assert!(status["pivot"][STATEROOT]["target"].is_null());
    // With the file gone, pivot has nothing to do and says why.
    assert_fails_with(
        &env.pivot(&[]),
        &["no pullspec given", "image-pullspec does not exist"],
    );
}

#[test]
fn keep_holds_the_commit_under_a_ref() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&["--keep", &v2.by_tag]));
    let refs = std::process::Command::new("ostree")
        .args(["refs", "--repo"])
        .arg(env.sysroot.repo_path())
        .output()
        .unwrap();
    let refs = String::from_utf8_lossy(&refs.stdout);
    assert!(refs.lines().any(|r| r == "pivot/pivot/os"), "{refs}");
    let rev = std::process::Command::new("ostree")
        .args(["rev-parse", "--repo"])
        .arg(env.sysroot.repo_path())
        .arg("pivot/pivot/os")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&rev.stdout).trim(), v2.commit);
}

#[test]
fn logs_carry_no_terminal_escape_codes_when_not_on_a_terminal() {
    let env = Env::new();
    let v2 = env.push_v2();
    let out = env.pivot(&[&v2.by_tag]);
    assert_success(&out);
    assert!(!out.stderr.contains(&0x1b), "{}", stderr(&out));
    assert!(stderr(&out).contains(&v2.commit));
    // Progress comes as plain lines instead of bars.
    assert!(
        stderr(&out).contains("fetching layer 1/1: "),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("(100%)"), "{}", stderr(&out));
}

#[test]
fn human_status_shows_versions_images_and_flags() {
    let env = Env::new();
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pivot"))
        .args(["status", "--sysroot"])
        .arg(&env.sysroot.path)
        .output()
        .unwrap();
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let image = format!("pivot://{}/pivot/os@{}", env.registry.host(), v2.digest);
    assert!(text.contains(&format!("  {image} (default)\n")), "{text}");
    assert!(text.contains(&format!("Commit: {}", v2.commit)), "{text}");
    assert!(
        text.contains("Version: 2") && text.contains("Version: 1"),
        "{text}"
    );
    assert!(
        text.contains(&format!("Stateroot: {STATEROOT} (serial 0)")),
        "{text}"
    );
    assert!(text.contains("(rollback)"), "{text}");
    assert!(text.contains("Last pivot (pivot-test): deployed"), "{text}");
}

#[test]
fn large_files_stream_into_the_repo_intact() {
    let env = Env::new();
    // Larger than what is written from memory, compressed or not.
    let payload = noise(6 << 20);
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &payload);
    let image = env.push("v2-large", &ImageSpec::new(tree, "2"));
    assert_success(&env.pivot(&[&image.by_tag]));
    let deployed = env.deployment(0).join("usr/share/pivot/payload");
    assert!(
        read(&deployed) == payload,
        "the 6 MiB file came out different"
    );
    assert_fsck_clean(&env);
}

#[test]
fn progress_fd_reports_steps_bytes_and_the_outcome_as_json_lines() {
    use std::os::fd::AsRawFd;
    let env = Env::new();
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &noise(3 << 20));
    let image = env.push("v2-progress", &ImageSpec::new(tree, "2"));
    let events_path = env.dir().join("events.jsonl");
    let events_file = std::fs::File::create(&events_path).unwrap();
    let fd = events_file.as_raw_fd();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pivot"));
    cmd.args(["--progress-fd", "200", "--sysroot"])
        .arg(&env.sysroot.path)
        .arg(&image.by_tag)
        .env("CONTAINERS_REGISTRIES_CONF", &env.registries_conf)
        .envs(pivot_testkit::pivot_test_env());
    pass_fd(&mut cmd, fd, 200);
    let out = cmd.output().unwrap();
    assert_success(&out);
    let events: Vec<serde_json::Value> = read(&events_path)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect();
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| e["step"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["pulling", "importing", "deploying"], "{events:?}");
    let start = events.iter().find(|e| e["event"] == "start").unwrap();
    let total = start["total"].as_u64().unwrap();
    assert_eq!(
        start["layers"][0]["digest"],
        image.layer_digests[0].as_str()
    );
    let last_bytes = events.iter().rfind(|e| e["event"] == "bytes").unwrap();
    assert_eq!(last_bytes["total_done"].as_u64(), Some(total));
    assert_eq!(last_bytes["done"], last_bytes["size"]);
    let done = events.last().unwrap();
    assert_eq!(
        (done["event"].as_str(), done["outcome"].as_str()),
        (Some("done"), Some("deployed"))
    );
    assert_eq!(done["bytes"].as_u64(), Some(total));
}

#[test]
fn a_terminal_gets_progress_bars_and_a_summary_line() {
    let env = Env::new();
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &noise(3 << 20));
    let image = env.push("v2-tty", &ImageSpec::new(tree, "2"));
    // script(1) gives pivot a pseudo-terminal, as an admin's shell would.
    let command = format!(
        "{} --sysroot {} {}",
        env!("CARGO_BIN_EXE_pivot"),
        env.sysroot.path.display(),
        image.by_tag
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("CONTAINERS_REGISTRIES_CONF", &env.registries_conf)
        .env_remove("JOURNAL_STREAM")
        .envs(pivot_testkit::pivot_test_env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("layer 1/1 [") && text.contains("ETA"),
        "{text}"
    );
    assert!(text.contains("#####"), "{text}");
    assert!(text.contains("fetched ") && text.contains("/s)"), "{text}");
}

#[test]
fn two_pivots_at_once_make_one_deployment() {
    let env = Env::new();
    let v2 = env.push_v2();
    let first = env.spawn_pivot(&[&v2.by_tag]);
    let second = env.spawn_pivot(&[&v2.by_digest]);
    let (first, second) = (
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    );
    assert_success(&first);
    assert_success(&second);
    let status = env.status_json();
    let deployments = status["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 2, "{status:#}");
    assert_eq!(deployments[0]["checksum"], v2.commit.as_str());
    let both = stderr(&first) + &stderr(&second);
    assert!(
        both.contains("deployed while waiting for the sysroot lock")
            || both.contains("already at target"),
        "{both}"
    );
}

#[test]
fn two_pivots_to_different_targets_make_one_deployment_and_the_other_says_why() {
    let env = Env::new();
    let v2 = env.push_v2();
    let tree = fixture("os-v2").with_file("usr/share/pivot/v3-marker", 0o644, "v3\n");
    let v3 = env.push("v3", &ImageSpec::new(tree, "3"));
    // The sysroot lock is held until both runs have looked at the deployments and wait for it:
    // each saw only v1, and one of them is bound to find that view stale.
    let sysroot = ostree::Sysroot::new(Some(&ostree::gio::File::for_path(&env.sysroot.path)));
    sysroot.lock().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let spawn = |name: &str, pullspec: &str| {
        let log = logs.path().join(name);
        let child = env
            .command(&[pullspec])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (child, log)
    };
    let mut runs = [spawn("v2", &v2.by_tag), spawn("v3", &v3.by_tag)];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !runs
        .iter()
        .all(|(_, log)| read(log).contains("another process holds the sysroot lock"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the runs never waited for the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    sysroot.unlock();
    let codes: Vec<Option<i32>> = runs
        .iter_mut()
        .map(|(child, _)| child.wait().unwrap().code())
        .collect();
    let logs: Vec<String> = runs.iter().map(|(_, log)| read(log)).collect();
    let (winner, loser) = match codes.as_slice() {
        [Some(0), Some(1)] => (0, 1),
        [Some(1), Some(0)] => (1, 0),
        other => panic!("expected one success and one failure, got {other:?}:\n{logs:#?}"),
    };
    assert!(
        logs[loser].contains(
            "the deployments changed while waiting for the sysroot lock; run pivot again"
        ),
        "{}",
        logs[loser]
    );
    let winner_commit = [&v2.commit, &v3.commit][winner];
    let loser_commit = [&v2.commit, &v3.commit][loser];
    let status = env.status_json();
    let deployments = status["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 2, "{status:#}");
    assert_eq!(deployments[0]["checksum"], winner_commit.as_str());
    assert_eq!(deployments[1]["checksum"], env.sysroot.commit_v1());
    // The refusal came before any download: nothing of the other image is in the repo.
    assert!(!env.has_commit(loser_commit));
    assert_fsck_clean(&env);
    // Run again, as told: it deploys on top of the winner.
    let again = [&v2.by_tag, &v3.by_tag][loser];
    assert_success(&env.pivot(&[again]));
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        loser_commit.as_str()
    );
}

#[test]
fn files_pivot_writes_under_var_and_in_the_repo_are_private() {
    use pivot_testkit::{Fault, FaultProxy};
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o7777
    };
    let mut env = Env::new();
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &noise(1 << 20));
    let v2 = env.push("v2", &ImageSpec::new(tree, "2"));
    let blob = &v2.layer_digests[0];
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(
        Fault::stall_after(&format!("/blobs/{blob}"), 100_000, Duration::from_secs(300))
            .method("GET"),
    );
    insecure_via(&mut env, &proxy);
    let pullspec = format!("{}/pivot/os:v2", proxy.host());

    // A download in progress is spooled in a private directory.
    let mut child = env.spawn_pivot(&["--retry-timeout", "60", &pullspec]);
    let spools = env.downloads();
    let spool = env.download(blob, "partial");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&spool).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "nothing was spooled");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(mode(&spools), 0o700);
    assert_eq!(mode(&spool), 0o600);
    child.kill().unwrap();
    child.wait().unwrap();

    assert_success(&env.pivot(&["--retry-timeout", "60", &pullspec]));
    let state = env.sysroot.path.join(format!(
        "ostree/deploy/{STATEROOT}/var/lib/pivot/state.json"
    ));
    assert_eq!(mode(&state), 0o600);
    assert_eq!(mode(state.parent().unwrap()), 0o700);
    // Only pivot's own directory is closed: /var/lib stays readable to other services.
    assert_eq!(
        mode(state.parent().unwrap().parent().unwrap()) & 0o055,
        0o055
    );
    // No temporary state file was left behind.
    let names: Vec<_> = std::fs::read_dir(state.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["state.json"]);
}
