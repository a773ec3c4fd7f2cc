//! A loopback TCP server on its own thread and tokio runtime, so it keeps
//! serving while the test thread blocks (e.g. waiting on a pivot child).

use anyhow::{Context, Result};
use std::future::Future;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// When a paused listener listens again.
enum Resume {
    After(Duration),
    /// When the sender is used or dropped.
    When(oneshot::Receiver<()>),
}

/// Ends a pause of a test server (e.g. `FleetLockServer::down`): the listener listens again
/// when this is dropped.
pub struct Resumer(#[allow(dead_code)] oneshot::Sender<()>);

pub(crate) struct Server {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    pause: mpsc::UnboundedSender<(Resume, oneshot::Sender<()>)>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds 127.0.0.1:0 and runs `handler` for each accepted connection.
    pub fn spawn<H, F>(name: &str, handler: H) -> Result<Server>
    where
        H: Fn(TcpStream) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        // Bind here, not on the thread, so the port is known and errors surface now.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .with_context(|| format!("binding {name} on loopback"))?;
        listener
            .set_nonblocking(true)
            .context("making listener non-blocking")?;
        let addr = listener.local_addr().context("reading bound address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building tokio runtime")?;
        let (tx, rx) = oneshot::channel::<()>();
        let (pause_tx, pause_rx) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        _ = rx => {}
                        r = accept_loop(listener, addr, pause_rx, handler) => {
                            if let Err(e) = r {
                                eprintln!("listener on {addr}: {e:#}");
                            }
                        }
                    }
                });
                // Dropping the runtime here cancels connections still in flight.
            })
            .with_context(|| format!("spawning {name} thread"))?;
        Ok(Server {
            addr,
            shutdown: Some(tx),
            pause: pause_tx,
            thread: Some(thread),
        })
    }

    /// Closes the listening socket for `duration`, so new connections are
    /// refused, then listens on the same address again. Returns once closed;
    /// connections already accepted carry on.
    pub fn refuse_for(&self, duration: Duration) -> Result<()> {
        self.pause_with(Resume::After(duration))
    }

    /// Closes the listening socket until the [`Resumer`] is dropped.
    pub fn refuse_until_resumed(&self) -> Result<Resumer> {
        let (tx, rx) = oneshot::channel();
        self.pause_with(Resume::When(rx))?;
        Ok(Resumer(tx))
    }

    fn pause_with(&self, resume: Resume) -> Result<()> {
        let (ack_tx, ack_rx) = oneshot::channel();
        self.pause
            .send((resume, ack_tx))
            .map_err(|_| anyhow::anyhow!("server thread is gone"))?;
        ack_rx
            .blocking_recv()
            .context("server thread did not close its listener")
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

async fn accept_loop<H, F>(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    mut pause: mpsc::UnboundedReceiver<(Resume, oneshot::Sender<()>)>,
    handler: H,
) -> Result<()>
where
    H: Fn(TcpStream) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut listener = TcpListener::from_std(listener).context("registering listener")?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted.context("accepting")?;
                tokio::spawn(handler(stream));
            }
            Some((resume, ack)) = pause.recv() => {
                drop(listener);
                let _ = ack.send(());
                match resume {
                    Resume::After(duration) => tokio::time::sleep(duration).await,
                    Resume::When(rx) => {
                        let _ = rx.await;
                    }
                }
                // std sets SO_REUSEADDR on Unix, so the same port binds again.
                let std_listener = std::net::TcpListener::bind(addr)
                    .with_context(|| format!("binding {addr} again"))?;
                std_listener.set_nonblocking(true)?;
                listener = TcpListener::from_std(std_listener)?;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
