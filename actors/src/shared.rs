//! What every actor of one session shares: settings, the event channel, counters.
//!
//! All of a session's actors live on one arbiter thread, so the locks here are never
//! contended; they exist because handles (`Session`, `RunContext`) are `Send`. Nothing
//! here is an address: holding a `SessionShared` keeps no actor alive.

use std::any::Any;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::{broadcast, watch, Notify};

use crate::agent::{check_tools, Agent};
use crate::call_ids::CallIds;
use crate::chat::{ChatContext, ChatItem};
use crate::error::BuildError;
use crate::error_policy::ErrorPolicy;
use crate::events::{AgentState, SessionEvent, UserState};
use crate::history::{AgentChat, HistoryBook, SessionHistory};
use crate::ids::SessionId;
use crate::lifecycle::AliveWaiter;
use crate::llm::{Llm, LlmTimeouts};
use crate::mailbox::Journal;
use crate::output::SpeechOutput;
use crate::prompts::Prompts;
use crate::tool::MockBody;

/// Settings of a session, fixed when it starts.
#[derive(Clone, Debug)]
pub(crate) struct SessionConfig {
    pub(crate) max_tool_steps: u32,
    pub(crate) grace_period: Duration,
    pub(crate) inherit_chat_context: bool,
    pub(crate) llm_timeouts: LlmTimeouts,
    pub(crate) max_calls_per_step: usize,
    pub(crate) max_argument_bytes: usize,
    pub(crate) allow_interruptions: bool,
    pub(crate) min_interruption_duration: Duration,
    pub(crate) false_interruption_timeout: Option<Duration>,
    pub(crate) user_away_timeout: Option<Duration>,
}

/// The tool names of the session-scoped toolsets, with their owners, for checking that
/// an agent can start here before anything is stopped for it.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionTools {
    pub(crate) owners: Vec<(String, String)>,
    pub(crate) any_cancellable: bool,
}

pub(crate) struct SessionShared {
    pub(crate) id: SessionId,
    pub(crate) config: SessionConfig,
    pub(crate) llm: Option<Arc<dyn Llm>>,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) prompts: Prompts,
    pub(crate) mocks: HashMap<String, MockBody>,
    pub(crate) userdata: Option<Arc<dyn Any + Send + Sync>>,
    pub(crate) journal: Option<Arc<Journal>>,
    pub(crate) session_tools: SessionTools,
    /// Created by the first subscriber: a broadcast channel allocates all its slots up
    /// front, which an idle session without listeners should not pay for.
    events: OnceLock<broadcast::Sender<SessionEvent>>,
    event_capacity: usize,
    /// Whether the session is inactive; written only through [`Self::publish_inactive`].
    pub(crate) inactive: watch::Sender<bool>,
    /// How many tool runs are alive in the session.
    running_tools: AtomicUsize,
    /// Notified each time the session becomes settled (inactive, no tool run alive), for
    /// `wait_for_settled`: one signal for the pair, so a waiting host is woken once per
    /// settle, not once per half of it.
    settled: Notify,
    /// Notified each time a switch (handoff, sub-task start or end) ends: reads that found
    /// no current agent ask again then.
    pub(crate) switched: Notify,
    output: Mutex<Box<dyn SpeechOutput>>,
    // Plain atomics, not channels: nobody awaits them (events announce changes), and an
    // idle session should not pay for a channel each.
    agent_state: AtomicU8,
    user_state: AtomicU8,
    run_seq: AtomicU64,
    speech_seq: AtomicU64,
    step_seq: AtomicU64,
    turn_seq: AtomicU64,
    call_ids: Mutex<CallIds>,
    /// Resolves once the session actor (and so every actor of the session) is gone.
    pub(crate) gone: AliveWaiter,
    /// The activations that closed, each recorded by its activity as it stopped.
    history: Mutex<HistoryBook>,
    /// The parent of every span of the session (turns, LLM requests, tool runs).
    pub(crate) span: tracing::Span,
}

fn agent_state_code(state: AgentState) -> u8 {
    match state {
        AgentState::Initializing => 0,
        AgentState::Listening => 1,
        AgentState::Thinking => 2,
        AgentState::Speaking => 3,
    }
}

fn user_state_code(state: UserState) -> u8 {
    match state {
        UserState::Speaking => 0,
        UserState::Listening => 1,
        UserState::Away => 2,
    }
}

/// What a new [`SessionShared`] is made of.
pub(crate) struct SharedParts {
    pub(crate) id: SessionId,
    pub(crate) config: SessionConfig,
    pub(crate) llm: Option<Arc<dyn Llm>>,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) prompts: Prompts,
    pub(crate) mocks: HashMap<String, MockBody>,
    pub(crate) userdata: Option<Arc<dyn Any + Send + Sync>>,
    pub(crate) journal: Option<Arc<Journal>>,
    pub(crate) session_tools: SessionTools,
    pub(crate) output: Box<dyn SpeechOutput>,
    pub(crate) event_capacity: usize,
    pub(crate) gone: AliveWaiter,
}

impl SessionShared {
    pub(crate) fn new(parts: SharedParts) -> Self {
        let (inactive, _) = watch::channel(false);
        let span = tracing::info_span!("session", session = %parts.id);
        Self {
            span,
            id: parts.id,
            config: parts.config,
            llm: parts.llm,
            error_policy: parts.error_policy,
            prompts: parts.prompts,
            mocks: parts.mocks,
            userdata: parts.userdata,
            journal: parts.journal,
            session_tools: parts.session_tools,
            events: OnceLock::new(),
            event_capacity: parts.event_capacity.max(1),
            inactive,
            running_tools: AtomicUsize::new(0),
            settled: Notify::new(),
            switched: Notify::new(),
            output: Mutex::new(parts.output),
            agent_state: AtomicU8::new(agent_state_code(AgentState::Initializing)),
            user_state: AtomicU8::new(user_state_code(UserState::Listening)),
            run_seq: AtomicU64::new(0),
            speech_seq: AtomicU64::new(0),
            step_seq: AtomicU64::new(0),
            turn_seq: AtomicU64::new(0),
            call_ids: Mutex::new(CallIds::default()),
            gone: parts.gone,
            history: Mutex::new(HistoryBook::default()),
        }
    }

    /// A tool run of the session started.
    pub(crate) fn tool_run_started(&self) {
        self.running_tools.fetch_add(1, Ordering::AcqRel);
    }

    /// A tool run of the session stopped; the last one settles an inactive session.
    pub(crate) fn tool_run_ended(&self) {
        let before = self
            .running_tools
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .unwrap_or(0);
        // Read after the count: whichever of this and `publish_inactive` comes second sees
        // both halves and notifies (the watch's lock orders the two).
        if before == 1 && *self.inactive.borrow() {
            self.settled.notify_waiters();
        }
    }

    /// Publishes whether the session is inactive (watchers hear of changes only), and
    /// settles it if it just became inactive with no tool run alive. The session publishes
    /// at every pump; an inactive session that stays so has already settled, or settles
    /// when its last run ends (`tool_run_ended`).
    pub(crate) fn publish_inactive(&self, inactive: bool) {
        let became_inactive = self.inactive.send_if_modified(|v| {
            let changed = *v != inactive;
            *v = inactive;
            changed
        }) && inactive;
        if became_inactive && self.running_tools.load(Ordering::Acquire) == 0 {
            self.settled.notify_waiters();
        }
    }

    /// Whether the session is settled: inactive, and no tool run alive.
    pub(crate) fn is_settled(&self) -> bool {
        self.running_tools.load(Ordering::Acquire) == 0 && *self.inactive.borrow()
    }

    /// Resolves at the next time the session settles; create it before checking
    /// [`Self::is_settled`], so that a settle in between is not missed.
    pub(crate) fn settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.settled.notified()
    }

    /// Sends an event to subscribers (none listening is fine).
    pub(crate) fn emit(&self, event: SessionEvent) {
        self.emit_with(|| event);
    }

    /// Builds and sends an event only when someone listens: chat items are cloned for
    /// events, and a session without subscribers should not pay for that per item.
    pub(crate) fn emit_with(&self, event: impl FnOnce() -> SessionEvent) {
        if let Some(events) = self.events.get() {
            if events.receiver_count() > 0 {
                let _ = events.send(event());
            }
        }
    }

    /// A new subscriber to the session's events.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.events
            .get_or_init(|| broadcast::channel(self.event_capacity).0)
            .subscribe()
    }

    /// Marks the call ids of a chat context from outside the session as issued: a model's
    /// later call with one of them gets a fresh id.
    pub(crate) fn reserve_call_ids(&self, chat: &ChatContext) {
        let mut ids = self.call_ids.lock().unwrap_or_else(|p| p.into_inner());
        for item in chat.items() {
            if let ChatItem::FunctionCall(call) = item {
                ids.reserve(&call.call_id);
            }
        }
    }

    pub(crate) fn next_run(&self) -> u64 {
        self.run_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn next_speech(&self) -> u64 {
        self.speech_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A step key unique in the session: toolsets serve several activities, and an
    /// interruption names the step whose calls it resolves.
    pub(crate) fn next_step(&self) -> u64 {
        self.step_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn next_turn(&self) -> u64 {
        self.turn_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Calls the host's output. A panic in it is caught and logged: host code must not
    /// take the session down.
    pub(crate) fn with_output<R: Default>(&self, f: impl FnOnce(&mut dyn SpeechOutput) -> R) -> R {
        // A panic inside the host's output leaves it as it was; keep using it.
        let mut output: MutexGuard<'_, Box<dyn SpeechOutput>> =
            self.output.lock().unwrap_or_else(|p| p.into_inner());
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(output.as_mut()))) {
            Ok(out) => out,
            Err(_) => {
                tracing::error!(session = %self.id, "the host's speech output panicked; the call was skipped");
                R::default()
            }
        }
    }

    /// Sets what the agent does; subscribers hear of a change.
    pub(crate) fn set_agent_state(&self, agent: &str, state: AgentState) {
        let code = agent_state_code(state);
        if self.agent_state.swap(code, Ordering::Relaxed) != code {
            self.emit_with(|| SessionEvent::AgentStateChanged {
                agent: agent.to_owned(),
                state,
            });
        }
    }

    /// What the agent does now.
    pub(crate) fn agent_state(&self) -> AgentState {
        match self.agent_state.load(Ordering::Relaxed) {
            0 => AgentState::Initializing,
            1 => AgentState::Listening,
            2 => AgentState::Thinking,
            _ => AgentState::Speaking,
        }
    }

    /// Sets what the user does; subscribers hear of a change.
    pub(crate) fn set_user_state(&self, state: UserState) {
        let code = user_state_code(state);
        if self.user_state.swap(code, Ordering::Relaxed) != code {
            self.emit(SessionEvent::UserStateChanged { state });
        }
    }

    /// What the user does now.
    pub(crate) fn user_state(&self) -> UserState {
        match self.user_state.load(Ordering::Relaxed) {
            0 => UserState::Speaking,
            1 => UserState::Listening,
            _ => UserState::Away,
        }
    }

    /// Records the final chat context of a closed activation (`order`: its place in start
    /// order).
    pub(crate) fn record_history(&self, order: u32, entry: AgentChat) {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(order, entry);
    }

    /// The history: closed activations and `live` ones, in start order.
    pub(crate) fn history(&self, live: Vec<(u32, AgentChat)>) -> SessionHistory {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .history(live)
    }

    /// The session-unique canonical id of a call the model made (see `call_ids`).
    pub(crate) fn canonical_call_id(&self, provider_id: &str) -> String {
        self.call_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .canonical(provider_id)
    }

    /// Checks that an activity of `agent` can start in this session: an LLM to use, and
    /// tool names unique among everything it would see. Done before anything is stopped
    /// for a handoff or sub-task, so a refused agent leaves the current one in place.
    pub(crate) fn check_agent(&self, agent: &Agent) -> Result<Arc<dyn Llm>, BuildError> {
        let llm = agent
            .def
            .llm
            .clone()
            .or_else(|| self.llm.clone())
            .ok_or_else(|| BuildError::NoLlm {
                agent: agent.name().to_owned(),
            })?;
        let companions = self.exposes_companions(agent);
        let companion_owner = "companion tools".to_owned();
        check_tools(
            agent
                .tool_owners()
                .chain(
                    self.session_tools
                        .owners
                        .iter()
                        .map(|(name, owner)| (name.as_str(), owner.clone())),
                )
                .chain(
                    companions
                        .then_some(crate::agent::COMPANION_TOOLS)
                        .into_iter()
                        .flatten()
                        .map(|name| (*name, companion_owner.clone())),
                ),
        )?;
        Ok(llm)
    }

    /// Whether an activity of `agent` exposes `get_running_tasks` and `cancel_task`: some
    /// tool it sees allows cancellation.
    pub(crate) fn exposes_companions(&self, agent: &Agent) -> bool {
        self.session_tools.any_cancellable || agent.any_cancellable()
    }
}
