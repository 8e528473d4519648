//! `ToolRunActor`: one running tool call.
//!
//! - **Owns:** the tool body's future (spawned in its context), the call's update counter
//!   and the sender of its immediate output.
//! - **Parent:** the `ToolsetActor` that spawned it. Sends `DeliverToolItems` and
//!   `Handoff` to the session, `RunEnded` to its toolset.
//! - **Starts** when its toolset accepts a `RunTool`; **stops** when the body returns
//!   (after its `/finished` items are in a chat context), or on `StopRun` once the body
//!   has finished or the grace period has passed.
//! - **Handles:** `ToolUpdate` (from the tool's `RunContext`), `StopRun` (from its
//!   toolset).
//!
//! Guarantees, each tested:
//! - The call gets exactly one immediate output: the body's return value, its first
//!   update, or a terminal "cancelled" output when the run is stopped first.
//! - Once `StopRun` is handled, every later `ctx.update` returns `Err` and no item of this
//!   run reaches any chat context.
//! - A panic in the body becomes an error output; it never reaches the actor.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::agent::Agent;
use crate::chat::{ChatItem, FunctionCall, FunctionCallOutput};
use crate::error::UpdateError;
use crate::ids::ActorId;
use crate::lifecycle::AliveToken;
use crate::mailbox::{counted_handlers, Mailbox, Probe};
use crate::outcome::{classify, CallOutput, Effect, ErrorPolicies};
use crate::prompts::{Prompts, UpdatePromptArgs};
use crate::run_context::RunContext;
use crate::session::{CompleteTask, DeliverToolItems, Scope};
use crate::session_handle::Session;
use crate::shared::SessionShared;
use crate::tool::{PreparedBody, Tool, ToolResult};
use crate::toolset::{RunEnded, ToolsetActor};

/// Everything a run needs from its toolset when it starts.
pub(crate) struct RunSpec {
    pub(crate) key: u64,
    pub(crate) call: FunctionCall,
    pub(crate) tool: Tool,
    pub(crate) agent: Agent,
    pub(crate) scope: Scope,
    pub(crate) body: PreparedBody,
    pub(crate) immediate: oneshot::Sender<CallOutput>,
    pub(crate) session: Session,
    pub(crate) prompts: Arc<Prompts>,
    pub(crate) toolset: Mailbox<ToolsetActor>,
    pub(crate) alive: AliveToken,
}

pub(crate) struct ToolRunActor {
    probe: Arc<Probe>,
    key: u64,
    call: FunctionCall,
    tool: Tool,
    agent: Agent,
    scope: Scope,
    shared: Arc<SessionShared>,
    session: Session,
    prompts: Arc<Prompts>,
    toolset: Mailbox<ToolsetActor>,
    body: Option<PreparedBody>,
    immediate: Option<oneshot::Sender<CallOutput>>,
    updates: u32,
    /// Set when the run must have no further effect (stopped, or its body returned).
    closed: bool,
    body_done: bool,
    cancel: watch::Sender<bool>,
    alive: AliveToken,
}

impl ToolRunActor {
    /// Starts a run on the current arbiter; returns its counted address.
    pub(crate) fn spawn(spec: RunSpec) -> Mailbox<ToolRunActor> {
        let shared = spec.session.shared.clone();
        let probe = Probe::new(
            ActorId::tool_run(&shared.id, spec.key, &spec.call.call_id),
            shared.journal.clone(),
        );
        let (cancel, _) = watch::channel(false);
        shared.running_tools.send_modify(|n| *n += 1);
        let actor = ToolRunActor {
            probe: probe.clone(),
            key: spec.key,
            call: spec.call,
            tool: spec.tool,
            agent: spec.agent,
            scope: spec.scope,
            shared,
            session: spec.session,
            prompts: spec.prompts,
            toolset: spec.toolset,
            body: Some(spec.body),
            immediate: Some(spec.immediate),
            updates: 0,
            closed: false,
            body_done: false,
            cancel,
            alive: spec.alive,
        };
        Mailbox::new(actor.start(), probe)
    }

    fn id(&self) -> &ActorId {
        self.probe.id()
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

    fn deliver(
        &self,
        call_id: String,
        output: String,
        is_error: bool,
        reply: bool,
    ) -> impl std::future::Future<Output = Result<(), UpdateError>> + 'static {
        let items = self.item_pair(call_id, output, is_error);
        let fut = self.session.mailbox.ask(
            self.id(),
            DeliverToolItems {
                scope: self.scope.clone(),
                base_call_id: self.call.call_id.clone(),
                items,
                reply,
            },
        );
        async move { fut.await.unwrap_or(Err(UpdateError::SessionClosed)) }
    }

    /// Delivers a terminal `/finished` pair on a task of the arbiter, not of this actor:
    /// actix drops a request whose reply future was dropped, so a delivery spawned in
    /// this actor's context would be lost if the actor stopped before the session handled
    /// it.
    fn deliver_detached(
        &self,
        call_id: String,
        output: String,
        is_error: bool,
        reply: bool,
    ) -> impl std::future::Future<Output = Result<(), UpdateError>> + 'static {
        let task = actix::spawn(self.deliver(call_id, output, is_error, reply));
        async move { task.await.unwrap_or(Err(UpdateError::SessionClosed)) }
    }

    fn on_body_done(
        &mut self,
        result: Result<ToolResult, Box<dyn std::any::Any + Send>>,
        ctx: &mut Context<Self>,
    ) {
        self.body_done = true;
        if self.closed {
            // Stopped while running: whoever stopped it writes the terminal output.
            ctx.stop();
            return;
        }
        self.closed = true;
        let policies = ErrorPolicies {
            levels: [
                &self.tool.def.error_policy,
                &self.agent.def.error_policy,
                &self.shared.error_policy,
            ],
        };
        let out = classify(&self.call.name, &self.call.call_id, result, &policies);
        if let Some(immediate) = self.immediate.take() {
            let _ = immediate.send(out);
            ctx.stop();
            return;
        }
        // Finished in the background, after at least one update.
        if out.is_unit() {
            ctx.stop();
            return;
        }
        if let Effect::Propagate(message) = &out.effect {
            self.shared.emit(crate::events::SessionEvent::Error {
                message: format!("tool {} failed: {message}", self.call.name),
            });
        }
        let (reply, next) = match out.effect {
            Effect::Handoff(handoff) => (false, Some(Next::Handoff(handoff))),
            Effect::CompleteTask(value) => (false, Some(Next::CompleteTask(value))),
            Effect::Quiet => (false, None),
            Effect::Reply | Effect::Propagate(_) => (true, None),
        };
        let finished = format!("{}/finished", self.call.call_id);
        let delivery = self.deliver(finished, out.output, out.is_error, reply);
        let session = self.session.mailbox.clone();
        let me = self.id().clone();
        // Detached from this actor (see `deliver_detached`), and holding no alive token: a
        // handoff may be buffering this delivery while it waits for this run's scope to
        // stop.
        let task = actix::spawn(async move {
            // The handoff (or task end) this run performs does not stop it: the body has
            // returned already.
            match (delivery.await, next) {
                (Ok(()), Some(Next::Handoff(handoff))) => session.tell(&me, handoff),
                (Ok(()), Some(Next::CompleteTask(value))) => {
                    session.tell(&me, CompleteTask { value })
                }
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

/// What a background run's final result asks the session to do after its `/finished`.
enum Next {
    Handoff(crate::session::Handoff),
    CompleteTask(serde_json::Value),
}

impl Actor for ToolRunActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let Some(body) = self.body.take() else {
            return;
        };
        let run_ctx = RunContext::new(
            Mailbox::new(ctx.address(), self.probe.clone()),
            self.session.clone(),
            self.call.clone(),
            self.key,
            self.cancel.subscribe(),
        );
        let alive = self.alive.clone();
        let fut = async move {
            // Declared first so it drops last: the toolset's wait for this run ends only
            // once the body future is gone.
            let _alive = alive;
            AssertUnwindSafe(body(run_ctx)).catch_unwind().await
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(|result, act, ctx| act.on_body_done(result, ctx)),
        );
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.closed = true;
        if let Some(immediate) = self.immediate.take() {
            let _ = immediate.send(CallOutput::ended("the tool stopped"));
        }
        self.probe.stopped();
        self.shared
            .running_tools
            .send_modify(|n| *n = n.saturating_sub(1));
        self.toolset
            .tell(self.probe.id(), RunEnded { key: self.key });
    }
}

/// Sent by a tool's `RunContext` for each `ctx.update(..)`; the reply says whether the
/// update reached a chat context. Sent with `send().await`: a tool that updates in a
/// loop waits for room instead of growing the queue.
pub(crate) struct ToolUpdate {
    pub(crate) message: UpdateMessage,
}

/// An update's content: text (wrapped by the `update` template) or a structured value
/// (passed as is).
#[derive(Debug, Clone)]
pub enum UpdateMessage {
    /// Text, wrapped by the update template.
    Text(String),
    /// A JSON value, recorded as is.
    Json(Value),
}

impl From<String> for UpdateMessage {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}
impl From<&str> for UpdateMessage {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}
impl From<Value> for UpdateMessage {
    fn from(value: Value) -> Self {
        Self::Json(value)
    }
}

impl Message for ToolUpdate {
    type Result = Result<(), UpdateError>;
}

impl Handler<ToolUpdate> for ToolRunActor {
    type Result = ResponseActFuture<Self, Result<(), UpdateError>>;

    fn handle(&mut self, msg: ToolUpdate, _ctx: &mut Self::Context) -> Self::Result {
        if self.closed {
            let err = UpdateError::RunEnded {
                call_id: self.call.call_id.clone(),
            };
            return Box::pin(fut::ready(Err(err)));
        }
        let text = match msg.message {
            UpdateMessage::Text(message) => self.prompts.render_update(&UpdatePromptArgs {
                function_name: self.call.name.clone(),
                call_id: self.call.call_id.clone(),
                message,
            }),
            UpdateMessage::Json(value) => value.to_string(),
        };
        if let Some(immediate) = self.immediate.take() {
            // The first update answers the LLM step; the tool goes on in the background.
            let _ = immediate.send(CallOutput::reply(text));
            return Box::pin(fut::ready(Ok(())));
        }
        self.updates += 1;
        let call_id = format!("{}/update_{}", self.call.call_id, self.updates);
        Box::pin(self.deliver(call_id, text, false, true).into_actor(self))
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
        let already_closed = self.closed;
        self.closed = true;
        let _ = self.cancel.send(true);
        let background = match self.immediate.take() {
            Some(immediate) => {
                let _ = immediate.send(CallOutput::ended(&msg.reason));
                false
            }
            // The immediate output was given: the body runs on in the background unless it
            // has returned (returning sets `closed`, so `body_done` alone decides).
            None => !self.body_done,
        };
        if self.body_done {
            ctx.stop();
            return background;
        }
        if msg.report && background && !already_closed {
            let out = CallOutput::ended(&msg.reason);
            let finished = format!("{}/finished", self.call.call_id);
            // Fire and forget: the item reaches the chat context even once this run is gone.
            drop(self.deliver_detached(finished, out.output, false, false));
        }
        ctx.run_later(self.shared.config.grace_period, |act, ctx| {
            if !act.body_done {
                tracing::debug!(call_id = %act.call.call_id, "grace period over: dropping the tool body");
            }
            ctx.stop();
        });
        background
    }
}

counted_handlers!(ToolRunActor: ToolUpdate, StopRun);
