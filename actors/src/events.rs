//! What the session tells the host: events on a broadcast channel and the result of a
//! turn.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::chat::{ChatContext, ChatItem, ChatRole, FunctionCall, FunctionCallOutput};
use crate::latency::TurnLatency;
use crate::llm::LlmUsage;
use crate::output::SpeechId;
use crate::speech::SpeechHandle;
use crate::usage::Usage;

/// What the user is doing, as the host's input says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UserState {
    /// Speaking (between `user_started_speaking` and `user_stopped_speaking`).
    Speaking,
    /// Not speaking.
    #[default]
    Listening,
    /// Silent, with the agent idle, for the session's `user_away_timeout`.
    Away,
}

/// What became of a deferred reply (see [`SessionEvent::DeferredReply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeferredReplyDecision {
    /// The model is asked to reply; the request's `deferred_call_ids` name the items.
    Requested,
    /// No request: the agent already spoke with every one of the items in view (an
    /// answer it gave in the meantime covered them).
    AlreadyAnswered,
}

/// Work an agent starts on its own, without user input: what
/// `SessionBuilder::max_agent_work` bounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "work", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentWork {
    /// A reply a hook or tool queued (`SessionControl::generate_reply`).
    Reply,
    /// A handoff a tool, hook or turn asked for.
    Handoff {
        /// The agent it would have handed to.
        to: String,
    },
}

impl std::fmt::Display for AgentWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reply => f.write_str("a reply"),
            Self::Handoff { to } => write!(f, "a handoff to {to}"),
        }
    }
}

/// An agent's lifecycle hook, as [`Unfinished::Hook`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentHook {
    /// `AgentBuilder::on_enter`.
    OnEnter,
    /// `AgentBuilder::on_exit`.
    OnExit,
}

impl std::fmt::Display for AgentHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OnEnter => "on_enter",
            Self::OnExit => "on_exit",
        })
    }
}

/// Code the engine does not own that a session stopped waiting for: it had not finished
/// within its grace period (`SessionBuilder::grace_period`), so the engine dropped it and
/// went on. Reported as a [`SessionEvent::Unfinished`] event when it is dropped, and, for a
/// session an [`Engine::drain`](crate::Engine::drain) closed, in its
/// [`DrainedSession::unfinished`](crate::DrainedSession::unfinished).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unfinished {
    /// A tool body still running a grace period after its call was stopped (cancelled, its
    /// agent handed off, the session closed): its future was dropped.
    ToolBody {
        /// The call's id.
        call_id: String,
        /// The tool.
        tool: String,
    },
    /// An agent's hook still running when the session closed: an `on_exit` is given the
    /// grace period, an `on_enter` is dropped with its agent.
    Hook {
        /// The agent.
        agent: String,
        /// Which hook.
        hook: AgentHook,
    },
    /// The snapshot store had not written what the session saved a grace period after the
    /// close began: that many snapshots or deltas were not stored (the store holds an
    /// earlier state of the session).
    SnapshotStore {
        /// Snapshots and deltas the session queued that were not written.
        unwritten: usize,
    },
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ToolBody { call_id, tool } => write!(
                f,
                "the body of {tool} (call {call_id}) did not end within the grace period after it was stopped: dropped"
            ),
            Self::Hook { agent, hook } => write!(
                f,
                "the {hook} hook of {agent} had not returned when the session closed: dropped"
            ),
            Self::SnapshotStore { unwritten } => write!(
                f,
                "the snapshot store did not write the session's last {unwritten} update(s) within the grace period of its close: not stored"
            ),
        }
    }
}

/// What the agent is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentState {
    /// The activity is starting (`on_enter` runs).
    #[default]
    Initializing,
    /// Waiting for the user.
    Listening,
    /// Waiting for the model or for tools.
    Thinking,
    /// Speech is being generated or played out.
    Speaking,
}

/// What one LLM request cost, reported when its stream ends (or is dropped).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmMetrics {
    /// The agent that asked.
    pub agent: String,
    /// The model that answered: its [`Llm::name`](crate::Llm::name), or the one a wrapper
    /// named with [`LlmChunk::ServedBy`](crate::LlmChunk::ServedBy).
    pub llm: String,
    /// From the request to its first chunk (none if no chunk came).
    pub time_to_first_chunk: Option<Duration>,
    /// From the request to the end of its stream.
    pub duration: Duration,
    /// Chunks of text received.
    pub text_chunks: u32,
    /// Tool calls received.
    pub tool_calls: u32,
    /// Token usage, when the provider reported it.
    pub usage: Option<LlmUsage>,
    /// Whether the stream was dropped before it ended (interruption, close) or failed.
    pub cancelled: bool,
}

/// Why words the user said over the agent made no turn (see
/// [`SessionEvent::UserWordsIgnored`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum IgnoredWords {
    /// Only backchannel words ("uh-huh", "right").
    Backchannel,
    /// Fewer words than the interruption's minimum.
    TooFewWords,
    /// The host's classifier said to ignore them.
    Classifier,
    /// The agent's speech could not be interrupted, and the session discards what the
    /// user says then.
    Uninterruptible,
}

/// What one turn cost and how fast it answered (see [`SessionEvent::TurnMetrics`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnMetrics {
    /// The agent that ran the turn.
    pub agent: String,
    /// What its LLM requests used.
    pub usage: Usage,
    /// How fast it answered.
    pub latency: TurnLatency,
    /// Whether it was interrupted.
    pub interrupted: bool,
}

/// An event of the session, delivered to every subscriber.
///
/// New kinds of events may be added: match with a wildcard arm.
///
/// The channel is a bounded broadcast: a subscriber that falls behind is told how many
/// events it missed (`RecvError::Lagged`) instead of growing the queue.
///
/// An event serializes (JSON: an object tagged by `type`, in snake case) to travel to
/// another machine. A speech's handle travels as what names it there, its id and whether
/// it allows interruptions (`{"id": 3, "allow_interruptions": true}`): the handle itself
/// is a link into this engine, so the side that reads the event makes its own: read back
/// alone, a speech's handle names it and is linked to nothing (see
/// [`SpeechHandle`]'s `Deserialize`); the cluster's remote session links each to its
/// session.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionEvent {
    /// The user said something: an interim transcript (`is_final == false`, for display
    /// only) or a final one (a user turn), or text from `Session::run`.
    UserInputTranscribed {
        /// The text.
        text: String,
        /// Whether it is final.
        is_final: bool,
    },
    /// The user started or stopped speaking, or went away.
    UserStateChanged {
        /// The new state.
        state: UserState,
    },
    /// An agent's chat context was set as a whole: when an activation starts (to what it
    /// inherited or was given, maybe nothing), and after a hook rewrote it. With the
    /// three item events below, a subscriber can follow every chat context exactly.
    ChatContextSet {
        /// The agent.
        agent: String,
        /// The chat context now.
        chat: ChatContext,
    },
    /// An item was added to an agent's chat context.
    ConversationItemAdded {
        /// The agent whose chat context grew.
        agent: String,
        /// The item.
        item: ChatItem,
    },
    /// An item of an agent's chat context changed: an assistant message cut to what the
    /// user heard of it.
    ConversationItemChanged {
        /// The agent.
        agent: String,
        /// Where the item is.
        index: usize,
        /// The item now.
        item: ChatItem,
    },
    /// An item left an agent's chat context: an assistant message the user heard none of.
    ConversationItemRemoved {
        /// The agent.
        agent: String,
        /// Where the item was.
        index: usize,
    },
    /// The session decided on a deferred reply: the answer to tool items that arrived
    /// after their step (`/update_n`, `/finished`), coalesced into one reply.
    DeferredReply {
        /// The agent that answers (or would have).
        agent: String,
        /// The items' call ids the reply covers, oldest first.
        call_ids: Vec<String>,
        /// Whether a reply was asked of the model.
        decision: DeferredReplyDecision,
    },
    /// The calls of one LLM step have their outputs.
    FunctionToolsExecuted {
        /// The agent that made the calls.
        agent: String,
        /// The calls.
        calls: Vec<FunctionCall>,
        /// Their outputs, in the same order.
        outputs: Vec<FunctionCallOutput>,
    },
    /// The agent's state changed.
    AgentStateChanged {
        /// The agent.
        agent: String,
        /// Its new state.
        state: AgentState,
    },
    /// The agent started a speech.
    SpeechCreated {
        /// The agent.
        agent: String,
        /// The speech (its handle: interrupt it, wait for its playout).
        speech: SpeechHandle,
    },
    /// A speech ended: played out in full, or cut short with what the user heard (a
    /// queued speech interrupted before it started, which had no `SpeechCreated`, ends
    /// with this too, heard nothing).
    SpeechPlayedOut {
        /// The speech.
        speech: SpeechId,
        /// Whether it was cut short.
        interrupted: bool,
        /// What the user heard, when cut short and the output said.
        heard: Option<String>,
    },
    /// The user talked over the agent, but not for long enough and without words: the
    /// interruption was false. `resumed` says whether the paused speech went on (a
    /// pausable output) or was simply never stopped.
    AgentFalseInterruption {
        /// Whether a paused speech was resumed.
        resumed: bool,
    },
    /// The conversation moved to another agent.
    AgentHandoff {
        /// The previous agent.
        from: Option<String>,
        /// The new current agent.
        to: String,
    },
    /// One LLM request ended; what it cost.
    LlmMetrics(LlmMetrics),
    /// A turn ended: what its requests used and how fast it answered, for the agent that
    /// ran it (after a handoff, the new agent's turns report under its name).
    TurnMetrics(TurnMetrics),
    /// Words the user said while the agent spoke made no turn and did not interrupt it
    /// (a backchannel, too few words, the classifier's call, an uninterruptible speech).
    /// Whether they went into the chat anyway is the host's choice
    /// (`Backchannel::keep_in_transcript`).
    UserWordsIgnored {
        /// What the user said.
        text: String,
        /// Why it made no turn.
        reason: IgnoredWords,
    },
    /// The user spoke longer than the turn handling's user-turn limit without the agent
    /// answering (see `UserTurnLimit`).
    UserTurnExceeded {
        /// The user's words since the agent last spoke.
        transcript: String,
        /// How many words that is.
        words: u32,
        /// How long since the user began.
        duration: Duration,
    },
    /// A turn was interrupted (`Session::interrupt`, a preempting handoff, a dropped
    /// `run` future): its LLM stream was dropped and its calls got their outputs.
    TurnInterrupted {
        /// The agent whose turn it was.
        agent: String,
    },
    /// The agents started as much work on their own since the last user input as the
    /// session allows (`SessionBuilder::max_agent_work`), and more was refused: a chain
    /// of handoffs and replies no user asked for (a runaway model or hook). Sent once per
    /// user input, at the first refusal; the session stays usable and the next user input
    /// lets the agents go on.
    AgentWorkRefused {
        /// The agent that asked (current when it was refused).
        agent: String,
        /// What was refused.
        work: AgentWork,
        /// The limit that was reached.
        limit: u32,
    },
    /// The connection to a realtime model is being replaced: it dropped (`reason` says
    /// how), or it reached its age limit. The next connection is set up and the
    /// conversation replayed as text before anything else is asked of the model.
    RealtimeReconnecting {
        /// The model.
        model: String,
        /// Why.
        reason: String,
    },
    /// Another writer claimed this session in its snapshot store (a restore of what this
    /// session saved, in this process or another: `SessionBuilder::restore_from`; a
    /// takeover, such as a cluster's new owner), and the store refused this session's save
    /// ([`StoreError::Fenced`](crate::StoreError::Fenced)). The session saves nothing more
    /// from now on: the conversation goes on where the newer claimant runs it, and what
    /// this one does from here is not kept. Sent once. A host should close this session
    /// and send the user to the one that claimed it; to take the conversation back here
    /// instead, take it over in the store
    /// ([`ClaimRule::Takeover`](crate::ClaimRule::Takeover), which fences the other).
    Fenced {
        /// What the store said.
        reason: String,
    },
    /// The session stopped waiting for code it does not own (a tool body, a hook, the
    /// snapshot store) that had not finished within its grace period, and dropped it.
    Unfinished(Unfinished),
    /// Something failed; the session is still up.
    Error {
        /// What failed, with its causes.
        message: String,
    },
    /// The session closed; no event follows.
    Closed,
}

/// The outcome of one turn (`session.run`, `session.generate_reply`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// What the turn added, in order: messages, function calls and outputs, handoffs.
    pub events: Vec<ChatItem>,
    /// Whether the turn was interrupted before it ended on its own: its LLM stream was
    /// dropped, no further step ran, and every call it made got an output.
    pub interrupted: bool,
    /// What the turn's LLM requests used (its share of `Session::usage`).
    #[serde(default)]
    pub usage: Usage,
    /// How fast the turn answered.
    #[serde(default)]
    pub latency: TurnLatency,
}

impl RunResult {
    /// The assistant's messages of the turn, in order.
    pub fn assistant_messages(&self) -> impl Iterator<Item = &str> {
        self.events.iter().filter_map(|item| match item {
            ChatItem::Message(m) if m.role == ChatRole::Assistant => Some(m.content.as_str()),
            _ => None,
        })
    }

    /// The function calls of the turn, in order.
    pub fn function_calls(&self) -> impl Iterator<Item = &FunctionCall> {
        self.events.iter().filter_map(|item| match item {
            ChatItem::FunctionCall(c) => Some(c),
            _ => None,
        })
    }

    /// The function call outputs of the turn, in order.
    pub fn function_outputs(&self) -> impl Iterator<Item = &FunctionCallOutput> {
        self.events.iter().filter_map(|item| match item {
            ChatItem::FunctionCallOutput(o) => Some(o),
            _ => None,
        })
    }

    /// The agent the turn handed off to, if it did.
    pub fn handoff(&self) -> Option<&str> {
        self.events.iter().find_map(|item| match item {
            ChatItem::AgentHandoff { to, .. } => Some(to.as_str()),
            _ => None,
        })
    }
}
