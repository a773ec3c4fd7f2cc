//! What a pivot keeps of its downloads, under the repo's `tmp/pivot-downloads/`, so that a
//! killed run resumes instead of starting over:
//!
//! - while a layer downloads, its bytes (`<digest>.partial`): the next run replays them and
//!   fetches only the rest;
//! - for a layer with checkpoints (`crate::import::checkpoint`), the last one
//!   (`<digest>.checkpoint`); the spool's bytes before it are punched out (the file keeps its
//!   length), and the next run resumes from it, replaying only the bytes after it;
//! - once the layer is imported (its objects staged in the open transaction), a record of what
//!   its import found instead (`<digest>.imported`: the repo config and refs it carried, its
//!   members outside the repo, the names of its objects) and its bytes are deleted. So the extra
//!   disk of a pivot is what the layers in flight downloaded since their last checkpoints, not a
//!   second copy of the image.
//!
//! A run that finds a record or a checkpoint checks that every object it names is still there
//! (libostree hands the staging directory of an interrupted transaction to the next one in the
//! same boot; after a reboot, `crate::import::adopt` takes them back) before it trusts it; when
//! any is missing it fetches the layer again. Records and checkpoints are written once what
//! they name is on disk (see [`super::spool_writer`]), to a temporary file renamed into place;
//! the directory is 0700 and its files 0600 (image content not yet in the repo). Everything here
//! is removed when an import ends, whatever its outcome.

use std::io::{BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::spool_writer::{SpoolWriter, Write as SpoolWrite};
use crate::fetch::image::OsImage;
use crate::import::{ImportedLayer, LayerCheckpoint};

pub(crate) struct Spools {
    dir: PathBuf,
    enabled: bool,
    /// None in unit tests: writes are then made at once.
    writer: Option<SpoolWriter>,
}

const PARTIAL: &str = "partial";
const IMPORTED: &str = "imported";
const CHECKPOINT: &str = "checkpoint";

impl Spools {
    const DIR: &'static str = "tmp/pivot-downloads";

    /// The spools of the repo at `repo_path`; drops what earlier runs left for other images (all
    /// of it when spooling is off).
    pub fn new(repo_path: &Path, os: &OsImage, enabled: bool) -> Spools {
        let dir = repo_path.join(Self::DIR);
        let wanted: Vec<String> = os
            .layers
            .iter()
            .flat_map(|l| {
                [PARTIAL, IMPORTED, CHECKPOINT].map(|ext| file_name(&l.descriptor.digest, ext))
            })
            .collect();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !enabled || !wanted.iter().any(|w| entry.file_name() == w.as_str()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let writer = enabled.then(|| {
            let target = dir.clone();
            SpoolWriter::start(dir.clone(), move |digest, write| apply(&target, digest, write))
        });
        Spools {
            dir,
            enabled,
            writer,
        }
    }

    /// Bytes of the layer `digest` (of `size` bytes) an earlier run kept in the repo at
    /// `repo_path`: all of them once it was imported.
    pub fn held(repo_path: &Path, digest: &str, size: u64) -> u64 {
        let dir = repo_path.join(Self::DIR);
        if dir.join(file_name(digest, IMPORTED)).exists() {
            return size;
        }
        let spooled = std::fs::metadata(dir.join(file_name(digest, PARTIAL)))
            .map(|m| m.len())
            .unwrap_or(0);
        if spooled <= size {
            spooled
        } else {
            0
        }
    }

    /// Where the layer's download is spooled; None when spooling is off.
    pub fn path(&self, digest: &str) -> Option<PathBuf> {
        self.enabled
            .then(|| self.dir.join(file_name(digest, PARTIAL)))
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The record an earlier run left of importing the layer `digest`, if any and readable.
    pub fn imported(&self, digest: &str) -> Option<ImportedLayer<'static>> {
        self.read(digest, IMPORTED)
    }

    /// The last checkpoint an earlier run saved inside the layer `digest`, if any and readable.
    pub fn checkpoint(&self, digest: &str) -> Option<LayerCheckpoint<'static>> {
        self.read(digest, CHECKPOINT)
    }

    fn read<T: serde::de::DeserializeOwned>(&self, digest: &str, ext: &str) -> Option<T> {
        if !self.enabled {
            return None;
        }
        let path = self.dir.join(file_name(digest, ext));
        let file = std::fs::File::open(&path).ok()?;
        match serde_json::from_reader(BufReader::new(file)) {
            Ok(record) => Some(record),
            Err(e) => {
                tracing::warn!("ignoring {}: {e}", path.display());
                self.forget(digest);
                None
            }
        }
    }

    /// Replaces the layer's spool (and checkpoint) by the record of its import, once the
    /// objects it names are on disk.
    pub fn save(&self, digest: &str, record: &ImportedLayer<'_>) -> Result<()> {
        let json = serde_json::to_vec(record).context("serializing a layer's record")?;
        self.send(digest, SpoolWrite::Imported { json });
        Ok(())
    }

    /// Saves a checkpoint inside the layer `digest` once the objects it names are on disk,
    /// then frees the spooled bytes before it (punches them out of the file, which keeps its
    /// length: the next run appends after it).
    pub fn save_checkpoint(&self, digest: &str, checkpoint: &LayerCheckpoint<'_>) -> Result<()> {
        let json = serde_json::to_vec(checkpoint).context("serializing a checkpoint")?;
        let free_before = checkpoint.point.input / 4096 * 4096;
        self.send(digest, SpoolWrite::Checkpoint { json, free_before });
        Ok(())
    }

    fn send(&self, digest: &str, write: SpoolWrite) {
        let unsent = match &self.writer {
            Some(writer) => writer.send(digest, write),
            None => Err(write),
        };
        if let Err(write) = unsent {
            apply(&self.dir, digest, write);
        }
    }

    /// Drops what is kept of the layer `digest` (its objects are gone, or its files unusable).
    pub fn forget(&self, digest: &str) {
        for ext in [IMPORTED, CHECKPOINT, PARTIAL] {
            let _ = std::fs::remove_file(self.dir.join(file_name(digest, ext)));
        }
    }

    /// Drops everything, what waits to be written included (the import ended).
    pub fn remove_all(&mut self) {
        if let Some(writer) = &mut self.writer {
            writer.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Makes a write of the layer `digest` under `dir`; a failure is logged (the next run then
/// finds less to resume from, or the download instead of the record).
fn apply(dir: &Path, digest: &str, write: SpoolWrite) {
    let remove = |ext| {
        let _ = std::fs::remove_file(dir.join(file_name(digest, ext)));
    };
    match write {
        SpoolWrite::Imported { json } => match write_file(dir, digest, IMPORTED, &json) {
            Ok(()) => [PARTIAL, CHECKPOINT].into_iter().for_each(remove),
            Err(e) => tracing::warn!("{e:#}; the download stays spooled instead"),
        },
        SpoolWrite::Checkpoint { json, free_before } => {
            let freed = write_file(dir, digest, CHECKPOINT, &json).and_then(|()| {
                let path = dir.join(file_name(digest, PARTIAL));
                crate::fetch::blob_reader::free_before(&path, free_before).with_context(|| {
                    format!("freeing the first {free_before} bytes of {}", path.display())
                })
            });
            if let Err(e) = freed {
                tracing::warn!("{e:#}");
            }
        }
    }
}

/// Writes a temporary file and renames it into place.
fn write_file(dir: &Path, digest: &str, ext: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(file_name(digest, ext));
    let tmp = dir.join(format!(".{}.tmp", file_name(digest, ext)));
    let written = (|| -> Result<()> {
        crate::node::state::private_dir(dir)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        // On the writer's thread, off the import's path: a record or checkpoint that is renamed
        // into place is whole, and is on disk before the spool is punched after it.
        file.sync_data()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("saving {}", path.display()))
}

fn file_name(digest: &str, ext: &str) -> String {
    format!("{}.{ext}", digest.replace(':', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123";

    fn spools(dir: &Path) -> Spools {
        Spools {
            dir: dir.join(Spools::DIR),
            enabled: true,
            writer: None,
        }
    }

    #[test]
    fn an_imported_layer_counts_as_held_whole_and_a_spool_as_its_length() {
        let repo = tempfile::tempdir().unwrap();
        let spools = spools(repo.path());
        std::fs::create_dir_all(&spools.dir).unwrap();
        assert_eq!(Spools::held(repo.path(), DIGEST, 100), 0);
        std::fs::write(spools.path(DIGEST).unwrap(), [0; 40]).unwrap();
        assert_eq!(Spools::held(repo.path(), DIGEST, 100), 40);
        // A spool longer than its blob is not one: it is downloaded again.
        assert_eq!(Spools::held(repo.path(), DIGEST, 30), 0);
        std::fs::write(spools.dir.join(file_name(DIGEST, IMPORTED)), "{}").unwrap();
        assert_eq!(Spools::held(repo.path(), DIGEST, 100), 100);
    }

    #[test]
    fn an_unreadable_record_is_dropped() {
        let repo = tempfile::tempdir().unwrap();
        let spools = spools(repo.path());
        std::fs::create_dir_all(&spools.dir).unwrap();
        let record = spools.dir.join(file_name(DIGEST, IMPORTED));
        std::fs::write(&record, "{\"format\": \"Legacy\", \"objects\": [").unwrap();
        assert!(spools.imported(DIGEST).is_none());
        assert!(!record.exists());
    }

    #[test]
    fn a_checkpoint_frees_the_spooled_bytes_before_it_and_is_read_back() {
        let repo = tempfile::tempdir().unwrap();
        let spools = spools(repo.path());
        std::fs::create_dir_all(&spools.dir).unwrap();
        let spool = spools.path(DIGEST).unwrap();
        std::fs::write(&spool, vec![7u8; 64 << 10]).unwrap();
        let json = serde_json::json!({
            "point": {
                "input": (40 << 10) + 5, "bits": 3, "last_byte": 9, "output": 100 << 10,
                "window": "00ff", "crc": 1, "member_output": 100 << 10,
                "blob": {"read": 48 << 10, "hash": {"h": [1, 2, 3, 4, 5, 6, 7, 8], "tail": "", "len": 48 << 10}},
            },
            "member": 101 << 10,
            "importer": {
                "format": "Legacy", "config": null, "refs": {},
                "members": {"symlinks": [], "outside": []},
                "written": 1, "skipped": 0, "objects": [format!("{}.file", "ab".repeat(32))],
            },
        });
        let checkpoint: LayerCheckpoint = serde_json::from_value(json).unwrap();
        spools.save_checkpoint(DIGEST, &checkpoint).unwrap();
        let data = std::fs::read(&spool).unwrap();
        assert_eq!(data.len(), 64 << 10, "the spool keeps its length");
        assert!(data[..40 << 10].iter().all(|b| *b == 0));
        assert!(data[40 << 10..].iter().all(|b| *b == 7));
        let on_disk = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&spool).unwrap());
        assert!(
            on_disk * 512 <= 28 << 10,
            "{on_disk} blocks still allocated"
        );
        let back = spools.checkpoint(DIGEST).unwrap();
        assert_eq!(back.point.input, (40 << 10) + 5);
        assert_eq!(back.point.window, [0, 0xff]);
        assert_eq!(back.member, 101 << 10);
        // Once the layer is imported, neither the spool nor the checkpoint stays.
        spools.save(DIGEST, &back.importer).unwrap();
        assert!(!spool.exists());
        assert!(spools.checkpoint(DIGEST).is_none());
        assert!(spools.imported(DIGEST).is_some());
    }
}
