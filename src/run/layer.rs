//! One layer of a [`Job`]: reused whole from the store, resumed from an earlier run's
//! checkpoint or spool, or fetched; then imported into the job's transaction.

use anyhow::{Context, Result};

use super::job::Job;
use crate::fetch::blob_reader::{BlobReader, Resume};
use crate::fetch::image::Format;
use crate::fetch::spools::Spools;
use crate::import::gz::InflatePoint;
use crate::import::{Checkpoints, LayerCheckpoint, RepoImporter, Staging};
use std::sync::Arc;

impl Job {
    pub(super) fn import_layer(
        &self,
        repo: &ostree::Repo,
        spools: &Spools,
        staging: Option<&Arc<Staging>>,
        i: usize,
    ) -> Result<RepoImporter> {
        let layer = &self.os.layers[i];
        let digest = &layer.descriptor.digest;
        let context = || format!("fetching layer {}/{} {digest}", i + 1, self.os.layers.len());
        let source = self
            .source
            .as_ref()
            .context("no image source to fetch the layers from")?;
        let count = self.os.layers.len();
        let native = self.os.format == Format::Native;
        if let Some(commit) = &self.stored(repo)?[i] {
            tracing::info!(
                "layer {}/{count} {digest} is in the repo already ({commit}): not fetched",
                i + 1
            );
            self.progress.present(i, layer.descriptor.size.max(0) as u64);
            let mut importer = RepoImporter::new(repo.clone(), self.os.format, false);
            if let Err(e) = importer.take_stored(commit) {
                tracing::warn!("{e:#}: its objects are looked up in the repo instead");
            }
            return Ok(importer);
        }
        if let Some(record) = spools.imported(digest) {
            match RepoImporter::from_record(repo.clone(), self.os.format, record) {
                Ok(mut importer) => {
                    importer.layer_commit = importer.write_layer_commit(i == 0)?;
                    importer.forget_objects();
                    tracing::info!(
                        "layer {}/{count} {digest} was imported by an earlier run: not fetched again",
                        i + 1
                    );
                    self.progress.present(i, layer.descriptor.size.max(0) as u64);
                    return Ok(importer);
                }
                Err(e) => {
                    tracing::info!(
                        "layer {}/{count} {digest} was imported by an earlier run, but {e:#}: fetching it again",
                        i + 1
                    );
                    spools.forget(digest);
                }
            }
        }
        let checkpointed = spools.enabled() && self.checkpointed(layer);
        let mut resumed = checkpointed
            .then(|| self.resume_point(repo, spools, i))
            .flatten();
        let spool = spools.path(digest);
        let resume = resumed.as_ref().map(|(_, point, _)| Resume {
            from: point.input,
            mark: point.blob.clone(),
        });
        let open = |resume| {
            BlobReader::open(
                &self.runtime,
                source,
                &layer.descriptor,
                spool.as_deref(),
                resume,
            )
        };
        let reader = match open(resume) {
            Err(e) if resumed.is_some() => {
                tracing::info!("layer {}/{count} {digest}: {e}; fetching it again", i + 1);
                resumed = None;
                spools.forget(digest);
                open(None)
            }
            opened => opened,
        }
        .with_context(context)?
        .with_progress(self.progress.clone(), i);
        let (mut importer, resume) = match resumed {
            Some((importer, point, member)) => {
                tracing::info!(
                    "layer {}/{count} {digest} resumes from a checkpoint at byte {} (tar offset {member})",
                    i + 1,
                    point.input
                );
                (importer, Some((point, member)))
            }
            None => {
                let mut importer = RepoImporter::new(repo.clone(), self.os.format, layer.derived);
                // A native layer's content objects make its object set (see crate::import::store).
                if spools.enabled() || native {
                    importer.record_objects();
                }
                (importer, None)
            }
        };
        importer.write_with(self.writers_per_layer());
        importer.stage_into(staging.cloned());
        let size = layer.descriptor.size.max(0) as u64;
        let mut save =
            |checkpoint: &LayerCheckpoint<'_>| spools.save_checkpoint(digest, checkpoint);
        let checkpoints = checkpointed.then_some(Checkpoints {
            resume,
            save: &mut save,
        });
        importer
            .import_blob(reader, layer.compression, size, checkpoints)
            .with_context(context)?;
        importer.layer_commit = importer.write_layer_commit(i == 0).with_context(context)?;
        // The layer's objects are staged: a run killed before the transaction commits finds
        // them there and, with this record, need not fetch the layer again.
        if let Some(record) = importer.record().filter(|_| spools.enabled()) {
            if let Err(e) = spools.save(digest, &record) {
                tracing::warn!("{e:#}; the download stays spooled instead");
            }
        }
        importer.forget_objects();
        Ok(importer)
    }

    /// The importer of layer `i` as an earlier run left it at its last checkpoint, with the
    /// point and tar offset to resume from; None (and the checkpoint dropped) unless every
    /// object the checkpoint names is still staged.
    fn resume_point(
        &self,
        repo: &ostree::Repo,
        spools: &Spools,
        i: usize,
    ) -> Option<(RepoImporter, InflatePoint, u64)> {
        let digest = &self.os.layers[i].descriptor.digest;
        let LayerCheckpoint {
            point,
            member,
            importer: record,
            xattrs,
        } = spools.checkpoint(digest)?;
        let restored = RepoImporter::from_record(repo.clone(), self.os.format, record)
            .and_then(|mut importer| importer.restore_xattrs(&xattrs).map(|()| importer));
        match restored {
            Ok(importer) => Some((importer, point.into_owned(), member)),
            Err(e) => {
                tracing::info!(
                    "layer {}/{} {digest} was partly imported by an earlier run, but {e:#}: fetching it again",
                    i + 1,
                    self.os.layers.len()
                );
                spools.forget(digest);
                None
            }
        }
    }
}
