//! Knowing that an actor is gone, and stopping a child: the one shutdown piece every
//! parent uses.
//!
//! actix drops a spawned future *after* `stopped()` runs and after the mailbox closes
//! (checked in `../shared/bench/actix-spike`), so neither a oneshot fired in `stopped()`
//! nor `connected() == false` proves a tool body is gone. What holds: the actor struct
//! and every future it spawns each own a clone of one [`AliveToken`]; a waiter resolves
//! once the last clone is dropped. Waiters are clonable, so several parties (two
//! concurrent `close()` calls, say) can all wait for the same actor.
//!
//! One small allocation per actor: a count of live tokens and a `Notify`, rather than a
//! channel, because every idle session pays for its actors' tokens.
//!
//! [`Child`] names the step every parent repeats: ask the child to stop, then wait until
//! it and everything it spawned are dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use tokio::sync::Notify;

use crate::ids::ActorId;
use crate::mailbox::{Counted, Mailbox};

#[derive(Debug)]
struct Liveness {
    tokens: AtomicUsize,
    gone: Notify,
}

/// Held by an actor and by the futures it spawns; the actor is gone when the last clone is.
#[derive(Debug)]
pub(crate) struct AliveToken(Arc<Liveness>);

impl Clone for AliveToken {
    fn clone(&self) -> Self {
        self.0.tokens.fetch_add(1, Ordering::Relaxed);
        Self(self.0.clone())
    }
}

impl Drop for AliveToken {
    fn drop(&mut self) {
        // AcqRel: a waiter that sees zero sees everything the token holders did.
        if self.0.tokens.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.gone.notify_waiters();
        }
    }
}

/// Resolves once every [`AliveToken`] of its pair is dropped. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct AliveWaiter(Arc<Liveness>);

impl AliveWaiter {
    /// Waits until the actor and everything it spawned are dropped.
    pub(crate) async fn wait(self) {
        loop {
            // Registered before the check, so a drop between the two is not missed.
            let notified = self.0.gone.notified();
            if self.0.tokens.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl AliveWaiter {
    /// Whether the actor and everything it spawned are gone already.
    pub(crate) fn is_gone(&self) -> bool {
        self.0.tokens.load(Ordering::Acquire) == 0
    }
}

/// A new token and the waiter that watches it.
pub(crate) fn alive_pair() -> (AliveToken, AliveWaiter) {
    let liveness = Arc::new(Liveness {
        tokens: AtomicUsize::new(1),
        gone: Notify::new(),
    });
    (AliveToken(liveness.clone()), AliveWaiter(liveness))
}

/// A child actor as its parent holds it: where to send, and how to know it is gone.
pub(crate) struct Child<A: Actor> {
    pub(crate) mailbox: Mailbox<A>,
    gone: AliveWaiter,
}

impl<A: Actor> Clone for Child<A> {
    fn clone(&self) -> Self {
        Self {
            mailbox: self.mailbox.clone(),
            gone: self.gone.clone(),
        }
    }
}

impl<A: Actor> std::fmt::Debug for Child<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Child({})", self.mailbox.id())
    }
}

impl<A: Actor> Child<A> {
    pub(crate) fn new(mailbox: Mailbox<A>, gone: AliveWaiter) -> Self {
        Self { mailbox, gone }
    }

    pub(crate) fn id(&self) -> &ActorId {
        self.mailbox.id()
    }

    /// Resolves once the child and every future it spawned are dropped (without asking it
    /// to stop: for a child someone else is stopping).
    pub(crate) fn gone(&self) -> impl std::future::Future<Output = ()> + 'static {
        self.gone.clone().wait()
    }

    /// Asks the child to stop with `msg` and waits until it is gone: its reply (if it
    /// answered before stopping), once the actor and every future it spawned are dropped.
    pub(crate) fn stop<M>(
        &self,
        from: &ActorId,
        msg: M,
    ) -> impl std::future::Future<Output = Option<M::Result>> + 'static
    where
        M: Message + Send + 'static,
        M::Result: Send,
        A: Handler<Counted<M>>,
        A::Context: ToEnvelope<A, Counted<M>>,
    {
        let ask = self.mailbox.ask(from, msg);
        let gone = self.gone.clone();
        async move {
            let reply = ask.await.ok();
            gone.wait().await;
            reply
        }
    }
}

/// Stops every child with a message made for each, concurrently, and waits until all are
/// gone; the replies come back in order.
pub(crate) fn stop_all<A, M>(
    children: impl IntoIterator<Item = Child<A>>,
    from: &ActorId,
    mut msg: impl FnMut() -> M,
) -> impl std::future::Future<Output = Vec<Option<M::Result>>> + 'static
where
    A: Actor + Handler<Counted<M>>,
    A::Context: ToEnvelope<A, Counted<M>>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    let stops: Vec<_> = children
        .into_iter()
        .map(|child| child.stop(from, msg()))
        .collect();
    futures_util::future::join_all(stops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_resolves_only_once_every_token_is_dropped() {
        let (token, waiter) = alive_pair();
        let second = token.clone();
        let other_waiter = waiter.clone();
        drop(token);
        let early = tokio::time::timeout(std::time::Duration::ZERO, waiter.clone().wait()).await;
        assert!(early.is_err(), "one token is still held");
        drop(second);
        // Both waiters see it: several `close()` calls can wait for one actor.
        waiter.wait().await;
        other_waiter.wait().await;
    }

    #[tokio::test]
    async fn a_waiter_already_waiting_wakes_when_the_last_token_goes() {
        let (token, waiter) = alive_pair();
        let waiting = tokio::spawn(waiter.wait());
        tokio::task::yield_now().await;
        drop(token);
        waiting.await.unwrap();
    }
}
