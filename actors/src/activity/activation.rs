//! The activation machine: one activation of an agent — its chat context, its turn, its
//! speeches, its barge-in, the tool items pending for a deferred reply — as a plain type.
//! `ActivityActor` feeds it every input and carries out the commands it returns; nothing
//! here sends a message, spawns or arms a timer.
//!
//! # States
//!
//! ```text
//!  Created ──Enter──▶ Entering ──Entered──▶ Listening ◀──turn ends── Running(turn)
//!     │                  │                   │    └──────RunTurn──────▶ │
//!     │                  │                   └──Pause──▶ Paused(turn?) ◀┘ Pause
//!     │                  │                      Resume: back to Listening or Running
//!     └──────────────────┴─ Close (from any state) ─▶ Closing{turn?} ──ToolsetsStopped──▶ Closed
//! ```
//!
//! Each state owns what it holds: a turn exists only in `Running`, `Paused` (the turn whose
//! tool awaits a sub-task, or whose speech still plays) and `Closing`; whether the
//! activation was ever entered (and so belongs in the session's history) is part of
//! `Closing` and `Closed`. A turn's own phase — generating, calling, playing — is in
//! [`Phase`].
//!
//! # Inputs and commands
//!
//! [`Activation::handle`] takes every [`Input`] (a chunk, a stream's end, a call's output,
//! an interruption, a pause, a resume, a close, a playout report, the user's voice, a
//! timer, tool items) and pushes the [`Command`]s the actor must carry out: open or cancel
//! a stream, run a tool, interrupt a step, stop runs or toolsets, run a hook, arm the one
//! timer. Two ports are called directly, because each is a plain call that answers at once
//! and its answer is part of the next decision: the host's speech output (`speech_finished`
//! says whether playout is done; `can_pause` decides a barge-in) and the session's event
//! channel (an event is built only when someone listens). A turn's answer and the answers
//! to interruptions are oneshot replies the machine sends itself.
//!
//! # Decisions, each with a unit test below
//!
//! - A turn starts only when the activation listens; anywhere else it is answered at once.
//! - What a model sends is bounded as it arrives (`turn.rs`, one size rule): a call's
//!   oversized name or arguments leave a short stand-in and the call is refused; the chunk
//!   that takes a step's text over `max_reply_bytes` is cut there and ends the step,
//!   failed (`TurnFailure::ReplyTooLong`), its calls unrun.
//! - Which calls of a step are refused, and whether a step goes on (`turn.rs`).
//! - A step's calls and outputs go into the chat context together, once the last output
//!   is in (the ledger); a paused activation commits on resume.
//! - An interruption is refused when the turn holds interruptions off and it is not
//!   forced; otherwise the stream is cut, the output told to stop, the step's calls get
//!   their outputs, no further step runs, and the waiter is answered once the turn ended.
//! - A deferred reply is due unless an assistant message was generated with the newest
//!   pending item in view (judged by chat position); items the agent lacks are inserted
//!   first. It is decided here, in one place.
//! - Tool items land only while the activation is current; a pause or close refuses the
//!   tools' held items, keeps the session-scoped pending ones for the next agent, and
//!   drops its own.
//! - A playout report applies once, to the message of its own speech: the first report
//!   counts, a repeated or late one changes nothing. It cuts the message where the heard
//!   text falls in what was said (`heard.rs`), never to new words. A report that comes
//!   while the text still streams is applied when the stream ends.
//! - A close tells the output to stop every speech of the turn still playing, a paused
//!   one too, and ends the barge-in.
//! - Barge-in (`barge_in.rs`) pauses, interrupts or resumes; the next deadline of the
//!   barge-in or of an interrupted turn's wait for its reports is the one timer armed.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::barge_in::{BargeAction, BargeIn, BargeInRules};
use super::latency::TurnTimer;
use super::ledger::{cut_to_heard, output_call_id, Cut, Ledger, Sink};
use super::preflight::Preflight;
use super::turn::{
    bound_call, bound_text, refusal, Ask, Ending, Generation, InputLimits, InterruptWaiter,
    ModelCall, Phase, Redo, StepEnd, ToolsetKey, Turn, TurnKind, TurnOutcome, TurnReport,
};

mod state;
use crate::agent::{Agent, TurnDecision};
use crate::chat::{ChatContext, ChatItem, ChatMessage, ChatRole, FunctionCall};
use crate::delivery::{DeliveryAnswer, Scope};
use crate::error::{SessionError, TurnFailure, UpdateError};
use crate::events::{AgentState, DeferredReplyDecision, LlmMetrics, SessionEvent, TurnMetrics};
use crate::history::{AgentChat, SubTaskOf};
use crate::ids::ActorId;
use crate::llm::{LlmChunk, LlmRequest, LlmUsage, ToolChoice, ToolSchema};
use crate::outcome::{excerpt, panic_message, CallOutput, StoppedCall, QUOTE_LIMIT};
use crate::output::{Playout, SpeechId};
use crate::prompts::ReplyPromptArgs;
use crate::realtime::Model;
use crate::shared::SessionShared;
use crate::speech::{Interruptibility, SpeechHandle, SpeechOutcome, SpeechPort, SpeechStatus};
use crate::telemetry::Cause;
use crate::usage::Usage;
pub(crate) use state::{ActivationState, Decided, Part, Restored};

/// How long an interrupted turn waits for its output to report what the user heard of
/// its cut speeches, before it ends without knowing.
pub(crate) const CUT_REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// A tool output waiting for the deferred reply. Written into snapshots as it is.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PendingItem {
    pub(crate) scope: Scope,
    /// The output's call id (`{id}/update_n` or `{id}/finished`).
    pub(crate) call_id: String,
    pub(crate) items: Arc<[ChatItem]>,
}

/// Where the activation is; each state owns what it holds.
pub(crate) enum State {
    /// Spawned with its start data; `on_enter` has not started.
    Created,
    /// `on_enter` runs.
    Entering,
    /// Current and idle: takes a turn.
    Listening,
    /// Current, running a turn.
    Running(Box<Turn>),
    /// Paused under a sub-task, with the turn whose tool awaits the task (or whose speech
    /// still plays), if any.
    Paused(Option<Box<Turn>>),
    /// `on_exit` and the stop of its toolsets run; the turn ends when they are done.
    Closing {
        entered: bool,
        turn: Option<Box<Turn>>,
        reason: Arc<str>,
    },
    /// Done: nothing lands any more.
    Closed { entered: bool },
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Entering => "entering",
            Self::Listening => "listening",
            Self::Running(_) => "running",
            Self::Paused(_) => "paused",
            Self::Closing { .. } => "closing",
            Self::Closed { .. } => "closed",
        }
    }

    /// Whether this is the session's current agent (it takes turns and tool items).
    fn is_current(&self) -> bool {
        matches!(self, Self::Entering | Self::Listening | Self::Running(_))
    }
}

/// Everything that happens to an activation.
pub(crate) enum Input {
    /// `StartActivity`: start (`on_enter` is about to run).
    Enter,
    /// `on_enter` returned.
    Entered,
    /// Run one turn; `done` hears its outcome.
    RunTurn {
        kind: TurnKind,
        done: oneshot::Sender<TurnOutcome>,
        /// Who asked: the turn's span goes under its span (telemetry).
        cause: Cause,
    },
    /// A chunk of step `step`'s stream.
    Chunk { step: u64, chunk: LlmChunk },
    /// Step `step`'s stream ended: on its own, with the model's error, or cut by the
    /// machine itself (its text went over the limit).
    StreamEnded {
        step: u64,
        failure: Option<TurnFailure>,
    },
    /// The immediate output of call `index` of step `step`.
    CallOutput {
        step: u64,
        index: usize,
        output: CallOutput,
    },
    /// Stop the running turn now; `waiter` hears once it ended (or that it may not).
    Interrupt {
        force: bool,
        waiter: InterruptWaiter,
    },
    /// A handle asked to interrupt `speech`.
    InterruptSpeech { speech: SpeechId, force: bool },
    /// The session asks for a preemptive request with the user's words so far (they
    /// wait for the end of the user's turn); none: drop the one under way.
    Preflight { text: Option<String> },
    /// The user started speaking.
    UserStartedSpeaking { at: Instant },
    /// The user stopped speaking.
    UserStoppedSpeaking { at: Instant },
    /// A transcript with words arrived; the session judged whether its words interrupt
    /// the agent (without a word rule, any words do).
    UserTranscript {
        is_final: bool,
        interrupts: bool,
        at: Instant,
    },
    /// A realtime model transcribed a user turn that started before its words came: the
    /// oldest user message still without words gets them.
    UserTranscribed { text: String },
    /// The output reported the end of a speech's playout.
    Playout {
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
    },
    /// A run's later items (`/update_n`, `/finished`).
    Deliver {
        scope: Scope,
        base_call_id: String,
        items: Vec<ChatItem>,
        reply: bool,
        answer: DeliveryAnswer,
    },
    /// Items the session wrote (terminal outputs of session runs at close).
    Append(Vec<ChatItem>),
    /// A sub-task starts: pause, stopping own runs but those in `spare`.
    Pause { spare: Vec<u64> },
    /// The runs a pause stopped are gone; `calls` ran in the background.
    RunsStopped {
        calls: Vec<StoppedCall>,
        reason: Arc<str>,
    },
    /// The sub-task ended; `carried` are the session-scoped items pending in it.
    Resume { carried: Vec<PendingItem> },
    /// End the activation (handoff, end of a task, session close).
    Close { reason: Arc<str> },
    /// `on_exit` returned.
    ExitHookDone,
    /// Every own toolset is gone; `calls` ran in the background.
    ToolsetsStopped { calls: Vec<StoppedCall> },
    /// The armed timer fired.
    Timer { now: Instant },
    /// The actor stopped, whoever stopped it.
    Stopped,
}

/// What the actor must do.
#[derive(Debug)]
pub(crate) enum Command {
    /// Run `on_enter`, then feed `Entered`.
    RunEnterHook,
    /// Run `on_exit`, then feed `ExitHookDone`.
    RunExitHook,
    /// Open the LLM request of step `step` and feed its chunks and end. `adopt`: the first
    /// step of a heard turn, whose answer a realtime model's server already started.
    OpenStream {
        step: u64,
        request: LlmRequest,
        span: tracing::Span,
        adopt: bool,
    },
    /// Drop step `step`'s stream (which closes an HTTP request).
    CancelStream { step: u64 },
    /// Send call `index` of step `step` to its toolset; feed its output.
    RunTool {
        step: u64,
        index: usize,
        toolset: ToolsetKey,
        call: FunctionCall,
        interruptibility: Arc<Interruptibility>,
        speech: Option<SpeechHandle>,
        /// The turn's span, the run's parent (telemetry).
        cause: Cause,
    },
    /// Answer a companion call (`get_running_tasks`, `cancel_task`) by asking every
    /// toolset; feed its output.
    AnswerCompanion {
        step: u64,
        index: usize,
        call: FunctionCall,
    },
    /// The step was interrupted: tell each toolset with calls of it.
    InterruptStep {
        step: u64,
        toolsets: Vec<ToolsetKey>,
    },
    /// Pause: stop every run of the own toolsets but `except`; feed `RunsStopped`.
    StopRuns { except: Vec<u64>, reason: Arc<str> },
    /// Close: stop the own toolsets (awaited); feed `ToolsetsStopped`.
    StopToolsets { reason: Arc<str> },
    /// Feed `Timer` at `at` (one timer is enough: the machine asks again for the next).
    ArmTimer { at: Instant },
}

/// The tools an activation sees, by name, and what it shows the model.
pub(crate) struct Tools {
    /// Tool name → the toolset that runs it.
    pub(crate) routes: HashMap<String, ToolsetKey>,
    /// Every schema, in a stable order (bare tools, agent toolsets, session toolsets,
    /// companions), shared by every request.
    pub(crate) schemas: Arc<[ToolSchema]>,
    /// Whether `get_running_tasks` and `cancel_task` are exposed.
    pub(crate) companions: bool,
}

/// Where an activation goes in the session's history.
#[derive(Clone, Debug)]
pub(crate) struct Place {
    /// Its place in start order.
    pub(crate) order: u32,
    /// How many items it was given at start.
    pub(crate) inherited: usize,
    pub(crate) sub_task_of: Option<SubTaskOf>,
}

/// Everything an activation starts from.
pub(crate) struct Setup {
    pub(crate) id: ActorId,
    pub(crate) agent: Agent,
    /// The model (its name goes in the metrics when the stream does not name another).
    pub(crate) llm: Model,
    pub(crate) shared: Arc<SessionShared>,
    /// How its speeches' handles reach the session.
    pub(crate) speech_port: Arc<dyn SpeechPort>,
    pub(crate) tools: Tools,
    /// The chat context it starts from.
    pub(crate) chat: ChatContext,
    pub(crate) order: u32,
    /// How many of its first items it inherited, when not all of `chat` (a restored
    /// activation, whose chat has grown since it started).
    pub(crate) inherited: Option<usize>,
    pub(crate) sub_task_of: Option<SubTaskOf>,
    /// The agent it takes over from, recorded as a handoff item.
    pub(crate) handoff_from: Option<String>,
    /// Session-scoped items pending for a deferred reply, carried over from the agent
    /// before it.
    pub(crate) carried: Vec<PendingItem>,
}

/// Where a turn's step is committed from: the current activation goes on to the next
/// step, a paused one holds the step until it resumes, a closing one commits and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Current,
    Paused,
    Closing,
}

/// The limits and timings an activation applies.
#[derive(Clone, Copy, Debug)]
struct Rules {
    max_tool_steps: u32,
    limits: InputLimits,
    /// Whether its turns may be interrupted, unless a `say` says otherwise (agent's
    /// setting, else the session's).
    allow_interruptions: bool,
    barge: BargeInRules,
    /// Whether it takes preemptive requests (the session decides when to ask).
    preemptive: bool,
}

/// The activation machine (see the module docs).
pub(crate) struct Activation {
    id: ActorId,
    agent: Agent,
    llm: Model,
    shared: Arc<SessionShared>,
    speech_port: Arc<dyn SpeechPort>,
    rules: Rules,
    tools: Tools,
    place: Place,
    handoff_from: Option<String>,
    state: State,
    ledger: Ledger,
    /// Chat length the latest assistant message was generated from.
    last_reply_view: usize,
    /// Items that landed here and ask for a deferred reply.
    pending: Vec<PendingItem>,
    /// Session-scoped pending items a pause or close handed back, for the next agent.
    carried: Vec<PendingItem>,
    barge_in: BargeIn,
    /// A preemptive request under way, while it listens.
    preflight: Option<Preflight>,
    /// Whether it is current now (set from the state after each input): only the current
    /// activation publishes the agent's state.
    current: bool,
    /// A turn ended during the input being handled.
    turn_ended: bool,
    /// The timer the actor has armed, if any.
    armed: Option<Instant>,
}

impl Activation {
    pub(crate) fn new(setup: Setup) -> Self {
        let config = &setup.shared.settings.config;
        let turn_rules = setup.shared.settings.turn_rules(&setup.agent);
        let rules = Rules {
            max_tool_steps: config.max_tool_steps,
            limits: InputLimits {
                max_calls_per_step: config.max_calls_per_step,
                max_argument_bytes: config.max_argument_bytes,
                max_reply_bytes: setup
                    .agent
                    .def
                    .max_reply_bytes
                    .unwrap_or(config.max_reply_bytes),
            },
            allow_interruptions: setup
                .agent
                .def
                .allow_interruptions
                .unwrap_or(config.allow_interruptions),
            barge: BargeInRules {
                // A realtime model's server heard the user already, and has cancelled its
                // answer if one ran: the interruption is real at once, words or not.
                min_duration: match setup.llm {
                    Model::Realtime(_) => Duration::ZERO,
                    Model::Text(_) => turn_rules.interruption.min_duration,
                },
                false_timeout: turn_rules.interruption.false_interruption_timeout,
                pause: turn_rules.interruption.resume_false_interruption,
                needs_words: matches!(setup.llm, Model::Text(_)) && turn_rules.needs_words(),
            },
            // A realtime model answers the user's turn itself: nothing to ask ahead.
            preemptive: turn_rules.preemptive.enabled && matches!(setup.llm, Model::Text(_)),
        };
        Self {
            place: Place {
                order: setup.order,
                inherited: setup.inherited.unwrap_or(setup.chat.len()),
                sub_task_of: setup.sub_task_of,
            },
            id: setup.id,
            agent: setup.agent,
            llm: setup.llm,
            shared: setup.shared,
            speech_port: setup.speech_port,
            rules,
            tools: setup.tools,
            handoff_from: setup.handoff_from,
            state: State::Created,
            ledger: Ledger::new(setup.chat),
            last_reply_view: 0,
            pending: setup.carried,
            carried: Vec::new(),
            barge_in: BargeIn::Quiet,
            preflight: None,
            current: false,
            turn_ended: false,
            armed: None,
        }
    }

    /// The speech of step `step` while it generates, started now if it has none yet: a
    /// realtime model's audio, which comes before the step's text, plays through it.
    /// `None` when the step no longer generates.
    pub(crate) fn start_speech(&mut self, step: u64) -> Option<SpeechId> {
        let State::Running(turn) = &mut self.state else {
            return None;
        };
        let Phase::Generating(generation) = &mut turn.phase else {
            return None;
        };
        if generation.step != step {
            return None;
        }
        generation
            .first_chunk
            .get_or_insert_with(|| generation.started.elapsed());
        let speaker = Speaker {
            id: &self.id,
            agent: &self.agent,
            shared: &self.shared,
            port: &self.speech_port,
            current: self.current,
        };
        Some(open_speech(&speaker, turn))
    }

    /// Every tool schema the activation shows its model.
    pub(crate) fn tool_schemas(&self) -> &Arc<[ToolSchema]> {
        &self.tools.schemas
    }

    /// The chat context now (a snapshot: cloning it is a reference count).
    pub(crate) fn chat(&self) -> &ChatContext {
        self.ledger.chat()
    }

    /// Whether it is paused under a sub-task.
    pub(crate) fn is_paused(&self) -> bool {
        matches!(self.state, State::Paused(_))
    }

    /// The session-scoped items pending here that the next agent takes over (after a
    /// pause or close).
    pub(crate) fn take_carried(&mut self) -> Vec<PendingItem> {
        std::mem::take(&mut self.carried)
    }

    /// Its entry in the session's history, with its chat context now; none if it never
    /// started (one spawned but never entered is no part of the conversation).
    pub(crate) fn history_entry(&self, live: bool) -> Option<(u32, AgentChat)> {
        let entered = match &self.state {
            State::Created => false,
            State::Closing { entered, .. } | State::Closed { entered } => *entered,
            _ => true,
        };
        entered.then(|| {
            (
                self.place.order,
                AgentChat {
                    agent: self.agent.name().to_owned(),
                    activity: self.id.clone(),
                    chat: self.ledger.chat().clone(),
                    inherited: self.place.inherited,
                    live,
                    sub_task_of: self.place.sub_task_of.clone(),
                },
            )
        })
    }

    /// Takes one input; pushes what the actor must do onto `out`.
    pub(crate) fn handle(&mut self, input: Input, out: &mut Vec<Command>) {
        // The per-token path: a chunk changes no state and sets no deadline, so it skips
        // the transition table (this is most of a streamed reply's inputs).
        let input = match input {
            Input::Chunk { step, chunk } => {
                let State::Running(turn) = &mut self.state else {
                    // A preemptive request's chunks wait for its turn, unsaid.
                    if let Some(preflight) = self.preflight.as_mut().filter(|p| p.step == step) {
                        preflight.chunk(chunk);
                    }
                    return;
                };
                let speaker = Speaker {
                    id: &self.id,
                    agent: &self.agent,
                    shared: &self.shared,
                    port: &self.speech_port,
                    current: self.current,
                };
                if !on_chunk(&speaker, turn, step, chunk, &self.rules.limits) {
                    return;
                }
                // Over the size limit: the step ends here, failed.
                Input::StreamEnded {
                    step,
                    failure: Some(TurnFailure::ReplyTooLong {
                        limit: self.rules.limits.max_reply_bytes,
                    }),
                }
            }
            other => other,
        };
        // Every transition takes the state and returns the next one.
        let state = std::mem::replace(&mut self.state, State::Closed { entered: false });
        self.state = self.step(state, input, out);
        self.current = self.state.is_current();
        if std::mem::take(&mut self.turn_ended) {
            // The agent listens again (published only if it is still current).
            self.publish(AgentState::Listening);
        }
        self.arm(out);
    }

    fn step(&mut self, state: State, input: Input, out: &mut Vec<Command>) -> State {
        match input {
            Input::Enter => match state {
                State::Created => {
                    self.enter(out);
                    State::Entering
                }
                other => other,
            },
            Input::Entered => match state {
                State::Entering => {
                    self.current = true;
                    self.publish(AgentState::Listening);
                    State::Listening
                }
                other => other,
            },
            Input::RunTurn { kind, done, cause } => match state {
                State::Listening => match self.begin_turn(kind, done, &cause, out) {
                    Some(turn) => State::Running(turn),
                    None => State::Listening,
                },
                other => {
                    // The session sends a turn only to its idle current agent; anything
                    // else means it is no longer current.
                    tracing::debug!(activity = %self.id, state = other.name(), "a turn came to an activity that does not take one");
                    refuse_turn(kind, done);
                    other
                }
            },
            // Taken by `handle` before the table.
            Input::Chunk { .. } => state,
            Input::StreamEnded { step, failure } => match state {
                State::Running(turn) => running(self.on_stream_end(turn, step, failure, out)),
                other => {
                    if let Some(preflight) = self.preflight.as_mut().filter(|p| p.step == step) {
                        preflight.end(failure);
                    }
                    other
                }
            },
            Input::CallOutput {
                step,
                index,
                output,
            } => match state {
                State::Running(turn) => {
                    let turn = self.on_call_output(turn, step, index, output, Where::Current, out);
                    running(turn)
                }
                // Recorded now, committed on resume: the step's items land after the
                // sub-task.
                State::Paused(Some(turn)) => State::Paused(self.on_call_output(
                    turn,
                    step,
                    index,
                    output,
                    Where::Paused,
                    out,
                )),
                State::Closing {
                    entered,
                    turn: Some(turn),
                    reason,
                } => State::Closing {
                    entered,
                    turn: self.on_call_output(turn, step, index, output, Where::Closing, out),
                    reason,
                },
                other => other,
            },
            Input::Interrupt { force, waiter } => match state {
                State::Running(turn) => match self.try_interrupt(turn, force, out) {
                    Ok(Some(mut turn)) => {
                        turn.waiters.push(waiter);
                        State::Running(turn)
                    }
                    Ok(None) => {
                        let _ = waiter.send(Ok(()));
                        State::Listening
                    }
                    Err(turn) => {
                        let _ = waiter.send(Err(SessionError::Uninterruptible));
                        State::Running(turn)
                    }
                },
                other => {
                    // No turn of the current agent runs: nothing to stop.
                    let _ = waiter.send(Ok(()));
                    other
                }
            },
            Input::InterruptSpeech { speech, force } => match state {
                State::Running(turn) if turn.owns(speech) => {
                    match self.try_interrupt(turn, force, out) {
                        Ok(turn) => running(turn),
                        Err(turn) => State::Running(turn),
                    }
                }
                State::Paused(Some(turn)) if turn.owns(speech) => {
                    // A paused caller's speech still playing: stop its playout; the
                    // report ends it.
                    self.shared.output.call(|output| output.interrupt(speech));
                    State::Paused(Some(turn))
                }
                other => other,
            },
            Input::Preflight { text } => {
                match text {
                    Some(text) if matches!(state, State::Listening) && self.rules.preemptive => {
                        self.start_preflight(text, out)
                    }
                    _ => self.drop_preflight(out),
                }
                state
            }
            Input::UserStartedSpeaking { at } => {
                let interruptible = matches!(&state, State::Running(turn) if turn.interruptible());
                let can_pause = interruptible && self.shared.output.call(|o| o.can_pause());
                let action =
                    self.barge_in
                        .user_started(at, interruptible, can_pause, &self.rules.barge);
                self.barge(state, action, out)
            }
            Input::UserStoppedSpeaking { at } => {
                let action = self.barge_in.user_stopped(at, &self.rules.barge);
                self.barge(state, action, out)
            }
            Input::UserTranscript {
                is_final,
                interrupts,
                at,
            } => {
                let action = if interrupts {
                    self.barge_in.words_interrupt(at, &self.rules.barge)
                } else {
                    self.barge_in.words_hold(is_final)
                };
                let state = self.barge(state, action, out);
                match state {
                    // A user turn goes first: the running turn stops if it allows it.
                    State::Running(turn) if is_final && interrupts && !turn.interrupted => {
                        match self.try_interrupt(turn, false, out) {
                            Ok(turn) => running(turn),
                            Err(turn) => State::Running(turn),
                        }
                    }
                    other => other,
                }
            }
            Input::UserTranscribed { text } => {
                let mut state = state;
                let events = match &mut state {
                    State::Running(turn) | State::Paused(Some(turn)) => Some(&mut turn.events),
                    _ => None,
                };
                self.fill_user_words(events, text);
                state
            }
            Input::Playout {
                speech,
                interrupted,
                heard,
            } => match state {
                State::Running(mut turn) => {
                    if self.report_while_generating(&mut turn, speech, interrupted, &heard) {
                        return State::Running(turn);
                    }
                    self.apply_report(Some(&mut turn), speech, interrupted, heard);
                    running(self.finish_if_played(turn))
                }
                State::Paused(Some(mut turn)) => {
                    self.apply_report(Some(&mut turn), speech, interrupted, heard);
                    State::Paused(self.finish_if_played(turn))
                }
                State::Closing {
                    entered,
                    turn: Some(mut turn),
                    reason,
                } => {
                    self.apply_report(Some(&mut turn), speech, interrupted, heard);
                    State::Closing {
                        entered,
                        turn: Some(turn),
                        reason,
                    }
                }
                other => {
                    self.apply_report(None, speech, interrupted, heard);
                    other
                }
            },
            Input::Deliver {
                scope,
                base_call_id,
                items,
                reply,
                answer,
            } => {
                if !state.is_current() {
                    answer.send(Err(UpdateError::ScopeClosed {
                        call_id: base_call_id,
                    }));
                    return state;
                }
                let pending = reply
                    .then(|| output_call_id(&items))
                    .flatten()
                    .map(|call_id| PendingItem {
                        scope,
                        call_id,
                        items: Arc::from(items.clone()),
                    });
                self.with_ledger(None, |ledger, sink| {
                    ledger.insert(&base_call_id, items, answer, sink)
                });
                self.pending.extend(pending);
                state
            }
            Input::Append(items) => {
                self.with_ledger(None, |ledger, sink| {
                    for item in items {
                        ledger.append(item, sink);
                    }
                });
                state
            }
            Input::Pause { spare } => {
                self.drop_preflight(out);
                self.pause(state, spare, out)
            }
            Input::RunsStopped { calls, reason } => {
                self.with_ledger(None, |ledger, sink| {
                    ledger.write_terminal(calls, &reason, sink)
                });
                state
            }
            Input::Resume { carried } => match state {
                State::Paused(turn) => {
                    self.pending.extend(carried);
                    self.current = true;
                    match turn {
                        Some(turn) => running(self.maybe_commit(turn, Where::Current, out)),
                        None => {
                            self.publish(AgentState::Listening);
                            State::Listening
                        }
                    }
                }
                other => {
                    self.carried.extend(carried);
                    other
                }
            },
            Input::Close { reason } => {
                self.drop_preflight(out);
                self.close(state, reason, out)
            }
            Input::ExitHookDone => {
                if let State::Closing { reason, .. } = &state {
                    out.push(Command::StopToolsets {
                        reason: reason.clone(),
                    });
                }
                state
            }
            Input::ToolsetsStopped { calls } => self.closed(state, calls),
            Input::Timer { now } => {
                self.armed = None;
                let action = self.barge_in.tick(now, &self.rules.barge);
                let state = self.barge(state, action, out);
                match state {
                    State::Running(turn) => running(self.give_up_if_due(turn, now)),
                    State::Paused(Some(turn)) => State::Paused(self.give_up_if_due(turn, now)),
                    other => other,
                }
            }
            Input::Stopped => {
                self.drop_preflight(out);
                let entered = match &state {
                    State::Created => false,
                    State::Closing { entered, .. } | State::Closed { entered } => *entered,
                    _ => true,
                };
                self.refuse_held();
                let turn = match state {
                    State::Running(turn) => Some(turn),
                    State::Paused(turn) | State::Closing { turn, .. } => turn,
                    _ => None,
                };
                if let Some(turn) = turn {
                    self.finish_now(turn, TurnOutcome::failed(SessionError::Closed));
                }
                State::Closed { entered }
            }
        }
    }

    /// Arms the one timer for the next deadline, unless one at or before it is armed.
    fn arm(&mut self, out: &mut Vec<Command>) {
        let turn_deadline = match &self.state {
            State::Running(turn) | State::Paused(Some(turn)) => match &turn.phase {
                Phase::Playing { give_up_at, .. } => *give_up_at,
                _ => None,
            },
            _ => None,
        };
        let next = match (self.barge_in.deadline(&self.rules.barge), turn_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(next) = next else {
            return;
        };
        if self.armed.is_some_and(|armed| armed <= next) {
            return;
        }
        self.armed = Some(next);
        out.push(Command::ArmTimer { at: next });
    }

    /// The fields a speech is made and announced with.
    fn speaker(&self) -> Speaker<'_> {
        Speaker {
            id: &self.id,
            agent: &self.agent,
            shared: &self.shared,
            port: &self.speech_port,
            current: self.current,
        }
    }

    /// Publishes what the agent does, if this activation is current.
    fn publish(&self, state: AgentState) {
        self.speaker().publish(state);
    }

    fn agent_name(&self) -> String {
        self.agent.name().to_owned()
    }

    /// Runs `f` on the ledger with a sink that emits each appended item and, given a
    /// turn, adds it to the turn's events.
    fn with_ledger<R>(
        &mut self,
        turn: Option<&mut Vec<ChatItem>>,
        f: impl FnOnce(&mut Ledger, Sink<'_>) -> R,
    ) -> R {
        let events = &self.shared.events;
        let agent = &self.agent;
        let mut turn = turn;
        let mut sink = |item: &ChatItem| {
            events.emit_with(|| SessionEvent::ConversationItemAdded {
                agent: agent.name().to_owned(),
                item: item.clone(),
            });
            if let Some(turn) = turn.as_mut() {
                turn.push(item.clone());
            }
        };
        f(&mut self.ledger, &mut sink)
    }

    /// Appends an item that belongs to the turn (a message).
    fn record(&mut self, events: &mut Vec<ChatItem>, item: ChatItem) {
        self.with_ledger(Some(events), |ledger, sink| ledger.append(item, sink));
    }

    /// A realtime model's transcript of a heard turn that started without it: the oldest
    /// user message still without words gets them, in the chat context and, if the turn
    /// still runs, in its events.
    fn fill_user_words(&mut self, events: Option<&mut Vec<ChatItem>>, text: String) {
        let unfilled = |item: &ChatItem| matches!(item, ChatItem::Message(m) if m.role == ChatRole::User && m.content.is_empty());
        let Some(index) = self.ledger.chat().items().iter().position(unfilled) else {
            return;
        };
        if let Some(events) = events {
            if let Some(ChatItem::Message(m)) = events.iter_mut().find(|item| unfilled(item)) {
                m.content = text.clone();
            }
        }
        let item = self.ledger.chat_mut().edit(|items| {
            let item = items.get_mut(index)?;
            if let ChatItem::Message(m) = item {
                m.content = text;
            }
            Some(item.clone())
        });
        if let Some(item) = item {
            self.shared
                .events
                .emit_with(|| SessionEvent::ConversationItemChanged {
                    agent: self.agent_name(),
                    index,
                    item,
                });
        }
    }

    /// Refuses the tools' held items, and forgets them in the pending reply.
    fn refuse_held(&mut self) {
        let refused = self.ledger.refuse_held();
        if !refused.is_empty() {
            self.pending.retain(|p| !refused.contains(&p.call_id));
        }
    }

    // ---- Entering -------------------------------------------------------------------

    fn enter(&mut self, out: &mut Vec<Command>) {
        self.current = true;
        self.shared
            .events
            .emit_with(|| SessionEvent::ChatContextSet {
                agent: self.agent.name().to_owned(),
                chat: self.ledger.chat().clone(),
            });
        if let Some(from) = self.handoff_from.take() {
            let item = ChatItem::AgentHandoff {
                from: Some(from),
                to: self.agent_name(),
            };
            self.with_ledger(None, |ledger, sink| ledger.append(item, sink));
        }
        self.publish(AgentState::Initializing);
        out.push(Command::RunEnterHook);
    }

    // ---- Turns ----------------------------------------------------------------------

    /// Starts a turn: returns it while it runs, `None` when it ended at once. A user turn
    /// whose words and chat a preemptive request answers takes it over; any other turn
    /// drops it.
    fn begin_turn(
        &mut self,
        kind: TurnKind,
        done: oneshot::Sender<TurnOutcome>,
        cause: &Cause,
        out: &mut Vec<Command>,
    ) -> Option<Box<Turn>> {
        let (session, telemetry) = (&self.shared.span, &self.shared.telemetry);
        let span = tracing::info_span!(
            parent: cause.parent(session, telemetry),
            "turn",
            session = %self.shared.id(),
            agent = %self.agent.name(),
            kind = kind.name(),
            "gen_ai.operation.name" = "invoke_agent",
            "gen_ai.agent.name" = %self.agent.name(),
            "gen_ai.conversation.id" = %self.shared.id(),
        );
        cause.link(&span, session, telemetry);
        let timer = TurnTimer::new(cause.at().unwrap_or_else(Instant::now), kind.name());
        let interruptibility = match &kind {
            TurnKind::Say { speech, .. } => speech.interruptibility().clone(),
            // The user spoke past their limit: the reply that cuts in is not theirs to cut.
            TurnKind::CutIn { .. } => Interruptibility::new(false),
            _ => Interruptibility::new(self.rules.allow_interruptions),
        };
        if !matches!(kind, TurnKind::Backchannel(_)) {
            self.publish(AgentState::Thinking);
        }
        let mut preflight = self.preflight.take();
        let mut adopted = None;
        let mut events = Vec::new();
        let mut speeches = Vec::new();
        let mut redone = None;
        let mut adopt = false;
        let ask = match kind {
            TurnKind::User(text) => {
                self.shared.events.emit(SessionEvent::UserInputTranscribed {
                    text: text.clone(),
                    is_final: true,
                });
                let mut message = user_message(text);
                let decision = self.user_turn_hook(&mut message);
                let fits = decision == TurnDecision::Reply
                    && preflight
                        .as_ref()
                        .is_some_and(|p| p.fits(self.ledger.chat(), &message));
                match preflight.take_if(|_| fits) {
                    // The request's chat is the ledger's plus this message: taken as it is.
                    Some(taken) => {
                        let chat = taken.chat.clone();
                        self.with_ledger(Some(&mut events), |ledger, sink| {
                            ledger.adopt(chat, sink)
                        });
                        adopted = Some(taken);
                    }
                    None => self.record(&mut events, ChatItem::Message(message)),
                }
                (decision == TurnDecision::Reply).then(Ask::default)
            }
            // The realtime model's server heard the user's turn and answers it already:
            // no `on_user_turn_completed` (it could not stop that answer); the words come
            // with the transcript, now or later (`UserTranscribed`).
            TurnKind::Heard { text, .. } => {
                self.record(&mut events, ChatItem::Message(user_message(text)));
                adopt = true;
                Some(Ask::default())
            }
            TurnKind::Backchannel(text) => {
                self.record(&mut events, ChatItem::Message(user_message(text)));
                None
            }
            TurnKind::CutIn { text, instructions } => {
                self.shared.events.emit(SessionEvent::UserInputTranscribed {
                    text: text.clone(),
                    is_final: true,
                });
                self.record(&mut events, ChatItem::Message(user_message(text)));
                Some(Ask {
                    tool_choice: ToolChoice::None,
                    extra_instructions: Some(instructions.to_string()),
                    deferred_call_ids: Vec::new(),
                })
            }
            TurnKind::Reply(instructions) => Some(Ask {
                extra_instructions: instructions,
                ..Ask::default()
            }),
            TurnKind::Deferred => self.deferred_reply(&mut events),
            // The LLM step that was in flight when the session was snapshotted: asked again,
            // the user's message already in the chat.
            TurnKind::Redo(redo) => {
                let ask = redo.ask.clone();
                redone = Some(redo);
                Some(ask)
            }
            TurnKind::Say {
                text,
                speech,
                add_to_chat,
            } => {
                self.say(&mut events, text, &speech, add_to_chat);
                speeches.push(speech);
                None
            }
        };
        // Dropped before any stream opens: the actor holds one stream at a time.
        if let Some(unused) = preflight {
            self.discard_preflight(unused, out);
        }
        let mut replay = None;
        let phase = match (&ask, adopted) {
            (Some(_), Some(taken)) => {
                let Preflight {
                    step,
                    chat,
                    span: request_span,
                    started,
                    first_chunk,
                    chunks,
                    ended,
                    ..
                } = taken;
                replay = Some((step, chunks, ended));
                Phase::Generating(Generation::new(
                    step,
                    request_span,
                    chat.len(),
                    started,
                    first_chunk,
                ))
            }
            (Some(ask), _) => {
                Phase::Generating(self.open_generation(ask, redone, adopt, &span, out))
            }
            (None, _) => Phase::Playing {
                outcome: TurnOutcome::default(),
                give_up_at: None,
            },
        };
        let turn = Box::new(Turn {
            events,
            steps: u32::from(ask.is_some()),
            ask: ask.unwrap_or_default(),
            interrupted: false,
            interruptibility,
            speeches,
            done,
            waiters: Vec::new(),
            span,
            timer,
            usage: Usage::default(),
            phase,
        });
        if let Some((step, chunks, ended)) = replay {
            return self.replay_preflight(turn, step, chunks, ended, out);
        }
        match turn.phase {
            Phase::Playing { .. } => self.finish_if_played(turn),
            _ => Some(turn),
        }
    }

    /// A turn took over a preemptive request: what the model sent meanwhile goes out now,
    /// as if it had just come (its speech starts here), and a stream that ended is ended.
    fn replay_preflight(
        &mut self,
        mut turn: Box<Turn>,
        step: u64,
        chunks: Vec<LlmChunk>,
        ended: Option<Option<TurnFailure>>,
        out: &mut Vec<Command>,
    ) -> Option<Box<Turn>> {
        turn.timer.adopted_preemptive();
        self.shared.telemetry.preemptive(&self.agent.def.name, true);
        for chunk in chunks {
            if on_chunk(&self.speaker(), &mut turn, step, chunk, &self.rules.limits) {
                let failure = TurnFailure::ReplyTooLong {
                    limit: self.rules.limits.max_reply_bytes,
                };
                return self.on_stream_end(turn, step, Some(failure), out);
            }
        }
        match ended {
            Some(failure) => self.on_stream_end(turn, step, failure, out),
            None => Some(turn),
        }
    }

    /// Starts a preemptive request with the user's words so far (one already under way
    /// is dropped): the agent's chat and this message, asked as a user turn would ask.
    fn start_preflight(&mut self, text: String, out: &mut Vec<Command>) {
        self.drop_preflight(out);
        let mut chat = self.ledger.chat().clone();
        chat.push(ChatItem::Message(user_message(text.clone())));
        let request = self.request(&Ask::default(), chat.clone());
        let step = self.shared.ids.next_step();
        let span = self.request_span(&self.shared.span, step, &request, true);
        out.push(Command::OpenStream {
            step,
            request,
            span: span.clone(),
            adopt: false,
        });
        self.preflight = Some(Preflight {
            text,
            step,
            chat,
            span,
            started: Instant::now(),
            first_chunk: None,
            chunks: Vec::new(),
            ended: None,
        });
    }

    /// Drops the preemptive request under way, if any.
    fn drop_preflight(&mut self, out: &mut Vec<Command>) {
        if let Some(preflight) = self.preflight.take() {
            self.discard_preflight(preflight, out);
        }
    }

    /// A preemptive request no turn takes: its stream is dropped and nothing of it reaches
    /// the chat or the output; what it cost is counted.
    fn discard_preflight(&mut self, preflight: Preflight, out: &mut Vec<Command>) {
        if preflight.ended.is_none() {
            out.push(Command::CancelStream {
                step: preflight.step,
            });
        }
        let model = preflight
            .served_by()
            .unwrap_or_else(|| self.llm.name())
            .to_owned();
        let reported = preflight.usage();
        let mut usage = Usage {
            requests: 1,
            discarded_preemptive: 1,
            ..Usage::default()
        };
        if let Some(reported) = &reported {
            usage.add_reported(reported);
        }
        record_usage(&preflight.span, reported.as_ref());
        self.shared
            .metrics
            .request(&self.agent.def.name, &model, &usage);
        let telemetry = &self.shared.telemetry;
        telemetry.llm_request(
            &self.agent.def.name,
            &model,
            preflight.first_chunk,
            reported.as_ref(),
        );
        telemetry.preemptive(&self.agent.def.name, false);
        tracing::debug!(parent: &preflight.span, "preemptive request dropped: the user went on");
        self.shared.events.emit_with(|| {
            SessionEvent::LlmMetrics(LlmMetrics {
                agent: self.agent_name(),
                llm: model.clone(),
                time_to_first_chunk: preflight.first_chunk,
                duration: preflight.started.elapsed(),
                text_chunks: count(&preflight.chunks, |c| matches!(c, LlmChunk::Text(_))),
                tool_calls: count(&preflight.chunks, |c| matches!(c, LlmChunk::ToolCall(_))),
                usage: reported,
                cancelled: true,
            })
        });
    }

    /// Runs `on_user_turn_completed`, catching its panics (the reply goes ahead).
    fn user_turn_hook(&mut self, message: &mut ChatMessage) -> TurnDecision {
        let Some(hook) = self.agent.def.on_user_turn_completed.clone() else {
            return TurnDecision::Reply;
        };
        let before = self.ledger.chat().clone();
        let chat = self.ledger.chat_mut();
        let decision = std::panic::catch_unwind(AssertUnwindSafe(|| hook(chat, message)));
        self.announce_hook_edits(&before);
        match decision {
            Ok(decision) => decision,
            Err(panic) => {
                let message = format!(
                    "on_user_turn_completed hook of {} panicked: {}",
                    self.agent.name(),
                    panic_message(&*panic)
                );
                tracing::error!(session = %self.shared.id(), "{message}");
                self.shared.events.emit(SessionEvent::Error { message });
                TurnDecision::Reply
            }
        }
    }

    /// Tells subscribers what a hook did to the chat context: the items it appended, or
    /// the whole context when it rewrote anything.
    fn announce_hook_edits(&self, before: &ChatContext) {
        let after = self.ledger.chat();
        if after.extends(before) {
            for item in &after.items()[before.len()..] {
                self.shared
                    .events
                    .emit_with(|| SessionEvent::ConversationItemAdded {
                        agent: self.agent_name(),
                        item: item.clone(),
                    });
            }
        } else {
            self.shared
                .events
                .emit_with(|| SessionEvent::ChatContextSet {
                    agent: self.agent_name(),
                    chat: after.clone(),
                });
        }
    }

    /// The deferred reply, decided here: inserts the pending items this agent lacks, and
    /// asks the model only if no assistant message was generated with the newest of them
    /// in view. `None`: no reply is due.
    fn deferred_reply(&mut self, events: &mut Vec<ChatItem>) -> Option<Ask> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return None;
        }
        let mut newest = None;
        let mut ids = Vec::with_capacity(pending.len());
        for item in pending {
            // An agent that became current after the update lacks it: insert it first, so
            // the reply never names a call id the model cannot see.
            let position = match self.ledger.chat().position_of_call(&item.call_id) {
                Some(position) => position,
                None => {
                    let at = self.ledger.chat().len();
                    self.with_ledger(Some(events), |ledger, sink| {
                        for entry in item.items.iter() {
                            ledger.append(entry.clone(), sink);
                        }
                    });
                    at
                }
            };
            newest = newest.max(Some(position));
            ids.push(item.call_id);
        }
        let due = reply_due(self.last_reply_view, newest);
        let decision = if due {
            DeferredReplyDecision::Requested
        } else {
            tracing::debug!(agent = %self.agent.name(), "deferred reply skipped: the agent already spoke with the updates in view");
            DeferredReplyDecision::AlreadyAnswered
        };
        self.shared
            .telemetry
            .deferred_reply(&self.agent.def.name, decision);
        self.shared
            .events
            .emit_with(|| SessionEvent::DeferredReply {
                agent: self.agent_name(),
                call_ids: ids.clone(),
                decision,
            });
        due.then(|| {
            let prompts = self.agent.def.prompts.or(&self.shared.settings.prompts);
            Ask {
                tool_choice: ToolChoice::None,
                extra_instructions: Some(prompts.render_reply(&ReplyPromptArgs {
                    pending_call_ids: ids.clone(),
                })),
                deferred_call_ids: ids,
            }
        })
    }

    /// Opens one LLM step: the request, its span, the command to stream it. A step asked
    /// again after a restore keeps its id and its speech's (`redone`); `adopt`: the first
    /// step of a heard turn, whose answer a realtime model's server already started (a
    /// step asked again never adopts: its connection is a new one, which started nothing).
    fn open_generation(
        &mut self,
        ask: &Ask,
        redone: Option<Redo>,
        adopt: bool,
        turn_span: &tracing::Span,
        out: &mut Vec<Command>,
    ) -> Generation {
        let request = self.request(ask, self.ledger.chat().clone());
        let view = self.ledger.chat().len();
        let (step, redone_speech, early_report, view) = match redone {
            Some(redo) => (
                redo.step,
                redo.speech,
                redo.heard.map(|report| (report.interrupted, report.heard)),
                redo.view.min(view),
            ),
            None => (self.shared.ids.next_step(), None, None, view),
        };
        let span = self.request_span(turn_span, step, &request, false);
        out.push(Command::OpenStream {
            step,
            request,
            span: span.clone(),
            adopt,
        });
        let mut generation = Generation::new(step, span, view, Instant::now(), None);
        generation.early_report = early_report;
        generation.redone_speech = redone_speech;
        generation
    }

    /// The request an `ask` makes of the model, from `chat`.
    fn request(&self, ask: &Ask, chat: ChatContext) -> LlmRequest {
        LlmRequest {
            agent: self.agent.def.name.clone(),
            instructions: self.agent.def.instructions.clone(),
            extra_instructions: ask.extra_instructions.clone(),
            chat,
            tools: self.tools.schemas.clone(),
            tool_choice: ask.tool_choice,
            deferred_call_ids: ask.deferred_call_ids.clone(),
        }
    }

    /// An `llm_request` span under `parent`, with OpenTelemetry's GenAI attributes; the
    /// request's content only when the host asked (`SessionBuilder::trace_content`). The
    /// usage and the answer are recorded on it when the request ends.
    fn request_span(
        &self,
        parent: &tracing::Span,
        step: u64,
        request: &LlmRequest,
        preemptive: bool,
    ) -> tracing::Span {
        let span = tracing::info_span!(
            parent: parent,
            "llm_request",
            session = %self.shared.id(),
            agent = %self.agent.name(),
            llm = %self.llm.name(),
            step,
            preemptive,
            speech = tracing::field::Empty,
            "gen_ai.operation.name" = "chat",
            "gen_ai.agent.name" = %self.agent.name(),
            "gen_ai.conversation.id" = %self.shared.id(),
            "gen_ai.request.model" = %self.llm.name(),
            "gen_ai.response.model" = tracing::field::Empty,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "gen_ai.usage.cache_read.input_tokens" = tracing::field::Empty,
            "gen_ai.system_instructions" = tracing::field::Empty,
            "gen_ai.input.messages" = tracing::field::Empty,
            "gen_ai.output.messages" = tracing::field::Empty,
        );
        if self.shared.settings.config.trace_content && !span.is_disabled() {
            span.record("gen_ai.system_instructions", &*system_instructions(request));
            span.record(
                "gen_ai.input.messages",
                serde_json::to_string(request.chat.items())
                    .unwrap_or_default()
                    .as_str(),
            );
        }
        span
    }

    /// The stream of `step` ended (or failed): record what was said, then run the calls
    /// or end the turn. A failed step's calls never run.
    fn on_stream_end(
        &mut self,
        mut turn: Box<Turn>,
        step: u64,
        failure: Option<TurnFailure>,
        out: &mut Vec<Command>,
    ) -> Option<Box<Turn>> {
        let generation = match turn.phase {
            Phase::Generating(generation) if generation.step == step => generation,
            other => {
                turn.phase = other;
                return Some(turn);
            }
        };
        let ending = if failure.is_none() {
            Ending::Complete
        } else {
            Ending::Failed
        };
        // The phase the turn moves to is decided below; until then it is over.
        turn.phase = Phase::Playing {
            outcome: TurnOutcome::default(),
            give_up_at: None,
        };
        let calls = self.close_generation(&mut turn, generation, ending, out);
        match failure {
            Some(failure) => {
                tracing::warn!(session = %self.shared.id(), agent = %self.agent.name(), error = %failure, "LLM request failed");
                self.shared.events.emit(SessionEvent::Error {
                    message: failure.to_string(),
                });
                self.finish(
                    turn,
                    TurnOutcome::failed(SessionError::turn_failed(failure)),
                    false,
                )
            }
            None if calls.is_empty() => self.finish(turn, TurnOutcome::default(), false),
            None => self.dispatch(turn, step, calls, out),
        }
    }

    /// Ends a generation: its stream is dropped, its speech finished on the output (and
    /// cut, on an interruption), what was said recorded (marked interrupted when the
    /// stream did not end on its own), its metrics emitted. Returns the calls the model
    /// made (a complete step runs them).
    fn close_generation(
        &mut self,
        turn: &mut Turn,
        mut generation: Generation,
        ending: Ending,
        out: &mut Vec<Command>,
    ) -> Vec<ModelCall> {
        if ending != Ending::Complete {
            out.push(Command::CancelStream {
                step: generation.step,
            });
        }
        let complete = ending == Ending::Complete;
        let model = generation.llm.as_deref().unwrap_or_else(|| self.llm.name());
        self.shared.telemetry.llm_request(
            &self.agent.def.name,
            model,
            generation.first_chunk,
            generation.usage.as_ref(),
        );
        let mut usage = Usage {
            requests: 1,
            ..Usage::default()
        };
        if let Some(reported) = &generation.usage {
            usage.add_reported(reported);
        }
        turn.usage += &usage;
        turn.timer.request_ended(generation.first_chunk);
        self.shared
            .metrics
            .request(&self.agent.def.name, model, &usage);
        record_usage(&generation.span, generation.usage.as_ref());
        if let Some(served) = &generation.llm {
            generation
                .span
                .record("gen_ai.response.model", served.as_str());
        }
        if self.shared.settings.config.trace_content && !generation.span.is_disabled() {
            generation.span.record(
                "gen_ai.output.messages",
                output_messages(&generation).as_str(),
            );
        }
        tracing::debug!(
            parent: &generation.span,
            text_chunks = generation.text_chunks,
            tool_calls = generation.calls.len(),
            complete,
            "LLM request ended"
        );
        self.shared.events.emit_with(|| {
            SessionEvent::LlmMetrics(LlmMetrics {
                agent: self.agent_name(),
                llm: generation
                    .llm
                    .clone()
                    .unwrap_or_else(|| self.llm.name().to_owned()),
                time_to_first_chunk: generation.first_chunk,
                duration: generation.started.elapsed(),
                text_chunks: generation.text_chunks,
                tool_calls: u32::try_from(generation.calls.len()).unwrap_or(u32::MAX),
                usage: generation.usage,
                cancelled: !complete,
            })
        });
        let calls = std::mem::take(&mut generation.calls);
        let Some(speech) = generation.speech else {
            return calls;
        };
        if !generation.text.is_empty() {
            self.last_reply_view = generation.view;
            self.record(
                &mut turn.events,
                ChatItem::Message(ChatMessage {
                    role: ChatRole::Assistant,
                    content: generation.text.clone(),
                    interrupted: !complete,
                    speech: Some(speech.id()),
                }),
            );
        }
        let playout = self
            .shared
            .output
            .call(|output| output.speech_finished(speech.id()));
        if let Some((interrupted, heard)) = generation.early_report {
            self.apply_report(Some(turn), speech.id(), interrupted, heard);
            return calls;
        }
        match (ending, playout) {
            (Ending::Cut, Playout::Pending) => {
                self.shared
                    .output
                    .call(|output| output.interrupt(speech.id()));
            }
            // Shown in full as far as it was generated.
            (Ending::Cut, Playout::Done) => self.speech_ended(
                &speech,
                SpeechOutcome::Interrupted {
                    heard: Some(generation.text),
                },
            ),
            (_, Playout::Done) => self.speech_ended(&speech, SpeechOutcome::Played),
            (_, Playout::Pending) => {}
        }
        calls
    }

    /// Opens the step in the ledger and sends each call to its toolset, or answers it at
    /// once when it may not run.
    fn dispatch(
        &mut self,
        mut turn: Box<Turn>,
        step: u64,
        sent: Vec<ModelCall>,
        out: &mut Vec<Command>,
    ) -> Option<Box<Turn>> {
        self.publish(AgentState::Thinking);
        // What the size rule cut, by call; kept only when something was (rarely): a step
        // of ordinary calls allocates nothing for it.
        let oversized: Vec<_> = if sent.iter().any(|s| s.oversized.is_some()) {
            sent.iter().map(|s| s.oversized).collect()
        } else {
            Vec::new()
        };
        let calls: Vec<FunctionCall> = sent
            .into_iter()
            .map(|sent| FunctionCall {
                call_id: self.shared.ids.canonical_call_id(&sent.chunk.call_id),
                name: sent.chunk.name,
                arguments: sent.chunk.arguments,
            })
            .collect();
        let speech = turn.speeches.last().cloned();
        self.with_ledger(Some(&mut turn.events), |ledger, sink| {
            ledger.open_step(step, calls.clone(), sink)
        });
        let mut toolsets: Vec<ToolsetKey> = Vec::new();
        for (index, call) in calls.into_iter().enumerate() {
            let refused = refusal(
                &call,
                oversized.get(index).copied().flatten(),
                index,
                turn.ask.tool_choice,
                &self.rules.limits,
            );
            if let Some(out) = refused {
                self.ledger.answer(step, index, out);
                continue;
            }
            if self.tools.companions && super::companions::is_companion(&call.name) {
                out.push(Command::AnswerCompanion { step, index, call });
                continue;
            }
            let Some(toolset) = self.tools.routes.get(&call.name).copied() else {
                let available: Vec<&str> =
                    self.tools.schemas.iter().map(|s| s.name.as_str()).collect();
                let output = CallOutput::error(format!(
                    "Error: unknown tool {}; available tools: {}",
                    excerpt(&call.name, QUOTE_LIMIT),
                    available.join(", ")
                ));
                self.ledger.answer(step, index, output);
                continue;
            };
            if !toolsets.contains(&toolset) {
                toolsets.push(toolset);
            }
            out.push(Command::RunTool {
                step,
                index,
                toolset,
                call,
                interruptibility: turn.interruptibility.clone(),
                speech: speech.clone(),
                cause: Cause::of(&turn.span),
            });
        }
        turn.phase = Phase::Calling { step, toolsets };
        turn.timer.calling(Instant::now());
        self.maybe_commit(turn, Where::Current, out)
    }

    fn on_call_output(
        &mut self,
        turn: Box<Turn>,
        step: u64,
        index: usize,
        output: CallOutput,
        from: Where,
        out: &mut Vec<Command>,
    ) -> Option<Box<Turn>> {
        if self.ledger.answer(step, index, output) {
            return self.maybe_commit(turn, from, out);
        }
        Some(turn)
    }

    /// Commits the open step once every call has its output, then decides what follows
    /// (a paused activation commits on resume; a closing one commits and ends).
    fn maybe_commit(
        &mut self,
        mut turn: Box<Turn>,
        from: Where,
        out: &mut Vec<Command>,
    ) -> Option<Box<Turn>> {
        if !matches!(turn.phase, Phase::Calling { .. }) || from == Where::Paused {
            return Some(turn);
        }
        let Some(committed) =
            self.with_ledger(Some(&mut turn.events), |ledger, sink| ledger.commit(sink))
        else {
            return Some(turn);
        };
        turn.timer.called(Instant::now());
        let end = StepEnd::of(&committed.calls, committed.effects);
        for (tool, message) in &end.propagated {
            self.shared.events.emit(SessionEvent::Error {
                message: format!("tool {tool} failed: {message}"),
            });
        }
        self.shared
            .events
            .emit_with(|| SessionEvent::FunctionToolsExecuted {
                agent: self.agent_name(),
                calls: committed.calls,
                outputs: committed.outputs,
            });
        if end.goes_on(
            turn.steps,
            self.rules.max_tool_steps,
            turn.interrupted,
            from == Where::Current,
        ) {
            turn.steps += 1;
            turn.phase =
                Phase::Generating(self.open_generation(&turn.ask, None, false, &turn.span, out));
            return Some(turn);
        }
        self.finish(turn, end.outcome, from == Where::Closing)
    }

    /// Ends the turn once its speeches have played (an interrupted one: once the output
    /// reported what was heard, or the report timeout passed). `closing`: ends now.
    fn finish(
        &mut self,
        mut turn: Box<Turn>,
        outcome: TurnOutcome,
        closing: bool,
    ) -> Option<Box<Turn>> {
        if turn.playing().is_none() || closing {
            self.finish_now(turn, outcome);
            return None;
        }
        let give_up_at = turn
            .interrupted
            .then(|| Instant::now() + CUT_REPORT_TIMEOUT);
        turn.phase = Phase::Playing {
            outcome,
            give_up_at,
        };
        Some(turn)
    }

    /// Ends a turn waiting for its speeches once none plays any more.
    fn finish_if_played(&mut self, turn: Box<Turn>) -> Option<Box<Turn>> {
        if turn.playing().is_some() || !matches!(turn.phase, Phase::Playing { .. }) {
            return Some(turn);
        }
        let mut turn = turn;
        let outcome = match std::mem::replace(
            &mut turn.phase,
            Phase::Playing {
                outcome: TurnOutcome::default(),
                give_up_at: None,
            },
        ) {
            Phase::Playing { outcome, .. } => outcome,
            _ => TurnOutcome::default(),
        };
        self.finish_now(turn, outcome);
        None
    }

    /// The output did not say in time what was heard of an interrupted turn's speeches:
    /// they end as interrupted, heard unknown, and the turn ends.
    fn give_up_if_due(&mut self, turn: Box<Turn>, now: Instant) -> Option<Box<Turn>> {
        let due = matches!(turn.phase, Phase::Playing { give_up_at: Some(at), .. } if now >= at);
        if !due {
            return Some(turn);
        }
        let playing: Vec<SpeechHandle> = turn
            .speeches
            .iter()
            .filter(|s| !s.is_done())
            .cloned()
            .collect();
        for speech in playing {
            self.speech_ended(&speech, SpeechOutcome::Interrupted { heard: None });
        }
        self.finish_if_played(turn)
    }

    /// Ends the turn now: answers the session (once) and whoever waits on an interruption.
    fn finish_now(&mut self, mut turn: Box<Turn>, mut outcome: TurnOutcome) {
        // A turn that ends with speeches still playing (a close) cuts them short.
        for speech in turn.speeches.iter().filter(|s| !s.is_done()) {
            self.speech_ended(speech, SpeechOutcome::Interrupted { heard: None });
        }
        let latency = turn.timer.latency(Instant::now);
        // Turns that asked the model count in the agent's latency (a `say` does not).
        if turn.timer.asked_the_model() {
            self.shared.metrics.turn(&self.agent.def.name, &latency);
            if !latency.tools.is_zero() {
                self.shared
                    .telemetry
                    .turn_tools(latency.tools, &self.agent.def.name);
            }
            let interrupted = outcome.interrupted || turn.interrupted;
            self.shared.events.emit_with(|| {
                SessionEvent::TurnMetrics(TurnMetrics {
                    agent: self.agent_name(),
                    usage: turn.usage,
                    latency,
                    interrupted,
                })
            });
        }
        outcome.report = Some(Box::new(TurnReport {
            usage: turn.usage,
            latency,
        }));
        self.barge_in.turn_ended();
        if outcome.handoff.is_some() {
            // The handoff's span goes under this turn's.
            outcome.cause = Cause::of(&turn.span);
        }
        let mut events = turn.events;
        events.append(&mut outcome.events);
        outcome.events = events;
        outcome.interrupted |= turn.interrupted;
        let _ = turn.done.send(outcome);
        for waiter in turn.waiters {
            let _ = waiter.send(Ok(()));
        }
        self.turn_ended = true;
    }

    /// Stops the turn now (see `Input::Interrupt`): `Err` with the turn unchanged when it
    /// does not allow interruptions and `force` is not set; else the turn if it goes on
    /// (waiting for its calls or its reports), `None` if it ended.
    fn try_interrupt(
        &mut self,
        mut turn: Box<Turn>,
        force: bool,
        out: &mut Vec<Command>,
    ) -> Result<Option<Box<Turn>>, Box<Turn>> {
        if turn.interrupted {
            return Ok(Some(turn));
        }
        if !force && !turn.interruptibility.allows() {
            return Err(turn);
        }
        turn.interrupted = true;
        self.shared.telemetry.interrupted(&self.agent.def.name);
        self.shared.events.emit(SessionEvent::TurnInterrupted {
            agent: self.agent_name(),
        });
        self.barge_in.turn_ended();
        // Speeches of earlier steps still playing stop too.
        let playing: Vec<SpeechId> = turn
            .speeches
            .iter()
            .filter(|s| !s.is_done())
            .map(|s| s.id())
            .collect();
        self.shared.output.call(|output| {
            for speech in playing {
                output.interrupt(speech);
            }
        });
        let phase = std::mem::replace(
            &mut turn.phase,
            Phase::Playing {
                outcome: TurnOutcome::default(),
                give_up_at: None,
            },
        );
        Ok(match phase {
            Phase::Generating(generation) => {
                // Cut: the calls it made do not run.
                let _ = self.close_generation(&mut turn, generation, Ending::Cut, out);
                self.finish(turn, TurnOutcome::default(), false)
            }
            Phase::Calling { step, toolsets } => {
                out.push(Command::InterruptStep {
                    step,
                    toolsets: toolsets.clone(),
                });
                turn.phase = Phase::Calling { step, toolsets };
                // Calls answered by the activity itself may all be in already.
                self.maybe_commit(turn, Where::Current, out)
            }
            Phase::Playing { outcome, .. } => self.finish(turn, outcome, false),
        })
    }

    // ---- Speeches -------------------------------------------------------------------

    fn announce_speech(&mut self, speech: &SpeechHandle) {
        self.speaker().announce(speech);
    }

    /// A `say` turn: the text goes to the output as one chunk and, if asked, into the chat.
    fn say(
        &mut self,
        events: &mut Vec<ChatItem>,
        text: String,
        speech: &SpeechHandle,
        add_to_chat: bool,
    ) {
        speech.set_status(SpeechStatus::Speaking);
        self.announce_speech(speech);
        self.shared
            .output
            .call(|output| output.speech_chunk(speech.id(), &text));
        if add_to_chat && !text.is_empty() {
            self.record(
                events,
                ChatItem::Message(ChatMessage {
                    role: ChatRole::Assistant,
                    content: text,
                    interrupted: false,
                    speech: Some(speech.id()),
                }),
            );
        }
        let playout = self
            .shared
            .output
            .call(|output| output.speech_finished(speech.id()));
        if playout == Playout::Done {
            self.speech_ended(speech, SpeechOutcome::Played);
        }
    }

    /// A speech is over: its handle learns how, subscribers get `SpeechPlayedOut`, and
    /// later reports of it change nothing.
    fn speech_ended(&mut self, speech: &SpeechHandle, outcome: SpeechOutcome) {
        if speech.is_done() {
            return;
        }
        self.shared.speeches.ended(speech.id());
        let (interrupted, heard) = match &outcome {
            SpeechOutcome::Played => (false, None),
            SpeechOutcome::Interrupted { heard } => (true, heard.clone()),
        };
        speech.set_status(SpeechStatus::Done(outcome));
        self.shared.events.emit(SessionEvent::SpeechPlayedOut {
            speech: speech.id(),
            interrupted,
            heard,
        });
    }

    /// A report for the speech still streaming is kept until its stream ends; the first
    /// one is final, a repeated one changes nothing.
    fn report_while_generating(
        &mut self,
        turn: &mut Turn,
        speech: SpeechId,
        interrupted: bool,
        heard: &Option<String>,
    ) -> bool {
        match &mut turn.phase {
            Phase::Generating(generation)
                if generation.speech.as_ref().is_some_and(|s| s.id() == speech) =>
            {
                generation
                    .early_report
                    .get_or_insert_with(|| (interrupted, heard.clone()));
                true
            }
            _ => false,
        }
    }

    /// The output reports the end of `speech`'s playout: its message is cut to what was
    /// heard (removed when nothing was), in the chat context and the turn's events, and
    /// the speech ends.
    fn apply_report(
        &mut self,
        turn: Option<&mut Turn>,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
    ) {
        let Some(turn) = turn else {
            return;
        };
        let Some(handle) = turn.speeches.iter().find(|s| s.id() == speech).cloned() else {
            return;
        };
        if handle.is_done() {
            return;
        }
        if interrupted {
            match self.ledger.cut_speech(speech, heard.as_deref()) {
                Cut::Removed(index) => {
                    if self.last_reply_view > index {
                        self.last_reply_view -= 1;
                    }
                    // A step being generated was asked from a chat that held the message.
                    if let Phase::Generating(generation) = &mut turn.phase {
                        if generation.view > index {
                            generation.view -= 1;
                        }
                    }
                    self.shared
                        .events
                        .emit_with(|| SessionEvent::ConversationItemRemoved {
                            agent: self.agent_name(),
                            index,
                        });
                }
                Cut::Shortened(index) => {
                    if let Some(item) = self.ledger.chat().items().get(index).cloned() {
                        self.shared
                            .events
                            .emit_with(|| SessionEvent::ConversationItemChanged {
                                agent: self.agent_name(),
                                index,
                                item,
                            });
                    }
                }
                Cut::NotFound => {}
            }
            if let Some(index) = turn
                .events
                .iter()
                .rposition(|item| matches!(item, ChatItem::Message(m) if m.speech == Some(speech)))
            {
                cut_to_heard(&mut turn.events, index, heard.as_deref());
            }
        }
        let outcome = if interrupted {
            SpeechOutcome::Interrupted { heard }
        } else {
            SpeechOutcome::Played
        };
        self.speech_ended(&handle, outcome);
    }

    /// Carries out what the barge-in decided.
    fn barge(&mut self, state: State, action: BargeAction, out: &mut Vec<Command>) -> State {
        match (action, state) {
            (BargeAction::Nothing, state) => state,
            (BargeAction::Pause, State::Running(turn)) => {
                if let Some(speech) = turn.playing().map(|s| s.id()) {
                    self.shared.output.call(|output| output.pause(speech));
                }
                self.publish(AgentState::Listening);
                State::Running(turn)
            }
            (BargeAction::Interrupt, State::Running(turn)) => {
                // Interruptions may have been held off since the user started.
                match self.try_interrupt(turn, false, out) {
                    Ok(turn) => running(turn),
                    Err(turn) => {
                        self.resume_output(&turn);
                        State::Running(turn)
                    }
                }
            }
            (BargeAction::FalseInterruption { resume }, state) => {
                if let (true, State::Running(turn)) = (resume, &state) {
                    self.resume_output(turn);
                }
                self.shared
                    .events
                    .emit(SessionEvent::AgentFalseInterruption { resumed: resume });
                state
            }
            // The turn ended meanwhile: nothing is left to pause or interrupt.
            (BargeAction::Pause | BargeAction::Interrupt, state) => state,
        }
    }

    /// Resumes a speech paused by a barge-in that did not become an interruption.
    fn resume_output(&self, turn: &Turn) {
        if let Some(speech) = turn.playing().map(|s| s.id()) {
            self.shared.output.call(|output| output.resume(speech));
            self.publish(AgentState::Speaking);
        }
    }

    // ---- Pause and close ------------------------------------------------------------

    /// A sub-task starts: a turn still generating stops where it is (interrupted); a turn
    /// waiting on its calls stays open and commits on resume — if it was interrupted,
    /// whoever waits for that is answered now (its end waits for a sub-task only the user
    /// and the model can finish). The tools' held items are refused; session-scoped
    /// pending items go to the task's agent, its own are dropped.
    fn pause(&mut self, state: State, spare: Vec<u64>, out: &mut Vec<Command>) -> State {
        let turn = match state {
            State::Running(turn) => {
                let generating = matches!(turn.phase, Phase::Generating(_));
                let turn = if generating {
                    match self.try_interrupt(turn, true, out) {
                        Ok(turn) => turn,
                        Err(turn) => Some(turn),
                    }
                } else {
                    Some(turn)
                };
                turn.map(|mut turn| {
                    if turn.interrupted {
                        for waiter in turn.waiters.drain(..) {
                            let _ = waiter.send(Ok(()));
                        }
                    }
                    turn
                })
            }
            State::Listening | State::Entering => None,
            other => return other,
        };
        self.refuse_held();
        self.hand_back_pending();
        out.push(Command::StopRuns {
            except: spare,
            reason: Arc::from("the agent was paused for a sub-task"),
        });
        State::Paused(turn)
    }

    /// Session-scoped pending items go to whichever agent is current next; its own are
    /// dropped (their scope no longer takes items).
    fn hand_back_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.carried
            .extend(pending.into_iter().filter(|p| p.scope == Scope::Session));
    }

    /// Tells the output to stop every speech of `turn` still playing — a paused one too
    /// (a barge-in waiting to see whether it was false) — but the one still generating,
    /// which ending its generation stops.
    fn stop_playing(&self, turn: &Turn) {
        let generating = match &turn.phase {
            Phase::Generating(generation) => generation.speech.as_ref().map(|s| s.id()),
            _ => None,
        };
        let playing: Vec<SpeechId> = turn
            .speeches
            .iter()
            .filter(|s| !s.is_done() && Some(s.id()) != generating)
            .map(|s| s.id())
            .collect();
        if !playing.is_empty() {
            self.shared.output.call(|output| {
                for speech in playing {
                    output.interrupt(speech);
                }
            });
        }
    }

    /// Starts closing: a stream is cut, every speech still playing (or paused) told to
    /// stop, a barge-in ended, the tools' held items refused; an activation that ran runs
    /// `on_exit` before its toolsets stop, one never entered stops them at once. A second
    /// close waits for the same toolsets.
    fn close(&mut self, state: State, reason: Arc<str>, out: &mut Vec<Command>) -> State {
        let (entered, turn) = match state {
            State::Created => {
                out.push(Command::StopToolsets {
                    reason: reason.clone(),
                });
                return State::Closing {
                    entered: false,
                    turn: None,
                    reason,
                };
            }
            State::Closing { .. } | State::Closed { .. } => {
                out.push(Command::StopToolsets { reason });
                return state;
            }
            State::Entering | State::Listening => (true, None),
            State::Running(turn) => (true, Some(turn)),
            State::Paused(turn) => (true, turn),
        };
        // A barge-in ends with the turn: no timer of it may resume or interrupt anything.
        self.barge_in.turn_ended();
        let turn = turn.map(|mut turn| {
            self.stop_playing(&turn);
            let phase = std::mem::replace(
                &mut turn.phase,
                Phase::Playing {
                    outcome: TurnOutcome::failed(SessionError::Closed),
                    give_up_at: None,
                },
            );
            match phase {
                Phase::Generating(generation) => {
                    // Closing: the calls it made do not run.
                    let _ = self.close_generation(&mut turn, generation, Ending::Cut, out);
                }
                other => turn.phase = other,
            }
            turn
        });
        self.refuse_held();
        self.hand_back_pending();
        out.push(Command::RunExitHook);
        State::Closing {
            entered,
            turn,
            reason,
        }
    }

    /// The own toolsets are gone: every call still without an output gets its terminal
    /// one, background calls their `/finished`, and the turn ends.
    fn closed(&mut self, state: State, calls: Vec<StoppedCall>) -> State {
        match state {
            State::Closing {
                entered,
                turn,
                reason,
            } => {
                match turn {
                    Some(mut turn) => {
                        self.with_ledger(Some(&mut turn.events), |ledger, sink| {
                            ledger.abort(&reason, sink);
                            ledger.write_terminal(calls, &reason, sink);
                        });
                        self.finish_now(turn, TurnOutcome::failed(SessionError::Closed));
                    }
                    None => self.with_ledger(None, |ledger, sink| {
                        ledger.abort(&reason, sink);
                        ledger.write_terminal(calls, &reason, sink);
                    }),
                }
                self.hand_back_pending();
                State::Closed { entered }
            }
            other => {
                if !calls.is_empty() {
                    let reason = "the session closed";
                    self.with_ledger(None, |ledger, sink| {
                        ledger.write_terminal(calls, reason, sink)
                    });
                }
                other
            }
        }
    }
}

/// What a speech is made and announced with: the fields of an activation that the
/// per-token path borrows while the turn is borrowed from its state.
struct Speaker<'a> {
    id: &'a ActorId,
    agent: &'a Agent,
    shared: &'a SessionShared,
    port: &'a Arc<dyn SpeechPort>,
    current: bool,
}

impl Speaker<'_> {
    /// Publishes what the agent does, if the activation is current.
    fn publish(&self, state: AgentState) {
        if self.current {
            self.shared
                .host_view
                .set_agent_state(&self.shared.events, self.agent.name(), state);
        }
    }

    /// Starts a new speech on the output (under `id`, for a step asked again after a
    /// restore whose speech had begun).
    fn start(&self, interruptibility: Arc<Interruptibility>, id: Option<u64>) -> SpeechHandle {
        let speech = SpeechHandle::new(
            SpeechId(id.unwrap_or_else(|| self.shared.ids.next_speech())),
            interruptibility,
            SpeechStatus::Speaking,
            self.port.clone(),
            self.shared.gone.clone(),
        );
        self.announce(&speech);
        speech
    }

    fn announce(&self, speech: &SpeechHandle) {
        self.shared
            .speeches
            .started(speech.id(), self.id, speech.interruptibility());
        let agent = self.agent.name();
        self.shared
            .output
            .call(|output| output.speech_started(speech.id(), agent));
        self.shared
            .events
            .emit_with(|| SessionEvent::SpeechCreated {
                agent: agent.to_owned(),
                speech: speech.clone(),
            });
        self.publish(AgentState::Speaking);
    }
}

/// One chunk of the model's answer: text goes to the output at once, its speech started
/// at the first text; a call is kept bounded (`turn::bound_call`). Returns whether the
/// step's text went over its limit: the part that fits was said, and the step must end.
fn on_chunk(
    speaker: &Speaker<'_>,
    turn: &mut Turn,
    step: u64,
    chunk: LlmChunk,
    limits: &InputLimits,
) -> bool {
    let Phase::Generating(generation) = &mut turn.phase else {
        return false;
    };
    if generation.step != step {
        return false;
    }
    if !matches!(chunk, LlmChunk::Usage(_) | LlmChunk::ServedBy(_)) {
        generation
            .first_chunk
            .get_or_insert_with(|| generation.started.elapsed());
    }
    match chunk {
        LlmChunk::Text(text) => {
            let (text, over) = bound_text(&text, generation.text.len(), limits);
            if over && text.is_empty() {
                return true;
            }
            generation.text_chunks += 1;
            generation.text.push_str(text);
            let speech = open_speech(speaker, turn);
            speaker
                .shared
                .output
                .call(|output| output.speech_chunk(speech, text));
            return over;
        }
        LlmChunk::ToolCall(call) => generation.calls.push(bound_call(call, limits)),
        LlmChunk::Usage(usage) => generation.usage = Some(usage),
        LlmChunk::ServedBy(llm) => generation.llm = Some(llm),
    }
    false
}

/// The speech of the generating step of `turn`, started at its first text or audio.
fn open_speech(speaker: &Speaker<'_>, turn: &mut Turn) -> SpeechId {
    let Phase::Generating(generation) = &mut turn.phase else {
        // Not reached: callers hold a generating turn.
        return SpeechId(0);
    };
    if let Some(speech) = &generation.speech {
        return speech.id();
    }
    if let Some(e2e) = turn.timer.text_out(Instant::now()) {
        speaker
            .shared
            .telemetry
            .turn_e2e(e2e, &speaker.agent.def.name, turn.timer.kind);
    }
    // A step asked again after a restore speaks under the speech id it had.
    let speech = speaker.start(
        turn.interruptibility.clone(),
        generation.redone_speech.take(),
    );
    generation
        .span
        .record("speech", tracing::field::display(speech.id()));
    generation.speech = Some(speech.clone());
    let id = speech.id();
    turn.speeches.push(speech);
    id
}

/// The state after a running turn went a step: still running, or listening.
fn running(turn: Option<Box<Turn>>) -> State {
    match turn {
        Some(turn) => State::Running(turn),
        None => State::Listening,
    }
}

/// Whether a deferred reply is still due: no assistant message was generated from a chat
/// context that already held the newest pending item (`newest`, its position).
fn reply_due(last_reply_view: usize, newest: Option<usize>) -> bool {
    newest.is_some_and(|newest| last_reply_view <= newest)
}

/// The user's words as a chat message.
fn user_message(text: String) -> ChatMessage {
    ChatMessage {
        role: ChatRole::User,
        content: text,
        interrupted: false,
        speech: None,
    }
}

/// Records a request's usage on its span (OpenTelemetry's GenAI attributes).
fn record_usage(span: &tracing::Span, usage: Option<&LlmUsage>) {
    if let Some(usage) = usage {
        span.record("gen_ai.usage.input_tokens", usage.prompt_tokens);
        span.record("gen_ai.usage.output_tokens", usage.completion_tokens);
        if let Some(cached) = usage.cached_prompt_tokens {
            span.record("gen_ai.usage.cache_read.input_tokens", cached);
        }
    }
}

/// The request's instructions as `gen_ai.system_instructions` (JSON parts).
fn system_instructions(request: &LlmRequest) -> String {
    let mut parts = vec![serde_json::json!({"type": "text", "content": &*request.instructions})];
    if let Some(extra) = &request.extra_instructions {
        parts.push(serde_json::json!({"type": "text", "content": extra}));
    }
    serde_json::Value::Array(parts).to_string()
}

/// What a generation answered, as `gen_ai.output.messages` (one assistant message with
/// its text and tool calls, JSON).
fn output_messages(generation: &Generation) -> String {
    let mut parts = Vec::new();
    if !generation.text.is_empty() {
        parts.push(serde_json::json!({"type": "text", "content": generation.text}));
    }
    for call in &generation.calls {
        parts.push(serde_json::json!({
            "type": "tool_call",
            "id": call.chunk.call_id,
            "name": call.chunk.name,
            "arguments": call.chunk.arguments,
        }));
    }
    serde_json::json!([{"role": "assistant", "parts": parts}]).to_string()
}

/// How many of `chunks` are of a kind.
fn count(chunks: &[LlmChunk], kind: impl Fn(&LlmChunk) -> bool) -> u32 {
    u32::try_from(chunks.iter().filter(|c| kind(c)).count()).unwrap_or(u32::MAX)
}

/// Answers a turn that cannot run here: a queued `say` counts as interrupted, unheard.
fn refuse_turn(kind: TurnKind, done: oneshot::Sender<TurnOutcome>) {
    if let TurnKind::Say { speech, .. } = kind {
        speech.set_status(SpeechStatus::Done(SpeechOutcome::Interrupted {
            heard: Some(String::new()),
        }));
    }
    let _ = done.send(TurnOutcome::failed(SessionError::Closed));
}

#[cfg(test)]
mod tests;
