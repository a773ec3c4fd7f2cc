//! Walking the objects a commit reaches, tree by tree, holding only the directories still to
//! visit: libostree's `traverse_commit` (and its prune, built on it) gathers the names of all
//! the commit's objects at once in GLib hash tables, which made peak RSS grow with the image
//! (about 20 MiB per GB). Every dirtree and the commit are structure-checked before their
//! checksums are read.

use anyhow::{anyhow, Context, Result};
use ostree::ObjectType;

/// Calls `visit` with each object `commit` reaches (the commit itself first), and descends into
/// a dirtree only when `visit` returns true for it (false: already walked). A missing commit or
/// dirtree is an error naming the object; a missing file or dirmeta is `visit`'s to judge.
pub fn walk_commit(
    repo: &ostree::Repo,
    commit: &str,
    mut visit: impl FnMut(ObjectType, &str) -> Result<bool>,
) -> Result<()> {
    let commit_v = repo
        .load_variant_if_exists(ObjectType::Commit, commit)
        .with_context(|| format!("reading commit {commit}"))?
        .with_context(|| format!("commit {commit} is not in the repo"))?;
    ostree::validate_structureof_commit(&commit_v)
        .with_context(|| format!("commit {commit} is malformed"))?;
    visit(ObjectType::Commit, commit)?;
    // (a{sv} aya(say) s s t ay ay): the root dirtree and dirmeta are the last two.
    let mut pending = vec![(
        ostree::checksum_from_bytes_v(&commit_v.child_value(6)),
        ostree::checksum_from_bytes_v(&commit_v.child_value(7)),
    )];
    while let Some((tree, meta)) = pending.pop() {
        visit(ObjectType::DirMeta, &meta)?;
        if !visit(ObjectType::DirTree, &tree)? {
            continue;
        }
        let dirtree = repo
            .load_variant_if_exists(ObjectType::DirTree, &tree)
            .with_context(|| format!("reading dirtree {tree}"))?
            .ok_or_else(|| {
                anyhow!("commit {commit} is incomplete: dirtree object {tree} is missing")
            })?;
        ostree::validate_structureof_dirtree(&dirtree)
            .with_context(|| format!("dirtree {tree} is malformed"))?;
        // (a(say) a(sayay)): files (name, content checksum), then directories (name, dirtree,
        // dirmeta).
        let files = dirtree.child_value(0);
        for i in 0..files.n_children() {
            let file = ostree::checksum_from_bytes_v(&files.child_value(i).child_value(1));
            visit(ObjectType::File, &file)?;
        }
        let dirs = dirtree.child_value(1);
        for i in 0..dirs.n_children() {
            let dir = dirs.child_value(i);
            pending.push((
                ostree::checksum_from_bytes_v(&dir.child_value(1)),
                ostree::checksum_from_bytes_v(&dir.child_value(2)),
            ));
        }
    }
    Ok(())
}
