//! `ToolsetActor`: the executor of one named group of tools.
//!
//! - **Owns:** the registry of its running calls (one `ToolRunActor` each) and the
//!   duplicate checks.
//! - **Parent:** the session (session-scoped toolsets) or an activity (agent-scoped
//!   toolsets and an agent's bare tools, the toolset `tools`).
//! - **Starts** with its parent; **stops** on `StopToolset`, after every run it owns has
//!   stopped and been awaited.
//! - **Handles:** `RunTool`, `ListRuns` and `CancelRun` (from an activity), `StopRuns` and
//!   `StopToolset` (from its parent), `RunEnded` (from its runs).
//!
//! Guarantees, each tested:
//! - The order on each call is: strip `confirm_duplicate`, parse the arguments, check
//!   duplicates, run. A call whose arguments do not parse never runs and cancels nothing.
//! - When `StopRuns` answers, every run it stopped is gone: actor and body dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use actix::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::agent::Agent;
use crate::chat::FunctionCall;
use crate::ids::ActorId;
use crate::lifecycle::{alive_pair, wait_all, AliveToken, AliveWaiter};
use crate::mailbox::{counted_handlers, Mailbox, Probe};
use crate::outcome::{error_text, CallOutput, Effect};
use crate::prompts::{DuplicatePromptArgs, Prompts};
use crate::session::Scope;
use crate::session_handle::Session;
use crate::tool::{DuplicatePolicy, Tool, CONFIRM_DUPLICATE_PARAM};
use crate::tool_run::{RunSpec, StopRun, ToolRunActor};

struct RunEntry {
    call: FunctionCall,
    step: u64,
    mailbox: Mailbox<ToolRunActor>,
    waiter: Option<AliveWaiter>,
    closed: bool,
    started: tokio::time::Instant,
}

pub(crate) struct ToolsetActor {
    probe: Arc<Probe>,
    scope: Scope,
    tools: HashMap<String, (Tool, DuplicatePolicy)>,
    runs: BTreeMap<u64, RunEntry>,
    session: Session,
    prompts: Arc<Prompts>,
    me: Option<Mailbox<ToolsetActor>>,
    _alive: AliveToken,
}

impl ToolsetActor {
    /// Starts a toolset on the current arbiter. `tools` carry their effective duplicate
    /// policy. Returns its address and the waiter that resolves once it is gone.
    pub(crate) fn spawn(
        id: ActorId,
        scope: Scope,
        tools: Vec<(Tool, DuplicatePolicy)>,
        prompts: Prompts,
        session: Session,
    ) -> (Mailbox<ToolsetActor>, AliveWaiter) {
        let probe = Probe::new(id, session.shared.journal.clone());
        let (alive, waiter) = alive_pair();
        let actor = ToolsetActor {
            probe: probe.clone(),
            scope,
            tools: tools
                .into_iter()
                .map(|(tool, policy)| (tool.name().to_owned(), (tool, policy)))
                .collect(),
            runs: BTreeMap::new(),
            session,
            prompts: Arc::new(prompts),
            me: None,
            _alive: alive,
        };
        (Mailbox::new(actor.start(), probe), waiter)
    }

    /// Running calls of `name` started in an earlier step than `step`.
    fn duplicates_of(&self, name: &str, step: u64) -> Vec<u64> {
        self.runs
            .iter()
            .filter(|(_, run)| !run.closed && run.call.name == name && run.step != step)
            .map(|(key, _)| *key)
            .collect()
    }

    /// Marks runs closed and stops them; resolves once all are gone, with the calls that
    /// were running in the background.
    fn stop_runs(
        &mut self,
        keys: Vec<u64>,
        reason: Arc<str>,
        report: bool,
    ) -> impl std::future::Future<Output = Vec<FunctionCall>> + 'static {
        let mut acks = Vec::new();
        let mut waiters = Vec::new();
        for key in keys {
            let Some(run) = self.runs.get_mut(&key) else {
                continue;
            };
            if run.closed {
                continue;
            }
            run.closed = true;
            let ask = run.mailbox.ask(
                self.probe.id(),
                StopRun {
                    reason: reason.clone(),
                    report,
                },
            );
            acks.push((run.call.clone(), ask));
            if let Some(waiter) = run.waiter.take() {
                waiters.push(waiter);
            }
        }
        async move {
            let mut background = Vec::new();
            for (call, ask) in acks {
                if ask.await.unwrap_or(false) {
                    background.push(call);
                }
            }
            wait_all(waiters).await;
            background
        }
    }

    fn spawn_run(
        &mut self,
        tool: Tool,
        call: FunctionCall,
        step: u64,
        agent: Agent,
        body: crate::tool::PreparedBody,
    ) -> oneshot::Receiver<CallOutput> {
        let key = self.session.shared.next_run();
        let (tx, rx) = oneshot::channel();
        let (alive, waiter) = alive_pair();
        let Some(me) = self.me.clone() else {
            // `me` is set in `started`, which actix runs before any message is handled.
            let _ = tx.send(CallOutput::ended("the toolset is not running"));
            return rx;
        };
        let mailbox = ToolRunActor::spawn(RunSpec {
            key,
            call: call.clone(),
            tool,
            agent,
            scope: self.scope.clone(),
            body,
            immediate: tx,
            session: self.session.clone(),
            prompts: self.prompts.clone(),
            toolset: me,
            alive,
        });
        self.runs.insert(
            key,
            RunEntry {
                call,
                step,
                mailbox,
                waiter: Some(waiter),
                closed: false,
                started: tokio::time::Instant::now(),
            },
        );
        rx
    }
}

impl Actor for ToolsetActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.me = Some(Mailbox::new(ctx.address(), self.probe.clone()));
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.probe.stopped();
    }
}

/// Sent by an activity for each tool call of an LLM step that names a tool of this
/// toolset. The reply is the call's immediate output: its return value, its first
/// update, a duplicate or argument-error answer, or a terminal output if it is stopped
/// first. One per call, so `tell`/`ask` without a bound is safe.
pub(crate) struct RunTool {
    pub(crate) call: FunctionCall,
    /// Identifies the LLM step (calls of one step are never duplicates of each other).
    pub(crate) step: u64,
    /// The agent that made the call (its error policy applies).
    pub(crate) agent: Agent,
}

impl Message for RunTool {
    type Result = CallOutput;
}

impl Handler<RunTool> for ToolsetActor {
    type Result = ResponseActFuture<Self, CallOutput>;

    fn handle(&mut self, msg: RunTool, _ctx: &mut Self::Context) -> Self::Result {
        let ready = |out: CallOutput| -> Self::Result { Box::pin(fut::ready(out)) };
        let Some((tool, policy)) = self.tools.get(&msg.call.name).cloned() else {
            return ready(CallOutput::error(format!(
                "Error: unknown tool {}",
                msg.call.name
            )));
        };
        // 1. Strip `confirm_duplicate` (always: the model may send it to any tool).
        let mut args: Value = if msg.call.arguments.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            match serde_json::from_str(&msg.call.arguments) {
                Ok(value) => value,
                Err(err) => return ready(args_error(tool.name(), &err.to_string())),
            }
        };
        let confirmed = args
            .as_object_mut()
            .and_then(|o| o.remove(CONFIRM_DUPLICATE_PARAM))
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        // 2. Parse (a mock's arguments are checked against the real type too).
        let mock = self.session.shared.mocks.get(tool.name()).cloned();
        let raw = mock.is_some().then(|| args.clone());
        let body = match (tool.def.prepare)(args) {
            Ok(body) => body,
            Err(reason) => return ready(args_error(tool.name(), &reason)),
        };
        let body: crate::tool::PreparedBody = match (mock, raw) {
            (Some(mock), Some(raw)) => Box::new(move |ctx| mock(ctx, raw)),
            _ => body,
        };
        // 3. Duplicates.
        let running = self.duplicates_of(tool.name(), msg.step);
        if !running.is_empty() {
            let calls: Vec<FunctionCall> = running
                .iter()
                .filter_map(|key| self.runs.get(key).map(|r| r.call.clone()))
                .collect();
            let args = || DuplicatePromptArgs {
                function_name: tool.name().to_owned(),
                running_calls: calls.clone(),
            };
            match policy {
                DuplicatePolicy::Allow => {}
                DuplicatePolicy::Reject => {
                    return ready(CallOutput::reply(self.prompts.render_reject(&args())))
                }
                DuplicatePolicy::Confirm if !confirmed => {
                    return ready(CallOutput::reply(self.prompts.render_confirm(&args())))
                }
                DuplicatePolicy::Confirm => {}
                DuplicatePolicy::Replace => {
                    let reason: Arc<str> = Arc::from("replaced by a newer call");
                    let stopping = self.stop_runs(running, reason, true);
                    return Box::pin(stopping.into_actor(self).then(move |_, act, _| {
                        let rx = act.spawn_run(tool, msg.call, msg.step, msg.agent, body);
                        async move { rx.await.unwrap_or_else(|_| lost()) }.into_actor(act)
                    }));
                }
            }
        }
        // 4. Run.
        let rx = self.spawn_run(tool, msg.call, msg.step, msg.agent, body);
        Box::pin(async move { rx.await.unwrap_or_else(|_| lost()) }.into_actor(self))
    }
}

/// The model's arguments did not parse: an error output it can act on, a warning in the
/// log (an expected error: no backtrace).
fn args_error(tool: &str, reason: &str) -> CallOutput {
    tracing::warn!(tool, %reason, "tool arguments did not parse");
    CallOutput::error(format!("Error parsing arguments for {tool}: {reason}"))
}

fn lost() -> CallOutput {
    CallOutput {
        output: error_text("the tool run ended without an output"),
        is_error: true,
        effect: Effect::Reply,
    }
}

/// Sent by a run actor when it stops, so the registry shrinks. One per run.
pub(crate) struct RunEnded {
    pub(crate) key: u64,
}

impl Message for RunEnded {
    type Result = ();
}

impl Handler<RunEnded> for ToolsetActor {
    type Result = ();

    fn handle(&mut self, msg: RunEnded, _ctx: &mut Self::Context) {
        // The entry's waiter, if still here, is dropped with it: nobody waits on it.
        self.runs.remove(&msg.key);
    }
}

/// Sent by the toolset's parent when its scope pauses or closes: stops every running
/// call (but `except`, the run awaiting a sub-task), awaiting each. The reply lists the
/// calls that were running in the background, for which the parent writes a terminal
/// `/finished` output.
pub(crate) struct StopRuns {
    pub(crate) reason: Arc<str>,
    pub(crate) except: Option<u64>,
}

impl Message for StopRuns {
    type Result = Vec<FunctionCall>;
}

impl Handler<StopRuns> for ToolsetActor {
    type Result = ResponseActFuture<Self, Vec<FunctionCall>>;

    fn handle(&mut self, msg: StopRuns, _ctx: &mut Self::Context) -> Self::Result {
        let keys: Vec<u64> = self
            .runs
            .keys()
            .copied()
            .filter(|key| Some(*key) != msg.except)
            .collect();
        Box::pin(self.stop_runs(keys, msg.reason, false).into_actor(self))
    }
}

/// Sent by the toolset's parent to stop it: all runs are stopped and awaited first (their
/// background calls are returned as by `StopRuns`), then the toolset stops.
pub(crate) struct StopToolset {
    pub(crate) reason: Arc<str>,
}

impl Message for StopToolset {
    type Result = Vec<FunctionCall>;
}

impl Handler<StopToolset> for ToolsetActor {
    type Result = ResponseActFuture<Self, Vec<FunctionCall>>;

    fn handle(&mut self, msg: StopToolset, _ctx: &mut Self::Context) -> Self::Result {
        let keys: Vec<u64> = self.runs.keys().copied().collect();
        Box::pin(
            self.stop_runs(keys, msg.reason, false)
                .into_actor(self)
                .map(|background, _, ctx| {
                    ctx.stop();
                    background
                }),
        )
    }
}

/// A running call the model may cancel, as `get_running_tasks` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RunningCall {
    pub(crate) call_id: String,
    pub(crate) name: String,
    pub(crate) arguments: String,
    pub(crate) age_seconds: f64,
}

/// Sent by an activity for the companion tool `get_running_tasks`: the running calls of
/// tools that allow cancellation.
pub(crate) struct ListRuns;

impl Message for ListRuns {
    type Result = Vec<RunningCall>;
}

impl Handler<ListRuns> for ToolsetActor {
    type Result = Vec<RunningCall>;

    fn handle(&mut self, _msg: ListRuns, _ctx: &mut Self::Context) -> Vec<RunningCall> {
        self.runs
            .values()
            .filter(|run| !run.closed)
            .filter(|run| {
                self.tools
                    .get(&run.call.name)
                    .is_some_and(|(tool, _)| tool.allows_cancellation())
            })
            .map(|run| RunningCall {
                call_id: run.call.call_id.clone(),
                name: run.call.name.clone(),
                arguments: run.call.arguments.clone(),
                age_seconds: run.started.elapsed().as_secs_f64(),
            })
            .collect()
    }
}

/// What `CancelRun` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelAnswer {
    /// Stopped and awaited.
    Cancelled,
    /// The call runs here but its tool does not allow cancellation.
    NotCancellable { tool: String },
    /// No running call with that id here.
    Unknown,
}

/// Sent by an activity for the companion tool `cancel_task(call_id)`. The reply comes
/// once the run is gone; its `/finished` output says it was cancelled.
pub(crate) struct CancelRun {
    pub(crate) call_id: String,
}

impl Message for CancelRun {
    type Result = CancelAnswer;
}

impl Handler<CancelRun> for ToolsetActor {
    type Result = ResponseActFuture<Self, CancelAnswer>;

    fn handle(&mut self, msg: CancelRun, _ctx: &mut Self::Context) -> Self::Result {
        let found = self
            .runs
            .iter()
            .find(|(_, run)| !run.closed && run.call.call_id == msg.call_id)
            .map(|(key, run)| (*key, run.call.name.clone()));
        let Some((key, name)) = found else {
            return Box::pin(fut::ready(CancelAnswer::Unknown));
        };
        let allowed = self
            .tools
            .get(&name)
            .is_some_and(|(tool, _)| tool.allows_cancellation());
        if !allowed {
            return Box::pin(fut::ready(CancelAnswer::NotCancellable { tool: name }));
        }
        let stopping = self.stop_runs(vec![key], Arc::from("cancelled by the model"), true);
        Box::pin(
            stopping
                .into_actor(self)
                .map(|_, _, _| CancelAnswer::Cancelled),
        )
    }
}

counted_handlers!(ToolsetActor: RunTool, RunEnded, StopRuns, StopToolset, ListRuns, CancelRun);
