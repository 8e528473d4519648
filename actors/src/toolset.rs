//! `ToolsetActor`: the executor of one named group of tools.
//!
//! - **Owns:** the registry of its running calls (one `ToolRunActor` each) and the
//!   duplicate checks.
//! - **Parent:** the session (session-scoped toolsets) or an activity (agent-scoped
//!   toolsets and an agent's bare tools, the toolset `tools`).
//! - **Starts** with its parent; **stops** on `StopToolset`, after every run it owns has
//!   stopped and been awaited.
//! - **Handles:** `RunTool`, `InterruptStep`, `ListRuns` and `CancelRun` (from an
//!   activity), `StopRuns` and `StopToolset` (from its parent), `RunEnded` (from its runs).
//!
//! Guarantees, each tested:
//! - The order on each call is: strip `confirm_duplicate`, parse the arguments, check
//!   duplicates, run. A call whose arguments do not parse never runs and cancels nothing.
//! - When `StopRuns` answers, every run it stopped is gone: actor and body dropped.
//! - An interrupted step's calls without an output are cancelled (tools that cancel on
//!   interruption) or moved to the background, even a call still waiting for a
//!   `replace` duplicate to stop.

mod duplicates;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::agent::Agent;
use crate::chat::FunctionCall;
use crate::delivery::Scope;
use crate::error::SessionError;
use crate::ids::ActorId;
use crate::lifecycle::{alive_pair, AliveToken, Child};
use crate::mailbox::{counted_handlers, plain_response, Link, Mailbox, Probe};
use crate::outcome::{error_text, excerpt, CallOutput, Effect, StoppedCall, QUOTE_LIMIT};
use crate::prompts::{DuplicatePromptArgs, Prompts};
use crate::session::SessionLinks;
use crate::shared::SessionShared;
use crate::speech::{Interruptibility, SpeechHandle};
use crate::telemetry::Cause;
use crate::tool::{DuplicatePolicy, PreparedBody, Tool, ToolReturn, CONFIRM_DUPLICATE_PARAM};
use crate::tool_run::{InterruptRun, Progress, RunSpec, StopRun, ToolRunActor};

use duplicates::{is_duplicate, on_duplicate, OnDuplicate, Running};

/// How many interrupted steps a toolset remembers for calls still being set up (a
/// `replace` waiting for the old run to stop): steps of one activity are sequential, so a
/// handful covers every activity it serves.
const REMEMBERED_INTERRUPTS: usize = 16;

struct RunEntry {
    call: FunctionCall,
    step: u64,
    /// Whether the turn that made the call may be interrupted now: `cancel_task` refuses
    /// a call whose speech holds interruptions off.
    interruptibility: Arc<Interruptibility>,
    child: Child<ToolRunActor>,
    closed: bool,
    started: tokio::time::Instant,
    progress: Arc<Progress>,
}

pub(crate) struct ToolsetActor {
    probe: Arc<Probe>,
    scope: Scope,
    tools: HashMap<String, (Tool, DuplicatePolicy)>,
    runs: BTreeMap<u64, RunEntry>,
    shared: Arc<SessionShared>,
    links: Arc<SessionLinks>,
    prompts: Arc<Prompts>,
    /// What its runs send back when they stop.
    ended: Link<RunEnded>,
    interrupted_steps: VecDeque<u64>,
    /// Set once `StopToolset` is handled: no run starts any more (a call still being set
    /// up, such as a `replace` waiting for the runs it cancels, gets a terminal output),
    /// so the runs that stop is waiting for are all there are.
    closing: Option<Arc<str>>,
    _alive: AliveToken,
}

impl ToolsetActor {
    /// Starts a toolset on the current arbiter. `tools` carry their effective duplicate
    /// policy.
    pub(crate) fn spawn(
        id: ActorId,
        scope: Scope,
        tools: Vec<(Tool, DuplicatePolicy)>,
        prompts: Prompts,
        shared: Arc<SessionShared>,
        links: Arc<SessionLinks>,
    ) -> Child<ToolsetActor> {
        let probe = Probe::new(id, shared.journal.clone());
        let (alive, gone) = alive_pair();
        let actor_probe = probe.clone();
        let addr = ToolsetActor::create(move |ctx| ToolsetActor {
            ended: Mailbox::new(ctx.address(), actor_probe.clone()).link(),
            probe: actor_probe,
            scope,
            tools: tools
                .into_iter()
                .map(|(tool, policy)| (tool.name().to_owned(), (tool, policy)))
                .collect(),
            runs: BTreeMap::new(),
            shared,
            links,
            prompts: Arc::new(prompts),
            interrupted_steps: VecDeque::new(),
            closing: None,
            _alive: alive,
        });
        Child::new(Mailbox::new(addr, probe), gone)
    }

    /// Running calls that a call of `name` in step `step` duplicates.
    fn duplicates_of(&self, name: &str, step: u64) -> Vec<u64> {
        self.runs
            .iter()
            .filter(|(_, run)| {
                let running = Running {
                    tool: &run.call.name,
                    step: run.step,
                    stopping: run.closed,
                };
                is_duplicate(running, name, step)
            })
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
    ) -> impl std::future::Future<Output = Vec<StoppedCall>> + 'static {
        type Stopping = (
            Option<(FunctionCall, Arc<Progress>)>,
            BoxFuture<'static, Option<bool>>,
        );
        let mut stops: Vec<Stopping> = Vec::new();
        for key in keys {
            let Some(run) = self.runs.get_mut(&key) else {
                continue;
            };
            if run.closed {
                // Already stopping (a pause, a cancel, a `replace`, whose stop writes its
                // output): wait for it all the same, so that whoever stops this toolset
                // knows every run is gone when the answer comes.
                stops.push((None, run.child.gone().map(|()| None).boxed()));
                continue;
            }
            run.closed = true;
            let stop = run.child.stop(
                self.probe.id(),
                StopRun {
                    reason: reason.clone(),
                    report,
                },
            );
            stops.push((Some((run.call.clone(), run.progress.clone())), stop.boxed()));
        }
        async move {
            let (calls, stops): (Vec<_>, Vec<_>) = stops.into_iter().unzip();
            let background = futures_util::future::join_all(stops).await;
            calls
                .into_iter()
                .zip(background)
                .filter_map(|(call, background)| call.filter(|_| background.unwrap_or(false)))
                // Read once the run is gone: a call-long body that returned has said what.
                .filter_map(|(call, progress)| match progress.take_kept() {
                    None => Some(StoppedCall::stopped(call)),
                    Some(Some(kept)) => Some(StoppedCall {
                        call,
                        kept: Some(kept),
                    }),
                    // It returned nothing: no `/finished` to write.
                    Some(None) => None,
                })
                .collect()
        }
    }

    fn spawn_run(
        &mut self,
        msg: RunTool,
        tool: Tool,
        body: PreparedBody,
    ) -> oneshot::Receiver<CallOutput> {
        let RunTool {
            call,
            step,
            agent,
            is_task,
            interruptibility,
            speech,
            cause,
        } = msg;
        let (tx, rx) = oneshot::channel();
        let cancels_on_interruption = tool.cancels_on_interruption();
        let mailbox = self.spawn_entry(
            NewRun {
                call,
                step,
                agent,
                is_task,
                interruptibility,
                speech,
                tool,
                body,
                cause,
            },
            None,
            Some(tx),
            Arc::new(Progress::default()),
        );
        if self.interrupted_steps.contains(&step) {
            // Its step was interrupted while the call was being set up.
            mailbox.tell(
                self.probe.id(),
                InterruptRun {
                    cancel: cancels_on_interruption,
                },
            );
        }
        rx
    }

    /// Spawns a run and enters it in the registry, under `key` if the session gave it
    /// one (a run standing for a call that awaits a sub-task), else a new one.
    fn spawn_entry(
        &mut self,
        run: NewRun,
        key: Option<u64>,
        immediate: Option<oneshot::Sender<CallOutput>>,
        progress: Arc<Progress>,
    ) -> Mailbox<ToolRunActor> {
        let key = key.unwrap_or_else(|| self.shared.ids.next_run());
        let (alive, gone) = alive_pair();
        let mailbox = ToolRunActor::spawn(RunSpec {
            key,
            call: run.call.clone(),
            tool: run.tool,
            agent: run.agent,
            is_task: run.is_task,
            interruptibility: run.interruptibility.clone(),
            speech: run.speech,
            cause: run.cause,
            scope: self.scope.clone(),
            body: run.body,
            immediate,
            progress: progress.clone(),
            shared: self.shared.clone(),
            links: self.links.clone(),
            prompts: self.prompts.clone(),
            toolset: self.ended.clone(),
            alive,
        });
        self.runs.insert(
            key,
            RunEntry {
                call: run.call,
                step: run.step,
                interruptibility: run.interruptibility,
                child: Child::new(mailbox.clone(), gone),
                closed: false,
                started: tokio::time::Instant::now(),
                progress,
            },
        );
        mailbox
    }
}

/// A run about to be spawned.
struct NewRun {
    call: FunctionCall,
    step: u64,
    agent: Agent,
    is_task: bool,
    interruptibility: Arc<Interruptibility>,
    speech: Option<SpeechHandle>,
    tool: Tool,
    body: PreparedBody,
    cause: Cause,
}

impl Actor for ToolsetActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.probe.stopped();
    }
}

/// Sent by an activity for each tool call of an LLM step that names a tool of this
/// toolset. The reply is the call's immediate output: its return value, its first
/// update, a duplicate or argument-error answer, or a terminal output if it is stopped
/// first. One per call.
pub(crate) struct RunTool {
    pub(crate) call: FunctionCall,
    /// Identifies the LLM step (calls of one step are never duplicates of each other).
    pub(crate) step: u64,
    /// The agent that made the call (its error policy applies).
    pub(crate) agent: Agent,
    /// Whether that agent runs as a sub-task (only then may the tool complete a task).
    pub(crate) is_task: bool,
    /// Whether the calling turn may be interrupted (shared with its speeches).
    pub(crate) interruptibility: Arc<Interruptibility>,
    /// The speech of the step that made the call, if it said something.
    pub(crate) speech: Option<SpeechHandle>,
    /// The calling turn's span, the run's span's parent (telemetry).
    pub(crate) cause: Cause,
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
                excerpt(&msg.call.name, QUOTE_LIMIT)
            )));
        };
        let (body, confirmed) = match self.prepare(&tool, &msg.call.arguments) {
            Ok(prepared) => prepared,
            Err(out) => return ready(out),
        };
        // 3. Duplicates.
        let running = self.duplicates_of(tool.name(), msg.step);
        let answer = |act: &Self, confirm: bool| {
            let args = DuplicatePromptArgs {
                function_name: tool.name().to_owned(),
                running_calls: running
                    .iter()
                    .filter_map(|key| act.runs.get(key).map(|r| r.call.clone()))
                    .collect(),
            };
            let text = if confirm {
                act.prompts.render_confirm(&args)
            } else {
                act.prompts.render_reject(&args)
            };
            ready(CallOutput::reply(text))
        };
        match on_duplicate(policy, !running.is_empty(), confirmed) {
            OnDuplicate::Run => {}
            OnDuplicate::Reject => return answer(self, false),
            OnDuplicate::AskToConfirm => return answer(self, true),
            OnDuplicate::Replace => {
                let reason: Arc<str> = Arc::from("replaced by a newer call");
                let stopping = self.stop_runs(running, reason, true);
                return Box::pin(
                    stopping
                        .into_actor(self)
                        .then(move |_, act, _| act.start_run(msg, tool, body).into_actor(act)),
                );
            }
        }
        // 4. Run.
        Box::pin(self.start_run(msg, tool, body).into_actor(self))
    }
}

impl ToolsetActor {
    /// Strips `confirm_duplicate` (always: the model may send it to any tool) and parses
    /// the arguments (a mock's are checked against the real type too): the body to run,
    /// and whether the call confirmed a duplicate. An argument error is the output.
    fn prepare(&self, tool: &Tool, arguments: &str) -> Result<(PreparedBody, bool), CallOutput> {
        let mut args: Value = if arguments.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(arguments)
                .map_err(|err| args_error(tool.name(), &err.to_string()))?
        };
        let confirmed = args
            .as_object_mut()
            .and_then(|o| o.remove(CONFIRM_DUPLICATE_PARAM))
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let mock = self.shared.settings.mocks.get(tool.name()).cloned();
        let raw = mock.is_some().then(|| args.clone());
        let body = (tool.def.prepare)(args).map_err(|reason| args_error(tool.name(), &reason))?;
        let body: PreparedBody = match (mock, raw) {
            (Some(mock), Some(raw)) => Box::new(move |ctx| mock(ctx, raw)),
            _ => body,
        };
        Ok((body, confirmed))
    }

    /// Spawns the call's run and resolves with its immediate output; once the toolset is
    /// closing, answers the terminal output instead of starting anything.
    fn start_run(
        &mut self,
        msg: RunTool,
        tool: Tool,
        body: PreparedBody,
    ) -> impl std::future::Future<Output = CallOutput> + 'static {
        let started = match &self.closing {
            Some(reason) => Err(reason.clone()),
            None => Ok(self.spawn_run(msg, tool, body)),
        };
        async move {
            match started {
                Ok(rx) => rx.await.unwrap_or_else(|_| lost()),
                Err(reason) => CallOutput::ended(&reason),
            }
        }
    }
}

/// The model's arguments did not parse: an error output it can act on, a warning in the
/// log (an expected error: no backtrace). The reason quotes at most a short prefix of the
/// model's input.
fn args_error(tool: &str, reason: &str) -> CallOutput {
    let reason = excerpt(reason, QUOTE_LIMIT);
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

/// Sent by an activity whose turn is interrupted while step `step` waits for its calls:
/// each of its runs here that has no output yet is cancelled (tools that cancel on
/// interruption) or moved to the background. One per toolset per step.
pub(crate) struct InterruptStep {
    pub(crate) step: u64,
}

impl Message for InterruptStep {
    type Result = ();
}

impl Handler<InterruptStep> for ToolsetActor {
    type Result = ();

    fn handle(&mut self, msg: InterruptStep, _ctx: &mut Self::Context) {
        if self.interrupted_steps.len() == REMEMBERED_INTERRUPTS {
            self.interrupted_steps.pop_front();
        }
        self.interrupted_steps.push_back(msg.step);
        for run in self
            .runs
            .values()
            .filter(|r| r.step == msg.step && !r.closed)
        {
            let cancel = self
                .tools
                .get(&run.call.name)
                .is_some_and(|(tool, _)| tool.cancels_on_interruption());
            run.child
                .mailbox
                .tell(self.probe.id(), InterruptRun { cancel });
        }
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
        // Whoever waits for this run holds its own waiter; the entry can go.
        self.runs.remove(&msg.key);
    }
}

/// Sent by the toolset's parent when its scope pauses or closes: stops every running
/// call (but those in `except`: the run awaiting a sub-task, and one still returning the
/// result of the last one), awaiting each. The reply lists the
/// calls that were running in the background, for which the parent writes a terminal
/// `/finished` output.
pub(crate) struct StopRuns {
    pub(crate) reason: Arc<str>,
    pub(crate) except: Vec<u64>,
}

impl Message for StopRuns {
    type Result = Vec<StoppedCall>;
}

impl Handler<StopRuns> for ToolsetActor {
    type Result = ResponseActFuture<Self, Vec<StoppedCall>>;

    fn handle(&mut self, msg: StopRuns, _ctx: &mut Self::Context) -> Self::Result {
        let keys: Vec<u64> = self
            .runs
            .keys()
            .copied()
            .filter(|key| !msg.except.contains(key))
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
    type Result = Vec<StoppedCall>;
}

impl Handler<StopToolset> for ToolsetActor {
    type Result = ResponseActFuture<Self, Vec<StoppedCall>>;

    fn handle(&mut self, msg: StopToolset, _ctx: &mut Self::Context) -> Self::Result {
        self.closing = Some(msg.reason.clone());
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
    /// The call runs here but its speech holds interruptions off.
    Uninterruptible,
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
        let interruptible = self
            .runs
            .get(&key)
            .is_some_and(|run| run.interruptibility.allows());
        let allowed = self
            .tools
            .get(&name)
            .is_some_and(|(tool, _)| tool.allows_cancellation());
        if !allowed {
            return Box::pin(fut::ready(CancelAnswer::NotCancellable { tool: name }));
        }
        if !interruptible {
            return Box::pin(fut::ready(CancelAnswer::Uninterruptible));
        }
        let stopping = self.stop_runs(vec![key], Arc::from("cancelled by the model"), true);
        Box::pin(
            stopping
                .into_actor(self)
                .map(|_, _, _| CancelAnswer::Cancelled),
        )
    }
}

/// A call of this toolset running in the background, as a session snapshot records it.
pub(crate) struct BackgroundCall {
    /// Its run's key: the session knows which run awaits a sub-task by its key.
    pub(crate) key: u64,
    pub(crate) call: FunctionCall,
    /// Later updates it sent.
    pub(crate) updates: u32,
    pub(crate) checkpoint: Option<Value>,
}

/// Sent by the session when it takes a snapshot: the calls of this toolset running in the
/// background (their immediate output given, their body not returned, not stopping).
pub(crate) struct ListBackground;

impl Message for ListBackground {
    type Result = Vec<BackgroundCall>;
}

impl Handler<ListBackground> for ToolsetActor {
    type Result = Vec<BackgroundCall>;

    fn handle(&mut self, _msg: ListBackground, _ctx: &mut Self::Context) -> Self::Result {
        self.runs
            .iter()
            .filter(|(_, run)| !run.closed && run.progress.in_background())
            .map(|(key, run)| BackgroundCall {
                key: *key,
                call: run.call.clone(),
                updates: run.progress.updates(),
                checkpoint: run.progress.checkpoint(),
            })
            .collect()
    }
}

/// Sent when a session is restored from a snapshot, for each call of this toolset that
/// was running in the background: what its tool's restore policy says. `Restart` and
/// `Resume` run the body again in the background (its immediate output is in the chat
/// already): its updates go on after `updates`, and `ctx.restored_checkpoint()` reads
/// `checkpoint`. `Abandon` — or a call that cannot run again (its tool is gone, its
/// arguments no longer parse, the toolset is closing) — answers the call's terminal output.
pub(crate) struct ResumeRun {
    /// The key the session gave the run: it gives the runs it restores keys in the order
    /// they started, and this toolset lists its runs by key.
    pub(crate) key: u64,
    pub(crate) call: FunctionCall,
    pub(crate) agent: Agent,
    pub(crate) is_task: bool,
    pub(crate) updates: u32,
    pub(crate) checkpoint: Option<Value>,
    /// Set when the call's body awaited a sub-task that is still running: the body is not
    /// run again, whatever the tool's policy (it would ask for the task a second time).
    pub(crate) awaits: Option<AwaitedTask>,
}

/// A restored call whose body awaited a sub-task (`ctx.run_task`) still running in the
/// snapshot. A run stands for it in this toolset, as the body's run did — duplicates,
/// `get_running_tasks` and `cancel_task` see it, a pause spares it — whose body awaits the
/// task's result and returns it, as the tool's `run_task` would have handed it over.
pub(crate) struct AwaitedTask {
    /// The step of the call (a paused step's call: an interruption of that step after the
    /// caller resumes moves it to the background, as it would the body's run).
    pub(crate) step: u64,
    /// Whether that step's turn may be interrupted (`cancel_task` asks).
    pub(crate) interruptibility: Arc<Interruptibility>,
    /// The task's result, from the session.
    pub(crate) result: BoxFuture<'static, Result<Value, SessionError>>,
    /// Where its output goes when the call awaits in a paused step; none for a call in
    /// the background, whose result arrives as its `/finished` output.
    pub(crate) immediate: Option<oneshot::Sender<CallOutput>>,
}

/// The body of a run standing for a call that awaits a sub-task: the task's result is
/// its return value (a failed task's error, its error).
fn awaiting_body(result: BoxFuture<'static, Result<Value, SessionError>>) -> PreparedBody {
    Box::new(move |_ctx| async move { Ok(ToolReturn::Json(result.await?)) }.boxed())
}

/// What became of a call restored from a snapshot.
pub(crate) enum Resumed {
    /// Its body runs again.
    Running,
    /// It ends with this `/finished` output (a deferred reply tells the user).
    Ended { output: String, is_error: bool },
}

/// The terminal output of a call abandoned at a restore.
pub(crate) const ABANDONED: &str = "Interrupted before it finished.";

impl Message for ResumeRun {
    type Result = Resumed;
}

plain_response!(Resumed);

impl Handler<ResumeRun> for ToolsetActor {
    type Result = Resumed;

    fn handle(&mut self, mut msg: ResumeRun, ctx: &mut Self::Context) -> Self::Result {
        if let Some(awaits) = msg.awaits.take() {
            return self.await_task(msg, awaits, ctx);
        }
        let Some((tool, _)) = self.tools.get(&msg.call.name).cloned() else {
            return Resumed::Ended {
                output: ABANDONED.to_owned(),
                is_error: false,
            };
        };
        if self.closing.is_some() || tool.restore_policy() == crate::tool::RestorePolicy::Abandon {
            return Resumed::Ended {
                output: ABANDONED.to_owned(),
                is_error: false,
            };
        }
        let body = match self.prepare(&tool, &msg.call.arguments) {
            Ok((body, _)) => body,
            Err(out) => {
                return Resumed::Ended {
                    output: out.output,
                    is_error: true,
                }
            }
        };
        let checkpoint = match tool.restore_policy() {
            crate::tool::RestorePolicy::Resume => msg.checkpoint,
            _ => None,
        };
        self.spawn_entry(
            NewRun {
                call: msg.call,
                step: 0,
                agent: msg.agent,
                is_task: msg.is_task,
                interruptibility: Interruptibility::new(true),
                speech: None,
                tool,
                body,
                cause: Cause::default(),
            },
            Some(msg.key),
            None,
            Arc::new(Progress::restored(msg.updates, checkpoint)),
        );
        Resumed::Running
    }
}

impl ToolsetActor {
    /// Restores a call that awaits a sub-task: a run stands for it (see [`AwaitedTask`]).
    /// A tool no longer here, or a toolset closing, ends it as an abandoned call.
    fn await_task(
        &mut self,
        msg: ResumeRun,
        awaits: AwaitedTask,
        ctx: &mut Context<Self>,
    ) -> Resumed {
        let tool = match self.tools.get(&msg.call.name) {
            Some((tool, _)) if self.closing.is_none() => tool.clone(),
            _ => {
                return Resumed::Ended {
                    output: ABANDONED.to_owned(),
                    is_error: false,
                }
            }
        };
        let AwaitedTask {
            step,
            interruptibility,
            result,
            immediate,
        } = awaits;
        // In a paused step the call has no output yet; in the background its updates go
        // on after those it sent, as a restored body's would.
        let progress = match immediate {
            Some(_) => Progress::default(),
            None => Progress::restored(msg.updates, msg.checkpoint),
        };
        // A paused step's output passes through this toolset on its way to the step, as
        // a body's does (`RunTool` answers it once the run hands it over): the step lands
        // after the same hops, so a tool's items racing the caller's resume land on the
        // same side of it as in the session the snapshot was taken of.
        let immediate = immediate.map(|step| {
            let (tx, rx) = oneshot::channel();
            ctx.spawn(rx.into_actor(self).map(move |output, _, _| {
                // A run dropped without an output reads as `RunTool`'s answer would.
                let _ = step.send(output.unwrap_or_else(|_| lost()));
            }));
            tx
        });
        self.spawn_entry(
            NewRun {
                call: msg.call,
                step,
                agent: msg.agent,
                is_task: msg.is_task,
                interruptibility,
                speech: None,
                tool,
                body: awaiting_body(result),
                cause: Cause::default(),
            },
            // The session spares this key when it pauses the caller again.
            Some(msg.key),
            immediate,
            Arc::new(progress),
        );
        Resumed::Running
    }
}

counted_handlers!(
    ToolsetActor: RunTool,
    InterruptStep,
    RunEnded,
    StopRuns,
    StopToolset,
    ListRuns,
    CancelRun,
    ListBackground,
    ResumeRun
);
