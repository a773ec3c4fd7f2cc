//! The host side of the command channel to guest/pivot-vm-agent over virtio-serial.
//!
//! The guest announces each boot with `HELLO <boot id>`. A request is
//! `<id> <boot id> <timeout s> <base64 script>` and its answer `RESULT <id> <rc> <base64 output>`;
//! the agent ignores requests addressed to another boot, so a request that was in flight when the
//! guest rebooted can never run in the next boot.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine;

pub enum Event {
    Hello { boot_id: String, at: Instant },
    Result { id: u64, rc: i32, output: String },
}

pub struct Agent {
    stream: UnixStream,
    events: Receiver<Event>,
    next_id: u64,
}

/// What a command printed and how it exited.
pub struct Output {
    pub rc: i32,
    pub text: String,
}

impl Agent {
    /// Serves the channel over `stream`, the host's connected end of the agent socket.
    pub fn new(stream: UnixStream) -> Result<Agent> {
        let reader = BufReader::new(stream.try_clone()?);
        let (tx, events) = mpsc::channel();
        // Reads for as long as QEMU keeps the socket open, across guest reboots.
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                if let Some(event) = parse(&line) {
                    if tx.send(event).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Agent {
            stream,
            events,
            next_id: 1,
        })
    }

    /// Waits for the next `HELLO` (a boot whose agent came up), up to `deadline`. Returns `None`
    /// at the deadline, so the caller can check the console in between.
    pub fn next_hello(&mut self, until: Instant) -> Result<Option<(String, Instant)>> {
        loop {
            let wait = until.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(wait) {
                Ok(Event::Hello { boot_id, at }) => return Ok(Some((boot_id, at))),
                Ok(Event::Result { .. }) => continue,
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the agent socket closed (QEMU exited?)")
                }
            }
        }
    }

    /// Runs `script` with bash in boot `boot_id`, for at most `timeout`.
    pub fn run(&mut self, boot_id: &str, script: &str, timeout: Duration) -> Result<Output> {
        let id = self.next_id;
        self.next_id += 1;
        let b64 = base64::engine::general_purpose::STANDARD.encode(script);
        let secs = timeout.as_secs().max(1);
        writeln!(self.stream, "{id} {boot_id} {secs} {b64}").context("writing to the agent")?;
        // The agent's own timeout fires first; this one covers a guest that stopped answering.
        let deadline = Instant::now() + timeout + Duration::from_secs(30);
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(wait) {
                Ok(Event::Result {
                    id: got,
                    rc,
                    output,
                }) if got == id => return Ok(Output { rc, text: output }),
                Ok(Event::Result { .. }) => continue,
                Ok(Event::Hello { boot_id: new, .. }) => {
                    bail!("the guest rebooted (new boot {new}) while running: {script}")
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("no answer from the guest within {timeout:?} + 30 s to: {script}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("the agent socket closed (QEMU exited?)")
                }
            }
        }
    }

    /// Sends `script` without waiting for an answer (a reboot or poweroff may cut it short).
    pub fn send(&mut self, boot_id: &str, script: &str) -> Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        let b64 = base64::engine::general_purpose::STANDARD.encode(script);
        writeln!(self.stream, "{id} {boot_id} 60 {b64}").context("writing to the agent")
    }
}

fn parse(line: &str) -> Option<Event> {
    let mut words = line.trim_end().splitn(4, ' ');
    match words.next()? {
        "HELLO" => Some(Event::Hello {
            boot_id: words.next()?.to_string(),
            at: Instant::now(),
        }),
        "RESULT" => {
            let id = words.next()?.parse().ok()?;
            let rc = words.next()?.parse().ok()?;
            let output = base64::engine::general_purpose::STANDARD
                .decode(words.next().unwrap_or(""))
                .ok()?;
            Some(Event::Result {
                id,
                rc,
                output: String::from_utf8_lossy(&output).into_owned(),
            })
        }
        _ => None,
    }
}
