//! Switching the current agent: a handoff (close the old activity, start the new one) and
//! a sub-task (pause the caller, run the task agent, resume the caller with its result).
//!
//! The schedule is in `Switching` meanwhile: jobs and session-scoped tool items wait, and
//! are flushed to the incoming agent once its `on_enter` has run. Every agent started here
//! was checked first (`SessionShared::check_agent`), so a switch never leaves the session
//! without a current agent: it ends with the new one current, or with the session closed.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;

use super::{ActivityRef, PlannedHandoff, PlannedTask, SessionActor, SessionToolset};
use crate::activity::{
    ActivityActor, ActivitySpec, CloseActivity, Handover, PauseActivity, PendingItem,
    ResumeActivity, StartActivity,
};
use crate::agent::{effective_policy, Agent};
use crate::chat::ChatContext;
use crate::error::SessionError;
use crate::events::SessionEvent;
use crate::history::SubTaskOf;
use crate::ids::ActorId;
use crate::lifecycle::Child;
use crate::realtime::Model;
use crate::starting_chat::StartingChat;
use crate::toolset::{RestoredRun, ToolsetActor};

/// An activity about to start.
pub(super) struct Entry {
    pub(super) agent: Agent,
    /// The model, already resolved (the agent's or the session's).
    pub(super) llm: Model,
    /// The chat context it starts from.
    pub(super) chat: ChatContext,
    /// The agent it takes over from, recorded as a handoff item.
    pub(super) handoff_from: Option<String>,
    pub(super) sub_task_of: Option<SubTaskOf>,
    /// Session-scoped tool items pending for a deferred reply, from the agent before.
    pub(super) carried: Vec<PendingItem>,
}

impl SessionActor {
    /// Spawns the session-scoped toolsets (once, at start), each with the calls it was
    /// running when the session was snapshotted, for a restored session.
    pub(super) fn start_toolsets(&mut self, mut restored: HashMap<String, Vec<RestoredRun>>) {
        let mut toolsets = Vec::new();
        for def in std::mem::take(&mut self.toolset_defs) {
            let tools: Vec<_> = def
                .tools
                .iter()
                .map(|t| (t.clone(), effective_policy(t, &def)))
                .collect();
            let schemas = tools.iter().map(|(t, p)| t.schema(*p)).collect();
            let (child, book) = ToolsetActor::spawn(
                ActorId::session_toolset(self.shared.id(), &def.name),
                super::Scope::Session,
                tools,
                def.prompts.or(&self.shared.settings.prompts),
                self.shared.clone(),
                self.links.clone(),
                restored.remove(&def.name).unwrap_or_default(),
            );
            toolsets.push(SessionToolset {
                name: def.name.clone(),
                tools: def.tools.clone(),
                schemas,
                mailbox: child.mailbox.clone(),
                book,
            });
            self.toolset_children.push(child);
        }
        self.toolsets = Arc::from(toolsets);
    }

    /// The chat context an agent starts with, by `start`, from the previous agent's. The
    /// call ids of a given context are reserved, so the model's later ids never equal
    /// them.
    pub(super) fn starting_chat(&self, start: &StartingChat, previous: ChatContext) -> ChatContext {
        let chat = start.apply(previous);
        if matches!(start, StartingChat::Given(_)) {
            self.shared.ids.reserve_call_ids(&chat);
        }
        chat
    }

    /// Closes the outgoing activity, then starts the handoff's agent.
    pub(super) fn begin_handoff(
        &mut self,
        outgoing: ActivityRef,
        planned: PlannedHandoff,
        ctx: &mut Context<Self>,
    ) {
        let from = outgoing.agent.name().to_owned();
        let to = planned.handoff.agent.name().to_owned();
        // From the outgoing agent's close to the incoming one's `on_enter`; under the span
        // of whoever asked (the host's, a tool's, the handing-off turn's).
        let (session, telemetry) = (&self.shared.span, &self.shared.telemetry);
        let span = tracing::info_span!(
            parent: planned.cause.parent(session, telemetry),
            "handoff",
            session = %self.shared.id(),
            from = %from,
            to = %to,
        );
        planned.cause.link(&span, session, telemetry);
        let reason: Arc<str> = Arc::from(format!("the agent handed off to {to}"));
        let close = outgoing
            .child
            .stop(self.probe.id(), CloseActivity { reason });
        ctx.spawn(close.into_actor(self).map(move |left, act, ctx| {
            let Handover { chat, pending } = left.unwrap_or_default();
            if act.schedule.is_closed() {
                planned.done.finish(Err(SessionError::Closed), &from, &to);
                return;
            }
            let PlannedHandoff {
                handoff, llm, done, ..
            } = planned;
            let fallback = if act.shared.settings.config.inherit_chat_context {
                StartingChat::All
            } else {
                StartingChat::Empty
            };
            let start = StartingChat::resolve(
                handoff.chat.as_ref(),
                handoff.agent.starting_chat(),
                fallback,
            );
            let chat = act.starting_chat(&start, chat);
            let entry = Entry {
                agent: handoff.agent,
                llm,
                chat,
                handoff_from: Some(from.clone()),
                sub_task_of: outgoing.sub_task_of,
                carried: pending,
            };
            act.enter(entry, ctx, move |act, res| {
                // The handoff's span ends here, once the new agent's `on_enter` ran.
                let _span = span;
                if res.is_ok() {
                    act.shared.events.emit(SessionEvent::AgentHandoff {
                        from: Some(from.clone()),
                        to: to.clone(),
                    });
                }
                done.finish(res, &from, &to);
            });
        }));
    }

    /// Spawns and starts an activity of `entry.agent`, makes it current, then calls
    /// `then` and resumes the queue.
    pub(super) fn enter(
        &mut self,
        entry: Entry,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Result<(), SessionError>) + 'static,
    ) {
        let Entry {
            agent,
            llm,
            chat,
            handoff_from,
            sub_task_of,
            carried,
        } = entry;
        let generation = self.generations.entry(agent.name().to_owned()).or_insert(0);
        *generation += 1;
        self.started += 1;
        self.chain
            .activation_started(self.started, agent.restore_data());
        let reply_wanted = !carried.is_empty();
        let generation = *generation;
        let realtime = self.realtime_link(&llm);
        let child: Child<ActivityActor> = ActivityActor::spawn(ActivitySpec {
            agent: agent.clone(),
            llm,
            realtime,
            generation,
            is_task: self.schedule.in_task(),
            shared: self.shared.clone(),
            links: self.links.clone(),
            session_toolsets: self.toolsets.clone(),
            chat,
            order: self.started,
            sub_task_of: sub_task_of.clone(),
            handoff_from,
            carried,
            inherited: None,
            restored: None,
        });
        let id = child.id().clone();
        let activity = ActivityRef {
            child: child.clone(),
            agent: agent.clone(),
            sub_task_of: sub_task_of.clone(),
        };
        if !self.schedule.entering(id.clone(), activity) {
            // The session closed while the previous agent was leaving: the new activity
            // never starts; stop it (its toolsets have no runs yet) and let the close
            // finish.
            child.mailbox.tell(
                self.probe.id(),
                CloseActivity {
                    reason: Arc::from("the session closed"),
                },
            );
            then(self, Err(SessionError::Closed));
            return;
        }
        let (entered, started) = tokio::sync::oneshot::channel();
        // Once per activity.
        child
            .mailbox
            .tell(self.probe.id(), StartActivity { entered });
        ctx.spawn(started.into_actor(self).map(move |started, act, ctx| {
            if act.schedule.is_closed() {
                then(act, Err(SessionError::Closed));
                return;
            }
            if started.is_err() {
                // The activity died before it started (its arbiter is going away): the
                // session cannot go on without a current agent.
                then(act, Err(SessionError::Closed));
                act.begin_close("the agent's activity stopped unexpectedly", ctx);
                return;
            }
            let held = act.schedule.entered(reply_wanted);
            act.switched(ctx);
            then(act, Ok(()));
            for delivery in held {
                act.deliver(delivery);
            }
            act.pump(ctx);
        }));
    }

    /// Tells readers waiting for a current agent that there is one again; snapshots asked
    /// for during the switch are taken now.
    pub(super) fn switched(&mut self, ctx: &mut Context<Self>) {
        self.route_realtime();
        self.shared.host_view.switched.notify_waiters();
        self.take_waiting_snapshots(ctx);
    }

    /// Pauses the caller (its agent-scoped runs stop, but those in `spare`: the one
    /// awaiting the task, and one still returning the caller's last task's result), then
    /// starts the task's agent.
    pub(super) fn begin_task(
        &mut self,
        caller: ActivityRef,
        task: PlannedTask,
        spare: Vec<u64>,
        ctx: &mut Context<Self>,
    ) {
        let pause = caller
            .child
            .mailbox
            .ask(self.probe.id(), PauseActivity { spare });
        let from = caller.agent.name().to_owned();
        let caller_id = caller.id().clone();
        ctx.spawn(pause.into_actor(self).map(move |paused, act, ctx| {
            if act.schedule.is_closed() {
                return;
            }
            // A caller that died while pausing: its items end where they are.
            let after = paused.as_ref().map_or(usize::MAX, |p| p.chat.len());
            let Handover { chat, pending } = paused.unwrap_or_default();
            let start =
                StartingChat::resolve(None, task.agent.starting_chat(), StartingChat::Empty);
            let chat = act.starting_chat(&start, chat);
            let entry = Entry {
                agent: task.agent,
                llm: task.llm,
                chat,
                handoff_from: Some(from),
                sub_task_of: Some(SubTaskOf {
                    caller: caller_id,
                    after,
                }),
                carried: pending,
            };
            act.enter(entry, ctx, |_, res| {
                if let Err(err) = res {
                    tracing::warn!(%err, "a sub-task agent did not start");
                }
            });
        }));
    }

    /// Closes the completed sub-task's activity, then resumes its caller with the result.
    pub(super) fn begin_end_task(&mut self, task: ActivityRef, ctx: &mut Context<Self>) {
        let close = task.child.stop(
            self.probe.id(),
            CloseActivity {
                reason: Arc::from("the task completed"),
            },
        );
        ctx.spawn(close.into_actor(self).map(move |left, act, ctx| {
            let pending = left.map(|left| left.pending).unwrap_or_default();
            let Some(resumed) = act.schedule.task_closed(!pending.is_empty()) else {
                return;
            };
            resumed
                .caller
                .child
                .mailbox
                .tell(act.probe.id(), ResumeActivity { carried: pending });
            act.switched(ctx);
            let _ = resumed.reply.send(Ok(resumed.value));
            for delivery in resumed.held {
                act.deliver(delivery);
            }
            act.pump(ctx);
        }));
    }
}
