//! The events task of a remote session: delivers the session's events in sequence order,
//! once each, and gets back the ones it missed.
//!
//! Core NATS delivers at most once, so an event can be lost when a connection drops. The
//! owner numbers its events and keeps the newest; this task asks it for the missing ones
//! (`Replay { from }`) when it sees a gap, when its connection comes back, and, while a
//! call waits for an answer, every `check_every` (which also shows the owner is alive:
//! one silent for the input deadline fails the waiting calls). Events the owner no longer
//! has are reported as one `EventsLost` event, so a subscriber always knows. An event too
//! big for one message comes in numbered parts, joined here in order before it is
//! delivered; one whose parts were lost is covered by the `EventsLost` of their numbers.
//! A replay from an owner older than the newest heard from (a fenced owner that still
//! answers) is not taken: its events are not the session's, and taking its answer for
//! the newest owner's would report lost what the newest owner keeps.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{RequestErrorKind, Subscriber};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::RemoteShared;
use crate::protocol::{
    Reply, Request, WireBody, WireElement, WireEvent, WireEventKind, EPOCH_HEADER,
};
use crate::remote_event::RemoteEventKind;

/// Where an event goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// The next one: deliver it.
    Deliver,
    /// Had already, or from a stale owner (a lower epoch): drop it.
    Seen,
    /// Events before it are missing, from `from` on.
    Gap { from: u64 },
}

/// The order of a session's events as delivered so far, and the parts of a big event
/// joined so far.
#[derive(Debug)]
pub(crate) struct EventOrder {
    next: u64,
    epoch: u64,
    /// The text of the event whose parts are coming, and the index of the next part.
    joined: String,
    next_part: u32,
}

impl Default for EventOrder {
    fn default() -> Self {
        Self {
            next: 1,
            epoch: 0,
            joined: String::new(),
            next_part: 0,
        }
    }
}

impl EventOrder {
    /// Where the element numbered `seq` at `epoch` goes; a delivered one moves the order
    /// on. A newer owner (a higher epoch) numbers its events from 1: the order follows it
    /// from there, and a stale owner's events are dropped.
    pub(crate) fn place(&mut self, seq: u64, epoch: u64) -> Placement {
        if epoch < self.epoch {
            return Placement::Seen;
        }
        if epoch > self.epoch {
            self.epoch = epoch;
            self.next = 1;
            self.drop_parts();
        }
        if seq < self.next {
            Placement::Seen
        } else if seq > self.next {
            Placement::Gap { from: self.next }
        } else {
            self.next += 1;
            Placement::Deliver
        }
    }

    /// Takes an element [`place`](Self::place) said to deliver: the event to deliver now,
    /// if it completes one (a whole event does; a part, when it is the last of its event).
    /// A part out of its order (those before it were lost, and reported so) drops what was
    /// joined; so does an event that cannot be read.
    pub(crate) fn join(&mut self, element: WireElement) -> Result<Option<WireEvent>, String> {
        let (seq, epoch) = (element.seq, element.epoch);
        match element.body() {
            Some(WireBody::Whole(kind)) => {
                self.drop_parts();
                Ok(Some(WireEvent { seq, epoch, kind }))
            }
            Some(WireBody::Part(part)) => {
                if part.index == 0 {
                    self.drop_parts();
                } else if part.index != self.next_part {
                    self.drop_parts();
                    return Ok(None);
                }
                self.joined.push_str(&part.text);
                self.next_part += 1;
                if self.next_part < part.count {
                    return Ok(None);
                }
                let text = std::mem::take(&mut self.joined);
                self.next_part = 0;
                serde_json::from_str(&text)
                    .map(|kind| Some(WireEvent { seq, epoch, kind }))
                    .map_err(|err| format!("an event joined from {} parts: {err}", part.count))
            }
            None => Err(format!("element {seq} is neither an event nor a part")),
        }
    }

    fn drop_parts(&mut self) {
        self.joined = String::new();
        self.next_part = 0;
    }

    /// The next sequence number to deliver.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// The epoch of the owner the numbers are of.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Gives up on everything up to `seq` (and on an event whose parts it held).
    fn skip_past(&mut self, seq: u64) {
        self.next = self.next.max(seq + 1);
        self.drop_parts();
    }
}

/// Runs until the session ends or the handle is dropped (which aborts it).
pub(crate) async fn pump(shared: Arc<RemoteShared>, mut subscription: Subscriber) {
    let options = shared.gateway.options.clone();
    let mut order = EventOrder::default();
    let mut connections = shared.gateway.client.connections();
    connections.borrow_and_update();
    let every = options.check_every;
    let mut check = tokio::time::interval_at(Instant::now() + every, every);
    // When the owner last showed it lives, while a call waits on it.
    let mut last_heard = Instant::now();
    while shared.closed().is_none() {
        tokio::select! {
            message = subscription.next() => {
                let Some(message) = message else { break };
                last_heard = Instant::now();
                // Each message is a batch: a JSON array of consecutive events and parts.
                match serde_json::from_slice::<Vec<WireElement>>(&message.payload) {
                    Ok(events) => {
                        for event in events {
                            take(&shared, &mut order, &mut subscription, event).await;
                        }
                    }
                    Err(err) => tracing::warn!(session = %shared.key, error = %err, "unreadable events"),
                }
            }
            changed = connections.changed() => {
                if changed.is_err() {
                    break;
                }
                // Back after an outage: what was published meanwhile never came. Not
                // before the start is known: there is no owner to replay anything yet (the
                // client's first `Connected` may only be counted now), and the start's
                // own event comes on the subscription; a catch-up would hold this loop,
                // and so that event, for the whole input deadline.
                if shared.has_started() {
                    catch_up(&shared, &mut order, &mut subscription, None, options.input_deadline).await;
                }
            }
            _ = check.tick() => {
                // Silence is fine while nobody waits; while a call does, a replay both
                // fetches what was missed and shows the owner is alive.
                let alive = !shared.awaits_outcomes()
                    || catch_up(&shared, &mut order, &mut subscription, None, options.attempt_timeout).await;
                if alive {
                    last_heard = Instant::now();
                } else if last_heard.elapsed() >= options.input_deadline {
                    tracing::warn!(session = %shared.key, "the owner is silent: failing the calls that wait on it");
                    shared.abandon_waiters();
                }
            }
        }
    }
    let _ = subscription.unsubscribe().await;
}

/// Places a live event (or part), filling a gap before it first.
async fn take(
    shared: &RemoteShared,
    order: &mut EventOrder,
    subscription: &mut Subscriber,
    event: WireElement,
) {
    match order.place(event.seq, event.epoch) {
        Placement::Deliver => deliver(shared, order, event),
        Placement::Seen => {}
        Placement::Gap { .. } => {
            let deadline = shared.gateway.options.input_deadline;
            let until = (event.seq, event.epoch);
            catch_up(shared, order, subscription, Some(until), deadline).await;
            // The replay normally brought it; if not, it is next now.
            if order.place(event.seq, event.epoch) == Placement::Deliver {
                deliver(shared, order, event);
            }
        }
    }
}

/// Delivers an element in its place: an event, or the event its last part completes.
fn deliver(shared: &RemoteShared, order: &mut EventOrder, element: WireElement) {
    match order.join(element) {
        Ok(Some(event)) => shared.deliver(event),
        Ok(None) => {}
        Err(err) => tracing::warn!(session = %shared.key, error = %err, "unreadable event"),
    }
}

/// Asks the owner for the events from the next one on and delivers them; returns whether
/// the owner answered. With `until` (a live event's number and epoch), events of that
/// owner before it that cannot be had are reported lost.
///
/// What the owner published before its reply came before the reply, and may wait in the
/// subscription, not yet taken (a slow front, big events): it is taken first, so a hole in
/// the reply (events the owner no longer keeps) is not taken for a loss while they wait
/// there. A newer owner's events that arrived meanwhile are not judged by an older owner's
/// reply: a hole before them is asked of the newer owner (it numbers from 1).
async fn catch_up(
    shared: &RemoteShared,
    order: &mut EventOrder,
    subscription: &mut Subscriber,
    until: Option<(u64, u64)>,
    patience: Duration,
) -> bool {
    let deadline = Instant::now() + patience;
    // Arrived after a hole in a newer owner's numbering than the reply was asked in: for
    // after the next reply.
    let mut behind: Vec<WireElement> = Vec::new();
    loop {
        shared.gateway.count(|s| s.replays += 1);
        let asked = order.epoch();
        match replay(shared, order.next(), asked, deadline).await {
            Some((events, complete)) => {
                let later = take_arrived(shared, order, subscription);
                let arrived = std::mem::take(&mut behind).into_iter().chain(later);
                for event in events.into_iter().chain(arrived) {
                    if !behind.is_empty() {
                        behind.push(event);
                        continue;
                    }
                    if event.epoch == order.epoch() && event.seq > order.next() {
                        if order.epoch() != asked {
                            behind.push(event);
                            continue;
                        }
                        lose(shared, order, event.seq - 1);
                    }
                    if order.place(event.seq, event.epoch) == Placement::Deliver {
                        deliver(shared, order, event);
                    }
                }
                if !behind.is_empty() {
                    continue;
                }
                lose_until(shared, order, until);
                if complete {
                    return true;
                }
            }
            None => {
                for event in std::mem::take(&mut behind) {
                    if event.epoch == order.epoch() && event.seq > order.next() {
                        lose(shared, order, event.seq - 1);
                    }
                    if order.place(event.seq, event.epoch) == Placement::Deliver {
                        deliver(shared, order, event);
                    }
                }
                lose_until(shared, order, until);
                return false;
            }
        }
    }
}

/// Reports lost what is still missing before the live event `until` (its number and
/// epoch), while the order counts in that owner's numbers.
fn lose_until(shared: &RemoteShared, order: &mut EventOrder, until: Option<(u64, u64)>) {
    if let Some((seq, epoch)) = until {
        if epoch == order.epoch() {
            lose(shared, order, seq.saturating_sub(1));
        }
    }
}

/// Takes what already arrived on the subscription, without waiting: what is in its place
/// is delivered; what comes after a hole is returned, in order, for after the replay.
fn take_arrived(
    shared: &RemoteShared,
    order: &mut EventOrder,
    subscription: &mut Subscriber,
) -> Vec<WireElement> {
    let mut later = Vec::new();
    while let Some(Some(message)) = subscription.next().now_or_never() {
        let Ok(events) = serde_json::from_slice::<Vec<WireElement>>(&message.payload) else {
            tracing::warn!(session = %shared.key, "unreadable events");
            continue;
        };
        for event in events {
            if !later.is_empty() {
                later.push(event);
                continue;
            }
            match order.place(event.seq, event.epoch) {
                Placement::Deliver => deliver(shared, order, event),
                Placement::Seen => {}
                Placement::Gap { .. } => later.push(event),
            }
        }
    }
    later
}

/// Reports the events from the next one to `to` as lost, as one event numbered `to`.
fn lose(shared: &RemoteShared, order: &mut EventOrder, to: u64) {
    let from = order.next();
    if to < from {
        return;
    }
    order.skip_past(to);
    shared.gateway.count(|s| s.events_lost += to - from + 1);
    tracing::warn!(session = %shared.key, from, to, "events lost");
    shared.deliver(WireEvent {
        seq: to,
        epoch: order.epoch,
        kind: WireEventKind::Event(RemoteEventKind::EventsLost { from, to }),
    });
}

/// The epoch of the owner that sent `message` (`Sb-Epoch`; 0 without one).
pub(crate) fn epoch_of(message: &async_nats::Message) -> u64 {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(EPOCH_HEADER))
        .and_then(|v| v.as_str().parse::<u64>().ok())
        .unwrap_or(0)
}

/// One replay request, retried until `deadline`.
async fn replay(
    shared: &RemoteShared,
    from: u64,
    epoch: u64,
    deadline: Instant,
) -> Option<(Vec<WireElement>, bool)> {
    let gateway = &shared.gateway;
    let payload = Bytes::from(serde_json::to_vec(&Request::Replay { from, epoch }).ok()?);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let request = async_nats::Request::new()
            .payload(payload.clone())
            .timeout(Some(gateway.options.attempt_timeout));
        let sent = gateway
            .client
            .nats()
            .send_request(shared.inputs_subject.clone(), request)
            .await;
        let wait = match sent {
            // A stale owner's events (a fenced owner that still answers) are not the
            // session's: taken, they would be dropped as old and the events the newest
            // owner keeps reported lost. Asked again shortly: the newest owner answers.
            Ok(message) if !shared.answer_is_current(epoch_of(&message)) => {
                gateway.count(|s| s.stale_replies += 1);
                tracing::debug!(session = %shared.key, epoch = epoch_of(&message), newest = shared.newest_owner(), "a replay from a stale owner, ignored");
                true
            }
            Ok(message) => {
                return match serde_json::from_slice::<Reply>(&message.payload) {
                    Ok(Reply::Replay { events, complete }) => Some((events, complete)),
                    _ => None,
                }
            }
            Err(err) if err.kind() == RequestErrorKind::NoResponders => {
                shared.owner_silent();
                true
            }
            Err(_) => false,
        };
        let now = Instant::now();
        if now >= deadline || shared.closed().is_some() {
            return None;
        }
        if wait {
            let pause = Duration::from_millis(10 << attempt.min(4));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::protocol::EventPart;

    fn error(text: &str) -> WireEventKind {
        WireEventKind::Event(RemoteEventKind::StartFailed {
            reason: text.to_owned(),
        })
    }

    fn whole(seq: u64, text: &str) -> WireElement {
        WireElement {
            seq,
            epoch: 1,
            kind: Some(error(text)),
            part: None,
        }
    }

    fn part(seq: u64, index: u32, count: u32, text: &str) -> WireElement {
        WireElement {
            seq,
            epoch: 1,
            kind: None,
            part: Some(EventPart {
                index,
                count,
                text: text.to_owned(),
            }),
        }
    }

    /// The parts of an event saying `message`, from number `first` on.
    fn parts_of(first: u64, message: &str, count: u32) -> Vec<WireElement> {
        let text = serde_json::to_string(&error(message)).unwrap();
        let size = text.len().div_ceil(count as usize);
        let pieces: Vec<String> = text
            .as_bytes()
            .chunks(size)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        assert_eq!(pieces.len(), count as usize);
        (0..count)
            .zip(pieces)
            .map(|(i, piece)| part(first + u64::from(i), i, count, &piece))
            .collect()
    }

    /// Places and joins `elements` in turn; the events delivered.
    fn read(order: &mut EventOrder, elements: Vec<WireElement>) -> Vec<WireEvent> {
        let mut out = Vec::new();
        for element in elements {
            if order.place(element.seq, element.epoch) == Placement::Deliver {
                if let Some(event) = order.join(element).unwrap() {
                    out.push(event);
                }
            }
        }
        out
    }

    fn message(event: &WireEvent) -> &str {
        match &event.kind {
            WireEventKind::Event(RemoteEventKind::StartFailed { reason }) => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_parts_of_a_big_event_are_joined_into_it_in_their_place() {
        let mut order = EventOrder::default();
        let mut elements = vec![whole(1, "before")];
        elements.extend(parts_of(2, "a long history", 3));
        elements.push(whole(5, "after"));
        let events = read(&mut order, elements);
        assert_eq!(
            events.iter().map(message).collect::<Vec<_>>(),
            ["before", "a long history", "after"]
        );
        assert_eq!(events[1].seq, 4, "the event takes its last part's number");
    }

    #[test]
    fn an_event_whose_first_parts_were_lost_is_dropped_and_the_next_one_joins() {
        let mut order = EventOrder::default();
        read(&mut order, vec![whole(1, "before")]);
        let mut parts = parts_of(2, "lost in part", 3);
        // Its first part never came: the gap was reported lost up to it.
        parts.remove(0);
        order.skip_past(2);
        let mut elements = parts;
        elements.extend(parts_of(5, "whole again", 2));
        let events = read(&mut order, elements);
        assert_eq!(
            events.iter().map(message).collect::<Vec<_>>(),
            ["whole again"]
        );
    }

    #[test]
    fn events_are_delivered_in_order_once() {
        let mut order = EventOrder::default();
        assert_eq!(order.place(1, 1), Placement::Deliver);
        assert_eq!(order.place(1, 1), Placement::Seen);
        assert_eq!(order.place(2, 1), Placement::Deliver);
        assert_eq!(order.next(), 3);
    }

    #[test]
    fn a_gap_is_named_from_the_first_missing_event() {
        let mut order = EventOrder::default();
        order.place(1, 1);
        assert_eq!(order.place(4, 1), Placement::Gap { from: 2 });
        assert_eq!(order.next(), 2, "a gap delivers nothing");
        order.skip_past(3);
        assert_eq!(order.place(4, 1), Placement::Deliver);
    }

    #[test]
    fn a_stale_owner_loses_to_a_newer_one_which_numbers_from_one() {
        let mut order = EventOrder::default();
        order.place(1, 1);
        order.place(2, 1);
        assert_eq!(order.place(1, 2), Placement::Deliver);
        assert_eq!(order.place(3, 1), Placement::Seen, "epoch 1 is stale now");
        assert_eq!(order.place(2, 2), Placement::Deliver);
    }

    #[test]
    fn a_newer_owner_seen_first_past_its_first_event_is_a_gap_from_one() {
        let mut order = EventOrder::default();
        order.place(1, 1);
        assert_eq!(order.place(3, 2), Placement::Gap { from: 1 });
        assert_eq!((order.epoch(), order.next()), (2, 1));
        assert_eq!(order.place(1, 2), Placement::Deliver);
    }
}
