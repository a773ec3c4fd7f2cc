//! Importing the OSTree commit an image carries into the sysroot's repo, straight from the layer
//! streams: for a legacy oscontainer the archive repo at `srv/repo` of its layers, for an
//! ostree-native image the ostree-rs-ext tar format ([`native`]). In both, each object is written into the caller's open
//! transaction with its expected checksum, so libostree verifies every object and nothing of the
//! image is unpacked to disk. Objects the repo already has are skipped.
//!
//! Hostile input is refused where it is parsed: every tar member is checked first
//! ([`member`]), every layer's decompressed size is bounded ([`stream`]), every object must hash
//! to its name ([`objects`]), and the repo's text files must be small, UTF-8 and free of NULs.

mod adopt;
mod checkpoint;
mod complete;
pub mod commit_walk;
mod derived;
pub mod gz;
mod member;
pub(crate) mod memory;
mod native;
mod objects;
mod record;
mod selinux;
pub mod staging;
pub mod store;
mod stream;
mod writers;

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::io::Read;

use anyhow::{anyhow, bail, ensure, Context, Result};
use ostree::gio;
use ostree::glib;
use ostree::ObjectType;

use crate::fetch::image::{is_checksum, Compression, Format, OsImage};

/// Layers imported at once. Each layer's import already keeps two threads busy
/// (decompression, object writes) but waits on the network and on fsync in turns; a second
/// layer fills those gaps (measured: benches/pivot-bench). More would only add memory and
/// spooled bytes on a 2-core node.
pub const PARALLEL_LAYERS: usize = 2;
use checkpoint::{Tracker, Waiting, MAX_WAITING_MEMBERS, POINT_SPAN, WAITING_CHECKPOINTS};
use member::{Member, MemberCheck};
pub(crate) use objects::{object_name, object_type, ObjectKey};
pub use objects::{Publisher, Staging};
pub use record::ImportedLayer;
use objects::{Tally, IN_MEMORY_OBJECT};
use writers::Writers;
use stream::{decompress, ChunkReader, Start, DECOMPRESSED_AHEAD};

use crate::fetch::blob_reader::Blob;
pub use checkpoint::{spool_bound, Checkpoints, LayerCheckpoint};
pub(crate) use adopt::adopt;
pub use complete::{verify_complete, verify_complete_given, Present};
pub use staging::remove_unheld_staging_dirs;

const REPO_DIR: &str = "srv/repo/";
/// `srv/repo/config` and refs are a few lines of text.
const MAX_TEXT: u64 = 1 << 20;

/// Collects what the layers say about the repo while their objects are written.
pub struct RepoImporter {
    repo: ostree::Repo,
    format: Format,
    /// What the layer being imported keeps between members, for [`Format::Native`].
    native: native::NativeLayer,
    /// Whether this importer reads a layer derived from a native image's commit.
    derived_layer: bool,
    /// The changes of the derived layers read (merged in layer order by [`Self::absorb`]).
    derived: derived::DerivedLayer,
    /// Contents of `srv/repo/config`, if any layer had it.
    config: Option<String>,
    /// ref name → checksum, from `srv/repo/refs/`.
    refs: BTreeMap<String, String>,
    members: MemberCheck,
    /// This layer's objects (for a legacy layer); after [`Self::absorb`], the counts of all.
    tally: Tally,
    /// The commit of this layer's ref in the store, once written
    /// ([`Self::write_layer_commit`]).
    pub layer_commit: Option<String>,
    /// The content objects of this layer (after [`Self::absorb`], of all layers) that are in
    /// the repo or staged: what [`Self::finish`] need not look up again ([`Present`]).
    contents: Vec<[u8; 32]>,
    /// Threads writing a legacy layer's objects ([`writers`]).
    writer_threads: usize,
}

impl RepoImporter {
    /// `repo` must be in a transaction: objects only become visible when the caller commits it.
    /// Several importers may write into one transaction from different threads.
    /// `derived_layer`: the layer is one of an ostree-native image's derived layers.
    pub fn new(repo: ostree::Repo, format: Format, derived_layer: bool) -> Self {
        RepoImporter {
            repo,
            format,
            native: native::NativeLayer::default(),
            derived_layer,
            derived: derived::DerivedLayer::default(),
            config: None,
            refs: BTreeMap::new(),
            members: MemberCheck::default(),
            tally: Tally::default(),
            layer_commit: None,
            contents: Vec::new(),
            writer_threads: 1,
        }
    }

    /// Writes a legacy layer's objects on `threads` threads (see [`writers`]).
    pub fn write_with(&mut self, threads: usize) {
        self.writer_threads = threads.max(1);
    }

    /// Writes a native layer's regular files into `staging` without libostree (see
    /// [`Staging`]); with None, libostree writes them.
    pub fn stage_into(&mut self, staging: Option<std::sync::Arc<Staging>>) {
        self.native.staging = staging;
    }

    /// Keeps the names of the objects the layer brings, for [`Self::record`].
    pub fn record_objects(&mut self) {
        self.tally.names = Some(Vec::new());
        self.native.tally.names = Some(Vec::new());
    }

    /// Objects written and objects the repo already had.
    pub fn counts(&self) -> (u64, u64) {
        (self.tally.written, self.tally.skipped)
    }

    /// What this layer's import leaves for the rest of the run, to be saved: None for a derived
    /// layer (its changes are a tree in memory, not objects) or without [`Self::record_objects`].
    pub fn record(&self) -> Option<ImportedLayer<'_>> {
        self.record_with(&self.config, &self.refs, &self.members)
    }

    /// [`Self::record`] with what the layer's members made known up to some point of it.
    fn record_with<'a>(
        &'a self,
        config: &'a Option<String>,
        refs: &'a BTreeMap<String, String>,
        members: &'a MemberCheck,
    ) -> Option<ImportedLayer<'a>> {
        if self.derived_layer {
            return None;
        }
        let legacy = self.tally.names.as_deref()?;
        let native = self.native.tally.names.as_deref().unwrap_or_default();
        let objects = match (legacy.is_empty(), native.is_empty()) {
            (_, true) => Cow::Borrowed(legacy),
            (true, false) => Cow::Borrowed(native),
            (false, false) => Cow::Owned([legacy, native].concat()),
        };
        Some(ImportedLayer {
            format: format!("{:?}", self.format),
            config: Cow::Borrowed(config),
            refs: Cow::Borrowed(refs),
            members: Cow::Borrowed(members),
            written: self.tally.written + self.native.tally.written,
            skipped: self.tally.skipped + self.native.tally.skipped,
            objects,
        })
    }

    /// Stops keeping object names (once the record is saved).
    pub fn forget_objects(&mut self) {
        self.tally.names = None;
        self.native.tally.names = None;
    }

    /// The importer of a layer an earlier run imported (or, from a checkpoint, began to import)
    /// into the transaction now open (the staging directory libostree kept for it), from its
    /// record. Refused, naming the first missing object, unless every object the layer brought
    /// is still there.
    pub fn from_record(
        repo: ostree::Repo,
        format: Format,
        record: ImportedLayer<'_>,
    ) -> Result<Self> {
        ensure!(
            record.format == format!("{format:?}"),
            "the record is of a {} layer",
            record.format
        );
        for object in record.objects.iter() {
            if !repo.has_object(object.kind(), &object.checksum(), gio::Cancellable::NONE)? {
                bail!("object {object} is no longer in the repo");
            }
        }
        let mut importer = RepoImporter::new(repo, format, false);
        importer.config = record.config.into_owned();
        importer.refs = record.refs.into_owned();
        importer.members = record.members.into_owned();
        // Where the import of the rest of a layer counts its objects.
        let tally = match format {
            Format::Legacy => &mut importer.tally,
            Format::Native => &mut importer.native.tally,
        };
        tally.written = record.written;
        tally.skipped = record.skipped;
        tally.names = Some(record.objects.into_owned());
        Ok(importer)
    }

    /// Takes back what a native layer's checkpoint kept of its xattrs objects.
    pub fn restore_xattrs(&mut self, saved: &BTreeMap<String, String>) -> Result<()> {
        self.native.restore_xattrs(saved)
    }

    /// Takes in what `later` (the importer of the next layer) found: its config and refs win,
    /// and its members are checked against the symlinks of the layers before it.
    pub fn absorb(&mut self, later: RepoImporter) -> Result<()> {
        self.members.absorb(later.members)?;
        if later.config.is_some() {
            self.config = later.config;
        }
        self.refs.extend(later.refs);
        self.contents.extend(later.contents);
        if later.derived_layer {
            self.tally.written += later.derived.objects_written;
            self.derived.absorb(later.derived);
        }
        self.tally.written += later.tally.written + later.native.tally.written;
        self.tally.skipped += later.tally.skipped + later.native.tally.skipped;
        Ok(())
    }

    /// Imports one layer blob of `compressed_size` bytes (its descriptor's size, which bounds
    /// how far it may decompress): a second thread decompresses it (and checks its digest) while
    /// this one writes objects. The blob is read to its very end even when the import fails
    /// early, because only then is its digest checked: a corrupted blob is reported as one, not
    /// as whatever the corruption broke first. With `checkpoints` (a gzip layer, not a derived
    /// one: see [`checkpoint`]), the import resumes from and keeps checkpoints; `blob` then
    /// starts at the resumed point's input.
    pub fn import_blob(
        &mut self,
        blob: impl Blob,
        compression: Compression,
        compressed_size: u64,
        checkpoints: Option<Checkpoints<'_>>,
    ) -> Result<()> {
        let mut checkpoints = checkpoints;
        let resume = checkpoints.as_mut().and_then(|c| c.resume.take());
        let skip = match &resume {
            Some((point, member)) => Some(
                member
                    .checked_sub(point.output)
                    .context("the checkpoint's tar member is before its decompression point")?,
            ),
            None => None,
        };
        let mut tracker = checkpoints.map(|c| Tracker::new(c, compressed_size, resume.as_ref()));
        let (tx, rx) = std::sync::mpsc::sync_channel(DECOMPRESSED_AHEAD);
        let start = Start {
            resume: resume.as_ref().map(|(point, _)| point).zip(skip),
            points: tracker.as_ref().map(|t| (t.points.clone(), POINT_SPAN)),
        };
        std::thread::scope(|scope| {
            let producer = std::thread::Builder::new()
                .name("pivot-decompress".into())
                .spawn_scoped(scope, move || {
                    decompress(blob, compression, compressed_size, tx, start)
                })
                .map_err(|e| anyhow!("starting the decompression thread: {e}"))?;
            let imported = self.import_stream(ChunkReader::new(rx), tracker.as_mut());
            let produced = producer
                .join()
                .map_err(|_| anyhow!("the decompression thread panicked"))?;
            match (produced, imported) {
                // A bad blob or a broken stream explains whatever the import then tripped on.
                (Err(e), _) => Err(e),
                (Ok(()), imported) => imported,
            }
        })
    }

    /// Imports an uncompressed tar layer read from `reader` (the fuzzing entry point).
    #[cfg(feature = "internal-testing-api")]
    pub fn import_tar(&mut self, reader: impl Read) -> Result<()> {
        self.import_stream(reader, None)
    }

    fn import_stream(&mut self, reader: impl Read, tracker: Option<&mut Tracker>) -> Result<()> {
        if self.derived_layer {
            return self.derived.import_tar(&self.repo, reader);
        }
        if self.format == Format::Native {
            return self.native.import_tar(&self.repo, reader, tracker);
        }
        let mut writers = Writers::start(&self.repo, self.writer_threads)?;
        let imported = self.import_legacy(reader, tracker, &mut writers);
        // Objects before the member that failed were written meanwhile: the earliest failure
        // is the one to report.
        match (writers.drain(&mut self.tally), imported) {
            (Err(e), _) => Err(e),
            (Ok(()), imported) => imported,
        }
    }

    fn import_legacy(
        &mut self,
        reader: impl Read,
        mut tracker: Option<&mut Tracker>,
        writers: &mut Writers,
    ) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        // A checkpoint names only objects already staged. One that falls due while objects
        // before it are still being written waits for them with the import's state as it was,
        // and the import goes on (the pool's bound on what it holds bounds how far); only when
        // [`WAITING_CHECKPOINTS`] wait does the import wait for the oldest one's objects.
        let mut waiting: VecDeque<Waiting> = VecDeque::new();
        for entry in archive.entries().context("reading the layer as tar")? {
            let mut entry = entry.context("reading the layer as tar")?;
            let end = checkpoint::member_end(&entry);
            let sparse = entry.header().entry_type().is_gnu_sparse();
            self.legacy_member(&mut entry, writers)?;
            let Some(tracker) = tracker.as_deref_mut() else {
                continue;
            };
            // The newest checkpoint whose objects are all staged is saved; older ones need not be.
            let full = waiting.len() == WAITING_CHECKPOINTS;
            let mut staged = None;
            while let Some(w) = waiting.front() {
                let wait = full && staged.is_none();
                if !writers.staged_before(w.mark, &mut self.tally, wait)? {
                    break;
                }
                staged = waiting.pop_front();
            }
            if let Some(w) = staged {
                if let Some(record) = self.record_with(&w.config, &w.refs, &w.members) {
                    tracker.save_at(&w.point, w.end, record, BTreeMap::new());
                }
            }
            if sparse {
                continue;
            }
            // Due counts from the last checkpoint saved or waiting.
            let last = waiting.back().map(|w| w.point.input);
            let Some(point) = tracker.due_point_after(end, last) else {
                continue;
            };
            if self.members.paths() > MAX_WAITING_MEMBERS {
                // Copying what the members made known would cost more than waiting.
                writers.staged_before(writers.mark(), &mut self.tally, true)?;
                waiting.clear();
                if let Some(record) = self.record() {
                    tracker.save_at(&point, end, record, BTreeMap::new());
                }
            } else {
                waiting.push_back(Waiting {
                    point,
                    end,
                    mark: writers.mark(),
                    config: self.config.clone(),
                    refs: self.refs.clone(),
                    members: self.members.clone(),
                });
            }
        }
        Ok(())
    }

    fn legacy_member(
        &mut self,
        entry: &mut tar::Entry<impl Read>,
        writers: &mut Writers,
    ) -> Result<()> {
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0);
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        let member = self
            .members
            .check(&entry.path_bytes(), kind, mode, link.as_deref())?;
        let Member::RepoFile(rel) = member else {
            return Ok(());
        };
        let context = || format!("importing {REPO_DIR}{rel}");
        if rel == "config" {
            self.config = Some(read_text(entry).with_context(context)?);
        } else if let Some(name) = rel.strip_prefix("refs/heads/") {
            self.read_ref(name.to_string(), entry)
                .with_context(context)?;
        } else if let Some(name) = rel.strip_prefix("refs/remotes/") {
            let name = name.replacen('/', ":", 1);
            self.read_ref(name, entry).with_context(context)?;
        } else if let Some(obj) = rel.strip_prefix("objects/") {
            if let Some((checksum, ext)) = object_name(obj) {
                let size = entry.size();
                if size <= IN_MEMORY_OBJECT {
                    let mut data = Vec::with_capacity(size as usize);
                    entry.take(size).read_to_end(&mut data).with_context(context)?;
                    return writers.submit(&rel, checksum, ext, data);
                }
                return writers.submit_stream(&rel, checksum, ext, entry, size);
            }
        }
        Ok(())
    }

    fn read_ref(&mut self, name: String, entry: &mut impl Read) -> Result<()> {
        let target = read_text(entry)?.trim().to_string();
        ensure!(
            is_checksum(&target),
            "ref {name} does not hold a commit checksum"
        );
        self.refs.insert(name, target);
        Ok(())
    }

    /// Writes what [`crate::import::store`] keeps of this layer of an ostree-native image and returns
    /// the commit for its layer ref: a component layer's object set (the content objects it
    /// carried), or a derived layer's own commit. None for the commit layer (its ref is the
    /// image's commit, known once all layers are in) and for legacy layers. Keeps the layer's
    /// content objects as present (see [`Self::finish`]).
    pub fn write_layer_commit(&mut self, commit_layer: bool) -> Result<Option<String>> {
        if self.format != Format::Native {
            return Ok(None);
        }
        if self.derived_layer {
            return self.derived.write_layer_commit(&self.repo).map(Some);
        }
        let names = match (self.native.tally.names.as_deref_mut(), commit_layer) {
            (Some(names), _) => names,
            // The commit layer's objects are then looked up when the import finishes.
            (None, true) => return Ok(None),
            (None, false) => bail!("the layer's objects were not recorded"),
        };
        // Content objects first, in checksum order (the record keeps no order).
        names.sort_unstable_by_key(|k| (k.kind() != ObjectType::File, k.sha256()));
        self.contents = names
            .iter()
            .take_while(|k| k.kind() == ObjectType::File)
            .map(ObjectKey::sha256)
            .collect();
        if commit_layer {
            return Ok(None);
        }
        crate::import::store::write_object_set(&self.repo, self.contents.iter()).map(Some)
    }

    /// Takes the content objects of `commit`, the object set of a layer the store holds whole,
    /// as present (see [`Self::finish`]); none of them if the set cannot be read whole.
    pub fn take_stored(&mut self, commit: &str) -> Result<()> {
        let before = self.contents.len();
        let walked = commit_walk::walk_commit(&self.repo, commit, |kind, checksum| {
            if kind == ObjectType::File {
                self.contents.push(ObjectKey::parse(kind, checksum)?.sha256());
            }
            Ok(true)
        });
        if walked.is_err() {
            self.contents.truncate(before);
        }
        walked.with_context(|| format!("reading the object set {commit}"))
    }

    /// A derived layer's entries dropped on import, by top-level directory.
    pub fn filtered(&self) -> &std::collections::BTreeMap<String, u32> {
        &self.derived.filtered
    }

    /// Picks the image's commit (the label's, else the repo's single ref) and checks that every
    /// object it reaches is now in the repo; for an image with derived layers, also writes the
    /// tree with them applied (checked the same way). The content objects the layers brought,
    /// and those of the stored layers taken ([`Self::take_stored`]), are not looked up again.
    pub fn finish(self, os: &OsImage) -> Result<Finished> {
        let commit_label = os.commit_label.as_deref();
        if self.format == Format::Native {
            let commit = commit_label
                .or(os.base_commit.as_deref())
                .context("an ostree-native image names its commit by a label")?;
            ensure!(
                self.repo
                    .has_object(ObjectType::Commit, commit, gio::Cancellable::NONE)?,
                "commit {commit} (label {}) is not in the image's layers",
                crate::fetch::image::NATIVE_COMMIT_LABEL
            );
            let present = Present::new(self.contents);
            verify_complete_given(&self.repo, commit, &present)?;
            let derived = if self.derived.is_empty() {
                None
            } else {
                Some(derived::apply(&self.repo, commit, &self.derived)?)
            };
            return Ok(Finished {
                commit: commit.to_string(),
                derived,
                present,
            });
        }
        let Some(config) = &self.config else {
            bail!("the image has no OSTree repository at {REPO_DIR} (no {REPO_DIR}config in any layer)");
        };
        let mode = repo_mode(config);
        ensure!(
            matches!(mode.as_deref(), Some("archive-z2" | "archive")),
            "{REPO_DIR} is a {:?} repository; an oscontainer carries an archive repository",
            mode.unwrap_or_default()
        );
        let commit = match commit_label {
            Some(label) => label.to_string(),
            None => match self.refs.len() {
                0 => bail!(
                    "the image has no {} label and its repository has no ref to fall back on",
                    crate::fetch::image::COMMIT_LABEL
                ),
                1 => self.refs.values().next().unwrap().clone(),
                _ => bail!(
                    "the image has no {} label and its repository has several refs ({}): cannot tell which commit to deploy",
                    crate::fetch::image::COMMIT_LABEL,
                    self.refs.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            },
        };
        let cancellable = gio::Cancellable::NONE;
        ensure!(
            self.repo
                .has_object(ObjectType::Commit, &commit, cancellable)?,
            "commit {commit} is not in the image's repository"
        );
        verify_complete(&self.repo, &commit)?;
        Ok(Finished {
            commit,
            derived: None,
            present: Present::default(),
        })
    }
}

/// What the layers of an image made, once all are in.
pub struct Finished {
    /// The commit the image names: a legacy image's, to deploy; an ostree-native image's
    /// `ostree.commit`, the base of its merge commit.
    pub commit: String,
    /// For an ostree-native image with derived layers: the tree with them applied (complete).
    pub derived: Option<ostree::RepoFile>,
    /// The content objects the import vouches for, to check the tree with the derived layers
    /// applied against ([`verify_complete_given`]).
    pub present: Present,
}

/// A small text file of the repo (its config, a ref): at most [`MAX_TEXT`] bytes of UTF-8
/// without NUL (libostree and GLib take text as C strings).
fn read_text(entry: &mut impl Read) -> Result<String> {
    let mut data = Vec::new();
    entry.take(MAX_TEXT + 1).read_to_end(&mut data)?;
    ensure!(
        data.len() as u64 <= MAX_TEXT,
        "the file is larger than the {MAX_TEXT} bytes accepted"
    );
    ensure!(!data.contains(&0), "the file contains a NUL byte");
    String::from_utf8(data).map_err(|_| anyhow!("the file is not UTF-8 text"))
}

/// `mode=` of the `[core]` group of an ostree repo config.
fn repo_mode(config: &str) -> Option<String> {
    let keyfile = glib::KeyFile::new();
    keyfile
        .load_from_data(config, glib::KeyFileFlags::NONE)
        .ok()?;
    keyfile.string("core", "mode").ok().map(|s| s.to_string())
}

#[cfg(test)]
mod tests;
