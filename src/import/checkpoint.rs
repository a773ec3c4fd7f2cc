//! Checkpoints inside a layer: every so many compressed bytes, at the end of a tar member, the
//! import saves where decompression can resume ([`InflatePoint`], taken at a deflate block
//! boundary at or before that member's end) together with what the import found up to there
//! (the same record a finished layer leaves). A killed run then resumes from the checkpoint,
//! and the download spool only needs the bytes after it: the caller frees the rest. So a layer
//! in flight costs a few MiB of disk beside its objects, not its whole download.
//!
//! Only gzip layers have checkpoints (zstd's decoder has no state to save), and not the derived
//! layers of a native image (their changes are a tree in memory). A native layer's checkpoint
//! also keeps the xattrs objects read so far, which its later content objects refer to.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;

use super::gz::{InflatePoint, Points};
use super::member::MemberCheck;
use super::ImportedLayer;

/// Decompressed bytes between the points a decoder offers.
pub(super) const POINT_SPAN: u64 = 1 << 20;

/// Checkpoints of a legacy layer that may wait for their objects at once.
pub(super) const WAITING_CHECKPOINTS: usize = 8;
/// A checkpoint waits with a copy of what the layer's members made known; past this many
/// members outside the repository (an oscontainer has a handful), it is saved at once instead.
pub(super) const MAX_WAITING_MEMBERS: usize = 1024;

/// A checkpoint of a legacy layer waiting for the objects before it to be staged: where, and
/// what the layer's members made known up to there.
pub(super) struct Waiting {
    pub point: InflatePoint,
    pub end: u64,
    /// The objects before it, as `Writers::mark` marks them.
    pub mark: u64,
    pub config: Option<String>,
    pub refs: BTreeMap<String, String>,
    pub members: MemberCheck,
}

/// A place inside a layer to resume its import from.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct LayerCheckpoint<'a> {
    pub point: Cow<'a, InflatePoint>,
    /// Offset in the decompressed layer of the tar member the import resumes at.
    pub member: u64,
    pub importer: ImportedLayer<'a>,
    /// For a native layer: the xattrs objects read so far (checksum → serialized, in hex).
    #[serde(default)]
    pub xattrs: BTreeMap<String, String>,
}

/// Compressed bytes between checkpoints of a layer of `size` compressed bytes: a 64th of it,
/// within 1–16 MiB. That bounds both the disk a layer in flight holds and the checkpoints'
/// cost (each rewrites the names of the objects imported so far).
fn checkpoint_interval(size: u64) -> u64 {
    (size / 64).clamp(1 << 20, 16 << 20)
}

/// The most a checkpointed layer's spool holds on disk: the bytes since the last checkpoint
/// written (up to three intervals: one may wait for the sync that makes it durable, see
/// `crate::fetch::spool_writer`, and one for the objects before it to be staged), what the
/// object writers hold ahead of the staged objects, plus how far the decoder's newest point and
/// the import trail the download (a point span, the decompressed chunks in flight, a read
/// buffer), with a margin.
pub fn spool_bound(size: u64) -> u64 {
    3 * checkpoint_interval(size) + super::writers::HELD_AHEAD as u64 + (4 << 20)
}

/// Saves a checkpoint (see [`Checkpoints::save`]).
pub type SaveCheckpoint<'a> = &'a mut dyn FnMut(&LayerCheckpoint<'_>) -> Result<()>;

/// How an import keeps checkpoints.
pub struct Checkpoints<'a> {
    /// Where this run starts: the checkpoint it resumes from, if any.
    pub resume: Option<(InflatePoint, u64)>,
    /// Saves a checkpoint; after a failure no more are taken for the layer.
    pub save: SaveCheckpoint<'a>,
}

/// A layer's checkpoints while it is imported.
pub(super) struct Tracker<'a> {
    pub points: Arc<Points>,
    /// Decompressed offset of the start of this run's tar stream.
    pub base: u64,
    last_input: u64,
    interval: u64,
    save: Option<SaveCheckpoint<'a>>,
}

impl<'a> Tracker<'a> {
    /// The tracker of a layer of `size` compressed bytes, resuming from `resume` if any.
    pub fn new(
        checkpoints: Checkpoints<'a>,
        size: u64,
        resume: Option<&(InflatePoint, u64)>,
    ) -> Tracker<'a> {
        let (base, last_input) = resume.map_or((0, 0), |(point, member)| (*member, point.input));
        Tracker {
            points: Arc::default(),
            base,
            last_input,
            interval: checkpoint_interval(size),
            save: Some(checkpoints.save),
        }
    }

    /// Whether a checkpoint is due at the end of a tar member (`end`: its offset in this run's
    /// tar stream), counting from the compressed offset `last` of a checkpoint taken but not yet
    /// saved, if any.
    fn due_after(&self, end: u64, last: Option<u64>) -> bool {
        let last = last.unwrap_or(self.last_input).max(self.last_input);
        self.save.is_some()
            && (self.points.input_at_or_before(self.base + end))
                .is_some_and(|input| input >= last + self.interval)
    }

    /// The decompression point a checkpoint at `end` would save, when one is due. It is taken
    /// now: the decoder keeps only its newest points.
    fn due_point(&self, end: u64) -> Option<InflatePoint> {
        self.due_point_after(end, None)
    }

    /// [`Tracker::due_point`], counting as [`Tracker::due_after`] does.
    pub fn due_point_after(&self, end: u64, last: Option<u64>) -> Option<InflatePoint> {
        self.due_after(end, last)
            .then(|| self.points.at_or_before(self.base + end))
            .flatten()
    }

    /// At the end of a tar member (`end`: its offset in this run's tar stream), saves a
    /// checkpoint when one is due, with the import's state there: `state` gives its record and,
    /// for a native layer, its xattrs objects (None: no checkpoint can be taken).
    pub fn member_end<'r>(
        &mut self,
        end: u64,
        state: impl FnOnce() -> Option<(ImportedLayer<'r>, BTreeMap<String, String>)>,
    ) {
        let Some(point) = self.due_point(end) else {
            return;
        };
        let Some((importer, xattrs)) = state() else {
            return;
        };
        self.save_at(&point, end, importer, xattrs);
    }

    /// Saves the checkpoint at `end` (`point` its [`Tracker::due_point`]) with the import's
    /// state there.
    pub fn save_at(
        &mut self,
        point: &InflatePoint,
        end: u64,
        importer: ImportedLayer<'_>,
        xattrs: BTreeMap<String, String>,
    ) {
        let checkpoint = LayerCheckpoint {
            point: Cow::Borrowed(point),
            member: self.base + end,
            importer,
            xattrs,
        };
        let Some(save) = &mut self.save else {
            return;
        };
        match save(&checkpoint) {
            Ok(()) => self.last_input = point.input,
            Err(e) => {
                tracing::warn!("{e:#}; this layer's download stays spooled whole instead");
                self.save = None;
            }
        }
    }
}

/// The offset just past `entry` (its header, data and padding) in its tar stream.
pub(super) fn member_end(entry: &tar::Entry<impl std::io::Read>) -> u64 {
    let stored = entry.header().entry_size().unwrap_or(u64::MAX);
    entry
        .raw_file_position()
        .saturating_add(stored.div_ceil(512).saturating_mul(512))
}
