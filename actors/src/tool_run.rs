//! `ToolRunActor`: one running tool call.
//!
//! - **Owns:** the tool body's future (spawned in its context), the call's update counter
//!   and the sender of its immediate output.
//! - **Parent:** the `ToolsetActor` that spawned it. Reaches the session only through its
//!   links (`SessionLinks`: items, a handoff, a task's completion or start) and its
//!   toolset through a `RunEnded` link.
//! - **Starts** when its toolset accepts a `RunTool`; **stops** when the body returns
//!   (after its `/finished` items are in a chat context), or on `StopRun` once the body
//!   has finished or the grace period has passed.
//! - **Handles:** `ToolUpdate` (from the tool's `RunContext`), `StopRun` and `InterruptRun`
//!   (from its toolset).
//!
//! Guarantees, each tested:
//! - The call gets exactly one immediate output: the body's return value, its first
//!   update, the placeholder of an interruption, or a terminal "cancelled" output when
//!   the run is stopped first.
//! - Once `StopRun` is handled, every later `ctx.update` returns `Err` and no item of this
//!   run reaches any chat context.
//! - A panic in the body becomes an error output; it never reaches the actor.
//! - In a session that saves to a store, the body of an `Abandon` tool's call starts only
//!   once a stored snapshot holds the call (`SessionLinks::record_call`); when the store
//!   cannot hold it within the bound, or the run is stopped first, the body never starts
//!   (the call's output says it was not made).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::activity::DeliverToolItems;
use crate::agent::Agent;
use crate::chat::{ChatItem, FunctionCall, FunctionCallOutput};
use crate::control::SessionControl;
use crate::delivery::{DeliveryAnswer, Scope, TaskAsker};
use crate::error::{SessionError, UpdateError};
use crate::events::Unfinished;
use crate::heartbeat;
use crate::ids::ActorId;
use crate::lifecycle::AliveToken;
use crate::mailbox::{counted_handlers, Link, Mailbox, Probe};
use crate::outcome::{
    classify, finish_in_background, vet, AfterFinished, BackgroundFinish, CallOutput, ErrorPolicies,
};
use crate::prompts::{Prompts, UpdatePromptArgs};
use crate::reentry;
use crate::run_context::{RunContext, RunPort, UpdateMessage};
use crate::session::SessionLinks;
use crate::shared::SessionShared;
use crate::speech::{Interruptibility, SpeechHandle};
use crate::telemetry::{Cause, Stopwatch};
use crate::tool::{PreparedBody, Tool, ToolResult};
use crate::toolset::{Progress, Replayed, RunEnded};

/// Why a call cancelled by an interruption stopped ("Cancelled: the user interrupted.").
const INTERRUPTED: &str = "the user interrupted";

/// Everything a run needs from its toolset when it starts.
pub(crate) struct RunSpec {
    pub(crate) key: u64,
    pub(crate) call: FunctionCall,
    pub(crate) tool: Tool,
    pub(crate) agent: Agent,
    pub(crate) is_task: bool,
    pub(crate) interruptibility: Arc<Interruptibility>,
    pub(crate) speech: Option<SpeechHandle>,
    /// What made the call (its turn), for the run's span (telemetry).
    pub(crate) cause: Cause,
    pub(crate) scope: Scope,
    pub(crate) body: PreparedBody,
    /// For a call whose body starts only once a stored snapshot holds it: how long it
    /// waits for that.
    pub(crate) record: Option<Duration>,
    /// Where its immediate output goes; none for a call restored from a snapshot, which
    /// runs in the background from the start.
    pub(crate) immediate: Option<oneshot::Sender<CallOutput>>,
    pub(crate) progress: Arc<Progress>,
    pub(crate) shared: Arc<SessionShared>,
    pub(crate) links: Arc<SessionLinks>,
    pub(crate) prompts: Arc<Prompts>,
    pub(crate) toolset: Link<RunEnded>,
    pub(crate) alive: AliveToken,
}

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunPhase {
    /// The body has not started: it waits for a stored snapshot holding the call (an
    /// `Abandon` tool's, in a session that saves to a store).
    Recording,
    /// The body runs; its updates are taken.
    Running,
    /// Stopped (cancelled, replaced, its scope closed): nothing of it lands any more; the
    /// body has the grace period to end.
    Stopped,
    /// The body returned.
    Returned,
}

pub(crate) struct ToolRunActor {
    probe: Arc<Probe>,
    key: u64,
    call: Arc<FunctionCall>,
    tool: Tool,
    agent: Agent,
    is_task: bool,
    /// The calling turn's interruptions, which the tool may hold off while it runs.
    hold: Arc<InterruptionHold>,
    speech: Option<SpeechHandle>,
    /// What made the call, and when the run started (telemetry; empty without it).
    cause: Cause,
    started: Stopwatch,
    scope: Scope,
    shared: Arc<SessionShared>,
    links: Arc<SessionLinks>,
    prompts: Arc<Prompts>,
    toolset: Link<RunEnded>,
    body: Option<PreparedBody>,
    record: Option<Duration>,
    immediate: Option<oneshot::Sender<CallOutput>>,
    progress: Arc<Progress>,
    phase: RunPhase,
    /// A call-long run stopped in the background by its scope: its body's result is kept
    /// (see `Tool::call_long`).
    keep_result: bool,
    cancel: watch::Sender<bool>,
    alive: AliveToken,
}

impl ToolRunActor {
    /// Starts a run on the current arbiter; returns its counted address.
    pub(crate) fn spawn(spec: RunSpec) -> Mailbox<ToolRunActor> {
        let probe = Probe::tool_run(
            ActorId::tool_run(spec.shared.id(), spec.key, &spec.call.call_id),
            spec.shared.journal.clone(),
            spec.tool.name(),
            spec.agent.name(),
        );
        let (cancel, _) = watch::channel(false);
        spec.shared
            .host_view
            .tool_run_started(spec.tool.is_call_long());
        let actor = ToolRunActor {
            probe: probe.clone(),
            key: spec.key,
            call: Arc::new(spec.call),
            tool: spec.tool,
            agent: spec.agent,
            is_task: spec.is_task,
            hold: Arc::new(InterruptionHold {
                interruptibility: spec.interruptibility,
                held: AtomicBool::new(false),
            }),
            speech: spec.speech,
            cause: spec.cause,
            started: Stopwatch::start(),
            scope: spec.scope,
            shared: spec.shared,
            links: spec.links,
            prompts: spec.prompts,
            toolset: spec.toolset,
            body: Some(spec.body),
            record: spec.record,
            immediate: spec.immediate,
            progress: spec.progress,
            phase: RunPhase::Running,
            keep_result: false,
            cancel,
            alive: spec.alive,
        };
        Mailbox::new(actor.start(), probe)
    }

    fn id(&self) -> &ActorId {
        self.probe.id()
    }

    /// Waits, bounded, for a stored snapshot holding the call, then starts the body — or
    /// ends the call without it (see [`recorded`](Self::recorded)).
    fn record(&mut self, bound: Duration, ctx: &mut Context<Self>) {
        self.phase = RunPhase::Recording;
        let recorded = self.links.record_call(self.id(), &self.call.call_id);
        let wait = async move {
            match tokio::time::timeout(bound, recorded).await {
                Ok(recorded) => recorded,
                Err(_) => Err(format!("the store did not answer within {bound:?}")),
            }
        };
        // The run's own future: dropped when the run stops, so a stopped call's body can
        // never start.
        ctx.spawn(
            wait.into_actor(self)
                .map(|recorded, act, ctx| act.recorded(recorded, ctx)),
        );
    }

    /// The store holds the call (its body starts), or cannot (`Err`, why): the body never
    /// starts, and the call's output says it was not made.
    fn recorded(&mut self, recorded: Result<(), String>, ctx: &mut Context<Self>) {
        if self.phase != RunPhase::Recording {
            // Stopped meanwhile: its stop gave the call its output.
            return;
        }
        let reason = match recorded {
            Ok(()) => {
                self.phase = RunPhase::Running;
                self.start_body(ctx);
                return;
            }
            Err(reason) => reason,
        };
        let message = format!(
            "the call {} of {} was not made: it could not be recorded in the session's store ({reason})",
            self.call.call_id, self.call.name
        );
        tracing::warn!(session = %self.shared.id(), "{message}");
        self.shared
            .events
            .emit(crate::events::SessionEvent::Error { message });
        self.phase = RunPhase::Returned;
        self.progress.over();
        self.give(
            CallOutput::error(format!(
                "Error: {} was not called: the call could not be recorded, so it was not made ({reason}).",
                self.call.name
            )),
            ctx,
        );
    }

    fn item_pair(&self, call_id: String, output: String, is_error: bool) -> Vec<ChatItem> {
        vec![
            ChatItem::FunctionCall(FunctionCall {
                call_id: call_id.clone(),
                name: self.call.name.clone(),
                arguments: self.call.arguments.clone(),
            }),
            ChatItem::FunctionCallOutput(FunctionCallOutput {
                call_id,
                name: self.call.name.clone(),
                output,
                is_error,
            }),
        ]
    }

    /// Sends an output of this call (`/update_n`, `/finished`) to the session; `answer`
    /// hears once it is in a chat context.
    fn deliver(
        &self,
        call_id: String,
        output: String,
        is_error: bool,
        reply: bool,
        answer: DeliveryAnswer,
    ) {
        let items = self.item_pair(call_id, output, is_error);
        self.links.deliver(
            self.id(),
            DeliverToolItems {
                scope: self.scope.clone(),
                base_call_id: self.call.call_id.clone(),
                items,
                reply,
                answer,
            },
        );
    }

    /// [`deliver`](Self::deliver), resolving once the output is in a chat context.
    fn deliver_awaited(
        &self,
        call_id: String,
        output: String,
        is_error: bool,
        reply: bool,
    ) -> impl std::future::Future<Output = Result<(), UpdateError>> + Send + 'static {
        let (answer, heard) = DeliveryAnswer::awaited();
        self.deliver(call_id, output, is_error, reply, answer);
        heard
    }

    /// Stops the run: nothing of it lands any more, `ctx.cancelled()` resolves, and the
    /// actor stops when the body ends or the grace period is over. A call still without
    /// an immediate output gets "Cancelled: {reason}.". Returns whether the call was
    /// running in the background (its immediate output given, its body not returned).
    fn stop(&mut self, reason: &str, ctx: &mut Context<Self>) -> bool {
        let returned = self.phase == RunPhase::Returned;
        // A body that never started has nothing to wait for: the run stops at once, and the
        // wait for its record is dropped with it.
        let unstarted = self.phase == RunPhase::Recording;
        // Stopped before (an interruption, the model's cancel): that stop ended the call,
        // so a second one (a handoff or close within the grace period) must not write a
        // second terminal output for it.
        let stopped = self.phase == RunPhase::Stopped;
        self.phase = RunPhase::Stopped;
        self.progress.over();
        let _ = self.cancel.send(true);
        let background = match self.immediate.take() {
            Some(immediate) => {
                let _ = immediate.send(CallOutput::ended(reason));
                false
            }
            None => !returned && !stopped,
        };
        if returned || unstarted {
            ctx.stop();
        } else {
            ctx.run_later(self.shared.settings.config.grace_period, |act, ctx| {
                if act.phase != RunPhase::Returned {
                    act.shared.unfinished.report(
                        &act.shared,
                        Unfinished::ToolBody {
                            call_id: act.call.call_id.clone(),
                            tool: act.call.name.clone(),
                        },
                    );
                }
                ctx.stop();
            });
        }
        background
    }

    fn on_body_done(
        &mut self,
        result: Result<ToolResult, Box<dyn std::any::Any + Send>>,
        ctx: &mut Context<Self>,
    ) {
        let was = std::mem::replace(&mut self.phase, RunPhase::Returned);
        // Its last output is on its way (or its stopper's to write): a snapshot no longer
        // holds it.
        self.progress.over();
        if was == RunPhase::Stopped {
            // Stopped while running: whoever stopped it writes the terminal output — a
            // call-long tool's own result, if it returned one in time.
            if self.keep_result {
                let out = classify(
                    &self.call.name,
                    &self.call.call_id,
                    result,
                    &ErrorPolicies {
                        levels: [
                            &self.tool.def.error_policy,
                            &self.agent.def.error_policy,
                            &self.shared.settings.error_policy,
                        ],
                    },
                );
                let kept = (!out.is_unit()).then_some((out.output, out.is_error));
                self.progress.keep(kept);
            }
            ctx.stop();
            return;
        }
        let policies = ErrorPolicies {
            levels: [
                &self.tool.def.error_policy,
                &self.agent.def.error_policy,
                &self.shared.settings.error_policy,
            ],
        };
        let out = classify(&self.call.name, &self.call.call_id, result, &policies);
        let shared = &self.shared;
        let out = vet(out, self.is_task, |agent| {
            shared
                .settings
                .check_agent(agent)
                .map(drop)
                .map_err(|err| err.to_string())
        });
        self.give(out, ctx);
    }

    /// The call's last output: its step's, or — after an update or an interruption — its
    /// `/finished` in the background; the run stops once it is given.
    fn give(&mut self, out: CallOutput, ctx: &mut Context<Self>) {
        if let Some(immediate) = self.immediate.take() {
            let _ = immediate.send(out);
            ctx.stop();
            return;
        }
        // Finished in the background, after an update or an interruption.
        let BackgroundFinish::Finished {
            output,
            is_error,
            reply,
            then,
            error_event,
        } = finish_in_background(&self.call.name, out)
        else {
            ctx.stop();
            return;
        };
        if let Some(message) = error_event {
            self.shared
                .events
                .emit(crate::events::SessionEvent::Error { message });
        }
        let finished = format!("{}/finished", self.call.call_id);
        let delivery = self.deliver_awaited(finished, output, is_error, reply);
        let links = self.links.clone();
        let me = self.id().clone();
        // On a task of the arbiter, not of this actor: actix drops a request whose reply
        // future is dropped, and this actor's futures are dropped when it stops. It holds
        // no alive token: a handoff may hold this delivery while it waits for this run's
        // scope to stop.
        let task = actix::spawn(async move {
            // The handoff (or task end) this run performs does not stop it: the body has
            // returned already.
            match (delivery.await, then) {
                (Ok(()), AfterFinished::Handoff(handoff)) => {
                    if let Err(err) = links.queue_handoff(&me, handoff).await {
                        tracing::warn!(%err, "a background tool's handoff was refused");
                    }
                }
                (Ok(()), AfterFinished::CompleteTask(value)) => links.complete_task(&me, value),
                _ => {}
            }
        });
        ctx.spawn(
            async move {
                let _ = task.await;
            }
            .into_actor(self)
            .map(|(), _, ctx| ctx.stop()),
        );
    }
}

/// A tool's hold on its turn's interruptions: taken by `ctx.disallow_interruptions()`,
/// released when the run stops.
struct InterruptionHold {
    interruptibility: Arc<Interruptibility>,
    held: AtomicBool,
}

impl InterruptionHold {
    fn take(&self) {
        if !self.held.swap(true, Ordering::Relaxed) {
            self.interruptibility.hold();
        }
    }

    fn release(&self) {
        if self.held.swap(false, Ordering::Relaxed) {
            self.interruptibility.release();
        }
    }
}

/// What a tool's `RunContext` reaches: this run (updates) and the session (a sub-task),
/// by narrow links.
struct RunLinks {
    id: ActorId,
    call_id: Arc<str>,
    key: u64,
    /// Its scope: a sub-task it asks for is dropped once its activity is no longer current.
    scope: Scope,
    /// This run's address; the context sends it only `ToolUpdate` (the port's one method).
    update: Mailbox<ToolRunActor>,
    session: Arc<SessionLinks>,
    hold: Arc<InterruptionHold>,
    speech: Option<SpeechHandle>,
    progress: Arc<Progress>,
    /// The session's state, for its slots on the blocking pool, made at its first
    /// blocking job (most sessions never run one). Weak: a context kept past its run keeps
    /// nothing of the session.
    session_state: std::sync::Weak<SessionShared>,
}

impl RunPort for RunLinks {
    fn id(&self) -> &ActorId {
        &self.id
    }

    fn update(
        &self,
        message: UpdateMessage,
        reply: bool,
    ) -> BoxFuture<'static, Result<(), UpdateError>> {
        let (answer, heard) = oneshot::channel();
        self.update.tell(
            &self.id,
            ToolUpdate {
                message,
                reply,
                answer,
            },
        );
        let call_id = self.call_id.clone();
        let progress = self.progress.clone();
        async move {
            // No answer: the run was gone before it read the update.
            let answer = heard.await.unwrap_or_else(|_| {
                Err(UpdateError::RunEnded {
                    call_id: call_id.to_string(),
                })
            });
            progress.answered(answer.is_ok());
            answer
        }
        .boxed()
    }

    fn disallow_interruptions(&self) {
        self.hold.take();
    }

    fn blocking_slots(&self) -> Option<Arc<tokio::sync::Semaphore>> {
        let shared = self.session_state.upgrade()?;
        Some(
            shared
                .blocking
                .slots(shared.settings.config.max_blocking_jobs),
        )
    }

    fn speech(&self) -> Option<&SpeechHandle> {
        self.speech.as_ref()
    }

    fn run_task(&self, agent: Agent) -> BoxFuture<'static, Result<Value, SessionError>> {
        let asker = TaskAsker {
            run: self.key,
            scope: self.scope.clone(),
        };
        self.session.run_task(&self.id, agent, asker).boxed()
    }

    fn checkpoint(&self, value: Value) {
        self.progress.checkpoint(value);
    }

    fn restored(&self) -> Option<&Option<Value>> {
        self.progress.restored_checkpoint()
    }
}

impl Actor for ToolRunActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        match self.record {
            Some(bound) => self.record(bound, ctx),
            None => self.start_body(ctx),
        }
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.shared
            .telemetry
            .tool_ended(&self.started, &self.call.name);
        self.phase = RunPhase::Stopped;
        self.hold.release();
        if let Some(immediate) = self.immediate.take() {
            let _ = immediate.send(CallOutput::ended("the tool stopped"));
        }
        self.probe.stopped();
        self.shared
            .host_view
            .tool_run_ended(self.tool.is_call_long());
        self.toolset
            .tell(self.probe.id(), RunEnded { key: self.key });
    }
}

impl ToolRunActor {
    /// Starts the body, in the run's context.
    fn start_body(&mut self, ctx: &mut Context<Self>) {
        let Some(body) = self.body.take() else {
            return;
        };
        let port = Arc::new(RunLinks {
            id: self.id().clone(),
            call_id: Arc::from(self.call.call_id.as_str()),
            key: self.key,
            scope: self.scope.clone(),
            update: Mailbox::new(ctx.address(), self.probe.clone()),
            session: self.links.clone(),
            hold: self.hold.clone(),
            speech: self.speech.clone(),
            progress: self.progress.clone(),
            session_state: Arc::downgrade(&self.shared),
        });
        let control = SessionControl::new(
            self.shared.id().clone(),
            self.id().clone(),
            self.links.clone(),
            self.shared.settings.userdata.clone(),
        );
        let run_ctx = RunContext::new(port, control, self.call.clone(), self.cancel.subscribe());
        let alive = self.alive.clone();
        let session = self.shared.id().clone();
        let span = tracing::info_span!(
            parent: self.cause.parent(&self.shared.span, &self.shared.telemetry),
            "tool_run",
            session = %self.shared.id(),
            agent = %self.agent.name(),
            tool = %self.call.name,
            call_id = %self.call.call_id,
            run = %self.probe.id(),
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %self.call.name,
            "gen_ai.tool.call.id" = %self.call.call_id,
            "gen_ai.agent.name" = %self.agent.name(),
            "gen_ai.conversation.id" = %self.shared.id(),
        );
        let body = reentry::inside(session, AssertUnwindSafe(body(run_ctx)).catch_unwind())
            .instrument(span);
        // Named in a stall report if it holds the arbiter (only while a monitor runs).
        let mark = heartbeat::mark(|| (self.shared.id().clone(), self.call.clone()));
        let body = heartbeat::watched(body, mark);
        let fut = async move {
            // Declared first so it drops last: the toolset's wait for this run ends only
            // once the body future is gone.
            let _alive = alive;
            body.await
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(|result, act, ctx| act.on_body_done(result, ctx)),
        );
    }
}

/// Sent by a tool's `RunContext` for each `ctx.update(..)`; `answer` says whether the
/// update reached a chat context. Told, with the answer inside: it is passed on to the
/// session and the activity, so an update costs no reply future at any hop and its answer
/// does not depend on this run living on (a body that returns while an update it handed
/// out waits behind its step must not turn that update into an `Err` for an item that
/// then lands). Bounded: each `update` awaits its answer, so a tool that updates in a
/// loop has one update on its way.
pub(crate) struct ToolUpdate {
    pub(crate) message: UpdateMessage,
    /// Whether the model is asked to answer it (`false`: `update_silently`).
    pub(crate) reply: bool,
    pub(crate) answer: oneshot::Sender<Result<(), UpdateError>>,
}

impl Message for ToolUpdate {
    type Result = ();
}

impl Handler<ToolUpdate> for ToolRunActor {
    type Result = ();

    fn handle(&mut self, msg: ToolUpdate, _ctx: &mut Self::Context) {
        if self.phase != RunPhase::Running {
            let _ = msg.answer.send(Err(UpdateError::RunEnded {
                call_id: self.call.call_id.clone(),
            }));
            return;
        }
        let text = match msg.message {
            UpdateMessage::Text(message) => self.prompts.render_update(&UpdatePromptArgs {
                function_name: self.call.name.clone(),
                call_id: self.call.call_id.clone(),
                message,
            }),
            UpdateMessage::Json(value) => value.to_string(),
        };
        let said = crate::toolset::digest(&text);
        match self.progress.replays(said) {
            Replayed::No => {}
            // A body run again says what the call said before the snapshot, in its place:
            // the chat holds it (the user heard it, or will once its step is in). Not
            // delivered again; answered as the first one is.
            Replayed::Landed => {
                let _ = msg.answer.send(Ok(()));
                return;
            }
            Replayed::WhenHeldLands(held) => {
                held.wait(msg.answer);
                return;
            }
        }
        if let Some(immediate) = self.immediate.take() {
            // The first update answers the LLM step; the tool goes on in the background.
            let output = if msg.reply {
                CallOutput::reply(text)
            } else {
                CallOutput::quiet(text)
            };
            self.progress.first_update(said);
            let _ = immediate.send(output);
            let _ = msg.answer.send(Ok(()));
            return;
        }
        let n = self.progress.next_update(said);
        let call_id = format!("{}/update_{n}", self.call.call_id);
        self.deliver(
            call_id,
            text,
            false,
            msg.reply,
            DeliveryAnswer::to(msg.answer),
        );
    }
}

/// Sent by the toolset to stop this run (its scope pauses or closes, the model cancels
/// it, or a `replace` duplicate supersedes it). Fires `ctx.cancelled()`, then stops the
/// actor when the body finishes or the grace period ends. The reply says whether the
/// run was in the background (its immediate output already given).
pub(crate) struct StopRun {
    pub(crate) reason: Arc<str>,
    /// Deliver the terminal `/finished` output through the session (the scope lives on);
    /// otherwise the stopper writes it.
    pub(crate) report: bool,
}

impl Message for StopRun {
    type Result = bool;
}

impl Handler<StopRun> for ToolRunActor {
    type Result = bool;

    fn handle(&mut self, msg: StopRun, ctx: &mut Self::Context) -> bool {
        let already_stopped = self.phase == RunPhase::Stopped;
        let background = self.stop(&msg.reason, ctx);
        // Its scope stops (a pause, a handoff, the close): the end of the call a call-long
        // tool runs for, whose result is its own.
        self.keep_result = self.tool.is_call_long() && background && !msg.report;
        if msg.report && background && !already_stopped {
            let out = CallOutput::ended(&msg.reason);
            let finished = format!("{}/finished", self.call.call_id);
            // Fire and forget: told to the session, the item reaches the chat context
            // even once this run is gone.
            self.deliver(
                finished,
                out.output,
                false,
                false,
                DeliveryAnswer::unheard(),
            );
        }
        background
    }
}

/// Sent by the toolset when the turn that made this call is interrupted before the call
/// has an output: a tool that cancels on interruption is cancelled ("Cancelled: the user
/// interrupted."); any other moves to the background at once with a short placeholder,
/// and its result arrives later as `/finished` with a deferred reply. A call that already
/// has its output is not touched.
pub(crate) struct InterruptRun {
    pub(crate) cancel: bool,
}

impl Message for InterruptRun {
    type Result = ();
}

impl Handler<InterruptRun> for ToolRunActor {
    type Result = ();

    fn handle(&mut self, msg: InterruptRun, ctx: &mut Self::Context) {
        // A call whose body waits to be recorded is interrupted as one whose body runs: a
        // cancelling tool's body then never starts.
        let live = matches!(self.phase, RunPhase::Running | RunPhase::Recording);
        if self.immediate.is_none() || !live {
            return;
        }
        if msg.cancel {
            self.stop(INTERRUPTED, ctx);
        } else if let Some(immediate) = self.immediate.take() {
            let _ = immediate.send(CallOutput::moved_to_background());
        }
    }
}

counted_handlers!(ToolRunActor: ToolUpdate, StopRun, InterruptRun);
