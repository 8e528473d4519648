//! Messages over the server's `max_payload`, written and read as parts.
//!
//! A long conversation's full snapshot (or a big turn's delta) can be larger than one
//! message may be. It is then written as `part` messages followed by the message itself,
//! which carries the last piece and, in `Sb-Parts`, the sequence of the first part. Each
//! write is a compare-and-set like any other, so a stale owner cannot add a part either,
//! and nothing else can come between the parts of one message: a reader joins the parts
//! from `Sb-Parts` up to the message.
//!
//! A writer that stops between parts (it died, it was fenced, the server went away)
//! leaves parts that no message closes. They are not the chain: a reader skips them (a
//! delta's reader looks at deltas only), and one that finds them at the subject's end
//! follows each part's `Sb-Before` (the subject's last message before the run) back to
//! the chain's real end. The next full snapshot purges them with the rest.

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::DirectGetErrorKind;
use bytes::{Bytes, BytesMut};
use switchboard::snapshot::StoreError;

use super::{
    corrupt, unavailable, unmarked, SnapshotKind, SnapshotRecord, SnapshotStream, SnapshotWriter,
    StreamError, WriterState,
};
use crate::namespace::SessionKey;

/// On a message written in parts: the sequence of its first part.
pub(super) const PARTS: &str = "Sb-Parts";
/// On a part: the subject's last message before the run of parts it belongs to.
pub(super) const BEFORE: &str = "Sb-Before";
/// On a message written in parts: the sequence of every part, in order, comma-separated.
/// A reader fetches each by its sequence: it does not depend on the server's index of the
/// subject's messages (which a ten-minute fault campaign once saw skip a full snapshot's
/// parts for good, though nothing had removed them).
pub(super) const PART_SEQS: &str = "Sb-Part-Seqs";

/// The longest `Sb-Part-Seqs` written (the rest of `ROOM` is for the other headers): a
/// message of more parts than this holds (hundreds of MiB) is read by its `Sb-Parts`
/// alone.
const MOST_PART_SEQS_BYTES: usize = 2048;

/// What a message needs beside its payload (the headers, ours and JetStream's).
const ROOM: usize = 4096;

/// The most `part` messages followed back from a subject's end.
const MOST_RUNS: usize = 16;

/// A subject's end: its last sequence and epoch, and the last message of its chain (the
/// last one that is not a part) with its record.
pub(super) struct Tail {
    pub(super) last_seq: u64,
    pub(super) last_epoch: u64,
    pub(super) message: StreamMessage,
    pub(super) record: SnapshotRecord,
}

/// `payload` cut into pieces of at most `limit` bytes (without copying).
pub(super) fn pieces(payload: &Bytes, limit: usize) -> Vec<Bytes> {
    if payload.len() <= limit {
        return vec![payload.clone()];
    }
    (0..payload.len())
        .step_by(limit)
        .map(|at| payload.slice(at..payload.len().min(at + limit)))
        .collect()
}

fn number(message: &StreamMessage, name: &str) -> u64 {
    message
        .headers
        .get(name)
        .and_then(|v| v.as_str().parse().ok())
        .unwrap_or(0)
}

impl SnapshotStream {
    /// The most payload bytes one message may carry on this connection's server.
    pub(super) fn message_limit(&self) -> usize {
        self.js
            .client()
            .max_payload()
            .saturating_sub(ROOM)
            .max(ROOM)
    }

    /// The end of `session`'s subject: `None` when it has no message.
    pub(super) async fn tail(&self, session: &SessionKey) -> Result<Option<Tail>, StoreError> {
        let subject = self.subject(session);
        let Some(last) = self
            .last(&subject)
            .await
            .map_err(|err| unavailable(session, err))?
        else {
            return Ok(None);
        };
        let record = SnapshotRecord::read(&last).map_err(|err| unmarked(session, err))?;
        let (last_seq, last_epoch) = (record.seq, record.epoch);
        let (mut message, mut record) = (last, record);
        for _ in 0..MOST_RUNS {
            if record.kind != SnapshotKind::Part {
                return Ok(Some(Tail {
                    last_seq,
                    last_epoch,
                    message,
                    record,
                }));
            }
            let before = number(&message, BEFORE);
            message = self.stream.direct_get(before).await.map_err(|err| {
                let reason = format!("at {before}: {err}");
                unavailable(
                    session,
                    StreamError::Read {
                        subject: subject.clone(),
                        reason,
                    },
                )
            })?;
            record = SnapshotRecord::read(&message).map_err(|err| unmarked(session, err))?;
        }
        Err(corrupt(
            session,
            format!("it ends in more than {MOST_RUNS} runs of unfinished parts"),
        ))
    }

    /// The whole payload of `message`: its parts' joined with its own.
    pub(super) async fn payload(&self, message: &StreamMessage) -> Result<Bytes, String> {
        let first = number(message, PARTS);
        if first == 0 {
            return Ok(message.payload.clone());
        }
        let subject = message.subject.to_string();
        if let Some(seqs) = part_seqs(message) {
            return self.join_by_sequence(message, &subject, &seqs).await;
        }
        let mut joined = BytesMut::new();
        let mut at = first;
        while at < message.sequence {
            let part = match self
                .stream
                .direct_get_next_for_subject(subject.clone(), Some(at))
                .await
            {
                Ok(part) => part,
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => {
                    return Err(format!(
                        "{subject}: part {at} of {} is gone",
                        message.sequence
                    ))
                }
                Err(err) => return Err(format!("cannot read {subject} at {at}: {err}")),
            };
            let record = SnapshotRecord::read(&part).map_err(|err| err.to_string())?;
            if part.sequence >= message.sequence || record.kind != SnapshotKind::Part {
                // Where the parts should have been says who could have removed them.
                return Err(format!(
                    "{subject}: message {} has {:?} {} among its parts (its parts start at \
                     {first}; the next one after {} is missing)",
                    message.sequence,
                    record.kind,
                    part.sequence,
                    at.saturating_sub(1)
                ));
            }
            joined.extend_from_slice(&part.payload);
            at = part.sequence + 1;
        }
        joined.extend_from_slice(&message.payload);
        Ok(joined.freeze())
    }

    /// `message`'s parts fetched by their sequences, joined with its own payload.
    async fn join_by_sequence(
        &self,
        message: &StreamMessage,
        subject: &str,
        seqs: &[u64],
    ) -> Result<Bytes, String> {
        let mut joined = BytesMut::new();
        for &seq in seqs {
            let part = match self.stream.direct_get(seq).await {
                Ok(part) => part,
                Err(err) if err.kind() == DirectGetErrorKind::NotFound => {
                    return Err(format!(
                        "{subject}: part {seq} of {} is gone",
                        message.sequence
                    ))
                }
                Err(err) => return Err(format!("cannot read {subject} at {seq}: {err}")),
            };
            let record = SnapshotRecord::read(&part).map_err(|err| err.to_string())?;
            if part.subject.as_str() != subject
                || part.sequence >= message.sequence
                || record.kind != SnapshotKind::Part
            {
                return Err(format!(
                    "{subject}: message {}'s part {seq} is {:?} on {}",
                    message.sequence, record.kind, part.subject
                ));
            }
            joined.extend_from_slice(&part.payload);
        }
        joined.extend_from_slice(&message.payload);
        Ok(joined.freeze())
    }
}

/// The sequences of `message`'s parts, when it names them.
fn part_seqs(message: &StreamMessage) -> Option<Vec<u64>> {
    let value = message.headers.get(PART_SEQS)?;
    value
        .as_str()
        .split(',')
        .map(|seq| seq.trim().parse().ok())
        .collect()
}

impl SnapshotWriter {
    /// Writes one message of `kind` (its parts first, when it is over the server's
    /// limit), the first after the subject's message `after` and each next after the one
    /// before; the sequences of its first part (its own when whole) and of the message.
    pub(super) async fn write_message(
        &self,
        state: &mut WriterState,
        kind: SnapshotKind,
        full: u64,
        payload: Bytes,
        ttl: Option<std::time::Duration>,
        after: u64,
    ) -> Result<(u64, u64), StoreError> {
        let inner = &self.inner;
        let pieces = pieces(&payload, inner.stream.message_limit());
        let count = pieces.len();
        let mut first = 0;
        let mut last = after;
        let mut part_seqs = String::new();
        for (index, piece) in pieces.into_iter().enumerate() {
            let message = if index + 1 < count {
                inner
                    .stream
                    .message(
                        SnapshotKind::Part,
                        state.epoch,
                        &inner.worker,
                        full,
                        piece.clone(),
                    )
                    .header(BEFORE, after.to_string().as_str())
            } else {
                let mut message =
                    inner
                        .stream
                        .message(kind, state.epoch, &inner.worker, full, piece.clone());
                if first != 0 {
                    message = message.header(PARTS, first.to_string().as_str());
                    if part_seqs.len() <= MOST_PART_SEQS_BYTES {
                        message = message.header(PART_SEQS, part_seqs.as_str());
                    }
                }
                if let Some(ttl) = ttl {
                    message = message.ttl(ttl);
                }
                message
            };
            last = self.write_locked(state, message, &piece, last).await?;
            if index == 0 {
                first = last;
            }
            if index + 1 < count {
                if !part_seqs.is_empty() {
                    part_seqs.push(',');
                }
                part_seqs.push_str(&last.to_string());
            }
        }
        Ok((first, last))
    }
}
