//! A call's link: the task that owns one bridged call from its first hello to its end. It
//! starts the session through the factory, applies the worker's inputs to the host once
//! each and in order, numbers the session's outputs and keeps them until acknowledged, and
//! outlives a dropped connection for the resume window, so a worker that reconnects within
//! it goes on where it was.
//!
//! What holds (each checked by `tests/livekit_calls.rs`):
//! - an input is applied once, whatever the number of connections it was sent on;
//! - an output is delivered until acknowledged: a reconnection resends every output after
//!   the last one the worker says it applied, in order;
//! - a call without a connection for longer than the resume window closes its session;
//! - a hangup closes the session, and the worker is told the call `ended`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::delivery::{Admission, InputLedger, Outbox};
use crate::host::{BridgeHost, CallInfo, SpeechSink};
use crate::protocol::{CallInput, CallOutput, ClientFrame, ServerFrame};
use crate::server::HostFactory;

pub(crate) type Socket = WebSocketStream<TcpStream>;

/// A connection handed to a call after its hello was accepted.
pub(crate) struct Attach {
    pub(crate) socket: Socket,
    /// The last output the worker applied.
    pub(crate) last_output: u64,
}

/// The calls running, by session id: where a reconnection finds its call.
pub(crate) type Calls = Arc<Mutex<HashMap<String, mpsc::Sender<Attach>>>>;

type Pending = Pin<Box<dyn Future<Output = Option<CallOutput>> + Send>>;

/// How a call ended.
enum End {
    /// The worker hung up, or the session ended on its own: tell the worker.
    Ended(String),
    /// No connection for the whole resume window: nobody to tell.
    Abandoned,
}

/// Runs one call to its end; removes it from `calls` when done.
pub(crate) async fn run_call<F: HostFactory>(
    factory: Arc<F>,
    info: CallInfo,
    can_pause: bool,
    mut attaches: mpsc::Receiver<Attach>,
    calls: Calls,
    resume_window: Duration,
) {
    let session = info.session.clone();
    let (sink, speech) = SpeechSink::new(can_pause);
    let started = factory.start(info, sink).await;
    let host = match started {
        Ok(host) => host,
        Err(reason) => {
            tracing::warn!(%session, %reason, "a bridged call could not start its session");
            while let Ok(mut attach) = attaches.try_recv() {
                let _ = send(
                    &mut attach.socket,
                    &ServerFrame::Refused {
                        reason: reason.clone(),
                    },
                )
                .await;
                let _ = attach.socket.close(None).await;
            }
            forget(&calls, &session);
            return;
        }
    };
    let mut call = Call {
        session: session.clone(),
        host,
        outbox: Outbox::default(),
        ledger: InputLedger::default(),
        running: FuturesUnordered::new(),
        socket: None,
        detached_since: Instant::now(),
        attached_once: false,
    };
    let end = call.serve(&mut attaches, speech, resume_window).await;
    // Take the call off the map first: a reconnection from now on is refused, not queued.
    forget(&calls, &session);
    match end {
        End::Ended(reason) => {
            tracing::debug!(%session, %reason, "a bridged call ended");
            call.host.close().await;
            call.emit(CallOutput::Ended { reason }).await;
            if let Some(mut socket) = call.socket.take() {
                let _ = socket.close(None).await;
            }
        }
        End::Abandoned => {
            tracing::info!(%session, "a bridged call lost its worker for the whole resume window; closing its session");
            call.host.close().await;
        }
    }
}

fn forget(calls: &Calls, session: &str) {
    if let Ok(mut calls) = calls.lock() {
        calls.remove(session);
    }
}

struct Call<H> {
    session: String,
    host: H,
    outbox: Outbox<CallOutput>,
    ledger: InputLedger,
    /// Inputs whose answer takes time (typed turns, a remote host's round trips).
    running: FuturesUnordered<Pending>,
    socket: Option<Socket>,
    /// Since when the call has had no connection (meaningful while `socket` is `None`).
    detached_since: Instant,
    attached_once: bool,
}

impl<H: BridgeHost> Call<H> {
    async fn serve(
        &mut self,
        attaches: &mut mpsc::Receiver<Attach>,
        mut speech: mpsc::UnboundedReceiver<CallOutput>,
        resume_window: Duration,
    ) -> End {
        loop {
            let deadline = self
                .socket
                .is_none()
                .then(|| self.detached_since + resume_window);
            tokio::select! {
                attach = attaches.recv() => {
                    let Some(attach) = attach else { return End::Abandoned };
                    self.attach(attach).await;
                }
                frame = next_frame(&mut self.socket) => match frame {
                    Some(frame) => {
                        if let Some(end) = self.on_frame(frame).await {
                            return end;
                        }
                    }
                    None => {
                        tracing::debug!(session = %self.session, "a bridged call's connection closed; waiting for the worker to reconnect");
                        self.detach();
                    }
                },
                output = speech.recv() => match output {
                    Some(output) => self.emit(output).await,
                    None => return End::Ended("the session ended".to_owned()),
                },
                Some(answer) = self.running.next(), if !self.running.is_empty() => {
                    if let Some(answer) = answer {
                        self.emit(answer).await;
                    }
                }
                () = sleep_until(deadline) => return End::Abandoned,
            }
        }
    }

    fn detach(&mut self) {
        if self.socket.take().is_some() {
            self.detached_since = Instant::now();
        }
    }

    /// A (re)connection: the worker applied every output up to `last_output`; tell it
    /// which input came last and send again everything after its number.
    async fn attach(&mut self, attach: Attach) {
        let Attach {
            mut socket,
            last_output,
        } = attach;
        if let Some(mut old) = self.socket.take() {
            // The worker gave up on it; a newer connection wins.
            let _ = old.close(None).await;
        }
        self.outbox.ack(last_output);
        let welcome = ServerFrame::Welcome {
            session: self.session.clone(),
            resumed: self.attached_once,
            last_input: self.ledger.last(),
        };
        self.attached_once = true;
        if send(&mut socket, &welcome).await.is_err() {
            return;
        }
        for (seq, output) in self.outbox.unacked() {
            if send_output(&mut socket, seq, output).await.is_err() {
                return;
            }
        }
        self.socket = Some(socket);
    }

    /// Numbers an output, keeps it, and sends it when connected.
    async fn emit(&mut self, output: CallOutput) {
        let seq = self.outbox.push(output);
        let Some(socket) = self.socket.as_mut() else {
            return;
        };
        let Some((_, output)) = self.outbox.newest() else {
            return;
        };
        if send_output(socket, seq, output).await.is_err() {
            self.detach();
        }
    }

    async fn send_or_detach(&mut self, frame: &ServerFrame) {
        if let Some(socket) = self.socket.as_mut() {
            if send(socket, frame).await.is_err() {
                self.detach();
            }
        }
    }

    async fn on_frame(&mut self, frame: ClientFrame) -> Option<End> {
        match frame {
            ClientFrame::Ack { upto } => self.outbox.ack(upto),
            ClientFrame::Hello(_) => {
                tracing::warn!("a second hello on one connection; dropping the connection");
                self.detach();
            }
            ClientFrame::Input { id, input } => match self.ledger.admit(id) {
                Admission::Apply => {
                    let end = self.apply(id, input);
                    self.send_or_detach(&ServerFrame::Ack { upto: id }).await;
                    return end;
                }
                Admission::Duplicate => {
                    let upto = self.ledger.last();
                    self.send_or_detach(&ServerFrame::Ack { upto }).await;
                }
                Admission::Gap { expected } => {
                    tracing::warn!(id, expected, "a bridged call's input came out of order; dropping the connection so the worker resends");
                    self.detach();
                }
            },
        }
        None
    }

    /// Applies one input to the host. Its future is polled once here, before the next
    /// input is read, so the session receives the inputs in order.
    fn apply(&mut self, id: u64, input: CallInput) -> Option<End> {
        let work: Pending = match input {
            CallInput::UserStartedSpeaking => quiet(self.host.user_started_speaking()),
            CallInput::UserStoppedSpeaking => quiet(self.host.user_stopped_speaking()),
            CallInput::Transcript { text, is_final } => quiet(self.host.transcript(text, is_final)),
            CallInput::PlayoutFinished {
                speech,
                interrupted,
                heard,
            } => quiet(self.host.playout_finished(speech, interrupted, heard)),
            CallInput::UserText { text } => {
                let turn = self.host.run(text);
                Box::pin(async move {
                    Some(CallOutput::TurnDone {
                        input: id,
                        outcome: turn.await,
                    })
                })
            }
            CallInput::Hangup { reason } => {
                return Some(End::Ended(
                    reason.unwrap_or_else(|| "the worker hung up".to_owned()),
                ));
            }
        };
        self.under_way(work);
        None
    }

    fn under_way(&mut self, mut work: Pending) {
        // The real waker comes with the `FuturesUnordered`'s next poll, which polls every
        // newly pushed future.
        let mut cx = Context::from_waker(Waker::noop());
        // Ready at once: an input without an answer (or one refused, already logged).
        if work.as_mut().poll(&mut cx).is_pending() {
            self.running.push(work);
        }
    }
}

/// An input without an answer: a refusal is logged, nothing goes to the worker.
fn quiet(
    work: impl Future<Output = Result<(), crate::host::HostError>> + Send + 'static,
) -> Pending {
    Box::pin(async move {
        if let Err(error) = work.await {
            tracing::warn!(%error, "the session refused a bridged input");
        }
        None
    })
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The next frame of the connection; `None` once it is closed or broken (or there is
/// none: then never).
async fn next_frame(socket: &mut Option<Socket>) -> Option<ClientFrame> {
    let Some(ws) = socket.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match ws.next().await? {
            Ok(Message::Text(text)) => match serde_json::from_str::<ClientFrame>(&text) {
                Ok(frame) => return Some(frame),
                Err(error) => {
                    tracing::warn!(%error, "a bridged call sent a frame that is not one; dropping the connection");
                    return None;
                }
            },
            Ok(Message::Close(_)) | Err(_) => return None,
            // Pings are answered by the WebSocket itself; binary frames mean nothing here.
            Ok(_) => continue,
        }
    }
}

/// Sends output `seq` from where it is kept, without a copy of it.
async fn send_output(
    socket: &mut Socket,
    seq: u64,
    output: &CallOutput,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    /// `ServerFrame::Output`, borrowed: the same JSON.
    #[derive(serde::Serialize)]
    struct OutputFrame<'a> {
        r#type: &'static str,
        seq: u64,
        output: &'a CallOutput,
    }
    let frame = OutputFrame {
        r#type: "output",
        seq,
        output,
    };
    // Serialising a frame of plain data cannot fail.
    let text = serde_json::to_string(&frame).unwrap_or_default();
    socket.send(Message::text(text)).await
}

/// Sends one frame.
pub(crate) async fn send(
    socket: &mut Socket,
    frame: &ServerFrame,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    // Serialising a frame of plain data cannot fail.
    let text = serde_json::to_string(frame).unwrap_or_default();
    socket.send(Message::text(text)).await
}
