//! A layer's object writes, spread over a pool of threads.
//!
//! Writing an archive-repo object is most of a legacy layer's import: libostree inflates it,
//! checksums it and writes the file, which on a single thread left the other core idle while one
//! big layer — the shape oscontainers ship — was imported (benches/pivot-bench). So the tar
//! thread reads each object (at most [`super::objects::IN_MEMORY_OBJECT`]) and hands it to
//! the pool, which writes into the same transaction (libostree's writes are safe from several
//! threads). What waits is bounded in bytes ([`QUEUED_BYTES`]). A checkpoint waits until the
//! objects submitted before it are staged ([`Writers::mark`], [`Writers::staged_before`]) and
//! the record until all are, so either names only objects already staged, while the import
//! reads on; a write that fails stops the layer, and of several failures the one of the
//! earliest object in the layer is reported, as a sequential import would.
//!
//! A larger object is streamed to a writer in chunks as the tar thread reads it
//! ([`Writers::submit_stream`]), and the tar thread goes on to the next member once it has sent
//! the last chunk: waiting there for the object to land left both cores half idle on a tree of
//! large files, as each object's inflating, hashing and writing drained before the next began.
//! What streams hold between the tar thread and their writers is bounded in bytes across all of
//! them ([`STREAMED_AHEAD`]): whole objects of a typical tree of large files, so that the tar
//! thread reads the next object while a writer still inflates the last (8 MiB was no faster
//! and 3 MiB more of peak memory).

use std::collections::{BTreeSet, VecDeque};
use std::io::Read;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};

use super::objects::{write_object, write_object_bytes, write_object_owned, Outcome, Tally};
use super::stream::{fill, ChunkReader, STREAM_CHUNK};

/// Bytes of objects read ahead of the writers, at most (one object may exceed it alone).
const QUEUED_BYTES: usize = 1 << 20;
/// Bytes of streamed objects read ahead of their writers, at most, all streams together (a
/// writer holds one chunk more while it reads it).
const STREAMED_AHEAD: usize = 4 << 20;
/// What the pool holds of the layer ahead of the objects it staged: queued objects and streams.
pub(super) const HELD_AHEAD: usize = QUEUED_BYTES + STREAMED_AHEAD;

struct Job {
    seq: u64,
    /// The member's path in the image's repo, as errors name it.
    rel: String,
    checksum: String,
    ext: String,
    payload: Payload,
}

enum Payload {
    /// The object file, read whole.
    Bytes(Vec<u8>),
    /// The object file of this many bytes, in chunks as the tar thread reads it.
    Stream(Receiver<Chunk>, u64),
}

impl Payload {
    /// What the job counts against [`QUEUED_BYTES`]: a stream's chunks count against
    /// [`STREAMED_AHEAD`] instead.
    fn weight(&self) -> usize {
        match self {
            Payload::Bytes(data) => data.len(),
            Payload::Stream(..) => 0,
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    queued_bytes: usize,
    /// Jobs submitted and not yet done (queued or being written), by sequence number.
    unstaged: BTreeSet<u64>,
    /// Jobs done and not yet counted: (sequence number, checksum, type, outcome).
    done: Vec<(u64, String, String, Outcome)>,
    /// The failure of the earliest object, by submission order.
    failed: Option<(u64, anyhow::Error)>,
    /// Streams the tar thread stopped feeding because reading the layer failed: their writers'
    /// failures are a consequence, and the layer's own error is the one to report.
    abandoned: BTreeSet<u64>,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Bytes in streamed chunks not yet read by their writers.
    streamed: Budget,
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
            streamed: Budget::default(),
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
            self.inline_done(checksum, ext, outcome);
            return Ok(());
        }
        self.enqueue(rel, checksum, ext, Payload::Bytes(data))?;
        Ok(())
    }

    /// Streams the object file `checksum.ext` of `size` bytes, read from `entry`, to a writer;
    /// returns once its last chunk is sent, the writer finishing it meanwhile. A failure to read
    /// `entry` is the caller's to report: the writer's failure that follows from it is not.
    pub fn submit_stream(
        &mut self,
        rel: &str,
        checksum: String,
        ext: &str,
        entry: &mut impl Read,
        size: u64,
    ) -> Result<()> {
        let context = || format!("importing {}{rel}", super::REPO_DIR);
        if let Some(repo) = &self.inline {
            let outcome = write_object(repo, &checksum, ext, entry, size).with_context(context)?;
            self.inline_done(checksum, ext, outcome);
            return Ok(());
        }
        let (tx, rx) = channel();
        let seq = self.enqueue(rel, checksum, ext, Payload::Stream(rx, size))?;
        let mut left = size;
        let fed = (|| -> Result<()> {
            while left > 0 {
                let len = STREAM_CHUNK.min(left as usize);
                let mut chunk = Chunk::take(&self.shared, len);
                let n = fill(entry, &mut chunk.data)?;
                anyhow::ensure!(n > 0, "the layer ends {left} bytes before this member does");
                chunk.data.truncate(n);
                left -= n as u64;
                if tx.send(chunk).is_err() {
                    break; // The writer stopped: its outcome or error says why.
                }
            }
            Ok(())
        })();
        if fed.is_err() {
            // Before the writer can see the stream end.
            self.lock().abandoned.insert(seq);
        }
        drop(tx);
        fed.with_context(context)
    }

    /// Queues a job, waiting while the queue is full; its sequence number. Once a write failed,
    /// fails with the error of the earliest object that failed.
    fn enqueue(&mut self, rel: &str, checksum: String, ext: &str, payload: Payload) -> Result<u64> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let weight = payload.weight();
        let mut state = self.lock();
        while state.queued_bytes > 0
            && state.queued_bytes + weight > QUEUED_BYTES
            && state.failed.is_none()
        {
            state = wait(&self.shared.progress, state);
        }
        if state.failed.is_some() {
            drop(state);
            self.drain(&mut Tally::default())?;
            state = self.lock();
        }
        state.queued_bytes += weight;
        state.unstaged.insert(seq);
        state.queue.push_back(Job {
            seq,
            rel: rel.to_string(),
            checksum,
            ext: ext.to_string(),
            payload,
        });
        self.shared.work.notify_one();
        Ok(seq)
    }

    fn inline_done(&mut self, checksum: String, ext: &str, outcome: Outcome) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.lock().done.push((seq, checksum, ext.to_string(), outcome));
    }

    /// Marks the objects submitted so far: [`Writers::staged_before`] tells when they are staged.
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// Whether every object submitted before `mark` is staged (with `wait`, once it is), having
    /// counted those in `tally`; the earliest failure, if any.
    pub fn staged_before(&mut self, mark: u64, tally: &mut Tally, wait: bool) -> Result<bool> {
        let mut state = self.lock();
        let unstaged = |state: &State| state.unstaged.first().is_some_and(|&seq| seq < mark);
        while wait && unstaged(&state) && state.failed.is_none() {
            state = self::wait(&self.shared.progress, state);
        }
        if state.failed.is_some() {
            // Nothing more is written: once what was in flight is done with, the failure of the
            // earliest object is known.
            while !state.unstaged.is_empty() {
                state = self::wait(&self.shared.progress, state);
            }
            state.done.clear();
            state.abandoned.clear();
            return Err(state.failed.take().expect("a failure").1);
        }
        if unstaged(&state) {
            return Ok(false);
        }
        let (counted, kept) = std::mem::take(&mut state.done)
            .into_iter()
            .partition(|(seq, ..)| *seq < mark);
        state.done = kept;
        for (_, checksum, ext, outcome) in counted {
            tally.count(&checksum, &ext, outcome);
        }
        state.abandoned.retain(|&seq| seq >= mark);
        Ok(true)
    }

    /// Waits until every queued object is written, then counts them in `tally`; the earliest
    /// failure, if any.
    pub fn drain(&mut self, tally: &mut Tally) -> Result<()> {
        self.staged_before(u64::MAX, tally, true).map(|_| ())
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
            for job in std::mem::take(&mut state.queue) {
                state.unstaged.remove(&job.seq);
            }
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
            payload,
        } = job;
        let weight = payload.weight();
        // A failed layer writes nothing more: its transaction's objects are dropped with it.
        let skip = shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed
            .is_some();
        let written = match payload {
            _ if skip => Ok(Outcome::Ignored),
            Payload::Bytes(data) => write_object_bytes(repo, &checksum, &ext, data),
            Payload::Stream(chunks, size) => {
                write_object_owned(repo, &checksum, &ext, ChunkReader::new(chunks), size)
            }
        }
        .map_err(|e| e.context(format!("importing {}{rel}", super::REPO_DIR)));
        let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.queued_bytes -= weight;
        state.unstaged.remove(&seq);
        match written {
            Ok(outcome) => state.done.push((seq, checksum, ext, outcome)),
            Err(_) if state.abandoned.contains(&seq) => {}
            Err(e) => {
                if state.failed.as_ref().is_none_or(|(first, _)| seq < *first) {
                    state.failed = Some((seq, e));
                }
            }
        }
        shared.progress.notify_all();
    }
}

/// A count of bytes in flight, with a bound that waits.
#[derive(Default)]
struct Budget {
    used: Mutex<usize>,
    freed: Condvar,
}

/// A streamed object's chunk, counted against [`STREAMED_AHEAD`] until it is dropped: read by its
/// writer, or dropped with a stream a writer gave up.
struct Chunk {
    data: Vec<u8>,
    /// What it counts against the budget.
    counted: usize,
    shared: Arc<Shared>,
}

impl Chunk {
    /// A chunk of `len` bytes, once the budget has room for it (always, when nothing is in
    /// flight).
    fn take(shared: &Arc<Shared>, len: usize) -> Chunk {
        let budget = &shared.streamed;
        let mut used = budget.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used > 0 && *used + len > STREAMED_AHEAD {
            used = budget.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += len;
        Chunk {
            data: vec![0; len],
            counted: len,
            shared: shared.clone(),
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let budget = &self.shared.streamed;
        *budget.used.lock().unwrap_or_else(|e| e.into_inner()) -= self.counted;
        budget.freed.notify_all();
    }
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::objects::tests::bare_repo_in_transaction;
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

    #[test]
    fn objects_are_written_by_the_pool_and_counted_once_drained() {
        for threads in [1, 2] {
            objects_are_written_and_counted(threads);
        }
    }

    fn objects_are_written_and_counted(threads: usize) {
        let dir = tempfile::tempdir().unwrap();
        let repo = bare_repo_in_transaction(dir.path());
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

    /// Large file objects stream to the writers while the tar thread reads on, each checked
    /// against its name before it lands (one larger than what streams may hold ahead among
    /// them) and counted once staged; a stream the tar thread could not finish reading fails
    /// with the layer's error, not with the writer's that follows from it, and lands nothing.
    #[test]
    fn streamed_objects_are_checked_and_counted_once_staged() {
        for threads in [1, 2] {
            streamed_objects(threads);
        }
    }

    fn streamed_objects(threads: usize) {
        use crate::import::objects::tests::*;
        let dir = tempfile::tempdir().unwrap();
        let sizes = [STREAMED_AHEAD + (1 << 20), 2 << 20, 3 << 20];
        let files: Vec<_> = (sizes.iter().enumerate())
            .map(|(i, &len)| (["a", "b", "c"][i], incompressible(len)))
            .collect();
        let objects = filez_objects(dir.path(), &files);
        let repo = bare_repo_in_transaction(dir.path());
        let mut writers = Writers::start(&repo, threads).unwrap();
        let mut tally = Tally::default();
        for (name, data) in &objects {
            let size = data.len() as u64;
            writers
                .submit_stream(name, name.clone(), "filez", &mut &data[..], size)
                .unwrap();
        }
        assert!(writers.staged_before(writers.mark(), &mut tally, true).unwrap());
        assert_eq!((tally.written, tally.skipped), (3, 0));
        assert!(objects.iter().all(|(name, _)| has_file(&repo, name)));

        let wrong = "ab".repeat(32);
        let data = &objects[1].1;
        let size = data.len() as u64;
        let submitted = writers.submit_stream("wrong", wrong.clone(), "filez", &mut &data[..], size);
        let err = format!("{:#}", submitted.and_then(|()| writers.drain(&mut tally)).unwrap_err());
        assert!(err.starts_with("importing srv/repo/wrong:"), "{err}");
        assert!(err.contains("does not match its name"), "{err}");
        assert!(!has_file(&repo, &wrong));

        let broken = std::io::Error::other("the layer's gzip is corrupt");
        let mut cut = (&data[..size as usize / 2]).chain(FailingRead(Some(broken)));
        let err = writers.submit_stream("cut", wrong.clone(), "filez", &mut cut, size);
        let err = format!("{:#}", err.unwrap_err());
        // Written on this thread (one writer), the object's own error says where it broke.
        assert!(err.starts_with("importing srv/repo/cut: "), "{err}");
        assert!(err.ends_with(": the layer's gzip is corrupt"), "{err}");
        writers.drain(&mut tally).unwrap();
        assert!(!has_file(&repo, &wrong));
    }

    struct FailingRead(Option<std::io::Error>);

    impl Read for FailingRead {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(self.0.take().unwrap_or_else(|| std::io::Error::other("read again")))
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
        let repo = bare_repo_in_transaction(dir.path());
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
