//! Pushed oscontainers checked by an independent peer (skopeo) and by the ostree CLI.

use anyhow::{bail, ensure, Context, Result};
use pivot_testkit::{
    push_oscontainer, sha256_digest, CommitLabel, Compression, ImageSpec, ManifestFormat,
    PushedImage, Registry, Tree, COMMIT_LABEL, DECOY_COMMIT,
};
use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    ensure!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

fn inspect(reference: &str, raw: bool) -> Result<Vec<u8>> {
    let image = format!("docker://{reference}");
    let mut args = vec!["inspect", "--tls-verify=false"];
    if raw {
        args.push("--raw");
    }
    args.push(&image);
    run("skopeo", &args)
}

fn json(bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes).context("parsing JSON")
}

/// Copies `reference` into an OCI layout at `dest` with skopeo.
fn copy_to_oci(reference: &str, dest: &Path, all: bool) -> Result<()> {
    let src = format!("docker://{reference}");
    let dst = format!("oci:{}:img", dest.display());
    let mut args = vec![
        "--insecure-policy",
        "copy",
        "--quiet",
        "--src-tls-verify=false",
    ];
    if all {
        args.push("--all");
    }
    args.extend([src.as_str(), dst.as_str()]);
    run("skopeo", &args).map(drop)
}

fn oci_blob(layout: &Path, digest: &str) -> Result<Vec<u8>> {
    let hex = digest.strip_prefix("sha256:").context("digest algorithm")?;
    fs::read(layout.join("blobs/sha256").join(hex)).with_context(|| format!("blob {digest}"))
}

/// Unpacks the single image in an OCI layout, layers in order; returns the layer count.
fn unpack_oci(layout: &Path, root: &Path) -> Result<usize> {
    let index = json(&fs::read(layout.join("index.json"))?)?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index digest")?;
    let manifest = json(&oci_blob(layout, digest)?)?;
    let layers = manifest["layers"].as_array().context("layers")?;
    for layer in layers {
        let blob = oci_blob(layout, layer["digest"].as_str().context("layer digest")?)?;
        let media_type = layer["mediaType"].as_str().unwrap_or_default();
        let tar = if media_type.ends_with("gzip") {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&blob[..]), &mut out)?;
            out
        } else if media_type.ends_with("zstd") {
            zstd::decode_all(&blob[..])?
        } else {
            blob
        };
        tar::Archive::new(&tar[..])
            .unpack(root)
            .context("unpacking layer")?;
    }
    Ok(layers.len())
}

/// skopeo agrees with what we say we pushed, and the repo inside is a real one.
fn verify(reg: &Registry, img: &PushedImage, spec: &ImageSpec) -> Result<tempfile::TempDir> {
    assert_eq!(
        img.by_tag,
        format!("{}/{}:{}", reg.host(), img.repository, img.tag)
    );
    assert_eq!(
        img.by_digest,
        format!("{}/{}@{}", reg.host(), img.repository, img.digest)
    );
    assert_eq!(sha256_digest(&inspect(&img.by_tag, true)?), img.digest);
    assert_eq!(sha256_digest(&inspect(&img.by_digest, true)?), img.digest);

    let info = json(&inspect(&img.by_tag, false)?)?;
    assert_eq!(
        info["Labels"][COMMIT_LABEL].as_str(),
        Some(img.commit.as_str())
    );
    assert_eq!(
        info["Labels"]["version"].as_str(),
        Some(spec.version.as_str())
    );
    assert_eq!(info["Architecture"].as_str(), Some("amd64"));
    let layers: Vec<&str> = info["Layers"]
        .as_array()
        .context("Layers")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(layers, img.layer_digests);

    let manifest_ref = format!("{}/{}@{}", reg.host(), img.repository, img.manifest_digest);
    let manifest = json(&inspect(&manifest_ref, true)?)?;
    assert_eq!(
        manifest["config"]["digest"].as_str(),
        Some(img.config_digest.as_str())
    );
    for d in img.layer_digests.iter().chain([&img.config_digest]) {
        assert!(
            reg.blob_data_path(d).exists(),
            "blob {d} not in registry storage"
        );
    }

    let work = tempfile::tempdir()?;
    let layout = work.path().join("oci");
    copy_to_oci(&manifest_ref, &layout, false)?;
    let root = work.path().join("root");
    assert_eq!(unpack_oci(&layout, &root)?, spec.layers);
    let repo = root.join("srv/repo");
    let repo_arg = format!("--repo={}", repo.display());
    let rev = run("ostree", &[&repo_arg, "rev-parse", &spec.refs[0]])?;
    assert_eq!(String::from_utf8(rev)?.trim(), img.commit);
    run("ostree", &[&repo_arg, "fsck"])?;
    let show = run(
        "ostree",
        &[&repo_arg, "cat", &img.commit, "/usr/lib/os-release"],
    )?;
    assert_eq!(
        String::from_utf8(show)?,
        spec.tree
            .file_text("usr/lib/os-release")
            .unwrap_or_default()
    );
    Ok(work)
}

fn v2() -> Result<Tree> {
    Tree::fixture("os-v2")
}

#[test]
fn oci_gzip() -> Result<()> {
    let reg = Registry::start()?;
    let spec = ImageSpec::new(v2()?, "2");
    let img = push_oscontainer(&reg, "pivot/os", "v2", &spec)?;
    assert_eq!(img.digest, img.manifest_digest);
    verify(&reg, &img, &spec)?;
    let raw = json(&inspect(&img.by_tag, true)?)?;
    assert_eq!(
        raw["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        raw["layers"][0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    assert_eq!(reg.count_requests("PUT", "/v2/pivot/os/manifests/v2"), 1);
    Ok(())
}

#[test]
fn docker_gzip() -> Result<()> {
    let reg = Registry::start()?;
    let mut spec = ImageSpec::new(v2()?, "2");
    spec.format = ManifestFormat::DockerV2S2;
    let img = push_oscontainer(&reg, "pivot/os", "docker", &spec)?;
    verify(&reg, &img, &spec)?;
    let raw = json(&inspect(&img.by_tag, true)?)?;
    assert_eq!(
        raw["mediaType"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    assert_eq!(
        raw["config"]["mediaType"],
        "application/vnd.docker.container.image.v1+json"
    );

    spec.compression = Compression::None;
    let img = push_oscontainer(&reg, "pivot/os", "docker-plain", &spec)?;
    verify(&reg, &img, &spec)?;

    spec.compression = Compression::Zstd;
    let err = push_oscontainer(&reg, "pivot/os", "bad", &spec).unwrap_err();
    assert!(format!("{err:#}").contains("zstd"), "{err:#}");
    Ok(())
}

#[test]
fn oci_zstd_index() -> Result<()> {
    let reg = Registry::start()?;
    let mut spec = ImageSpec::new(v2()?, "2");
    spec.compression = Compression::Zstd;
    spec.index = true;
    let img = push_oscontainer(&reg, "pivot/os", "multi", &spec)?;
    assert_ne!(img.digest, img.manifest_digest);
    verify(&reg, &img, &spec)?;

    let index = json(&inspect(&img.by_tag, true)?)?;
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let entries = index["manifests"].as_array().context("manifests")?;
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["platform"]["architecture"], "arm64");
    assert_eq!(entries[1]["platform"]["architecture"], "amd64");
    assert_eq!(
        entries[1]["digest"].as_str(),
        Some(img.manifest_digest.as_str())
    );

    let decoy = format!(
        "{}/pivot/os@{}",
        reg.host(),
        entries[0]["digest"].as_str().unwrap()
    );
    let decoy = json(&inspect(&decoy, false)?)?;
    assert_eq!(decoy["Labels"][COMMIT_LABEL].as_str(), Some(DECOY_COMMIT));
    assert_eq!(decoy["Architecture"], "arm64");

    let work = tempfile::tempdir()?;
    copy_to_oci(&img.by_tag, &work.path().join("all"), true)?;
    Ok(())
}

#[test]
fn split_layers_two_refs_and_no_label() -> Result<()> {
    let reg = Registry::start()?;
    let mut spec = ImageSpec::new(v2()?, "2");
    spec.layers = 3;
    spec.refs = vec!["os/pivot-test".into(), "os/other".into()];
    spec.compression = Compression::None;
    let img = push_oscontainer(&reg, "pivot/split", "v2", &spec)?;
    assert_eq!(img.layer_digests.len(), 3);
    let work = verify(&reg, &img, &spec)?;
    let repo = work.path().join("root/srv/repo");
    let repo_arg = format!("--repo={}", repo.display());
    let other = String::from_utf8(run("ostree", &[&repo_arg, "rev-parse", "os/other"])?)?;
    assert_ne!(other.trim(), img.commit);
    // Uncompressed layers straight from registry storage: config first, refs last.
    let names = |i: usize| -> Result<Vec<String>> {
        let blob = fs::read(reg.blob_data_path(&img.layer_digests[i]))?;
        let mut archive = tar::Archive::new(&blob[..]);
        let mut names = Vec::new();
        for e in archive.entries()? {
            names.push(e?.path()?.to_string_lossy().into_owned());
        }
        Ok(names)
    };
    let (first, last) = (names(0)?, names(2)?);
    assert_eq!(first[..3], ["srv/", "srv/repo/", "srv/repo/config"]);
    assert!(first.iter().any(|n| n.starts_with("srv/repo/objects/")));
    assert!(last
        .iter()
        .any(|n| n == "srv/repo/refs/heads/os/pivot-test"));
    assert!(!first
        .iter()
        .any(|n| n == "srv/repo/refs/heads/os/pivot-test"));

    spec.layers = 1;
    spec.commit_label = CommitLabel::Omit;
    let img = push_oscontainer(&reg, "pivot/split", "nolabel", &spec)?;
    let info = json(&inspect(&img.by_tag, false)?)?;
    assert!(info["Labels"].get(COMMIT_LABEL).is_none(), "{info}");
    assert_eq!(info["Labels"]["version"], "2");
    Ok(())
}

#[test]
fn image_without_repo() -> Result<()> {
    let reg = Registry::start()?;
    let mut spec = ImageSpec::new(v2()?, "2");
    spec.with_repo = false;
    spec.commit_label = CommitLabel::Value("0123".into());
    let img = push_oscontainer(&reg, "pivot/norepo", "v2", &spec)?;
    let info = json(&inspect(&img.by_tag, false)?)?;
    assert_eq!(info["Labels"][COMMIT_LABEL], "0123");
    let work = tempfile::tempdir()?;
    let layout = work.path().join("oci");
    copy_to_oci(&img.by_tag, &layout, false)?;
    let root = work.path().join("root");
    unpack_oci(&layout, &root)?;
    if root.join("srv/repo").exists() {
        bail!("srv/repo present in a with_repo=false image");
    }
    assert!(root.join("srv/README").exists());
    Ok(())
}
