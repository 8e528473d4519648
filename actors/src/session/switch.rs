//! Switching the current agent: a handoff (close the old activity, start the new one) and
//! a sub-task (pause the caller, run the task agent, resume the caller with its result).
//! While a switch is under way the session is in `Phase::Switching`: jobs and tool items
//! wait, and are flushed to the incoming agent once its `on_enter` has run.

use std::sync::Arc;

use actix::prelude::*;
use serde_json::Value;
use tokio::sync::oneshot;

use super::{Handoff, PausedActivity, Phase, Reply, Scope, SessionActor};
use crate::activity::{CloseActivity, PauseActivity, ResumeActivity, StartActivity};
use crate::agent::Agent;
use crate::chat::ChatContext;
use crate::error::{SessionError, TaskError};
use crate::events::SessionEvent;

impl SessionActor {
    /// Closes the current activity, starts one of `handoff.agent`.
    pub(super) fn start_handoff(
        &mut self,
        handoff: Handoff,
        reply: Option<Reply<()>>,
        ctx: &mut Context<Self>,
    ) {
        let Some(old) = self.current.take() else {
            if let Some(reply) = reply {
                let _ = reply.send(Err(SessionError::Closed));
            }
            return;
        };
        self.phase = Phase::Switching;
        self.set_inactive(false);
        // Only the old activity's own items leave the pending reply.
        self.pending
            .retain(|p| p.scope != Scope::Activity(old.id().clone()));
        let from = old.agent.name().to_owned();
        let to = handoff.agent.name().to_owned();
        let reason: Arc<str> = Arc::from(format!("the agent handed off to {to}"));
        let close = old.mailbox.ask(self.probe.id(), CloseActivity { reason });
        let waiter = old.waiter;
        ctx.spawn(
            async move {
                let chat = close.await.unwrap_or_default();
                if let Some(waiter) = waiter {
                    waiter.wait().await;
                }
                chat
            }
            .into_actor(self)
            .map(move |old_chat, act, ctx| {
                let chat = if act.shared.config.inherit_chat_context {
                    old_chat
                } else {
                    ChatContext::new()
                };
                act.enter(
                    handoff.agent,
                    chat,
                    Some(Some(from.clone())),
                    ctx,
                    move |act, res| {
                        if res.is_ok() {
                            act.shared.emit(SessionEvent::AgentHandoff {
                                from: Some(from),
                                to,
                            });
                        }
                        if let Some(reply) = reply {
                            let _ = reply.send(res);
                        }
                    },
                );
            }),
        );
    }

    /// Spawns and starts an activity of `agent`, makes it current, then calls `then`
    /// and resumes the queue.
    pub(super) fn enter(
        &mut self,
        agent: Agent,
        chat: ChatContext,
        handoff_from: Option<Option<String>>,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Result<(), SessionError>) + 'static,
    ) {
        let activity = match self.spawn_activity(agent) {
            Ok(activity) => activity,
            Err(err) => {
                self.shared.emit(SessionEvent::Error {
                    message: format!("cannot start the next agent: {err}"),
                });
                self.phase = Phase::Running;
                then(self, Err(err));
                self.flush_waiting(ctx);
                self.pump(ctx);
                return;
            }
        };
        let start = activity
            .mailbox
            .ask(self.probe.id(), StartActivity { chat, handoff_from });
        self.current = Some(activity);
        ctx.spawn(start.into_actor(self).map(move |started, act, ctx| {
            if act.phase == Phase::Closing {
                then(act, Err(SessionError::Closed));
                return;
            }
            act.phase = Phase::Running;
            then(act, started.map_err(SessionError::from));
            act.flush_waiting(ctx);
            act.pump(ctx);
        }));
    }

    pub(super) fn start_task(
        &mut self,
        agent: Agent,
        exempt: Option<u64>,
        result: oneshot::Sender<Result<Value, TaskError>>,
        ctx: &mut Context<Self>,
    ) {
        let Some(caller) = self.current.take() else {
            let _ = result.send(Err(TaskError::SessionClosed));
            return;
        };
        self.phase = Phase::Switching;
        self.set_inactive(false);
        self.pending
            .retain(|p| p.scope != Scope::Activity(caller.id().clone()));
        let pause = caller
            .mailbox
            .ask(self.probe.id(), PauseActivity { exempt });
        ctx.spawn(pause.into_actor(self).map(move |_, act, ctx| {
            let from = caller.agent.name().to_owned();
            act.paused.push(PausedActivity {
                activity: caller,
                result,
            });
            act.enter(
                agent,
                ChatContext::new(),
                Some(Some(from)),
                ctx,
                |act, res| {
                    let Err(err) = res else { return };
                    // The sub-task could not start: its caller resumes and gets the error.
                    let Some(paused) = act.paused.pop() else {
                        return;
                    };
                    paused.activity.mailbox.tell(act.probe.id(), ResumeActivity);
                    act.current = Some(paused.activity);
                    let _ = paused
                        .result
                        .send(Err(TaskError::NotStarted(err.to_string())));
                },
            );
        }));
    }

    pub(super) fn end_task(&mut self, value: Value, ctx: &mut Context<Self>) {
        let Some(task) = self.current.take() else {
            return;
        };
        self.phase = Phase::Switching;
        self.pending
            .retain(|p| p.scope != Scope::Activity(task.id().clone()));
        let reason: Arc<str> = Arc::from("the task completed");
        let close = task.mailbox.ask(self.probe.id(), CloseActivity { reason });
        let waiter = task.waiter;
        ctx.spawn(
            async move {
                let _ = close.await;
                if let Some(waiter) = waiter {
                    waiter.wait().await;
                }
            }
            .into_actor(self)
            .map(move |(), act, ctx| {
                let Some(paused) = act.paused.pop() else {
                    act.phase = Phase::Running;
                    return;
                };
                paused.activity.mailbox.tell(act.probe.id(), ResumeActivity);
                act.current = Some(paused.activity);
                act.phase = Phase::Running;
                let _ = paused.result.send(Ok(value));
                act.flush_waiting(ctx);
                act.pump(ctx);
            }),
        );
    }
}
