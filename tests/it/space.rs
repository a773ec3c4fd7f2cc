//! Disk space: a pivot that cannot fit is refused before it downloads (repo) or deploys (/boot),
//! with numbers; one that runs out of space anyway leaves the sysroot as it was and frees what it
//! wrote. Sysroots live on size-limited tmpfs mounts, filled to the free space each case needs.
// unsafe: descriptors and locks set up for the pivot under test (libc).
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::common::*;
use pivot::node::progress::human;
use pivot_testkit::{Compression, ImageSpec, PushedImage, RawImage, RawLayer, RepoTar, Tmpfs};

const MIB: u64 = 1 << 20;

/// v2 with an 8 MiB file of noise: about 4 MiB of layer, 8 MiB of objects.
fn push_large_v2(env: &Env) -> PushedImage {
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &noise(8 << 20));
    env.push("v2-large", &ImageSpec::new(tree, "2"))
}

fn layers_size(env: &Env, image: &PushedImage) -> u64 {
    image
        .layer_digests
        .iter()
        .map(|d| {
            std::fs::metadata(env.registry.blob_data_path(d))
                .unwrap()
                .len()
        })
        .sum()
}

/// Takes up the free space of the filesystem holding `dir` until `leave` bytes are free.
fn fill(dir: &Path, leave: u64) -> PathBuf {
    let path = dir.join("filler");
    let free = free(dir);
    assert!(free > leave, "only {free} bytes free, {leave} wanted");
    let file = std::fs::File::create(&path).unwrap();
    // SAFETY: a valid descriptor; fallocate really allocates on tmpfs.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, (free - leave) as i64) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    path
}

fn free(dir: &Path) -> u64 {
    pivot::sysroot::space::free_bytes(dir).unwrap()
}

/// The sysroot repo's min-free-space reserve.
fn reserve(env: &Env) -> u64 {
    let repo = ostree::Repo::new_for_path(env.sysroot.repo_path());
    repo.open(ostree::gio::Cancellable::NONE).unwrap();
    repo.min_free_space_bytes().unwrap()
}

/// Names and total size of what is in the repo's tmp/.
fn tmp_contents(env: &Env) -> (Vec<String>, u64) {
    let tmp = env.sysroot.repo_path().join("tmp");
    let mut names: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let du = std::process::Command::new("du")
        .args(["-sb"])
        .arg(&tmp)
        .output()
        .unwrap();
    let size = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (names, size)
}

/// The sysroot, the repo's tmp/ and the free space of `dir` before a pivot that fails.
struct Before {
    snapshot: String,
    tmp: (Vec<String>, u64),
    free: u64,
}

impl Before {
    fn take(env: &Env, dir: &Path) -> Before {
        Before {
            snapshot: env.sysroot.snapshot().unwrap(),
            tmp: tmp_contents(env),
            free: free(dir),
        }
    }

    /// The sysroot as it was, fsck clean, and what the pivot wrote freed: the state file
    /// recording the failure is all that may remain.
    fn assert_unchanged(&self, env: &Env, dir: &Path) {
        assert_eq!(env.sysroot.snapshot().unwrap(), self.snapshot);
        assert_fsck_clean(env);
        assert_eq!(tmp_contents(env), self.tmp, "the repo's tmp/ changed");
        let (before, after) = (self.free, free(dir));
        assert!(
            after + 64 * 1024 >= before,
            "{before} bytes free before, {after} after"
        );
    }
}

/// The `<n> <unit>` after `prefix` in `text`, in bytes.
fn figure_after(text: &str, prefix: &str) -> u64 {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in {text}"))
        + prefix.len();
    let mut words = text[at..].split_whitespace();
    let value: f64 = words.next().unwrap().parse().unwrap();
    let unit = words.next().unwrap().trim_end_matches(',');
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB as f64,
        "GiB" => (MIB << 10) as f64,
        other => panic!("unit {other:?} in {text}"),
    };
    (value * scale) as u64
}

/// A sysroot on a 64 MiB tmpfs with v2-large pushed.
struct Tight {
    env: Env,
    image: PushedImage,
    /// The image's layers' size.
    layers: u64,
    /// The repo's min-free-space reserve.
    reserve: u64,
    tmpfs: Tmpfs,
}

fn tight() -> Tight {
    let tmpfs = Tmpfs::mount(64 * MIB).unwrap();
    let env = Env::new_in(tmpfs.path());
    let image = push_large_v2(&env);
    let layers = layers_size(&env, &image);
    let reserve = reserve(&env);
    Tight {
        env,
        image,
        layers,
        reserve,
        tmpfs,
    }
}

/// pivot's pre-flight estimate for `layers` bytes of layers, none of them spooled yet.
fn estimate(layers: u64) -> pivot::sysroot::space::Needs {
    pivot::sysroot::space::repo_needs(
        &[pivot::sysroot::space::Layer {
            size: layers,
            spooled: 0,
            checkpointed: false,
        }],
        pivot::sysroot::space::EXPANSION,
    )
}

#[test]
fn an_image_the_repo_has_no_room_for_is_refused_before_any_download() {
    // tmpfs first: bindings drop in reverse order, the sysroot before its filesystem.
    let Tight {
        tmpfs,
        env,
        image,
        layers,
        ..
    } = tight();
    // Room for the layers twice: not for the objects they become.
    fill(tmpfs.path(), 2 * layers);
    let before = env.sysroot.snapshot().unwrap();

    let out = env.pivot(&[&image.by_tag]);
    let repo = env.sysroot.repo_path();
    let needs = estimate(layers).objects;
    assert_fails_with(
        &out,
        &[
            &format!("not enough space in {}: ", repo.display()),
            &format!("the image needs about {}, ", human(needs)),
            " free",
        ],
    );
    let err = stderr(&out);
    let free = figure_after(&err, &format!("{}, ", human(needs)));
    assert!(
        free <= 2 * layers && free + 4 * MIB >= 2 * layers,
        "reported {free} free, about {} expected:\n{err}",
        2 * layers
    );
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
    for layer in &image.layer_digests {
        assert_eq!(
            env.registry.count_requests("GET", layer),
            0,
            "a layer was downloaded"
        );
    }
    assert!(!repo.join("tmp/pivot-downloads").exists());
}

#[test]
fn an_image_with_room_for_its_objects_but_not_its_partial_downloads_is_pivoted_without_them() {
    let Tight {
        tmpfs,
        env,
        image,
        layers,
        reserve,
    } = tight();
    let needs = estimate(layers);
    // Room for the objects and half the download: not for both.
    fill(tmpfs.path(), needs.objects + needs.spools / 2 + reserve);

    let out = env.pivot(&[&image.by_tag]);
    assert_success(&out);
    let err = stderr(&out);
    assert!(
        err.contains("going on without partial downloads"),
        "no word of dropping the partial downloads:\n{err}"
    );
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        image.commit.as_str()
    );
    assert_fsck_clean(&env);
}

#[test]
fn running_out_of_space_mid_import_leaves_the_sysroot_as_it_was_and_frees_what_it_wrote() {
    let tmpfs = Tmpfs::mount(64 * MIB).unwrap();
    let env = Env::new_in(tmpfs.path());
    // 16 MiB of text that compresses a thousandfold: far more objects than the pre-flight
    // check's estimate of three times the layer, so the import meets a real ENOSPC.
    let tree = fixture("os-v2").with_file(
        "usr/share/pivot/payload",
        0o644,
        &"pivot fills the disk\n".repeat(800_000),
    );
    let image = env.push("v2-compressible", &ImageSpec::new(tree, "2"));
    let needs = estimate(layers_size(&env, &image));
    let reserve = reserve(&env);
    fill(
        tmpfs.path(),
        needs.objects + needs.spools + reserve + 4 * MIB,
    );
    let before = Before::take(&env, tmpfs.path());

    let out = env.pivot(&[&image.by_tag]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        !err.contains("not enough space"),
        "the pre-flight check refused it:\n{err}"
    );
    assert!(
        err.contains("No space left on device") || err.contains("min-free-space"),
        "{err}"
    );
    assert!(err.contains("fetching layer 1/1"), "{err}");

    before.assert_unchanged(&env, tmpfs.path());
}

/// The same for an ostree-native image, whose files pivot writes itself (not libostree): the
/// repo's min-free-space reserve stops the import as libostree's would, and without a reserve
/// the disk does; either way nothing of the image stays.
#[test]
fn running_out_of_space_mid_import_of_a_native_image_leaves_the_sysroot_as_it_was() {
    native_out_of_space(
        None,
        "writing file object: min-free-space-percent '3%' would be exceeded",
    );
    native_out_of_space(
        Some("0"),
        "writing file object: writing the file: No space left on device",
    );
}

/// A native image of far more objects than the room left, pivoted with the repo's
/// `core.min-free-space-percent` set to `percent` (else libostree's default); `expected` is
/// the error.
fn native_out_of_space(percent: Option<&str>, expected: &str) {
    let tmpfs = Tmpfs::mount(64 * MIB).unwrap();
    let env = Env::new_in(tmpfs.path());
    if let Some(percent) = percent {
        let repo = format!("--repo={}", env.sysroot.repo_path().display());
        let set = [
            "config",
            &repo,
            "set",
            "core.min-free-space-percent",
            percent,
        ];
        assert!(std::process::Command::new("ostree")
            .args(set)
            .status()
            .unwrap()
            .success());
    }
    // 24 files of 1.6 MiB of text that compresses a thousandfold, each written by pivot itself
    // (up to 2 MiB): far more than the pre-flight check's estimate of three times the layers.
    let mut tree = fixture("os-v2");
    for i in 0..24 {
        let text = format!("pivot fills the disk {i}\n").repeat(70_000);
        tree = tree.with_file(&format!("usr/share/pivot/payload-{i}"), 0o644, &text);
    }
    let oci = crate::native::encapsulate_signed(&tree, false, Some("chunked"), None);
    let image = crate::native::push_native_images(&env, &oci).pullspec(&env, "chunked");
    fill(tmpfs.path(), 12 * MIB + reserve(&env));
    let before = Before::take(&env, tmpfs.path());

    let out = env.pivot(&[&image]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(expected), "{err}");

    before.assert_unchanged(&env, tmpfs.path());
}

#[test]
fn a_kernel_that_boot_has_no_room_for_is_refused_before_deploying() {
    let tmpfs = Tmpfs::mount(64 * MIB).unwrap();
    let env = Env::new_in(tmpfs.path());
    let boot = env.sysroot.path.join("boot");
    let boot_fs = Tmpfs::mount_over(&boot, 8 * MIB).unwrap();
    let tree = fixture("os-v2").with_file(
        "usr/lib/modules/6.1.0-pivot/vmlinuz",
        0o644,
        &noise(3 << 20),
    );
    let image = env.push("v2-new-kernel", &ImageSpec::new(tree, "2"));
    let filler = fill(boot_fs.path(), 2 * MIB);
    let before = env.sysroot.snapshot().unwrap();
    let entries_before = env.sysroot.boot_entries().unwrap();

    let out = env.pivot(&[&image.by_tag]);
    assert_fails_with(
        &out,
        &[
            &format!("not enough space in {}: ", boot.display()),
            &format!("the kernel and initramfs of {} need about 3.", image.commit),
            " MiB free",
        ],
    );
    let err = stderr(&out);
    let needed = figure_after(&err, "need about ");
    assert!((3 * MIB..4 * MIB).contains(&needed), "{err}");
    // Nothing was deployed; the imported commit stays in the repo, unreferenced, so that the
    // run after /boot is cleaned up does not download it again.
    assert_eq!(env.sysroot.boot_entries().unwrap(), entries_before);
    let without_objects = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("== repo objects"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        without_objects(&env.sysroot.snapshot().unwrap()),
        without_objects(&before)
    );
    assert_fsck_clean(&env);
    assert!(stderr(&out).contains("imported "), "{}", stderr(&out));

    // With room again, the next run deploys it without downloading it again.
    std::fs::remove_file(&filler).unwrap();
    let out = env.pivot(&[&image.by_tag]);
    assert_success(&out);
    assert!(
        stderr(&out).contains("already in the repo"),
        "{}",
        stderr(&out)
    );

    // A kernel /boot already holds (same boot checksum) needs no room: v2's is v1's, and goes
    // in with less free space than its margin.
    fill(boot_fs.path(), 96 * 1024);
    let v2 = env.push_v2();
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    drop(boot_fs);
}

/// An image that carries one layer twice (OCI allows it) needs room for it once: the second
/// copy makes no new objects, and the two are imported one after the other, from one spool.
#[test]
fn a_layer_the_image_carries_twice_needs_room_for_it_once() {
    let tmpfs = Tmpfs::mount(64 * MIB).unwrap();
    let env = Env::new_in(tmpfs.path());
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &noise(8 << 20));
    let repo = RepoTar::build(&tree, "2").unwrap();
    let layer = RawLayer::new(&repo.tar, Compression::Gzip).unwrap();
    let one = pivot::sysroot::space::Layer {
        size: layer.blob.len() as u64,
        spooled: 0,
        checkpointed: true,
    };
    let image = RawImage::new(vec![layer.clone(), layer], Some(&repo.commit));
    let pushed = image.push(&env.registry, "pivot/os", "twice").unwrap();
    let reserve = reserve(&env);
    let needs = |layers: &[pivot::sysroot::space::Layer]| {
        let needs = pivot::sysroot::space::repo_needs(layers, pivot::sysroot::space::EXPANSION);
        needs.objects + needs.spools + reserve
    };
    let (once, twice) = (needs(&[one]), needs(&[one, one]));
    let _filler = fill(tmpfs.path(), once + MIB);
    assert!(
        twice > free(tmpfs.path()),
        "the test needs room for one copy only"
    );

    let out = env.pivot(&[&pushed.by_tag]);
    assert_success(&out);
    assert_eq!(
        std::fs::read(env.deployment(0).join("usr/share/pivot/payload"))
            .unwrap()
            .len(),
        8 << 20
    );
}
