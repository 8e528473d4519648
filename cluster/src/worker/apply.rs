//! Applying a host input to the engine: what each input the gateway sends does on the
//! session (`Session::apply`, with its id, so the session's ledger holds it), and what the
//! gateway hears at once — an answer, or "pending" with work whose end is the input's
//! outcome (a turn, a read, an interruption, an agent update), an event of the tenure.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use switchboard::snapshot::SessionSnapshot;
use switchboard::{
    HostInput, InputAnswer, InputId, RunResult, SayOptions, Session, SessionError, SessionHistory,
};

use super::tenure::Event;
use crate::protocol::{Answer, Failure, Input, InputOutcome};
use crate::spec::SessionFactory;

/// What applying an input gave.
pub(super) enum Applying {
    /// Its answer, now.
    Answered(Answer),
    /// An answer that takes time: the engine call under way (not polled yet: its first
    /// poll sends the input to the engine), whose end is the input's outcome.
    UnderWay(BoxFuture<'static, Event<SessionSnapshot>>),
}

impl Applying {
    fn later(
        work: impl std::future::Future<Output = Event<SessionSnapshot>> + Send + 'static,
    ) -> Self {
        Self::UnderWay(work.boxed())
    }
}

/// Hands `input` to the engine with its id (`Session::apply`); the engine message is
/// sent on the returned future's first poll.
pub(super) async fn apply(
    session: &Session,
    factory: &dyn SessionFactory,
    id: u64,
    input: Input,
) -> Applying {
    let session = session.clone();
    let input_id = InputId::new(id);
    let at_once = |answer: Result<InputAnswer, SessionError>| {
        Applying::Answered(match answer {
            Ok(InputAnswer::Speech(speech)) => Answer::Speech {
                speech: speech.id(),
                allow_interruptions: speech.allow_interruptions(),
            },
            Ok(_) => Answer::Done,
            Err(err) => Answer::Failed {
                failure: err.into(),
            },
        })
    };
    match input {
        Input::Run { text } => Applying::later(async move {
            let outcome = turn_outcome(session.apply(input_id, HostInput::Run { text }).await);
            Event::Outcome { id, outcome }
        }),
        Input::GenerateReply { instructions } => Applying::later(async move {
            let reply = HostInput::GenerateReply { instructions };
            let outcome = turn_outcome(session.apply(input_id, reply).await);
            Event::Outcome { id, outcome }
        }),
        Input::Say {
            text,
            allow_interruptions,
            add_to_chat,
        } => {
            let mut options = SayOptions::new().add_to_chat(add_to_chat);
            if let Some(allow) = allow_interruptions {
                options = options.allow_interruptions(allow);
            }
            at_once(
                session
                    .apply(input_id, HostInput::Say { text, options })
                    .await,
            )
        }
        Input::Transcript { text, is_final } => {
            let transcript = HostInput::Transcript { text, is_final };
            at_once(session.apply(input_id, transcript).await)
        }
        Input::UserStartedSpeaking => at_once(
            session
                .apply(input_id, HostInput::UserStartedSpeaking)
                .await,
        ),
        Input::UserStoppedSpeaking => at_once(
            session
                .apply(input_id, HostInput::UserStoppedSpeaking)
                .await,
        ),
        Input::Interrupt { force } => Applying::later(async move {
            let result = session
                .apply(input_id, HostInput::Interrupt { force })
                .await;
            Event::Outcome {
                id,
                outcome: done_outcome(result.map(|_| ())),
            }
        }),
        Input::InterruptSpeech { speech, force } => at_once(
            session
                .apply(input_id, HostInput::InterruptSpeech { speech, force })
                .await,
        ),
        Input::UpdateAgent { agent, data } => match factory.agent(&agent, &data) {
            Ok(agent) => Applying::later(async move {
                let update = HostInput::UpdateAgent { agent };
                let outcome = done_outcome(session.apply(input_id, update).await.map(|_| ()));
                Event::Outcome { id, outcome }
            }),
            Err(error) => Applying::Answered(Answer::Failed {
                failure: Failure::Factory { error },
            }),
        },
        Input::PlayoutFinished {
            speech,
            interrupted,
            heard,
        } => {
            let report = HostInput::PlayoutFinished {
                speech,
                interrupted,
                heard,
            };
            at_once(session.apply(input_id, report).await)
        }
        Input::History => Applying::later(async move {
            let history = match session.apply(input_id, HostInput::History).await {
                Ok(InputAnswer::History(history)) => history,
                _ => SessionHistory::default(),
            };
            Event::Outcome {
                id,
                outcome: InputOutcome::History { history },
            }
        }),
        Input::Answered => at_once(session.apply(input_id, HostInput::AlreadyAnswered).await),
        // The tenure closes the session itself (its `Action::Close`, answered by the
        // history in the close's `InputDone`): a close never comes here.
        Input::Close => Applying::Answered(Answer::Pending),
    }
}

fn turn_outcome(answer: Result<InputAnswer, SessionError>) -> InputOutcome {
    let result = answer.map(|answer| match answer {
        InputAnswer::Turn(result) => result,
        _ => RunResult::default(),
    });
    InputOutcome::Turn {
        result: result.map_err(Failure::from),
    }
}

fn done_outcome(result: Result<(), SessionError>) -> InputOutcome {
    InputOutcome::Done {
        result: result.map_err(Failure::from),
    }
}
