//! Moves the regular files pivot staged ([`super::Staging`]) into `objects/` while the import
//! goes on, rather than all at once when libostree commits the transaction.
//!
//! libostree 2022.7 commits by a `syncfs`, then a `renameat` per staged object, one after the
//! other: on XFS, 0.4 s of a 300 MB first pull with 18k files during which nothing else runs
//! (docs/benchmark.md). Here a thread takes the objects pivot staged in batches and, for each
//! batch, waits for a `syncfs` that began after the last of them was staged, then renames
//! them: what libostree's commit does, on the same terms (an object reaches `objects/` only
//! with its content on disk), batch by batch while the layers still download. What is left
//! when the layers are in (the last partial batch), and everything libostree staged itself,
//! its commit moves as before.
//!
//! Objects in `objects/` are visible before the transaction commits: loose objects no ref
//! reaches, which `ostree fsck` accepts and a prune removes. A pivot that fails removes the
//! ones it moved, so a refused image leaves the repo as it was; a killed one leaves them for
//! the next run, which counts them as present (the checkpoints that name them then hold), and
//! for the prune after the next deployment if it pivots elsewhere.

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use rustix::fs::{AtFlags, Mode};

use super::bare::{object_name, Staging};

/// Objects per `syncfs` and batch of renames: few enough syncs that they cost little, small
/// enough that the last batch, left to libostree's commit, is short.
const BATCH: usize = 1024;

/// The objects staged but not yet moved, filled by the writers.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
}

#[derive(Default)]
struct QueueState {
    staged: Vec<[u8; 32]>,
    /// Objects per batch while a publisher takes them; 0 before it starts and once it stops,
    /// when what is staged stays for libostree's commit.
    batch: usize,
}

impl Queue {
    /// Queues the object `id`, just linked into the staging directory.
    pub(super) fn push(&self, id: [u8; 32]) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.batch == 0 {
            return;
        }
        state.staged.push(id);
        if state.staged.len() >= state.batch {
            self.wake.notify_one();
        }
    }

    /// The next whole batch, or None once the publisher stops (the rest stays staged).
    fn next_batch(&self) -> Option<Vec<[u8; 32]>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if state.batch == 0 {
                return None;
            }
            if state.staged.len() >= state.batch {
                return Some(std::mem::take(&mut state.staged));
            }
            state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Hands batches of `batch` objects to the publisher from now on.
    fn open(&self, batch: usize) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.batch = batch.max(1);
    }

    /// Stops the publisher: what is staged from now on, or still queued, stays for the commit.
    fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.batch = 0;
        state.staged.clear();
        self.wake.notify_one();
    }
}

/// The thread that moves staged objects into `objects/`. Dropped before [`Publisher::keep`],
/// it removes what it moved: the transaction they belong to did not commit.
pub struct Publisher {
    staging: Arc<Staging>,
    objects: File,
    worker: Option<JoinHandle<Moved>>,
    moved: Moved,
}

/// What a publisher moved into `objects/`, and the prefix directories it made there.
#[derive(Default)]
struct Moved {
    objects: Vec<[u8; 32]>,
    dirs: Vec<u8>,
}

impl Publisher {
    /// Starts moving what is staged in `staging` into the repo's `objects/` (`objects`).
    pub fn start(staging: Arc<Staging>, objects: &std::path::Path) -> Result<Publisher> {
        Self::start_batched(staging, objects, BATCH)
    }

    fn start_batched(staging: Arc<Staging>, objects: &std::path::Path, batch: usize) -> Result<Publisher> {
        let objects = File::open(objects)
            .with_context(|| format!("opening {}", objects.display()))?;
        staging.queue().open(batch);
        let (theirs, their_objects) = (staging.clone(), objects.try_clone()?);
        let worker = std::thread::Builder::new()
            .name("pivot-publish".into())
            .spawn(move || run(&theirs, &their_objects));
        let worker = match worker {
            Ok(worker) => Some(worker),
            Err(e) => {
                staging.queue().close();
                return Err(e).context("starting the thread that moves objects");
            }
        };
        Ok(Publisher {
            staging,
            objects,
            worker,
            moved: Moved::default(),
        })
    }

    /// Stops moving objects; what is still staged is left to the commit.
    pub fn stop(&mut self) {
        self.staging.queue().close();
        if let Some(worker) = self.worker.take() {
            match worker.join() {
                Ok(moved) => {
                    self.moved.objects.extend(moved.objects);
                    self.moved.dirs.extend(moved.dirs);
                }
                Err(_) => tracing::warn!("the thread that moves objects panicked"),
            }
        }
    }

    /// The transaction committed: the objects moved stay.
    pub fn keep(mut self) {
        self.stop();
        self.moved = Moved::default();
    }

    /// How many objects were moved so far (once stopped).
    pub fn published(&self) -> usize {
        self.moved.objects.len()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop();
        let moved = std::mem::take(&mut self.moved);
        if !moved.objects.is_empty() {
            tracing::debug!(
                "removing the {} objects moved into objects/: their transaction did not commit",
                moved.objects.len()
            );
        }
        for id in moved.objects {
            let name = object_name(&id);
            match rustix::fs::unlinkat(&self.objects, name.as_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => tracing::warn!("could not remove the object {name}: {e}"),
            }
        }
        // As libostree would have left them: only the prefix directories its commit makes.
        for prefix in moved.dirs {
            let dir = format!("{prefix:02x}");
            match rustix::fs::unlinkat(&self.objects, dir.as_str(), AtFlags::REMOVEDIR) {
                Ok(()) | Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTEMPTY) => {}
                Err(e) => tracing::warn!("could not remove objects/{dir}: {e}"),
            }
        }
    }
}

/// Moves batches until stopped; returns what it moved. On an error it stops, and libostree's
/// commit moves the rest.
fn run(staging: &Staging, objects: &File) -> Moved {
    let mut moved = Moved::default();
    let mut made = [false; 256];
    while let Some(batch) = staging.queue().next_batch() {
        if let Err(e) = rustix::fs::syncfs(staging.dir().as_fd()) {
            tracing::debug!("moving objects stops, the staging directory's sync failed: {e}");
            staging.queue().close();
            break;
        }
        for id in batch {
            if let Err(e) = publish(staging, objects, &id, &mut made, &mut moved.dirs) {
                tracing::debug!("moving objects stops: {e:#}");
                staging.queue().close();
                return moved;
            }
            moved.objects.push(id);
        }
    }
    moved
}

/// Moves the staged object `id` into `objects/`, its prefix directory made as libostree makes
/// it (`_ostree_repo_ensure_loose_objdir_at`: mode 0777 less the umask), and added to `dirs` if
/// this made it.
fn publish(
    staging: &Staging,
    objects: &File,
    id: &[u8; 32],
    made: &mut [bool; 256],
    dirs: &mut Vec<u8>,
) -> Result<()> {
    let name = object_name(id);
    let prefix = &name[..2];
    if !made[usize::from(id[0])] {
        match rustix::fs::mkdirat(objects, prefix, Mode::from_raw_mode(0o777)) {
            Ok(()) => dirs.push(id[0]),
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e).context(format!("making objects/{prefix}")),
        }
        made[usize::from(id[0])] = true;
    }
    rustix::fs::renameat(staging.dir(), name.as_str(), objects, name.as_str())
        .with_context(|| format!("moving {name} into objects/"))
}

#[cfg(test)]
mod tests;
