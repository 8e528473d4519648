//! What the actors of one session share, split by purpose. Each part says who writes it.
//!
//! All of a session's actors live on one arbiter thread, so the locks here are never
//! contended; they exist because handles (`Session`, `RunContext`) are `Send`. Nothing
//! here is an address: holding a `SessionShared` keeps no actor alive.
//!
//! | part | what | written by |
//! |---|---|---|
//! | [`settings`](SessionShared::settings) | id, config, model, policies, prompts, mocks, user data, session tools | nobody after start |
//! | [`events`](SessionShared::events) | the host's event channel | any actor of the session (a broadcast channel is made for many senders; on one arbiter they are totally ordered) |
//! | [`host_view`](SessionShared::host_view) | what the host reads without a message: inactivity, settling, switches, user and agent state | the session actor, except the agent state (the current activity) and the count of live tool runs (each run, in and out) |
//! | [`ids`](SessionShared::ids) | counters for runs, speeches, steps and turns; the call-id table | any actor that makes one (atomics; the call-id table behind a lock) |
//! | [`output`](SessionShared::output) | the host's speech output | the activity that speaks; the session once, to attach its reporter |
//! | [`speeches`](SessionShared::speeches) | which activity owns each speech still going, and so whether the agent holds the floor | each activity, for its own speeches only; read by the session to route playout reports and to judge the user's words over the agent |
//! | [`metrics`](SessionShared::metrics) | the usage ledger (tokens by agent and model) and each agent's latency | each activity, as its requests and turns end; read by the host and by snapshots |
//! | [`history`](SessionShared::history) | the final chat context of each activation that closed | each activity, once, as it stops |
//! | [`unfinished`](SessionShared::unfinished) | the host's code its close stopped waiting for | whichever actor drops it (a run, an activity, the session) |
//! | [`journal`](SessionShared::journal) | the session's live actors and queued messages, and each actor's record when inspecting | each actor's probe, for its own actor and the messages sent to it |
//! | [`audio`](SessionShared::audio) | where the host's microphone audio goes: the current agent's realtime connection, if it has one | the session, when the current agent changes and at close |

mod events;
mod host_view;
mod ids;
mod metrics;
mod settings;
mod speeches;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::events::{SessionEvent, Unfinished};
use crate::history::{AgentChat, HistoryBook, SessionHistory};
use crate::idle_release::IdleHold;
use crate::lifecycle::AliveWaiter;
use crate::mailbox::Journal;
use crate::output::SpeechOutput;
use crate::realtime_link::RealtimeLink;
use crate::telemetry::SessionTelemetry;

pub(crate) use events::Events;
pub(crate) use host_view::HostView;
pub(crate) use ids::Ids;
pub(crate) use metrics::MetricsBook;
pub(crate) use settings::{
    userdata_json, SessionConfig, SessionSettings, SessionTools, UserdataJson,
};
pub(crate) use speeches::{AgentSpeech, Floor, SpeechBook};

pub(crate) struct SessionShared {
    /// Fixed when the session starts.
    pub(crate) settings: SessionSettings,
    pub(crate) events: Events,
    pub(crate) host_view: HostView,
    pub(crate) ids: Ids,
    pub(crate) output: HostOutput,
    pub(crate) speeches: SpeechBook,
    pub(crate) metrics: MetricsBook,
    pub(crate) history: History,
    pub(crate) unfinished: UnfinishedBook,
    /// Its jobs' slots on the blocking pool (`RunContext::run_blocking`).
    pub(crate) blocking: BlockingSlots,
    /// The mailbox journal every probe of the session reports to: its live actors and
    /// queued messages, and each actor's record when inspection is on.
    pub(crate) journal: Arc<Journal>,
    /// Where the host's microphone audio goes.
    pub(crate) audio: AudioSlot,
    /// Resolves once the session actor (and so every actor of the session) is gone.
    pub(crate) gone: AliveWaiter,
    /// The parent of every span of the session (turns, LLM requests, tool runs).
    pub(crate) span: tracing::Span,
    /// The engine's metrics as this session records them, and the span it started
    /// under (empty without the `telemetry` feature).
    pub(crate) telemetry: SessionTelemetry,
    /// When the session was built, for its age in `Session::summary` (tokio's clock, so
    /// paused test time moves it too).
    pub(crate) started_at: tokio::time::Instant,
    /// The session's count for the engine's idle release: its memory can be given back
    /// once this state is dropped (none in unit tests, which have no engine).
    _memory: Option<IdleHold>,
}

/// What a new [`SessionShared`] is made of.
pub(crate) struct SharedParts {
    pub(crate) settings: SessionSettings,
    pub(crate) journal: Arc<Journal>,
    pub(crate) output: Box<dyn SpeechOutput>,
    pub(crate) event_capacity: usize,
    /// The channel of subscribers that came before the start, if any.
    pub(crate) events: Option<tokio::sync::broadcast::Sender<crate::events::SessionEvent>>,
    pub(crate) gone: AliveWaiter,
    pub(crate) span: tracing::Span,
    pub(crate) telemetry: SessionTelemetry,
    pub(crate) memory: Option<IdleHold>,
}

impl SessionShared {
    pub(crate) fn new(parts: SharedParts) -> Self {
        Self {
            span: parts.span,
            telemetry: parts.telemetry,
            settings: parts.settings,
            events: Events::new(parts.event_capacity, parts.events),
            host_view: HostView::new(),
            ids: Ids::default(),
            output: HostOutput(Mutex::new(parts.output)),
            speeches: SpeechBook::default(),
            metrics: MetricsBook::default(),
            history: History::default(),
            unfinished: UnfinishedBook::default(),
            blocking: BlockingSlots::default(),
            journal: parts.journal,
            audio: AudioSlot::default(),
            gone: parts.gone,
            started_at: tokio::time::Instant::now(),
            _memory: parts.memory,
        }
    }

    /// The session's id.
    pub(crate) fn id(&self) -> &crate::ids::SessionId {
        &self.settings.id
    }
}

/// The host's speech output. Called by the activity that speaks (and by the session once,
/// to attach its reporter); a panic inside it is caught and logged: host code must not
/// take the session down.
pub(crate) struct HostOutput(Mutex<Box<dyn SpeechOutput>>);

impl HostOutput {
    /// Calls the output; a call that panics is skipped (its result is `R::default()`).
    pub(crate) fn call<R: Default>(&self, f: impl FnOnce(&mut dyn SpeechOutput) -> R) -> R {
        // A panic inside the host's output leaves it as it was; keep using it.
        let mut output: MutexGuard<'_, Box<dyn SpeechOutput>> =
            self.0.lock().unwrap_or_else(|p| p.into_inner());
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(output.as_mut()))) {
            Ok(out) => out,
            Err(_) => {
                tracing::error!("the host's speech output panicked; the call was skipped");
                R::default()
            }
        }
    }
}

/// The current agent's realtime connection, where the host's microphone audio goes (none:
/// the audio is dropped). A host's `AudioInput` keeps a copy of its sender and takes a new
/// one only when the generation moved, so a piece of audio costs an atomic read, not a
/// lock.
#[derive(Default)]
pub(crate) struct AudioSlot {
    link: Mutex<Option<RealtimeLink>>,
    generation: AtomicU64,
}

impl AudioSlot {
    /// The connection the host's audio goes to from now on.
    pub(crate) fn set(&self, link: Option<RealtimeLink>) {
        let mut slot = self.link.lock().unwrap_or_else(|p| p.into_inner());
        let same = match (&*slot, &link) {
            (Some(a), Some(b)) => a.same(b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            *slot = link;
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// The generation of the slot: it moves whenever the connection changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The connection now, with its generation.
    pub(crate) fn current(&self) -> (u64, Option<RealtimeLink>) {
        let slot = self.link.lock().unwrap_or_else(|p| p.into_inner());
        (self.generation(), slot.clone())
    }
}

/// The activations that closed, each recorded once by its activity as it stops.
#[derive(Default)]
pub(crate) struct History(Mutex<HistoryBook>);

impl History {
    /// Records the final chat context of a closed activation (`order`: its place in start
    /// order).
    pub(crate) fn record(&self, order: u32, entry: AgentChat) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(order, entry);
    }

    /// The closed activations, with their place in start order.
    pub(crate) fn closed(&self) -> Vec<(u32, AgentChat)> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed()
            .to_vec()
    }

    /// The history: closed activations and `live` ones, in start order.
    pub(crate) fn read(&self, live: Vec<(u32, AgentChat)>) -> SessionHistory {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .history(live)
    }
}

/// How many of the session's blocking jobs (`RunContext::run_blocking`) may be on its
/// arbiter's blocking pool at once, running or queued there. The pool is shared by every
/// session of the arbiter and takes jobs first come, first served: a session that queued
/// ten thousand jobs there would hold every neighbour's job behind them (and its stuck jobs
/// every thread). With its own few slots, a session's further jobs wait in the session, a
/// neighbour's job finds a thread, and a job whose call was cancelled while it waited for
/// a slot never reaches the pool. The semaphore is made at the session's first blocking
/// job: most sessions never run one.
#[derive(Default)]
pub(crate) struct BlockingSlots(std::sync::OnceLock<Arc<tokio::sync::Semaphore>>);

impl BlockingSlots {
    /// The session's slots, `limit` of them (the session's `max_blocking_jobs`) when this
    /// is the first call.
    pub(crate) fn slots(&self, limit: usize) -> Arc<tokio::sync::Semaphore> {
        self.0
            .get_or_init(|| Arc::new(tokio::sync::Semaphore::new(limit.max(1))))
            .clone()
    }
}

/// What the session stopped waiting for (see [`Unfinished`]): each is an event when it is
/// dropped; those dropped once the session began to close are kept for the drain report.
/// Nothing is kept before the close, so a long session that cancels many slow tools does
/// not grow it.
#[derive(Default)]
pub(crate) struct UnfinishedBook(Mutex<Vec<Unfinished>>);

impl UnfinishedBook {
    /// Reports `what`: a warning, an event, and kept when the session is closing.
    pub(crate) fn report(&self, shared: &SessionShared, what: Unfinished) {
        tracing::warn!(session = %shared.id(), "{what}");
        if shared.host_view.is_closing() {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(what.clone());
        }
        shared.events.emit(SessionEvent::Unfinished(what));
    }

    /// What was kept.
    pub(crate) fn read(&self) -> Vec<Unfinished> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
impl SessionShared {
    /// A session's shared state with the builder's defaults, for unit tests of the plain
    /// machines.
    pub(crate) fn for_tests(output: Box<dyn SpeechOutput>) -> Arc<Self> {
        use std::collections::HashMap;
        use std::time::Duration;

        let (_alive, gone) = crate::lifecycle::alive_pair();
        Arc::new(Self::new(SharedParts {
            settings: SessionSettings {
                id: crate::ids::SessionId::new("s1".to_owned()),
                config: SessionConfig {
                    max_tool_steps: 3,
                    grace_period: Duration::from_secs(2),
                    inherit_chat_context: false,
                    llm_timeouts: crate::llm::LlmTimeouts::default(),
                    max_calls_per_step: 32,
                    max_argument_bytes: 64 * 1024,
                    max_reply_bytes: 64 * 1024,
                    max_agent_work: 8,
                    allow_interruptions: true,
                    user_away_timeout: None,
                    turn_handling: crate::turn_handling::TurnHandling::new()
                        .endpointing(crate::turn_handling::Endpointing::fixed(Duration::ZERO)),
                    trace_content: false,
                    max_blocking_jobs: 4,
                    record_calls: None,
                },
                llm: None,
                realtime: None,
                error_policy: crate::error_policy::ErrorPolicy::new(),
                prompts: crate::prompts::Prompts::new(),
                mocks: HashMap::new(),
                userdata: None,
                userdata_json: None,
                session_tools: SessionTools::default(),
                epoch: 0,
            },
            journal: Journal::new(None),
            output,
            event_capacity: 1024,
            events: None,
            gone,
            span: tracing::Span::none(),
            telemetry: SessionTelemetry::default(),
            memory: None,
        }))
    }
}
