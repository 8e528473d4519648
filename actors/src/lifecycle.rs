//! Knowing that an actor is gone: a drop-based wait group.
//!
//! actix drops a spawned future *after* `stopped()` runs and after the mailbox closes
//! (checked in `../shared/bench/actix-spike`), so neither a oneshot fired in `stopped()`
//! nor `connected() == false` proves a tool body is gone. What holds: the actor struct
//! and every future it spawns each own a clone of one [`AliveToken`]; the parent waits
//! until the channel closes, which happens only when the last clone is dropped.

use tokio::sync::mpsc;

/// Held by an actor and by the futures it spawns; dropped last when it is gone.
#[derive(Clone, Debug)]
pub(crate) struct AliveToken(#[allow(dead_code)] mpsc::Sender<()>);

/// Resolves once every [`AliveToken`] of its pair is dropped.
#[derive(Debug)]
pub(crate) struct AliveWaiter(mpsc::Receiver<()>);

impl AliveWaiter {
    /// Waits until the actor and everything it spawned are dropped.
    pub(crate) async fn wait(mut self) {
        // Nothing is ever sent: `recv` returns `None` once all senders are gone.
        while self.0.recv().await.is_some() {}
    }
}

/// A new token and the waiter that watches it.
pub(crate) fn alive_pair() -> (AliveToken, AliveWaiter) {
    let (tx, rx) = mpsc::channel(1);
    (AliveToken(tx), AliveWaiter(rx))
}

/// Waits for all of them.
pub(crate) async fn wait_all(waiters: Vec<AliveWaiter>) {
    futures_util::future::join_all(waiters.into_iter().map(AliveWaiter::wait)).await;
}
