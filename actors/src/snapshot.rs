//! Sessions that outlive their process (a deploy, a crash, a move): what a snapshot of a
//! session holds, the deltas that bring one up to date, and their two encodings.
//!
//! A snapshot names code, it never holds it: agents by name and the data they were built
//! with (restored through an [`AgentRegistry`](crate::AgentRegistry)), tools by name (their
//! restore policy is read from the restored code), user data as JSON. It holds the
//! conversation at its last consistent point: every activation's chat context as
//! committed, and the state of the machines that run it — the session's (its schedule:
//! the pause stack of sub-tasks, queued work, what the user is doing; the user's words
//! waiting for the end of their turn; the counters that keep ids unique), each live
//! activation's (its step under way, the items pending for a deferred reply) and each
//! toolset's (the calls it runs) — and the call ids issued.
//!
//! Each machine writes and reads its own part, with serde, beside its code; this module
//! knows the frame they travel in: the session's id, its epoch, the ledger of host inputs
//! applied, the call's usage and latency so far, and the chain. The machines' parts are
//! one JSON value in the head (`state`), which the session assembles and takes apart
//! again.
//!
//! It is split in two so that saving after every turn costs what changed, not the length
//! of the call: a small *head* (replaced whole by each delta) and the *body* — chat items
//! and call ids — which only grows, so a [`SnapshotDelta`] carries the head and what was
//! appended (or, after a chat was cut, what follows the cut).
//!
//! Encodings: JSON ([`SessionSnapshot::to_json`]), and a compact binary form
//! ([`SessionSnapshot::to_bytes`]: MessagePack in a frame with a magic number, the schema
//! version, the length and a CRC-32, so a truncated or corrupted file is refused, never
//! half-read).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::ChatItem;
use crate::input_ledger::LedgerRecord;
use crate::latency::SessionLatency;
use crate::usage::SessionUsage;

/// The schema this build writes. It reads this one; a snapshot of a newer schema is
/// refused with [`SnapshotError::NewerSchema`], one of an older schema with
/// [`SnapshotError::OlderSchema`].
pub const SNAPSHOT_VERSION: u32 = 2;

/// Why a snapshot could not be read, applied or restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SnapshotError {
    /// Written by a newer build: upgrade this one to restore it.
    #[error("the snapshot has schema version {found}; this build reads up to {supported}")]
    NewerSchema {
        /// The snapshot's version.
        found: u32,
        /// The newest this build reads.
        supported: u32,
    },
    /// Written by an older build whose snapshots this one does not read (version 1: the
    /// machines' parts were laid out differently): restore it with that build.
    #[error("the snapshot has schema version {found}; this build reads version {supported} only")]
    OlderSchema {
        /// The snapshot's version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The snapshot holds a running tool call of a toolset the restoring side did not
    /// supply (a session toolset not given to the builder again, or an agent toolset the
    /// agent the registry built no longer has): the call cannot follow its tool's restore
    /// policy. Give the builder the session's toolsets (`SessionBuilder::toolset`) and the
    /// registry agents with theirs.
    #[error("the snapshot's running call {call_id} ({tool}) belongs to toolset {toolset:?}, which the restoring side does not have")]
    UnknownToolset {
        /// The running call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// The toolset it ran in (`tools` for an agent's bare tools).
        toolset: String,
    },
    /// The snapshot holds a running tool call whose toolset is there but no longer has
    /// its tool: the call cannot follow its tool's restore policy.
    #[error("the snapshot's running call {call_id} is of tool {tool}, which toolset {toolset:?} no longer has")]
    UnknownTool {
        /// The running call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// The toolset it ran in (`tools` for an agent's bare tools).
        toolset: String,
    },
    /// The input ends before the snapshot does (a partial write or a cut transfer).
    #[error("the snapshot is truncated: {needed} bytes expected, {got} found")]
    Truncated {
        /// Bytes the frame says it has.
        needed: usize,
        /// Bytes there are.
        got: usize,
    },
    /// The input is not a snapshot, or was changed (a bad checksum, invalid data).
    #[error("the snapshot is corrupt: {reason}")]
    Corrupt {
        /// What is wrong.
        reason: String,
    },
    /// The snapshot names an agent the restoring registry does not know, or whose
    /// builder refused the snapshot's data.
    #[error("the snapshot needs agent {name:?}, which the agent registry cannot build: {reason}")]
    UnknownAgent {
        /// The agent's name.
        name: String,
        /// Why it could not be built.
        reason: String,
    },
    /// The snapshot's user data does not deserialize into the type the registry names.
    #[error("the snapshot's user data does not deserialize: {reason}")]
    UserData {
        /// The deserializer's message.
        reason: String,
    },
    /// A delta for another session, or one that does not follow the snapshot it is
    /// applied to.
    #[error("the delta does not follow this snapshot: {reason}")]
    OutOfOrder {
        /// What does not match.
        reason: String,
    },
}

/// Why a store could not claim, save or load a session's snapshots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StoreError {
    /// The file system refused (a missing folder, no room, no permission).
    #[error("snapshot store: {path}: {message}")]
    Io {
        /// The file or folder.
        path: String,
        /// What the system said.
        message: String,
    },
    /// What the store holds does not read as a snapshot.
    #[error("snapshot store: {0}")]
    Snapshot(#[from] SnapshotError),
    /// A delta that does not follow the chain the store holds (another chain's, or a
    /// link is missing), or one for a session with no full snapshot yet: nothing was
    /// written. Save a full snapshot first (a session's saving does so by itself).
    #[error(
        "snapshot store: the delta for session {session:?} does not follow what the store holds"
    )]
    NoBase {
        /// The session.
        session: String,
    },
    /// A session id that cannot name a record here.
    #[error("snapshot store: session id {id:?} cannot name a file")]
    BadId {
        /// The id.
        id: String,
    },
    /// The write or the claim was refused. A write: the session's record is not at the
    /// version this writer last saw — someone claimed the session after this writer did
    /// (a restore of it, here or in another process, or a takeover), or removed it; this
    /// writer is stale and may not write the session any more (fencing), and a session's
    /// saving stops for good ([`SessionEvent::Fenced`](crate::SessionEvent::Fenced)). A
    /// restore's claim ([`ClaimRule::Restore`](crate::ClaimRule::Restore)): someone
    /// claimed the session after the snapshot restored was written — another restore of
    /// it came first — and nothing was written; a session being started does not start.
    #[error("snapshot store: session {session:?} is written by a newer owner: {reason}")]
    Fenced {
        /// The session.
        session: String,
        /// What the store found.
        reason: String,
    },
    /// A remote store could not be reached or did not answer (a network store: a server
    /// away, a timeout); a later write may succeed.
    #[error("snapshot store: session {session:?}: the store is unavailable: {reason}")]
    Unavailable {
        /// The session.
        session: String,
        /// What failed.
        reason: String,
    },
    /// The store holds no snapshot of the session
    /// ([`SessionBuilder::restore_from`](crate::SessionBuilder::restore_from) had nothing
    /// to restore): nothing was claimed.
    #[error("snapshot store: no snapshot of session {session:?} to restore")]
    NotFound {
        /// The session.
        session: String,
    },
}

/// A session written down at its last consistent point: read it back with
/// [`SessionBuilder::restore`](crate::SessionBuilder::restore), on this engine or another
/// process's. Serializable with serde; [`to_json`](Self::to_json) and
/// [`to_bytes`](Self::to_bytes) are the two encodings a store uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionSnapshot {
    pub(crate) version: u32,
    /// Its place in the session's chain (see [`SessionSnapshot::seq`]): a delta applies
    /// to the snapshot whose `seq` is its `base`.
    pub(crate) seq: u64,
    pub(crate) head: SnapshotHead,
    /// Every activation that started, in start order (the body: it only grows).
    pub(crate) activations: Vec<ActivationRecord>,
    /// Every call id the session issued, in order (the body: it only grows).
    pub(crate) call_ids: Vec<String>,
}

/// What changed in a session since a snapshot (or the delta before): apply it to that
/// snapshot with [`SessionSnapshot::apply`]. Its size follows what changed, not the
/// length of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotDelta {
    pub(crate) version: u32,
    /// The `seq` of the snapshot it applies to.
    pub(crate) base: u64,
    pub(crate) head: SnapshotHead,
    /// Items appended to (or rewritten in) activations already written.
    pub(crate) chats: Vec<ChatChange>,
    /// Activations started since.
    pub(crate) activations: Vec<ActivationRecord>,
    /// Call ids issued since.
    pub(crate) call_ids: Vec<String>,
}

/// The small part of a snapshot, replaced whole by each delta.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SnapshotHead {
    pub(crate) session: String,
    /// Incremented at every restore: a writer with an older epoch is stale (fencing).
    pub(crate) epoch: u64,
    /// The id up to which every host input applied with an id is in the snapshot
    /// (`Session::apply`, for exactly-once delivery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_input: Option<u64>,
    /// The ledger of the host inputs applied with ids: the last ones, each with its answer,
    /// or marked not held when its effect is not in the snapshot (a queued job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) inputs: Vec<LedgerRecord>,
    /// The session's user data, when it was given as serde data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) userdata: Option<Value>,
    /// The machines' own states, as the session assembled them (see the module docs).
    pub(crate) state: Value,
    /// The usage ledger: every LLM request's tokens by agent and model, for the whole call
    /// (a restored session goes on counting from it).
    #[serde(default, skip_serializing_if = "SessionUsage::is_empty")]
    pub(crate) usage: SessionUsage,
    /// Each agent's latency over the call.
    #[serde(default, skip_serializing_if = "SessionLatency::is_empty")]
    pub(crate) latency: SessionLatency,
}

/// One activation as the history keeps it: who, and its chat context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ActivationRecord {
    /// Its place in start order.
    pub(crate) order: u32,
    /// Its actor id (`activity/s1/booker#2`).
    pub(crate) activity: String,
    pub(crate) agent: String,
    /// What its agent was built with (`AgentBuilder::restore_data`).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub(crate) data: Value,
    /// How many of its first items it was given at start.
    pub(crate) inherited: usize,
    /// When its first `inherited` items are the chat of an activation that had closed,
    /// that activation: they are not written twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) inherited_from: Option<u32>,
    /// Its items: all of them, or those after the inherited ones with `inherited_from`.
    pub(crate) items: Vec<ChatItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sub_task_of: Option<SubTaskRecord>,
}

/// Which activation an activation ran as a sub-task of, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SubTaskRecord {
    /// The caller's actor id.
    pub(crate) caller: String,
    /// How many items the caller had when it paused.
    pub(crate) after: usize,
}

/// Items written to an activation since the last snapshot: its first `keep` stored items
/// stay, `append` follows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ChatChange {
    pub(crate) order: u32,
    pub(crate) keep: usize,
    pub(crate) append: Vec<ChatItem>,
}

impl SessionSnapshot {
    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.head.session
    }

    /// The session's epoch: 0 for a session never restored, one more at each restore. A
    /// writer holding an older epoch than the latest snapshot is stale.
    pub fn epoch(&self) -> u64 {
        self.head.epoch
    }

    /// The id up to which every host input applied with an id
    /// ([`Session::apply`](crate::Session::apply)) is in the snapshot: a host that resends
    /// its inputs after a restore sends those after it (the restored session answers any
    /// it holds from its ledger without applying it again).
    pub fn last_input(&self) -> Option<u64> {
        self.head.last_input
    }

    /// The schema version it was written with.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The session's usage ledger when it was taken: what the call had cost so far, by
    /// agent and model (a stored call's cost reads without restoring it).
    pub fn usage(&self) -> &SessionUsage {
        &self.head.usage
    }

    /// Each agent's latency over the call when it was taken.
    pub fn latency(&self) -> &SessionLatency {
        &self.head.latency
    }

    /// How many activations it holds (closed and live).
    pub fn activations(&self) -> usize {
        self.activations.len()
    }

    /// How many chat items it holds, over every activation.
    pub fn items(&self) -> usize {
        self.activations.iter().map(|a| a.items.len()).sum()
    }

    /// Its place in the session's chain of snapshots: every snapshot or delta the
    /// session takes moves the chain on by one, a full one too (so a delta never applies
    /// to a full snapshot taken after its base), and applying a delta moves it to the
    /// delta's. The first snapshot a session takes is 0; a restored session's chain goes
    /// on from the snapshot it was restored from, so its first snapshot is one more than
    /// that snapshot's.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The session's user data as JSON, when it was given as serde data.
    pub(crate) fn userdata(&self) -> Option<&Value> {
        self.head.userdata.as_ref()
    }

    /// Refuses a snapshot of a newer schema (one built through serde, not read through
    /// `from_json` or `from_bytes`, skipped that check).
    pub(crate) fn check_version(&self) -> Result<(), SnapshotError> {
        check_version(self.version)
    }

    /// Brings the snapshot up to date with a delta taken after it.
    pub fn apply(&mut self, delta: &SnapshotDelta) -> Result<(), SnapshotError> {
        check_version(delta.version)?;
        if delta.head.session != self.head.session {
            return Err(SnapshotError::OutOfOrder {
                reason: format!(
                    "the delta is of session {:?}, the snapshot of {:?}",
                    delta.head.session, self.head.session
                ),
            });
        }
        if delta.base != self.seq {
            return Err(SnapshotError::OutOfOrder {
                reason: format!(
                    "the delta follows snapshot {}, this is snapshot {}",
                    delta.base, self.seq
                ),
            });
        }
        // Checked in full before anything changes: a delta that does not apply leaves the
        // snapshot as it was.
        for change in &delta.chats {
            let record = self
                .activations
                .iter()
                .find(|r| r.order == change.order)
                .ok_or_else(|| SnapshotError::OutOfOrder {
                    reason: format!(
                        "the delta changes activation {}, which is not here",
                        change.order
                    ),
                })?;
            if change.keep > record.items.len() {
                return Err(SnapshotError::OutOfOrder {
                    reason: format!(
                        "the delta keeps {} items of activation {}, which has {}",
                        change.keep,
                        change.order,
                        record.items.len()
                    ),
                });
            }
        }
        for change in &delta.chats {
            if let Some(record) = self
                .activations
                .iter_mut()
                .find(|r| r.order == change.order)
            {
                record.items.truncate(change.keep);
                record.items.extend(change.append.iter().cloned());
            }
        }
        // A record of an activation already here is written again whole (its inherited
        // items changed); a new one is added in start order.
        for record in &delta.activations {
            match self
                .activations
                .iter_mut()
                .find(|r| r.order == record.order)
            {
                Some(old) => *old = record.clone(),
                None => {
                    let at = self.activations.partition_point(|r| r.order < record.order);
                    self.activations.insert(at, record.clone());
                }
            }
        }
        self.call_ids.extend(delta.call_ids.iter().cloned());
        self.head = delta.head.clone();
        self.seq += 1;
        Ok(())
    }

    /// JSON text (UTF-8).
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data with derived impls into memory cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a snapshot written by [`to_json`](Self::to_json).
    pub fn from_json(json: &[u8]) -> Result<Self, SnapshotError> {
        read_json(json)
    }

    /// The compact binary form: MessagePack in a checked frame.
    pub fn to_bytes(&self) -> Vec<u8> {
        frame(Kind::Full, self)
    }

    /// Reads a snapshot written by [`to_bytes`](Self::to_bytes): a truncated or changed
    /// input is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        unframe(Kind::Full, bytes)
    }
}

impl SnapshotDelta {
    /// The session it is of.
    pub fn session_id(&self) -> &str {
        &self.head.session
    }

    /// The `seq` of the snapshot it applies to.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The session's epoch when it was taken (see [`SessionSnapshot::epoch`]).
    pub fn epoch(&self) -> u64 {
        self.head.epoch
    }

    /// The id of the last host input applied when it was taken (see
    /// [`SessionSnapshot::last_input`]): a store that wrote it knows the inputs up to
    /// there are kept.
    pub fn last_input(&self) -> Option<u64> {
        self.head.last_input
    }

    /// How many chat items it carries (what its size follows).
    pub fn items(&self) -> usize {
        self.chats.iter().map(|c| c.append.len()).sum::<usize>()
            + self
                .activations
                .iter()
                .map(|a| a.items.len())
                .sum::<usize>()
    }

    /// JSON text (UTF-8).
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data with derived impls into memory cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a delta written by [`to_json`](Self::to_json).
    pub fn from_json(json: &[u8]) -> Result<Self, SnapshotError> {
        read_json(json)
    }

    /// The compact binary form: MessagePack in a checked frame.
    pub fn to_bytes(&self) -> Vec<u8> {
        frame(Kind::Delta, self)
    }

    /// Reads a delta written by [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        unframe(Kind::Delta, bytes)
    }
}

fn check_version(found: u32) -> Result<(), SnapshotError> {
    if found > SNAPSHOT_VERSION {
        return Err(SnapshotError::NewerSchema {
            found,
            supported: SNAPSHOT_VERSION,
        });
    }
    if found < SNAPSHOT_VERSION {
        return Err(SnapshotError::OlderSchema {
            found,
            supported: SNAPSHOT_VERSION,
        });
    }
    Ok(())
}

/// Reads JSON, checking the schema version before the rest: a newer schema may not parse.
fn read_json<T: serde::de::DeserializeOwned>(json: &[u8]) -> Result<T, SnapshotError> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let version: Version = serde_json::from_slice(json).map_err(corrupt)?;
    check_version(version.version)?;
    serde_json::from_slice(json).map_err(corrupt)
}

fn corrupt(err: impl std::fmt::Display) -> SnapshotError {
    SnapshotError::Corrupt {
        reason: err.to_string(),
    }
}

/// What a binary frame holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Full = 1,
    Delta = 2,
}

const MAGIC: &[u8; 4] = b"SBSN";
/// Magic, kind, version, payload length, CRC-32 of the payload.
const HEADER: usize = 4 + 1 + 4 + 8 + 4;

/// The length of the binary frame ([`SessionSnapshot::to_bytes`],
/// [`SnapshotDelta::to_bytes`]) at the start of `bytes`, if its header is all there: how a
/// log of frames written one after another is split.
pub(crate) fn frame_len(bytes: &[u8]) -> Option<usize> {
    let len = bytes.get(9..17)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(len);
    usize::try_from(u64::from_le_bytes(word))
        .ok()?
        .checked_add(HEADER)
}

fn frame<T: Serialize>(kind: Kind, value: &T) -> Vec<u8> {
    // Named fields (a map), so a reader of a later schema with added optional fields
    // still reads it; serializing derived plain data into memory cannot fail.
    let payload = rmp_serde::to_vec_named(value).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(kind as u8);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn unframe<T: serde::de::DeserializeOwned>(kind: Kind, bytes: &[u8]) -> Result<T, SnapshotError> {
    if bytes.len() < HEADER {
        if bytes.len() >= 4 && &bytes[..4] != MAGIC {
            return Err(corrupt("not a switchboard snapshot (bad magic number)"));
        }
        return Err(SnapshotError::Truncated {
            needed: HEADER,
            got: bytes.len(),
        });
    }
    if &bytes[..4] != MAGIC {
        return Err(corrupt("not a switchboard snapshot (bad magic number)"));
    }
    if bytes[4] != kind as u8 {
        return Err(corrupt(match kind {
            Kind::Full => "a delta, where a full snapshot was expected",
            Kind::Delta => "a full snapshot, where a delta was expected",
        }));
    }
    let word = |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
    check_version(u32::from_le_bytes(word(5)))?;
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[9..17]);
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(corrupt)?;
    let crc = u32::from_le_bytes(word(17));
    let payload = &bytes[HEADER..];
    if payload.len() < len {
        return Err(SnapshotError::Truncated {
            needed: HEADER + len,
            got: bytes.len(),
        });
    }
    let payload = &payload[..len];
    if crc32(payload) != crc {
        return Err(corrupt("the checksum does not match"));
    }
    rmp_serde::from_slice(payload).map_err(corrupt)
}

/// CRC-32 (IEEE 802.3, reflected), bit by bit: snapshots are written per turn, not per
/// byte on a hot path, and a table would be 1 KiB of statics for nothing.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        // The index is the low byte of `crc ^ byte`: always below 256.
        crc = (crc >> 8) ^ CRC_TABLE[((crc ^ u32::from(byte)) & 0xFF) as usize];
    }
    !crc
}

/// CRC-32 (IEEE, reflected) a byte at a time: the bit-by-bit loop was most of the time of
/// `to_bytes` and `from_bytes`.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatRole;

    fn snapshot(items: usize) -> SessionSnapshot {
        SessionSnapshot {
            version: SNAPSHOT_VERSION,
            seq: 0,
            head: SnapshotHead {
                session: "call-42".into(),
                epoch: 3,
                last_input: Some(17),
                inputs: Vec::new(),
                userdata: None,
                state: serde_json::json!({"stack": [{"order": 1}]}),
                ..SnapshotHead::default()
            },
            activations: vec![ActivationRecord {
                order: 1,
                activity: "activity/call-42/a#1".into(),
                agent: "a".into(),
                data: serde_json::json!({"party": 2}),
                inherited: 0,
                inherited_from: None,
                items: (0..items)
                    .map(|i| ChatItem::message(ChatRole::User, format!("hello {i}")))
                    .collect(),
                sub_task_of: None,
            }],
            call_ids: vec!["call_1".into()],
        }
    }

    #[test]
    fn the_crc_is_the_standard_one() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn both_encodings_read_back_the_same_snapshot() {
        let s = snapshot(3);
        assert_eq!(SessionSnapshot::from_json(&s.to_json()).unwrap(), s);
        assert_eq!(SessionSnapshot::from_bytes(&s.to_bytes()).unwrap(), s);
        assert!(
            s.to_bytes().len() < s.to_json().len(),
            "the binary form is smaller"
        );
    }

    #[test]
    fn a_truncated_or_changed_binary_snapshot_is_refused() {
        let bytes = snapshot(3).to_bytes();
        for cut in [0, 3, HEADER - 1, HEADER, bytes.len() - 1] {
            assert!(
                matches!(
                    SessionSnapshot::from_bytes(&bytes[..cut]),
                    Err(SnapshotError::Truncated { .. })
                ),
                "cut at {cut}"
            );
        }
        let mut flipped = bytes.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x40;
        assert!(matches!(
            SessionSnapshot::from_bytes(&flipped),
            Err(SnapshotError::Corrupt { .. })
        ));
        assert!(matches!(
            SessionSnapshot::from_bytes(b"not a snapshot at all, just text"),
            Err(SnapshotError::Corrupt { .. })
        ));
        assert!(matches!(
            SessionSnapshot::from_json(b"{\"version\": 1, \"seq\""),
            Err(SnapshotError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_newer_schema_is_refused_before_it_is_parsed() {
        let mut bytes = snapshot(1).to_bytes();
        bytes[5..9].copy_from_slice(&(SNAPSHOT_VERSION + 1).to_le_bytes());
        assert_eq!(
            SessionSnapshot::from_bytes(&bytes),
            Err(SnapshotError::NewerSchema {
                found: SNAPSHOT_VERSION + 1,
                supported: SNAPSHOT_VERSION
            })
        );
        let json = br#"{"version": 99, "something": "we do not know yet"}"#;
        assert!(matches!(
            SessionSnapshot::from_json(json),
            Err(SnapshotError::NewerSchema { found: 99, .. })
        ));
    }

    #[test]
    fn a_delta_appends_and_rewrites_and_must_follow_its_snapshot() {
        let mut s = snapshot(3);
        let delta = SnapshotDelta {
            version: SNAPSHOT_VERSION,
            base: 0,
            head: SnapshotHead {
                last_input: Some(18),
                ..s.head.clone()
            },
            chats: vec![ChatChange {
                order: 1,
                keep: 2,
                append: vec![ChatItem::message(ChatRole::Assistant, "cut and more")],
            }],
            activations: Vec::new(),
            call_ids: vec!["call_2".into()],
        };
        let again = delta.clone();
        s.apply(&delta).unwrap();
        assert_eq!(s.seq, 1);
        assert_eq!(s.activations[0].items.len(), 3);
        assert_eq!(s.activations[0].items[2].text(), Some("cut and more"));
        assert_eq!(s.call_ids, ["call_1", "call_2"]);
        assert_eq!(s.last_input(), Some(18));
        assert!(matches!(
            s.apply(&again),
            Err(SnapshotError::OutOfOrder { .. })
        ));
        let round = SnapshotDelta::from_bytes(&delta.to_bytes()).unwrap();
        assert_eq!(round, delta);
    }

    #[test]
    fn a_delta_that_does_not_apply_leaves_the_snapshot_as_it_was() {
        let mut s = snapshot(3);
        let before = s.clone();
        let delta = SnapshotDelta {
            version: SNAPSHOT_VERSION,
            base: 0,
            head: s.head.clone(),
            chats: vec![
                ChatChange {
                    order: 1,
                    keep: 3,
                    append: vec![ChatItem::message(ChatRole::Assistant, "fine")],
                },
                ChatChange {
                    order: 7,
                    keep: 0,
                    append: Vec::new(),
                },
            ],
            activations: Vec::new(),
            call_ids: vec!["call_2".into()],
        };
        assert!(matches!(
            s.apply(&delta),
            Err(SnapshotError::OutOfOrder { .. })
        ));
        assert_eq!(s, before);
    }

    #[test]
    fn a_record_written_again_replaces_the_one_of_its_order() {
        let mut s = snapshot(2);
        let mut rewritten = s.activations[0].clone();
        rewritten.inherited = 1;
        rewritten
            .items
            .insert(0, ChatItem::message(ChatRole::User, "inherited"));
        let mut second = s.activations[0].clone();
        second.order = 2;
        let delta = SnapshotDelta {
            version: SNAPSHOT_VERSION,
            base: 0,
            head: s.head.clone(),
            chats: Vec::new(),
            activations: vec![second, rewritten.clone()],
            call_ids: Vec::new(),
        };
        s.apply(&delta).unwrap();
        assert_eq!(s.activations.len(), 2);
        assert_eq!(s.activations[0], rewritten);
        assert_eq!(s.activations[1].order, 2);
    }
}
