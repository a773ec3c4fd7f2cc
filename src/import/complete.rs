//! Whether a commit is complete: every object it reaches is in the repo (or staged in the open
//! transaction). Nothing is deployed or kept as whole until this holds.
//!
//! An import already knows most of the answer. Each content object a layer brought was either
//! written into the transaction or found in the repo while it was imported, and a layer the
//! store held was checked whole before it was used. Looking those up again cost an update half
//! a second at 300 MB (a 65-layer image names 18k files, and each lookup in a transaction is
//! two `fstatat`s), about as much as libostree's checkout of the whole deployment. So the
//! objects the import vouches for ([`Present`]) are taken from memory, and only the others
//! (dirmetas, the objects of layers imported before a reboot, those of a derived tree) are
//! looked up in the repo.

use std::collections::HashSet;

use anyhow::{bail, Result};
use ostree::{gio, ObjectType};

use super::commit_walk::walk_commit;
use super::objects::ObjectKey;

/// Content objects an import knows to be in the repo or staged in its transaction, sorted: 32
/// bytes each (a 1 GB image's 60k files, under 2 MiB).
#[derive(Default)]
pub struct Present(Vec<[u8; 32]>);

impl Present {
    pub fn new(mut contents: Vec<[u8; 32]>) -> Present {
        contents.sort_unstable();
        contents.dedup();
        Present(contents)
    }

    fn holds(&self, checksum: &str) -> bool {
        ObjectKey::new(ObjectType::File, checksum)
            .is_some_and(|key| self.0.binary_search(key.sha256_ref()).is_ok())
    }
}

/// Every object reachable from `commit` must be present before the commit may be deployed.
pub fn verify_complete(repo: &ostree::Repo, commit: &str) -> Result<()> {
    verify_complete_given(repo, commit, &Present::default())
}

/// [`verify_complete`], where the content objects of `present` are known to be there. A tree
/// or dirmeta (most directories share a few) is read or looked up once; files are not kept in
/// the set, which would cost a legacy image's import, where `present` is empty, 2 MiB at 1 GB.
pub fn verify_complete_given(repo: &ostree::Repo, commit: &str, present: &Present) -> Result<()> {
    let mut seen = HashSet::new();
    walk_commit(repo, commit, |kind, checksum| {
        match kind {
            ObjectType::DirTree => return Ok(seen.insert(ObjectKey::parse(kind, checksum)?)),
            ObjectType::DirMeta if !seen.insert(ObjectKey::parse(kind, checksum)?) => return Ok(true),
            ObjectType::File if present.holds(checksum) => return Ok(true),
            ObjectType::DirMeta | ObjectType::File => {}
            _ => return Ok(true),
        }
        if !repo.has_object(kind, checksum, gio::Cancellable::NONE)? {
            let name = ostree::object_type_to_string(kind);
            bail!("commit {commit} is incomplete: {name} object {checksum} is missing");
        }
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bare-user repo with one commit of a tree where two files share their content; the
    /// commit and the content objects of `shared` and `unique`.
    fn repo_with_commit(dir: &std::path::Path) -> (ostree::Repo, String, String, String) {
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/one"), "shared").unwrap();
        std::fs::write(tree.join("a/b/two"), "shared").unwrap();
        std::fs::write(tree.join("three"), "unique").unwrap();
        let path = dir.join("repo");
        let ostree = |args: &[&str]| crate::import::objects::tests::ostree_cli(&path, args);
        ostree(&["init", "--mode=bare-user"]);
        let commit = ostree(&["commit", "--orphan", tree.to_str().unwrap()]);
        let content = |file: &str| {
            ostree(&["ls", "-C", &commit, file])
                .split_whitespace()
                .nth(4)
                .unwrap()
                .to_string()
        };
        let (shared, unique) = (content("/a/one"), content("/three"));
        assert_eq!(content("/a/b/two"), shared);
        let repo = ostree::Repo::new_for_path(&path);
        repo.open(gio::Cancellable::NONE).unwrap();
        (repo, commit, shared, unique)
    }

    fn present(checksums: &[&str]) -> Present {
        let key = |c: &&str| ObjectKey::parse(ObjectType::File, c).unwrap().sha256();
        Present::new(checksums.iter().map(key).collect())
    }

    #[test]
    fn objects_the_import_vouches_for_are_not_looked_up_and_the_others_are() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, commit, shared, unique) = repo_with_commit(dir.path());
        verify_complete(&repo, &commit).unwrap();
        verify_complete_given(&repo, &commit, &present(&[&shared, &unique])).unwrap();

        // A content object two files share, gone: found missing, vouched for or not by others.
        repo.delete_object(ObjectType::File, &shared, gio::Cancellable::NONE)
            .unwrap();
        let missing = format!("commit {commit} is incomplete: file object {shared} is missing");
        for given in [present(&[]), present(&[&unique])] {
            let error = verify_complete_given(&repo, &commit, &given).unwrap_err();
            assert_eq!(format!("{error:#}"), missing);
        }
        // Vouched for, it is taken as there: what the import wrote or found is not stat'ed again.
        verify_complete_given(&repo, &commit, &present(&[&shared])).unwrap();
    }

    #[test]
    fn a_missing_dirmeta_is_found_when_every_file_is_vouched_for() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, commit, shared, unique) = repo_with_commit(dir.path());
        let v = repo.load_variant(ObjectType::Commit, &commit).unwrap();
        let meta = ostree::checksum_from_bytes_v(&v.child_value(7));
        repo.delete_object(ObjectType::DirMeta, &meta, gio::Cancellable::NONE)
            .unwrap();
        let error = verify_complete_given(&repo, &commit, &present(&[&shared, &unique]))
            .unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!("commit {commit} is incomplete: dirmeta object {meta} is missing")
        );
    }
}
