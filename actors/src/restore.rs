//! `AgentRegistry`: how a restoring process builds back the code a snapshot names.
//!
//! A snapshot names agents and holds the data each was built with
//! ([`AgentBuilder::restore_data`](crate::AgentBuilder::restore_data)); it never holds
//! code. The restoring side registers, per agent name, how to build that agent from its
//! data, so an agent built at handoff time with data of the call (a booking agent for
//! "party of 2") comes back the same — and, when the session's user data was given as
//! serde data, which type to read it back as.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::agent::Agent;
use crate::shared::{userdata_json, UserdataJson};
use crate::snapshot::SnapshotError;

type BuildAgent = Arc<dyn Fn(&Value) -> Result<Agent, String> + Send + Sync>;
type BuildAnyAgent = Arc<dyn Fn(&str, &Value) -> Result<Agent, String> + Send + Sync>;
type Userdata = Arc<dyn Any + Send + Sync>;
type ReadUserdata = Arc<dyn Fn(Value) -> Result<Userdata, String> + Send + Sync>;

/// Builds the agents a snapshot names, by name, from the data they were built with; see
/// [`SessionBuilder::restore`](crate::SessionBuilder::restore).
///
/// ```
/// use switchboard::snapshot::AgentRegistry;
/// use switchboard::Agent;
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Booking { party: u32 }
///
/// fn booking_agent(booking: &Booking) -> Agent {
///     Agent::builder("booker")
///         .instructions(format!("Book a table for {}.", booking.party))
///         .restore_data(booking)
///         .build()
///         .expect("a plain agent builds")
/// }
///
/// let agents = AgentRegistry::new()
///     .agent("greeter", |_| Agent::builder("greeter").build())
///     .agent_with_data("booker", |booking: Booking| Ok::<_, std::convert::Infallible>(booking_agent(&booking)));
/// assert!(agents.knows("booker"));
/// ```
#[derive(Clone, Default)]
pub struct AgentRegistry {
    agents: HashMap<String, BuildAgent>,
    /// Builds any agent the map does not name, by name and data.
    fallback: Option<BuildAnyAgent>,
    /// How to read the user data back, and how to write it again in later snapshots.
    userdata: Option<(ReadUserdata, UserdataJson)>,
}

impl fmt::Debug for AgentRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("AgentRegistry")
            .field("agents", &names)
            .field("fallback", &self.fallback.is_some())
            .field("userdata", &self.userdata.is_some())
            .finish()
    }
}

impl AgentRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// How to build the agent named `name` from its restore data (JSON, `null` when it
    /// was built with none). The agent it builds must have that name.
    pub fn agent<E: fmt::Display>(
        mut self,
        name: impl Into<String>,
        build: impl Fn(&Value) -> Result<Agent, E> + Send + Sync + 'static,
    ) -> Self {
        self.agents.insert(
            name.into(),
            Arc::new(move |data| build(data).map_err(|err| err.to_string())),
        );
        self
    }

    /// [`agent`](Self::agent), reading the restore data as a `T` first.
    pub fn agent_with_data<T: DeserializeOwned, E: fmt::Display>(
        self,
        name: impl Into<String>,
        build: impl Fn(T) -> Result<Agent, E> + Send + Sync + 'static,
    ) -> Self {
        self.agent(name, move |data: &Value| {
            let data = T::deserialize(data).map_err(|err| format!("its data: {err}"))?;
            build(data).map_err(|err| err.to_string())
        })
    }

    /// How to build an agent no [`agent`](Self::agent) names, from its name and restore
    /// data: for a host whose agents come from one factory function (a cluster worker's
    /// `SessionFactory`). The agent it builds must have that name.
    pub fn fallback<E: fmt::Display>(
        mut self,
        build: impl Fn(&str, &Value) -> Result<Agent, E> + Send + Sync + 'static,
    ) -> Self {
        self.fallback = Some(Arc::new(move |name, data| {
            build(name, data).map_err(|err| err.to_string())
        }));
        self
    }

    /// The type the session's user data is read back as, when the session was started
    /// with [`SessionBuilder::userdata_serde`](crate::SessionBuilder::userdata_serde).
    pub fn userdata<T: Serialize + DeserializeOwned + Any + Send + Sync>(mut self) -> Self {
        let read: ReadUserdata = Arc::new(|value| {
            serde_json::from_value::<T>(value)
                .map(|data| Arc::new(data) as Userdata)
                .map_err(|err| err.to_string())
        });
        self.userdata = Some((read, userdata_json::<T>()));
        self
    }

    /// Whether it knows how to build the agent named `name` (with a
    /// [`fallback`](Self::fallback), always: the fallback may still refuse it).
    pub fn knows(&self, name: &str) -> bool {
        self.agents.contains_key(name) || self.fallback.is_some()
    }

    /// Builds the agent `name` from `data`.
    pub(crate) fn build(&self, name: &str, data: &Value) -> Result<Agent, SnapshotError> {
        let built = match (self.agents.get(name), &self.fallback) {
            (Some(build), _) => build(data),
            (None, Some(fallback)) => fallback(name, data),
            (None, None) => Err("the registry has no agent of that name".to_owned()),
        };
        let agent = built.map_err(|reason| SnapshotError::UnknownAgent {
            name: name.to_owned(),
            reason,
        })?;
        if agent.name() != name {
            return Err(SnapshotError::UnknownAgent {
                name: name.to_owned(),
                reason: format!("the registry built an agent named {:?}", agent.name()),
            });
        }
        Ok(agent)
    }

    /// Reads the session's user data back, with the writer for later snapshots, if the
    /// registry names its type.
    pub(crate) fn read_userdata(
        &self,
        value: Value,
    ) -> Option<Result<(Userdata, UserdataJson), SnapshotError>> {
        let (read, write) = self.userdata.as_ref()?;
        Some(
            read(value)
                .map(|data| (data, write.clone()))
                .map_err(|reason| SnapshotError::UserData { reason }),
        )
    }
}
