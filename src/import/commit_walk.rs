//! Walking the objects a commit reaches, tree by tree, holding only the directories still to
//! visit: libostree's `traverse_commit` (and its prune, built on it) gathers the names of all
//! the commit's objects at once in GLib hash tables, which made peak RSS grow with the image
//! (about 20 MiB per GB). Every dirtree and the commit are structure-checked before their
//! checksums are read.
//!
//! On a node the repo's trees are rarely in the page cache when an update comes (the last
//! import was days ago), and reading them one by one waits for the disk once per directory: a
//! 300 MB image's 2.3k dirtrees took 0.25 s that way, three times as long as the walk itself.
//! So when a tree is read, the kernel is asked for its subdirectories' trees at once
//! (`POSIX_FADV_WILLNEED`): their reads overlap, and the walk finds them cached (0.11 s).
//!
//! A large dirtree without subdirectories (the container store's object sets: every object of
//! a layer in one flat tree, several MiB at 1 GB) is read from its object file in pieces
//! ([`flat_files`]): loaded whole, libostree maps all of it at once, which raised pivot's peak
//! memory by as much.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{anyhow, bail, ensure, Context, Result};
use nix::fcntl::{openat, posix_fadvise, AtFlags, OFlag, PosixFadviseAdvice};
use nix::sys::stat::Mode;
use ostree::ObjectType;

/// Dirtrees up to this size are loaded whole (libostree reads them into memory; larger ones
/// it maps).
const SMALL_DIRTREE: u64 = 16 << 10;

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
    let objects = Objects::open(repo);
    let mut pending = vec![(
        ostree::checksum_from_bytes_v(&commit_v.child_value(6)),
        ostree::checksum_from_bytes_v(&commit_v.child_value(7)),
    )];
    while let Some((tree, meta)) = pending.pop() {
        visit(ObjectType::DirMeta, &meta)?;
        if !visit(ObjectType::DirTree, &tree)? {
            continue;
        }
        if let Some(path) = objects.large_dirtree(&tree) {
            if flat_files(&path, |file| visit(ObjectType::File, file).map(drop))? {
                continue;
            }
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
            let tree = ostree::checksum_from_bytes_v(&dir.child_value(1));
            objects.read_ahead(&tree);
            pending.push((tree, ostree::checksum_from_bytes_v(&dir.child_value(2))));
        }
    }
    Ok(())
}

/// The repo's `objects/` directory, opened once for the walk; None where the repo has no local
/// path (the walk then reads every dirtree through libostree, without reading ahead).
struct Objects(Option<(std::fs::File, std::path::PathBuf)>);

impl Objects {
    fn open(repo: &ostree::Repo) -> Objects {
        use ostree::gio::prelude::FileExt;
        let dir = repo.path().path().map(|repo| repo.join("objects"));
        Objects(dir.and_then(|dir| Some((std::fs::File::open(&dir).ok()?, dir))))
    }

    /// `objects/<xx>/<rest>.dirtree` of `checksum`.
    fn dirtree(checksum: &str) -> String {
        format!("{}/{}.dirtree", &checksum[..2], &checksum[2..])
    }

    /// The loose object file of dirtree `checksum` if it is larger than [`SMALL_DIRTREE`].
    fn large_dirtree(&self, checksum: &str) -> Option<std::path::PathBuf> {
        let (dir, path) = self.0.as_ref()?;
        let name = Self::dirtree(checksum);
        let stat = nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name.as_str(), AtFlags::empty());
        (stat.ok()?.st_size as u64 > SMALL_DIRTREE).then(|| path.join(name))
    }

    /// Starts reading dirtree `checksum` into the page cache, if it is a loose object here (one
    /// staged in the open transaction was just written, and is cached).
    fn read_ahead(&self, checksum: &str) {
        let Some((dir, _)) = &self.0 else { return };
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        let name = Self::dirtree(checksum);
        let Ok(fd) = openat(Some(dir.as_raw_fd()), name.as_str(), flags, Mode::empty()) else {
            return;
        };
        let _ = posix_fadvise(fd, 0, 0, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
        let _ = nix::unistd::close(fd);
    }
}

/// Calls `visit` with the checksum of each file of the serialized dirtree at `path`, reading
/// it in pieces, if the dirtree has files only; returns false (having visited nothing) if it
/// has subdirectories, or does not look like a dirtree at all (the caller's whole load then
/// checks its structure). Malformed entries are an error naming the object.
///
/// The layout is GVariant's for `(a(say)a(sayay))`: the files array, the (empty) directories
/// array, and the files array's end as the tuple's one framing offset; the array ends with a
/// table of its elements' end offsets; each `(say)` is the NUL-terminated name, the 32-byte
/// checksum and the name's end. Offsets are little-endian, as wide as their container needs.
pub fn flat_files(path: &Path, mut visit: impl FnMut(&str) -> Result<()>) -> Result<bool> {
    let what = || format!("dirtree {}", path.display());
    let mut file = std::fs::File::open(path).with_context(what)?;
    let size = file.metadata().with_context(what)?.len();
    let tuple_width = offset_width(size);
    let files_end = read_offset(&mut file, size - tuple_width, tuple_width).with_context(what)?;
    ensure!(files_end <= size - tuple_width, "{} is malformed", what());
    if files_end != size - tuple_width {
        return Ok(false); // Subdirectories: the caller loads it whole.
    }
    if files_end == 0 {
        return Ok(true);
    }
    let width = offset_width(files_end);
    let table = read_offset(&mut file, files_end - width, width).with_context(what)?;
    ensure!(
        table <= files_end && (files_end - table) % width == 0,
        "{} is malformed",
        what()
    );
    let count = (files_end - table) / width;
    let mut offsets = BufReader::new(std::fs::File::open(path).with_context(what)?);
    offsets.seek(SeekFrom::Start(table)).with_context(what)?;
    let mut elements = BufReader::new(file);
    elements.seek(SeekFrom::Start(0)).with_context(what)?;
    let (mut start, mut element) = (0u64, Vec::new());
    for _ in 0..count {
        let end = read_le(&mut offsets, width).with_context(what)?;
        ensure!(
            end > start && end <= table && end - start <= 4096,
            "{} is malformed",
            what()
        );
        element.resize((end - start) as usize, 0);
        elements.read_exact(&mut element).with_context(what)?;
        visit(&file_checksum(&element).with_context(|| format!("{} is malformed", what()))?)?;
        start = end;
    }
    ensure!(start == table, "{} is malformed", what());
    Ok(true)
}

/// The content checksum of one serialized `(say)` file entry, its name checked as libostree
/// checks file names.
fn file_checksum(element: &[u8]) -> Result<String> {
    let width = offset_width(element.len() as u64) as usize;
    ensure!(element.len() > width + 32, "entry too short");
    let mut name_end = [0u8; 8];
    name_end[..width].copy_from_slice(&element[element.len() - width..]);
    let name_end = u64::from_le_bytes(name_end) as usize;
    ensure!(
        name_end >= 2 && name_end + 32 + width == element.len(),
        "entry of a bad shape"
    );
    let name = std::str::from_utf8(&element[..name_end - 1])?;
    ensure!(element[name_end - 1] == 0, "name without its NUL");
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        bail!("invalid file name {name:?}");
    }
    Ok(hex::encode(&element[name_end..name_end + 32]))
}

/// GVariant's framing offset width for a container of `size` bytes (also what
/// `crate::import::store` serializes object sets with).
pub(crate) fn offset_width(size: u64) -> u64 {
    match size {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

fn read_offset(file: &mut std::fs::File, at: u64, width: u64) -> Result<u64> {
    file.seek(SeekFrom::Start(at))?;
    read_le(file, width)
}

fn read_le(input: &mut impl Read, width: u64) -> Result<u64> {
    let mut bytes = [0u8; 8];
    input.read_exact(&mut bytes[..width as usize])?;
    Ok(u64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostree::glib::prelude::ToVariant;

    /// Flat dirtrees of several sizes (offsets of 1, 2 and 4 bytes) read in pieces give the
    /// same checksums as GLib's own parse; one with a subdirectory is left to the caller.
    #[test]
    fn flat_dirtrees_read_in_pieces_as_glib_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        for count in [0usize, 1, 2, 40, 700, 50_000] {
            let files: Vec<(String, Vec<u8>)> = (0..count)
                .map(|i| {
                    let sum = hex::decode(format!("{:064x}", i * 7919 + 1)).unwrap();
                    (format!("{:064x}", i * 31 + 5), sum)
                })
                .collect();
            let dirs: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
            let variant = (files.clone(), dirs).to_variant();
            let path = dir.path().join(format!("{count}.dirtree"));
            std::fs::write(&path, variant.data()).unwrap();
            let mut seen = Vec::new();
            assert!(flat_files(&path, |c| {
                seen.push(c.to_string());
                Ok(())
            })
            .unwrap());
            let expected: Vec<String> = files.iter().map(|(_, c)| hex::encode(c)).collect();
            assert_eq!(seen, expected, "{count} files");
        }
        let with_dir = (
            vec![("a".to_string(), vec![1u8; 32])],
            vec![("d".to_string(), vec![2u8; 32], vec![3u8; 32])],
        )
            .to_variant();
        let path = dir.path().join("nested.dirtree");
        std::fs::write(&path, with_dir.data()).unwrap();
        assert!(!flat_files(&path, |_| panic!("visited")).unwrap());
    }

    /// A commit whose root holds a thousand files (a dirtree of about 40 KiB, read in pieces)
    /// is walked to the same objects as libostree's own traversal finds.
    #[test]
    fn a_large_flat_tree_is_walked_as_libostree_traverses_it() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        for i in 0..1000 {
            std::fs::write(tree.join(format!("f{i:04}")), format!("file {i}\n")).unwrap();
        }
        let repo_path = dir.path().join("repo");
        let ostree = |args: &[&str]| crate::import::objects::tests::ostree_cli(&repo_path, args);
        ostree(&["init", "--mode=bare-user"]);
        let commit = ostree(&["commit", "--orphan", tree.to_str().unwrap()]);
        let repo = ostree::Repo::new_for_path(&repo_path);
        repo.open(ostree::gio::Cancellable::NONE).unwrap();
        let (root, _) = {
            let v = repo.load_variant(ObjectType::Commit, &commit).unwrap();
            (
                ostree::checksum_from_bytes_v(&v.child_value(6)),
                ostree::checksum_from_bytes_v(&v.child_value(7)),
            )
        };
        let path = Objects::open(&repo).large_dirtree(&root);
        assert!(
            path.is_some(),
            "the root dirtree is small: the test proves nothing"
        );

        let mut walked = std::collections::BTreeSet::new();
        walk_commit(&repo, &commit, |kind, checksum| {
            Ok(walked.insert((kind, checksum.to_string())))
        })
        .unwrap();
        let expected: std::collections::BTreeSet<_> = repo
            .traverse_commit(&commit, 0, ostree::gio::Cancellable::NONE)
            .unwrap()
            .into_iter()
            .map(|name| (name.object_type(), name.checksum().to_string()))
            .collect();
        assert_eq!(walked, expected);
    }

    #[test]
    fn malformed_flat_dirtrees_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = vec![("f".to_string(), vec![1u8; 32]); 3];
        let dirs: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
        let good = (files, dirs).to_variant().data().to_vec();
        let path = dir.path().join("bad.dirtree");
        // A short checksum, a name with a slash, a truncated file.
        let short = (
            vec![("f".to_string(), vec![1u8; 31])],
            Vec::<(String, Vec<u8>, Vec<u8>)>::new(),
        )
            .to_variant();
        let slash = (
            vec![("a/b".to_string(), vec![1u8; 32])],
            Vec::<(String, Vec<u8>, Vec<u8>)>::new(),
        )
            .to_variant();
        for bytes in [
            short.data().to_vec(),
            slash.data().to_vec(),
            good[..good.len() - 3].to_vec(),
        ] {
            std::fs::write(&path, &bytes).unwrap();
            // Refused, or left to the caller's whole load (which checks the structure).
            assert!(
                !matches!(flat_files(&path, |_| Ok(())), Ok(true)),
                "{bytes:?}"
            );
        }
    }
}
