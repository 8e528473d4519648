//! `RealtimeLink`: a session's connection to a realtime model, kept by one task on the
//! session's arbiter. The task owns the socket (through the provider's
//! [`RealtimeConnection`]) and the protocol state (`wire.rs`, with the conversation's
//! mirror in `mirror.rs`); the session, the agent using the model and the host's audio
//! reach it through channels, never the socket itself.
//!
//! - **Who talks to it:** the session creates it for the first agent that uses a model and
//!   keeps it across handoffs between agents of that model (one socket per model); the
//!   current agent's activity attaches (its instructions, tools, chat) and sends its
//!   steps' requests ([`LinkOp`]); the host's `AudioInput` sends audio. Each response's
//!   events go to the attached activity ([`LinkEvent`]), in order, through one channel:
//!   per audio chunk one send, no message to an actor. What the server hears of the user
//!   (speech started and stopped, a turn, a transcript) goes to the session through
//!   [`UserPort`], as a host's VAD and STT would.
//! - **Why a task and not an actor:** a socket read is an await, and the socket outlives
//!   the activities that use it (a handoff on the same socket); the task has no mailbox to
//!   count or inspect, only the two channels, and it holds a clone of the session's alive
//!   token, so `close()` returns once the socket is closed.
//! - **Reconnect and recycle:** a dropped connection is opened again (backoff, a bounded
//!   number of attempts) and set up, the attached activity is told (`Reconnected`) and
//!   replays its chat through the mirror, as text; a connection older than the model's
//!   `max_connection_age` is replaced the same way at the next quiet moment. Requests made
//!   meanwhile wait and go after the replay. After the last failed attempt every step
//!   fails at once with the error, and the session gets an error event.
//! - **Stops** once every sender of its requests is dropped (the session at its close, the
//!   activities as they stop): it closes the socket (bounded) and ends.

mod mirror;
mod wire;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use crate::chat::ChatContext;
use crate::events::SessionEvent;
use crate::ids::ActorId;
use crate::lifecycle::AliveToken;
use crate::llm::LlmError;
use crate::output::SpeechId;
use crate::realtime::{ClientEvent, RealtimeConnection, RealtimeError, RealtimeModel};
use crate::shared::SessionShared;

pub(crate) use wire::{AgentConfig, Ask, StepEvent, UserSignal};
use wire::{Out, Wire};

/// Audio pieces the host may queue ahead of the socket (2 s at the default 100 ms); past
/// it, pieces are dropped and counted.
const AUDIO_QUEUE: usize = 20;

/// Server events handled in one go before the task yields to its arbiter.
const EVENT_BATCH: usize = 64;

/// How long closing the socket may take at the end.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What the session hears from the link: the user's side of the conversation.
pub(crate) trait UserPort: Send + Sync + 'static {
    /// What the server heard; `from` names the link's task.
    fn user(&self, from: &ActorId, signal: UserSignal);
}

/// A request to the link.
#[derive(Debug)]
pub(crate) enum LinkOp {
    /// An agent takes the connection: its steps' events go to `listener`.
    Attach {
        listener: mpsc::UnboundedSender<LinkEvent>,
        config: AgentConfig,
        chat: ChatContext,
    },
    /// The agent leaves (pause or close): nothing more goes to `listener`.
    Detach {
        listener: mpsc::UnboundedSender<LinkEvent>,
    },
    /// Make the remote conversation follow the chat.
    Sync { chat: ChatContext },
    /// A step opens (see `Wire::open`).
    Open {
        ask: Ask,
        adopt: bool,
        chat: ChatContext,
    },
    /// A step ended before its response.
    Cancel { step: u64 },
    /// A speech played the model's item `item`.
    Spoke { speech: SpeechId, item: String },
    /// A speech was cut after `heard_ms`.
    Truncate { speech: SpeechId, heard_ms: u32 },
}

/// What the host's `AudioInput` sends, in order on one channel.
#[derive(Debug)]
pub(crate) enum AudioIn {
    /// A piece of the user's audio.
    Audio(Vec<u8>),
    /// The user's turn ends here (push to talk, without server turn detection).
    Commit,
}

/// What the link tells the attached activity.
#[derive(Debug)]
pub(crate) enum LinkEvent {
    /// A piece of step `step`'s answer.
    Step(u64, StepEvent),
    /// A new connection replaced the old one: replay the chat.
    Reconnected,
}

/// The session's handle on one connection (cheap to clone: two channel senders).
#[derive(Clone)]
pub(crate) struct RealtimeLink {
    model: Arc<dyn RealtimeModel>,
    ops: mpsc::UnboundedSender<LinkOp>,
    audio: mpsc::Sender<AudioIn>,
}

impl RealtimeLink {
    /// Starts the link's task on the current arbiter; it connects at once.
    pub(crate) fn spawn(
        model: Arc<dyn RealtimeModel>,
        port: Arc<dyn UserPort>,
        shared: Arc<SessionShared>,
        alive: AliveToken,
    ) -> Self {
        let (ops, ops_rx) = mpsc::unbounded_channel();
        let (audio, audio_rx) = mpsc::channel(AUDIO_QUEUE);
        let wire = Wire::new(model.settings().clone(), model.capabilities());
        let id = ActorId::realtime(shared.id(), model.name());
        let task = Task {
            model: model.clone(),
            ops: ops_rx,
            audio: audio_rx,
            wire,
            listener: None,
            port,
            shared,
            out: Vec::new(),
            held: VecDeque::new(),
            timer: Box::pin(tokio::time::sleep_until(far_future())),
            armed: None,
            dropped_audio: 0,
            id,
            _alive: alive,
        };
        actix::spawn(task.run());
        Self { model, ops, audio }
    }

    /// The model this link connects to.
    pub(crate) fn model(&self) -> &Arc<dyn RealtimeModel> {
        &self.model
    }

    /// Sends a request; a link that ended takes nothing (its steps time out).
    pub(crate) fn send(&self, op: LinkOp) {
        let _ = self.ops.send(op);
    }

    /// Where the host's audio goes.
    pub(crate) fn audio(&self) -> mpsc::Sender<AudioIn> {
        self.audio.clone()
    }

    /// Whether two handles are of one connection.
    pub(crate) fn same(&self, other: &RealtimeLink) -> bool {
        self.ops.same_channel(&other.ops)
    }
}

/// How a connection's run ended.
enum End {
    /// Every request sender is gone: close and stop.
    Stopped,
    /// The connection failed.
    Dropped(RealtimeError),
    /// It is old enough to be replaced, and nothing is under way.
    Recycle,
}

struct Task {
    model: Arc<dyn RealtimeModel>,
    ops: mpsc::UnboundedReceiver<LinkOp>,
    audio: mpsc::Receiver<AudioIn>,
    wire: Wire,
    listener: Option<mpsc::UnboundedSender<LinkEvent>>,
    port: Arc<dyn UserPort>,
    shared: Arc<SessionShared>,
    /// What the wire asked for, carried out after each input (kept between inputs: the
    /// per-chunk path allocates nothing for it).
    out: Vec<Out>,
    /// Requests that came while no connection was open, applied after the next connects.
    held: VecDeque<LinkOp>,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    dropped_audio: u64,
    /// The task's name as a sender of the session's messages.
    id: ActorId,
    _alive: AliveToken,
}

impl Task {
    async fn run(mut self) {
        let settings = self.model.settings().clone();
        let mut failures = 0u32;
        let mut reconnecting = false;
        loop {
            // Requests keep coming while the connection is opened: held until it is.
            let opened = {
                let connect = self.model.connect();
                tokio::pin!(connect);
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(done) = connect.as_mut().poll(cx) {
                        return Poll::Ready(Some(done));
                    }
                    match self.hold_ops(cx) {
                        true => Poll::Ready(None),
                        false => Poll::Pending,
                    }
                })
                .await
            };
            let mut conn = match opened {
                None => return,
                Some(Ok(conn)) => conn,
                Some(Err(err)) => {
                    failures += 1;
                    tracing::warn!(session = %self.shared.id(), model = %self.model.name(), %err, attempt = failures, "cannot connect to the realtime model");
                    if failures > settings.reconnect.attempts {
                        self.give_up(&err.to_string()).await;
                        return;
                    }
                    let wait = settings.reconnect.backoff * 2u32.saturating_pow(failures - 1);
                    if self.wait_holding(wait).await {
                        return;
                    }
                    continue;
                }
            };
            failures = 0;
            let opened_at = Instant::now();
            self.wire.connected(&mut self.out);
            self.carry_out(&mut *conn);
            if reconnecting {
                self.tell(LinkEvent::Reconnected);
            }
            while let Some(op) = self.held.pop_front() {
                self.apply(op);
                self.carry_out(&mut *conn);
            }
            let end = std::future::poll_fn(|cx| self.poll_conn(&mut *conn, opened_at, cx)).await;
            match end {
                End::Stopped => {
                    close(&mut *conn).await;
                    return;
                }
                End::Dropped(err) => {
                    tracing::warn!(session = %self.shared.id(), model = %self.model.name(), %err, "the realtime connection dropped; reconnecting");
                    self.shared.events.emit(SessionEvent::RealtimeReconnecting {
                        model: self.model.name().to_owned(),
                        reason: err.to_string(),
                    });
                }
                End::Recycle => {
                    tracing::debug!(session = %self.shared.id(), model = %self.model.name(), "replacing the realtime connection before its time limit");
                    self.shared.events.emit(SessionEvent::RealtimeReconnecting {
                        model: self.model.name().to_owned(),
                        reason: "the connection reached its age limit".to_owned(),
                    });
                    close(&mut *conn).await;
                }
            }
            self.wire.dropped(&mut self.out);
            self.carry_out_offline();
            reconnecting = true;
        }
    }

    /// One round over the connection: requests, audio, the server's events, the flush,
    /// the timer. Ends only when the connection must be left.
    fn poll_conn(
        &mut self,
        conn: &mut dyn RealtimeConnection,
        opened_at: Instant,
        cx: &mut Context<'_>,
    ) -> Poll<End> {
        loop {
            let mut progress = false;
            loop {
                match self.ops.poll_recv(cx) {
                    Poll::Ready(Some(op)) => {
                        self.apply(op);
                        self.carry_out(conn);
                        progress = true;
                    }
                    Poll::Ready(None) => return Poll::Ready(End::Stopped),
                    Poll::Pending => break,
                }
            }
            while let Poll::Ready(Some(audio)) = self.audio.poll_recv(cx) {
                conn.send(match audio {
                    AudioIn::Audio(audio) => ClientEvent::AppendAudio(audio),
                    AudioIn::Commit => ClientEvent::CommitAudio,
                });
                progress = true;
            }
            let mut batch = 0;
            let drained = loop {
                if batch == EVENT_BATCH {
                    break false;
                }
                batch += 1;
                match conn.poll_next(cx) {
                    Poll::Ready(Some(Ok(event))) => {
                        self.wire.on_event(event, Instant::now(), &mut self.out);
                        self.carry_out(conn);
                    }
                    Poll::Ready(Some(Err(err))) => return Poll::Ready(End::Dropped(err)),
                    Poll::Ready(None) => {
                        return Poll::Ready(End::Dropped(RealtimeError::Dropped {
                            message: "the server closed the connection".to_owned(),
                        }))
                    }
                    Poll::Pending => break true,
                }
            };
            if let Poll::Ready(Err(err)) = conn.poll_flush(cx) {
                return Poll::Ready(End::Dropped(err));
            }
            if !drained {
                // More events may wait in the connection's buffer, which no waker watches:
                // yield to the arbiter's other tasks and come back at once.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let old_at = opened_at + self.model.settings().max_connection_age;
            let now = Instant::now();
            if now >= old_at && self.wire.quiet() {
                return Poll::Ready(End::Recycle);
            }
            // Past its age the connection is replaced at the first quiet moment an event
            // brings; before, the timer wakes the task at that age.
            if self.poll_timer((now < old_at).then_some(old_at), cx) {
                self.wire.tick(Instant::now(), &mut self.out);
                self.carry_out(conn);
                progress = true;
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Arms the timer for the wire's deadline or `also`, whichever comes first; whether it
    /// fired.
    fn poll_timer(&mut self, also: Option<Instant>, cx: &mut Context<'_>) -> bool {
        let deadline = match (self.wire.deadline(), also) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if deadline != self.armed {
            self.armed = deadline;
            self.timer
                .as_mut()
                .reset(deadline.unwrap_or_else(far_future));
        }
        if self.armed.is_some() && self.timer.as_mut().poll(cx).is_ready() {
            self.armed = None;
            self.timer.as_mut().reset(far_future());
            return true;
        }
        false
    }

    /// Applies one request to the wire.
    fn apply(&mut self, op: LinkOp) {
        let now = Instant::now();
        match op {
            LinkOp::Attach {
                listener,
                config,
                chat,
            } => {
                self.listener = Some(listener);
                self.wire.attach(config, &chat, now, &mut self.out);
            }
            LinkOp::Detach { listener } => self.detach(&listener),
            LinkOp::Sync { chat } => self.wire.sync(&chat, now, &mut self.out),
            LinkOp::Open { ask, adopt, chat } => {
                self.wire.open(ask, adopt, &chat, now, &mut self.out)
            }
            LinkOp::Cancel { step } => self.wire.cancel(step, &mut self.out),
            LinkOp::Spoke { speech, item } => self.wire.spoke(speech, item),
            LinkOp::Truncate { speech, heard_ms } => {
                self.wire.truncate(speech, heard_ms, &mut self.out)
            }
        }
    }

    /// Forgets `listener` if it is the one attached (an agent that left after another
    /// attached detaches nobody).
    fn detach(&mut self, listener: &mpsc::UnboundedSender<LinkEvent>) {
        if self
            .listener
            .as_ref()
            .is_some_and(|l| l.same_channel(listener))
        {
            self.listener = None;
        }
    }

    /// Carries out what the wire asked for.
    fn carry_out(&mut self, conn: &mut dyn RealtimeConnection) {
        for out in self.out.drain(..) {
            match out {
                Out::Send(event) => conn.send(event),
                Out::Step(step, event) => {
                    if let Some(listener) = &self.listener {
                        if listener.send(LinkEvent::Step(step, event)).is_err() {
                            self.listener = None;
                        }
                    }
                }
                Out::User(signal) => self.port.user(&self.id, signal),
                Out::Error(message) => self.shared.events.emit(SessionEvent::Error {
                    message: format!("the realtime model refused an event: {message}"),
                }),
            }
        }
    }

    /// Carries out what the wire asked for while no connection is open: its sends are
    /// moot (the next connection is set up and replayed from scratch).
    fn carry_out_offline(&mut self) {
        let outs: Vec<Out> = self.out.drain(..).collect();
        for out in outs {
            match out {
                Out::Send(_) => {}
                Out::Step(step, event) => self.tell(LinkEvent::Step(step, event)),
                Out::User(signal) => self.port.user(&self.id, signal),
                Out::Error(message) => self.shared.events.emit(SessionEvent::Error { message }),
            }
        }
    }

    fn tell(&mut self, event: LinkEvent) {
        if let Some(listener) = &self.listener {
            if listener.send(event).is_err() {
                self.listener = None;
            }
        }
    }

    /// While no connection is open: requests are held (attaches and detaches take effect
    /// at once, so step events of the settled steps reach the right activity), audio
    /// waits in its queue. Whether every request sender is gone.
    fn hold_ops(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            match self.ops.poll_recv(cx) {
                Poll::Ready(Some(op)) => {
                    match &op {
                        LinkOp::Attach { listener, .. } => self.listener = Some(listener.clone()),
                        LinkOp::Detach { listener }
                            if self
                                .listener
                                .as_ref()
                                .is_some_and(|l| l.same_channel(listener)) =>
                        {
                            self.listener = None;
                        }
                        _ => {}
                    }
                    self.held.push_back(op);
                }
                Poll::Ready(None) => return true,
                Poll::Pending => return false,
            }
        }
    }

    /// Waits `wait` holding requests; whether every request sender is gone.
    async fn wait_holding(&mut self, wait: Duration) -> bool {
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        std::future::poll_fn(|cx| {
            if self.hold_ops(cx) {
                return Poll::Ready(true);
            }
            sleep.as_mut().poll(cx).map(|()| false)
        })
        .await
    }

    /// No connection can be opened: every step fails with the error, now and later, until
    /// the link is dropped.
    async fn give_up(&mut self, error: &str) {
        let message = format!("the realtime model {} is gone: {error}", self.model.name());
        tracing::error!(session = %self.shared.id(), "{message}");
        self.shared.events.emit(SessionEvent::Error {
            message: message.clone(),
        });
        let fail = |step| {
            LinkEvent::Step(
                step,
                StepEvent::Done {
                    usage: None,
                    failure: Some(LlmError::Connect {
                        message: message.clone(),
                    }),
                },
            )
        };
        let held: Vec<LinkOp> = self.held.drain(..).collect();
        let failed_now: Vec<u64> = self.wire.settle_all();
        for step in failed_now {
            self.tell(fail(step));
        }
        for op in held {
            self.fail_op(op, &fail);
        }
        while let Some(op) = self.ops.recv().await {
            self.fail_op(op, &fail);
        }
    }

    fn fail_op(&mut self, op: LinkOp, fail: &impl Fn(u64) -> LinkEvent) {
        match op {
            LinkOp::Attach { listener, .. } => self.listener = Some(listener),
            LinkOp::Detach { listener } => self.detach(&listener),
            LinkOp::Open { ask, .. } => self.tell(fail(ask.step)),
            _ => {}
        }
        while let Ok(_audio) = self.audio.try_recv() {
            self.dropped_audio += 1;
        }
        if self.dropped_audio > 0 && self.dropped_audio % 500 == 1 {
            tracing::debug!(session = %self.shared.id(), pieces = self.dropped_audio, "audio dropped: the realtime model is gone");
        }
    }
}

/// Closes a connection, within a bound.
async fn close(conn: &mut dyn RealtimeConnection) {
    let closing = std::future::poll_fn(|cx| {
        let _ = conn.poll_flush(cx);
        conn.poll_close(cx)
    });
    let _ = tokio::time::timeout(CLOSE_WAIT, closing).await;
}

/// A deadline that never comes (an unarmed timer).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}
