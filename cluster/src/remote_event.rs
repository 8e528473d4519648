//! What a session says to its front, across machines: [`RemoteEvent`]s on the session's
//! event subject, each with its sequence number and its owner's epoch, and the serde
//! forms of what the engine's host API returns ([`RemoteRunResult`], [`RemoteHistory`],
//! [`RemoteFailure`]).
//!
//! The engine's own types hold handles (`SpeechHandle`) and actor ids that mean nothing on
//! another machine; these carry the same facts as plain data. Chat items travel as the
//! engine's [`ChatItem`], which is serde already.

use serde::{Deserialize, Serialize};
use switchboard::{
    AgentState, ChatItem, DeferredReplyDecision, FunctionCall, FunctionCallOutput, IgnoredWords,
    LlmUsage, RunResult, SessionError, SessionEvent, SessionHistory, SpeechId, TurnLatency, Usage,
    UserState,
};

/// One event of a remote session, in the order the owner published it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteEvent {
    /// 1, 2, 3, … per session, without gaps: the gateway delivers them in this order,
    /// once each, asking the owner again for any it missed. Each owner numbers the
    /// events it publishes from 1; the gateway numbers what it delivers, so the numbers
    /// go on across a move to another owner.
    pub seq: u64,
    /// The owner's epoch when it published: a higher epoch means a newer owner, whose
    /// events win over a stale one's.
    pub epoch: u64,
    /// What happened.
    pub kind: RemoteEventKind,
}

/// What happened in a remote session. The engine's [`SessionEvent`]s, the speech the
/// session streams to its output, and the cluster's own lifecycle events.
///
/// New kinds may be added: match with a wildcard arm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteEventKind {
    /// A worker owns the session and it runs: the first event of every session.
    SessionStarted,
    /// No worker could start the session (its spec names an unknown agent, the factory
    /// failed, its id was taken); no event follows.
    StartFailed {
        /// Why.
        reason: String,
    },
    /// A host input whose answer takes time (a turn, a handoff, the history, a close)
    /// has its answer.
    InputDone {
        /// The input's id.
        input: u64,
        /// Its answer.
        outcome: InputOutcome,
    },
    /// Its worker drains: the session settled (or was interrupted at the drain's
    /// deadline), its last snapshot is stored, and it is moving to another worker. Inputs
    /// sent meanwhile wait for the new owner; `SessionResumed` follows.
    SessionMoving,
    /// A new owner runs the session, restored from its last snapshot (after a drain, or
    /// because the worker before died or lost its lease): the first event of that owner,
    /// at a higher epoch. The snapshot held every input up to `last_input`; the gateway
    /// sends the later ones again. A turn that was under way runs again.
    SessionResumed {
        /// The last input id the restored snapshot holds (0: none).
        last_input: u64,
    },
    /// The session is over on its worker: the last event.
    SessionEnded {
        /// Why it ended.
        reason: EndReason,
    },
    /// Events the gateway could not get back after an outage (the owner no longer had
    /// them): `from..=to` are missing. Delivered with `seq == to`.
    EventsLost {
        /// The first missing sequence number.
        from: u64,
        /// The last missing one.
        to: u64,
    },
    /// The worker fell behind the session's own event channel and missed this many.
    EventsDropped {
        /// How many.
        missed: u64,
    },

    /// The user said something (`SessionEvent::UserInputTranscribed`).
    UserInputTranscribed {
        /// The text.
        text: String,
        /// Whether it is final.
        is_final: bool,
    },
    /// The user started or stopped speaking, or went away.
    UserStateChanged {
        /// The new state.
        state: RemoteUserState,
    },
    /// An agent's chat context was set as a whole.
    ChatContextSet {
        /// The agent.
        agent: String,
        /// Its items now.
        items: Vec<ChatItem>,
    },
    /// An item was added to an agent's chat context.
    ConversationItemAdded {
        /// The agent.
        agent: String,
        /// The item.
        item: ChatItem,
    },
    /// An item of an agent's chat context changed (cut to what the user heard).
    ConversationItemChanged {
        /// The agent.
        agent: String,
        /// Where the item is.
        index: usize,
        /// The item now.
        item: ChatItem,
    },
    /// An item left an agent's chat context.
    ConversationItemRemoved {
        /// The agent.
        agent: String,
        /// Where it was.
        index: usize,
    },
    /// The session decided on a deferred reply.
    DeferredReply {
        /// The agent.
        agent: String,
        /// The call ids it covers.
        call_ids: Vec<String>,
        /// Whether the model was asked to reply (false: an answer already covered them).
        requested: bool,
    },
    /// The calls of one LLM step have their outputs.
    FunctionToolsExecuted {
        /// The agent.
        agent: String,
        /// The calls.
        calls: Vec<FunctionCall>,
        /// Their outputs, in the same order.
        outputs: Vec<FunctionCallOutput>,
    },
    /// An agent's state changed.
    AgentStateChanged {
        /// The agent.
        agent: String,
        /// Its new state.
        state: RemoteAgentState,
    },
    /// The agent started a speech.
    SpeechCreated {
        /// The agent.
        agent: String,
        /// The speech.
        speech: SpeechId,
    },
    /// A speech ended.
    SpeechPlayedOut {
        /// The speech.
        speech: SpeechId,
        /// Whether it was cut short.
        interrupted: bool,
        /// What the user heard, when cut short and the front said.
        heard: Option<String>,
    },
    /// A barge-in turned out false.
    AgentFalseInterruption {
        /// Whether a paused speech resumed.
        resumed: bool,
    },
    /// The conversation moved to another agent.
    AgentHandoff {
        /// The previous agent.
        from: Option<String>,
        /// The new one.
        to: String,
    },
    /// One LLM request ended; what it cost.
    LlmMetrics {
        /// The agent.
        agent: String,
        /// The model that answered.
        llm: String,
        /// From the request to its first chunk, in milliseconds.
        time_to_first_chunk_ms: Option<f64>,
        /// From the request to the end of its stream, in milliseconds.
        duration_ms: f64,
        /// Token usage, when the provider said.
        usage: Option<LlmUsage>,
        /// Whether the stream was dropped or failed before it ended.
        cancelled: bool,
    },
    /// A turn was interrupted.
    TurnInterrupted {
        /// The agent.
        agent: String,
    },
    /// A turn ended: what its requests used and how fast it answered
    /// (`SessionEvent::TurnMetrics`).
    TurnMetrics {
        /// The agent that ran it.
        agent: String,
        /// What its requests used.
        usage: Usage,
        /// How fast it answered.
        latency: TurnLatency,
        /// Whether it was interrupted.
        interrupted: bool,
    },
    /// Words the user said over the agent made no turn (`SessionEvent::UserWordsIgnored`).
    UserWordsIgnored {
        /// What the user said.
        text: String,
        /// Why.
        reason: IgnoredWords,
    },
    /// The user spoke past the user-turn limit (`SessionEvent::UserTurnExceeded`).
    UserTurnExceeded {
        /// Their words since the agent last spoke.
        transcript: String,
        /// How many.
        words: u32,
        /// Since they began, in milliseconds.
        duration_ms: f64,
    },
    /// Something failed; the session is still up.
    Error {
        /// What failed.
        message: String,
    },
    /// The engine closed the session.
    Closed,

    /// Speech output: a speech starts (what a TTS begins).
    SpeechStarted {
        /// The speech.
        speech: SpeechId,
        /// The agent speaking.
        agent: String,
    },
    /// Speech output: a piece of a speech's text, in order.
    SpeechChunk {
        /// The speech.
        speech: SpeechId,
        /// The text.
        text: String,
    },
    /// Speech output: the speech's text is complete. A voice front reports its playout
    /// with `RemoteSession::playout_finished` once the audio ends.
    SpeechFinished {
        /// The speech.
        speech: SpeechId,
    },
    /// Speech output: stop playing this speech now, then report what was heard.
    SpeechInterrupted {
        /// The speech.
        speech: SpeechId,
    },
    /// Speech output: pause this speech (the user talks over it).
    SpeechPaused {
        /// The speech.
        speech: SpeechId,
    },
    /// Speech output: resume a paused speech (the interruption was false).
    SpeechResumed {
        /// The speech.
        speech: SpeechId,
    },
}

impl RemoteEventKind {
    /// The form of an engine event that can travel; `None` for none (every current kind
    /// has one; a kind added to the engine later travels as nothing until mapped here).
    pub(crate) fn from_session_event(event: &SessionEvent) -> Option<Self> {
        Some(match event {
            SessionEvent::UserInputTranscribed { text, is_final } => Self::UserInputTranscribed {
                text: text.clone(),
                is_final: *is_final,
            },
            SessionEvent::UserStateChanged { state } => Self::UserStateChanged {
                state: (*state).into(),
            },
            SessionEvent::ChatContextSet { agent, chat } => Self::ChatContextSet {
                agent: agent.clone(),
                items: chat.items().to_vec(),
            },
            SessionEvent::ConversationItemAdded { agent, item } => Self::ConversationItemAdded {
                agent: agent.clone(),
                item: item.clone(),
            },
            SessionEvent::ConversationItemChanged { agent, index, item } => {
                Self::ConversationItemChanged {
                    agent: agent.clone(),
                    index: *index,
                    item: item.clone(),
                }
            }
            SessionEvent::ConversationItemRemoved { agent, index } => {
                Self::ConversationItemRemoved {
                    agent: agent.clone(),
                    index: *index,
                }
            }
            SessionEvent::DeferredReply {
                agent,
                call_ids,
                decision,
            } => Self::DeferredReply {
                agent: agent.clone(),
                call_ids: call_ids.clone(),
                requested: matches!(decision, DeferredReplyDecision::Requested),
            },
            SessionEvent::FunctionToolsExecuted {
                agent,
                calls,
                outputs,
            } => Self::FunctionToolsExecuted {
                agent: agent.clone(),
                calls: calls.clone(),
                outputs: outputs.clone(),
            },
            SessionEvent::AgentStateChanged { agent, state } => Self::AgentStateChanged {
                agent: agent.clone(),
                state: (*state).into(),
            },
            SessionEvent::SpeechCreated { agent, speech } => Self::SpeechCreated {
                agent: agent.clone(),
                speech: speech.id(),
            },
            SessionEvent::SpeechPlayedOut {
                speech,
                interrupted,
                heard,
            } => Self::SpeechPlayedOut {
                speech: *speech,
                interrupted: *interrupted,
                heard: heard.clone(),
            },
            SessionEvent::AgentFalseInterruption { resumed } => {
                Self::AgentFalseInterruption { resumed: *resumed }
            }
            SessionEvent::AgentHandoff { from, to } => Self::AgentHandoff {
                from: from.clone(),
                to: to.clone(),
            },
            SessionEvent::LlmMetrics(metrics) => Self::LlmMetrics {
                agent: metrics.agent.clone(),
                llm: metrics.llm.clone(),
                time_to_first_chunk_ms: metrics.time_to_first_chunk.map(|d| d.as_secs_f64() * 1e3),
                duration_ms: metrics.duration.as_secs_f64() * 1e3,
                usage: metrics.usage,
                cancelled: metrics.cancelled,
            },
            SessionEvent::TurnInterrupted { agent } => Self::TurnInterrupted {
                agent: agent.clone(),
            },
            SessionEvent::TurnMetrics(metrics) => Self::TurnMetrics {
                agent: metrics.agent.clone(),
                usage: metrics.usage,
                latency: metrics.latency,
                interrupted: metrics.interrupted,
            },
            SessionEvent::UserWordsIgnored { text, reason } => Self::UserWordsIgnored {
                text: text.clone(),
                reason: *reason,
            },
            SessionEvent::UserTurnExceeded {
                transcript,
                words,
                duration,
            } => Self::UserTurnExceeded {
                transcript: transcript.clone(),
                words: *words,
                duration_ms: duration.as_secs_f64() * 1000.0,
            },
            SessionEvent::Error { message } => Self::Error {
                message: message.clone(),
            },
            SessionEvent::Closed => Self::Closed,
            _ => return None,
        })
    }
}

/// What the agent is doing (the engine's `AgentState`, as data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteAgentState {
    /// Starting (`on_enter` runs).
    Initializing,
    /// Waiting for the user.
    Listening,
    /// Waiting for the model or tools.
    Thinking,
    /// Speech is generated or played.
    Speaking,
    /// A state this version of the cluster does not know.
    Other,
}

impl From<AgentState> for RemoteAgentState {
    fn from(state: AgentState) -> Self {
        match state {
            AgentState::Initializing => Self::Initializing,
            AgentState::Listening => Self::Listening,
            AgentState::Thinking => Self::Thinking,
            AgentState::Speaking => Self::Speaking,
            _ => Self::Other,
        }
    }
}

/// What the user is doing (the engine's `UserState`, as data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteUserState {
    /// Speaking.
    Speaking,
    /// Not speaking.
    Listening,
    /// Silent for the session's away timeout.
    Away,
    /// A state this version of the cluster does not know.
    Other,
}

impl From<UserState> for RemoteUserState {
    fn from(state: UserState) -> Self {
        match state {
            UserState::Speaking => Self::Speaking,
            UserState::Listening => Self::Listening,
            UserState::Away => Self::Away,
            _ => Self::Other,
        }
    }
}

/// Why a session ended on its worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EndReason {
    /// The front closed it.
    Closed,
    /// Its worker drained (a deploy, a scale-down): the session settled, or was
    /// interrupted at the drain's deadline, and closed.
    Drained,
    /// No input came for the worker's idle timeout.
    Idle,
    /// Its worker lost ownership (its lease expired and another owner took it): it
    /// stopped without writing anything more.
    Fenced,
}

/// The answer to a host input that takes time, as [`RemoteEventKind::InputDone`] carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum InputOutcome {
    /// A turn (`run`, `generate_reply`) ended.
    Turn {
        /// What it did, or why it failed.
        result: Result<RemoteRunResult, RemoteFailure>,
    },
    /// An operation with no value (`interrupt`, `update_agent`) ended.
    Done {
        /// Whether it worked.
        result: Result<(), RemoteFailure>,
    },
    /// The conversation so far (`history`, and `close`, which returns it at the end).
    History {
        /// The history.
        history: RemoteHistory,
    },
}

/// What a turn did (the engine's `RunResult`, as data).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteRunResult {
    /// What the turn added, in order.
    pub items: Vec<ChatItem>,
    /// Whether it was interrupted.
    pub interrupted: bool,
    /// What its LLM requests used (left out when nothing was counted).
    #[serde(default, skip_serializing_if = "Usage::is_empty")]
    pub usage: Usage,
    /// How fast it answered (left out when nothing was measured).
    #[serde(default, skip_serializing_if = "TurnLatency::is_empty")]
    pub latency: TurnLatency,
}

impl RemoteRunResult {
    /// The assistant's messages of the turn, in order.
    pub fn assistant_messages(&self) -> impl Iterator<Item = &str> {
        self.items.iter().filter_map(|item| match item {
            ChatItem::Message(m) if m.role == switchboard::ChatRole::Assistant => {
                Some(m.content.as_str())
            }
            _ => None,
        })
    }

    /// The function calls of the turn, in order.
    pub fn function_calls(&self) -> impl Iterator<Item = &FunctionCall> {
        self.items.iter().filter_map(|item| match item {
            ChatItem::FunctionCall(call) => Some(call),
            _ => None,
        })
    }
}

impl From<&RunResult> for RemoteRunResult {
    fn from(result: &RunResult) -> Self {
        Self {
            items: result.events.clone(),
            interrupted: result.interrupted,
            usage: result.usage,
            latency: result.latency,
        }
    }
}

/// The conversation of a session (the engine's `SessionHistory`, as data): every
/// activation of every agent, in the order they started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteHistory {
    /// One entry per activation, oldest first.
    pub agents: Vec<RemoteAgentChat>,
}

/// The chat context of one activation of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteAgentChat {
    /// The agent's name.
    pub agent: String,
    /// The activation's id (`activity/s1/booker#2`).
    pub activity: String,
    /// Its chat context.
    pub items: Vec<ChatItem>,
    /// How many of the first items it inherited.
    pub inherited: usize,
    /// Whether it still runs.
    pub live: bool,
}

impl RemoteHistory {
    /// Every item each activation added itself (inherited ones once), with the agent's
    /// name, activation by activation.
    pub fn own_items(&self) -> impl Iterator<Item = (&str, &ChatItem)> {
        self.agents.iter().flat_map(|entry| {
            entry.items[entry.inherited.min(entry.items.len())..]
                .iter()
                .map(move |item| (entry.agent.as_str(), item))
        })
    }

    /// The texts of the user's messages, in order.
    pub fn user_messages(&self) -> Vec<&str> {
        self.own_items()
            .filter_map(|(_, item)| match item {
                ChatItem::Message(m) if m.role == switchboard::ChatRole::User => {
                    Some(m.content.as_str())
                }
                _ => None,
            })
            .collect()
    }

    /// The texts of the agents' messages, in order.
    pub fn assistant_messages(&self) -> Vec<&str> {
        self.own_items()
            .filter_map(|(_, item)| match item {
                ChatItem::Message(m) if m.role == switchboard::ChatRole::Assistant => {
                    Some(m.content.as_str())
                }
                _ => None,
            })
            .collect()
    }
}

impl From<&SessionHistory> for RemoteHistory {
    fn from(history: &SessionHistory) -> Self {
        Self {
            agents: history
                .agents
                .iter()
                .map(|entry| RemoteAgentChat {
                    agent: entry.agent.clone(),
                    activity: entry.activity.as_str().to_owned(),
                    items: entry.chat.items().to_vec(),
                    inherited: entry.inherited,
                    live: entry.live,
                })
                .collect(),
        }
    }
}

/// Why the engine refused or failed a host input (the engine's `SessionError`, as data).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteFailure {
    /// The session is closed.
    #[error("the session is closed")]
    Closed,
    /// The current speech does not allow interruptions (use `force_interrupt`).
    #[error("the current speech does not allow interruptions")]
    Uninterruptible,
    /// Too much work is queued; try again once the turn ran.
    #[error("the session already has {limit} jobs queued")]
    QueueFull {
        /// The limit.
        limit: usize,
    },
    /// An agent could not start here.
    #[error("the agent cannot start: {message}")]
    Build {
        /// Why.
        message: String,
    },
    /// The turn failed (the model, or a tool error routed to propagate); what it did
    /// before is in `result`.
    #[error("the turn failed: {message}")]
    TurnFailed {
        /// Why.
        message: String,
        /// What the turn did before it failed (boxed, as the engine's is: a failure
        /// travels inside every gateway error).
        result: Box<RemoteRunResult>,
    },
    /// The worker's factory could not build what was asked (an unknown agent).
    #[error("{message}")]
    Factory {
        /// Why.
        message: String,
    },
    /// Anything else the engine said.
    #[error("{message}")]
    Engine {
        /// What it said.
        message: String,
    },
}

impl From<&SessionError> for RemoteFailure {
    fn from(err: &SessionError) -> Self {
        match err {
            SessionError::Closed => Self::Closed,
            SessionError::Uninterruptible => Self::Uninterruptible,
            SessionError::QueueFull { limit } => Self::QueueFull { limit: *limit },
            SessionError::Build(build) => Self::Build {
                message: build.to_string(),
            },
            SessionError::TurnFailed { failure, result } => Self::TurnFailed {
                message: failure.to_string(),
                result: Box::new(result.as_ref().into()),
            },
            other => Self::Engine {
                message: other.to_string(),
            },
        }
    }
}
