//! [`LiveKitBridge`]: the WebSocket server LiveKit workers connect to, one connection per
//! call. It checks each hello (protocol version, token), starts a call's session through
//! the [`HostFactory`] on its first hello, and hands a reconnection to the call it
//! belongs to.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::host::{BridgeHost, CallInfo, SpeechSink};
use crate::link::{run_call, send, Attach, Calls, Socket};
use crate::protocol::{ClientFrame, Hello, ServerFrame, PROTOCOL_VERSION};
use crate::token::BridgeToken;

/// Starts the session of a new call. Given who is calling and the [`SpeechSink`] the
/// session's speech goes to; returns the host the call's inputs are applied to, or why
/// the call cannot start (the worker is refused with that reason).
///
/// A closure `|call, speech| async move { … }` is a factory.
pub trait HostFactory: Send + Sync + 'static {
    /// The host it starts.
    type Host: BridgeHost;
    /// Starts a call's session.
    fn start(
        &self,
        call: CallInfo,
        speech: SpeechSink,
    ) -> impl Future<Output = Result<Self::Host, String>> + Send;
}

impl<F, Fut, H> HostFactory for F
where
    F: Fn(CallInfo, SpeechSink) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<H, String>> + Send,
    H: BridgeHost,
{
    type Host = H;
    fn start(
        &self,
        call: CallInfo,
        speech: SpeechSink,
    ) -> impl Future<Output = Result<H, String>> + Send {
        self(call, speech)
    }
}

/// Why the bridge could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// The address could not be bound (in use, not this machine's, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Settings of a [`LiveKitBridge`].
#[derive(Debug, Clone)]
pub struct BridgeOptions {
    /// The shared secret every worker's hello must carry.
    pub token: BridgeToken,
    /// How long a call outlives a dropped connection, waiting for its worker to
    /// reconnect; then its session closes. Default 30 s.
    pub resume_window: Duration,
    /// How long a new connection has to send its hello. Default 10 s.
    pub hello_timeout: Duration,
}

impl BridgeOptions {
    /// The defaults, with `token`.
    pub fn new(token: BridgeToken) -> Self {
        Self {
            token,
            resume_window: Duration::from_secs(30),
            hello_timeout: Duration::from_secs(10),
        }
    }
}

/// The bridge's WebSocket server, bound and ready; [`serve`](Self::serve) runs it.
#[derive(Debug)]
pub struct LiveKitBridge {
    listener: TcpListener,
    options: Arc<BridgeOptions>,
    calls: Calls,
}

impl LiveKitBridge {
    /// Binds `addr` (`127.0.0.1:0` for a free port).
    pub async fn bind(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        options: BridgeOptions,
    ) -> Result<Self, BridgeError> {
        let shown = format!("{addr:?}");
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| BridgeError::Bind {
                addr: shown,
                source,
            })?;
        Ok(Self {
            listener,
            options: Arc::new(options),
            calls: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The address it listens on (the port, when bound to port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// How many calls are running (connected or waiting for a reconnection).
    pub fn calls(&self) -> usize {
        self.calls.lock().map(|calls| calls.len()).unwrap_or(0)
    }

    /// Accepts workers until the future is dropped, starting each new call's session with
    /// `factory`. Calls keep running on their own tasks when it is dropped.
    pub async fn serve<F: HostFactory>(self, factory: F) {
        let factory = Arc::new(factory);
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: the next accept may work.
                    tracing::warn!(%error, "the bridge could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(greet(
                stream,
                self.options.clone(),
                self.calls.clone(),
                factory.clone(),
            ));
        }
    }
}

/// Takes a connection through its hello, then hands it to its call.
async fn greet<F: HostFactory>(
    stream: TcpStream,
    options: Arc<BridgeOptions>,
    calls: Calls,
    factory: Arc<F>,
) {
    let Ok(Ok(mut socket)) = tokio::time::timeout(
        options.hello_timeout,
        tokio_tungstenite::accept_async(stream),
    )
    .await
    else {
        return;
    };
    let hello = match tokio::time::timeout(options.hello_timeout, read_hello(&mut socket)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(reason)) => return refuse(socket, reason).await,
        Err(_) => return refuse(socket, "no hello in time".to_owned()).await,
    };
    if hello.protocol != PROTOCOL_VERSION {
        let reason = format!(
            "protocol {} is not spoken here (this bridge speaks {PROTOCOL_VERSION})",
            hello.protocol
        );
        return refuse(socket, reason).await;
    }
    if !options.token.matches(&hello.token) {
        tracing::warn!(session = %hello.session, "a worker presented a wrong bridge token");
        return refuse(socket, "wrong token".to_owned()).await;
    }
    if hello.session.is_empty() {
        return refuse(socket, "the hello names no session".to_owned()).await;
    }
    let attach = Attach {
        socket,
        last_output: hello.last_output,
    };
    let Some(to_call) = find_or_start(&hello, &options, &calls, &factory) else {
        let reason = format!(
            "session {} is not running here (it ended, or its resume window passed)",
            hello.session
        );
        return refuse(attach.socket, reason).await;
    };
    if let Err(mpsc::error::SendError(attach)) = to_call.send(attach).await {
        let reason = format!("session {} has just ended", hello.session);
        refuse(attach.socket, reason).await;
    }
}

/// The call `hello` belongs to: the running one, or a new one on a first hello (none for a
/// reconnection to a call that is gone).
fn find_or_start<F: HostFactory>(
    hello: &Hello,
    options: &BridgeOptions,
    calls: &Calls,
    factory: &Arc<F>,
) -> Option<mpsc::Sender<Attach>> {
    let mut running = calls.lock().ok()?;
    if let Some(call) = running.get(&hello.session) {
        return Some(call.clone());
    }
    if hello.last_output > 0 {
        return None;
    }
    let (tx, rx) = mpsc::channel(4);
    running.insert(hello.session.clone(), tx.clone());
    let info = CallInfo {
        session: hello.session.clone(),
        room: hello.room.clone(),
        participant: hello.participant.clone(),
        metadata: hello.metadata.clone(),
    };
    tokio::spawn(run_call(
        factory.clone(),
        info,
        hello.can_pause,
        rx,
        calls.clone(),
        options.resume_window,
    ));
    Some(tx)
}

async fn read_hello(socket: &mut Socket) -> Result<Hello, String> {
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => {
                return match serde_json::from_str::<ClientFrame>(&text) {
                    Ok(ClientFrame::Hello(hello)) => Ok(hello),
                    Ok(_) => Err("the first frame must be a hello".to_owned()),
                    Err(error) => Err(format!("the first frame is not a hello: {error}")),
                };
            }
            Some(Ok(Message::Close(_)) | Err(_)) | None => {
                return Err("closed before its hello".to_owned())
            }
            Some(Ok(_)) => continue,
        }
    }
}

async fn refuse(mut socket: Socket, reason: String) {
    let _ = send(&mut socket, &ServerFrame::Refused { reason }).await;
    let _ = socket.close(None).await;
    // Read until the worker closes too, so the refusal is not cut off by a reset.
    while let Some(Ok(_)) = socket.next().await {}
    let _ = socket.flush().await;
}
