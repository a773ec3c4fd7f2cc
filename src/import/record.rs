//! The record of one layer's import, kept beside the download spools (see
//! [`crate::fetch::spools`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::member::MemberCheck;
use super::objects::{ObjectKey, Tally};
use crate::fetch::image::Format;

/// What the import of one layer left for the rest of its run: saved beside the download spools
/// once the layer is imported (its objects staged in the open transaction), so that a run killed
/// before the transaction committed need not fetch that layer again.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct ImportedLayer<'a> {
    pub(super) format: String,
    pub(super) config: Cow<'a, Option<String>>,
    pub(super) refs: Cow<'a, BTreeMap<String, String>>,
    pub(super) members: Cow<'a, MemberCheck>,
    pub(super) written: u64,
    pub(super) skipped: u64,
    /// The objects the layer brought, written or skipped (as loose names, `<checksum>.<type>`).
    pub(super) objects: Cow<'a, [ObjectKey]>,
}

impl ImportedLayer<'_> {
    /// The objects the layer brought (so far, in a checkpoint).
    pub(crate) fn objects(&self) -> &[ObjectKey] {
        &self.objects
    }

    /// The record of a native layer's import so far: only its objects (it has no repo config,
    /// refs or members outside the repo to keep). None without recorded object names.
    pub(super) fn native(tally: &Tally) -> Option<ImportedLayer<'_>> {
        Some(ImportedLayer {
            format: format!("{:?}", Format::Native),
            config: Cow::Owned(None),
            refs: Cow::Owned(BTreeMap::new()),
            members: Cow::Owned(MemberCheck::default()),
            written: tally.written,
            skipped: tally.skipped,
            objects: Cow::Borrowed(tally.names.as_deref()?),
        })
    }
}
