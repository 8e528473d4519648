//! The session's side of realtime models: it keeps one connection per model its agents
//! use (`RealtimeLink`), hands it to each activity of that model, points the host's audio
//! at the current agent's, and hears what the model's server heard of the user.
//!
//! - A handoff or sub-task between agents of one model keeps the connection (the incoming
//!   activity updates its session); a new one is opened only for a model no live activity
//!   uses yet, and a connection no live activity uses any more is dropped once a switch
//!   ends (its task closes the socket).
//! - The server's VAD and transcripts reach the session as a host's would: speech started
//!   and stopped are `UserStartedSpeaking` and `UserStoppedSpeaking` (the user's state,
//!   the barge-in of the current agent), a committed turn is a user turn that goes first
//!   (`HeardTurn`), and its transcript fills in the words (`Transcribed`), in the queued
//!   turn if it has not started, else in the chat of the agent that holds it.

use std::sync::Arc;

use actix::prelude::*;

use super::{QueuedTurn, SessionActor, SessionLinks, TurnId};
use crate::activity::{
    InterruptTurn, TurnKind, UserStartedSpeaking, UserStoppedSpeaking, UserTranscribed,
};
use crate::events::{SessionEvent, UserState};
use crate::ids::ActorId;
use crate::realtime::Model;
use crate::realtime_link::{RealtimeLink, UserPort, UserSignal};
use crate::speech::SpeechPriority;
use crate::telemetry::Cause;

impl UserPort for SessionLinks {
    fn user(&self, from: &ActorId, signal: UserSignal) {
        // Each is one event of the server's, at the server's pace (a few per user turn).
        match signal {
            UserSignal::Started => self.session.tell(from, UserStartedSpeaking),
            UserSignal::Stopped => self.session.tell(from, UserStoppedSpeaking),
            UserSignal::Heard { item } => self.session.tell(from, HeardTurn { item }),
            UserSignal::Transcript { item, text } => {
                self.session.tell(from, Transcribed { item, text })
            }
        }
    }
}

impl SessionActor {
    /// The connection an activity of `model` uses, if it is a realtime model: the one the
    /// session keeps for that model, or a new one.
    pub(super) fn realtime_link(&mut self, model: &Model) -> Option<RealtimeLink> {
        let Model::Realtime(realtime) = model else {
            return None;
        };
        let kept = self
            .realtime_links
            .iter()
            .find(|link| Model::Realtime(link.model().clone()).same(model));
        if let Some(link) = kept {
            return Some(link.clone());
        }
        let port: Arc<dyn UserPort> = self.links.clone();
        let link = RealtimeLink::spawn(
            realtime.clone(),
            port,
            self.shared.clone(),
            self._alive.clone(),
        );
        self.realtime_links.push(link.clone());
        Some(link)
    }

    /// After a switch: the host's audio goes to the current agent's connection, and
    /// connections no live activity uses are dropped.
    pub(super) fn route_realtime(&mut self) {
        if self.realtime_links.is_empty() {
            return;
        }
        let models: Vec<Model> = self
            .schedule
            .activities()
            .iter()
            .filter_map(|activity| self.shared.settings.model_of(&activity.agent))
            .collect();
        self.realtime_links.retain(|link| {
            let model = Model::Realtime(link.model().clone());
            models.iter().any(|m| m.same(&model))
        });
        let current = self
            .schedule
            .current()
            .and_then(|current| self.shared.settings.model_of(&current.agent))
            .and_then(|model| {
                self.realtime_links
                    .iter()
                    .find(|link| Model::Realtime(link.model().clone()).same(&model))
                    .cloned()
            });
        self.shared.audio.set(current);
    }

    /// At close: every connection is dropped (each task closes its socket; the session is
    /// gone once they have).
    pub(super) fn drop_realtime(&mut self) {
        self.shared.audio.set(None);
        self.realtime_links.clear();
    }
}

/// From a realtime model's server: the user's turn ended (their audio is item `item`) and
/// the server answers it. A user turn that goes first; a turn running now is interrupted
/// if it allows it (the barge-in usually did so when the user started speaking).
pub(crate) struct HeardTurn {
    pub(crate) item: String,
}

impl Message for HeardTurn {
    type Result = ();
}

impl Handler<HeardTurn> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: HeardTurn, ctx: &mut Self::Context) {
        self.voice = true;
        self.agent_work.user_input();
        if self.schedule.user() == UserState::Speaking {
            self.set_user(UserState::Listening);
        }
        let turn = QueuedTurn {
            kind: TurnKind::Heard {
                item: msg.item,
                text: String::new(),
            },
            reply: None,
            cause: Cause::here(),
            tie: super::snapshot::Tie::None,
        };
        if let Err((_, why)) = self
            .schedule
            .queue_turn(TurnId::Engine, turn, SpeechPriority::High)
        {
            let message = format!("the user's turn was not kept: {}", super::refusal(why));
            tracing::warn!(session = %self.shared.id(), "{message}");
            self.shared.events.emit(SessionEvent::Error { message });
        }
        if let Some(current) = self.schedule.current() {
            // At most one per user turn.
            current
                .child
                .mailbox
                .tell(self.probe.id(), InterruptTurn { force: false });
        }
        self.pump(ctx);
    }
}

/// From a realtime model's server: the transcript of the user's turn `item`.
pub(crate) struct Transcribed {
    pub(crate) item: String,
    pub(crate) text: String,
}

impl Message for Transcribed {
    type Result = ();
}

impl Handler<Transcribed> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Transcribed, _ctx: &mut Self::Context) {
        if msg.text.trim().is_empty() {
            return;
        }
        self.shared
            .events
            .emit_with(|| SessionEvent::UserInputTranscribed {
                text: msg.text.clone(),
                is_final: true,
            });
        let queued = self.schedule.queued_turn_mut(|turn: &QueuedTurn| {
            matches!(&turn.kind, TurnKind::Heard { item, .. } if *item == msg.item)
        });
        if let Some(QueuedTurn {
            kind: TurnKind::Heard { text, .. },
            ..
        }) = queued
        {
            *text = msg.text;
            return;
        }
        if let Some(current) = self.schedule.current() {
            // One per user turn.
            current
                .child
                .mailbox
                .tell(self.probe.id(), UserTranscribed { text: msg.text });
        }
    }
}
