//! What a session is made of, across machines: a [`SessionSpec`] travels (serde), and a
//! [`SessionFactory`] on each worker turns it into a `SessionBuilder`, because agents and
//! tools are code that only the worker's binary has.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use switchboard::snapshot::AgentRegistry;
use switchboard::{Agent, SessionBuilder};

/// What a front asks for when it starts a session: which agent to begin with and the
/// free-form data your factory reads (a caller's number, a tenant's settings, a booking
/// id). It travels as JSON through the jobs stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionSpec {
    /// The first agent's name, as your [`SessionFactory`] knows it.
    pub agent: String,
    /// Anything your factory needs to build the session (default `null`).
    #[serde(default)]
    pub data: Value,
    /// How the front plays speech (default: text, played once streamed).
    #[serde(default)]
    pub output: OutputMode,
}

impl SessionSpec {
    /// A session that starts with `agent`, no data, text output.
    pub fn new(agent: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
            data: Value::Null,
            output: OutputMode::Text,
        }
    }

    /// Sets the data your factory reads.
    pub fn data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }

    /// Sets how the front plays speech.
    pub fn output(mut self, output: OutputMode) -> Self {
        self.output = output;
        self
    }
}

/// An agent for a remote session to switch to (`RemoteSession::update_agent`): its name
/// and the data the worker's [`SessionFactory::agent`] builds it from, as a local session
/// takes the `Agent` itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AgentSpec {
    /// The agent's name, as your [`SessionFactory`] knows it.
    pub name: String,
    /// Anything your factory needs to build it (default `null`).
    #[serde(default)]
    pub data: Value,
}

impl AgentSpec {
    /// The agent named `name`, no data.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            data: Value::Null,
        }
    }

    /// Sets the data your factory reads.
    pub fn data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }
}

/// How the front on the other side of the gateway plays the agent's speech.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutputMode {
    /// A chat front: a speech has played once its text is complete.
    #[default]
    Text,
    /// A voice front: it speaks the text (TTS) and reports each speech's playout with
    /// `RemoteSession::playout_finished`; the agent counts as speaking until then.
    Voice {
        /// Whether the front can pause and resume a speech, so a barge-in pauses before it
        /// interrupts.
        pausable: bool,
    },
}

/// Why a factory could not build what was asked. It travels to the front (serde) as the
/// failure of the input that asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FactoryError {
    /// No agent of that name.
    #[error("no agent named {name:?}; this worker knows {known:?}")]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The names it knows.
        known: Vec<String>,
    },
    /// The spec's data does not fit the agent.
    #[error("the data for agent {agent:?} is not usable: {reason}")]
    InvalidData {
        /// The agent.
        agent: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The agent or session could not be built.
    #[error(transparent)]
    Build(#[from] switchboard::BuildError),
}

/// Builds sessions and agents from their names and data: the code a worker runs.
///
/// For a new session the worker takes [`SessionFactory::builder`] and adds the first agent
/// ([`SessionFactory::agent`] with the spec's agent and data), the session's id (the
/// cluster's session key) and an output that publishes the speech to the front (an output
/// set by the factory is replaced). To resume a session from its snapshot on another
/// worker it takes [`SessionFactory::restoring`] (by default the same builder) and an
/// [`AgentRegistry`] that builds each agent the snapshot names with
/// [`SessionFactory::agent`], from the data it was built with. So that an agent comes
/// back the same, build it with `AgentBuilder::restore_data(data)`.
///
/// ```
/// use switchboard::prelude::*;
/// use switchboard::testing::{Reply, ScriptedLlm};
/// use switchboard::SessionBuilder;
/// use switchboard_cluster::{FactoryError, SessionFactory, SessionSpec};
///
/// struct Concierge;
///
/// impl SessionFactory for Concierge {
///     fn builder(&self, _spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
///         let llm = ScriptedLlm::new([]);
///         llm.otherwise(Reply::text("Welcome!"));
///         Ok(Session::builder().llm(llm))
///     }
///
///     fn agent(&self, name: &str, data: &serde_json::Value) -> Result<Agent, FactoryError> {
///         match name {
///             "concierge" => Ok(Agent::builder("concierge")
///                 .instructions("Greet.")
///                 .restore_data(data)
///                 .build()?),
///             _ => Err(FactoryError::UnknownAgent { name: name.into(), known: vec!["concierge".into()] }),
///         }
///     }
/// }
/// ```
pub trait SessionFactory: Send + Sync + 'static {
    /// The builder of the session `spec` asks for, without its agent: its model,
    /// toolsets, options and user data.
    fn builder(&self, spec: &SessionSpec) -> Result<SessionBuilder, FactoryError>;

    /// The agent named `name`, built with `data`: a session's first agent, the agent a
    /// front's `update_agent` names, and each agent of a session being restored.
    fn agent(&self, name: &str, data: &Value) -> Result<Agent, FactoryError>;

    /// The builder and agent registry a session restored from its snapshot starts with.
    /// By default [`builder`](Self::builder) and `agents` (which builds every agent with
    /// [`agent`](Self::agent)). Override it when the session's user data is written in its
    /// snapshots (`userdata_serde`): return a builder without user data and
    /// `agents.userdata::<T>()`, so the snapshot's is read back.
    fn restoring(
        &self,
        spec: &SessionSpec,
        agents: AgentRegistry,
    ) -> Result<(SessionBuilder, AgentRegistry), FactoryError> {
        Ok((self.builder(spec)?, agents))
    }
}

/// A shared factory: the same one for several workers, or for a worker started again.
impl<F: SessionFactory + ?Sized> SessionFactory for std::sync::Arc<F> {
    fn builder(&self, spec: &SessionSpec) -> Result<SessionBuilder, FactoryError> {
        (**self).builder(spec)
    }

    fn agent(&self, name: &str, data: &Value) -> Result<Agent, FactoryError> {
        (**self).agent(name, data)
    }

    fn restoring(
        &self,
        spec: &SessionSpec,
        agents: AgentRegistry,
    ) -> Result<(SessionBuilder, AgentRegistry), FactoryError> {
        (**self).restoring(spec, agents)
    }
}
