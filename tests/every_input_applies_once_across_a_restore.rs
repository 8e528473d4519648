//! SPEC §15, "Every input exactly once, whatever its kind": a host input applied with its
//! id (`Session::apply`) is applied once in the conversation however often the host sends
//! it, across snapshots and restores. Every kind — runs, replies, says, interim and final
//! transcripts, the user speaking, playout reports, interruptions, agent updates, history
//! reads — is applied on one session up to a point, the session is snapshotted there and
//! restored, and the restored one is sent every input again from the first: those its
//! snapshot holds are answered from its ledger and applied nothing, the others are applied,
//! and the conversation is the one a session that never stopped has. At every point
//! between two inputs, and in the middle of a turn.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use switchboard::prelude::*;
use switchboard::snapshot::AgentRegistry;
use switchboard::testing::{Reply, ScriptedLlm};
use switchboard::{HostInput, InputAnswer, InputId, RecordedAnswer};

fn agent(name: &str) -> Agent {
    Agent::builder(name).instructions("Note.").build().unwrap()
}

fn registry() -> AgentRegistry {
    AgentRegistry::new()
        .agent("a", |_| Ok::<_, BuildError>(agent("a")))
        .agent("b", |_| Ok::<_, BuildError>(agent("b")))
}

fn llm() -> Arc<ScriptedLlm> {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Noted."));
    llm
}

/// How many inputs the script has.
const INPUTS: u64 = 12;

/// Input `id` of the script: every kind once. `said` is the speech input 6 made, for the
/// playout report.
fn input(id: u64, said: Option<SpeechId>) -> HostInput {
    match id {
        1 => HostInput::UserStartedSpeaking,
        2 => HostInput::Transcript {
            text: "hel".into(),
            is_final: false,
        },
        3 => HostInput::UserStoppedSpeaking,
        4 => HostInput::Transcript {
            text: "hello there".into(),
            is_final: true,
        },
        5 => HostInput::Run {
            text: "second".into(),
        },
        6 => HostInput::Say {
            text: "Said as it is.".into(),
            options: SayOptions::new(),
        },
        7 => HostInput::GenerateReply {
            instructions: Some("Reply briefly.".into()),
        },
        8 => HostInput::UpdateAgent { agent: agent("b") },
        9 => HostInput::History,
        10 => HostInput::Interrupt { force: false },
        11 => HostInput::PlayoutFinished {
            speech: said.expect("input 6 made a speech"),
            interrupted: false,
            heard: None,
        },
        12 => HostInput::Run {
            text: "third".into(),
        },
        _ => unreachable!("the script has {INPUTS} inputs"),
    }
}

/// What a session did with the script's inputs.
#[derive(Default)]
struct Applied {
    /// Input 6's speech.
    said: Option<SpeechId>,
    /// The ids answered from the ledger.
    earlier: Vec<u64>,
}

/// Applies inputs `ids` in order, each once the one before settled (while the user
/// speaks, inputs 1 and 2, the session is not inactive: the next comes at once).
async fn apply(session: &Session, ids: impl IntoIterator<Item = u64>, applied: &mut Applied) {
    for id in ids {
        let answer = session
            .apply(InputId::new(id), input(id, applied.said))
            .await
            .unwrap_or_else(|err| panic!("input {id}: {err}"));
        match answer {
            InputAnswer::Speech(speech) => applied.said = Some(speech.id()),
            InputAnswer::AppliedEarlier(RecordedAnswer::Speech(speech)) => {
                applied.earlier.push(id);
                applied.said = Some(speech);
            }
            InputAnswer::AppliedEarlier(_) => applied.earlier.push(id),
            _ => {}
        }
        if !(1..=2).contains(&id) {
            common::settled(session).await;
        }
    }
}

/// The conversation as one list: each agent's messages and handoffs, in order.
fn transcript(history: &SessionHistory) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in &history.agents {
        for item in entry.chat.items() {
            match item {
                ChatItem::Message(m) if m.role != ChatRole::System => {
                    lines.push(format!("{} {:?}: {}", entry.agent, m.role, m.content))
                }
                ChatItem::AgentHandoff { from, to } => {
                    lines.push(format!("{}: handoff {from:?} -> {to}", entry.agent))
                }
                _ => {}
            }
        }
    }
    lines
}

/// How many interim transcripts a session announced.
fn interims(events: &mut tokio::sync::broadcast::Receiver<SessionEvent>) -> usize {
    let mut n = 0;
    while let Ok(event) = events.try_recv() {
        if matches!(
            event,
            SessionEvent::UserInputTranscribed {
                is_final: false,
                ..
            }
        ) {
            n += 1;
        }
    }
    n
}

async fn started(engine: &Engine, llm: Arc<ScriptedLlm>, id: &str) -> Session {
    Session::builder()
        .llm(llm)
        .agent(agent("a"))
        .id(id)
        .start(engine)
        .await
        .unwrap()
}

#[actix::test]
async fn every_input_kind_applies_once_across_a_restore_at_every_point() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();

    // The session that never stopped.
    let llm_r = llm();
    let reference = started(&engine, llm_r.clone(), "reference").await;
    let mut events_r = reference.subscribe();
    apply(&reference, 1..=INPUTS, &mut Applied::default()).await;
    let expected = transcript(&reference.history().await);
    assert_eq!(interims(&mut events_r), 1);
    reference.close().await.unwrap();
    assert!(
        expected.iter().any(|l| l.contains("handoff")),
        "the script hands off: {expected:#?}"
    );

    for cut in 0..=INPUTS {
        let id = format!("cut-{cut}");
        let llm_a = llm();
        let before = started(&engine, llm_a.clone(), &id).await;
        let mut events_a = before.subscribe();
        let mut applied = Applied::default();
        apply(&before, 1..=cut, &mut applied).await;
        let snapshot = before.snapshot().await.unwrap();
        assert_eq!(snapshot.last_input(), (cut > 0).then_some(cut));
        before.close().await.unwrap();

        let llm_b = llm();
        let after = Session::builder()
            .llm(llm_b.clone())
            .restore(snapshot, registry())
            .start(&engine)
            .await
            .unwrap();
        let mut events_b = after.subscribe();
        let mut again = Applied::default();
        // The host sends everything again, from the first.
        apply(&after, 1..=INPUTS, &mut again).await;
        assert_eq!(
            again.earlier,
            (1..=cut).collect::<Vec<_>>(),
            "cut {cut}: what the snapshot holds is answered from the ledger, nothing else"
        );
        assert_eq!(
            transcript(&after.history().await),
            expected,
            "cut {cut}: the conversation is the one that never stopped"
        );
        assert_eq!(
            interims(&mut events_a) + interims(&mut events_b),
            1,
            "cut {cut}: the interim transcript is announced once"
        );
        assert_eq!(
            llm_a.request_count() + llm_b.request_count(),
            llm_r.request_count(),
            "cut {cut}: the model is asked as often as without the restore"
        );
        after.close().await.unwrap();
    }
}

/// A snapshot in the middle of a turn: the turn's input is in it (its step is asked
/// again after the restore), so sent again it is answered from the ledger, and the turn's
/// words are in the conversation once.
#[actix::test]
async fn a_turn_snapshotted_mid_way_is_not_applied_again() {
    tokio::time::pause();
    let engine = Engine::current().unwrap();
    let llm_a = llm();
    let held = llm_a.hold(0);
    let before = started(&engine, llm_a.clone(), "mid-turn").await;
    let turn = actix::spawn({
        let session = before.clone();
        async move {
            session
                .apply(InputId::new(1), HostInput::Run { text: "hi".into() })
                .await
        }
    });
    held.requested(Duration::from_secs(5)).await.unwrap();
    let snapshot = before.snapshot().await.unwrap();
    assert_eq!(
        snapshot.last_input(),
        Some(1),
        "the running turn's input is in"
    );
    held.release();
    turn.await.unwrap().unwrap();
    before.close().await.unwrap();

    let llm_b = llm();
    let after = Session::builder()
        .llm(llm_b.clone())
        .restore(snapshot, registry())
        .start(&engine)
        .await
        .unwrap();
    common::settled(&after).await;
    // Its answer was not known when the snapshot was taken.
    let again = after
        .apply(InputId::new(1), HostInput::Run { text: "hi".into() })
        .await
        .unwrap();
    assert!(
        matches!(again, InputAnswer::AppliedEarlier(RecordedAnswer::Unknown)),
        "{again:?}"
    );
    let next = after
        .apply(
            InputId::new(2),
            HostInput::Run {
                text: "next".into(),
            },
        )
        .await
        .unwrap();
    assert!(matches!(next, InputAnswer::Turn(_)), "{next:?}");
    assert_eq!(
        transcript(&after.history().await),
        [
            "a User: hi",
            "a Assistant: Noted.",
            "a User: next",
            "a Assistant: Noted."
        ]
    );
    assert_eq!(
        llm_b.request_count(),
        2,
        "the step asked again, and input 2"
    );
    after.close().await.unwrap();
}
