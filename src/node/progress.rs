//! Progress for the people and programs waiting on a pivot.
//!
//! - On a terminal (stderr is a TTY, not the journal): a bar for the layer being fetched and one
//!   for the whole image, with bytes, rate and ETA, then one summary line.
//! - Otherwise (journald, pipes): a plain log line every 5 s or every 10 % of the image.
//! - `--progress-fd N`: JSON Lines on file descriptor N, the events of
//!   [`crate::api::progress::Event`], opening with
//!   `{"event":"stream","apiVersion":"pivot.openshift.io/v1","kind":"PivotProgress"}`.
// unsafe: taking ownership of the descriptor --progress-fd duplicates.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use crate::api::outcome::Outcome;
use crate::api::progress::{Event, LayerSize, Step, KIND};
use crate::api::API_VERSION;

const TERMINAL_EVERY: Duration = Duration::from_millis(100);
const PLAIN_EVERY: Duration = Duration::from_secs(5);
const JSON_EVERY: Duration = Duration::from_millis(250);

/// Shared by the pipeline's threads; cheap to clone.
#[derive(Clone, Default)]
pub struct Progress {
    inner: Option<Arc<Mutex<State>>>,
}

struct State {
    terminal: bool,
    json: Option<File>,
    started: Instant,
    layers: Vec<(String, u64, u64)>,
    total: u64,
    /// Bytes of the layers done, fetched or not: what the bars show.
    done: u64,
    /// Of those, the bytes this run fetched.
    fetched: u64,
    current: usize,
    last_draw: Option<Instant>,
    last_plain: Instant,
    last_plain_tenth: u64,
    last_json: Vec<Instant>,
    /// Lines of bars on screen.
    drawn: usize,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl Progress {
    /// `json_fd`: where to write JSON Lines, if anywhere.
    pub fn new(json_fd: Option<RawFd>) -> Result<Progress> {
        let json = match json_fd {
            Some(fd) => {
                // A private duplicate (close-on-exec): whatever happens to the number the caller
                // passed, pivot writes to the file it meant.
                let dup = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10));
                ensure!(
                    dup.is_ok(),
                    "--progress-fd {fd} is not an open file descriptor"
                );
                // SAFETY: `dup` is a new descriptor that nothing else owns.
                Some(unsafe { File::from_raw_fd(dup.unwrap()) })
            }
            None => None,
        };
        let terminal =
            std::io::stderr().is_terminal() && std::env::var_os("JOURNAL_STREAM").is_none();
        let progress = Progress {
            inner: Some(Arc::new(Mutex::new(State {
                terminal,
                json,
                started: Instant::now(),
                layers: Vec::new(),
                total: 0,
                done: 0,
                fetched: 0,
                current: 0,
                last_draw: None,
                last_plain: Instant::now(),
                last_plain_tenth: 0,
                last_json: Vec::new(),
                drawn: 0,
            }))),
        };
        // The stream opens by naming itself, so that a reader knows which shape follows.
        progress.with(|s| {
            s.emit(Event::Stream {
                api_version: API_VERSION.into(),
                kind: KIND.into(),
            })
        });
        Ok(progress)
    }

    fn with(&self, f: impl FnOnce(&mut State)) {
        if let Some(inner) = &self.inner {
            if let Ok(mut state) = inner.lock() {
                f(&mut state);
            }
        }
    }

    pub fn step(&self, step: Step) {
        self.with(|s| s.emit(Event::Step { step }));
    }

    /// The layers about to be fetched: (digest, size).
    pub fn start(&self, image: &str, digest: &str, layers: &[(String, u64)]) {
        self.with(|s| {
            s.layers = layers.iter().map(|(d, n)| (d.clone(), *n, 0)).collect();
            s.total = layers.iter().map(|(_, n)| n).sum();
            s.last_json = vec![Instant::now() - JSON_EVERY; layers.len()];
            s.started = Instant::now();
            let layers = layers
                .iter()
                .map(|(digest, size)| LayerSize {
                    digest: digest.clone(),
                    size: *size,
                })
                .collect();
            s.emit(Event::Start {
                image: image.into(),
                digest: digest.into(),
                total: s.total,
                layers,
            });
        });
    }

    /// `n` more bytes of layer `index` arrived (from the registry, or the image's layout).
    pub fn bytes(&self, index: usize, n: u64) {
        self.with(|s| s.add(index, n, true));
    }

    /// `n` bytes of layer `index` that this run did not fetch: the layer is in the repo
    /// already, or an earlier run's download kept them. They fill the bars; the summary and
    /// the `done` event count only what was fetched.
    pub fn present(&self, index: usize, n: u64) {
        self.with(|s| s.add(index, n, false));
    }

    /// Ends the display: a summary line, and the `done` event.
    pub fn finish(&self, outcome: Outcome) {
        self.with(|s| {
            s.clear_bars();
            let secs = s.started.elapsed().as_secs_f64();
            let present = s.done - s.fetched;
            let here = match present {
                0 => String::new(),
                n => format!("; {} of the image's layers were here already", human(n)),
            };
            if s.fetched > 0 {
                tracing::info!(
                    "fetched {} in {:.1} s ({}/s){here}",
                    human(s.fetched),
                    secs,
                    human((s.fetched as f64 / secs.max(0.001)) as u64)
                );
            } else if present > 0 {
                tracing::info!("fetched nothing{here}");
            }
            s.emit(Event::Done {
                outcome,
                bytes: s.fetched,
                seconds: secs,
            });
        });
    }
}

impl State {
    fn emit(&mut self, event: Event) {
        if let Some(out) = &mut self.json {
            // A reader that went away must not fail the pivot.
            if let Ok(line) = serde_json::to_string(&event) {
                let _ = writeln!(out, "{line}");
            }
        }
    }

    /// `n` more bytes of layer `index` done, `fetched` by this run or not.
    fn add(&mut self, index: usize, n: u64, fetched: bool) {
        let Some(layer) = self.layers.get_mut(index) else {
            return;
        };
        layer.2 += n;
        let (digest, size, done) = layer.clone();
        self.done += n;
        if fetched {
            self.fetched += n;
        }
        self.current = index;
        let now = Instant::now();
        if self.json.is_some() && (done == size || now - self.last_json[index] >= JSON_EVERY) {
            self.last_json[index] = now;
            self.emit(Event::Bytes {
                layer: index,
                digest,
                done,
                size,
                total_done: self.done,
                total: self.total,
            });
        }
        if self.terminal {
            if self.last_draw.is_none_or(|t| now - t >= TERMINAL_EVERY) || done == size {
                self.last_draw = Some(now);
                self.draw();
            }
        } else {
            let tenth = self.done * 10 / self.total.max(1);
            if tenth > self.last_plain_tenth || now - self.last_plain >= PLAIN_EVERY {
                self.last_plain_tenth = tenth;
                self.last_plain = now;
                tracing::info!(
                    "fetching layer {}/{}: {} of {} ({}%), {}/s",
                    index + 1,
                    self.layers.len(),
                    human(self.done),
                    human(self.total),
                    self.done * 100 / self.total.max(1),
                    human(self.rate())
                );
            }
        }
    }

    fn rate(&self) -> u64 {
        (self.done as f64 / self.started.elapsed().as_secs_f64().max(0.001)) as u64
    }

    /// One bar per layer in flight (layers download in parallel), then the total.
    fn draw(&mut self) {
        let rate = self.rate();
        let eta = |left: u64| match rate {
            0 => "?".to_string(),
            r => format!("{}s", left / r),
        };
        let count = self.layers.len();
        let mut lines: Vec<String> = self
            .layers
            .iter()
            .enumerate()
            .filter(|(i, (_, size, done))| (*done > 0 && done < size) || *i == self.current)
            .map(|(i, (_, size, done))| {
                format!(
                    "layer {}/{count} {} {}/{}",
                    i + 1,
                    bar(*done, *size),
                    human(*done),
                    human(*size)
                )
            })
            .collect();
        lines.push(format!(
            "total     {} {}/{}  {}/s  ETA {}",
            bar(self.done, self.total),
            human(self.done),
            human(self.total),
            human(rate),
            eta(self.total.saturating_sub(self.done))
        ));
        let mut err = std::io::stderr().lock();
        // Move up over the previous bars, redraw, and blank lines left over from a taller draw.
        if self.drawn > 0 {
            let _ = write!(err, "\x1b[{}F", self.drawn);
        }
        for line in &lines {
            let _ = writeln!(err, "\x1b[2K{line}");
        }
        for _ in lines.len()..self.drawn {
            let _ = writeln!(err, "\x1b[2K");
        }
        let extra = self.drawn.saturating_sub(lines.len());
        if extra > 0 {
            let _ = write!(err, "\x1b[{extra}F");
        }
        self.drawn = lines.len();
    }

    fn clear_bars(&mut self) {
        if self.drawn > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\x1b[{}F", self.drawn);
            for _ in 0..self.drawn {
                let _ = writeln!(err, "\x1b[2K");
            }
            let _ = write!(err, "\x1b[{}F", self.drawn);
            self.drawn = 0;
        }
    }
}

fn bar(done: u64, total: u64) -> String {
    const WIDTH: u64 = 24;
    let filled = (done * WIDTH / total.max(1)).min(WIDTH) as usize;
    format!(
        "[{}{}]",
        "#".repeat(filled),
        "-".repeat(WIDTH as usize - filled)
    )
}

/// Bytes for people: `12.3 MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes_read_naturally() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(5 << 30), "5.0 GiB");
    }

    #[test]
    fn bars_fill_proportionally() {
        assert_eq!(bar(0, 10), format!("[{}]", "-".repeat(24)));
        assert_eq!(
            bar(5, 10),
            format!("[{}{}]", "#".repeat(12), "-".repeat(12))
        );
        assert_eq!(bar(10, 10), format!("[{}]", "#".repeat(24)));
    }

    /// A whole stream, as a run writes it, reads back line by line through the published
    /// types, in the documented order, with the spellings the docs give.
    #[test]
    fn the_stream_reads_back_through_the_published_types() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.jsonl");
        let out = File::create(&path).unwrap();
        let progress = Progress::new(Some(out.as_raw_fd())).unwrap();
        progress.step(Step::Pulling);
        progress.start(
            "reg/os@sha256:00",
            "sha256:00",
            &[("sha256:aa".into(), 3), ("sha256:bb".into(), 2)],
        );
        progress.step(Step::Importing);
        progress.bytes(0, 3);
        // Layer 1 was here already: it fills the bars but was not fetched.
        progress.present(1, 2);
        progress.step(Step::Deploying);
        progress.finish(Outcome::Deployed);
        let mut text = String::new();
        File::open(&path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let events: Vec<Event> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(
            events[0],
            Event::Stream {
                api_version: API_VERSION.into(),
                kind: KIND.into()
            }
        );
        assert_eq!(events[1], Event::Step { step: Step::Pulling });
        assert!(matches!(&events[2], Event::Start { total: 5, layers, .. } if layers.len() == 2));
        assert!(matches!(
            events[5],
            Event::Bytes {
                layer: 1,
                done: 2,
                total_done: 5,
                total: 5,
                ..
            }
        ));
        assert!(matches!(
            events.last(),
            Some(Event::Done {
                outcome: Outcome::Deployed,
                bytes: 3,
                ..
            })
        ));
        assert!(text.lines().nth(1).unwrap().contains(r#""step":"pulling""#));
    }
}
