//! Tools: a typed argument struct, an async body taking a [`RunContext`], and per-tool
//! policies: what happens on a duplicate call (`DuplicatePolicy`), whether the model may
//! cancel a running call, and how its unexpected errors are routed.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::agent::Agent;
use crate::error_policy::ErrorPolicy;
use crate::handoff::Handoff;
use crate::llm::ToolSchema;
use crate::run_context::RunContext;

/// The name of the boolean parameter that `on_duplicate = confirm` adds to a tool.
pub const CONFIRM_DUPLICATE_PARAM: &str = "confirm_duplicate";

/// Lists the running calls the model may cancel (a companion tool).
pub(crate) const GET_RUNNING_TASKS: &str = "get_running_tasks";
/// Cancels one running call by id (a companion tool).
pub(crate) const CANCEL_TASK: &str = "cancel_task";
/// The companion tools an activity exposes when a tool it sees allows cancellation.
pub(crate) const COMPANION_TOOLS: &[&str] = &[GET_RUNNING_TASKS, CANCEL_TASK];

/// What happens when the model calls a tool while an earlier call of it still runs in
/// the same toolset (calls of one LLM step are never duplicates of each other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DuplicatePolicy {
    /// Run both.
    Allow,
    /// Answer the model that the tool is already running, naming the running calls.
    Reject,
    /// Cancel the running calls (and wait for them), then run.
    Replace,
    /// Ask the model to confirm; the tool's schema gets a `confirm_duplicate` boolean, and a
    /// call with it set to true runs.
    Confirm,
}

/// What happens to a call of a tool that was running when its session was snapshotted,
/// once the session is restored.
///
/// A call is running from the moment its body may start — before it sent anything — until
/// it returned: whether its step still waits for its output or it runs in the background
/// after an update. A step whose calls started is never asked of the model again; each of
/// its calls still without an output gets one as its policy says, and the step goes on.
/// Each call gets exactly one terminal output across any number of restores, and nothing
/// delivered before the snapshot is delivered again after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestorePolicy {
    /// The call ends with the output "Interrupted before it finished." — its step's
    /// output, or, in the background, its `/finished` with a deferred reply that tells the
    /// user — and its body never runs again: a side effect (a card charged) happens at most
    /// once. The default: the body may have done its work, or not, and only it knows.
    ///
    /// Across a crash too: in a session that saves to a store
    /// (`SessionBuilder::save_snapshots`), the body starts only once the store holds a
    /// snapshot with the call running (calls of one step share one write), so the store
    /// never holds a state from before the call while its body runs: whoever restores from
    /// it abandons the call rather than asking the model again. When the store cannot hold
    /// the call — the write fails, is fenced, or takes longer than
    /// `SessionBuilder::record_timeout` — the body never starts and the call's output, which
    /// the model reads, says it was not made because it could not be recorded. A call
    /// stopped while it waits (an interruption that cancels it, a handoff, the close) ends
    /// without its body ever starting. Without a store, nothing waits.
    #[default]
    Abandon,
    /// The body runs again from the start, with the same call id and arguments, and
    /// `ctx.restored_checkpoint()` reads what it saved with `ctx.checkpoint(..)`. For work
    /// that is safe to do again. What it says that the call already said is not said again:
    /// its updates that repeat, in order, the ones delivered before the snapshot (its
    /// first one if that was the call's output, then each `/update_n`) are not delivered —
    /// the user heard them, the model read them, and no reply is asked for them — and
    /// `ctx.update` answers `Ok`. The first update that says something new ends that; it and
    /// every one after go out, numbered after the last one delivered.
    Restart,
    /// The body runs again and goes on where it was: it reads what it saved with
    /// `ctx.checkpoint(..)` from `ctx.restored_checkpoint()`. Everything it sends is new:
    /// its updates go out numbered after the last one delivered. Save the checkpoint right
    /// after the update it accounts for, so a body resumed from it sends nothing the user
    /// already heard.
    Resume,
}

/// A tool body's successful result.
///
/// "No reply" is said one way: [`ToolReturn::NoReply`] (or [`ToolReturn::no_reply`]) —
/// the output is kept for the model to read later and asks for no further step. A body
/// that returns `()` is `NoReply` with an empty output: nothing at all.
#[derive(Debug)]
#[non_exhaustive]
pub enum ToolReturn {
    /// Nothing to say: the output is empty and no further LLM step runs for it.
    #[deprecated(
        since = "0.1.0",
        note = "return `()` or `ToolReturn::no_reply(\"\")`: both say \"no reply\" the one way"
    )]
    Unit,
    /// Text for the model.
    Text(String),
    /// A structured value for the model (written as JSON text).
    Json(Value),
    /// Text kept in the chat context for the model to read later, with no reply asked
    /// for it: no further step runs on its account (another call of the same step may
    /// still want one). LiveKit's `ToolResult(output, reply_required=False)`.
    NoReply(String),
    /// Hand the conversation to another agent: a handoff, once every call of the step has
    /// its output. The agent that made the call gets an output naming the new agent.
    Handoff(Handoff),
    /// End the current sub-task agent with this result (see `RunContext::run_task`).
    CompleteTask(Value),
}

impl ToolReturn {
    /// Serializes a value as the tool's result.
    pub fn json<T: serde::Serialize>(value: &T) -> Result<Self, ToolFailure> {
        Ok(Self::Json(serde_json::to_value(value)?))
    }

    /// Text the model reads later, with no reply asked for it ([`ToolReturn::NoReply`]).
    pub fn no_reply(text: impl Into<String>) -> Self {
        Self::NoReply(text.into())
    }

    /// Ends the current sub-task agent with this result.
    pub fn complete_task<T: serde::Serialize>(value: &T) -> Result<Self, ToolFailure> {
        Ok(Self::CompleteTask(serde_json::to_value(value)?))
    }
}

impl From<()> for ToolReturn {
    fn from(_: ()) -> Self {
        Self::NoReply(String::new())
    }
}
impl From<String> for ToolReturn {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}
impl From<&str> for ToolReturn {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}
impl From<Value> for ToolReturn {
    fn from(value: Value) -> Self {
        Self::Json(value)
    }
}
impl From<Handoff> for ToolReturn {
    fn from(handoff: Handoff) -> Self {
        Self::Handoff(handoff)
    }
}
impl From<Agent> for ToolReturn {
    fn from(agent: Agent) -> Self {
        Self::Handoff(Handoff::to(agent))
    }
}

/// An error meant for the model: its text becomes an error output the LLM reads.
/// Logged at `warn` without a backtrace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// An error with this message for the model.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A signal, not an error: the tool's output is recorded, but no further LLM step runs.
/// It says what [`ToolReturn::NoReply`] says, through the error path.
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
#[error("stop response")]
#[deprecated(
    since = "0.1.0",
    note = "return `Ok(ToolReturn::no_reply(output))`: \"no reply\" is said one way"
)]
pub struct StopResponse {
    /// The output to record for the call (empty by default).
    pub output: String,
}

#[allow(deprecated)]
impl StopResponse {
    /// Stops the response, recording `output` as the call's output.
    pub fn with_output(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
        }
    }
}

/// A tool body panicked. Match it in an [`ErrorPolicy`] to propagate panics; it is never
/// shown to the model.
#[derive(Debug, Clone, thiserror::Error)]
#[error("tool panicked: {message}")]
#[non_exhaustive]
pub struct ToolPanic {
    /// The panic's message.
    pub message: String,
}

/// Why a tool body failed: any error (`?` converts), including [`ToolError`] for the
/// model and [`StopResponse`] as a signal. Like `anyhow::Error` it does not implement
/// `std::error::Error` itself, so that every error type converts into it.
pub struct ToolFailure(Box<dyn StdError + Send + Sync + 'static>);

impl ToolFailure {
    /// The underlying error.
    pub fn error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.0
    }

    /// The error for the model, if it is a [`ToolError`].
    pub fn as_tool_error(&self) -> Option<&ToolError> {
        self.0.downcast_ref()
    }

    /// The signal, if it is a [`StopResponse`].
    #[deprecated(
        since = "0.1.0",
        note = "StopResponse is deprecated: see ToolReturn::NoReply"
    )]
    #[allow(deprecated)]
    pub fn as_stop_response(&self) -> Option<&StopResponse> {
        self.0.downcast_ref()
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for ToolFailure {
    fn from(err: E) -> Self {
        Self(Box::new(err))
    }
}

impl fmt::Debug for ToolFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// What a tool body returns.
pub type ToolResult = Result<ToolReturn, ToolFailure>;

/// A parsed call, ready to run once given its context.
pub(crate) type PreparedBody = Box<dyn FnOnce(RunContext) -> BoxFuture<'static, ToolResult> + Send>;
type Prepare = dyn Fn(Value) -> Result<PreparedBody, String> + Send + Sync;

/// A mock body: replaces a tool's body for one session, keeping its schema and policies.
/// It gets the arguments as parsed JSON (they were checked against the tool's own type
/// first) and the same [`RunContext`] the real body would.
pub(crate) type MockBody =
    Arc<dyn Fn(RunContext, Value) -> BoxFuture<'static, ToolResult> + Send + Sync>;

pub(crate) fn mock_body<F, Fut, R>(body: F) -> MockBody
where
    F: Fn(RunContext, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, ToolFailure>> + Send + 'static,
    R: Into<ToolReturn>,
{
    Arc::new(move |ctx, args| body(ctx, args).map(|r| r.map(Into::into)).boxed())
}

/// Arguments of a tool that takes none.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
pub struct NoArgs {}

/// A tool: name, description, JSON schema of its typed arguments, an async body and its
/// policies. Cheap to clone (shared).
///
/// ```
/// use switchboard::{Tool, RunContext, ToolFailure};
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Weather { city: String }
/// let tool = Tool::new("get_weather", "Current weather in a city",
///     |_ctx: RunContext, args: Weather| async move {
///         Ok::<_, ToolFailure>(format!("sunny in {}", args.city))
///     });
/// assert_eq!(tool.name(), "get_weather");
/// ```
#[derive(Clone)]
pub struct Tool {
    pub(crate) def: Arc<ToolDef>,
}

pub(crate) struct ToolDef {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) parameters: Value,
    pub(crate) prepare: Arc<Prepare>,
    pub(crate) on_duplicate: Option<DuplicatePolicy>,
    pub(crate) allow_cancellation: bool,
    pub(crate) cancel_on_interruption: bool,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) on_restore: RestorePolicy,
    pub(crate) call_long: bool,
}

impl Clone for ToolDef {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
            prepare: self.prepare.clone(),
            on_duplicate: self.on_duplicate,
            allow_cancellation: self.allow_cancellation,
            cancel_on_interruption: self.cancel_on_interruption,
            error_policy: self.error_policy.clone(),
            on_restore: self.on_restore,
            call_long: self.call_long,
        }
    }
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.def.name)
            .field("on_duplicate", &self.def.on_duplicate)
            .field("allow_cancellation", &self.def.allow_cancellation)
            .field("call_long", &self.def.call_long)
            .finish()
    }
}

impl Tool {
    /// A tool whose arguments are `A` (parsed from the model's JSON; its schema derived
    /// from `A`) and whose body is `body`.
    pub fn new<A, F, Fut, R>(
        name: impl Into<String>,
        description: impl Into<String>,
        body: F,
    ) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(RunContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ToolFailure>> + Send + 'static,
        R: Into<ToolReturn>,
    {
        let body = Arc::new(body);
        let prepare = move |value: Value| -> Result<PreparedBody, String> {
            let args: A = serde_json::from_value(value).map_err(|e| e.to_string())?;
            let body = body.clone();
            Ok(Box::new(move |ctx: RunContext| {
                body(ctx, args).map(|r| r.map(Into::into)).boxed()
            }))
        };
        Self {
            def: Arc::new(ToolDef {
                name: name.into(),
                description: description.into(),
                parameters: parameters_schema::<A>(),
                prepare: Arc::new(prepare),
                on_duplicate: None,
                allow_cancellation: false,
                cancel_on_interruption: false,
                error_policy: ErrorPolicy::new(),
                on_restore: RestorePolicy::Abandon,
                call_long: false,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut ToolDef)) -> Self {
        f(Arc::make_mut(&mut self.def));
        self
    }

    /// Sets what happens on a duplicate call (default: `confirm` in a named toolset,
    /// `reject` among an agent's bare tools).
    pub fn on_duplicate(self, policy: DuplicatePolicy) -> Self {
        self.edit(|d| d.on_duplicate = Some(policy))
    }

    /// Lets the model cancel running calls of this tool with `cancel_task`.
    pub fn allow_cancellation(self, allow: bool) -> Self {
        self.edit(|d| d.allow_cancellation = allow)
    }

    /// Cancels running calls of this tool when the user barges in (default false).
    pub fn cancel_on_interruption(self, cancel: bool) -> Self {
        self.edit(|d| d.cancel_on_interruption = cancel)
    }

    /// Routes this tool's unexpected errors before the agent's and session's rules.
    pub fn error_policy(self, policy: ErrorPolicy) -> Self {
        self.edit(|d| d.error_policy = policy)
    }

    /// What happens to a call of this tool that was running when its session was
    /// snapshotted, once the session is restored (default [`RestorePolicy::Abandon`]).
    pub fn on_restore(self, policy: RestorePolicy) -> Self {
        self.edit(|d| d.on_restore = policy)
    }

    /// Declares the tool call-long: a call of it may run for the whole call (a recorder, a
    /// transcriber, a silence watchdog) and that is its job, not unfinished work. Such a
    /// call:
    ///
    /// - does not hold the session's settling: [`Session::wait_for_settled`] and an
    ///   [`Engine::drain`] do not wait for it (a session whose only running call is
    ///   call-long counts as settled);
    /// - is told when the call ends: at the close of its session (or the stop of its
    ///   agent, for an agent's tool) [`RunContext::cancelled`] resolves, and the body has
    ///   the grace period to finish (`SessionBuilder::grace_period`);
    /// - keeps its own result: what the body returns within the grace period is its
    ///   `/finished` output in the history, instead of "Cancelled: the session closed.". A
    ///   body that returns `()` adds nothing; one still running after the grace period is
    ///   dropped and reported, as any tool's.
    ///
    /// The call still needs an immediate output like any other (its first
    /// [`RunContext::update`], say "recording"), or its turn waits for it. Cancelled by the
    /// model or replaced by a duplicate, it ends as any call does.
    ///
    /// ```
    /// use switchboard::prelude::*;
    ///
    /// let recorder = Tool::new("record_call", "Records the call", |ctx: RunContext, _: NoArgs| async move {
    ///     ctx.update("recording").await?; // the model goes on
    ///     let mut seconds = 0u64;
    ///     // ... record until the call ends ...
    ///     ctx.cancelled().await;
    ///     seconds += 1;
    ///     Ok::<_, ToolFailure>(format!("recording saved, {seconds} s"))
    /// })
    /// .call_long(true);
    /// assert!(recorder.is_call_long());
    /// ```
    ///
    /// [`Session::wait_for_settled`]: crate::Session::wait_for_settled
    /// [`Engine::drain`]: crate::Engine::drain
    /// [`RunContext::cancelled`]: crate::RunContext::cancelled
    /// [`RunContext::update`]: crate::RunContext::update
    pub fn call_long(self, call_long: bool) -> Self {
        self.edit(|d| d.call_long = call_long)
    }

    /// Whether a call of it may run for the whole call (see [`Tool::call_long`]).
    pub fn is_call_long(&self) -> bool {
        self.def.call_long
    }

    /// Its restore policy (see [`Tool::on_restore`]).
    pub fn restore_policy(&self) -> RestorePolicy {
        self.def.on_restore
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The tool's description.
    pub fn description(&self) -> &str {
        &self.def.description
    }

    /// The JSON schema of its arguments, as declared (without `confirm_duplicate`).
    pub fn parameters(&self) -> &Value {
        &self.def.parameters
    }

    /// Whether a user interruption cancels its calls that have no output yet (otherwise
    /// they move to the background).
    pub fn cancels_on_interruption(&self) -> bool {
        self.def.cancel_on_interruption
    }

    /// Whether the model may cancel its running calls.
    pub fn allows_cancellation(&self) -> bool {
        self.def.allow_cancellation
    }

    /// The duplicate policy set on the tool itself, if any.
    pub fn duplicate_policy(&self) -> Option<DuplicatePolicy> {
        self.def.on_duplicate
    }

    /// The schema the model sees under the effective duplicate policy.
    pub(crate) fn schema(&self, policy: DuplicatePolicy) -> ToolSchema {
        let mut parameters = self.def.parameters.clone();
        if policy == DuplicatePolicy::Confirm {
            if let Some(props) = parameters
                .as_object_mut()
                .map(|o| {
                    o.entry("properties")
                        .or_insert_with(|| Value::Object(Default::default()))
                })
                .and_then(Value::as_object_mut)
            {
                props.insert(
                    CONFIRM_DUPLICATE_PARAM.to_owned(),
                    serde_json::json!({
                        "type": "boolean",
                        "description": "Set to true only when the user confirmed running this tool again while an earlier call still runs.",
                        "default": false
                    }),
                );
            }
        }
        ToolSchema {
            name: self.def.name.clone(),
            description: self.def.description.clone(),
            parameters,
        }
    }

    /// Whether the tool's own arguments use the name `confirm_duplicate`.
    pub(crate) fn declares_confirm_param(&self) -> bool {
        self.def
            .parameters
            .get("properties")
            .and_then(|p| p.get(CONFIRM_DUPLICATE_PARAM))
            .is_some()
    }
}

fn parameters_schema<A: JsonSchema>() -> Value {
    let mut value = schemars::schema_for!(A).to_value();
    if let Some(obj) = value.as_object_mut() {
        obj.remove("$schema");
        obj.remove("title");
        if obj.get("type") == Some(&Value::String("object".into()))
            && !obj.contains_key("properties")
        {
            obj.insert("properties".into(), Value::Object(Default::default()));
        }
    }
    value
}

/// Whether a tool name is one providers accept.
pub(crate) fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A named group of tools with one executor (its ToolsetActor). On the session builder
/// it is session-scoped (survives handoffs); on an agent it is agent-scoped.
#[derive(Clone, Debug)]
pub struct Toolset {
    pub(crate) name: String,
    pub(crate) tools: Vec<Tool>,
    pub(crate) default_duplicate: Option<DuplicatePolicy>,
    pub(crate) prompts: crate::prompts::Prompts,
}

impl Toolset {
    /// An empty toolset with this name (part of its actors' ids).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            tools: Vec::new(),
            default_duplicate: None,
            prompts: crate::prompts::Prompts::new(),
        }
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Deprecated: a toolset-wide duplicate policy. It logs a warning once and applies
    /// only to tools that set none themselves; set `Tool::on_duplicate` instead.
    #[deprecated(note = "set `Tool::on_duplicate` on each tool")]
    pub fn on_duplicate(mut self, policy: DuplicatePolicy) -> Self {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                toolset = %self.name,
                "Toolset::on_duplicate is deprecated; set Tool::on_duplicate on each tool"
            );
        });
        self.default_duplicate = Some(policy);
        self
    }

    /// Prompt templates for this toolset's tools (`update`, duplicate texts); they win
    /// over the agent's and the session's.
    pub fn prompts(mut self, prompts: crate::prompts::Prompts) -> Self {
        self.prompts = prompts;
        self
    }

    /// The toolset's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its tools.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }
}
