//! Committing a [`Tree`] into an OSTree repo through libostree.

use crate::tree::Tree;
use anyhow::{Context, Result};
use ostree::glib::prelude::*;
use ostree::{gio, glib};

/// Fixed commit time (2023-11-14), so identical trees and versions give identical commits.
pub const COMMIT_TIME: u64 = 1_700_000_000;

/// Commits `tree` with metadata `{"version": version}`; sets `branch` when given.
/// Returns the commit checksum.
pub fn commit_tree(
    repo: &ostree::Repo,
    tree: &Tree,
    branch: Option<&str>,
    version: &str,
) -> Result<String> {
    let scratch = tempfile::tempdir().context("creating scratch dir for commit")?;
    tree.write_to(scratch.path())?;

    let cancellable = gio::Cancellable::NONE;
    let txn = repo
        .auto_transaction(cancellable)
        .context("preparing ostree transaction")?;
    let mtree = ostree::MutableTree::new();
    // Keep modes exactly as the tree says, but own everything by root and drop
    // host xattrs (e.g. SELinux labels of the scratch dir).
    let modifier = ostree::RepoCommitModifier::new(
        ostree::RepoCommitModifierFlags::SKIP_XATTRS,
        Some(Box::new(|_repo, _path, info: &gio::FileInfo| {
            info.set_attribute_uint32("unix::uid", 0);
            info.set_attribute_uint32("unix::gid", 0);
            ostree::RepoCommitFilterResult::Allow
        })),
    );
    repo.write_directory_to_mtree(
        &gio::File::for_path(scratch.path()),
        &mtree,
        Some(&modifier),
        cancellable,
    )
    .context("writing tree into ostree mtree")?;
    let root = repo
        .write_mtree(&mtree, cancellable)
        .context("writing ostree mtree")?;
    let root = root
        .downcast::<ostree::RepoFile>()
        .map_err(|_| anyhow::anyhow!("write_mtree did not return a RepoFile"))?;

    let meta = glib::VariantDict::new(None);
    meta.insert("version", version);
    if !tree.rpm_pkglist.is_empty() {
        meta.insert_value("rpmostree.rpmdb.pkglist", &tree.rpm_pkglist.to_variant());
    }
    let meta = meta.end();
    let checksum = repo
        .write_commit_with_time(
            None,
            Some(&format!("Pivot test tree {version}")),
            None,
            Some(&meta),
            &root,
            COMMIT_TIME,
            cancellable,
        )
        .context("writing ostree commit")?
        .to_string();
    if let Some(branch) = branch {
        repo.transaction_set_ref(None, branch, Some(&checksum));
    }
    txn.commit(cancellable)
        .context("committing ostree transaction")?;
    Ok(checksum)
}

/// Who signs an image's OSTree commit, with `ostree gpg-sign` (the signer OSTree publishes
/// with), and whether the signature is then corrupted, as a forger or a bit flip would.
#[derive(Clone, Debug)]
pub struct CommitSigner {
    pub gnupg_home: std::path::PathBuf,
    /// Key ID or fingerprint.
    pub key: String,
    pub tamper: bool,
}

/// Signs `commit` in the repo at `repo_dir` as `signer` says.
pub fn sign_commit(repo_dir: &std::path::Path, commit: &str, signer: &CommitSigner) -> Result<()> {
    let out = std::process::Command::new("ostree")
        .arg("gpg-sign")
        .arg(format!("--repo={}", repo_dir.display()))
        .arg(format!("--gpg-homedir={}", signer.gnupg_home.display()))
        .args([commit, &signer.key])
        .output()
        .context("running ostree gpg-sign")?;
    anyhow::ensure!(out.status.success(), "ostree gpg-sign: {out:?}");
    if !signer.tamper {
        return Ok(());
    }
    let repo = ostree::Repo::new_for_path(repo_dir);
    repo.open(gio::Cancellable::NONE)?;
    let meta = repo
        .read_commit_detached_metadata(commit, gio::Cancellable::NONE)?
        .context("the signed commit has no detached metadata")?;
    let dict = glib::VariantDict::new(Some(&meta));
    let mut signatures: Vec<Vec<u8>> = dict
        .lookup("ostree.gpgsigs")?
        .context("no ostree.gpgsigs")?;
    // The last byte is in the signature's value: the packet still parses, the math fails.
    let last = signatures[0].last_mut().context("an empty signature")?;
    *last ^= 0x01;
    dict.insert_value("ostree.gpgsigs", &signatures.to_variant());
    repo.write_commit_detached_metadata(commit, Some(&dict.end()), gio::Cancellable::NONE)?;
    Ok(())
}
