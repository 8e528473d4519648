//! `ToolsetActor`: the executor of one named group of tools.
//!
//! - **Owns:** the registry of its running calls (one `ToolRunActor` each) and the
//!   duplicate checks.
//! - **Parent:** the session (session-scoped toolsets) or an activity (agent-scoped
//!   toolsets and an agent's bare tools, the toolset `tools`).
//! - **Starts** with its parent — a restored one with the calls it was running, each as
//!   its tool's restore policy says; **stops** on `StopToolset`, after every run it owns
//!   has stopped and been awaited.
//! - **Handles:** `RunTool`, `InterruptStep`, `ListRuns` and `CancelRun` (from an
//!   activity), `StopRuns` and `StopToolset` (from its parent), `RunEnded` (from its runs).
//! - **Writes its own state** (`toolset/runs.rs`): every call whose body may have started,
//!   in its `RunBook`, which its parent reads for a snapshot; it reads the same state back
//!   when a restored session starts it.
//!
//! Guarantees, each tested:
//! - The order on each call is: strip `confirm_duplicate`, parse the arguments, check
//!   duplicates, run. A call whose arguments do not parse never runs and cancels nothing.
//! - When `StopRuns` answers, every run it stopped is gone: actor and body dropped.
//! - An interrupted step's calls without an output are cancelled (tools that cancel on
//!   interruption) or moved to the background, even a call still waiting for a
//!   `replace` duplicate to stop.
//! - A call is in its book from the moment its run is spawned until the run stops or its
//!   body returns. Restored, an `Abandon` tool's call gets its terminal output and its body
//!   never runs again; a `Restart` or `Resume` tool's body runs again with the same call
//!   id, its output going where it went (its open step, or the background).

mod duplicates;
mod runs;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::activity::DeliverToolItems;
use crate::agent::Agent;
use crate::chat::FunctionCall;
use crate::delivery::{DeliveryAnswer, Scope};
use crate::error::SessionError;
use crate::ids::ActorId;
use crate::lifecycle::{alive_pair, AliveToken, Child};
use crate::mailbox::{counted_handlers, Link, Mailbox, Probe};
use crate::outcome::{
    error_text, excerpt, finished_pair, CallOutput, Effect, StoppedCall, QUOTE_LIMIT,
};
use crate::prompts::{DuplicatePromptArgs, Prompts};
use crate::session::SessionLinks;
use crate::shared::SessionShared;
use crate::speech::{Interruptibility, SpeechHandle};
use crate::telemetry::Cause;
use crate::tool::{
    DuplicatePolicy, PreparedBody, RestorePolicy, Tool, ToolReturn, CONFIRM_DUPLICATE_PARAM,
};
use crate::tool_run::{InterruptRun, RunSpec, StopRun, ToolRunActor};

use duplicates::{is_duplicate, on_duplicate, OnDuplicate, Running};
pub(crate) use runs::{digest, Progress, RepeatAnswer, Replayed, RunBook, RunState, ToolsetState};

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
    /// Its runs' progress, for snapshots (shared with its parent, which reads it).
    book: Arc<RunBook>,
    /// Set once `StopToolset` is handled: no run starts any more (a call still being set
    /// up, such as a `replace` waiting for the runs it cancels, gets a terminal output),
    /// so the runs that stop is waiting for are all there are.
    closing: Option<Arc<str>>,
    _alive: AliveToken,
}

impl ToolsetActor {
    /// Starts a toolset on the current arbiter, with the calls it was running when the
    /// session was snapshotted (`restored`, empty for a new one). `tools` carry their
    /// effective duplicate policy. Returns the toolset and its book of runs, for its parent
    /// to read when the session is snapshotted.
    pub(crate) fn spawn(
        id: ActorId,
        scope: Scope,
        tools: Vec<(Tool, DuplicatePolicy)>,
        prompts: Prompts,
        shared: Arc<SessionShared>,
        links: Arc<SessionLinks>,
        restored: Vec<RestoredRun>,
    ) -> (Child<ToolsetActor>, Arc<RunBook>) {
        let probe = Probe::new(id, shared.journal.clone());
        let (alive, gone) = alive_pair();
        let actor_probe = probe.clone();
        let book = Arc::new(RunBook::default());
        let actor_book = book.clone();
        let addr = ToolsetActor::create(move |ctx| {
            let mut toolset = ToolsetActor {
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
                book: actor_book,
                closing: None,
                _alive: alive,
            };
            for run in restored {
                toolset.restore(run, ctx);
            }
            toolset
        });
        (Child::new(Mailbox::new(addr, probe), gone), book)
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
            // No longer a running call for a snapshot: whoever stops it writes its output.
            run.progress.over();
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
        // An `Abandon` body starts once a stored snapshot holds its call (see
        // `RecordCall`); only a new call's: a restored one's body never runs again.
        let record = (tool.restore_policy() == RestorePolicy::Abandon)
            .then_some(self.shared.settings.config.record_calls)
            .flatten();
        let progress = Progress::new(
            self.shared.ids.next_run(),
            step,
            Arc::new(call.clone()),
            tool.restore_policy() == RestorePolicy::Restart,
        );
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
                record,
            },
            Some(tx),
            Arc::new(progress),
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

    /// Spawns a run and enters it in the registry and the book, under its progress's key.
    fn spawn_entry(
        &mut self,
        run: NewRun,
        immediate: Option<oneshot::Sender<CallOutput>>,
        progress: Arc<Progress>,
    ) -> Mailbox<ToolRunActor> {
        let key = progress.key();
        let (alive, gone) = alive_pair();
        self.book.add(progress.clone());
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
            record: run.record,
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
    /// How long its body waits for a stored snapshot holding the call, if it waits.
    record: Option<std::time::Duration>,
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
        self.book.remove(msg.key);
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

/// A call a restored toolset was running when the session was snapshotted, and what it
/// needs to run again: its state as the toolset wrote it (a call of a step still open that
/// had not started yet gets a fresh one), who made it, and where its output goes.
pub(crate) struct RestoredRun {
    pub(crate) state: RunState,
    /// The agent that made the call (the current one, for a session toolset's call in the
    /// background): its error policy applies.
    pub(crate) agent: Agent,
    pub(crate) is_task: bool,
    /// For a call of a step still open: where its immediate output goes. None for a call
    /// in the background, whose next outputs are later items.
    pub(crate) step: Option<oneshot::Sender<CallOutput>>,
    /// Whether the turn of its step may be interrupted (shared with the restored turn).
    pub(crate) interruptibility: Arc<Interruptibility>,
    /// Set when its body awaited a sub-task that is still running: a run stands for the
    /// call, whose body awaits the task's result and returns it — whatever the tool's
    /// policy, since running the body again would ask for the task a second time.
    pub(crate) awaits: Option<BoxFuture<'static, Result<Value, SessionError>>>,
    /// For a call whose `repeat` is held until its step is in: that item's answer.
    pub(crate) repeat_answer: Option<RepeatAnswer>,
}

impl RestoredRun {
    /// A call that ran in the background: it shares the interruptibility of the step that
    /// made it, when that step's turn is restored (`steps`, by step id), so a tool's hold on
    /// interruptions covers its siblings as it did before the snapshot.
    pub(crate) fn in_background(
        state: RunState,
        agent: Agent,
        is_task: bool,
        steps: &HashMap<u64, Arc<Interruptibility>>,
        awaits: Option<BoxFuture<'static, Result<Value, SessionError>>>,
        repeat_answer: Option<RepeatAnswer>,
    ) -> Self {
        let interruptibility = steps
            .get(&state.step)
            .cloned()
            .unwrap_or_else(|| Interruptibility::new(true));
        Self {
            state,
            agent,
            is_task,
            step: None,
            interruptibility,
            awaits,
            repeat_answer,
        }
    }
}

/// The body of a run standing for a call that awaits a sub-task: the task's result is
/// its return value (a failed task's error, its error).
fn awaiting_body(result: BoxFuture<'static, Result<Value, SessionError>>) -> PreparedBody {
    Box::new(move |_ctx| async move { Ok(ToolReturn::Json(result.await?)) }.boxed())
}

/// The terminal output of a call abandoned at a restore.
pub(crate) const ABANDONED: &str = "Interrupted before it finished.";

impl ToolsetActor {
    /// Carries out a restored call's tool's restore policy (see [`RestoredRun`]): a run
    /// standing for a call that awaits a sub-task; a body run again (`Restart`, `Resume`);
    /// or, for `Abandon`, the terminal output "Interrupted before it finished." — into
    /// its step, or as its `/finished` with a deferred reply — and the body never runs
    /// again. A tool whose arguments no longer parse ends the call with that error.
    fn restore(&mut self, run: RestoredRun, ctx: &mut Context<Self>) {
        let RestoredRun {
            state,
            agent,
            is_task,
            step,
            interruptibility,
            awaits,
            repeat_answer,
        } = run;
        // The restore checked that every call's tool is here (`RestorePlan`); one missing
        // all the same is abandoned rather than lost.
        let tool = self
            .tools
            .get(&state.call.name)
            .map(|(tool, _)| tool.clone());
        let policy = tool
            .as_ref()
            .map_or(RestorePolicy::Abandon, Tool::restore_policy);
        let body = match (&tool, awaits) {
            (Some(_), Some(result)) => Ok(awaiting_body(result)),
            (Some(tool), None) if policy != RestorePolicy::Abandon => self
                .prepare(tool, &state.call.arguments)
                .map(|(body, _)| body)
                .map_err(|out| (out.output, true)),
            _ => Err((ABANDONED.to_owned(), false)),
        };
        let (tool, body) = match (tool, body) {
            (Some(tool), Ok(body)) => (tool, body),
            (_, Err((output, is_error))) => {
                return self.end_restored(state.call, step, output, is_error, ctx);
            }
            (None, Ok(_)) => {
                return self.end_restored(state.call, step, ABANDONED.to_owned(), false, ctx);
            }
        };
        // What the call said before, the body run again does not say twice.
        let starts_over = policy == RestorePolicy::Restart;
        let progress = Progress::restored(
            &state,
            Arc::new(state.call.clone()),
            starts_over,
            repeat_answer,
        );
        let immediate = step.map(|step| self.relay(step, ctx));
        self.spawn_entry(
            NewRun {
                call: state.call,
                step: state.step,
                agent,
                is_task,
                interruptibility,
                speech: None,
                tool,
                body,
                cause: Cause::default(),
                record: None,
            },
            immediate,
            Arc::new(progress),
        );
    }

    /// Where a restored call's immediate output goes on its way to its step: through this
    /// toolset, as a body's output reaches its step as the answer to `RunTool` — so the
    /// step lands after the same hops, and a tool's items racing it land on the same side
    /// of it as in the session the snapshot was taken of.
    fn relay(
        &self,
        step: oneshot::Sender<CallOutput>,
        ctx: &mut Context<Self>,
    ) -> oneshot::Sender<CallOutput> {
        let (tx, rx) = oneshot::channel();
        ctx.spawn(rx.into_actor(self).map(move |output, _, _| {
            // A run dropped without an output reads as `RunTool`'s answer would.
            let _ = step.send(output.unwrap_or_else(|_| lost()));
        }));
        tx
    }

    /// A restored call that ends instead of running again: its output goes into its step,
    /// or — a call in the background — it is its `/finished` item with a deferred reply,
    /// and the call counts as a running tool until the item is in a chat context (the
    /// session does not look settled before the reply it asks for is wanted).
    fn end_restored(
        &mut self,
        call: FunctionCall,
        step: Option<oneshot::Sender<CallOutput>>,
        output: String,
        is_error: bool,
        ctx: &mut Context<Self>,
    ) {
        if let Some(step) = step {
            let step = self.relay(step, ctx);
            let _ = step.send(CallOutput {
                output,
                is_error,
                effect: Effect::Reply,
            });
            return;
        }
        let running = RunningTool::start(&self.shared);
        let (answer, heard) = DeliveryAnswer::awaited();
        self.links.deliver(
            self.probe.id(),
            DeliverToolItems {
                scope: self.scope.clone(),
                base_call_id: call.call_id.clone(),
                items: finished_pair(call, output, is_error).into(),
                reply: true,
                answer,
            },
        );
        // On the arbiter, not this actor: the count must drop even if the toolset stops
        // first (the guard drops with the task either way).
        actix::spawn(async move {
            let _ = heard.await;
            drop(running);
        });
    }
}

/// A restored call that ends counts as a running tool until its output has landed; the
/// count drops with this guard.
struct RunningTool(Arc<SessionShared>);

impl RunningTool {
    fn start(shared: &Arc<SessionShared>) -> Self {
        // An ended call is not call-long: it holds the settling until its output lands.
        shared.host_view.tool_run_started(false);
        Self(shared.clone())
    }
}

impl Drop for RunningTool {
    fn drop(&mut self) {
        self.0.host_view.tool_run_ended(false);
    }
}

counted_handlers!(
    ToolsetActor: RunTool,
    InterruptStep,
    RunEnded,
    StopRuns,
    StopToolset,
    ListRuns,
    CancelRun
);
