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
use super::ImportedLayer;

/// Decompressed bytes between the points a decoder offers.
pub(super) const POINT_SPAN: u64 = 1 << 20;

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
/// written (up to two intervals: one may wait for the sync that makes it durable, see
/// `crate::fetch::spool_writer`), plus how far the decoder's newest point and the import trail
/// the download (a point span, the decompressed chunks in flight, a read buffer), with a margin.
pub fn spool_bound(size: u64) -> u64 {
    2 * checkpoint_interval(size) + (4 << 20)
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
    /// tar stream): the import then makes its state whole (its writes staged) and calls
    /// [`Tracker::member_end`].
    pub fn due(&self, end: u64) -> bool {
        self.due_point(end).is_some()
    }

    /// The decompression point a checkpoint at `end` would save, when one is due.
    fn due_point(&self, end: u64) -> Option<InflatePoint> {
        self.save.as_ref()?;
        let point = self.points.at_or_before(self.base + end)?;
        (point.input >= self.last_input + self.interval).then_some(point)
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
        let checkpoint = LayerCheckpoint {
            point: Cow::Borrowed(&point),
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
