//! An import cut by a reboot or a power cut: libostree passes the killed transaction's staging
//! directory over in the next boot, and pivot takes back the objects its records and checkpoint
//! name, each checked against its checksum, so the next pivot fetches only what was missing.
//!
//! A reboot is played by renaming the killed run's staging directories after another boot id
//! (libostree names them `staging-<boot id>-*` and reuses only its own boot's).

use std::path::Path;

use crate::common::*;
use crate::crash::{assert_converged, killed_in_the_last_layer, layer_bytes_sent, recorded_layers};
use pivot_testkit::Tmpfs;

/// A boot that is not this one.
const EARLIER_BOOT: &str = "0badc0de-0000-4000-8000-000000000000";

#[test]
fn after_a_reboot_the_objects_a_killed_import_staged_are_taken_back_and_only_the_rest_fetched() {
    let tmpfs = Tmpfs::mount(512 << 20).expect("mounting a tmpfs for the sysroot");
    let mut env = Env::new_in(tmpfs.path());
    let (image, proxy, pullspec, run) = killed_in_the_last_layer(&mut env);
    assert_eq!(run.phase(), "importing", "{}", run.stderr);
    let imported = recorded_layers(&env, &image);
    assert!(
        imported.len() >= 2,
        "only {} layers were recorded as imported before the kill",
        imported.len()
    );
    let last = &image.layer_digests[image.layer_digests.len() - 1];
    let checkpointed = env.download(last, "checkpoint").exists();

    // The reboot; and one object of the first recorded layer did not reach the disk whole.
    let tmp = env.sysroot.repo_path().join("tmp");
    move_staging_to_an_earlier_boot(&tmp);
    let damaged_layer = imported[0];
    let damaged = damage_a_file_object(&tmp, &env.download(damaged_layer, "imported"));

    let sent_before = layer_bytes_sent(&proxy, &image);
    let out = env.pivot(&[&pullspec]);
    assert_success(&out);
    let err = stderr(&out);
    assert!(
        err.contains("objects an import cut by a reboot had staged (1 did not read back whole)"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{damaged_layer} was imported by an earlier run, but object {damaged} is no longer in the repo"
        )),
        "{err}"
    );
    for (i, digest) in image.layer_digests.iter().enumerate() {
        let sent = proxy.body_bytes_sent(digest) - sent_before[i];
        if digest == damaged_layer {
            assert!(
                sent > 0,
                "{digest}, with a damaged object, was not fetched again"
            );
        } else if imported.contains(&digest) {
            assert_eq!(sent, 0, "{digest} was fetched again: {err}");
            assert!(
                err.contains(&format!(
                    "{digest} was imported by an earlier run: not fetched again"
                )),
                "{err}"
            );
        }
    }
    if checkpointed {
        assert!(
            err.contains(&format!("{last} resumes from a checkpoint")),
            "{err}"
        );
    }
    // The damaged copy never reached the repo: fsck is clean.
    assert_converged(&env, &image, "after the run that followed the reboot");
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("staging-") || n.starts_with("pivot-adopt-"))
        .collect();
    assert!(left.is_empty(), "left in the repo's tmp: {left:?}");
}

/// Renames this boot's staging directories (and lock files) after [`EARLIER_BOOT`].
fn move_staging_to_an_earlier_boot(tmp: &Path) {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let ours = format!("staging-{}-", boot.trim());
    let mut moved = 0;
    for name in pivot::import::staging::staging_dirs(tmp) {
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix(&ours) {
            let to = tmp.join(format!("staging-{EARLIER_BOOT}-{rest}"));
            std::fs::rename(tmp.join(&*name), to).unwrap();
            moved += 1;
        }
    }
    assert!(moved > 0, "the killed run left no staging directory");
}

/// Changes a byte of a file object the layer record at `record` names, in the earlier boot's
/// staging directory (a write the power cut cut short); returns the object's loose name.
fn damage_a_file_object(tmp: &Path, record: &Path) -> String {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
    let names = record["objects"].as_array().expect("a record's objects");
    for name in names.iter().filter_map(|n| n.as_str()) {
        let Some(checksum) = name.strip_suffix(".file") else {
            continue;
        };
        let loose = format!("{}/{}.file", &checksum[..2], &checksum[2..]);
        for dir in pivot::import::staging::staging_dirs(tmp) {
            let path = tmp.join(dir).join(&loose);
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() || meta.len() == 0 {
                continue;
            }
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[0] ^= 0xff;
            std::fs::write(&path, bytes).unwrap();
            return name.to_string();
        }
    }
    panic!("no regular file object of the record is staged");
}

#[test]
fn an_earlier_boots_staging_directory_that_cannot_be_read_costs_downloads_not_the_pivot() {
    let env = Env::new();
    let v2 = env.push_v2();
    // An earlier boot's staging directory, and in the way of the repo pivot reads it through, a
    // file it cannot remove as a directory.
    let tmp = env.sysroot.repo_path().join("tmp");
    let name = format!("staging-{EARLIER_BOOT}-stuck");
    std::fs::create_dir_all(tmp.join(&name)).unwrap();
    let shell = tmp.join(format!("pivot-adopt-{name}"));
    std::fs::write(&shell, "not a repo").unwrap();
    let out = env.pivot(&[&v2.by_tag]);
    assert_success(&out);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "taking back what an import before the last reboot staged: removing ostree/repo/tmp/pivot-adopt-{name}: "
        )) && err.contains(": the layers it held are fetched again"),
        "{err}"
    );
    let status = env.status_json();
    assert_eq!(
        status["pivot"][STATEROOT]["last"]["commit"],
        v2.commit.as_str()
    );
}
