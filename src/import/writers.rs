//! A layer's object writes, spread over a pool of threads.
//!
//! Writing an archive-repo object is most of a legacy layer's import: libostree inflates it,
//! checksums it and writes the file, which on a single thread left the other core idle while one
//! big layer — the shape oscontainers ship — was imported (benches/pivot-bench). So the tar
//! thread reads each object (at most [`super::objects::IN_MEMORY_OBJECT`]) and hands it to
//! the pool, which writes into the same transaction (libostree's writes are safe from several
//! threads). What waits is bounded in bytes ([`QUEUED_BYTES`]). The pool is drained before each
//! checkpoint and at the layer's end, so a checkpoint or record only names objects already
//! staged; a write that fails stops the layer, and of several failures the one of the earliest
//! object in the layer is reported, as a sequential import would.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use anyhow::{anyhow, Result};

use super::objects::{write_object_bytes, Outcome, Tally};

/// Bytes of objects read ahead of the writers, at most (one object may exceed it alone).
const QUEUED_BYTES: usize = 1 << 20;

struct Job {
    seq: u64,
    /// The member's path in the image's repo, as errors name it.
    rel: String,
    checksum: String,
    ext: String,
    data: Vec<u8>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    queued_bytes: usize,
    /// Jobs submitted and not yet done (queued or being written).
    in_flight: usize,
    done: Vec<(String, String, Outcome)>,
    /// The failure of the earliest object, by submission order.
    failed: Option<(u64, anyhow::Error)>,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a job is queued or the pool closes.
    work: Condvar,
    /// Signalled when a job is done.
    progress: Condvar,
}

pub(super) struct Writers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// With a single writer, the objects are written on the caller's thread, into this repo.
    inline: Option<ostree::Repo>,
    next_seq: u64,
}

impl Writers {
    /// A pool of `count` writers into the open transaction of `repo`; for one, none (the
    /// caller's thread writes: a layer imported beside others already shares the cores).
    pub fn start(repo: &ostree::Repo, count: usize) -> Result<Writers> {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let mut writers = Writers {
            shared: shared.clone(),
            threads: Vec::new(),
            inline: (count <= 1).then(|| repo.clone()),
            next_seq: 0,
        };
        if writers.inline.is_some() {
            return Ok(writers);
        }
        for i in 0..count {
            // A repo handle may move between threads but not be shared by them.
            let (repo, shared) = (repo.clone(), shared.clone());
            let thread = std::thread::Builder::new()
                .name(format!("pivot-writer-{i}"))
                .spawn(move || work(&repo, &shared))
                .map_err(|e| anyhow!("starting an object writer thread: {e}"))?;
            writers.threads.push(thread);
        }
        Ok(writers)
    }

    /// Queues the object file `checksum.ext` (the member `rel` of the image's repo) with its
    /// bytes; waits while the queue is full. Once a write failed, fails with the error of the
    /// earliest object that failed.
    pub fn submit(&mut self, rel: &str, checksum: String, ext: &str, data: Vec<u8>) -> Result<()> {
        if let Some(repo) = &self.inline {
            let outcome = write_object_bytes(repo, &checksum, ext, data)
                .map_err(|e| e.context(format!("importing {}{rel}", super::REPO_DIR)))?;
            self.lock().done.push((checksum, ext.to_string(), outcome));
            return Ok(());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut state = self.lock();
        while state.queued_bytes > 0
            && state.queued_bytes + data.len() > QUEUED_BYTES
            && state.failed.is_none()
        {
            state = wait(&self.shared.progress, state);
        }
        if state.failed.is_some() {
            drop(state);
            return self.drain(&mut Tally::default());
        }
        state.queued_bytes += data.len();
        state.in_flight += 1;
        state.queue.push_back(Job {
            seq,
            rel: rel.to_string(),
            checksum,
            ext: ext.to_string(),
            data,
        });
        self.shared.work.notify_one();
        Ok(())
    }

    /// Waits until every queued object is written, then counts them in `tally`; the earliest
    /// failure, if any.
    pub fn drain(&mut self, tally: &mut Tally) -> Result<()> {
        let mut state = self.lock();
        while state.in_flight > 0 {
            state = wait(&self.shared.progress, state);
        }
        for (checksum, ext, outcome) in state.done.drain(..) {
            tally.count(&checksum, &ext, outcome);
        }
        match state.failed.take() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        {
            let mut state = self.lock();
            state.closed = true;
            // Nothing queued is written once the layer is given up.
            state.in_flight -= state.queue.len();
            state.queue.clear();
        }
        self.shared.work.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn wait<'a>(condvar: &Condvar, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    condvar.wait(guard).unwrap_or_else(|e| e.into_inner())
}

fn work(repo: &ostree::Repo, shared: &Shared) {
    loop {
        let job = {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(job) = state.queue.pop_front() {
                    break job;
                }
                if state.closed {
                    return;
                }
                state = shared.work.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Job {
            seq,
            rel,
            checksum,
            ext,
            data,
        } = job;
        let size = data.len();
        // A failed layer writes nothing more: its transaction's objects are dropped with it.
        let skip = shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed
            .is_some();
        let written = if skip {
            Ok(Outcome::Ignored)
        } else {
            write_object_bytes(repo, &checksum, &ext, data)
                .map_err(|e| e.context(format!("importing {}{rel}", super::REPO_DIR)))
        };
        let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.queued_bytes -= size;
        state.in_flight -= 1;
        match written {
            Ok(outcome) => state.done.push((checksum, ext, outcome)),
            Err(e) => {
                if state.failed.as_ref().is_none_or(|(first, _)| seq < *first) {
                    state.failed = Some((seq, e));
                }
            }
        }
        shared.progress.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostree::gio;
    use ostree::glib::prelude::*;
    use sha2::Digest;

    /// A dirmeta object of `mode` (a directory's), its bytes and checksum.
    fn dirmeta(mode: u32) -> (String, Vec<u8>) {
        let xattrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let variant = (0u32.to_be(), 0u32.to_be(), (0o40000 | mode).to_be(), xattrs).to_variant();
        let data = variant.data().to_vec();
        (hex::encode(sha2::Sha256::digest(&data)), data)
    }

    fn repo(dir: &std::path::Path) -> ostree::Repo {
        let repo = ostree::Repo::new_for_path(dir);
        repo.create(ostree::RepoMode::Bare, gio::Cancellable::NONE).unwrap();
        repo.prepare_transaction(gio::Cancellable::NONE).unwrap();
        repo
    }

    #[test]
    fn objects_are_written_by_the_pool_and_counted_once_drained() {
        for threads in [1, 2] {
            objects_are_written_and_counted(threads);
        }
    }

    fn objects_are_written_and_counted(threads: usize) {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo(dir.path());
        let mut writers = Writers::start(&repo, threads).unwrap();
        let mut tally = Tally::default();
        let objects: Vec<_> = (0o700..0o740).map(dirmeta).collect();
        for (checksum, data) in &objects {
            let rel = format!("objects/{}/{}.dirmeta", &checksum[..2], &checksum[2..]);
            writers.submit(&rel, checksum.clone(), "dirmeta", data.clone()).unwrap();
        }
        // Again: the repo has them now.
        let (checksum, data) = objects[0].clone();
        writers.drain(&mut tally).unwrap();
        writers.submit("again", checksum, "dirmeta", data).unwrap();
        writers.drain(&mut tally).unwrap();
        assert_eq!((tally.written, tally.skipped), (objects.len() as u64, 1));
        for (checksum, _) in &objects {
            let has = repo.has_object(ostree::ObjectType::DirMeta, checksum, gio::Cancellable::NONE);
            assert!(has.unwrap(), "{checksum} was not written");
        }
    }

    #[test]
    fn of_several_bad_objects_the_earliest_is_reported_and_the_layer_stops() {
        for threads in [1, 2] {
            the_earliest_bad_object_is_reported(threads);
        }
    }

    fn the_earliest_bad_object_is_reported(threads: usize) {
        let dir = tempfile::tempdir().unwrap();
        let repo = repo(dir.path());
        let mut writers = Writers::start(&repo, threads).unwrap();
        let mut tally = Tally::default();
        let mut first_error = None;
        for (i, mode) in (0o700..0o770).enumerate() {
            let (checksum, mut data) = dirmeta(mode);
            // Every tenth from the fifth on holds content that is not what its name says.
            if i % 10 == 5 {
                data[11] ^= 1;
            }
            let submitted = writers.submit(&format!("object {i}"), checksum, "dirmeta", data);
            if let Err(e) = submitted {
                first_error = Some(e);
                break;
            }
        }
        let error = match first_error {
            Some(e) => e,
            None => writers.drain(&mut tally).unwrap_err(),
        };
        assert!(
            format!("{error:#}").starts_with("importing srv/repo/object 5:"),
            "{error:#}"
        );
        // Reported once: the pool is clear for the caller's last drain.
        assert!(writers.drain(&mut tally).is_ok());
    }
}
