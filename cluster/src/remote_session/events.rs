//! The events task of a remote session: delivers the session's events in sequence order,
//! once each, and gets back the ones it missed.
//!
//! Core NATS delivers at most once, so an event can be lost when a connection drops. The
//! owner numbers its events and keeps the newest; this task asks it for the missing ones
//! (`Replay { from }`) when it sees a gap, when its connection comes back, and, while a
//! call waits for an answer, every `check_every` (which also shows the owner is alive:
//! one silent for the input deadline fails the waiting calls). Events the owner no longer
//! has are reported as one `EventsLost` event, so a subscriber always knows.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{RequestErrorKind, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::Instant;

use super::RemoteShared;
use crate::protocol::{Reply, Request, WireEvent, WireEventKind};
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

/// The order of a session's events as delivered so far.
#[derive(Debug)]
pub(crate) struct EventOrder {
    next: u64,
    epoch: u64,
}

impl Default for EventOrder {
    fn default() -> Self {
        Self { next: 1, epoch: 0 }
    }
}

impl EventOrder {
    /// Where `event` goes; a delivered one moves the order on. A newer owner (a higher
    /// epoch) numbers its events from 1: the order follows it from there, and a stale
    /// owner's events are dropped.
    pub(crate) fn place(&mut self, event: &WireEvent) -> Placement {
        if event.epoch < self.epoch {
            return Placement::Seen;
        }
        if event.epoch > self.epoch {
            self.epoch = event.epoch;
            self.next = 1;
        }
        if event.seq < self.next {
            Placement::Seen
        } else if event.seq > self.next {
            Placement::Gap { from: self.next }
        } else {
            self.next += 1;
            Placement::Deliver
        }
    }

    /// The next sequence number to deliver.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// The epoch of the owner the numbers are of.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Gives up on everything up to `seq`.
    fn skip_past(&mut self, seq: u64) {
        self.next = self.next.max(seq + 1);
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
                // Each message is a batch: a JSON array of consecutive events.
                match serde_json::from_slice::<Vec<WireEvent>>(&message.payload) {
                    Ok(events) => {
                        for event in events {
                            take(&shared, &mut order, event).await;
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
                    catch_up(&shared, &mut order, None, options.input_deadline).await;
                }
            }
            _ = check.tick() => {
                // Silence is fine while nobody waits; while a call does, a replay both
                // fetches what was missed and shows the owner is alive.
                let alive = !shared.awaits_outcomes()
                    || catch_up(&shared, &mut order, None, options.attempt_timeout).await;
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

/// Places a live event, filling a gap before it first.
async fn take(shared: &RemoteShared, order: &mut EventOrder, event: WireEvent) {
    match order.place(&event) {
        Placement::Deliver => shared.deliver(event),
        Placement::Seen => {}
        Placement::Gap { .. } => {
            let deadline = shared.gateway.options.input_deadline;
            catch_up(shared, order, Some(event.seq), deadline).await;
            // The replay normally brought it; if not, it is next now.
            if order.place(&event) == Placement::Deliver {
                shared.deliver(event);
            }
        }
    }
}

/// Asks the owner for the events from the next one on and delivers them; returns whether
/// the owner answered. With `until` (a live event's number), events before it that cannot
/// be had are reported lost.
async fn catch_up(
    shared: &RemoteShared,
    order: &mut EventOrder,
    until: Option<u64>,
    patience: Duration,
) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        shared.gateway.count(|s| s.replays += 1);
        match replay(shared, order.next(), order.epoch(), deadline).await {
            Some((events, complete)) => {
                for event in events {
                    if event.epoch == order.epoch() && event.seq > order.next() {
                        lose(shared, order, event.seq - 1);
                    }
                    if order.place(&event) == Placement::Deliver {
                        shared.deliver(event);
                    }
                }
                if let Some(until) = until {
                    lose(shared, order, until.saturating_sub(1));
                }
                if complete {
                    return true;
                }
            }
            None => {
                if let Some(until) = until {
                    lose(shared, order, until.saturating_sub(1));
                }
                return false;
            }
        }
    }
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

/// One replay request, retried until `deadline`.
async fn replay(
    shared: &RemoteShared,
    from: u64,
    epoch: u64,
    deadline: Instant,
) -> Option<(Vec<WireEvent>, bool)> {
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
        let no_responders = match sent {
            Ok(message) => {
                return match serde_json::from_slice::<Reply>(&message.payload) {
                    Ok(Reply::Replay { events, complete }) => Some((events, complete)),
                    _ => None,
                }
            }
            Err(err) => err.kind() == RequestErrorKind::NoResponders,
        };
        let now = Instant::now();
        if now >= deadline || shared.closed().is_some() {
            return None;
        }
        if no_responders {
            shared.owner_silent();
            let pause = Duration::from_millis(10 << attempt.min(4));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, epoch: u64) -> WireEvent {
        WireEvent {
            seq,
            epoch,
            kind: WireEventKind::Event(RemoteEventKind::SessionStarted),
        }
    }

    #[test]
    fn events_are_delivered_in_order_once() {
        let mut order = EventOrder::default();
        assert_eq!(order.place(&event(1, 1)), Placement::Deliver);
        assert_eq!(order.place(&event(1, 1)), Placement::Seen);
        assert_eq!(order.place(&event(2, 1)), Placement::Deliver);
        assert_eq!(order.next(), 3);
    }

    #[test]
    fn a_gap_is_named_from_the_first_missing_event() {
        let mut order = EventOrder::default();
        order.place(&event(1, 1));
        assert_eq!(order.place(&event(4, 1)), Placement::Gap { from: 2 });
        assert_eq!(order.next(), 2, "a gap delivers nothing");
        order.skip_past(3);
        assert_eq!(order.place(&event(4, 1)), Placement::Deliver);
    }

    #[test]
    fn a_stale_owner_loses_to_a_newer_one_which_numbers_from_one() {
        let mut order = EventOrder::default();
        order.place(&event(1, 1));
        order.place(&event(2, 1));
        assert_eq!(order.place(&event(1, 2)), Placement::Deliver);
        assert_eq!(
            order.place(&event(3, 1)),
            Placement::Seen,
            "epoch 1 is stale now"
        );
        assert_eq!(order.place(&event(2, 2)), Placement::Deliver);
    }

    #[test]
    fn a_newer_owner_seen_first_past_its_first_event_is_a_gap_from_one() {
        let mut order = EventOrder::default();
        order.place(&event(1, 1));
        assert_eq!(order.place(&event(3, 2)), Placement::Gap { from: 1 });
        assert_eq!((order.epoch(), order.next()), (2, 1));
        assert_eq!(order.place(&event(1, 2)), Placement::Deliver);
    }
}
