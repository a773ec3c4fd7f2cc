//! ostree-rs-ext's own answers about a repo (see the crate documentation): what rpm-ostree and
//! bootc would see after a pivot.

use anyhow::{Context, Result};
use ostree_ext::container::store::{self, ImageImporter, PrepareResult};
use ostree_ext::container::{ImageReference, OstreeImageReference, SignatureSource};
use ostree_ext::{gio, ostree};

fn open_repo(path: &str) -> Result<ostree::Repo> {
    let repo = ostree::Repo::new_for_path(path);
    repo.open(gio::Cancellable::NONE)
        .with_context(|| format!("opening {path}"))?;
    Ok(repo)
}

fn unverified(image: &str) -> Result<OstreeImageReference> {
    Ok(OstreeImageReference {
        sigverify: SignatureSource::ContainerPolicyAllowInsecure,
        imgref: ImageReference::try_from(image)?,
    })
}

/// `{"images": [...], "image": {"manifest_digest", "merge_commit", "base_commit", "version"} | null}`
pub fn query(repo: &str, image: &str) -> Result<()> {
    let repo = open_repo(repo)?;
    let images = store::list_images(&repo)?;
    let imgref = ImageReference::try_from(image)?;
    let state = store::query_image(&repo, &imgref)?.map(|s| {
        serde_json::json!({
            "manifest_digest": s.manifest_digest.to_string(),
            "merge_commit": s.merge_commit,
            "base_commit": s.base_commit,
            "version": s.version(),
        })
    });
    println!(
        "{}",
        serde_json::json!({ "images": images, "image": state })
    );
    Ok(())
}

/// `{"present": true, "merge_commit": …}` or `{"present": false, "fetch": [digests],
/// "reused": [digests]}`; with `import`, imports it then and reports `"imported": <merge commit>`.
pub async fn prepare(repo: &str, image: &str, import: bool) -> Result<()> {
    let repo = open_repo(repo)?;
    let config = ostree_ext::containers_image_proxy::ImageProxyConfig {
        insecure_skip_tls_verification: Some(true),
        ..Default::default()
    };
    let mut importer = ImageImporter::new(&repo, &unverified(image)?, config).await?;
    let answer = match importer.prepare().await? {
        PrepareResult::AlreadyPresent(state) => serde_json::json!({
            "present": true,
            "merge_commit": state.merge_commit,
        }),
        PrepareResult::Ready(prepared) => {
            let (fetch, reused): (Vec<_>, Vec<_>) =
                prepared.all_layers().partition(|l| l.commit.is_none());
            let digests = |v: Vec<&store::ManifestLayerState>| -> Vec<String> {
                v.iter().map(|l| l.layer().digest().to_string()).collect()
            };
            let mut answer = serde_json::json!({
                "present": false,
                "fetch": digests(fetch),
                "reused": digests(reused),
            });
            if import {
                let state = importer.import(prepared).await?;
                answer["imported"] = state.merge_commit.clone().into();
            }
            answer
        }
    };
    println!("{answer}");
    Ok(())
}

/// Copies `image` of the repo `from` into the repo `to` as `name`; prints `{"copied": name}`.
pub async fn copy(from: &str, image: &str, to: &str, name: &str) -> Result<()> {
    let (from, to) = (open_repo(from)?, open_repo(to)?);
    let (image, renamed) = (
        ImageReference::try_from(image)?,
        ImageReference::try_from(name)?,
    );
    store::copy(&from, &image, &to, &renamed).await?;
    println!("{}", serde_json::json!({ "copied": name }));
    Ok(())
}

/// Deploys `image` as bootc and rpm-ostree do; prints `{"merge_commit": …}`.
pub async fn deploy(sysroot: &str, stateroot: &str, image: &str) -> Result<()> {
    let sysroot = ostree::Sysroot::new(Some(&gio::File::for_path(sysroot)));
    sysroot.load(gio::Cancellable::NONE)?;
    let imgref = unverified(image)?;
    let mut opts = ostree_ext::container::deploy::DeployOpts::default();
    opts.proxy_cfg = Some(ostree_ext::containers_image_proxy::ImageProxyConfig {
        insecure_skip_tls_verification: Some(true),
        ..Default::default()
    });
    let state =
        ostree_ext::container::deploy::deploy(&sysroot, stateroot, &imgref, Some(opts)).await?;
    println!(
        "{}",
        serde_json::json!({ "merge_commit": state.merge_commit })
    );
    Ok(())
}
