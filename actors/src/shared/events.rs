//! The session's event channel to the host: a bounded broadcast, created by the first
//! subscriber.

use std::sync::OnceLock;

use tokio::sync::broadcast;

use crate::events::SessionEvent;

/// Where events go. Any actor of the session sends (a broadcast channel is made for many
/// senders); an event is built only when someone listens.
pub(crate) struct Events {
    /// Created by the first subscriber: a broadcast channel allocates all its slots up
    /// front, which an idle session without listeners should not pay for.
    channel: OnceLock<broadcast::Sender<SessionEvent>>,
    capacity: usize,
}

impl Events {
    /// Events sent on `channel` when the host subscribed before the session started (its
    /// first agent's `on_enter` speaks inside `start`), else on a channel made by the
    /// first subscriber.
    pub(crate) fn new(capacity: usize, channel: Option<broadcast::Sender<SessionEvent>>) -> Self {
        let lock = OnceLock::new();
        if let Some(channel) = channel {
            let _ = lock.set(channel);
        }
        Self {
            channel: lock,
            capacity: capacity.max(1),
        }
    }

    /// Sends an event to subscribers (none listening is fine).
    pub(crate) fn emit(&self, event: SessionEvent) {
        self.emit_with(|| event);
    }

    /// Builds and sends an event only when someone listens: chat items are cloned for
    /// events, and a session without subscribers should not pay for that per item.
    pub(crate) fn emit_with(&self, event: impl FnOnce() -> SessionEvent) {
        if let Some(channel) = self.channel.get() {
            if channel.receiver_count() > 0 {
                let _ = channel.send(event());
            }
        }
    }

    /// A new subscriber (from now on).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.channel
            .get_or_init(|| broadcast::channel(self.capacity).0)
            .subscribe()
    }
}
