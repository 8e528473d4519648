//! The inputs task of a remote session: sends inputs one at a time, in order, each with
//! the next id, retrying an input with the same id until its owner answers — and, when a
//! new owner takes the session over, sends it the inputs its snapshot does not hold.
//!
//! One at a time, because the owner's ledger keeps only the last applied id (what a
//! snapshot carries) and because the engine must see inputs in the order the front gave
//! them (speech started, then the transcript). An answer comes within a round trip (a
//! turn answers `Pending` at once and its outcome comes as an event), so one at a time
//! costs a round trip per input, a fraction of a millisecond.
//!
//! **Across a move.** The task keeps every input it sent until the owner reports a stored
//! snapshot that holds it (`saved` in each answer). A new owner says which inputs its
//! snapshot holds (`SessionResumed { last_input }`, or `Earlier`/`OutOfOrder` answers); the
//! task then sends it the later ones again, in order, before anything new — whether a
//! caller waits or not (a turn that was under way on the old owner runs again, and its
//! `InputDone` reaches the call still waiting for it). Each input is applied once in the
//! conversation: the old owner's application died with it unless its snapshot holds it.
//! An input that changes nothing a snapshot keeps (a history read, an interim transcript,
//! the user starting or stopping to speak) and whose answer the front already has is never
//! sent again: in its place goes `Input::Answered`, which the new owner counts and applies
//! nothing for, so the front never gets two results for one read. An input that changes
//! the conversation (a turn, a `say`, a final transcript, a handoff, a playout report, an
//! interrupt) is sent again even when its answer was heard: the answer does not prove that
//! a stored snapshot kept its effect, and a conversation that lost a turn the user heard
//! the answer of would go on without it (the new owner runs it again). An input a new owner's snapshot holds whose
//! answer was not heard is asked for again: the owner answers from its session's ledger
//! when that keeps it. While the old owner drains it answers `Moving`, and the task waits
//! for the new one.
//!
//! **Which owner counts.** Every answer carries its owner's epoch. An answer from an owner
//! older than the newest heard from (in an event, or in an answer taken) is a stale
//! owner's and is not taken; what the owner has (`acked`) is counted in the numbers of the
//! owner it was learnt from, so a `SessionResumed` that comes after that owner's answers
//! (events have their own task) sends nothing again.
//!
//! An input that found no answer within the input deadline may or may not have been
//! applied; later inputs of the session then fail the same way rather than risk being
//! applied out of order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::RequestErrorKind;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::events::epoch_of;
use super::{OwnerSeen, RemoteShared};
use crate::gateway::GatewayError;
use crate::protocol::{Answer, Input, InputOutcome, Reply, Request};
use crate::remote_event::CloseReason;

/// One input to send, with where its answers go.
pub(crate) struct Submission {
    pub(crate) input: Input,
    /// Where its `InputDone` goes, for an input whose answer takes time.
    pub(crate) outcome: Option<oneshot::Sender<Result<InputOutcome, GatewayError>>>,
    /// Where the owner's immediate answer goes (none: nobody waits).
    pub(crate) answer: Option<oneshot::Sender<Result<Answer, GatewayError>>>,
}

/// An input sent, kept until a stored snapshot holds it.
struct Sent {
    id: u64,
    name: &'static str,
    /// Whether its only answer is "done" (so one lost in a move is known).
    answers_done: bool,
    /// Whether the front has its answer (one other than "pending"; a pending one's
    /// `InputDone` is in `RemoteShared`).
    answered: bool,
    /// Whether it changes what a snapshot keeps: then it is sent again after a move until a
    /// stored snapshot holds it, answered or not; else, once answered, never again.
    kept_by_snapshots: bool,
    payload: Bytes,
}

/// The inputs sent that no stored snapshot is known to hold, oldest first; their ids
/// follow each other.
#[derive(Default)]
struct Outbox {
    sent: VecDeque<Sent>,
}

impl Outbox {
    fn push(&mut self, sent: Sent) {
        self.sent.push_back(sent);
    }

    /// Takes back the newest one (it was not applied: its id is used again).
    fn pop(&mut self) {
        self.sent.pop_back();
    }

    fn get(&self, id: u64) -> Option<&Sent> {
        let first = self.sent.front()?.id;
        let at = usize::try_from(id.checked_sub(first)?).ok()?;
        self.sent.get(at)
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Sent> {
        let first = self.sent.front()?.id;
        let at = usize::try_from(id.checked_sub(first)?).ok()?;
        self.sent.get_mut(at)
    }

    /// Forgets the inputs up to `saved`: a stored snapshot holds them.
    fn forget_through(&mut self, saved: u64) {
        while self.sent.front().is_some_and(|s| s.id <= saved) {
            self.sent.pop_front();
        }
    }
}

/// Where the current owner is in the session's inputs.
struct Delivery {
    /// The owner has every input up to this one.
    acked: u64,
    /// The epoch of the owner `acked` was last learnt from (its `SessionResumed`, or its
    /// answer to an input): a `SessionResumed` of that owner that comes after its answers
    /// (the events come on their own task, and may come late) tells nothing new, and one
    /// of an older owner nothing at all.
    epoch: u64,
    owner: watch::Receiver<OwnerSeen>,
}

impl Delivery {
    /// An owner said it resumed the session: a newer one than `acked` counts for has the
    /// inputs its snapshot holds.
    fn new_owner(&mut self, shared: &RemoteShared) {
        let seen = *self.owner.borrow_and_update();
        if let Some(lacking) = self.resumed(seen) {
            shared.gateway.count(|s| s.inputs_resent += lacking);
        }
    }

    /// Takes what `seen` says; returns how many inputs the owner lacks that an older one
    /// was counted as having (they are sent again), when it is a newer owner.
    fn resumed(&mut self, seen: OwnerSeen) -> Option<u64> {
        match seen.epoch.cmp(&self.epoch) {
            // Old news: a newer owner answered already.
            std::cmp::Ordering::Less => None,
            // The owner that answered already: it has what it answered for, and what its
            // snapshot held.
            std::cmp::Ordering::Equal => {
                self.acked = self.acked.max(seen.last_input);
                None
            }
            std::cmp::Ordering::Greater => {
                let lacking = self.acked.saturating_sub(seen.last_input);
                self.acked = seen.last_input;
                self.epoch = seen.epoch;
                Some(lacking)
            }
        }
    }

    /// The owner at `epoch` (not older than the newest heard from) said it has every
    /// input up to `acked`.
    fn answered(&mut self, epoch: u64, acked: u64) {
        self.epoch = self.epoch.max(epoch);
        self.acked = acked;
    }
}

/// Sends the session's inputs until every handle is gone.
pub(crate) async fn send_inputs(
    shared: Arc<RemoteShared>,
    mut submissions: mpsc::UnboundedReceiver<Submission>,
) {
    let mut next_id = 1u64;
    let mut in_doubt: Option<GatewayError> = None;
    let mut outbox = Outbox::default();
    let mut owner = shared.owner.subscribe();
    owner.borrow_and_update();
    let mut delivery = Delivery {
        acked: 0,
        epoch: 0,
        owner,
    };
    loop {
        let submission = tokio::select! {
            biased;
            changed = delivery.owner.changed() => {
                if changed.is_err() {
                    break;
                }
                delivery.new_owner(&shared);
                // Nobody waits for these answers (their callers had theirs); a turn that
                // was under way runs again and its `InputDone` finds its caller.
                if in_doubt.is_none() && delivery.acked + 1 < next_id {
                    match deliver(&shared, &mut outbox, &mut delivery, next_id - 1).await {
                        Ok(_) | Err(GatewayError::AnswerLost { .. } | GatewayError::Closed { .. }) => {}
                        Err(err) => in_doubt = Some(err),
                    }
                }
                continue;
            }
            submission = submissions.recv() => submission,
        };
        let Some(Submission {
            input,
            outcome,
            answer,
        }) = submission
        else {
            break;
        };
        if matches!(input, Input::Close) {
            shared
                .closing
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let result = if let Some(err) = &in_doubt {
            Err(err.clone())
        } else if let Some(reason) = shared.closed() {
            Err(shared.closed_error(reason))
        } else {
            let id = next_id;
            match sent(&shared, id, input) {
                Err(err) => Err(err),
                Ok(sent) => {
                    if let Some(outcome) = outcome {
                        shared.register(id, outcome);
                    }
                    outbox.push(sent);
                    next_id += 1;
                    shared.gateway.count(|s| s.inputs_sent += 1);
                    let result = deliver(&shared, &mut outbox, &mut delivery, id).await;
                    match &result {
                        Ok(_) | Err(GatewayError::AnswerLost { .. }) => {}
                        Err(
                            err @ (GatewayError::Unreachable { .. }
                            | GatewayError::InputsLost { .. }),
                        ) => {
                            in_doubt = Some(err.clone());
                        }
                        // Not applied: the id is free for the next input.
                        Err(_) => {
                            outbox.pop();
                            next_id -= 1;
                        }
                    }
                    match &result {
                        Ok(Answer::Pending) => {}
                        Err(err @ GatewayError::AnswerLost { .. }) => shared.fail(id, err.clone()),
                        _ => shared.forget(id),
                    }
                    result
                }
            }
        };
        if let Some(answer) = answer {
            let _ = answer.send(result);
        }
    }
}

/// Input `id`, ready to send.
fn sent(shared: &RemoteShared, id: u64, input: Input) -> Result<Sent, GatewayError> {
    let name = input.name();
    let answers_done = matches!(
        input,
        Input::Transcript { .. }
            | Input::UserStartedSpeaking
            | Input::UserStoppedSpeaking
            | Input::PlayoutFinished { .. }
    );
    let kept_by_snapshots = !matches!(
        input,
        Input::Transcript {
            is_final: false,
            ..
        } | Input::UserStartedSpeaking
            | Input::UserStoppedSpeaking
            | Input::History
            | Input::Answered
    );
    let payload = serde_json::to_vec(&Request::Input { id, input }).map_err(|err| {
        GatewayError::Protocol {
            session: shared.key.clone(),
            detail: err.to_string(),
        }
    })?;
    let max = shared.gateway.client.nats().max_payload();
    if payload.len() > max {
        return Err(GatewayError::TooLarge {
            session: shared.key.clone(),
            what: name,
            bytes: payload.len(),
            max,
        });
    }
    Ok(Sent {
        id,
        name,
        answers_done,
        answered: false,
        kept_by_snapshots,
        payload: payload.into(),
    })
}

/// The answer to `target` once the session closed. Its outcome may have come before
/// (a close's answer is the history, published just before `SessionClosed`; the reply
/// to its request can come later than the owner's end on a loaded machine, and a retry
/// finds nobody): then it was applied, its answer `Pending`, and its caller takes the
/// outcome that waits for it. Otherwise its answer never came: `Closed`.
fn closed_after(
    shared: &RemoteShared,
    target: u64,
    reason: CloseReason,
) -> Result<Answer, GatewayError> {
    if shared.outcome_delivered(target) {
        return Ok(Answer::Pending);
    }
    Err(shared.closed_error(reason))
}

/// What goes in place of input `id` when the front has its answer.
fn answered_payload(shared: &RemoteShared, id: u64) -> Result<Bytes, GatewayError> {
    let request = Request::Input {
        id,
        input: Input::Answered,
    };
    serde_json::to_vec(&request)
        .map(Bytes::from)
        .map_err(|err| GatewayError::Protocol {
            session: shared.key.clone(),
            detail: err.to_string(),
        })
}

/// Gets every input up to `target` to the current owner, in order — those a new owner
/// lacks again first, each whose answer the front has as `Input::Answered` — and returns
/// `target`'s answer (asked for again when a new owner had it before it was heard). Gives
/// up when the session ends, the server refuses the subject, or the owner stays silent for
/// the input deadline.
async fn deliver(
    shared: &RemoteShared,
    outbox: &mut Outbox,
    delivery: &mut Delivery,
    target: u64,
) -> Result<Answer, GatewayError> {
    let gateway = &shared.gateway;
    let options = &gateway.options;
    let began = Instant::now();
    let mut deadline = began + options.input_deadline;
    let mut attempt = 0u32;
    loop {
        let next = delivery.acked + 1;
        // The owner had `target` before its answer was heard (a move in between): asked
        // again, it answers from its session's ledger if that keeps the answer.
        let asking = next > target;
        let at = next.min(target);
        let Some(sent) = outbox.get(at) else {
            return Err(GatewayError::InputsLost {
                session: shared.key.clone(),
                expected: at,
            });
        };
        let answered =
            !asking && !sent.kept_by_snapshots && (sent.answered || shared.outcome_delivered(at));
        let name = sent.name;
        let payload = if answered {
            answered_payload(shared, at)?
        } else {
            sent.payload.clone()
        };
        if attempt > 0 {
            gateway.count(|s| s.retries += 1);
        }
        attempt += 1;
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(options.attempt_timeout));
        let sent = tokio::select! {
            sent = gateway.client.nats().send_request(shared.inputs_subject.clone(), request) => sent,
            changed = delivery.owner.changed() => {
                if changed.is_ok() {
                    delivery.new_owner(shared);
                    deadline = Instant::now() + options.input_deadline;
                    attempt = 0;
                }
                continue;
            }
        };
        let unanswered = match sent {
            // A fenced owner that still answered: its answer is not the session's. Taken
            // as no answer: asked again shortly, the newest owner answers. (It lives: not
            // a silent owner.) Newest means the newest heard from in any way — a newer
            // owner's answer taken before counts, even when its `SessionResumed` is not
            // delivered yet: else the two would be taken in turn, and the stale one's
            // ledger (behind inputs the newer one's stored snapshot let the outbox
            // forget) would read as inputs lost.
            Ok(message) if !shared.answer_is_current(epoch_of(&message)) => {
                gateway.count(|s| s.stale_replies += 1);
                tracing::warn!(session = %shared.key, input = at, epoch = epoch_of(&message), newest = shared.newest_owner(), "a reply from a stale owner, ignored");
                Unanswered::Stale
            }
            Ok(message) => {
                let from = epoch_of(&message);
                match read_reply(shared, at, &message.payload)? {
                    Reply::Applied { answer, saved, .. } => {
                        // (Kept from `target` on: its answer may still be lost in a move.)
                        let forget = saved.min(target - 1);
                        outbox.forget_through(forget);
                        shared.forget_outcomes_through(forget);
                        if asking {
                            return Ok(answer);
                        }
                        if answered {
                            gateway.count(|s| s.inputs_answered += 1);
                        }
                        if !matches!(answer, Answer::Pending) {
                            if let Some(sent) = outbox.get_mut(at) {
                                sent.answered = true;
                            }
                        }
                        delivery.answered(from, next);
                        attempt = 0;
                        if next == target {
                            return Ok(answer);
                        }
                    }
                    Reply::Earlier { .. } if asking => return lost(shared, outbox, target),
                    Reply::Earlier { last, .. } => {
                        delivery.answered(from, last.max(next));
                        attempt = 0;
                    }
                    Reply::OutOfOrder { expected } => {
                        if expected <= next && outbox.get(expected).is_some() {
                            delivery.answered(from, expected - 1);
                            attempt = 0;
                        } else {
                            return Err(GatewayError::InputsLost {
                                session: shared.key.clone(),
                                expected,
                            });
                        }
                    }
                    Reply::Moving => {
                        // The owner lives and is handing the session over: wait for the
                        // next one (or ask again shortly).
                        deadline = Instant::now() + options.input_deadline;
                        tokio::select! {
                            changed = delivery.owner.changed() => {
                                if changed.is_ok() {
                                    delivery.new_owner(shared);
                                    attempt = 0;
                                }
                            }
                            _ = tokio::time::sleep(options.attempt_timeout) => {}
                        }
                    }
                    Reply::Closed { reason } => return closed_after(shared, target, reason),
                    Reply::Replay { .. } => {
                        return Err(GatewayError::Protocol {
                            session: shared.key.clone(),
                            detail: format!("input {next} was answered with a replay"),
                        })
                    }
                }
                continue;
            }
            Err(err) if err.kind() == RequestErrorKind::NoResponders => Unanswered::Nobody,
            Err(_) => Unanswered::TimedOut,
        };
        if let Some(server_said) = gateway.client.refusal_of(&shared.inputs_subject) {
            return Err(GatewayError::Refused {
                subject: shared.inputs_subject.clone(),
                server_said,
            });
        }
        if let Some(reason) = shared.closed() {
            return closed_after(shared, target, reason);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(GatewayError::Unreachable {
                session: shared.key.clone(),
                input: name,
                waited: now - began,
            });
        }
        if unanswered != Unanswered::TimedOut {
            // Nobody subscribed: the owner is reconnecting, or gone and its session not
            // yet resumed (the pool is asked to claim it at once); or a stale owner
            // answered, and the newest is on its way. A timeout, on the other hand,
            // already waited: send again at once.
            if unanswered == Unanswered::Nobody {
                shared.owner_silent();
            }
            let pause = Duration::from_millis(10 << attempt.min(4));
            tokio::select! {
                changed = delivery.owner.changed() => {
                    if changed.is_ok() {
                        delivery.new_owner(shared);
                        deadline = Instant::now() + options.input_deadline;
                        attempt = 0;
                    }
                }
                _ = tokio::time::sleep(pause.min(deadline - now)) => {}
            }
        }
    }
}

/// Why an attempt to deliver an input brought no answer to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unanswered {
    /// Nobody is subscribed to the session's inputs ("no responders").
    Nobody,
    /// An owner older than the newest seen answered: its answer is not the session's.
    Stale,
    /// The attempt's timeout passed, or the request failed otherwise (it already
    /// waited, or waiting would not help).
    TimedOut,
}

/// Input `target` was applied, but its answer was never heard: an input whose only
/// answer is "done" has it; any other's is lost.
fn lost(shared: &RemoteShared, outbox: &Outbox, target: u64) -> Result<Answer, GatewayError> {
    match outbox.get(target) {
        Some(sent) if sent.answers_done => Ok(Answer::Done),
        sent => Err(GatewayError::AnswerLost {
            session: shared.key.clone(),
            input: sent.map_or("input", |s| s.name),
        }),
    }
}

fn read_reply(shared: &RemoteShared, id: u64, payload: &[u8]) -> Result<Reply, GatewayError> {
    match serde_json::from_slice::<Reply>(payload) {
        Ok(reply @ Reply::Applied { id: answered, .. }) if answered == id => Ok(reply),
        Ok(reply @ Reply::Earlier { id: answered, .. }) if answered == id => Ok(reply),
        Ok(
            reply @ (Reply::Closed { .. }
            | Reply::Moving
            | Reply::OutOfOrder { .. }
            | Reply::Replay { .. }),
        ) => Ok(reply),
        Ok(other) => Err(GatewayError::Protocol {
            session: shared.key.clone(),
            detail: format!("input {id} was answered with {other:?}"),
        }),
        Err(err) => Err(GatewayError::Protocol {
            session: shared.key.clone(),
            detail: format!("unreadable answer to input {id}: {err}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(id: u64) -> Sent {
        Sent {
            id,
            name: "run",
            answers_done: false,
            answered: false,
            kept_by_snapshots: true,
            payload: Bytes::new(),
        }
    }

    #[test]
    fn the_outbox_keeps_what_no_stored_snapshot_holds() {
        let mut outbox = Outbox::default();
        for id in 1..=5 {
            outbox.push(sent(id));
        }
        outbox.forget_through(2);
        assert!(outbox.get(2).is_none());
        assert_eq!(outbox.get(3).map(|s| s.id), Some(3));
        assert_eq!(outbox.get(5).map(|s| s.id), Some(5));
        assert!(outbox.get(6).is_none());
        outbox.pop();
        assert!(outbox.get(5).is_none());
    }
}
