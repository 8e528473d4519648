//! The session's one timer: it rings at the earliest of the session's deadlines (the end
//! of the user's turn, the user going away).
//!
//! One stream for the session's life, re-armed by writing the next deadline into a watch:
//! a storm of start/stop-speaking inputs moves a deadline back and forth at a constant
//! cost each, where spawning and cancelling a timer future per input made the actor's
//! list of futures grow and every poll walk it.

use actix::prelude::*;
use futures_util::stream::{self, Stream};
use tokio::sync::watch;
use tokio::time::Instant;

/// The timer's end in the session.
pub(crate) struct Alarm {
    deadline: watch::Sender<Option<Instant>>,
}

/// The alarm rang: some deadline may have passed.
pub(crate) struct Rang;

impl Message for Rang {
    type Result = ();
}

impl Alarm {
    /// An alarm and the stream of its rings, for the actor to add to its context.
    pub(crate) fn new() -> (Self, impl Stream<Item = Rang>) {
        let (deadline, watched) = watch::channel(None);
        (Self { deadline }, rings(watched))
    }

    /// Rings at `at` (none: not at all); an earlier setting is replaced.
    pub(crate) fn set(&self, at: Option<Instant>) {
        self.deadline.send_if_modified(|now| {
            let changed = *now != at;
            *now = at;
            changed
        });
    }
}

/// Rings once each deadline passes; a deadline moved before it passed rings at its new
/// time. Ends when the alarm is dropped.
fn rings(watched: watch::Receiver<Option<Instant>>) -> impl Stream<Item = Rang> {
    stream::unfold((watched, None), |(mut watched, mut rung)| async move {
        loop {
            let deadline = *watched.borrow_and_update();
            match deadline {
                // Nothing to ring for, or rung already for this deadline.
                None => watched.changed().await.ok()?,
                Some(at) if rung == Some(at) => watched.changed().await.ok()?,
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {
                            rung = Some(at);
                            return Some((Rang, (watched, rung)));
                        }
                        changed = watched.changed() => changed.ok()?,
                    }
                }
            }
        }
    })
}
