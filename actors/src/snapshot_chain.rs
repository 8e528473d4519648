//! One session's chain of snapshots read back: a full snapshot and the deltas taken after
//! it, brought together with one rule, whatever store they come from ([`SnapshotChain`]).
//!
//! Every store keeps a session as links, oldest first: full snapshots and deltas (a file
//! store as a file and a log of frames, the cluster's store as messages on a subject, a
//! database as rows). Reading them back is the same for all, so it is written once here:
//!
//! * a **full snapshot** starts the chain again: it holds everything before it;
//! * a **delta that follows** the chain (its base is the chain's `seq`) is applied, and the
//!   chain moves on by one;
//! * a **delta already in** the chain (its base below the chain's `seq`) is skipped: a delta
//!   that a later full snapshot already holds (left by a crash between the full
//!   snapshot's write and the removal of the deltas before it), or one written twice;
//! * a **delta that does not follow** (its base above the chain's `seq`: a link is
//!   missing; of another session; one that does not apply; or none before it) **ends the
//!   chain** there, and so does a link that does not read (a torn last write, cut by a
//!   crash): every delta after it follows it, so none can apply. The chain is what was
//!   read before it, until a later full snapshot starts it again.
//!
//! A store's writes refuse a delta that does not follow what it holds and a writer that
//! is not the latest to claim the session, so a chain that ends early is a crash's torn
//! last write or damage; [`SnapshotChain::end`] says where and why, for the store to
//! report.

use crate::snapshot::{frame_len, SessionSnapshot, SnapshotDelta, SnapshotError};

/// A session's links read back in order, with the rule of the module docs: feed it the
/// links oldest first ([`full`](Self::full), [`delta`](Self::delta), or a log of binary
/// frames with [`frames`](Self::frames)), then take the snapshot it makes
/// ([`into_snapshot`](Self::into_snapshot)).
///
/// ```
/// use switchboard::snapshot::SnapshotChain;
///
/// let chain = SnapshotChain::new();
/// assert!(chain.into_snapshot().is_none()); // no link: nothing stored
/// ```
#[derive(Debug, Default)]
pub struct SnapshotChain {
    snapshot: Option<SessionSnapshot>,
    end: Option<ChainEnd>,
}

/// What became of one delta fed to a [`SnapshotChain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkRead {
    /// It followed the chain and was applied.
    Applied,
    /// The chain already holds it: skipped.
    AlreadyIn,
    /// It does not follow (or the chain had ended before it): not applied, and the chain
    /// ends (see [`SnapshotChain::end`]).
    Ended,
}

/// Where and why a chain ended before its last link.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChainEnd {
    /// The chain's `seq` when it ended (`None`: no full snapshot was read before).
    pub seq: Option<u64>,
    /// Whether the link that ended it was cut short (a crash mid-write), rather than a
    /// whole link that does not follow.
    pub torn: bool,
    /// What was wrong with the link.
    pub reason: String,
}

impl SnapshotChain {
    /// An empty chain.
    pub fn new() -> Self {
        Self::default()
    }

    /// A full snapshot: the chain starts again from it.
    pub fn full(&mut self, snapshot: SessionSnapshot) {
        self.snapshot = Some(snapshot);
        self.end = None;
    }

    /// The next delta.
    pub fn delta(&mut self, delta: &SnapshotDelta) -> LinkRead {
        if self.end.is_some() {
            return LinkRead::Ended;
        }
        let Some(snapshot) = self.snapshot.as_mut() else {
            self.ended(false, "a delta with no full snapshot before it".to_owned());
            return LinkRead::Ended;
        };
        if delta.session_id() != snapshot.session_id() {
            let reason = format!(
                "a delta of session {:?} in the chain of {:?}",
                delta.session_id(),
                snapshot.session_id()
            );
            self.ended(false, reason);
            return LinkRead::Ended;
        }
        if delta.base() < snapshot.seq() {
            return LinkRead::AlreadyIn;
        }
        match snapshot.apply(delta) {
            Ok(()) => LinkRead::Applied,
            Err(err) => {
                self.ended(false, err.to_string());
                LinkRead::Ended
            }
        }
    }

    /// A link that does not read (`torn`: it was cut short, as by a crash mid-write): the
    /// chain ends before it.
    pub fn unreadable(&mut self, error: &SnapshotError, torn: bool) {
        if self.end.is_none() {
            self.ended(torn, error.to_string());
        }
    }

    /// Deltas in their binary form ([`SnapshotDelta::to_bytes`]) written one after another
    /// (a log), each fed as [`delta`](Self::delta). Returns how many bytes of `log` the
    /// chain read: up to the end of the last delta that followed or was already in. What
    /// comes after (a torn last frame, or the frames after one that does not follow) is
    /// not part of the chain; a writer going on with the log cuts it there first, so that
    /// what it appends follows the chain.
    pub fn frames(&mut self, log: &[u8]) -> usize {
        let mut read = 0;
        while read < log.len() && self.end.is_none() {
            let rest = &log[read..];
            let Some(len) = frame_len(rest).filter(|len| *len <= rest.len()) else {
                let error = SnapshotError::Truncated {
                    needed: frame_len(rest).unwrap_or(rest.len() + 1),
                    got: rest.len(),
                };
                self.unreadable(&error, true);
                break;
            };
            match SnapshotDelta::from_bytes(&rest[..len]) {
                Ok(delta) => {
                    if self.delta(&delta) == LinkRead::Ended {
                        break;
                    }
                }
                Err(error) => {
                    self.unreadable(&error, false);
                    break;
                }
            }
            read += len;
        }
        read
    }

    /// The chain's `seq` so far: what a delta appended next must have as its base (`None`:
    /// no full snapshot yet).
    pub fn seq(&self) -> Option<u64> {
        self.snapshot.as_ref().map(SessionSnapshot::seq)
    }

    /// Where and why the chain ended before its last link, if it did.
    pub fn end(&self) -> Option<&ChainEnd> {
        self.end.as_ref()
    }

    /// The snapshot with every delta that followed applied (`None`: no full snapshot).
    pub fn into_snapshot(self) -> Option<SessionSnapshot> {
        self.snapshot
    }

    fn ended(&mut self, torn: bool, reason: String) {
        self.end = Some(ChainEnd {
            seq: self.seq(),
            torn,
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatItem, ChatRole};
    use crate::snapshot::SNAPSHOT_VERSION;
    use crate::snapshot::{ActivationRecord, ChatChange, SnapshotHead};

    /// A full snapshot of session `session` at `seq`, with one activation of `items`
    /// messages.
    fn full(session: &str, seq: u64, items: usize) -> SessionSnapshot {
        SessionSnapshot {
            version: SNAPSHOT_VERSION,
            seq,
            head: head(session),
            activations: vec![ActivationRecord {
                order: 1,
                activity: format!("activity/{session}/a#1"),
                agent: "a".into(),
                data: serde_json::Value::Null,
                inherited: 0,
                inherited_from: None,
                items: (0..items).map(message).collect(),
                sub_task_of: None,
            }],
            call_ids: Vec::new(),
        }
    }

    fn head(session: &str) -> SnapshotHead {
        SnapshotHead {
            session: session.into(),
            state: serde_json::json!({"stack": [{"order": 1}]}),
            ..SnapshotHead::default()
        }
    }

    fn message(i: usize) -> ChatItem {
        ChatItem::message(ChatRole::User, format!("message {i}"))
    }

    /// A delta on `base` that appends message `item` (the chain then holds `item + 1`
    /// messages, as a delta taken after `item` earlier ones).
    fn delta(session: &str, base: u64, item: usize) -> SnapshotDelta {
        SnapshotDelta {
            version: SNAPSHOT_VERSION,
            base,
            head: head(session),
            chats: vec![ChatChange {
                order: 1,
                keep: item,
                append: vec![message(item)],
            }],
            activations: Vec::new(),
            call_ids: Vec::new(),
        }
    }

    fn items(chain: SnapshotChain) -> (u64, usize) {
        let snapshot = chain.into_snapshot().unwrap();
        (snapshot.seq(), snapshot.items())
    }

    #[test]
    fn an_empty_chain_has_nothing() {
        let mut chain = SnapshotChain::new();
        assert_eq!(chain.frames(&[]), 0);
        assert!(chain.end().is_none());
        assert!(chain.into_snapshot().is_none());
    }

    #[test]
    fn a_full_snapshot_alone_is_the_chain() {
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 3, 2));
        assert_eq!(chain.seq(), Some(3));
        assert!(chain.end().is_none());
        assert_eq!(items(chain), (3, 2));
    }

    #[test]
    fn deltas_that_follow_apply_in_order() {
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        assert_eq!(chain.delta(&delta("s", 0, 1)), LinkRead::Applied);
        assert_eq!(chain.delta(&delta("s", 1, 2)), LinkRead::Applied);
        assert!(chain.end().is_none());
        assert_eq!(items(chain), (2, 3));
    }

    #[test]
    fn a_delta_with_a_wrong_base_ends_the_chain_and_nothing_after_it_applies() {
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        assert_eq!(chain.delta(&delta("s", 0, 1)), LinkRead::Applied);
        // Link 1 is missing.
        assert_eq!(chain.delta(&delta("s", 2, 3)), LinkRead::Ended);
        // Even one that would have followed what was read: the chain has ended.
        assert_eq!(chain.delta(&delta("s", 1, 2)), LinkRead::Ended);
        let end = chain.end().unwrap().clone();
        assert_eq!((end.seq, end.torn), (Some(1), false));
        assert!(end.reason.contains("follows snapshot 2"), "{}", end.reason);
        assert_eq!(items(chain), (1, 2));
    }

    #[test]
    fn a_delta_of_another_session_or_before_any_full_snapshot_ends_the_chain() {
        let mut chain = SnapshotChain::new();
        assert_eq!(chain.delta(&delta("s", 0, 1)), LinkRead::Ended);
        assert_eq!(chain.end().unwrap().seq, None);
        // A full snapshot starts it again.
        chain.full(full("s", 0, 1));
        assert_eq!(chain.delta(&delta("other", 0, 1)), LinkRead::Ended);
        assert!(chain.end().unwrap().reason.contains("other"));
        assert_eq!(items(chain), (0, 1));
    }

    #[test]
    fn a_duplicate_delta_is_skipped() {
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        let once = delta("s", 0, 1);
        assert_eq!(chain.delta(&once), LinkRead::Applied);
        assert_eq!(chain.delta(&once), LinkRead::AlreadyIn);
        assert_eq!(chain.delta(&delta("s", 1, 2)), LinkRead::Applied);
        assert!(chain.end().is_none());
        assert_eq!(items(chain), (2, 3));
    }

    #[test]
    fn a_torn_last_frame_is_left_out_and_the_chain_before_it_is_whole() {
        let mut log = delta("s", 0, 1).to_bytes();
        let whole = log.len();
        let second = delta("s", 1, 2).to_bytes();
        log.extend_from_slice(&second[..second.len() - 3]);
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        assert_eq!(chain.frames(&log), whole, "the torn frame is not read");
        let end = chain.end().unwrap();
        assert!(end.torn);
        assert_eq!(end.seq, Some(1));
        assert_eq!(items(chain), (1, 2));
        // Cut within the header too.
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        assert_eq!(chain.frames(&second[..5]), 0);
        assert!(chain.end().unwrap().torn);
    }

    #[test]
    fn a_changed_frame_ends_the_chain_without_being_torn() {
        let mut log = delta("s", 0, 1).to_bytes();
        let at = log.len() - 1;
        log[at] ^= 0xFF;
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        assert_eq!(chain.frames(&log), 0);
        let end = chain.end().unwrap();
        assert!(!end.torn);
        assert!(end.reason.contains("checksum"), "{}", end.reason);
    }

    #[test]
    fn a_newer_full_snapshot_after_deltas_starts_the_chain_again() {
        let mut chain = SnapshotChain::new();
        chain.full(full("s", 0, 1));
        assert_eq!(chain.delta(&delta("s", 0, 1)), LinkRead::Applied);
        assert_eq!(chain.delta(&delta("s", 5, 9)), LinkRead::Ended);
        chain.full(full("s", 4, 7));
        assert!(
            chain.end().is_none(),
            "a full snapshot starts the chain again"
        );
        // A delta the new full snapshot holds (left by a crash before the old ones were
        // removed), then one that follows it.
        let mut log = delta("s", 1, 2).to_bytes();
        log.extend_from_slice(&delta("s", 4, 7).to_bytes());
        assert_eq!(chain.frames(&log), log.len());
        assert_eq!(items(chain), (5, 8));
    }
}
