//! Applying derived layers' changes to a mutable tree: the merged tree of the image (on its
//! base commit), and the tree of one layer's own commit for the store.

use anyhow::{anyhow, bail, Context, Result};

use super::super::selinux::Labels;
use super::{join, Change, DerivedLayer};

/// Writes the tree of `base` with the derived layers' `changes` applied, what they add labeled
/// from `base`'s SELinux policy (see `super::selinux`); returns its root.
pub(in crate::import) fn apply(
    repo: &ostree::Repo,
    base: &str,
    layers: &DerivedLayer,
) -> Result<ostree::RepoFile> {
    let root = ostree::MutableTree::from_commit(repo, base)
        .with_context(|| format!("reading commit {base}"))?;
    let objects = Objects {
        repo,
        default_dirmeta: crate::import::store::root_dirmeta(repo)?,
        labels: Labels::of_commit(repo, base)?,
    };
    // Layer by layer (split at the boundary markers): whiteouts first, then the rest.
    for layer in layers.changes.split(|c| matches!(c, Change::NextLayer)) {
        let (hiding, adding): (Vec<&Change>, Vec<&Change>) = layer
            .iter()
            .partition(|c| matches!(c, Change::Whiteout(_) | Change::Opaque(_)));
        for change in hiding.into_iter().chain(adding) {
            apply_change(&root, change, &objects)
                .with_context(|| format!("applying the derived layers: {change:?}"))?;
        }
    }
    crate::import::store::write_tree(repo, &root).context("writing the derived tree")
}

/// The metadata of what a change adds: a directory a layer only implies is root-owned 0755,
/// and with `labels` every new file and directory is labeled for its path.
pub(super) struct Objects<'r> {
    pub repo: &'r ostree::Repo,
    pub default_dirmeta: String,
    pub labels: Option<Labels>,
}

impl Objects<'_> {
    fn dirmeta(&self, path: &str, dirmeta: &str) -> Result<String> {
        match &self.labels {
            Some(labels) => labels.dirmeta(self.repo, path, dirmeta),
            None => Ok(dirmeta.to_string()),
        }
    }

    fn file(&self, path: &str, checksum: &str) -> Result<String> {
        match &self.labels {
            Some(labels) => labels.file(self.repo, path, checksum),
            None => Ok(checksum.to_string()),
        }
    }
}

pub(super) fn apply_change(
    root: &ostree::MutableTree,
    change: &Change,
    objects: &Objects,
) -> Result<()> {
    match change {
        Change::Whiteout(path) => {
            let (dir, name) = parent_of(root, path, None)?;
            if let Some(dir) = dir {
                dir.remove(name, true)?;
            }
        }
        Change::Opaque(path) => {
            if let Some(dir) = lookup_dir(root, path)? {
                for name in dir.copy_files().into_keys() {
                    dir.remove(&name, true)?;
                }
                for name in dir.copy_subdirs().into_keys() {
                    dir.remove(&name, true)?;
                }
            }
        }
        Change::Dir { path, dirmeta } => {
            let (dir, name) = parent_of(root, path, Some(objects))?;
            let dir = dir.expect("created");
            if let (Some(_), None) = dir.lookup(name).unwrap_or((None, None)) {
                dir.remove(name, false)?;
            }
            dir.ensure_dir(name)?
                .set_metadata_checksum(&objects.dirmeta(path, dirmeta)?);
        }
        Change::File { path, checksum } => {
            replace_file(root, path, &objects.file(path, checksum)?, objects)?
        }
        Change::NextLayer => {}
        Change::Link { path, target } => {
            // The same object as its target (labeled already, if the target was added).
            let (dir, name) = parent_of(root, target, None)?;
            let checksum = dir
                .and_then(|d| d.lookup(name).ok())
                .and_then(|(file, _)| file)
                .ok_or_else(|| anyhow!("the hardlink target {target:?} is not a file"))?;
            replace_file(root, path, &checksum, objects)?;
        }
    }
    Ok(())
}

fn replace_file(
    root: &ostree::MutableTree,
    path: &str,
    checksum: &str,
    objects: &Objects,
) -> Result<()> {
    let (dir, name) = parent_of(root, path, Some(objects))?;
    let dir = dir.expect("created");
    if let (None, Some(_)) = dir.lookup(name).unwrap_or((None, None)) {
        dir.remove(name, false)?;
    }
    dir.replace_file(name, checksum)?;
    Ok(())
}

/// The directory holding `path` and its last component; with `create`, missing parents are
/// made (root-owned 0755, labeled). A parent that is a file (a symlink, say) is refused: a layer
/// cannot write through it.
pub(super) fn parent_of<'p>(
    root: &ostree::MutableTree,
    path: &'p str,
    create: Option<&Objects>,
) -> Result<(Option<ostree::MutableTree>, &'p str)> {
    let (parent, name) = match path.rsplit_once('/') {
        Some((p, n)) => (p, n),
        None => ("", path),
    };
    let mut dir = root.clone();
    let mut walked = String::new();
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        walked = join(&walked, part);
        match (dir.lookup(part).unwrap_or((None, None)), create) {
            ((_, Some(sub)), _) => dir = sub,
            ((Some(_), None), _) => {
                bail!("{parent:?} is not a directory in the image (its {part:?} is a file or symlink)")
            }
            ((None, None), Some(objects)) => {
                let sub = dir.ensure_dir(part)?;
                sub.set_metadata_checksum(&objects.dirmeta(&walked, &objects.default_dirmeta)?);
                dir = sub;
            }
            ((None, None), None) => return Ok((None, name)),
        }
    }
    Ok((Some(dir), name))
}

fn lookup_dir(root: &ostree::MutableTree, path: &str) -> Result<Option<ostree::MutableTree>> {
    let mut dir = root.clone();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        match dir.lookup(part).unwrap_or((None, None)) {
            (_, Some(sub)) => dir = sub,
            _ => return Ok(None),
        }
    }
    Ok(Some(dir))
}
