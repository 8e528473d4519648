//! `Inspector`: a test's (or debugging host's) view of a session's actor mailboxes: which
//! actors live, what each handled, how many messages wait for each.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::ids::{ActorId, SessionId};
use crate::mailbox::{ActorSnapshot, Received, Records};

/// Why an inspection check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// No actor with this id was ever seen in the session.
    #[error("no actor {id} in this session; actors seen: {known}")]
    UnknownActor {
        /// The id asked for.
        id: String,
        /// The ids the journal knows.
        known: String,
    },
    /// The actor is still alive.
    #[error("actor {id} is still alive")]
    StillAlive {
        /// The actor.
        id: String,
    },
    /// The awaited actor did not start in time.
    #[error("actor {id} did not start within {timeout:?}; actors seen: {known}")]
    NotStarted {
        /// The actor.
        id: String,
        /// How long we waited.
        timeout: Duration,
        /// The ids the journal knows.
        known: String,
    },
    /// The awaited message did not arrive in time.
    #[error("actor {id} received no {kind} within {timeout:?}; it received: {received}")]
    Timeout {
        /// The actor.
        id: String,
        /// The message kind awaited.
        kind: String,
        /// How long we waited.
        timeout: Duration,
        /// What it did receive.
        received: String,
    },
}

/// The mailbox view of one session. Cheap to clone.
#[derive(Clone)]
pub struct Inspector {
    records: Arc<Records>,
    session: SessionId,
}

impl fmt::Debug for Inspector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inspector")
            .field("session", &self.session)
            .finish()
    }
}

impl Inspector {
    pub(crate) fn new(records: Arc<Records>, session: SessionId) -> Self {
        Self { records, session }
    }

    /// The ids of the session's live actors, sorted.
    pub fn live_actors(&self) -> Vec<ActorId> {
        self.records.live_actors()
    }

    /// Every actor the session ever had, alive or stopped, sorted.
    pub fn actors(&self) -> Vec<ActorId> {
        self.records.actors()
    }

    /// The actors that work for the agent named `agent`, alive or stopped, sorted: its
    /// activities (`activity/s1/<agent>#<n>`, one per activation), their agent-scoped
    /// toolsets (`toolset/s1/<agent>#<n>/<toolset>`, where `tools` holds its bare tools),
    /// and the tool runs its model started, including runs of session-scoped toolsets,
    /// which can outlive its activity. Keep the live ones with [`Inspector::is_alive`].
    ///
    /// ```
    /// # use switchboard::*;
    /// # fn check(inspector: &Inspector) {
    /// let live: Vec<ActorId> = inspector
    ///     .actors_of_agent("booker")
    ///     .into_iter()
    ///     .filter(|id| inspector.is_alive(id.as_str()))
    ///     .collect();
    /// # }
    /// ```
    pub fn actors_of_agent(&self, agent: &str) -> Vec<ActorId> {
        let activity = format!("activity/{}/{agent}#", self.session);
        let toolset = format!("toolset/{}/{agent}#", self.session);
        let mut found: Vec<ActorId> = self
            .records
            .actors()
            .into_iter()
            .filter(|id| {
                let id = id.as_str();
                // The generation must follow the name, so `book` does not match `booker#1`.
                let generation_then = |rest: &str, tail: fn(&str) -> bool| {
                    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                    digits > 0 && tail(&rest[digits..])
                };
                id.strip_prefix(&activity)
                    .is_some_and(|rest| generation_then(rest, str::is_empty))
                    || id
                        .strip_prefix(&toolset)
                        .is_some_and(|rest| generation_then(rest, |tail| tail.starts_with('/')))
            })
            .collect();
        found.extend(
            self.records
                .runs()
                .into_iter()
                .filter(|(_, _, caller)| &**caller == agent)
                .map(|(id, _, _)| id),
        );
        found.sort();
        found
    }

    /// The runs of the tool named `tool`, alive or stopped, in the order the calls started.
    /// A run's id is `tool/s1/<n>:<call id>`, where `<n>` counts the session's runs and the
    /// call id is the model's: this finds a run without guessing either.
    pub fn runs_of_tool(&self, tool: &str) -> Vec<ActorId> {
        let mut runs: Vec<(u64, ActorId)> = self
            .records
            .runs()
            .into_iter()
            .filter(|(_, name, _)| &**name == tool)
            .map(|(id, _, _)| (self.run_number(&id), id))
            .collect();
        runs.sort();
        runs.into_iter().map(|(_, id)| id).collect()
    }

    /// The `<n>` of a run id `tool/s1/<n>:<call id>`.
    fn run_number(&self, id: &ActorId) -> u64 {
        id.as_str()
            .strip_prefix(&format!("tool/{}/", self.session))
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or(u64::MAX)
    }

    /// Whether an actor is alive now.
    pub fn is_alive(&self, id: &str) -> bool {
        self.records
            .snapshot(id)
            .is_some_and(|s| s.stopped_at.is_none())
    }

    /// What the journal knows of one actor.
    pub fn actor(&self, id: &str) -> Result<ActorSnapshot, InspectError> {
        self.records.snapshot(id).ok_or_else(|| self.unknown(id))
    }

    /// The messages an actor handled, oldest first.
    pub fn received(&self, id: &str) -> Result<Vec<Received>, InspectError> {
        Ok(self.actor(id)?.received)
    }

    /// How many messages wait in an actor's mailbox now.
    pub fn pending(&self, id: &str) -> Result<usize, InspectError> {
        Ok(self.actor(id)?.pending)
    }

    /// When the actor started (wall clock: paused test time does not move it).
    pub fn started_at(&self, id: &str) -> Result<chrono::DateTime<chrono::Utc>, InspectError> {
        Ok(self.actor(id)?.started_at)
    }

    /// When the actor stopped, if it has.
    pub fn stopped_at(
        &self,
        id: &str,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, InspectError> {
        Ok(self.actor(id)?.stopped_at)
    }

    /// Ok when the actor has stopped.
    pub fn assert_stopped(&self, id: &str) -> Result<(), InspectError> {
        match self.actor(id)?.stopped_at {
            Some(_) => Ok(()),
            None => Err(InspectError::StillAlive { id: id.to_owned() }),
        }
    }

    /// Every message the session's actors handled, in order.
    pub fn traffic(&self) -> Vec<Received> {
        self.records.all_received()
    }

    /// Waits until `id` has handled a message of `kind` (looking at what it already
    /// handled too), for at most `timeout`.
    pub async fn wait_for(
        &self,
        id: &str,
        kind: &str,
        timeout: Duration,
    ) -> Result<Received, InspectError> {
        self.wait_for_nth(id, kind, 1, timeout).await
    }

    /// Waits until `id` has handled its `n`-th message of `kind` (1 for the first, counting
    /// what it already handled), for at most `timeout`; returns that message. An actor
    /// that does not exist yet is waited for too.
    pub async fn wait_for_nth(
        &self,
        id: &str,
        kind: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Received, InspectError> {
        let wait = async {
            loop {
                let notified = self.records.notified();
                if let Some(found) = self.records.snapshot(id).and_then(|s| {
                    s.received
                        .into_iter()
                        .filter(|r| r.kind == kind)
                        .nth(n.saturating_sub(1))
                }) {
                    return found;
                }
                notified.await;
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(found) => Ok(found),
            Err(_) => Err(InspectError::Timeout {
                id: id.to_owned(),
                kind: if n > 1 {
                    format!("{kind} #{n}")
                } else {
                    kind.to_owned()
                },
                timeout,
                received: self
                    .records
                    .snapshot(id)
                    .map(|s| {
                        s.received
                            .iter()
                            .map(|r| r.kind)
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_else(|| "nothing (unknown actor)".into()),
            }),
        }
    }

    /// Waits until the actor `id` has started (returns at once if it already has, even if
    /// it has stopped since), for at most `timeout`. An actor starts when its parent
    /// creates it; to wait until it has also handled its first message, use
    /// [`Inspector::wait_for`] with that message's kind (an activity's is `StartActivity`).
    pub async fn wait_for_start(&self, id: &str, timeout: Duration) -> Result<(), InspectError> {
        let wait = async {
            loop {
                let notified = self.records.notified();
                if self.records.snapshot(id).is_some() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| InspectError::NotStarted {
                id: id.to_owned(),
                timeout,
                known: self.known(),
            })
    }

    /// Waits until the actor `id` has stopped, for at most `timeout`.
    pub async fn wait_until_stopped(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<(), InspectError> {
        let wait = async {
            loop {
                let notified = self.records.notified();
                if self
                    .records
                    .snapshot(id)
                    .is_some_and(|s| s.stopped_at.is_some())
                {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| InspectError::StillAlive { id: id.to_owned() })
    }

    /// Waits until no actor of the session is alive, for at most `timeout`; the error
    /// names the ones still alive.
    pub async fn wait_until_all_stopped(&self, timeout: Duration) -> Result<(), InspectError> {
        let wait = async {
            loop {
                let notified = self.records.notified();
                if self.records.live_actors().is_empty() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| {
            let live: Vec<String> = self
                .records
                .live_actors()
                .iter()
                .map(ToString::to_string)
                .collect();
            InspectError::StillAlive {
                id: live.join(", "),
            }
        })
    }

    /// The recorded traffic as a Mermaid sequence diagram: participants aliased (ids hold
    /// `:` and `#`, which Mermaid does not accept), in sequence order, without
    /// timestamps, so the text is stable for golden files.
    pub fn mermaid(&self) -> String {
        let traffic = self.traffic();
        let mut participants: Vec<ActorId> = Vec::new();
        let alias = |id: &ActorId, participants: &mut Vec<ActorId>| -> usize {
            match participants.iter().position(|p| p == id) {
                Some(i) => i,
                None => {
                    participants.push(id.clone());
                    participants.len() - 1
                }
            }
        };
        let mut lines = Vec::new();
        for r in &traffic {
            let from = alias(&r.from, &mut participants);
            let to = alias(&r.to, &mut participants);
            lines.push(format!("    A{from}->>A{to}: {}", r.kind));
        }
        let mut out = String::from("sequenceDiagram\n");
        for (i, p) in participants.iter().enumerate() {
            out.push_str(&format!("    participant A{i} as {p}\n"));
        }
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
        out
    }

    /// Writes [`Inspector::mermaid`] to a file (e.g. `trace.mmd`, which Mermaid viewers and
    /// GitHub render).
    pub fn save_mermaid(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.mermaid())
    }

    fn unknown(&self, id: &str) -> InspectError {
        InspectError::UnknownActor {
            id: id.to_owned(),
            known: self.known(),
        }
    }

    /// The ids the journal knows, for error messages.
    fn known(&self) -> String {
        self.records
            .actors()
            .iter()
            .map(ActorId::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}
