//! An activity's speeches: starting them on the output, applying playout reports (for any
//! speech, at any time, to that speech's own message), and barge-in — carrying out what
//! `barge_in.rs` decides from the user's input and its timers.

use std::sync::Arc;

use actix::prelude::*;
use tokio::time::Instant;

use super::barge_in::BargeAction;
use super::ledger::{cut_to_heard, Cut};
use super::ActivityActor;
use crate::chat::{ChatItem, ChatMessage, ChatRole};
use crate::events::{AgentState, SessionEvent};
use crate::output::{Playout, SpeechId};
use crate::speech::{Interruptibility, SpeechHandle, SpeechOutcome, SpeechStatus};

impl ActivityActor {
    /// Starts a new speech of the running turn on the output.
    pub(super) fn start_speech(&mut self, interruptibility: Arc<Interruptibility>) -> SpeechHandle {
        let speech = SpeechHandle::new(
            SpeechId(self.shared.next_speech()),
            interruptibility,
            SpeechStatus::Speaking,
            self.links.clone(),
            self.shared.gone.clone(),
        );
        self.announce_speech(&speech);
        speech
    }

    fn announce_speech(&mut self, speech: &SpeechHandle) {
        let agent = self.agent_name();
        self.shared
            .with_output(|output| output.speech_started(speech.id(), &agent));
        self.shared.emit_with(|| SessionEvent::SpeechCreated {
            agent: agent.clone(),
            speech: speech.clone(),
        });
        self.set_state(AgentState::Speaking);
        if let Some(turn) = self.turn.as_mut() {
            turn.speeches.push(speech.clone());
        }
    }

    /// A `say` turn: the text goes to the output as one chunk and, if asked, into the chat.
    pub(super) fn say(&mut self, text: String, speech: SpeechHandle, add_to_chat: bool) {
        speech.set_status(SpeechStatus::Speaking);
        self.announce_speech(&speech);
        self.shared
            .with_output(|output| output.speech_chunk(speech.id(), &text));
        if add_to_chat && !text.is_empty() {
            self.record(ChatItem::Message(ChatMessage {
                role: ChatRole::Assistant,
                content: text,
                interrupted: false,
                speech: Some(speech.id()),
            }));
        }
        let playout = self
            .shared
            .with_output(|output| output.speech_finished(speech.id()));
        if playout == Playout::Done {
            self.speech_ended(&speech, SpeechOutcome::Played);
        }
    }

    /// A speech is over: its handle learns how, subscribers get `SpeechPlayedOut`.
    pub(super) fn speech_ended(&mut self, speech: &SpeechHandle, outcome: SpeechOutcome) {
        if speech.is_done() {
            return;
        }
        let (interrupted, heard) = match &outcome {
            SpeechOutcome::Played => (false, None),
            SpeechOutcome::Interrupted { heard } => (true, heard.clone()),
        };
        speech.set_status(SpeechStatus::Done(outcome));
        self.shared.emit(SessionEvent::SpeechPlayedOut {
            speech: speech.id(),
            interrupted,
            heard,
        });
    }

    /// The output reports the end of `speech`'s playout. Its message is cut to what was
    /// heard (removed when nothing was), in the chat context and the turn's events; a
    /// report that comes while the text still streams is applied when it ends.
    pub(super) fn playout_finished(
        &mut self,
        speech: SpeechId,
        interrupted: bool,
        heard: Option<String>,
        _ctx: &mut Context<Self>,
    ) {
        if let Some(generation) = self.generation_mut(None) {
            if generation.speech.as_ref().is_some_and(|s| s.id() == speech) {
                generation.early_report = Some((interrupted, heard));
                return;
            }
        }
        if interrupted {
            match self.ledger.cut_speech(speech, heard.as_deref()) {
                Cut::Removed(index) => {
                    if self.last_reply_view > index {
                        self.last_reply_view -= 1;
                    }
                    self.shared
                        .emit_with(|| SessionEvent::ConversationItemRemoved {
                            agent: self.agent_name(),
                            index,
                        });
                }
                Cut::Shortened(index) => {
                    let item = self.ledger.chat().items().get(index).cloned();
                    if let Some(item) = item {
                        self.shared
                            .emit_with(|| SessionEvent::ConversationItemChanged {
                                agent: self.agent_name(),
                                index,
                                item,
                            });
                    }
                }
                Cut::NotFound => {}
            }
            if let Some(turn) = self.turn.as_mut() {
                if let Some(index) = turn.events.iter().rposition(
                    |item| matches!(item, ChatItem::Message(m) if m.speech == Some(speech)),
                ) {
                    cut_to_heard(&mut turn.events, index, heard.as_deref());
                }
            }
        }
        let handle = self
            .turn
            .as_ref()
            .and_then(|t| t.speeches.iter().find(|s| s.id() == speech).cloned());
        if let Some(handle) = handle {
            let outcome = if interrupted {
                SpeechOutcome::Interrupted { heard }
            } else {
                SpeechOutcome::Played
            };
            self.speech_ended(&handle, outcome);
            if self.turn.as_ref().is_some_and(|t| t.playing().is_none()) && !self.barge_in.paused()
            {
                self.set_state(AgentState::Listening);
            }
        }
        self.finish_if_played();
    }

    /// A handle asked to interrupt `speech`: its turn stops if it is the running one.
    pub(super) fn interrupt_speech(
        &mut self,
        speech: SpeechId,
        force: bool,
        ctx: &mut Context<Self>,
    ) {
        let ours = self
            .turn
            .as_ref()
            .is_some_and(|t| t.speeches.iter().any(|s| s.id() == speech));
        if ours {
            let _ = self.interrupt(force, ctx);
        }
    }

    /// The user started speaking (host input).
    pub(super) fn user_started(&mut self, ctx: &mut Context<Self>) {
        let interruptible = self.turn.as_ref().is_some_and(|t| t.interruptible());
        let can_pause = self.shared.with_output(|output| output.can_pause());
        let action =
            self.barge_in
                .user_started(Instant::now(), interruptible, can_pause, &self.barge_rules);
        self.carry_out(action, ctx);
    }

    /// The user stopped speaking (host input).
    pub(super) fn user_stopped(&mut self, ctx: &mut Context<Self>) {
        let action = self
            .barge_in
            .user_stopped(Instant::now(), &self.barge_rules);
        self.carry_out(action, ctx);
    }

    /// A transcript with words arrived (host input).
    pub(super) fn user_words(&mut self, ctx: &mut Context<Self>) {
        let action = self.barge_in.transcript();
        self.carry_out(action, ctx);
    }

    fn carry_out(&mut self, action: BargeAction, ctx: &mut Context<Self>) {
        match action {
            BargeAction::Nothing => {}
            BargeAction::Pause => {
                if let Some(speech) = self.turn.as_ref().and_then(|t| t.playing()).map(|s| s.id()) {
                    self.shared.with_output(|output| output.pause(speech));
                }
                self.set_state(AgentState::Listening);
                self.arm_barge_timer(self.barge_rules.min_duration, ctx, |act, now| {
                    act.barge_in.min_duration_passed(now, &act.barge_rules)
                });
            }
            BargeAction::Watch => {
                self.arm_barge_timer(self.barge_rules.min_duration, ctx, |act, now| {
                    act.barge_in.min_duration_passed(now, &act.barge_rules)
                });
            }
            BargeAction::AwaitTranscript => {
                if let Some(timeout) = self.barge_rules.false_timeout {
                    self.arm_barge_timer(timeout, ctx, |act, _| {
                        act.barge_in.false_timeout_passed()
                    });
                }
            }
            BargeAction::Interrupt => {
                self.cancel_barge_timer(ctx);
                // Interruptions may have been held off since the user started.
                if self.interrupt(false, ctx).is_err() {
                    self.resume_output();
                }
            }
            BargeAction::FalseInterruption { resume } => {
                self.cancel_barge_timer(ctx);
                if resume {
                    self.resume_output();
                }
                self.shared
                    .emit(SessionEvent::AgentFalseInterruption { resumed: resume });
            }
        }
    }

    /// Resumes a speech paused by a barge-in that did not become an interruption.
    fn resume_output(&mut self) {
        let playing = self.turn.as_ref().and_then(|t| t.playing()).map(|s| s.id());
        if let Some(speech) = playing {
            self.shared.with_output(|output| output.resume(speech));
            self.set_state(AgentState::Speaking);
        }
    }

    fn arm_barge_timer(
        &mut self,
        after: std::time::Duration,
        ctx: &mut Context<Self>,
        decide: fn(&mut Self, Instant) -> BargeAction,
    ) {
        self.cancel_barge_timer(ctx);
        self.barge_timer = Some(ctx.run_later(after, move |act, ctx| {
            act.barge_timer = None;
            let action = decide(act, Instant::now());
            act.carry_out(action, ctx);
        }));
    }

    fn cancel_barge_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.barge_timer.take() {
            ctx.cancel_future(timer);
        }
    }

    /// The turn ended or was interrupted: no barge-in is left to decide. (A pending timer
    /// finds the barge-in quiet and does nothing.)
    pub(super) fn end_barge_in(&mut self) {
        self.barge_in.turn_ended();
    }
}
