//! `Proxy`: a TCP proxy between one worker process and the NATS server, to cut the worker
//! off from the server while it lives (a partition).
//!
//! While cut, the proxy forwards nothing, either way: what it reads it holds, and the
//! sockets stay open, as across a network path that drops everything — neither side hears
//! a close, only silence. Healed, it forwards what it held and goes on. A connection the
//! server closes (a restart) is closed on the worker's side too, once the proxy forwards
//! again, so the worker reconnects through the proxy as it would to the server.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A proxy to one upstream address; see the module docs. Dropping it closes everything.
pub struct Proxy {
    addr: SocketAddr,
    flowing: watch::Sender<bool>,
    listener: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream` (a
    /// `nats://host:port` URL).
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream
            .trim_start_matches("nats://")
            .parse()
            .expect("the server's URL is host:port");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let (flowing, watching) = watch::channel(true);
        let listener = tokio::spawn(async move {
            // Dropped with the listener's task: every connection closes with the proxy.
            let mut connections = JoinSet::new();
            while let Ok((worker, _)) = listener.accept().await {
                let watching = watching.clone();
                connections.spawn(async move {
                    // The server away (a restart): the worker's connection closes, and it
                    // tries again.
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = worker.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (worker_read, worker_write) = worker.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(worker_read, server_write, watching.clone()),
                        pump(server_read, worker_write, watching),
                    );
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Self {
            addr,
            flowing,
            listener,
        }
    }

    /// The URL a worker connects to instead of the server's.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Stops forwarding, both ways.
    pub fn cut(&self) {
        self.flowing.send_replace(false);
    }

    /// Forwards again (what was held first).
    pub fn heal(&self) {
        self.flowing.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Copies `from` to `to` while the proxy forwards; holds what it read while it does not.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut flowing: watch::Receiver<bool>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if flowing.wait_for(|on| *on).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if flowing.wait_for(|on| *on).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
