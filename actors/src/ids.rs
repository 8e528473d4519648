//! Identifiers: sessions, actors and tool runs.
//!
//! Actor ids are strings a person can read in a test failure:
//! `session/s1`, `activity/s1/agent-a#2`, `toolset/s1/booking`,
//! `toolset/s1/agent-a#2/tools`, `tool/s1/7:call_3`. They are unique for the life of
//! the engine: activities carry their generation and tool runs a per-session sequence
//! number, because agents come back and providers reuse call ids. (A host that gives a
//! later session the id of one that is gone, `SessionBuilder::id`, gets that session's
//! actor ids again: unique among live sessions then.)

use std::fmt;
use std::sync::Arc;

/// The id of one actor, e.g. `activity/s1/agent-a#1`.
///
/// Cheap to clone (an `Arc<str>`): every counted message carries its sender's id.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId(Arc<str>);

impl ActorId {
    /// Wraps a string as an actor id.
    pub(crate) fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id that stands for the host program (code outside the engine) as a sender.
    pub(crate) fn host() -> Self {
        Self::new("host")
    }

    /// Which session this actor belongs to (`s1` for `tool/s1/7:call_3`), if any.
    pub fn session(&self) -> Option<&str> {
        self.0.split('/').nth(1)
    }

    pub(crate) fn session_actor(session: &SessionId) -> Self {
        Self::new(format!("session/{session}"))
    }

    pub(crate) fn activity(session: &SessionId, agent: &str, generation: u32) -> Self {
        Self::new(format!("activity/{session}/{agent}#{generation}"))
    }

    pub(crate) fn session_toolset(session: &SessionId, toolset: &str) -> Self {
        Self::new(format!("toolset/{session}/{toolset}"))
    }

    pub(crate) fn agent_toolset(
        session: &SessionId,
        agent: &str,
        generation: u32,
        toolset: &str,
    ) -> Self {
        Self::new(format!("toolset/{session}/{agent}#{generation}/{toolset}"))
    }

    /// The task that keeps a session's connection to a realtime model, as a sender.
    pub(crate) fn realtime(session: &SessionId, model: &str) -> Self {
        Self::new(format!("realtime/{session}/{model}"))
    }

    pub(crate) fn tool_run(session: &SessionId, seq: u64, call_id: &str) -> Self {
        Self::new(format!("tool/{session}/{seq}:{call_id}"))
    }
}

/// As its text: `"activity/s1/booker#2"`.
impl serde::Serialize for ActorId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// From its text (an id another engine made: it names that engine's actor).
impl<'de> serde::Deserialize<'de> for ActorId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::new(String::deserialize(deserializer)?))
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl PartialEq<str> for ActorId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ActorId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// The id of one session: the host's own (`SessionBuilder::id`, say the call's id), or
/// `s1`, `s2`, … in the order the engine started them. It names one live session of its
/// engine: once that session is gone, the id is free again.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// The longest id a host may choose, in bytes: room for a UUID, a SIP Call-ID or a
    /// telephony provider's call id, and short enough to print in every log line.
    pub const MAX_LEN: usize = 128;

    pub(crate) fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `other` is this very id value (the same allocation), not only the same
    /// text: a registry entry is removed only by the session that made it, never by an
    /// earlier one of the same id.
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Checks an id a host chose: not empty, at most [`SessionId::MAX_LEN`] bytes, no `/`
    /// (actor ids embed the session id between slashes, `tool/<session>/7:call_1`, and
    /// `ActorId::session` splits on them), no whitespace or control character (ids go
    /// into logs and spans, where they must read as one word).
    pub(crate) fn check(id: &str) -> Result<(), &'static str> {
        if id.is_empty() {
            return Err("it is empty");
        }
        if id.len() > Self::MAX_LEN {
            return Err("it is longer than 128 bytes");
        }
        if id.contains('/') {
            return Err("it contains '/', which separates the parts of actor ids");
        }
        if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("it contains whitespace or a control character");
        }
        Ok(())
    }
}

/// As its text: `"s1"`, `"call-42"`.
impl serde::Serialize for SessionId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// From its text, checked as a host's id is ([`SessionBuilder::id`](crate::SessionBuilder::id)).
impl<'de> serde::Deserialize<'de> for SessionId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::check(&text).map_err(|reason| {
            serde::de::Error::custom(format!("session id {text:?} is invalid: {reason}"))
        })?;
        Ok(Self::new(text))
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
