//! `RealtimeServer`: the simulated OpenAI Realtime server (`realtime_sim.rs`) on a loopback
//! WebSocket, for tests of the real provider and for `cargo run --example realtime`
//! without a key (cargo feature `realtime`).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::Message;

use super::realtime_script::RealtimeScript;
use super::realtime_sim::{Outgoing, SimReport, Simulator};

/// A loopback WebSocket server that speaks the OpenAI Realtime API (GA) from a
/// [`RealtimeScript`] and checks its client as the service does. It runs on a thread of
/// its own, in real time, until dropped. Point `OpenAiRealtime` at
/// [`base_url`](Self::base_url) with any API key (a connection without one is refused
/// with 401, as the service does).
pub struct RealtimeServer {
    addr: SocketAddr,
    sim: Simulator,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for RealtimeServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealtimeServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl RealtimeServer {
    /// Starts the server on a free port of 127.0.0.1.
    pub fn start(script: RealtimeScript) -> io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let sim = Simulator::new(script);
        let (stop, stopped) = oneshot::channel();
        let serving = sim.clone();
        let thread = std::thread::Builder::new()
            .name("realtime-server".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        tracing::error!(%err, "the loopback realtime server cannot start");
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(listener) => listener,
                        Err(err) => {
                            tracing::error!(%err, "the loopback realtime server cannot listen");
                            return;
                        }
                    };
                    tokio::select! {
                        () = accept(listener, serving) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(Self {
            addr,
            sim,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL to give the provider.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// What it saw so far, over all connections.
    pub fn report(&self) -> SimReport {
        self.sim.report()
    }
}

impl Drop for RealtimeServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(listener: TcpListener, sim: Simulator) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::task::spawn_local(connection(stream, sim.clone()));
    }
}

/// Refuses a handshake without a bearer token, as the service does.
// The signature is tungstenite's handshake callback; the refusal is an HTTP response.
#[allow(clippy::result_large_err)]
fn authorize(request: &Request, response: Response) -> Result<Response, ErrorResponse> {
    let bearer = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer "));
    if bearer {
        return Ok(response);
    }
    let mut refusal = ErrorResponse::new(Some(
        r#"{"error":{"type":"invalid_request_error","code":"invalid_api_key","message":"Missing bearer authentication in header"}}"#
            .to_owned(),
    ));
    *refusal.status_mut() = StatusCode::UNAUTHORIZED;
    Err(refusal)
}

async fn connection(stream: tokio::net::TcpStream, sim: Simulator) {
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, authorize).await else {
        return;
    };
    let (mut sink, mut source) = ws.split();
    let (to_sim, incoming) = mpsc::unbounded_channel();
    let (outgoing, mut from_sim) = mpsc::unbounded_channel();
    let (_control, controls) = mpsc::unbounded_channel();
    let reader = async move {
        while let Some(Ok(message)) = source.next().await {
            match message {
                Message::Text(text) if to_sim.send(text.as_str().to_owned()).is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    let writer = async move {
        while let Some(out) = from_sim.recv().await {
            match out {
                Outgoing::Text(text) => {
                    if sink.send(Message::text(text)).await.is_err() {
                        break;
                    }
                }
                Outgoing::Close => {
                    let _ = sink.close().await;
                    break;
                }
            }
        }
    };
    tokio::task::spawn_local(reader);
    tokio::task::spawn_local(writer);
    sim.serve(incoming, outgoing, controls).await;
}
