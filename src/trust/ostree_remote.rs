//! OSTree-level signatures (`--ostree-remote NAME`, rpm-ostree's `ostree-remote-image:`): the
//! commit an image carries must be signed by a key of that remote, as the node's repo configures
//! it (`gpg-verify` with the remote's keyring or `gpgkeypath`; `sign-verify` with ed25519 keys
//! where libostree is built with them). This vouches for the OS itself whatever the container
//! around it, and works for `oci:` layouts, which carry no container signatures.
//!
//! The remote is looked up before anything is downloaded. The commit is verified inside the
//! import's transaction, before it is committed: a refused commit leaves nothing in the repo.
//! A commit the repo has already (an earlier pull, another tool's) is verified before it is
//! deployed just the same. libostree's `signature_verify_commit_data` does the checking, with
//! the remote's own settings, as ostree-rs-ext does for its tar imports.
//!
//! Unsafe code: one libostree call the crate binds no function for (a remote's boolean option).
#![allow(unsafe_code)]

use anyhow::{anyhow, ensure, Context, Result};
use ostree::glib::translate::{from_glib_full, ToGlibPtr};
use ostree::{ffi, gio, glib, ObjectType};

/// Refuses, before any download, a remote the repo does not have or that verifies nothing.
pub fn check_remote(repo: &ostree::Repo, name: &str) -> Result<()> {
    ensure!(
        repo.remote_list().iter().any(|r| r.as_str() == name),
        "--ostree-remote {name}: the sysroot's repo has no remote {name} (add it with `ostree remote add`)"
    );
    let gpg = repo
        .remote_get_gpg_verify(name)
        .with_context(|| format!("reading the remote {name}"))?;
    let sign = remote_bool(repo, name, "sign-verify")
        .with_context(|| format!("reading the remote {name}"))?;
    ensure!(
        gpg || sign,
        "--ostree-remote {name}: the remote verifies nothing (gpg-verify=false and no sign-verify)"
    );
    Ok(())
}

/// Verifies `commit` (in the repo, or in its open transaction) against the keys of `remote`.
pub fn verify_commit(repo: &ostree::Repo, remote: &str, commit: &str) -> Result<()> {
    let refused = |why: String| anyhow!("commit {commit} is not signed by the ostree remote {remote}: {why}");
    let data = repo
        .load_variant(ObjectType::Commit, commit)
        .with_context(|| format!("reading commit {commit}"))?;
    let signatures = repo
        .read_commit_detached_metadata(commit, gio::Cancellable::NONE)
        .with_context(|| format!("reading the signatures of commit {commit}"))?
        .ok_or_else(|| refused("it carries no signatures".to_string()))?;
    repo.signature_verify_commit_data(
        remote,
        &data.data_as_bytes(),
        &signatures.data_as_bytes(),
        ostree::RepoVerifyFlags::empty(),
    )
    .map_err(|e| refused(crate::node::logging::one_line(e.message())))?;
    tracing::info!("commit {commit} is signed by a key of the ostree remote {remote}");
    Ok(())
}


/// A boolean option of a remote (default false), as libostree reads it: from the repo's config
/// or the sysroot's `remotes.d`. (The crate binds no getter for it.)
fn remote_bool(repo: &ostree::Repo, remote: &str, option: &str) -> Result<bool, glib::Error> {
    let mut value = glib::ffi::GFALSE;
    let mut error = std::ptr::null_mut();
    // SAFETY: valid repo and C strings for the call's duration; `error` is set exactly when
    // the call fails, and is then owned here.
    let ok = unsafe {
        ffi::ostree_repo_get_remote_boolean_option(
            repo.to_glib_none().0,
            remote.to_glib_none().0,
            option.to_glib_none().0,
            glib::ffi::GFALSE,
            &mut value,
            &mut error,
        )
    };
    if ok == glib::ffi::GFALSE {
        // SAFETY: see above.
        return Err(unsafe { from_glib_full(error) });
    }
    Ok(value != glib::ffi::GFALSE)
}
