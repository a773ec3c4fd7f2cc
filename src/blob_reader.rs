//! A blocking `Read` over an async blob stream, so layers can be decompressed and imported on a
//! blocking thread (libostree is blocking) while the download runs ahead on the async runtime.

use std::io::{self, Read};

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

/// Chunks buffered ahead of the consumer: bounds memory to a few MiB per layer.
const CHANNEL_DEPTH: usize = 64;

pub struct BlobReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
    read: u64,
    limit: u64,
    done: bool,
}

impl BlobReader {
    /// Starts forwarding `stream` on `runtime`; reading more than `limit` bytes is an error, so a
    /// blob cannot be larger than its descriptor says.
    pub fn spawn(
        runtime: &Handle,
        mut stream: BoxStream<'static, io::Result<Bytes>>,
        limit: u64,
    ) -> Self {
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        runtime.spawn(async move {
            while let Some(item) = stream.next().await {
                let failed = item.is_err();
                // The reader went away (the import failed): stop downloading.
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
        });
        BlobReader {
            rx,
            current: Bytes::new(),
            read: 0,
            limit,
            done: false,
        }
    }

    /// Bytes handed out so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                None => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.current.len());
        if self.read + n as u64 > self.limit {
            self.done = true;
            return Err(io::Error::other(format!(
                "blob is larger than the {} bytes its descriptor declares",
                self.limit
            )));
        }
        buf[..n].copy_from_slice(&self.current.split_to(n));
        self.read += n as u64;
        Ok(n)
    }
}
