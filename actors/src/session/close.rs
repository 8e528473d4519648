//! Closing a session: by `Session::close`, or because the host dropped its last handle.
//!
//! In order (after a snapshot being collected, if any, is in: it is of the point before
//! the close): everything waiting fails with `Closed` (queued turns, handoffs, sub-task
//! requests, tool items held during a switch) and the pending reply is dropped; the
//! session-scoped toolsets stop (runs cancelled with their grace period, awaited) and
//! their background calls' terminal outputs go to the current agent; every activity
//! (current, incoming, paused) closes as in a handoff, recording its final chat context in
//! the history as it stops; the snapshots taken for the session's store are written; the
//! session actor stops. `Session::close` waits for the session actor to be dropped, so
//! when it returns no actor of the session is alive.
//!
//! Each wait on code the engine does not own is bounded by the grace period
//! (`SessionBuilder::grace_period`): the session's tool bodies, then each agent's
//! `on_exit` and its own tool bodies, then the snapshot store. What did not finish in time
//! is dropped and reported (`SessionEvent::Unfinished`, kept for the drain report), so a
//! close returns within four grace periods plus the engine's own work, whatever they do.

use std::sync::Arc;

use actix::prelude::*;

use super::SessionActor;
use crate::activity::{AppendItems, CloseActivity, TurnKind};
use crate::chat::ChatItem;
use crate::error::{SessionError, UpdateError};
use crate::events::{SessionEvent, Unfinished};
use crate::lifecycle::stop_all;
use crate::outcome::{terminal_pair, StoppedCall};
use crate::speech::{SpeechOutcome, SpeechStatus};
use crate::toolset::StopToolset;

/// Sent by the host (`Session::close`, or the drop of its last `Session` handle): closes
/// the session. Answered at once; `Session::close` then waits for the session to be gone.
pub(crate) struct CloseSession;

impl Message for CloseSession {
    type Result = ();
}

impl Handler<CloseSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, _msg: CloseSession, ctx: &mut Self::Context) {
        self.begin_close("the session closed", ctx);
    }
}

impl SessionActor {
    /// Starts the close (once; later calls find it under way).
    pub(super) fn begin_close(&mut self, reason: &str, ctx: &mut Context<Self>) {
        // A snapshot being collected is of the point before the close: written whole
        // first (its parts come in a few messages).
        if self.chain.holds_close(reason) {
            return;
        }
        let Some(closing) = self.schedule.close() else {
            return;
        };
        self.shared.host_view.mark_closing();
        for turn in closing.turns {
            if let TurnKind::Say { speech, .. } = &turn.kind {
                speech.set_status(SpeechStatus::Done(SpeechOutcome::Interrupted {
                    heard: Some(String::new()),
                }));
            }
            if let Some(reply) = turn.reply {
                let _ = reply.send(Err(SessionError::Closed));
            }
        }
        for handoff in closing.handoffs {
            let to = handoff.handoff.agent.name().to_owned();
            handoff.done.finish(Err(SessionError::Closed), "", &to);
        }
        for (_, reply) in closing.tasks {
            let _ = reply.send(Err(SessionError::Closed));
        }
        for reply in closing.task_replies {
            let _ = reply.send(Err(SessionError::Closed));
        }
        for delivery in closing.held {
            delivery.answer.send(Err(UpdateError::Closed));
        }
        // Readers waiting for a switch to end learn that the session is closed.
        self.shared.host_view.switched.notify_waiters();
        let reason: Arc<str> = Arc::from(reason);
        let me = self.id();
        let each = reason.clone();
        let stop_toolsets = stop_all(std::mem::take(&mut self.toolset_children), &me, move || {
            StopToolset {
                reason: each.clone(),
            }
        });
        let activities = closing.activities;
        ctx.spawn(
            stop_toolsets
                .into_actor(self)
                .then(move |background, act, _| {
                    // Session runs that were in the background get their terminal output
                    // in the current agent's chat context.
                    let calls: Vec<StoppedCall> =
                        background.into_iter().flatten().flatten().collect();
                    if let (Some(current), false) = (activities.first(), calls.is_empty()) {
                        current.child.mailbox.tell(
                            &me,
                            AppendItems {
                                items: terminal_items(calls, &reason),
                            },
                        );
                    }
                    // An activity a switch is closing gets a second close; each records
                    // its final chat context itself as it stops, so none is lost.
                    let each = reason.clone();
                    stop_all(activities.into_iter().map(|a| a.child), &me, move || {
                        CloseActivity {
                            reason: each.clone(),
                        }
                    })
                    .into_actor(act)
                })
                // The last settled state reaches the store before the session is gone,
                // unless the store does not answer within the grace period: a database
                // outage must not hold every hang-up (and a drain) for ever.
                .then(|_, act, _| {
                    let grace = act.shared.settings.config.grace_period;
                    tokio::time::timeout(grace, act.chain.flushed()).into_actor(act)
                })
                .map(|flushed, act, ctx| {
                    if flushed.is_err() {
                        let unwritten = act.chain.unwritten();
                        act.shared
                            .unfinished
                            .report(&act.shared, Unfinished::SnapshotStore { unwritten });
                    }
                    // Every activity is gone: the realtime connections close now.
                    act.drop_realtime();
                    act.shared.events.emit(SessionEvent::Closed);
                    act.shared.host_view.publish_inactive(true);
                    ctx.stop();
                }),
        );
    }
}

fn terminal_items(calls: Vec<StoppedCall>, reason: &str) -> Vec<ChatItem> {
    calls
        .into_iter()
        .flat_map(|call| terminal_pair(call, reason))
        .collect()
}
