//! Front code written once against the host API ([`HostSession`]): a script of host
//! calls — turns, the user's voice, speech, a barge-in, another agent — run over any
//! session, local or on another machine, recording what the front got back. The same
//! script over a local `Session` and over a remote session running the same agents gives
//! the same record: what a front sees does not depend on where the session runs.
//!
//! ```
//! use switchboard::prelude::*;
//! use switchboard::testing::front::{run_front, FrontStep};
//! use switchboard::testing::{Reply, ScriptedLlm};
//!
//! #[switchboard::test]
//! async fn the_front_greets_then_answers() {
//!     let llm = ScriptedLlm::new([Reply::text("Hello!"), Reply::text("At nine.")]);
//!     let agent = Agent::builder("host").instructions("Greet.").build().unwrap();
//!     let session = Session::builder().llm(llm).agent(agent).start(&Engine::current().unwrap()).await.unwrap();
//!     let record = run_front(&session, vec![
//!         FrontStep::GenerateReply(None),
//!         FrontStep::Run("When do you open?".into()),
//!     ]).await.unwrap();
//!     assert_eq!(record.lines, ["reply: Hello!", "run When do you open?: At nine."]);
//! }
//! # fn main() {}
//! ```

use std::time::Duration;

use switchboard_actors::{
    ChatItem, ChatRole, EventsMissed, HostSession, SessionEvent, SessionEvents, SessionHistory,
};

/// How long a step waits for what it expects to hear (the turn a spoken input makes).
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// One host call of a front's script.
#[derive(Debug)]
#[non_exhaustive]
pub enum FrontStep<A> {
    /// `run(text)`; records the turn's assistant messages.
    Run(String),
    /// `generate_reply(instructions)`; records the reply's assistant messages.
    GenerateReply(Option<String>),
    /// `say(text)`.
    Say(String),
    /// The user talks, as a voice front reports it: started speaking, each interim
    /// transcript, the final one, stopped speaking; then the front waits for the agent's
    /// answer to it (its assistant message, from the events) and records it.
    Speak {
        /// What the STT heard on the way.
        interim: Vec<String>,
        /// What the user said.
        said: String,
    },
    /// `interrupt()`; records whether it was refused.
    Interrupt,
    /// `update_agent(agent)`.
    UpdateAgent(A),
}

/// What a front got back, one line per step (`run <text>: <reply>`), and the conversation
/// the session kept, from `close`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct FrontRecord {
    /// One line per step.
    pub lines: Vec<String>,
    /// The whole conversation, from `close`.
    pub history: SessionHistory,
}

impl FrontRecord {
    /// The user's messages of the conversation, in order, each once.
    pub fn user_messages(&self) -> Vec<String> {
        self.messages(ChatRole::User)
    }

    /// The agents' messages of the conversation, in order.
    pub fn assistant_messages(&self) -> Vec<String> {
        self.messages(ChatRole::Assistant)
    }

    fn messages(&self, role: ChatRole) -> Vec<String> {
        self.history
            .transcript()
            .into_iter()
            .filter_map(|(_, item)| match item {
                ChatItem::Message(m) if m.role == role => Some(m.content.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Why a front's script stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontError<E: std::error::Error + 'static> {
    /// A host call failed.
    #[error("{step}: {source}")]
    Host {
        /// The step.
        step: String,
        /// Its failure.
        source: E,
    },
    /// The front missed events it was waiting among.
    #[error("{step}: {source}")]
    Missed {
        /// The step.
        step: String,
        /// How many.
        source: EventsMissed,
    },
    /// What a step waited for did not come in time, or the session ended first.
    #[error("{step}: no {waiting_for} within {STEP_TIMEOUT:?}")]
    NotHeard {
        /// The step.
        step: String,
        /// What it waited for.
        waiting_for: &'static str,
    },
}

/// A call, as a script: a greeting (`generate_reply`), a typed turn, a spoken one (two
/// interim transcripts, then `a table for two`), a speech, a barge-in, another agent
/// (`next`, how the session at hand is given it) and a turn with it. Tests of fronts run it
/// over sessions of different kinds and compare the records.
pub fn a_call<A>(next: A) -> Vec<FrontStep<A>> {
    vec![
        FrontStep::GenerateReply(Some("Greet the caller.".into())),
        FrontStep::Run("I'd like a table".into()),
        FrontStep::Speak {
            interim: vec!["a table".into(), "a table for".into()],
            said: "a table for two".into(),
        },
        FrontStep::Say("One moment, please.".into()),
        FrontStep::Interrupt,
        FrontStep::UpdateAgent(next),
        FrontStep::Run("hello again".into()),
    ]
}

/// Runs `steps` over `session`, then closes it: the record of what the front got back.
pub async fn run_front<S: HostSession>(
    session: &S,
    steps: Vec<FrontStep<S::Agent>>,
) -> Result<FrontRecord, FrontError<S::Error>> {
    let mut events = session.events();
    let mut lines = Vec::with_capacity(steps.len());
    for step in steps {
        let line = match step {
            FrontStep::Run(text) => {
                let turn = session
                    .run(text.clone())
                    .await
                    .map_err(|source| host(format!("run {text}"), source))?;
                format!("run {text}: {}", joined(turn.assistant_messages()))
            }
            FrontStep::GenerateReply(instructions) => {
                let turn = session
                    .generate_reply(instructions)
                    .await
                    .map_err(|source| host("reply".into(), source))?;
                format!("reply: {}", joined(turn.assistant_messages()))
            }
            FrontStep::Say(text) => {
                session
                    .say(text.clone())
                    .await
                    .map_err(|source| host(format!("say {text}"), source))?;
                format!("say {text}")
            }
            FrontStep::Speak { interim, said } => {
                let step = format!("speak {said}");
                let fail = |source| host(step.clone(), source);
                session.user_started_speaking().await.map_err(fail)?;
                for text in interim {
                    session.transcript(text, false).await.map_err(fail)?;
                }
                session.transcript(said.clone(), true).await.map_err(fail)?;
                session.user_stopped_speaking().await.map_err(fail)?;
                let answer = answer_to(&mut events, &said, &step).await?;
                format!("{step}: {answer}")
            }
            FrontStep::Interrupt => match session.interrupt().await {
                Ok(()) => "interrupt".to_owned(),
                Err(err) => format!("interrupt refused: {err}"),
            },
            FrontStep::UpdateAgent(agent) => {
                session
                    .update_agent(agent)
                    .await
                    .map_err(|source| host("update_agent".into(), source))?;
                "update_agent".to_owned()
            }
        };
        lines.push(line);
    }
    let history = session
        .close()
        .await
        .map_err(|source| host("close".into(), source))?;
    Ok(FrontRecord { lines, history })
}

fn host<E: std::error::Error + 'static>(step: String, source: E) -> FrontError<E> {
    FrontError::Host { step, source }
}

fn joined<'a>(messages: impl Iterator<Item = &'a str>) -> String {
    messages.collect::<Vec<_>>().join(" / ")
}

/// Waits, among the events, for the user's message `said` to reach a chat context and
/// then for the next assistant message: the agent's answer to what the user said.
async fn answer_to<Ev: SessionEvents, E: std::error::Error + 'static>(
    events: &mut Ev,
    said: &str,
    step: &str,
) -> Result<String, FrontError<E>> {
    let wait = async {
        let mut heard = false;
        while let Some(event) = events.next().await {
            let event = event.map_err(|source| FrontError::Missed {
                step: step.to_owned(),
                source,
            })?;
            if let SessionEvent::ConversationItemAdded {
                item: ChatItem::Message(message),
                ..
            } = event
            {
                match message.role {
                    ChatRole::User if message.content == said => heard = true,
                    ChatRole::Assistant if heard => return Ok(message.content),
                    _ => {}
                }
            }
        }
        Err(FrontError::NotHeard {
            step: step.to_owned(),
            waiting_for: "answer before the session ended",
        })
    };
    tokio::time::timeout(STEP_TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| {
            Err(FrontError::NotHeard {
                step: step.to_owned(),
                waiting_for: "answer",
            })
        })
}
