//! `Session`: the host's handle on one conversation, and its builder.
//!
//! A thin `Send + Clone` wrapper over the session actor's counted address: each method
//! is one message and one reply, so a host on another thread crosses into the engine once
//! per operation, never per event or per chunk (events come through a channel).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{broadcast, watch};

use std::collections::HashMap;
use std::future::Future;

use serde_json::Value;

use crate::activity::TurnKind;
use crate::activity::{
    InterruptTurn, ReadChat, UserStartedSpeaking, UserStoppedSpeaking, UserTranscript,
};
use crate::agent::Agent;
use crate::audio_input::AudioInput;
use crate::chat::ChatContext;
use crate::error::{BuildError, SessionError};
use crate::error_policy::ErrorPolicy;
use crate::events::{AgentState, UserState};
use crate::events::{RunResult, SessionEvent};
use crate::handoff::Handoff;
use crate::history::SessionHistory;
use crate::host_input::{HostInput, InputAnswer};
use crate::ids::{ActorId, SessionId};
use crate::input_ledger::{InputId, RecordedAnswer};
use crate::inspector::Inspector;
use crate::latency::SessionLatency;
use crate::lifecycle::alive_pair;
use crate::llm::{Llm, LlmTimeouts};
use crate::mailbox::{Journal, Mailbox, Probe};
use crate::output::{NullOutput, SpeechOutput};
use crate::prompts::Prompts;
use crate::realtime::RealtimeModel;
use crate::reentry;
use crate::registry::{DrainPort, LiveSession};
use crate::restore::AgentRegistry;
use crate::run_context::RunContext;
use crate::runtime::{Engine, SessionSummary};
use crate::session::{
    ApplyInput, CancelTurn, CloseSession, InputsHandled, Read, ReadAgent, ReadHistory, RestorePlan,
    RunTask, RunTurn, Say, SessionActor, SnapshotUpdate, Start, StartSession, TakeSnapshot,
    UpdateAgent,
};
use crate::shared::{
    userdata_json, SessionConfig, SessionSettings, SessionShared, SessionTools, SharedParts,
    UserdataJson,
};
use crate::snapshot::{SessionSnapshot, SnapshotError, StoreError};
use crate::snapshot_store::{Claim, ClaimRule, SnapshotStore};
use crate::speech::{SayOptions, SpeechHandle};
use crate::telemetry::Cause;
use crate::tool::{mock_body, MockBody, ToolFailure, ToolReturn, Toolset};
use crate::turn_handling::{Endpointing, TurnHandling};
use crate::usage::SessionUsage;

/// A running session: the host's handle on one conversation. Cheap to clone; every clone
/// talks to the same session actor.
///
/// The host's handles (`Session` and [`SessionAddress`]) are what keeps a session alive:
/// when the last one is dropped without `close()`, the session closes itself exactly as
/// `close()` would, so no actor of it stays behind. Engine code (tools, hooks) never holds
/// one; they get a [`SessionControl`](crate::SessionControl) instead.
///
/// A closed session releases its agents and their tools, so a tool that keeps a
/// `Session` of its own session does not keep it in memory after `close()`. The session's
/// user data, its LLM and its session toolsets live as long as a handle does: one of them
/// holding a `Session` is a cycle that is never freed, so give them a [`WeakSession`].
#[derive(Clone)]
pub struct Session {
    host: Arc<Host>,
}

/// The host's end of a session; dropping the last one closes it.
struct Host {
    mailbox: Mailbox<SessionActor>,
    shared: Arc<SessionShared>,
    /// The engine the session runs on: its threads live as long as a session does, even
    /// if the host dropped its own `Engine`.
    _engine: Engine,
}

impl Drop for Host {
    fn drop(&mut self) {
        // One per session: bounded. A session already closed ignores it.
        self.mailbox.tell(&ActorId::host(), CloseSession);
    }
}

/// What the engine's drain asks of a session: the host end is what may interrupt and close
/// it. The registry holds it weakly, so it keeps no session alive.
impl DrainPort for Host {
    fn force_interrupt(&self) -> futures_util::future::BoxFuture<'static, ()> {
        let ask = self
            .mailbox
            .ask(&ActorId::host(), InterruptTurn { force: true });
        Box::pin(async move {
            // Forced: never `Uninterruptible`; an error means the session is gone already.
            let _ = ask.await;
        })
    }

    fn close(&self) {
        // One per drained session: bounded. A session already closed ignores it.
        self.mailbox.tell(&ActorId::host(), CloseSession);
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", self.host.shared.id())
            .finish()
    }
}

/// Interrupts (or unqueues) a host's turn whose `run` future was dropped before its
/// answer came.
struct CancelOnDrop<'a> {
    mailbox: &'a Mailbox<SessionActor>,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            // One per dropped future: bounded.
            self.mailbox
                .tell(&ActorId::host(), CancelTurn { id: self.id });
        }
    }
}

impl Session {
    /// Starts configuring a session.
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }

    /// The session's id: the one given to [`SessionBuilder::id`], else `s1`, `s2`, ….
    pub fn id(&self) -> &SessionId {
        self.host.shared.id()
    }

    /// What the session is doing now: its state (active, inactive, closing, closed), the
    /// current agent, the turns it ran, its age, its running tools, live actors and queued
    /// messages. Read without a message to the session, so it answers at once, also when
    /// the session is busy or stuck. [`Engine::sessions`] lists it for every live session.
    pub fn summary(&self) -> SessionSummary {
        SessionSummary::of(self.shared())
    }

    /// A weak handle on the session: it upgrades to a [`Session`] while the session
    /// lives, and never keeps it alive. When the host's last strong handle (`Session`,
    /// [`SessionAddress`]) is dropped, the session closes as it always does, whatever weak
    /// handles remain; they upgrade to `None` from then on.
    ///
    /// For a host part that must not keep a call alive: a TTS or playout task, a
    /// watchdog, a metrics loop. A tool or hook needs none (it has its `SessionControl`).
    ///
    /// A strong handle kept inside the session itself makes a cycle: a `Session` (or
    /// [`SessionAddress`]) in the session's own user data, in a tool's or hook's closure,
    /// or in the output given to its builder keeps the session alive after the host drops
    /// every handle of its own, so it never closes by itself, and its actors and memory
    /// stay until someone calls `close()`. Keep a `WeakSession` there instead.
    ///
    /// ```no_run
    /// # fn demo(session: switchboard::Session) {
    /// use std::time::Duration;
    /// use switchboard::UserState;
    ///
    /// // A watchdog that nudges a silent caller, and ends with the call: it holds only a
    /// // weak handle, so hanging up (dropping the last `Session`) closes the session.
    /// let weak = session.downgrade();
    /// tokio::spawn(async move {
    ///     let mut every = tokio::time::interval(Duration::from_secs(10));
    ///     loop {
    ///         every.tick().await;
    ///         // Strong only for this one check; `None` once the call is over.
    ///         let Some(session) = weak.upgrade() else { break };
    ///         if session.user_state() == UserState::Away {
    ///             let _ = session.say("Are you still there?").await;
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn downgrade(&self) -> WeakSession {
        WeakSession {
            host: Arc::downgrade(&self.host),
            id: self.id().clone(),
        }
    }

    fn shared(&self) -> &SessionShared {
        &self.host.shared
    }

    /// Fails at once when called from inside a tool or hook of this session, where
    /// awaiting would wait on the turn the caller runs in.
    fn check_reentry(&self, operation: &'static str) -> Result<(), SessionError> {
        if reentry::is_inside(self.id()) {
            return Err(SessionError::WouldDeadlock {
                operation: operation.into(),
            });
        }
        Ok(())
    }

    async fn turn(
        &self,
        kind: TurnKind,
        operation: &'static str,
    ) -> Result<RunResult, SessionError> {
        self.check_reentry(operation)?;
        let id = self.shared().ids.next_turn();
        let mut guard = CancelOnDrop {
            mailbox: &self.host.mailbox,
            id,
            armed: true,
        };
        let answer = self
            .host
            .mailbox
            .ask(
                &ActorId::host(),
                RunTurn {
                    id,
                    kind,
                    cause: Cause::here(),
                    input: None,
                },
            )
            .await;
        guard.armed = false;
        answer.unwrap_or(Err(SessionError::Closed))
    }

    /// Runs one user turn and returns what it produced, after any handoff it caused.
    ///
    /// Turns run one at a time, in the order they were asked for. Dropping the returned
    /// future before it resolves cancels the turn: it leaves the queue, or is interrupted
    /// if it runs (as [`Session::interrupt`] would).
    pub async fn run(&self, user_input: impl Into<String>) -> Result<RunResult, SessionError> {
        self.turn(TurnKind::User(user_input.into()), "run").await
    }

    /// Asks the current agent for a reply (no user message), with optional instructions.
    /// Queued and cancelled like [`Session::run`].
    pub async fn generate_reply(
        &self,
        instructions: Option<String>,
    ) -> Result<RunResult, SessionError> {
        self.turn(TurnKind::Reply(instructions), "generate_reply")
            .await
    }

    /// Hands the conversation to `agent` after the current turn; resolves once its
    /// `on_enter` has run. An agent that cannot start here (a tool-name clash, no LLM) is
    /// refused at once with [`SessionError::Build`], and the current agent stays.
    pub async fn update_agent(&self, agent: Agent) -> Result<(), SessionError> {
        self.address().send(Handoff::to(agent)).await
    }

    /// Runs a sub-task agent until a tool of it returns `ToolReturn::CompleteTask`,
    /// pausing the current agent meanwhile; returns the typed result.
    pub async fn run_task<T: DeserializeOwned>(&self, agent: Agent) -> Result<T, SessionError> {
        self.check_reentry("run_task")?;
        let value = self
            .host
            .mailbox
            .ask(&ActorId::host(), RunTask { agent, asker: None })
            .await
            .unwrap_or(Err(SessionError::Closed))?;
        serde_json::from_value(value).map_err(SessionError::TaskResult)
    }

    /// Stops the current turn now: its LLM stream is dropped, its speech cut on the
    /// output, no further step runs, and every call of it gets its output (a tool that
    /// cancels on interruption is cancelled, any other moves to the background and its
    /// result comes later). The interrupted turn's `run` returns `Ok` with `interrupted`
    /// set; queued work goes on. Resolves once the turn has ended (at once when none
    /// runs). [`SessionError::Uninterruptible`] when the turn's speech does not allow
    /// interruptions: see [`Session::force_interrupt`].
    pub async fn interrupt(&self) -> Result<(), SessionError> {
        self.interrupt_with(false).await
    }

    /// [`Session::interrupt`], even when the speech does not allow interruptions.
    pub async fn force_interrupt(&self) -> Result<(), SessionError> {
        self.interrupt_with(true).await
    }

    async fn interrupt_with(&self, force: bool) -> Result<(), SessionError> {
        self.host
            .mailbox
            .ask(&ActorId::host(), InterruptTurn { force })
            .await
            .map_err(|_| SessionError::Closed)?
    }

    /// Queues `text` for the agent to say as it is (no LLM request), after what is queued
    /// with the same priority; it goes into the chat context as an assistant message.
    /// Returns its handle once queued: await `wait_for_playout` to know it was heard.
    pub async fn say(&self, text: impl Into<String>) -> Result<SpeechHandle, SessionError> {
        self.say_with(text, SayOptions::new()).await
    }

    /// [`Session::say`] with options: whether it may be interrupted, whether it goes into
    /// the chat context, its priority.
    pub async fn say_with(
        &self,
        text: impl Into<String>,
        options: SayOptions,
    ) -> Result<SpeechHandle, SessionError> {
        self.host
            .mailbox
            .ask(
                &ActorId::host(),
                Say {
                    text: text.into(),
                    options,
                    cause: Cause::here(),
                    input: None,
                },
            )
            .await
            .unwrap_or(Err(SessionError::Closed))
    }

    /// Host input: the user started speaking (from the host's VAD). Deferred replies wait
    /// while the user speaks; over an interruptible speech this starts a barge-in (the
    /// output pauses if it can; see [`SessionBuilder::min_interruption_duration`]).
    pub fn user_started_speaking(&self) {
        // One message per input event, at the host's rate.
        self.host
            .mailbox
            .tell(&ActorId::host(), UserStartedSpeaking);
    }

    /// Host input: the user stopped speaking.
    pub fn user_stopped_speaking(&self) {
        self.host
            .mailbox
            .tell(&ActorId::host(), UserStoppedSpeaking);
    }

    /// Host input: what the user said (from the host's STT). An interim transcript
    /// (`is_final == false`) is an event, and words that make a barge-in under way real; a
    /// final one is a user turn, which interrupts the running turn if it allows it (or
    /// runs right after it).
    pub fn transcript(&self, text: impl Into<String>, is_final: bool) {
        self.host.mailbox.tell(
            &ActorId::host(),
            UserTranscript {
                text: text.into(),
                is_final,
                cause: Cause::here(),
                interrupts: false,
            },
        );
    }

    /// Where the host pushes the user's microphone audio for an agent that talks through a
    /// realtime model: the model hears it, detects the user's turns (its server's VAD), and
    /// its audio comes back through the output's
    /// [`speech_audio`](crate::SpeechOutput::speech_audio). Cheap per push: no message per
    /// frame. See [`AudioInput`].
    pub fn audio_input(&self) -> AudioInput {
        AudioInput::new(self.host.shared.clone())
    }

    /// What the agent is doing now.
    pub fn agent_state(&self) -> AgentState {
        self.shared().host_view.agent_state()
    }

    /// What the user is doing now, as the host's input says.
    pub fn user_state(&self) -> UserState {
        self.shared().host_view.user_state()
    }

    /// The session's usage ledger: every LLM request's tokens so far, by agent and model,
    /// across handoffs and sub-tasks (and restores: a snapshot carries it). Price it with
    /// [`SessionUsage::cost`]. Read without a message: a request's usage is in once its
    /// stream ended.
    pub fn usage(&self) -> SessionUsage {
        self.shared().metrics.usage()
    }

    /// Each agent's latency so far (end of the user's speech to the first text out, time
    /// to first token, tool time), by agent name, across handoffs and sub-tasks. A turn's
    /// own is in its `RunResult` and its `TurnMetrics` event.
    pub fn latency(&self) -> SessionLatency {
        self.shared().metrics.latency()
    }

    /// Closes the session: waits for no queued work, cancels tool runs (with their grace
    /// period), writes their terminal outputs, and stops every actor of the session.
    /// Resolves once all are gone — also when called several times at once — with the
    /// final chat context of every agent the session ran (its transcript).
    ///
    /// Bounded whatever the host's code does: the session's tool bodies, then each agent's
    /// `on_exit` hook and its own tool bodies, then the snapshot store
    /// ([`SessionBuilder::save_snapshots`]) get the grace period each
    /// ([`SessionBuilder::grace_period`], 2 s by default), so a close returns within four
    /// grace periods plus the engine's own work. What had not finished by then (a tool body
    /// deaf to cancellation, a hook awaiting a backend that never answers, a store that
    /// stopped answering) is dropped and reported as a
    /// [`SessionEvent::Unfinished`](crate::SessionEvent::Unfinished) event. A speech the
    /// output still plays and a model still streaming are cut at once.
    pub async fn close(&self) -> Result<SessionHistory, SessionError> {
        // Answered at once; an error means the session is gone already.
        let _ = self.host.mailbox.ask(&ActorId::host(), CloseSession).await;
        self.shared().gone.clone().wait().await;
        // Every activity recorded its final chat context as it stopped.
        Ok(self.shared().history.read(Vec::new()))
    }

    /// The conversation so far, across agents: the final chat context of every agent
    /// activation that ended and the current context of those still running (the current
    /// agent, callers paused under a sub-task, an agent a handoff is closing), in the
    /// order they started. Answers during a switch too; after close, the transcript.
    pub async fn history(&self) -> SessionHistory {
        match self.host.mailbox.ask(&ActorId::host(), ReadHistory).await {
            Ok(history) => history,
            // The session is gone: every activity is in the book.
            Err(_) => self.shared().history.read(Vec::new()),
        }
    }

    /// Resolves when the session is inactive: no speech is queued, generating or playing
    /// (the current agent runs no turn and none is queued, no user words wait for the end
    /// of their turn), no handoff is under way, no deferred reply is pending, and the user
    /// is not speaking; every input sent before the call counts. (Tools may still run in
    /// the background: see [`Session::wait_for_settled`].) A host call: a background tool
    /// of this session may await it once its turn has ended, but awaited from a tool of the
    /// turn in progress or from a hook, it waits on that turn or handoff and never resolves.
    pub async fn wait_for_inactive(&self) {
        self.inputs_handled().await;
        let mut rx = self.shared().host_view.inactive.subscribe();
        let _ = rx.wait_for(|inactive| *inactive).await;
    }

    /// Resolves once the session has handled every input this host sent before (a
    /// transcript, speaking or not are told, not awaited): what the waits above see then
    /// includes them. A closed session has nothing left to handle.
    async fn inputs_handled(&self) {
        let _ = self.host.mailbox.ask(&ActorId::host(), InputsHandled).await;
    }

    /// Resolves when the session has settled: no tool call is running anywhere in it
    /// (calls of call-long tools aside: see `Tool::call_long`) and the session is
    /// inactive (every deferred reply has run). What a test awaits after
    /// letting background tools finish. A host call: from inside a tool or hook of this
    /// same session it would wait on its own run, so it fails at once with
    /// [`SessionError::WouldDeadlock`].
    pub async fn wait_for_settled(&self) -> Result<(), SessionError> {
        self.check_reentry("wait_for_settled")?;
        self.inputs_handled().await;
        let shared = self.shared();
        loop {
            // Created before the check: a settle in between is not missed.
            let settled = shared.host_view.settled();
            if shared.host_view.is_settled() {
                return Ok(());
            }
            settled.await;
        }
    }

    /// Whether the session is inactive now.
    pub fn is_inactive(&self) -> bool {
        *self.shared().host_view.inactive.borrow()
    }

    /// A watch of the session's inactivity, for hosts that select over it.
    pub fn inactivity(&self) -> watch::Receiver<bool> {
        self.shared().host_view.inactive.subscribe()
    }

    /// Subscribes to the session's events (from now on).
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.shared().events.subscribe()
    }

    /// Reads the current agent; during a handoff or sub-task switch, waits for it to end.
    async fn read_current<M, T>(&self, read: impl Fn() -> M) -> Result<T, SessionError>
    where
        M: actix::Message<Result = Read<T>> + Send + 'static,
        T: Send + 'static,
        SessionActor: actix::Handler<crate::mailbox::Counted<M>>,
    {
        loop {
            // Created before asking: a switch that ends in between still wakes it.
            let switched = self.shared().host_view.switched.notified();
            match self.host.mailbox.ask(&ActorId::host(), read()).await {
                Ok(Read::Now(value)) => return Ok(value),
                Ok(Read::AfterSwitch) => switched.await,
                Ok(Read::Closed) | Err(_) => return Err(SessionError::Closed),
            }
        }
    }

    /// A copy of the current agent's chat context (after the switch under way, if any).
    pub async fn chat_context(&self) -> Result<ChatContext, SessionError> {
        self.read_current(|| ReadChat).await
    }

    /// The current agent's name (after the switch under way, if any).
    pub async fn current_agent(&self) -> Result<String, SessionError> {
        self.read_current(|| ReadAgent).await
    }

    /// The session actor's address, for sending it messages (`Handoff`). Like a
    /// `Session`, it is a host handle: it keeps the session alive.
    pub fn address(&self) -> SessionAddress {
        SessionAddress {
            host: self.host.clone(),
        }
    }

    /// The mailbox inspector, when the session was built with `.inspect(true)`. It does
    /// not keep the session alive.
    pub fn inspector(&self) -> Option<Inspector> {
        self.shared()
            .journal
            .records()
            .map(|records| Inspector::new(records.clone(), self.shared().id().clone()))
    }

    /// The session's user data, if it is a `T`.
    pub fn userdata<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.shared().settings.userdata.clone()?.downcast().ok()
    }

    /// The whole session written down at its last consistent point: restore it
    /// with [`SessionBuilder::restore`]. During a handoff or a sub-task's start or end it
    /// answers once the switch has ended; new work waits while it is collected (a few
    /// messages, not a turn). Starts a new chain: the next
    /// [`snapshot_update`](Self::snapshot_update) is a delta on this one.
    pub async fn snapshot(&self) -> Result<SessionSnapshot, SessionError> {
        self.check_reentry("snapshot")?;
        match self.take_snapshot(true).await? {
            SnapshotUpdate::Full(snapshot) => Ok(snapshot),
            // Asked in full, answered in full: a delta here is a bug in the chain.
            SnapshotUpdate::Delta(_) => Err(SnapshotError::OutOfOrder {
                reason: "a full snapshot was asked and a delta came".to_owned(),
            }
            .into()),
        }
    }

    /// What changed since the last snapshot or update taken from this session: a
    /// [`SnapshotDelta`](crate::SnapshotDelta) to [`apply`](SessionSnapshot::apply) to it,
    /// or a full snapshot when none was taken yet. Its size follows what changed, not the
    /// length of the conversation.
    pub async fn snapshot_update(&self) -> Result<SnapshotUpdate, SessionError> {
        self.check_reentry("snapshot_update")?;
        self.take_snapshot(false).await
    }

    /// Writes the session to the store it saves to
    /// ([`save_snapshots`](SessionBuilder::save_snapshots),
    /// [`save_claimed`](SessionBuilder::save_claimed),
    /// [`restore_from`](SessionBuilder::restore_from)) now: a full snapshot at its last
    /// consistent point, taken as [`snapshot`](Self::snapshot) takes one, written by the
    /// session's own saving after the saves queued before it, under its claim. Resolves
    /// with the snapshot once it is written. What a host does on SIGTERM before it exits
    /// (the session also saves after every settled turn: this adds what changed since,
    /// such as a tool's checkpoint). [`SessionError::Store`] when the store refused the
    /// write ([`StoreError::Fenced`]: another process claimed the session since) or failed
    /// it, or when the session saves to no store.
    pub async fn save(&self) -> Result<SessionSnapshot, SessionError> {
        self.check_reentry("save")?;
        let taken = self
            .host
            .mailbox
            .ask(
                &ActorId::host(),
                TakeSnapshot {
                    full: true,
                    save: true,
                },
            )
            .await
            .unwrap_or(Err(SessionError::Closed))?;
        match taken {
            SnapshotUpdate::Full(snapshot) => Ok(snapshot),
            // Asked in full, answered in full: a delta here is a bug in the chain.
            SnapshotUpdate::Delta(_) => Err(SnapshotError::OutOfOrder {
                reason: "a full snapshot was asked and a delta came".to_owned(),
            }
            .into()),
        }
    }

    async fn take_snapshot(&self, full: bool) -> Result<SnapshotUpdate, SessionError> {
        self.host
            .mailbox
            .ask(&ActorId::host(), TakeSnapshot { full, save: false })
            .await
            .unwrap_or(Err(SessionError::Closed))
    }

    /// Applies a host input with its id, exactly once across restores: what the
    /// `Session` method of the input's name does, with the id tied to it in one call.
    ///
    /// The session keeps a ledger of the ids it applied with what each answered, and its
    /// snapshots write the ledger with what the inputs changed. An id applied before — by
    /// this session, or by the one whose snapshot it was restored from — is answered from
    /// the ledger ([`InputAnswer::AppliedEarlier`]) and nothing is applied, whatever the
    /// input: a turn, a transcript, a read. A host that resends its inputs after a restore
    /// (all of them, or those after [`SessionSnapshot::last_input`]) so gets each applied
    /// once. An input whose job was still queued when the snapshot was taken (a `run`, a
    /// `say`) is not in it, and is applied when it comes again. The ledger keeps the last
    /// 16 ids with their answers; an id older than those counts as applied, its answer
    /// [`RecordedAnswer::Unknown`](crate::RecordedAnswer::Unknown).
    ///
    /// The answer: a turn's result once it ended ([`InputAnswer::Turn`]), a speech's handle
    /// once queued, the history, or `Done` once applied; refusals and failures as the
    /// method's. The input reaches the session on the future's first poll, so inputs
    /// applied one after another are applied in that order even when their answers take a
    /// whole turn. Await it: a future dropped before the session took the input applies
    /// nothing (its id stays free), and dropping the future of a turn once it is queued
    /// cancels the turn, as for [`run`](Self::run). The plain methods stay for hosts that
    /// need no ids.
    pub async fn apply(&self, id: InputId, input: HostInput) -> Result<InputAnswer, SessionError> {
        self.check_reentry("apply")?;
        let ticket = self.shared().ids.next_turn();
        let mut guard = CancelOnDrop {
            mailbox: &self.host.mailbox,
            id: ticket,
            armed: input.is_turn(),
        };
        let answer = self
            .host
            .mailbox
            .ask(
                &ActorId::host(),
                ApplyInput {
                    id: id.get(),
                    input,
                    ticket,
                    cause: Cause::here(),
                },
            )
            .await;
        guard.armed = false;
        answer.unwrap_or(Err(SessionError::Closed))
    }

    /// Whether input `id` was applied (by [`apply`](Self::apply), here or before the
    /// snapshot this session was restored from), with what it answered as the ledger keeps
    /// it; `None` when it was not.
    pub fn applied(&self, id: InputId) -> Option<RecordedAnswer> {
        self.shared().host_view.inputs().answer(id.get())
    }

    /// The id up to which every input applied with [`apply`](Self::apply) is in the
    /// session (ids count in the order they were applied; a `run` or `say` still queued
    /// holds back those after it), or read from the snapshot this session was restored
    /// from: what a snapshot taken now would hold
    /// ([`SessionSnapshot::last_input`]).
    pub fn last_input(&self) -> Option<u64> {
        self.shared().host_view.last_input()
    }

    /// The session's epoch. A session that saves to a store has the epoch its claim got
    /// from the store (one more than any claim of the session before). Without a store:
    /// 0 for a session never restored, one more than its snapshot's for a restored one.
    /// A host that finds a snapshot with a newer epoch than its own knows another process
    /// took the session over.
    pub fn epoch(&self) -> u64 {
        self.shared().settings.epoch
    }
}

/// A weak host handle on a session, from [`Session::downgrade`]: upgrades to a [`Session`]
/// while the session lives and never keeps it alive. `Send + Sync`, cheap to clone.
///
/// The way to hold a session from anything the session itself holds: its user data, a
/// tool's or hook's closure, its speech output. A strong `Session` there is a cycle that
/// keeps the session alive after the host dropped its own handles (it then never closes
/// by itself); a `WeakSession` upgrades while the call lives and lets it end.
#[derive(Clone)]
pub struct WeakSession {
    host: Weak<Host>,
    id: SessionId,
}

impl WeakSession {
    /// The session, while any strong handle of it (`Session`, [`SessionAddress`]) is
    /// held; `None` once every one was dropped (the session then closes, or has closed).
    /// A session closed with `close()` while the host still holds a handle upgrades: its
    /// calls answer [`SessionError::Closed`].
    pub fn upgrade(&self) -> Option<Session> {
        self.host.upgrade().map(|host| Session { host })
    }

    /// The session's id, also once it is gone (for logs).
    pub fn id(&self) -> &SessionId {
        &self.id
    }
}

impl fmt::Debug for WeakSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakSession")
            .field("id", &self.id)
            .field("alive", &(self.host.strong_count() > 0))
            .finish()
    }
}

/// The session actor's address as users see it: counted like every engine send, and
/// limited to the messages users may send. A host handle: it keeps the session alive.
#[derive(Clone)]
pub struct SessionAddress {
    host: Arc<Host>,
}

impl fmt::Debug for SessionAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionAddress({})", self.host.mailbox.id())
    }
}

impl SessionAddress {
    /// Sends a `Handoff` and waits for it to complete: after the current turn, or at once
    /// (interrupting it) for [`Handoff::interrupting`]. Refused at once with
    /// [`SessionError::Build`] when the agent cannot start here.
    pub async fn send(&self, handoff: Handoff) -> Result<(), SessionError> {
        if reentry::is_inside(self.host.shared.id()) {
            return Err(SessionError::WouldDeadlock {
                operation: "update_agent".into(),
            });
        }
        self.host
            .mailbox
            .ask(
                &ActorId::host(),
                UpdateAgent {
                    handoff,
                    cause: Cause::here(),
                },
            )
            .await
            .unwrap_or(Err(SessionError::Closed))
    }

    /// The session actor's id.
    pub fn id(&self) -> &ActorId {
        self.host.mailbox.id()
    }
}

/// Configures and starts a [`Session`].
pub struct SessionBuilder {
    llm: Option<Arc<dyn Llm>>,
    realtime: Option<Arc<dyn RealtimeModel>>,
    agent: Option<Agent>,
    toolsets: Vec<Toolset>,
    output: Box<dyn SpeechOutput>,
    userdata: Option<Arc<dyn Any + Send + Sync>>,
    max_tool_steps: u32,
    grace_period: Duration,
    record_timeout: Duration,
    inherit_chat_context: bool,
    llm_timeouts: LlmTimeouts,
    max_calls_per_step: usize,
    max_argument_bytes: usize,
    max_reply_bytes: usize,
    max_agent_work: u32,
    allow_interruptions: bool,
    user_away_timeout: Option<Duration>,
    turn_handling: TurnHandling,
    trace_content: bool,
    max_blocking_jobs: usize,
    inspect: bool,
    journal_capacity: usize,
    event_capacity: usize,
    error_policy: ErrorPolicy,
    prompts: Prompts,
    mocks: HashMap<String, MockBody>,
    userdata_json: Option<UserdataJson>,
    restore: Restoring,
    saving: Saving,
    /// The host's id for the session, if it chose one.
    id: Option<String>,
    /// The event channel, when someone subscribed before the start.
    events: Option<broadcast::Sender<SessionEvent>>,
}

impl Default for SessionBuilder {
    fn default() -> Self {
        Self {
            llm: None,
            realtime: None,
            agent: None,
            toolsets: Vec::new(),
            output: Box::new(NullOutput),
            userdata: None,
            max_tool_steps: 3,
            grace_period: Duration::from_secs(2),
            record_timeout: Self::DEFAULT_RECORD_TIMEOUT,
            inherit_chat_context: false,
            llm_timeouts: LlmTimeouts::default(),
            max_calls_per_step: 32,
            max_argument_bytes: 64 * 1024,
            max_reply_bytes: 64 * 1024,
            max_agent_work: 8,
            allow_interruptions: true,
            user_away_timeout: Some(Duration::from_secs(15)),
            turn_handling: TurnHandling::new(),
            trace_content: false,
            max_blocking_jobs: Self::DEFAULT_MAX_BLOCKING_JOBS,
            inspect: false,
            journal_capacity: 1024,
            event_capacity: 1024,
            error_policy: ErrorPolicy::new(),
            prompts: Prompts::new(),
            mocks: HashMap::new(),
            userdata_json: None,
            restore: Restoring::Nothing,
            saving: Saving::Nothing,
            id: None,
            events: None,
        }
    }
}

impl fmt::Debug for SessionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBuilder")
            .field("agent", &self.agent)
            .field("toolsets", &self.toolsets)
            .finish_non_exhaustive()
    }
}

impl SessionBuilder {
    /// How many blocking jobs of a session may be on the blocking pool at once unless
    /// [`max_blocking_jobs`](Self::max_blocking_jobs) says otherwise: a tool that parses
    /// a few documents in parallel runs them side by side, and a session that floods the
    /// pool takes no more than four of its threads.
    pub const DEFAULT_MAX_BLOCKING_JOBS: usize = 4;

    /// How long the body of an `Abandon` tool's call waits for the session's store to
    /// hold the call unless [`record_timeout`](Self::record_timeout) says otherwise: a
    /// store that answers at all answers within it (a local file or an in-memory store in
    /// microseconds, a JetStream write in milliseconds).
    pub const DEFAULT_RECORD_TIMEOUT: Duration = Duration::from_secs(5);

    /// The model agents use unless they set their own.
    pub fn llm(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// The realtime speech-to-speech model agents use unless they set their own model;
    /// it wins over the session's [`llm`](Self::llm). The host's microphone audio goes in
    /// through [`Session::audio_input`], the model's audio comes out through the output's
    /// [`SpeechOutput::speech_audio`].
    pub fn realtime(mut self, model: Arc<dyn RealtimeModel>) -> Self {
        self.realtime = Some(model);
        self
    }

    /// The first agent.
    pub fn agent(mut self, agent: Agent) -> Self {
        self.agent = Some(agent);
        self
    }

    /// Adds a session-scoped toolset: its runs survive handoffs and deliver to the agent
    /// current at delivery time.
    pub fn toolset(mut self, toolset: Toolset) -> Self {
        self.toolsets.push(toolset);
        self
    }

    /// Where speech goes (default: dropped; read turns from `RunResult` and events). The
    /// session hands it a [`PlayoutReporter`](crate::PlayoutReporter) when it starts.
    pub fn output(mut self, output: impl SpeechOutput) -> Self {
        self.output = Box::new(output);
        self
    }

    /// Data tools and hooks can read (`ctx.userdata::<T>()`). A snapshot does not hold
    /// it (it may be a connection, a handle): a restored session gets it again from its
    /// builder. For data that should travel with the snapshot, use
    /// [`userdata_serde`](Self::userdata_serde).
    ///
    /// The session keeps its user data as long as it lives: a [`Session`] (or
    /// [`SessionAddress`]) of this very session in it is a cycle that keeps the session
    /// alive after the host drops its own handles. Put a [`WeakSession`] there instead
    /// ([`Session::downgrade`]).
    pub fn userdata<T: Any + Send + Sync>(mut self, data: T) -> Self {
        self.userdata = Some(Arc::new(data));
        self.userdata_json = None;
        self
    }

    /// Data tools and hooks can read, as [`userdata`](Self::userdata), that snapshots also
    /// write down as JSON: a restore reads it back as the type its
    /// [`AgentRegistry::userdata`] names.
    pub fn userdata_serde<T: Serialize + DeserializeOwned + Any + Send + Sync>(
        mut self,
        data: T,
    ) -> Self {
        self.userdata = Some(Arc::new(data));
        self.userdata_json = Some(userdata_json::<T>());
        self
    }

    /// Saves the session to `store` after every turn that settles: a delta of
    /// what changed, and a full snapshot when the store has nothing to apply it to or
    /// once the deltas since the last full one carry as many items as it held (so loading
    /// reads at most about twice the conversation and a save costs the same per turn at
    /// any length). A failed save is an `Error` event; the next one writes in full.
    ///
    /// The session claims its record in the store as it starts
    /// ([`SnapshotStore::claim`]; its epoch is the one the store issues, and a claim the
    /// store refuses fails `start` with [`SessionError::Store`], nothing started). A new
    /// session takes the record over ([`ClaimRule::Takeover`]). With
    /// [`restore`](Self::restore), the claim is a restore of the snapshot given
    /// ([`ClaimRule::Restore`]): it lands only if nobody claimed the session after that
    /// snapshot's writer did, so of two processes restoring one snapshot to one store, the
    /// second fails `start` with [`StoreError::Fenced`]; what the store held is replaced
    /// by the snapshot given at the first save. To go on from what the store holds, use
    /// [`restore_from`](Self::restore_from).
    ///
    /// A claim fences every writer of the session before it: when a later one fences this
    /// session, the store refuses its next save, and the session stops saving with a
    /// [`SessionEvent::Fenced`].
    pub fn save_snapshots(mut self, store: Arc<dyn SnapshotStore>) -> Self {
        self.saving = Saving::Claim(store);
        self
    }

    /// Saves the session to `store` as [`save_snapshots`](Self::save_snapshots) does,
    /// under a claim the host already made ([`SnapshotStore::claim`]): for a host that
    /// claims sessions itself (a cluster's worker), and for a takeover of a session whose
    /// last claimant is known to be gone (a claim with [`ClaimRule::Takeover`], and
    /// [`restore`](Self::restore) of the snapshot it returns: [`ClaimRule`] shows it). The
    /// session takes the claim's epoch; `start` fails with
    /// [`BuildError::InvalidSessionId`] when the claim is of another session.
    pub fn save_claimed(mut self, store: Arc<dyn SnapshotStore>, claim: Claim) -> Self {
        self.saving = Saving::Claimed(store, claim);
        self
    }

    /// Starts the session again from `snapshot`, on this engine or another process's:
    /// the same session id, conversation, agents (built again by `agents` from the data
    /// they were built with), queued work and ids. An LLM step whose model had not
    /// answered is asked again; a step whose tool calls had started never is: each call
    /// that was running (from the moment its body may start) follows its tool's
    /// [`RestorePolicy`](crate::RestorePolicy). No `on_enter` runs. The builder's other
    /// settings (model, toolsets, output, timings) apply as given: they are code, not
    /// state, so give it the same model and session toolsets as the session had. A
    /// paused agent whose tool awaited a sub-task gets the task's result as that call's
    /// output, as JSON (the tool body that awaited it was in the old process).
    /// Everything is checked before anything starts: an agent the registry cannot build,
    /// a model missing, user data that does not read back, a newer schema, a running
    /// call whose toolset or tool the restoring side lacks (never silently ended) fail
    /// `start` with the reason ([`SessionError::Snapshot`], [`SessionError::Build`]).
    pub fn restore(mut self, snapshot: SessionSnapshot, agents: AgentRegistry) -> Self {
        self.restore = Restoring::Snapshot(Box::new(snapshot), agents);
        self
    }

    /// Starts session `session` again from what `store` holds of it, and saves to
    /// `store` from then on: at `start`, reads the session's snapshot, claims the session
    /// on it ([`ClaimRule::Restore`]: the claim lands only if nobody claimed the session
    /// since that snapshot's writer did), and restores the snapshot as the claim left it
    /// (nothing can be added behind it) as [`restore`](Self::restore) does. The session's
    /// epoch is the claim's. Nothing in the store: `start` fails with
    /// [`StoreError::NotFound`], nothing claimed.
    ///
    /// This is how a process goes on from one that crashed or froze: its claim fences the
    /// writer of what it restores, whose next save is refused
    /// ([`SessionEvent::Fenced`]). Of two processes restoring one stored state, the second
    /// fails `start` with [`SessionError::Store`]`(`[`StoreError::Fenced`]`)` and starts
    /// nothing; the store never holds a mix of the two. A restored session saves as soon
    /// as it has started: a restore that reads after that reads the first one's own state,
    /// and goes on from it as from a crashed process (the store cannot tell a live writer
    /// from a dead one), fencing it. When the process whose claim holds the session died
    /// before it saved, every restore is refused (for the same reason): a host that knows
    /// it is gone takes the session over with a [`ClaimRule::Takeover`] claim and
    /// [`save_claimed`](Self::save_claimed).
    pub fn restore_from(
        mut self,
        store: Arc<dyn SnapshotStore>,
        session: impl Into<String>,
        agents: AgentRegistry,
    ) -> Self {
        self.restore = Restoring::FromStore(session.into(), agents);
        self.saving = Saving::Claim(store);
        self
    }

    /// How many LLM steps with tool calls one turn may take (default 3).
    pub fn max_tool_steps(mut self, steps: u32) -> Self {
        self.max_tool_steps = steps.max(1);
        self
    }

    /// How long a cancelled tool may take to finish before its future is dropped
    /// (default 2 s).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// How long, in a session that saves to a store
    /// ([`save_snapshots`](Self::save_snapshots), [`save_claimed`](Self::save_claimed),
    /// [`restore_from`](Self::restore_from)), the body of a call whose tool's restore
    /// policy is [`RestorePolicy::Abandon`](crate::RestorePolicy::Abandon) waits for the
    /// store to hold the call before it starts (default 5 s).
    ///
    /// Such a body starts only once a stored snapshot holds its call as running, so a
    /// process that dies while it runs leaves a store from which a restore abandons the
    /// call rather than asking the model again — the body never runs twice. Calls of one
    /// step share one write. A write that fails, is refused (fenced), or is not answered
    /// within this bound ends the call without its body ever starting: its output, which
    /// the model reads, says the call was not made because it could not be recorded, and a
    /// [`SessionEvent::Error`] names it. Tools whose policy is `Restart` or `Resume`, and
    /// sessions without a store, never wait.
    pub fn record_timeout(mut self, bound: Duration) -> Self {
        self.record_timeout = bound;
        self
    }

    /// Whether a new agent starts with a copy of the previous agent's chat context
    /// (default false: each agent has its own).
    pub fn inherit_chat_context(mut self, inherit: bool) -> Self {
        self.inherit_chat_context = inherit;
        self
    }

    /// How long an LLM request may wait for its first chunk and for each next one before
    /// the turn fails with `LlmError::Timeout` and an error event (default 10 s each).
    /// An agent may set its own (`AgentBuilder::llm_timeouts`).
    pub fn llm_timeouts(mut self, timeouts: LlmTimeouts) -> Self {
        self.llm_timeouts = timeouts;
        self
    }

    /// How many tool calls one LLM step may make (default 32). Calls beyond it do not run:
    /// each gets an error output, so a model cannot flood the session.
    pub fn max_calls_per_step(mut self, calls: usize) -> Self {
        self.max_calls_per_step = calls.max(1);
        self
    }

    /// How long a call's arguments may be, in bytes (default 64 KiB). Longer ones are
    /// refused without being parsed: the call does not run, its output says why, and
    /// the chat keeps a short stand-in for the arguments (their size, that they were
    /// left out), so no later request carries them.
    pub fn max_argument_bytes(mut self, bytes: usize) -> Self {
        self.max_argument_bytes = bytes;
        self
    }

    /// How much text one LLM step may stream, in bytes (default 64 KiB: about 16,000
    /// tokens of English, more than a chat model's usual output limit, and hours of
    /// speech). A step that goes over keeps its text up to the limit (spoken and in the
    /// chat, marked interrupted), its stream is dropped, none of its calls run, and the
    /// turn fails with [`TurnFailure::ReplyTooLong`](crate::TurnFailure) and an error
    /// event. An agent may set its own (`AgentBuilder::max_reply_bytes`).
    pub fn max_reply_bytes(mut self, bytes: usize) -> Self {
        self.max_reply_bytes = bytes;
        self
    }

    /// How much work the agents may start on their own between two user inputs (default
    /// 8): replies a hook or tool queues ([`SessionControl::generate_reply`](crate::SessionControl::generate_reply), the greeting
    /// of an `on_enter`) and handoffs a tool, hook or turn asks for. Each turn is bounded
    /// by itself; this bounds a chain of them — two agents whose `on_enter` asks for a
    /// reply and a model that always transfers would otherwise hand the call back and
    /// forth without end.
    ///
    /// Past the limit such work is refused: a hook or tool that asked gets
    /// [`SessionError::AgentWorkLimit`]; a handoff a turn's tool returned does not happen
    /// (the current agent stays; its chat still holds the tool's output); the first
    /// refusal since the last user input is a
    /// [`SessionEvent::AgentWorkRefused`](crate::SessionEvent::AgentWorkRefused). The
    /// session stays usable. User input gives the agents the whole limit again: `run`,
    /// `generate_reply`, `update_agent` (and `SessionAddress::send` of a handoff),
    /// `run_task`, and a final transcript once it makes a user turn. `say`, interim
    /// transcripts and the user starting or stopping to speak do not. Zero: agents start
    /// nothing on their own (no `on_enter` reply, no handoff, not even one the user's turn
    /// asks for). Deferred replies to tool updates are not counted here.
    pub fn max_agent_work(mut self, limit: u32) -> Self {
        self.max_agent_work = limit;
        self
    }

    /// Whether the user may interrupt the agents' speech (default true); an agent or a
    /// `say` may set its own.
    pub fn allow_interruptions(mut self, allow: bool) -> Self {
        self.allow_interruptions = allow;
        self
    }

    /// How long the user must talk over the agent before it is a real interruption
    /// (default 0.5 s); a transcript with words makes it one at once.
    pub fn min_interruption_duration(mut self, duration: Duration) -> Self {
        let interruption = self.turn_handling.interruption.take().unwrap_or_default();
        self.turn_handling.interruption = Some(interruption.min_duration(duration));
        self
    }

    /// After the user stopped talking over the agent too briefly and without words, how
    /// long to wait for a transcript before the paused speech resumes (default 2 s);
    /// `None`: a paused speech never resumes (the pause becomes an interruption).
    pub fn false_interruption_timeout(mut self, timeout: Option<Duration>) -> Self {
        let interruption = self.turn_handling.interruption.take().unwrap_or_default();
        self.turn_handling.interruption = Some(interruption.false_interruption_timeout(timeout));
        self
    }

    /// How long the user of a voice session may stay silent, with the agent idle, before
    /// their state is `Away` (default 15 s; `None`: never).
    pub fn user_away_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.user_away_timeout = timeout;
        self
    }

    /// How long a final transcript waits for more of the user's words before it makes a
    /// turn (default 0.5 s): finals within it join one user message and one LLM request,
    /// and the user speaking again inside it holds it until they stop. Zero: every final
    /// is a turn at once. `wait_for_settled` covers a pending endpoint.
    pub fn endpointing_delay(mut self, delay: Duration) -> Self {
        let endpointing = self.turn_handling.endpointing.take().unwrap_or_default();
        self.turn_handling.endpointing =
            Some(Endpointing::fixed(delay).max_delay(endpointing.max()));
        self
    }

    /// How the session's agents take turns (see [`TurnHandling`]): endpointing,
    /// interruptions and backchannels, preemptive generation, user-turn limits, the
    /// host's classifier. An agent's own ([`AgentBuilder::turn_handling`](crate::AgentBuilder::turn_handling))
    /// overrides it group by group. Replaces what `endpointing_delay`,
    /// `min_interruption_duration` and `false_interruption_timeout` set before it, group
    /// by group too; those three set their field of this afterwards.
    pub fn turn_handling(mut self, turn_handling: TurnHandling) -> Self {
        self.turn_handling = turn_handling.over(&self.turn_handling);
        self
    }

    /// Whether the spans of LLM requests carry the messages' content
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions`;
    /// default false: a trace backend is often kept longer and seen by more people than
    /// the conversation should be). Spans always carry the other GenAI attributes.
    pub fn trace_content(mut self, on: bool) -> Self {
        self.trace_content = on;
        self
    }

    /// How many of this session's blocking jobs (`RunContext::run_blocking`) may be on the
    /// blocking pool at once, running or queued there (default
    /// [`DEFAULT_MAX_BLOCKING_JOBS`](Self::DEFAULT_MAX_BLOCKING_JOBS), 4; at least 1).
    /// Its further jobs wait in the session for one of these slots.
    ///
    /// The pool belongs to the session's arbiter, is shared by every session there and
    /// takes jobs first come, first served (up to 512 threads). Without a bound per
    /// session, one session that queued thousands of jobs held every neighbour's job behind
    /// them, and its jobs stuck for ever took every thread. With it, a session has at most
    /// this many threads: a neighbour's job waits at most one job's time for a thread as
    /// long as the arbiter's sessions together hold fewer slots than the pool has threads
    /// (128 sessions all at their bound, by default). A job whose call is cancelled while
    /// it waits, for a slot or on the pool, never starts.
    pub fn max_blocking_jobs(mut self, jobs: usize) -> Self {
        self.max_blocking_jobs = jobs.max(1);
        self
    }

    /// Records every actor's traffic for `Session::inspector` (default off: then the
    /// probe only counts queued messages).
    pub fn inspect(mut self, on: bool) -> Self {
        self.inspect = on;
        self
    }

    /// How many messages the journal keeps per actor (default 1024).
    pub fn journal_capacity(mut self, capacity: usize) -> Self {
        self.journal_capacity = capacity;
        self
    }

    /// Subscribes to the session's events before it starts, so the subscriber sees what
    /// the first agent's `on_enter` does inside `start` (a greeting's speech and items);
    /// [`Session::subscribe`] sees only what comes after it. Set
    /// [`event_capacity`](Self::event_capacity) before: the channel is made here.
    ///
    /// ```
    /// # use switchboard::prelude::*;
    /// # use switchboard::testing::{Reply, ScriptedLlm};
    /// # #[actix::main]
    /// # async fn main() {
    /// let greeter = Agent::builder("greeter")
    ///     .on_enter(|ctx| async move {
    ///         let _ = ctx.generate_reply("Greet the caller.").await;
    ///     })
    ///     .build()
    ///     .unwrap();
    /// let mut builder = Session::builder()
    ///     .llm(ScriptedLlm::new([Reply::text("Hello, how can I help?")]))
    ///     .agent(greeter);
    /// let mut events = builder.subscribe();
    /// let session = builder.start(&Engine::current().unwrap()).await.unwrap();
    /// session.wait_for_settled().await.unwrap();
    /// let mut greeted = false;
    /// while let Ok(event) = events.try_recv() {
    ///     greeted |= matches!(event, SessionEvent::SpeechCreated { .. });
    /// }
    /// assert!(greeted);
    /// # session.close().await.unwrap();
    /// # }
    /// ```
    pub fn subscribe(&mut self) -> broadcast::Receiver<SessionEvent> {
        self.events
            .get_or_insert_with(|| broadcast::channel(self.event_capacity.max(1)).0)
            .subscribe()
    }

    /// How many events a slow subscriber may fall behind before it is told it lagged
    /// (default 1024).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity;
        self
    }

    /// Routes unexpected tool errors (after tool and agent rules; default: hide).
    pub fn error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.error_policy = policy;
        self
    }

    /// Prompt templates for the whole session (agents and toolsets may override them).
    pub fn prompts(mut self, prompts: Prompts) -> Self {
        self.prompts = prompts;
        self
    }

    /// Replaces the body of every tool named `name` in this session (whichever agent or
    /// toolset has it) by `mock`, keeping the tool's schema and policies. The arguments
    /// are still checked against the tool's own type first (a call that would not parse
    /// gets the same error as without the mock); the mock gets them as JSON, and a
    /// `RunContext` with which it may `update`, return or fail like the real body.
    /// Mocks belong to this session only: another session can mock the same tool
    /// differently.
    pub fn mock_tool<F, Fut, R>(mut self, name: impl Into<String>, mock: F) -> Self
    where
        F: Fn(RunContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ToolFailure>> + Send + 'static,
        R: Into<ToolReturn>,
    {
        self.mocks.insert(name.into(), mock_body(mock));
        self
    }

    /// The session's id, chosen by the host — the call's id, say — in place of the
    /// engine's `s1`, `s2`, …. It names the session in its actor ids, logs, spans,
    /// summaries and a drain's report.
    ///
    /// [`SessionBuilder::start`] refuses, before anything starts:
    /// - an id of the wrong form with [`BuildError::InvalidSessionId`]: it must be 1 to
    ///   [`SessionId::MAX_LEN`] (128) bytes, with no `/` (actor ids embed the session id
    ///   between slashes, `tool/<id>/1:call_1`), whitespace or control character;
    /// - the id of a session still live on the same engine with
    ///   [`SessionError::DuplicateSession`]. An id is free again once its session is gone:
    ///   its `close()` returned, or every handle of it was dropped and it closed.
    ///
    /// The engine's own ids skip any `s<n>` a live session of the host holds, so the two
    /// never collide. Actor ids are unique among live sessions only when the host reuses
    /// an id: a later session of the same id has the same actor ids as the earlier one.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Starts the session on one of the engine's arbiters and runs the first agent's
    /// `on_enter`.
    pub async fn start(mut self, engine: &Engine) -> Result<Session, SessionError> {
        let restore = match std::mem::take(&mut self.restore) {
            Restoring::Nothing => None,
            Restoring::Snapshot(snapshot, agents) => Some((*snapshot, agents)),
            Restoring::FromStore(session, agents) => {
                let Saving::Claim(store) = std::mem::take(&mut self.saving) else {
                    // `restore_from` sets both; a later `save_claimed` replaced its store.
                    return Err(BuildError::InvalidSessionId {
                        id: quote_prefix(&session),
                        reason:
                            "restore_from claims the session itself: give no save_claimed with it"
                                .into(),
                    }
                    .into());
                };
                let not_found = || StoreError::NotFound {
                    session: session.clone(),
                };
                // Read, then claimed on what was read: the claim lands only if nobody
                // claimed the session since that snapshot's writer did, so of two
                // restorers of one stored state the second is refused here, before
                // anything starts. What is restored is read after the claim (nothing can
                // be added behind it): the same state, or what that writer added since.
                let read = store.load(&session).await?.ok_or_else(not_found)?;
                let claimed = store.claim(&session, ClaimRule::restore(&read)).await?;
                let snapshot = claimed.snapshot.ok_or_else(not_found)?;
                self.saving = Saving::Claimed(store, claimed.claim);
                Some((snapshot, agents))
            }
        };
        // A restored session is the snapshot's: it keeps its id.
        if let Some((snapshot, _)) = &restore {
            match &self.id {
                Some(id) if id != snapshot.session_id() => {
                    return Err(BuildError::InvalidSessionId {
                        id: quote_prefix(id),
                        reason: "a restored session keeps the id of its snapshot".into(),
                    }
                    .into())
                }
                _ => self.id = Some(snapshot.session_id().to_owned()),
            }
        }
        if let Some(id) = &self.id {
            SessionId::check(id).map_err(|reason| BuildError::InvalidSessionId {
                id: quote_prefix(id),
                reason: reason.into(),
            })?;
        }
        let agent = match (&restore, self.agent.take()) {
            (Some(_), Some(_)) => return Err(BuildError::AgentWithRestore.into()),
            (Some(_), None) => None,
            (None, agent) => {
                let agent = agent.ok_or(BuildError::NoAgent)?;
                if agent.def.llm.is_none()
                    && agent.def.realtime.is_none()
                    && self.llm.is_none()
                    && self.realtime.is_none()
                {
                    return Err(BuildError::NoLlm {
                        agent: agent.name().to_owned(),
                    }
                    .into());
                }
                Some(agent)
            }
        };
        for toolset in &self.toolsets {
            for tool in &toolset.tools {
                crate::agent::check_confirm(tool, crate::agent::effective_policy(tool, toolset))?;
            }
        }
        let session_tools = SessionTools {
            owners: self
                .toolsets
                .iter()
                .flat_map(|ts| {
                    ts.tools
                        .iter()
                        .map(move |t| (t.name().to_owned(), format!("session toolset {}", ts.name)))
                })
                .collect(),
            any_cancellable: self
                .toolsets
                .iter()
                .flat_map(|ts| ts.tools.iter())
                .any(|t| t.allows_cancellation()),
        };
        crate::agent::check_tools(
            session_tools
                .owners
                .iter()
                .map(|(name, owner)| (name.as_str(), owner.clone())),
        )?;
        let epoch = match &restore {
            Some((snapshot, agents)) => {
                snapshot.check_version()?;
                if let Some(value) = snapshot.userdata() {
                    // Data given to this builder wins: it is what the host has now.
                    if self.userdata.is_none() {
                        let (data, write) =
                            agents.read_userdata(value.clone()).ok_or_else(|| {
                                SnapshotError::UserData {
                                    reason: "the snapshot has user data and the agent registry names no type for it (`AgentRegistry::userdata`)".to_owned(),
                                }
                            })??;
                        self.userdata = Some(data);
                        self.userdata_json = Some(write);
                    }
                }
                snapshot.epoch() + 1
            }
            None => 0,
        };
        // The session's place on the engine: refused here, before anything starts, when a
        // live session has the id or the engine drains; freed if the start fails.
        let mut lease = engine.reserve_session(self.id.take())?;
        let memory = lease.take_memory();
        let id = lease.id().clone();
        // Its record in the store, claimed before anything starts: the epoch is the
        // store's, and every writer of the session before is fenced (or the claim is
        // refused, and nothing starts).
        let saving = match std::mem::take(&mut self.saving) {
            Saving::Nothing => None,
            Saving::Claim(store) => {
                // A restore claims on its snapshot (refused when a later claim holds the
                // session); a new session takes the record over.
                let rule = match &restore {
                    Some((snapshot, _)) => ClaimRule::restore(snapshot),
                    None => ClaimRule::Takeover { at_least: epoch },
                };
                let claimed = store.claim(id.as_str(), rule).await?;
                Some((store, claimed.claim))
            }
            Saving::Claimed(store, claim) => {
                if claim.session() != id.as_str() {
                    return Err(BuildError::InvalidSessionId {
                        id: quote_prefix(claim.session()),
                        reason: "the claim given to save_claimed is of another session".into(),
                    }
                    .into());
                }
                Some((store, claim))
            }
        };
        let epoch = saving.as_ref().map_or(epoch, |(_, claim)| claim.epoch());
        let journal = Journal::new(self.inspect.then_some(self.journal_capacity));
        let (alive, gone) = alive_pair();
        // Under the span current at `start` (the host's): the session's work nests in it.
        let span = tracing::info_span!("session", session = %id);
        #[cfg(feature = "telemetry")]
        let telemetry = crate::telemetry::SessionTelemetry::new(engine.telemetry());
        #[cfg(not(feature = "telemetry"))]
        let telemetry = crate::telemetry::SessionTelemetry::default();
        let shared = Arc::new(SessionShared::new(SharedParts {
            settings: SessionSettings {
                id: id.clone(),
                config: SessionConfig {
                    max_tool_steps: self.max_tool_steps,
                    grace_period: self.grace_period,
                    inherit_chat_context: self.inherit_chat_context,
                    llm_timeouts: self.llm_timeouts,
                    max_calls_per_step: self.max_calls_per_step,
                    max_argument_bytes: self.max_argument_bytes,
                    max_reply_bytes: self.max_reply_bytes,
                    max_agent_work: self.max_agent_work,
                    allow_interruptions: self.allow_interruptions,
                    user_away_timeout: self.user_away_timeout,
                    turn_handling: self.turn_handling,
                    trace_content: self.trace_content,
                    max_blocking_jobs: self.max_blocking_jobs,
                    record_calls: saving.is_some().then_some(self.record_timeout),
                },
                llm: self.llm,
                realtime: self.realtime,
                error_policy: self.error_policy,
                prompts: self.prompts,
                mocks: self.mocks,
                userdata: self.userdata,
                userdata_json: self.userdata_json,
                session_tools,
                epoch,
            },
            journal: journal.clone(),
            output: self.output,
            event_capacity: self.event_capacity,
            events: self.events,
            gone,
            span,
            telemetry,
            memory,
        }));
        // Checked here, before any actor exists: a session whose first agent cannot start
        // (or whose snapshot names one that cannot) fails with the reason and leaves
        // nothing behind.
        let start = match (agent, restore) {
            (Some(agent), _) => {
                let llm = shared.settings.check_agent(&agent)?;
                Start::Fresh(agent, llm)
            }
            (None, Some((snapshot, agents))) => Start::Restore(Box::new(RestorePlan::new(
                snapshot,
                |name, data| Ok(agents.build(name, data)?),
                |agent| Ok(shared.settings.check_agent(agent)?),
                &self.toolsets,
            )?)),
            // `agent` is `None` only when restoring (checked above).
            (None, None) => return Err(BuildError::NoAgent.into()),
        };
        let probe = Probe::new(ActorId::session_actor(&id), journal);
        let toolsets = self.toolsets;
        let store = saving;
        let actor_shared = shared.clone();
        let actor_probe = probe.clone();
        let addr = engine.start_session_actor(lease, move |ctx, lease| {
            SessionActor::new(
                ctx,
                actor_shared,
                actor_probe,
                start,
                toolsets,
                store,
                (lease, alive),
            )
        })?;
        let session = Session {
            host: Arc::new(Host {
                mailbox: Mailbox::new(addr, probe),
                shared,
                _engine: engine.clone(),
            }),
        };
        let host: Weak<dyn DrainPort> = Arc::downgrade(&session.host) as Weak<Host>;
        engine.register_session(
            &id,
            LiveSession {
                shared: Arc::downgrade(&session.host.shared),
                host,
            },
        );
        session
            .host
            .mailbox
            .ask(&ActorId::host(), StartSession)
            .await
            .unwrap_or(Err(SessionError::Closed))?;
        Ok(session)
    }
}

/// What a builder restores from.
#[derive(Default)]
enum Restoring {
    /// Nothing: a new session.
    #[default]
    Nothing,
    /// A snapshot the host has (`restore`).
    Snapshot(Box<SessionSnapshot>, AgentRegistry),
    /// What the store holds of a session, read once the session claimed it
    /// (`restore_from`).
    FromStore(String, AgentRegistry),
}

/// Where a builder's session saves.
#[derive(Default)]
enum Saving {
    /// Nowhere.
    #[default]
    Nothing,
    /// To a store, under a claim the session makes as it starts (`save_snapshots`).
    Claim(Arc<dyn SnapshotStore>),
    /// To a store, under the host's claim (`save_claimed`).
    Claimed(Arc<dyn SnapshotStore>, Claim),
}

/// The first 64 characters of an id for an error message, with `…` when it was longer: an
/// error never quotes a whole input of any size.
fn quote_prefix(id: &str) -> String {
    const SHOWN: usize = 64;
    match id.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &id[..cut]),
        None => id.to_owned(),
    }
}
