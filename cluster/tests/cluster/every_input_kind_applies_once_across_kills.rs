//! Every kind of input, round after round, while the worker that owns the session is
//! killed (SIGKILL) at random points — mid-input, mid-turn, between a say and its playout
//! report — and the session goes on on another: the user speaking, interim and final
//! transcripts, a say and its playout report, a reply asked for, an interruption, an agent
//! update, a history read, a typed turn. Each is applied once (the session's ledger, saved
//! with what the inputs changed, and the gateway's answered inputs): every turn the front
//! had the answer of is in the conversation once, none twice; a final transcript and a say
//! at most once (a final transcript's words may be cut by the interruption that follows
//! them); an interim transcript the front had answered shows once; each read sees every
//! answered turn before it. Seeded (`LEDGER_SEED`).

use crate::campaign::Rng;
use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{owner_of, within, WorkerProcess};
use switchboard::SessionEvent;
use switchboard_cluster::local::NatsServer;
use switchboard_cluster::{AgentSpec, GatewayError, GatewayOptions, RemoteEventKind, SessionSpec};
use tokio::sync::watch;

const ROUNDS: u64 = 12;

/// Whether a call answered, whatever it answered.
fn ok<T>(result: Result<T, GatewayError>) -> Result<(), GatewayError> {
    result.map(|_| ())
}
const KILLS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_input_is_applied_once_across_kills_at_random_points() {
    let _one_at_a_time = common::one_at_a_time().await;
    let seed = std::env::var("LEDGER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(34);
    let mut rng = Rng::new(seed);
    let server = NatsServer::start().unwrap();
    let lease = ["--lease-secs", "1"];
    let mut workers = vec![
        WorkerProcess::start(&server, "k0", 4, &lease),
        WorkerProcess::start(&server, "k1", 4, &lease),
    ];
    let gateway = common::gateway(&server, GatewayOptions::new()).await;
    let observer = common::client(&server, "observer").await;
    let session = gateway
        .start_session(SessionSpec::new("greeter"))
        .await
        .unwrap();
    let mut events = session.subscribe_from(1);

    // The killer: at random points, the owner dies and a new worker takes its place.
    let (done, mut finished) = watch::channel(false);
    let killer = {
        let key = session.id().clone();
        let mut rng = rng.clone();
        let server_url = server.url();
        let args: Vec<String> = common::credentials(&server)
            .into_iter()
            .chain(lease.iter().map(|s| (*s).to_owned()))
            .collect();
        tokio::spawn(async move {
            let mut kills = 0;
            let mut generation = 2;
            while kills < KILLS {
                let pause = rng.between(Duration::from_millis(200), Duration::from_millis(1500));
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    _ = finished.changed() => break,
                }
                let Some(owner) = owner_of(&observer, &key).await else {
                    continue;
                };
                let Some(at) = workers.iter().position(|w| w.name == owner.worker) else {
                    continue;
                };
                tokio::task::block_in_place(|| workers[at].kill());
                workers.remove(at);
                let name = format!("k{generation}");
                generation += 1;
                workers.push(tokio::task::block_in_place(|| {
                    WorkerProcess::start_with(&server_url, &name, 4, &args)
                }));
                kills += 1;
            }
            (kills, workers)
        })
    };

    // The rounds: every kind of input, recording what answered.
    let mut finals = Vec::new();
    let mut turns = Vec::new();
    let mut interims = Vec::new();
    let mut says = Vec::new();
    let mut agent = "greeter";
    for n in 0..ROUNDS {
        // Answered; or its answer lost in a move, or refused by the session (a playout
        // report of a speech the new owner never made): not answered.
        let answered = |result: &Result<(), GatewayError>| match result {
            Ok(()) => true,
            Err(GatewayError::AnswerLost { .. } | GatewayError::Session { .. }) => false,
            Err(err) => panic!("round {n}: {err}"),
        };
        answered(&ok(
            within("speaking", session.user_started_speaking()).await
        ));
        let interim = format!("interim {n}");
        let heard = answered(&ok(within(
            "an interim",
            session.transcript(interim.clone(), false),
        )
        .await));
        interims.push((interim, heard));
        answered(&ok(within("silence", session.user_stopped_speaking()).await));
        let text = format!("final {n}");
        let heard = answered(&ok(within(
            "a final",
            session.transcript(text.clone(), true),
        )
        .await));
        finals.push((text, heard));
        let said = format!("said {n}");
        match within("a say", session.say(said.clone())).await {
            Ok(speech) => {
                says.push(said);
                answered(&ok(within(
                    "a playout report",
                    session.playout_finished(speech.id(), false, None),
                )
                .await));
            }
            Err(GatewayError::AnswerLost { .. } | GatewayError::Session { .. }) => says.push(said),
            Err(err) => panic!("round {n}: a say: {err}"),
        }
        let typed = format!("typed {n}");
        match within("a turn", session.run(typed.clone())).await {
            Ok(_) => turns.push((typed, true)),
            Err(GatewayError::AnswerLost { .. }) => turns.push((typed, false)),
            Err(err) => panic!("round {n}: a turn: {err}"),
        }
        if rng.below(2) == 0 {
            answered(&ok(within(
                "a reply",
                session.generate_reply(Some(format!("reply {n}"))),
            )
            .await));
        }
        answered(&ok(within("an interruption", session.interrupt()).await));
        agent = if agent == "greeter" {
            "concierge"
        } else {
            "greeter"
        };
        answered(&ok(within(
            "an agent update",
            session.update_agent(AgentSpec::new(agent).data(serde_json::json!({}))),
        )
        .await));
        match within("a read", session.history()).await {
            Ok(read) => {
                let users = read.user_messages();
                for (text, heard) in &turns {
                    if *heard {
                        assert!(
                            users.contains(&text.as_str()),
                            "round {n}: the read lacks {text:?}: {users:?}"
                        );
                    }
                }
            }
            Err(GatewayError::AnswerLost { .. } | GatewayError::Session { .. }) => {}
            Err(err) => panic!("round {n}: a read: {err}"),
        }
    }
    done.send_replace(true);
    let (kills, _workers) = within("the killer", killer).await.unwrap();
    assert!(kills > 0, "no kill happened");

    // The conversation: each turn once (at most once when its answer was lost), each
    // final transcript and each say at most once.
    let history = within("the close", session.close()).await.unwrap();
    let users = history.user_messages();
    let said = history.assistant_messages();
    for (text, heard) in &turns {
        let times = users.iter().filter(|u| **u == text.as_str()).count();
        assert!(times <= 1, "{text:?} applied {times} times: {users:?}");
        assert!(
            !heard || times == 1,
            "{text:?} was answered but is not in {users:?}"
        );
    }
    for (text, _) in &finals {
        let times = users.iter().filter(|u| **u == text.as_str()).count();
        assert!(times <= 1, "{text:?} applied {times} times: {users:?}");
    }
    for text in &says {
        let times = said.iter().filter(|s| **s == text.as_str()).count();
        assert!(times <= 1, "{text:?} said {times} times: {said:?}");
    }
    // An interim transcript the front had answered shows once.
    let mut seen: HashMap<String, usize> = HashMap::new();
    loop {
        let event = within("the session's events", events.recv()).await.unwrap();
        match event.kind {
            RemoteEventKind::Session {
                event:
                    SessionEvent::UserInputTranscribed {
                        text,
                        is_final: false,
                    },
            } => *seen.entry(text).or_default() += 1,
            RemoteEventKind::SessionClosed { .. } => break,
            _ => {}
        }
    }
    for (text, heard) in &interims {
        let times = seen.get(text).copied().unwrap_or(0);
        assert!(times <= 1 || !heard, "{text:?} shown {times} times");
    }
    println!("seed {seed}: {kills} kills; {:?}", gateway.stats());
}
