//! Writes a layer's checkpoints and import record only once the objects they name are on disk.
//!
//! libostree syncs a transaction's objects when it commits, not as they are staged; a power cut
//! inside an import can lose the newest ones. A checkpoint or record naming such an object
//! would send the next boot's run back to fetch its layer again (the object fails its checksum
//! when taken back: see `crate::import::adopt`). So each is written after a `syncfs` of the
//! repo's filesystem that began after it was made, which also makes the spooled bytes it
//! relies on durable. The import does not wait for the sync: this thread does, and a record
//! made during one replaces the layer's checkpoint that waits. A layer's next checkpoint waits
//! for the one before it to be taken up, though: the spool is freed only up to a written
//! checkpoint, so this bounds its share to two checkpoint intervals (`crate::import::spool_bound`)
//! even where the disk is slower than the import (the import then goes at the disk's pace,
//! which its commit would wait for anyway).

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What is written of one layer.
pub(crate) enum Write {
    /// A checkpoint (JSON), and the spooled bytes before this offset may then be freed.
    Checkpoint { json: Vec<u8>, free_before: u64 },
    /// The record of the layer's import (JSON), which replaces its spool and checkpoint.
    Imported { json: Vec<u8> },
}

#[derive(Default)]
struct Pending {
    writes: BTreeMap<String, Write>,
    stopped: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Signalled when a write is queued, or the writer stops.
    queued: Condvar,
    /// Signalled when the thread takes up what waits, or stops.
    taken: Condvar,
}

pub(crate) struct SpoolWriter {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl SpoolWriter {
    /// Starts the thread that syncs the filesystem of `dir`, then hands each write to `apply`.
    pub fn start(dir: PathBuf, apply: impl Fn(&str, Write) + Send + 'static) -> SpoolWriter {
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            queued: Condvar::new(),
            taken: Condvar::new(),
        });
        let theirs = shared.clone();
        let worker = std::thread::Builder::new()
            .name("pivot-spools".into())
            .spawn(move || run(&dir, &theirs, apply))
            .map_err(|e| tracing::warn!("no thread to save checkpoints with: {e}"))
            .ok();
        SpoolWriter { shared, worker }
    }

    /// Queues `write` for the layer `digest`: a record replaces a checkpoint of it still
    /// waiting, a checkpoint first waits for that one to be taken up. Gives `write` back when
    /// there is no thread to write it.
    pub fn send(&self, digest: &str, write: Write) -> Result<(), Write> {
        if self.worker.is_none() {
            return Err(write);
        }
        let mut pending = self.lock();
        if let Write::Checkpoint { .. } = write {
            while pending.writes.contains_key(digest) && !pending.stopped {
                pending = self
                    .shared
                    .taken
                    .wait(pending)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
        pending.writes.insert(digest.to_string(), write);
        self.shared.queued.notify_one();
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.shared.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops what waits and ends the thread (the import is over: nothing is kept).
    pub fn stop(&mut self) {
        self.lock().stopped = true;
        self.shared.queued.notify_one();
        self.shared.taken.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Drop for SpoolWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(dir: &std::path::Path, shared: &Shared, apply: impl Fn(&str, Write)) {
    loop {
        let writes = {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            while pending.writes.is_empty() && !pending.stopped {
                pending = shared
                    .queued
                    .wait(pending)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if pending.stopped {
                return;
            }
            std::mem::take(&mut pending.writes)
        };
        shared.taken.notify_all();
        // A sync that fails leaves the writes as durable as libostree's own staging: they are
        // still worth keeping (a run in the same boot finds everything they name).
        if let Err(e) = sync(dir) {
            tracing::warn!("could not sync {}: {e}", dir.display());
        }
        for (digest, write) in writes {
            apply(&digest, write);
        }
    }
}

/// `syncfs` of the filesystem holding `dir` (created if missing).
fn sync(dir: &std::path::Path) -> std::io::Result<()> {
    crate::node::state::private_dir(dir).map_err(std::io::Error::other)?;
    let handle = std::fs::File::open(dir)?;
    nix::unistd::syncfs(handle.as_raw_fd()).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn writes_reach_the_disk_newest_last_and_a_stopped_writer_writes_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let applied = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
        let log = applied.clone();
        let mut writer = SpoolWriter::start(dir.path().join("spools"), move |digest, write| {
            let what = match write {
                Write::Checkpoint { json, .. } => String::from_utf8(json).unwrap(),
                Write::Imported { .. } => "imported".to_string(),
            };
            log.lock().unwrap().push((digest.to_string(), what));
        });
        for i in 0..20 {
            let json = format!("checkpoint {i}").into_bytes();
            writer
                .send("a", Write::Checkpoint { json, free_before: 0 })
                .unwrap_or_else(|_| panic!("no writer thread"));
        }
        let imported = Write::Imported { json: Vec::new() };
        assert!(writer.send("a", imported).is_ok());
        let json = b"checkpoint b".to_vec();
        assert!(writer.send("b", Write::Checkpoint { json, free_before: 0 }).is_ok());
        let started = Instant::now();
        while applied.lock().unwrap().len() < 2 || !done(&applied.lock().unwrap()) {
            assert!(started.elapsed() < Duration::from_secs(30), "{applied:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.stop();
        let applied = applied.lock().unwrap().clone();
        // A layer's writes are made in order, the record last; superseded ones may be skipped.
        let a: Vec<&str> = applied.iter().filter(|(d, _)| d == "a").map(|(_, w)| w.as_str()).collect();
        assert_eq!(a.last(), Some(&"imported"), "{applied:?}");
        assert!(a.len() <= 21);
        let numbers: Vec<u32> = a
            .iter()
            .filter_map(|w| w.strip_prefix("checkpoint ")?.parse().ok())
            .collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{applied:?}");
        // The sync needs the directory: it was made, private.
        let mode = std::fs::metadata(dir.path().join("spools")).unwrap();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777, 0o700);
        // Stopped: a write is given back, not lost silently.
        assert!(writer.send("c", Write::Imported { json: Vec::new() }).is_err());
    }

    fn done(applied: &[(String, String)]) -> bool {
        applied.iter().any(|(d, w)| d == "a" && w == "imported")
            && applied.iter().any(|(d, _)| d == "b")
    }
}
