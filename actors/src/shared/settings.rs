//! A session's settings: fixed when it starts, read by every actor, written by none.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{check_tools, Agent};
use crate::error::BuildError;
use crate::error_policy::ErrorPolicy;
use crate::ids::SessionId;
use crate::llm::{Llm, LlmTimeouts};
use crate::prompts::Prompts;
use crate::realtime::{Model, RealtimeModel};
use crate::tool::MockBody;
use crate::turn_handling::{TurnHandling, TurnRules};

/// The limits and timings of a session.
#[derive(Clone, Debug)]
pub(crate) struct SessionConfig {
    pub(crate) max_tool_steps: u32,
    pub(crate) grace_period: Duration,
    pub(crate) inherit_chat_context: bool,
    pub(crate) llm_timeouts: LlmTimeouts,
    pub(crate) max_calls_per_step: usize,
    pub(crate) max_argument_bytes: usize,
    pub(crate) max_reply_bytes: usize,
    pub(crate) max_agent_work: u32,
    pub(crate) allow_interruptions: bool,
    pub(crate) user_away_timeout: Option<Duration>,
    /// The session's turn handling (agents may override it group by group).
    pub(crate) turn_handling: TurnHandling,
    /// Whether spans carry the messages' content (`gen_ai.input.messages`, …).
    pub(crate) trace_content: bool,
    pub(crate) max_blocking_jobs: usize,
    /// For a session that saves to a store: how long the body of an `Abandon` tool's call
    /// waits for a stored snapshot holding the call before the call is given up (its body
    /// never starts). `None`: the session saves to no store, and no body waits.
    pub(crate) record_calls: Option<Duration>,
}

/// The tool names of the session-scoped toolsets, with their owners, for checking that
/// an agent can start here before anything is stopped for it.
#[derive(Clone, Debug, Default)]
pub(crate) struct SessionTools {
    pub(crate) owners: Vec<(String, String)>,
    pub(crate) any_cancellable: bool,
}

/// Everything a session is configured with.
pub(crate) struct SessionSettings {
    pub(crate) id: SessionId,
    pub(crate) config: SessionConfig,
    pub(crate) llm: Option<Arc<dyn Llm>>,
    /// The session's realtime model, if it sets one (it wins over `llm`).
    pub(crate) realtime: Option<Arc<dyn RealtimeModel>>,
    pub(crate) error_policy: ErrorPolicy,
    pub(crate) prompts: Prompts,
    pub(crate) mocks: HashMap<String, MockBody>,
    pub(crate) userdata: Option<Arc<dyn Any + Send + Sync>>,
    /// Writes the user data as JSON for a snapshot, when it was given as serde data.
    pub(crate) userdata_json: Option<UserdataJson>,
    pub(crate) session_tools: SessionTools,
    /// 0 for a session never restored; one more at each restore (fencing).
    pub(crate) epoch: u64,
}

/// Writes a session's user data as JSON.
pub(crate) type UserdataJson =
    Arc<dyn Fn(&(dyn Any + Send + Sync)) -> Option<serde_json::Value> + Send + Sync>;

/// The writer of a `T`'s JSON, for user data given as serde data.
pub(crate) fn userdata_json<T: serde::Serialize + Any + Send + Sync>() -> UserdataJson {
    Arc::new(|data| {
        let data = data.downcast_ref::<T>()?;
        match serde_json::to_value(data) {
            Ok(value) => Some(value),
            Err(err) => {
                // The snapshot goes without it; the restore then reports the gap.
                tracing::warn!(%err, "the session's user data did not serialize");
                None
            }
        }
    })
}

impl SessionSettings {
    /// The model an agent uses: its own realtime model or LLM, else the session's
    /// realtime model or LLM, in that order.
    pub(crate) fn model_of(&self, agent: &Agent) -> Option<Model> {
        let def = &agent.def;
        def.realtime
            .clone()
            .map(Model::Realtime)
            .or_else(|| def.llm.clone().map(Model::Text))
            .or_else(|| self.realtime.clone().map(Model::Realtime))
            .or_else(|| self.llm.clone().map(Model::Text))
    }

    /// Checks that an activity of `agent` can start in this session: a model to use, and
    /// tool names unique among everything it would see. Done before anything is stopped
    /// for a handoff or sub-task, so a refused agent leaves the current one in place.
    pub(crate) fn check_agent(&self, agent: &Agent) -> Result<Model, BuildError> {
        let llm = self.model_of(agent).ok_or_else(|| BuildError::NoLlm {
            agent: agent.name().to_owned(),
        })?;
        let companions = self.exposes_companions(agent);
        let companion_owner = "companion tools".to_owned();
        check_tools(
            agent
                .tool_owners()
                .chain(
                    self.session_tools
                        .owners
                        .iter()
                        .map(|(name, owner)| (name.as_str(), owner.clone())),
                )
                .chain(
                    companions
                        .then_some(crate::agent::COMPANION_TOOLS)
                        .into_iter()
                        .flatten()
                        .map(|name| (*name, companion_owner.clone())),
                ),
        )?;
        Ok(llm)
    }

    /// How `agent` takes turns here: its own groups over the session's.
    pub(crate) fn turn_rules(&self, agent: &Agent) -> TurnRules {
        match &agent.def.turn_handling {
            Some(own) => own.over(&self.config.turn_handling).rules(),
            None => self.config.turn_handling.rules(),
        }
    }

    /// Whether an activity of `agent` exposes `get_running_tasks` and `cancel_task`: some
    /// tool it sees allows cancellation.
    pub(crate) fn exposes_companions(&self, agent: &Agent) -> bool {
        self.session_tools.any_cancellable || agent.any_cancellable()
    }
}
