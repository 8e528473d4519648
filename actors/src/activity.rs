//! `ActivityActor`: one activation of an agent in a session. It is the driver of its
//! activation machine (`activity/activation.rs`): every message becomes an input, every
//! command comes back out as a message, a spawned stream or hook, or a timer.
//!
//! - **Owns:** the machine (the agent's chat context and step ledger, its turn, its
//!   speeches, its barge-in, the tool items pending for a deferred reply), its agent-scoped
//!   toolsets (a `ToolsetActor` for the bare tools, `tools`, and one per agent toolset),
//!   and the one LLM stream of the step being generated.
//! - **Parent:** the session. Sends it nothing but replies; its hooks reach the session
//!   only through `SessionControl` (narrow links that queue work). Talks to toolsets (its
//!   own and the session's) with `RunTool`, `InterruptStep`, `ListRuns`, `CancelRun`.
//! - **Starts** idle, with its toolsets, when the session spawns it; `StartActivity` runs
//!   `on_enter`. **Pauses** on `PauseActivity` (a sub-task agent runs) and **resumes** on
//!   `ResumeActivity`; **stops** on `CloseActivity` (runs `on_exit`, stops its toolsets).
//! - **Handles:** `StartActivity`, `StartTurn`, `InterruptTurn`, `InterruptSpeech`,
//!   `UserStartedSpeaking`, `UserStoppedSpeaking`, `UserTranscript`, `Preflight`,
//!   `DeliverToolItems`,
//!   `AppendItems`, `PauseActivity`, `ResumeActivity`, `CloseActivity`, `PlayoutFinished`,
//!   `ReadChat`, `ReadHistoryEntry`, `SnapshotActivation` — the relayed ones under the
//!   name the host's message has on the session.
//! - **Records** its final chat context in the session's history when it stops.
//! - **Writes its own state** for a snapshot (its machine's `ActivationState`, its own
//!   toolsets' calls from their books) and, restored, starts from it: its toolsets with
//!   the calls they were running, its open step waiting for its calls' outputs.
//!
//! Guarantees, each tested:
//! - Every function call in the chat context has exactly one output after it, whatever
//!   happens (cancel, error, handoff, pause, interruption, close): the ledger's rules.
//! - A call's later items (`/update_n`, `/finished`) are held until its step's pairs are
//!   in the chat context.
//! - When `PauseActivity` or `CloseActivity` answers, every tool run of its own toolsets
//!   (but the one awaiting a sub-task, on pause) has stopped and been dropped.
//! - Once paused or closed, it accepts no tool items: they are refused, never redirected.
//! - A panic in a hook or the LLM adapter, a stalled or failing model stream, fails the
//!   turn with an error event; the activity takes the next turn.
//! - A model stream yields to other work every 128 chunks that were ready at once
//!   (`llm_guard`): the arbiter's other sessions run meanwhile, and an interruption lands
//!   between chunks.
//! - Nothing a model sends is kept over its limit: an oversized tool name or arguments
//!   leave a short stand-in and the call does not run; a step's text stops at
//!   `max_reply_bytes` and the turn fails (`TurnFailure::ReplyTooLong`).
//! - Every assistant message knows its speech; a playout report cuts that message to what
//!   was heard — found in what was said, never as new words — and a speech nobody heard
//!   leaves no message. The first report of a speech is final.
//! - A close tells the output to stop every speech still playing, paused or not.
//! - A barge-in over an interruptible turn pauses a pausable output at once, interrupts
//!   after the minimum duration or a transcript, and resumes after a false interruption;
//!   with a word rule, only words the session judged interrupting do (backchannels never).
//! - A preemptive request says nothing and leaves nothing in the chat until a user turn
//!   with its words takes it over; any other turn, a pause or a close drops it.

mod activation;
mod barge_in;
mod companions;
mod heard;
mod latency;
mod ledger;
mod preflight;
mod realtime;
mod turn;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::agent::{effective_policy, Agent, Hook, HookContext};
use crate::chat::{ChatContext, ChatItem};
use crate::control::SessionControl;
use crate::delivery::{DeliveryAnswer, Scope};
use crate::error::{SessionError, TurnFailure};
use crate::events::{AgentHook, SessionEvent, Unfinished};
use crate::history::SubTaskOf;
use crate::ids::ActorId;
use crate::lifecycle::{alive_pair, stop_all, AliveToken, Child};
use crate::llm::LlmTimeouts;
use crate::llm_guard;
use crate::mailbox::{counted_handlers, plain_response, Mailbox, Probe};
use crate::outcome::{panic_message, CallOutput, StoppedCall};
use crate::output::SpeechId;
use crate::prompts::Prompts;
use crate::realtime::Model;
use crate::realtime_link::{LinkEvent, RealtimeLink};
use crate::reentry;
use crate::session::{Read, SessionLinks, SessionToolset};
use crate::shared::SessionShared;
use crate::speech::Interruptibility;
use crate::telemetry::Cause;
use crate::tool::{DuplicatePolicy, Tool};
use crate::toolset::{
    InterruptStep, RepeatAnswer, RestoredRun, RunBook, RunState, RunTool, StopRuns, StopToolset,
    ToolsetActor, ToolsetState,
};

use activation::{Activation, Command, Input, Setup, Tools};
pub(crate) use activation::{ActivationState, Decided, Part, PendingItem, Restored};
use turn::ToolsetKey;
pub(crate) use turn::{TurnKind, TurnOutcome};

/// Everything an activity is started with.
pub(crate) struct ActivitySpec {
    pub(crate) agent: Agent,
    /// The model, already resolved (the agent's or the session's).
    pub(crate) llm: Model,
    /// For a realtime model: the session's connection to it (kept across handoffs between
    /// agents of the model).
    pub(crate) realtime: Option<RealtimeLink>,
    pub(crate) generation: u32,
    /// Whether it runs as a sub-task (only a sub-task may complete a task).
    pub(crate) is_task: bool,
    pub(crate) shared: Arc<SessionShared>,
    pub(crate) links: Arc<SessionLinks>,
    pub(crate) session_toolsets: Arc<[SessionToolset]>,
    /// The chat context to start from (inherited, given, or empty).
    pub(crate) chat: ChatContext,
    /// Its place among the session's activations, for the history.
    pub(crate) order: u32,
    /// The sub-task it runs in, if any, for the history.
    pub(crate) sub_task_of: Option<SubTaskOf>,
    /// The agent this one takes over from, recorded as a handoff item.
    pub(crate) handoff_from: Option<String>,
    /// Session-scoped tool items pending for a deferred reply, from the agent before.
    pub(crate) carried: Vec<PendingItem>,
    /// How many of its first items it inherited, when not all of `chat` (restored).
    pub(crate) inherited: Option<usize>,
    /// Set when the activation comes back from a snapshot: it starts where it was, with
    /// no `on_enter`.
    pub(crate) restored: Option<RestoredActivity>,
}

/// An activity brought back from a snapshot: its machine's state, its own toolsets'
/// calls, and what the session restored for it.
pub(crate) struct RestoredActivity {
    pub(crate) machine: Restored,
    pub(crate) calls: RestoredCalls,
}

/// What a restored activity's own toolsets start with, and what the session restored for
/// its calls.
pub(crate) struct RestoredCalls {
    /// Its own toolsets' calls, as each toolset wrote them.
    pub(crate) toolsets: Vec<ToolsetState>,
    /// The outputs of its open step's calls of session toolsets (by call id), whose runs
    /// the session restored with their toolsets.
    pub(crate) step_outputs: HashMap<String, oneshot::Receiver<CallOutput>>,
    /// The results of the sub-tasks its own runs awaited, by run key.
    pub(crate) awaits: HashMap<u64, BoxFuture<'static, TaskResult>>,
    /// Per step, whether its turn may be interrupted, shared by the step's calls whichever
    /// toolset runs them.
    pub(crate) steps: HashMap<u64, Arc<Interruptibility>>,
    /// The answers its own calls' repeated updates wait for, by call id (filled as the
    /// activity spawns).
    pub(crate) repeats: HashMap<String, RepeatAnswer>,
}

/// The result of a sub-task, as the session hands it to the caller that waited for it.
pub(crate) type TaskResult = Result<serde_json::Value, SessionError>;

/// What an activity leaves to the agent after it, when it pauses or closes: its chat
/// context (what a next agent may inherit; its length is where a sub-task goes in the
/// transcript) and the session-scoped items still pending for a deferred reply.
#[derive(Default)]
pub(crate) struct Handover {
    pub(crate) chat: ChatContext,
    pub(crate) pending: Vec<PendingItem>,
}

pub(crate) struct ActivityActor {
    probe: Arc<Probe>,
    agent: Agent,
    llm: Model,
    timeouts: LlmTimeouts,
    /// Its side of the realtime model's connection, for a realtime agent.
    realtime: Option<realtime::Realtime>,
    is_task: bool,
    shared: Arc<SessionShared>,
    links: Arc<SessionLinks>,
    machine: Activation,
    /// Every toolset it sees, indexed by `ToolsetKey`: its own first, then the session's.
    toolsets: Vec<Mailbox<ToolsetActor>>,
    /// Its own toolsets, its children.
    own: Vec<Child<ToolsetActor>>,
    /// Its own toolsets' books of runs, by toolset name, for snapshots.
    books: Vec<(String, Arc<RunBook>)>,
    /// The stream of the step being generated, to drop it when the machine says.
    stream: Option<(u64, SpawnHandle)>,
    /// Who waits for `on_enter` (`StartActivity`).
    entering: Option<oneshot::Sender<()>>,
    /// Who waits for a pause to have stopped the runs (`PauseActivity`).
    pausing: Vec<oneshot::Sender<Handover>>,
    /// Who waits for the close to end (`CloseActivity`).
    closing: Vec<oneshot::Sender<Handover>>,
    /// Where its `on_exit` is.
    exit_hook: ExitHook,
    _alive: AliveToken,
}

/// Where an activity's `on_exit` is: a close waits for it, for the grace period once the
/// session is closing.
enum ExitHook {
    /// Not started.
    NotStarted,
    /// Running, with no bound yet (a handoff's).
    Running(SpawnHandle),
    /// Running, and dropped when the grace period set at the session's close ends.
    Bounded,
    /// Returned, or dropped.
    Done,
}

impl ActivityActor {
    /// Starts an activity actor and its own toolsets on the current arbiter; it stays
    /// idle until `StartActivity`. A restored one starts where it was: its toolsets with
    /// the calls they were running, and each call of its open step still without an output
    /// restored by its tool's policy, its output going into the step.
    pub(crate) fn spawn(mut spec: ActivitySpec) -> Child<ActivityActor> {
        let id = ActorId::activity(spec.shared.id(), spec.agent.name(), spec.generation);
        let probe = Probe::new(id.clone(), spec.shared.journal.clone());
        let (alive, gone) = alive_pair();
        let timeouts = spec
            .agent
            .def
            .llm_timeouts
            .unwrap_or(spec.shared.settings.config.llm_timeouts);
        let (groups, tools) = plan_toolsets(&spec);
        let restored_current = spec.restored.as_ref().is_some_and(|r| !r.machine.paused);
        let mut machine = Activation::new(Setup {
            id: id.clone(),
            agent: spec.agent.clone(),
            llm: spec.llm.clone(),
            shared: spec.shared.clone(),
            speech_port: spec.links.clone(),
            tools,
            chat: std::mem::take(&mut spec.chat),
            order: spec.order,
            sub_task_of: spec.sub_task_of.clone(),
            handoff_from: spec.handoff_from.take(),
            carried: std::mem::take(&mut spec.carried),
            inherited: spec.inherited,
        });
        let mut commands = Vec::new();
        let mut restored_runs: Vec<Vec<RestoredRun>> = groups.iter().map(|_| Vec::new()).collect();
        let mut step_outputs = Vec::new();
        if let Some(mut restored) = spec.restored.take() {
            // An update of its own calls, held until its step is in, whose answer had not
            // reached the body: the body saying it again waits for that item to land.
            let mut repeats = HashMap::new();
            if let Some(step) = restored.machine.state.step.as_ref() {
                for run in restored.calls.toolsets.iter().flat_map(|t| t.runs.iter()) {
                    let id = run.newest_update();
                    if run.repeat.is_some() && step.holds(&id) {
                        let slot = Arc::new(crate::delivery::AnswerSlot::default());
                        restored
                            .machine
                            .held_answers
                            .insert(id, crate::delivery::DeliveryAnswer::to_slot(slot.clone()));
                        repeats.insert(run.call.call_id.clone(), slot);
                    }
                }
            }
            machine.restore(restored.machine, &mut commands);
            restored.calls.repeats = repeats;
            step_outputs =
                restore_runs(&spec, &machine, &groups, restored.calls, &mut restored_runs);
        }
        let (own, books, toolsets) = start_toolsets(&spec, &id, groups, restored_runs);
        let actor = ActivityActor {
            probe: probe.clone(),
            agent: spec.agent,
            llm: spec.llm,
            timeouts,
            realtime: spec
                .realtime
                .map(|link| realtime::Realtime::new(link, timeouts)),
            is_task: spec.is_task,
            shared: spec.shared,
            links: spec.links,
            machine,
            toolsets,
            own,
            books,
            stream: None,
            entering: None,
            pausing: Vec::new(),
            closing: Vec::new(),
            exit_hook: ExitHook::NotStarted,
            _alive: alive,
        };
        // A restored current agent takes its model's connection at once (it gets no
        // `StartActivity`): the new connection is set up and its chat replayed as text,
        // before anything its restored step asks of the model.
        let restored_current = restored_current && actor.realtime.is_some();
        let addr = ActivityActor::create(move |ctx| {
            let mut actor = actor;
            if restored_current {
                actor.attach_realtime(ctx);
            }
            for (step, index, output) in step_outputs {
                // No output: the run was dropped before it gave one.
                actor.feed_output(step, index, output, "the tool stopped", ctx);
            }
            for command in commands {
                actor.carry_out(command, ctx);
            }
            actor
        });
        Child::new(Mailbox::new(addr, probe), gone)
    }

    /// Feeds the output of call `index` of step `step` once `output` resolves; without
    /// one (its run or toolset gone), the call ends for `lost`.
    fn feed_output<E>(
        &self,
        step: u64,
        index: usize,
        output: impl std::future::Future<Output = Result<CallOutput, E>> + 'static,
        lost: &'static str,
        ctx: &mut Context<Self>,
    ) {
        ctx.spawn(output.into_actor(self).map(move |output, act, ctx| {
            let output = output.unwrap_or_else(|_| CallOutput::ended(lost));
            act.feed(
                Input::CallOutput {
                    step,
                    index,
                    output,
                },
                ctx,
            );
        }));
    }

    /// Feeds the machine one input and carries out what it asks. The command list is
    /// not kept between inputs: most inputs (a chunk) ask for nothing and allocate
    /// nothing, and an idle activity should not hold a buffer sized for its busiest turn.
    fn feed(&mut self, input: Input, ctx: &mut Context<Self>) {
        let mut commands = Vec::new();
        self.machine.handle(input, &mut commands);
        for command in commands {
            self.carry_out(command, ctx);
        }
    }

    fn carry_out(&mut self, command: Command, ctx: &mut Context<Self>) {
        match command {
            Command::RunEnterHook => {
                let hook = self.run_hook(self.agent.def.on_enter.clone(), "on_enter");
                ctx.spawn(hook.into_actor(self).map(|(), act, ctx| {
                    act.feed(Input::Entered, ctx);
                    if let Some(entered) = act.entering.take() {
                        let _ = entered.send(());
                    }
                }));
            }
            Command::RunExitHook => {
                let hook = self.run_hook(self.agent.def.on_exit.clone(), "on_exit");
                let running = ctx.spawn(hook.into_actor(self).map(|(), act, ctx| {
                    act.exit_hook = ExitHook::Done;
                    act.feed(Input::ExitHookDone, ctx)
                }));
                self.exit_hook = ExitHook::Running(running);
                self.bound_exit_hook(ctx);
            }
            Command::OpenStream {
                step,
                request,
                span,
                adopt,
            } => {
                let llm = match (&self.llm, &mut self.realtime) {
                    (Model::Text(llm), _) => llm.clone(),
                    (Model::Realtime(_), Some(realtime)) => {
                        let _entered = span.enter();
                        realtime.open(step, request, adopt);
                        self.arm_step_wait(ctx);
                        return;
                    }
                    (Model::Realtime(model), None) => {
                        // Not reached: a realtime agent's activity is spawned with its link.
                        let error = crate::llm::LlmError::new(format!(
                            "the realtime model {} has no connection",
                            model.name()
                        ));
                        return self.feed(
                            Input::StreamEnded {
                                step,
                                failure: Some(TurnFailure::Llm(error)),
                            },
                            ctx,
                        );
                    }
                };
                let stream = llm_guard::open(&*llm, request, self.timeouts, span);
                let task = ctx.spawn(
                    stream
                        .into_actor(self)
                        .map(move |chunk, act, ctx| match chunk {
                            Ok(chunk) => act.feed(Input::Chunk { step, chunk }, ctx),
                            Err(error) => act.feed(
                                Input::StreamEnded {
                                    step,
                                    failure: Some(TurnFailure::Llm(error)),
                                },
                                ctx,
                            ),
                        })
                        .finish()
                        .map(move |(), act, ctx| {
                            act.feed(
                                Input::StreamEnded {
                                    step,
                                    failure: None,
                                },
                                ctx,
                            )
                        }),
                );
                self.stream = Some((step, task));
            }
            Command::CancelStream { step } => {
                if let Some(realtime) = &mut self.realtime {
                    realtime.cancel(step);
                }
                if let Some((open, task)) = self.stream.take() {
                    if open == step {
                        ctx.cancel_future(task);
                    } else {
                        self.stream = Some((open, task));
                    }
                }
            }
            Command::RunTool {
                step,
                index,
                toolset,
                call,
                interruptibility,
                speech,
                cause,
            } => {
                let Some(mailbox) = self.toolsets.get(toolset.0) else {
                    // Not reached: keys come from this activity's own routes.
                    return self.feed(
                        Input::CallOutput {
                            step,
                            index,
                            output: CallOutput::ended("the toolset is gone"),
                        },
                        ctx,
                    );
                };
                let ask = mailbox.ask(
                    self.probe.id(),
                    RunTool {
                        call,
                        step,
                        agent: self.agent.clone(),
                        is_task: self.is_task,
                        interruptibility,
                        speech,
                        cause,
                    },
                );
                self.feed_output(step, index, ask, "the toolset stopped", ctx);
            }
            Command::AnswerCompanion { step, index, call } => {
                let answer = companions::answer(
                    call.name,
                    call.arguments,
                    self.toolsets.clone(),
                    self.probe.id().clone(),
                );
                ctx.spawn(answer.into_actor(self).map(move |output, act, ctx| {
                    act.feed(
                        Input::CallOutput {
                            step,
                            index,
                            output,
                        },
                        ctx,
                    );
                }));
            }
            Command::InterruptStep { step, toolsets } => {
                for key in toolsets {
                    if let Some(toolset) = self.toolsets.get(key.0) {
                        // One per toolset per step: bounded.
                        toolset.tell(self.probe.id(), InterruptStep { step });
                    }
                }
            }
            Command::StopRuns { except, reason } => {
                let stops: Vec<_> = self
                    .own
                    .iter()
                    .map(|ts| {
                        ts.mailbox.ask(
                            self.probe.id(),
                            StopRuns {
                                reason: reason.clone(),
                                except: except.clone(),
                            },
                        )
                    })
                    .collect();
                ctx.spawn(futures_util::future::join_all(stops).into_actor(self).map(
                    move |results, act, ctx| {
                        let calls: Vec<StoppedCall> =
                            results.into_iter().flatten().flatten().collect();
                        act.feed(Input::RunsStopped { calls, reason }, ctx);
                        let handover = act.handover();
                        for waiter in act.pausing.drain(..) {
                            let _ = waiter.send(Handover {
                                chat: handover.chat.clone(),
                                pending: handover.pending.clone(),
                            });
                        }
                    },
                ));
            }
            Command::StopToolsets { reason } => {
                let each = reason.clone();
                let stops = stop_all(self.own.clone(), self.probe.id(), move || StopToolset {
                    reason: each.clone(),
                });
                ctx.spawn(stops.into_actor(self).map(|results, act, ctx| {
                    let calls = results.into_iter().flatten().flatten().collect();
                    act.feed(Input::ToolsetsStopped { calls }, ctx);
                    let handover = act.handover();
                    for waiter in act.closing.drain(..) {
                        let _ = waiter.send(Handover {
                            chat: handover.chat.clone(),
                            pending: handover.pending.clone(),
                        });
                    }
                    ctx.stop();
                }));
            }
            Command::ArmTimer { at } => {
                let after = at.saturating_duration_since(Instant::now());
                ctx.run_later(after, |act, ctx| {
                    act.feed(
                        Input::Timer {
                            now: Instant::now(),
                        },
                        ctx,
                    )
                });
            }
        }
    }

    /// A realtime agent takes its model's connection: its instructions, tools and chat go
    /// to the model, and the connection's events come here.
    fn attach_realtime(&mut self, ctx: &mut Context<Self>) {
        let Some(realtime) = &mut self.realtime else {
            return;
        };
        if realtime.attached() {
            return;
        }
        let config = realtime::config(&self.agent, self.machine.tool_schemas());
        let events = realtime.attach(config, self.machine.chat().clone());
        let task = ctx.spawn(
            events
                .into_actor(self)
                .map(|event, act, ctx| act.on_link(event, ctx))
                .finish(),
        );
        if let Some(realtime) = &mut self.realtime {
            realtime.listening(task);
        }
    }

    /// A realtime agent leaves the connection (it pauses or closes).
    fn detach_realtime(&mut self, ctx: &mut Context<Self>) {
        if let Some(task) = self.realtime.as_mut().and_then(|r| r.detach()) {
            ctx.cancel_future(task);
        }
    }

    /// One event of the realtime connection: a piece of a step's answer becomes the
    /// machine's input; the model's audio goes to the host's output through the step's
    /// speech.
    fn on_link(&mut self, event: LinkEvent, ctx: &mut Context<Self>) {
        let Some(realtime) = &mut self.realtime else {
            return;
        };
        match realtime.on_event(event) {
            realtime::Then::Nothing => {}
            realtime::Then::Audio(step, audio) => {
                let speech = match realtime.speech_of(step) {
                    Some(speech) => speech,
                    None => {
                        let Some(speech) = self.machine.start_speech(step) else {
                            return;
                        };
                        if let Some(realtime) = &mut self.realtime {
                            realtime.speaking(step, speech);
                        }
                        speech
                    }
                };
                self.shared
                    .output
                    .call(|output| output.speech_audio(speech, &audio));
                if let Some(realtime) = &mut self.realtime {
                    realtime.played(speech, audio.len());
                }
            }
            realtime::Then::Chunk(step, chunk) => {
                let text = matches!(chunk, crate::llm::LlmChunk::Text(_));
                self.feed(Input::Chunk { step, chunk }, ctx);
                if text {
                    // The step's speech starts at its first text when no audio came first.
                    let speech = self.machine.start_speech(step);
                    if let (Some(realtime), Some(speech)) = (&mut self.realtime, speech) {
                        realtime.speaking(step, speech);
                    }
                }
            }
            realtime::Then::Ended(step, usage, failure) => {
                if let Some(usage) = usage {
                    self.feed(
                        Input::Chunk {
                            step,
                            chunk: crate::llm::LlmChunk::Usage(usage),
                        },
                        ctx,
                    );
                }
                self.feed(
                    Input::StreamEnded {
                        step,
                        failure: failure.map(TurnFailure::Llm),
                    },
                    ctx,
                );
            }
            realtime::Then::Replay => {
                // A new connection: the whole chat goes to it, as text.
                realtime.sync(self.machine.chat().clone());
            }
        }
    }

    /// Arms the one timer of the open realtime step's wait (its first event, then each
    /// next one); when it fires and nothing came meanwhile, the step fails as a stalled
    /// LLM stream does.
    fn arm_step_wait(&mut self, ctx: &mut Context<Self>) {
        let Some((step, at)) = self.realtime.as_ref().and_then(|r| r.deadline()) else {
            return;
        };
        let after = at.saturating_duration_since(Instant::now());
        ctx.run_later(after, move |act, ctx| {
            let Some(realtime) = &mut act.realtime else {
                return;
            };
            match realtime.deadline() {
                Some((open, _)) if open == step => {}
                // The step ended, or another one opened (with its own timer).
                _ => return,
            }
            match realtime.timed_out(step) {
                Some(error) => {
                    tracing::warn!(session = %act.shared.id(), agent = %act.agent.name(), %error, "the realtime model did not answer in time");
                    act.feed(
                        Input::StreamEnded {
                            step,
                            failure: Some(TurnFailure::Llm(error)),
                        },
                        ctx,
                    );
                }
                // Events came: wait from the last one.
                None => act.arm_step_wait(ctx),
            }
        });
    }

    /// The chat context now and the pending items the next agent takes over.
    fn handover(&mut self) -> Handover {
        Handover {
            chat: self.machine.chat().clone(),
            pending: self.machine.take_carried(),
        }
    }

    /// Gives a running `on_exit` the grace period once the session is closing (a hook
    /// that awaits a backend that never answers must not hold the close): still running
    /// then, it is dropped and reported, and the close goes on as if it had returned. An
    /// `on_exit` of a handoff runs unbounded until the session closes.
    fn bound_exit_hook(&mut self, ctx: &mut Context<Self>) {
        if !matches!(self.exit_hook, ExitHook::Running(_)) || !self.shared.host_view.is_closing() {
            return;
        }
        let ExitHook::Running(running) = std::mem::replace(&mut self.exit_hook, ExitHook::Bounded)
        else {
            return;
        };
        ctx.run_later(self.shared.settings.config.grace_period, move |act, ctx| {
            if !matches!(act.exit_hook, ExitHook::Bounded) {
                return;
            }
            act.exit_hook = ExitHook::Done;
            ctx.cancel_future(running);
            act.report_hook(AgentHook::OnExit);
            act.feed(Input::ExitHookDone, ctx);
        });
    }

    /// Reports a hook the session stopped waiting for.
    fn report_hook(&self, hook: AgentHook) {
        self.shared.unfinished.report(
            &self.shared,
            Unfinished::Hook {
                agent: self.agent.name().to_owned(),
                hook,
            },
        );
    }

    /// Runs a lifecycle hook: marked as engine code of this session (so a host call made
    /// from it fails instead of waiting on itself) and with its panics caught.
    fn run_hook(
        &self,
        hook: Option<Hook>,
        which: &'static str,
    ) -> impl std::future::Future<Output = ()> + 'static {
        // Built only when there is a hook: most agents have none.
        let call = hook.map(|hook| {
            let ctx = HookContext {
                session: SessionControl::new(
                    self.shared.id().clone(),
                    self.probe.id().clone(),
                    self.links.clone(),
                    self.shared.settings.userdata.clone(),
                ),
                agent: self.agent.def.name.clone(),
            };
            // The hook's closure runs here, in the handler: its panic is caught too.
            let made = std::panic::catch_unwind(AssertUnwindSafe(|| hook(ctx)));
            (made, self.shared.clone(), self.agent.name().to_owned())
        });
        async move {
            let Some((made, shared, agent)) = call else {
                return;
            };
            let outcome = match made {
                Ok(run) => {
                    reentry::inside(shared.id().clone(), AssertUnwindSafe(run).catch_unwind()).await
                }
                Err(panic) => Err(panic),
            };
            if let Err(panic) = outcome {
                let message = format!(
                    "{which} hook of {agent} panicked: {}",
                    panic_message(&*panic)
                );
                tracing::error!(session = %shared.id(), %agent, "{message}");
                shared.events.emit(SessionEvent::Error { message });
            }
        }
    }
}

/// One of an agent's own toolsets, about to start: its name, tools and prompts.
struct Group {
    name: String,
    tools: Vec<(Tool, DuplicatePolicy)>,
    prompts: Prompts,
}

/// The agent's own toolsets and every toolset it sees, with the tool routes and schemas
/// the machine uses (stable order: bare tools, agent toolsets, session toolsets,
/// companions). A route's key is the toolset's place: its own first, then the session's.
fn plan_toolsets(spec: &ActivitySpec) -> (Vec<Group>, Tools) {
    let shared = &spec.shared;
    let agent = &spec.agent;
    let mut schemas = Vec::new();
    let mut routes = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let agent_prompts = agent.def.prompts.or(&shared.settings.prompts);
    if !agent.def.tools.is_empty() {
        let tools = agent
            .def
            .tools
            .iter()
            .map(|t| {
                (
                    t.clone(),
                    t.duplicate_policy().unwrap_or(DuplicatePolicy::Reject),
                )
            })
            .collect();
        groups.push(Group {
            name: "tools".to_owned(),
            tools,
            prompts: agent_prompts.clone(),
        });
    }
    for toolset in &agent.def.toolsets {
        let tools = toolset
            .tools
            .iter()
            .map(|t| (t.clone(), effective_policy(t, toolset)))
            .collect();
        groups.push(Group {
            name: toolset.name.clone(),
            tools,
            prompts: toolset.prompts.or(&agent_prompts),
        });
    }
    for (at, group) in groups.iter().enumerate() {
        schemas.extend(group.tools.iter().map(|(t, p)| t.schema(*p)));
        for (tool, _) in &group.tools {
            routes.insert(tool.name().to_owned(), ToolsetKey(at));
        }
    }
    for (at, toolset) in spec.session_toolsets.iter().enumerate() {
        let key = ToolsetKey(groups.len() + at);
        schemas.extend(toolset.schemas.iter().cloned());
        for tool in &toolset.tools {
            routes.insert(tool.name().to_owned(), key);
        }
    }
    let companions = shared.settings.exposes_companions(agent);
    if companions {
        schemas.extend(companions::schemas());
    }
    let tools = Tools {
        routes,
        schemas: Arc::from(schemas),
        companions,
    };
    (groups, tools)
}

/// Spawns the agent's own toolsets, each with the calls it restores; lists every toolset
/// the activity sees, its own first (as the routes' keys count them).
#[allow(clippy::type_complexity)]
fn start_toolsets(
    spec: &ActivitySpec,
    id: &ActorId,
    groups: Vec<Group>,
    restored: Vec<Vec<RestoredRun>>,
) -> (
    Vec<Child<ToolsetActor>>,
    Vec<(String, Arc<RunBook>)>,
    Vec<Mailbox<ToolsetActor>>,
) {
    let scope = Scope::Activity(id.clone());
    let mut own = Vec::new();
    let mut books = Vec::new();
    let mut toolsets = Vec::new();
    for (group, restored) in groups.into_iter().zip(restored) {
        let (child, book) = ToolsetActor::spawn(
            ActorId::agent_toolset(
                spec.shared.id(),
                spec.agent.name(),
                spec.generation,
                &group.name,
            ),
            scope.clone(),
            group.tools,
            group.prompts,
            spec.shared.clone(),
            spec.links.clone(),
            restored,
        );
        toolsets.push(child.mailbox.clone());
        books.push((group.name, book));
        own.push(child);
    }
    toolsets.extend(spec.session_toolsets.iter().map(|t| t.mailbox.clone()));
    (own, books, toolsets)
}

/// Sorts a restored activity's calls for its own toolsets (see `ActivityActor::spawn`):
/// each call of its open step still without an output goes to the toolset of its tool
/// with its state (a fresh one when it had not started) and a channel for its output —
/// unless the session restored it with a session toolset and handed the channel over —
/// and the other calls its toolsets wrote run on in the background. Returns the channels
/// the step's outputs come through, by step and call index.
fn restore_runs(
    spec: &ActivitySpec,
    machine: &Activation,
    groups: &[Group],
    calls: RestoredCalls,
    runs: &mut [Vec<RestoredRun>],
) -> Vec<(u64, usize, oneshot::Receiver<CallOutput>)> {
    let RestoredCalls {
        toolsets,
        step_outputs: mut from_session,
        mut awaits,
        steps,
        mut repeats,
    } = calls;
    // Each written call by id, with its toolset's place (the restore checked the names).
    let mut written: HashMap<String, (usize, RunState)> = HashMap::new();
    for toolset in toolsets {
        let Some(at) = groups.iter().position(|g| g.name == toolset.name) else {
            continue;
        };
        for run in toolset.runs {
            written.insert(run.call.call_id.clone(), (at, run));
        }
    }
    let mut outputs = Vec::new();
    for waiting in machine.waiting_calls() {
        let (step, index) = (waiting.step, waiting.index);
        if let Some(output) = from_session.remove(&waiting.call.call_id) {
            outputs.push((step, index, output));
            continue;
        }
        let (tx, rx) = oneshot::channel();
        outputs.push((step, index, rx));
        let Some(at) = waiting
            .toolset
            .map(|key| key.0)
            .filter(|at| *at < groups.len())
        else {
            // Not a tool of this agent (nor, restored, of a session toolset): the model
            // reads so, as it would have at the call.
            let _ = tx.send(CallOutput::error(format!(
                "Error: unknown tool {}",
                crate::outcome::excerpt(&waiting.call.name, crate::outcome::QUOTE_LIMIT)
            )));
            continue;
        };
        let state = match written.remove(&waiting.call.call_id) {
            Some((_, state)) => state,
            // It had not started: it starts now, under its tool's policy all the same.
            None => RunState {
                key: spec.shared.ids.next_run(),
                step,
                call: waiting.call.clone(),
                updates: 0,
                said: Vec::new(),
                checkpoint: None,
                repeat: None,
                unanswered: false,
                last_said: None,
            },
        };
        let awaits = awaits.remove(&state.key);
        runs[at].push(RestoredRun {
            state,
            agent: spec.agent.clone(),
            is_task: spec.is_task,
            step: Some(tx),
            interruptibility: waiting.interruptibility,
            awaits,
            repeat_answer: None,
        });
    }
    let mut background: Vec<(usize, RunState)> = written.into_values().collect();
    background.sort_by_key(|(_, state)| state.key);
    for (at, state) in background {
        let awaits = awaits.remove(&state.key);
        let repeat_answer = repeats.remove(&state.call.call_id);
        runs[at].push(RestoredRun::in_background(
            state,
            spec.agent.clone(),
            spec.is_task,
            &steps,
            awaits,
            repeat_answer,
        ));
    }
    for runs in runs.iter_mut() {
        runs.sort_by_key(|run| run.state.key);
    }
    outputs
}

impl Actor for ActivityActor {
    type Context = Context<Self>;

    fn stopped(&mut self, ctx: &mut Self::Context) {
        // A hook still running is dropped with the actor (its `on_enter` when the session
        // closed while it ran; its `on_exit` when a close came during a handoff's).
        if self.entering.is_some() && self.agent.def.on_enter.is_some() {
            self.report_hook(AgentHook::OnEnter);
        }
        if matches!(self.exit_hook, ExitHook::Running(_) | ExitHook::Bounded) {
            self.report_hook(AgentHook::OnExit);
        }
        self.feed(Input::Stopped, ctx);
        // Recorded here, whoever stopped it (a handoff, the end of a task, the session's
        // close, or several of them racing): the session reads the book once every
        // activity is gone, so no final chat context depends on whose reply arrived.
        if let Some((order, entry)) = self.machine.history_entry(false) {
            self.shared.history.record(order, entry);
        }
        self.probe.stopped();
    }
}

/// Sent by the session once, right after it spawned the activity: runs `on_enter`.
/// `entered` hears once `on_enter` returned (dropped unanswered if the activity stops
/// first, which the session reads as its end). Told, not asked: the answer travels with
/// the message, so no reply future is spawned for it.
pub(crate) struct StartActivity {
    pub(crate) entered: oneshot::Sender<()>,
}

impl Message for StartActivity {
    type Result = ();
}

impl Handler<StartActivity> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: StartActivity, ctx: &mut Self::Context) {
        self.entering = Some(msg.entered);
        self.feed(Input::Enter, ctx);
        // A realtime agent's instructions, tools and chat go to its model now, before
        // anything it asks (a handoff's: before the output of the call that handed off).
        self.attach_realtime(ctx);
    }
}

/// Sent by the session to run one turn; the session sends the next only after this one
/// answered, so an activity runs one turn at a time. `done` hears the turn's outcome
/// (dropped unanswered if the activity stops first: the session reads it as closed).
/// Told, with the answer inside, rather than asked: an asked message whose answer comes
/// later is a future actix spawns as a task of its own, one per turn.
pub(crate) struct StartTurn {
    pub(crate) kind: TurnKind,
    pub(crate) done: oneshot::Sender<TurnOutcome>,
    /// Who asked, for the turn's span and latency.
    pub(crate) cause: Cause,
}

impl Message for StartTurn {
    type Result = ();
}

impl Handler<StartTurn> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: StartTurn, ctx: &mut Self::Context) {
        self.feed(
            Input::RunTurn {
                kind: msg.kind,
                done: msg.done,
                cause: msg.cause,
            },
            ctx,
        );
    }
}

/// Stops the running turn now (`Session::interrupt`, a preempting handoff, a dropped
/// `run` future): the LLM stream is dropped, the output told to stop, no further step
/// runs, and each call of the open step gets its output (a call that cancels on
/// interruption is cancelled, the others move to the background). Refused
/// (`Uninterruptible`) when the turn does not allow interruptions and `force` is not set.
/// The reply comes once the turn ended (at once when none runs). The host sends it to the
/// session, which relays it to the current agent.
pub(crate) struct InterruptTurn {
    pub(crate) force: bool,
}

impl Message for InterruptTurn {
    type Result = Result<(), SessionError>;
}

impl Handler<InterruptTurn> for ActivityActor {
    type Result = ResponseFuture<Result<(), SessionError>>;

    fn handle(&mut self, msg: InterruptTurn, ctx: &mut Self::Context) -> Self::Result {
        let (waiter, rx) = oneshot::channel();
        self.feed(
            Input::Interrupt {
                force: msg.force,
                waiter,
            },
            ctx,
        );
        Box::pin(async move { rx.await.unwrap_or(Ok(())) })
    }
}

/// A `SpeechHandle` asked to interrupt its speech (`interrupt`, `force_interrupt`): the
/// session takes a queued `say` out of its queue, or relays this to the activity that
/// speaks it, whose turn stops.
pub(crate) struct InterruptSpeech {
    pub(crate) speech: SpeechId,
    pub(crate) force: bool,
}

impl Message for InterruptSpeech {
    type Result = ();
}

impl Handler<InterruptSpeech> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: InterruptSpeech, ctx: &mut Self::Context) {
        self.feed(
            Input::InterruptSpeech {
                speech: msg.speech,
                force: msg.force,
            },
            ctx,
        );
    }
}

/// Host input (`Session::user_started_speaking`): the user started speaking. The session
/// keeps the user's state and relays it to the current agent, whose turn may be barged in
/// on (the output pauses if it can).
pub(crate) struct UserStartedSpeaking;

impl Message for UserStartedSpeaking {
    type Result = ();
}

impl Handler<UserStartedSpeaking> for ActivityActor {
    type Result = ();

    fn handle(&mut self, _msg: UserStartedSpeaking, ctx: &mut Self::Context) {
        self.feed(Input::UserStartedSpeaking { at: Instant::now() }, ctx);
        if let Some(realtime) = &self.realtime {
            // The server may answer by itself when the user stops: what the chat holds
            // that the model lacks goes now, with the outputs the interruption just gave
            // the calls of the step it cut.
            realtime.sync(self.machine.chat().clone());
        }
    }
}

/// Host input (`Session::user_stopped_speaking`): the user stopped speaking; relayed like
/// [`UserStartedSpeaking`].
pub(crate) struct UserStoppedSpeaking;

impl Message for UserStoppedSpeaking {
    type Result = ();
}

impl Handler<UserStoppedSpeaking> for ActivityActor {
    type Result = ();

    fn handle(&mut self, _msg: UserStoppedSpeaking, ctx: &mut Self::Context) {
        self.feed(Input::UserStoppedSpeaking { at: Instant::now() }, ctx);
    }
}

/// Sent by the session when a final transcript's words wait for the end of the user's
/// turn, the agent is idle and the turn handling allows preemptive generation: start the
/// model now with these words (the user's words of the turn so far; none: only drop the
/// request under way, the user went on and no new try is allowed). The activity holds
/// what the model sends until a user turn with the same words takes it over; anything
/// else drops it. Told: one per final, and the session bounds the tries per user turn.
pub(crate) struct Preflight {
    pub(crate) text: Option<String>,
}

impl Message for Preflight {
    type Result = ();
}

impl Handler<Preflight> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: Preflight, ctx: &mut Self::Context) {
        self.feed(Input::Preflight { text: msg.text }, ctx);
    }
}

/// Host input (`Session::transcript`): what the user said, interim or final. The session
/// judges its words (the turn rules: a word minimum, backchannel words, the host's
/// classifier), turns a final one into a user turn unless its words were ignored, and
/// relays a transcript with words to the current agent with the judgement: words that
/// interrupt make a barge-in under way real, and a final one interrupts an interruptible
/// turn; words that do not leave the agent speaking.
pub(crate) struct UserTranscript {
    pub(crate) text: String,
    pub(crate) is_final: bool,
    /// The host's span at the call (telemetry): the session keeps it for the user turn.
    pub(crate) cause: Cause,
    /// Set by the session: whether the words interrupt the agent (the host sends false;
    /// the session decides).
    pub(crate) interrupts: bool,
}

impl Message for UserTranscript {
    type Result = ();
}

impl Handler<UserTranscript> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: UserTranscript, ctx: &mut Self::Context) {
        self.feed(
            Input::UserTranscript {
                is_final: msg.is_final,
                interrupts: msg.interrupts,
                at: Instant::now(),
            },
            ctx,
        );
    }
}

/// From the session: a realtime model transcribed a user turn that started before its
/// words came; the oldest user message still without words gets them.
pub(crate) struct UserTranscribed {
    pub(crate) text: String,
}

impl Message for UserTranscribed {
    type Result = ();
}

impl Handler<UserTranscribed> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: UserTranscribed, ctx: &mut Self::Context) {
        self.feed(Input::UserTranscribed { text: msg.text }, ctx);
    }
}

/// A tool run's later items (`/update_n`, `/finished`), sent to the session, which relays
/// them to the activity they belong to: held while the call's own step is not yet in the
/// chat context, refused when the activity is paused or closed. `answer` hears once the
/// items are in (or why they never will be); whoever delivers awaits it before its next
/// delivery, so deliveries are bounded. Told, not asked: the answer travels with the
/// message, so a delivery costs no reply future on the way.
pub(crate) struct DeliverToolItems {
    pub(crate) scope: Scope,
    pub(crate) base_call_id: String,
    pub(crate) items: Vec<ChatItem>,
    /// Whether the items call for a deferred reply.
    pub(crate) reply: bool,
    pub(crate) answer: DeliveryAnswer,
}

impl Message for DeliverToolItems {
    type Result = ();
}

impl Handler<DeliverToolItems> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: DeliverToolItems, ctx: &mut Self::Context) {
        self.feed(
            Input::Deliver {
                scope: msg.scope,
                base_call_id: msg.base_call_id,
                items: msg.items,
                reply: msg.reply,
                answer: msg.answer,
            },
            ctx,
        );
    }
}

/// Sent by the session to append items it produced (terminal outputs of session-scoped
/// runs stopped at close).
pub(crate) struct AppendItems {
    pub(crate) items: Vec<ChatItem>,
}

impl Message for AppendItems {
    type Result = ();
}

impl Handler<AppendItems> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: AppendItems, ctx: &mut Self::Context) {
        self.feed(Input::Append(msg.items), ctx);
    }
}

/// Sent by the session before a sub-task agent starts: stops the runs of this agent's
/// toolsets (all but those in `spare`: the run awaiting the sub-task, and one still
/// returning the result of this activity's last sub-task) and awaits them. The turn
/// in progress stays open and goes on after `ResumeActivity` (a turn still generating
/// text is interrupted: its speech stops where it was).
pub(crate) struct PauseActivity {
    pub(crate) spare: Vec<u64>,
}

/// The reply is what the task's agent takes over: the chat context once paused (its
/// length is where the sub-task's items go in the transcript, and a sub-task agent may
/// start from it) and the session-scoped items pending for a deferred reply.
impl Message for PauseActivity {
    type Result = Handover;
}

plain_response!(Handover);

impl Handler<PauseActivity> for ActivityActor {
    type Result = ResponseFuture<Handover>;

    fn handle(&mut self, msg: PauseActivity, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.pausing.push(tx);
        self.feed(Input::Pause { spare: msg.spare }, ctx);
        self.detach_realtime(ctx);
        if !self.machine.is_paused() {
            // Not pausable (closing): nothing to stop, answer with what it has.
            let handover = self.handover();
            for waiter in self.pausing.drain(..) {
                let _ = waiter.send(Handover {
                    chat: handover.chat.clone(),
                    pending: handover.pending.clone(),
                });
            }
        }
        Box::pin(async move { rx.await.unwrap_or_default() })
    }
}

/// Sent by the session when the sub-task this activity waited for has ended, with the
/// session-scoped items that were pending in it.
pub(crate) struct ResumeActivity {
    pub(crate) carried: Vec<PendingItem>,
}

impl Message for ResumeActivity {
    type Result = ();
}

impl Handler<ResumeActivity> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: ResumeActivity, ctx: &mut Self::Context) {
        // The caller's configuration and chat go back to the model first.
        self.attach_realtime(ctx);
        self.feed(
            Input::Resume {
                carried: msg.carried,
            },
            ctx,
        );
    }
}

/// Sent by the session to end this activity (handoff, end of a sub-task, session close):
/// runs `on_exit`, stops its toolsets (every run cancelled, given the grace period and
/// awaited), gives unfinished calls their terminal outputs, then stops. The reply is what
/// the next agent takes over, sent once every tool actor of this activity is gone. A
/// second `CloseActivity` (a session closing during a handoff) gets the same context.
pub(crate) struct CloseActivity {
    pub(crate) reason: Arc<str>,
}

impl Message for CloseActivity {
    type Result = Handover;
}

impl Handler<CloseActivity> for ActivityActor {
    type Result = ResponseFuture<Handover>;

    fn handle(&mut self, msg: CloseActivity, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.closing.push(tx);
        self.feed(Input::Close { reason: msg.reason }, ctx);
        self.detach_realtime(ctx);
        // The session's close reaching a handoff's `on_exit` still running bounds it.
        self.bound_exit_hook(ctx);
        Box::pin(async move { rx.await.unwrap_or_default() })
    }
}

/// The output's `PlayoutReporter` reported the end of a speech's playout, in full or cut
/// short with what was heard. Accepted by the session for any speech at any time and
/// relayed to the activity that speaks it; a speech that already ended gets nothing.
pub(crate) struct PlayoutFinished {
    pub(crate) speech: SpeechId,
    pub(crate) interrupted: bool,
    pub(crate) heard: Option<String>,
    /// How much of the speech's audio played, when the output plays audio.
    pub(crate) heard_audio: Option<std::time::Duration>,
}

impl Message for PlayoutFinished {
    type Result = ();
}

impl Handler<PlayoutFinished> for ActivityActor {
    type Result = ();

    fn handle(&mut self, msg: PlayoutFinished, ctx: &mut Self::Context) {
        let mut heard = msg.heard;
        if let (Some(realtime), Some(played), true) =
            (&mut self.realtime, msg.heard_audio, msg.interrupted)
        {
            // The model's item is cut where the user stopped hearing it; the text heard
            // is the same share of what was said, unless the output knew it.
            let estimate = realtime.cut(msg.speech, played, self.machine.chat());
            heard = heard.or(estimate);
        }
        self.feed(
            Input::Playout {
                speech: msg.speech,
                interrupted: msg.interrupted,
                heard,
            },
            ctx,
        );
    }
}

/// Asks for a copy of the current agent's chat context (for the host or a test): sent by
/// the host to the session, which relays it to the current agent or answers that a switch
/// is under way.
pub(crate) struct ReadChat;

impl Message for ReadChat {
    type Result = Read<ChatContext>;
}

impl Handler<ReadChat> for ActivityActor {
    type Result = Read<ChatContext>;

    fn handle(&mut self, _msg: ReadChat, _ctx: &mut Self::Context) -> Self::Result {
        Read::Now(self.machine.chat().clone())
    }
}

/// Asks for this activation's history entry as it is now (none before it started).
pub(crate) struct ReadHistoryEntry;

impl Message for ReadHistoryEntry {
    type Result = LiveEntry;
}

/// A running activation's history entry and its place in start order.
pub(crate) struct LiveEntry(pub(crate) Option<(u32, crate::history::AgentChat)>);

plain_response!(LiveEntry);

impl Handler<ReadHistoryEntry> for ActivityActor {
    type Result = LiveEntry;

    fn handle(&mut self, _msg: ReadHistoryEntry, _ctx: &mut Self::Context) -> Self::Result {
        LiveEntry(self.machine.history_entry(true))
    }
}

/// Sent by the session taking a snapshot: this activation's part — its history entry,
/// its state, what its turn decided — and its own toolsets' calls, read from their books in
/// the same handler, so both are of one point. Answered in mailbox order, after every item
/// relayed to it before.
pub(crate) struct SnapshotActivation;

/// An activation's contribution to a snapshot.
pub(crate) struct ActivationSnapshot {
    pub(crate) part: Part,
    pub(crate) toolsets: Vec<ToolsetState>,
}

impl Message for SnapshotActivation {
    type Result = ActivationSnapshot;
}

plain_response!(ActivationSnapshot);

impl Handler<SnapshotActivation> for ActivityActor {
    type Result = ActivationSnapshot;

    fn handle(&mut self, _msg: SnapshotActivation, _ctx: &mut Self::Context) -> Self::Result {
        ActivationSnapshot {
            part: self.machine.part(),
            toolsets: self
                .books
                .iter()
                .map(|(name, book)| ToolsetState {
                    name: name.clone(),
                    runs: book.states(),
                })
                .filter(|toolset| !toolset.runs.is_empty())
                .collect(),
        }
    }
}

counted_handlers!(
    ActivityActor: StartActivity,
    StartTurn,
    InterruptTurn,
    InterruptSpeech,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscript,
    UserTranscribed,
    Preflight,
    DeliverToolItems,
    AppendItems,
    PauseActivity,
    ResumeActivity,
    CloseActivity,
    PlayoutFinished,
    ReadChat,
    ReadHistoryEntry,
    SnapshotActivation,
);
