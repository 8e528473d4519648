//! A host input applied with its id (`Session::apply`): one message carries both, so the
//! input and its id enter the session together and a snapshot holds the input exactly when
//! its ledger holds the id (`input_ledger.rs`).
//!
//! The session looks the id up in its ledger first: an id applied before (here, or by the
//! session whose snapshot this one was restored from) is answered from the ledger and
//! nothing is applied. Otherwise the id goes into the ledger and the input is applied as
//! the `Session` method of the same name applies it — in the same handler, so nothing
//! comes between them. A `run`, `generate_reply` or `say` queues a job tied to the id
//! (the id's effect is in once the job starts: a queued host job is not in a snapshot);
//! every other input is in at once. When the answer comes, the ledger keeps it.

use actix::prelude::*;
use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;

use super::{ReadHistory, RunTurn, Say, SessionActor, UpdateAgent};
use crate::activity::{
    InterruptSpeech, InterruptTurn, PlayoutFinished, TurnKind, UserStartedSpeaking,
    UserStoppedSpeaking, UserTranscript,
};
use crate::error::SessionError;
use crate::handoff::Handoff;
use crate::host_input::{HostInput, InputAnswer};
use crate::input_ledger::{Admit, RecordedAnswer};
use crate::telemetry::Cause;

/// Sent by the host (`Session::apply`): a host input with its id. Answered with what the
/// input gave (a turn's result once it ended, a speech's handle once queued, `Done` once
/// applied), or with what it gave before when the id was applied before.
pub(crate) struct ApplyInput {
    pub(crate) id: u64,
    pub(crate) input: HostInput,
    /// The host's ticket for a turn: dropping the `apply` future sends `CancelTurn` with it.
    pub(crate) ticket: u64,
    /// The host's span at the call (telemetry).
    pub(crate) cause: Cause,
}

impl Message for ApplyInput {
    type Result = Result<InputAnswer, SessionError>;
}

impl Handler<ApplyInput> for SessionActor {
    type Result = ResponseFuture<Result<InputAnswer, SessionError>>;

    fn handle(&mut self, msg: ApplyInput, ctx: &mut Self::Context) -> Self::Result {
        let ApplyInput {
            id,
            input,
            ticket,
            cause,
        } = msg;
        if let Admit::Earlier(answer) = self.shared.host_view.inputs().admit(id) {
            return Box::pin(async move { Ok(InputAnswer::AppliedEarlier(answer)) });
        }
        let queues_a_job = matches!(
            input,
            HostInput::Run { .. } | HostInput::GenerateReply { .. } | HostInput::Say { .. }
        );
        // Before the input is applied: a job it queues may start at once, and its start
        // counts the id in.
        self.shared.host_view.inputs().applied(id, queues_a_job);
        let answer = self.apply(id, input, ticket, cause, ctx);
        let shared = self.shared.clone();
        Box::pin(async move {
            let answer = answer.await;
            shared.host_view.inputs().answered(id, recorded(&answer));
            answer
        })
    }
}

impl SessionActor {
    /// Applies `input` as the `Session` method of its name does, its job (if any) tied to
    /// input `id`.
    fn apply(
        &mut self,
        id: u64,
        input: HostInput,
        ticket: u64,
        cause: Cause,
        ctx: &mut Context<Self>,
    ) -> LocalBoxFuture<'static, Result<InputAnswer, SessionError>> {
        let done = || async { Ok(InputAnswer::Done) }.boxed_local();
        match input {
            HostInput::Run { text } => self.turn(ticket, TurnKind::User(text), cause, id, ctx),
            HostInput::GenerateReply { instructions } => {
                self.turn(ticket, TurnKind::Reply(instructions), cause, id, ctx)
            }
            HostInput::Say { text, options } => {
                let say = Say {
                    text,
                    options,
                    cause,
                    input: Some(id),
                };
                let said = Handler::handle(self, say, ctx);
                async move { said.map(InputAnswer::Speech) }.boxed_local()
            }
            HostInput::Transcript { text, is_final } => {
                let transcript = UserTranscript {
                    text,
                    is_final,
                    cause,
                    interrupts: false,
                };
                Handler::handle(self, transcript, ctx);
                done()
            }
            HostInput::UserStartedSpeaking => {
                Handler::handle(self, UserStartedSpeaking, ctx);
                done()
            }
            HostInput::UserStoppedSpeaking => {
                Handler::handle(self, UserStoppedSpeaking, ctx);
                done()
            }
            HostInput::PlayoutFinished {
                speech,
                interrupted,
                heard,
            } => {
                let report = PlayoutFinished {
                    speech,
                    interrupted,
                    heard,
                    heard_audio: None,
                };
                Handler::handle(self, report, ctx);
                done()
            }
            HostInput::AudioFinished {
                speech,
                interrupted,
                played,
            } => {
                let report = PlayoutFinished {
                    speech,
                    interrupted,
                    heard: None,
                    heard_audio: Some(played),
                };
                Handler::handle(self, report, ctx);
                done()
            }
            HostInput::Interrupt { force } => {
                let interrupted = Handler::handle(self, InterruptTurn { force }, ctx);
                async move { interrupted.await.map(|()| InputAnswer::Done) }.boxed_local()
            }
            HostInput::InterruptSpeech { speech, force } => {
                // The path a local handle's `interrupt` takes (the session's `SpeechPort`).
                Handler::handle(self, InterruptSpeech { speech, force }, ctx);
                done()
            }
            HostInput::UpdateAgent { agent } => {
                let handoff = UpdateAgent {
                    handoff: Handoff::to(agent),
                    cause,
                };
                let updated = Handler::handle(self, handoff, ctx);
                async move { updated.await.map(|()| InputAnswer::Done) }.boxed_local()
            }
            HostInput::History => {
                let read = Handler::handle(self, ReadHistory, ctx);
                async move { Ok(InputAnswer::History(read.await)) }.boxed_local()
            }
            HostInput::AlreadyAnswered => done(),
        }
    }

    fn turn(
        &mut self,
        ticket: u64,
        kind: TurnKind,
        cause: Cause,
        input: u64,
        ctx: &mut Context<Self>,
    ) -> LocalBoxFuture<'static, Result<InputAnswer, SessionError>> {
        let turn = RunTurn {
            id: ticket,
            kind,
            cause,
            input: Some(input),
        };
        let ran = Handler::handle(self, turn, ctx);
        async move { ran.await.map(InputAnswer::Turn) }.boxed_local()
    }
}

/// An answer as the ledger keeps it.
fn recorded(answer: &Result<InputAnswer, SessionError>) -> RecordedAnswer {
    match answer {
        Ok(InputAnswer::Done) => RecordedAnswer::Done,
        Ok(InputAnswer::Turn(_)) => RecordedAnswer::Turn,
        Ok(InputAnswer::Speech(speech)) => RecordedAnswer::Speech(speech.id()),
        Ok(InputAnswer::History(_)) => RecordedAnswer::Read,
        Ok(InputAnswer::AppliedEarlier(answer)) => answer.clone(),
        Err(err) => RecordedAnswer::Failed(err.to_string()),
    }
}
