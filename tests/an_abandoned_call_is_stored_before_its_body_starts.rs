//! An `Abandon` tool's body never runs twice, across a crash too: in a session that saves
//! to a store, the body starts only once a stored snapshot holds the call, so whoever
//! restores from the store after the process died abandons the call instead of asking the
//! model again (SPEC §14 "Exactly once, without exceptions"). A store that fails, or does
//! not answer within `record_timeout`, means the body never starts and the model reads why;
//! so does a stop while the body waits. Calls of one step share one write; a `Restart`
//! tool's body waits for none.
//!
//! A crash here: the store is cut off at the moment the body starts (nothing the session
//! writes after reaches it, as nothing a killed process would write does), the session is
//! dropped, and a new session restores from what the store holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_invariant, output, spawn_turn, Query};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::snapshot::{
    AgentRegistry, ClaimRule, Claimed, MemoryStore, SessionSnapshot, SnapshotDelta, SnapshotStore,
    StoreError, StoreVersion,
};
use switchboard::testing::{Gate, Reply, ScriptedLlm};
use switchboard::RestorePolicy;

/// How the store answers writes.
const PASS: u8 = 0;
/// Every write fails (a disk full, a database away).
const FAIL: u8 = 1;
/// No write is ever answered.
const DEAF: u8 = 2;
/// Cut off: the process died; nothing reaches the store any more (writes never answer).
const CUT: u8 = 3;

/// A `MemoryStore` whose writes can fail, hang or be cut off, counting the writes that
/// reached it.
#[derive(Clone, Default)]
struct Faulty {
    inner: MemoryStore,
    mode: Arc<AtomicU8>,
    writes: Arc<AtomicUsize>,
    /// Writes asked for, answered or not.
    asked: Arc<AtomicUsize>,
}

impl Faulty {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    fn write(
        &self,
        session: String,
        write: BoxFuture<'static, Result<StoreVersion, StoreError>>,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        match self.mode.load(Ordering::SeqCst) {
            PASS => {
                self.writes.fetch_add(1, Ordering::SeqCst);
                write
            }
            FAIL => async move {
                Err(StoreError::Unavailable {
                    session,
                    reason: "the disk is full".to_owned(),
                })
            }
            .boxed(),
            _ => futures_util::future::pending().boxed(),
        }
    }
}

impl SnapshotStore for Faulty {
    fn claim(
        &self,
        session: &str,
        rule: ClaimRule,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
        self.inner.claim(session, rule)
    }

    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let session = snapshot.session_id().to_owned();
        let write = self.inner.save(snapshot, after);
        self.write(session, write)
    }

    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let write = self.inner.append(delta, after);
        self.write(String::new(), write)
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        self.inner.load(session)
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.remove(session)
    }
}

/// A tool whose body counts its runs, opens `started` and waits for `done`.
#[derive(Clone)]
struct Counted {
    name: &'static str,
    started: Gate,
    done: Gate,
    runs: Arc<AtomicU32>,
    policy: RestorePolicy,
}

impl Counted {
    fn new(name: &'static str, policy: RestorePolicy) -> Self {
        Self {
            name,
            started: Gate::new(),
            done: Gate::new(),
            runs: Arc::default(),
            policy,
        }
    }

    fn tool(&self) -> Tool {
        let this = self.clone();
        Tool::new(
            self.name,
            "Charges the card",
            move |_ctx: RunContext, args: Query| {
                let this = this.clone();
                async move {
                    this.runs.fetch_add(1, Ordering::SeqCst);
                    this.started.open();
                    this.done.wait().await;
                    Ok::<_, ToolFailure>(format!("charged {}", args.q))
                }
            },
        )
        .on_restore(self.policy)
        .cancel_on_interruption(true)
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

fn cashier(tools: Vec<Tool>) -> Agent {
    let mut agent = Agent::builder("cashier").instructions("Take the payment.");
    for tool in tools {
        agent = agent.tool(tool);
    }
    agent.build().unwrap()
}

/// A session of `cashier(tools)` saving to `store`, its model answering `replies`.
async fn start(store: &Faulty, tools: Vec<Tool>, replies: Vec<Reply>) -> Session {
    Session::builder()
        .llm(ScriptedLlm::new(replies))
        .agent(cashier(tools))
        .grace_period(Duration::ZERO)
        .record_timeout(Duration::from_secs(1))
        .save_snapshots(Arc::new(store.clone()))
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}

/// Waits (bounded, in virtual time when paused) for `gate`, naming what it waits for.
async fn opened(gate: &Gate, what: &str) {
    tokio::time::timeout(Duration::from_secs(30), gate.wait())
        .await
        .unwrap_or_else(|_| panic!("waiting for {what}"));
}

/// The session's first save (in full, as it started) is in the store.
async fn first_save(store: &Faulty, session: &Session) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while store
            .inner
            .load(session.id().as_str())
            .await
            .unwrap()
            .is_none()
        {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("waiting for the session's first save");
}

#[actix::test]
async fn a_body_that_started_before_a_crash_is_abandoned_by_the_restore_never_run_again() {
    tokio::time::pause();
    let store = Faulty::default();
    let charge = Counted::new("charge_card", RestorePolicy::Abandon);
    let session = start(
        &store,
        vec![charge.tool()],
        vec![Reply::tool_call("charge_card", json!({"q": "40 EUR"}))],
    )
    .await;
    let id = session.id().as_str().to_owned();
    let _turn = spawn_turn(&session, "pay for the tickets");
    opened(&charge.started, "the charge's body to start").await;
    // The process dies as the body runs: the store keeps what it had.
    store.set(CUT);
    let stored = store.inner.load(&id).await.unwrap().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&stored.to_json()).unwrap();
    assert_eq!(
        json["head"]["state"]["stack"][0]["toolsets"][0]["runs"][0]["call"]["call_id"], "call_1",
        "the store held the call as running before its body started: {json:#}"
    );
    drop(_turn);
    drop(session);

    let llm = ScriptedLlm::new([Reply::text("The payment was interrupted; shall I retry?")]);
    let agents = {
        let tool = charge.tool();
        AgentRegistry::new().agent("cashier", move |_| {
            Ok::<_, BuildError>(cashier(vec![tool.clone()]))
        })
    };
    let restored = Session::builder()
        .llm(llm.clone())
        .grace_period(Duration::ZERO)
        .restore_from(Arc::new(store.inner.clone()), &id, agents)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    common::settled(&restored).await;
    assert_eq!(charge.runs(), 1, "the card is charged once");
    let chat = restored.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "Interrupted before it finished.");
    let requests = llm.requests();
    assert_eq!(
        requests.len(),
        1,
        "the model is asked once, to go on; not to call the tool again"
    );
    let calls: Vec<&str> = chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCall(call) => Some(call.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(calls, ["charge_card"], "one call in all");
    assert_invariant(&chat);
    restored.close().await.unwrap();
}

/// The turn with one `charge_card` call, then the model's answer to its output.
fn charge_then_answer() -> Vec<Reply> {
    vec![
        Reply::tool_call("charge_card", json!({"q": "40 EUR"})),
        Reply::text("I could not take the payment."),
    ]
}

/// Runs the turn and checks the call was not made: its body never started, its output is
/// the error the model reads, an `Error` event names it, and the turn went on.
async fn not_made(store: &Faulty, why: &str) {
    let charge = Counted::new("charge_card", RestorePolicy::Abandon);
    let session = start(store, vec![charge.tool()], charge_then_answer()).await;
    let mut events = session.subscribe();
    let result = tokio::time::timeout(Duration::from_secs(30), session.run("pay"))
        .await
        .expect("the turn ends, the store notwithstanding")
        .unwrap();
    assert_eq!(charge.runs(), 0, "the body never started");
    let chat = session.chat_context().await.unwrap();
    let out = chat.output_of("call_1").unwrap();
    assert!(out.is_error);
    assert!(
        out.output.contains("could not be recorded") && out.output.contains(why),
        "{}",
        out.output
    );
    assert_eq!(
        chat.items().last().unwrap().text(),
        Some("I could not take the payment."),
        "the turn went on: the model read the error"
    );
    drop(result);
    let mut named = false;
    while let Ok(event) = events.try_recv() {
        if let SessionEvent::Error { message } = event {
            named |= message.contains("call_1") && message.contains("was not made");
        }
    }
    assert!(named, "an Error event names the call not made");
    assert_invariant(&chat);
    session.close().await.unwrap();
}

#[actix::test]
async fn a_store_that_fails_means_the_body_never_starts_and_the_model_reads_why() {
    tokio::time::pause();
    let store = Faulty::default();
    store.set(FAIL);
    not_made(&store, "the disk is full").await;
}

#[actix::test]
async fn a_store_that_never_answers_holds_the_body_for_the_bound_only() {
    tokio::time::pause();
    let store = Faulty::default();
    store.set(DEAF);
    let began = tokio::time::Instant::now();
    not_made(&store, "did not answer within 1s").await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "bounded by record_timeout"
    );
}

#[actix::test]
async fn a_call_interrupted_while_it_waits_to_be_recorded_never_starts() {
    tokio::time::pause();
    let store = Faulty::default();
    let charge = Counted::new("charge_card", RestorePolicy::Abandon);
    let session = start(&store, vec![charge.tool()], charge_then_answer()).await;
    first_save(&store, &session).await;
    store.set(DEAF);
    let asked = store.asked.load(Ordering::SeqCst);
    let turn = spawn_turn(&session, "pay");
    tokio::time::timeout(Duration::from_millis(500), async {
        while store.asked.load(Ordering::SeqCst) == asked {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("waiting for the call's write to reach the store");
    session.interrupt().await.unwrap();
    let _ = turn.await;
    // Past the bound: the body still never started.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(charge.runs(), 0, "the body never started");
    let chat = session.chat_context().await.unwrap();
    assert_eq!(output(&chat, "call_1"), "Cancelled: the user interrupted.");
    session.close().await.unwrap();
}

#[actix::test]
async fn parallel_abandon_calls_of_one_step_share_one_write() {
    tokio::time::pause();
    let store = Faulty::default();
    let card = Counted::new("charge_card", RestorePolicy::Abandon);
    let ticket = Counted::new("book_ticket", RestorePolicy::Abandon);
    let session = start(
        &store,
        vec![card.tool(), ticket.tool()],
        vec![
            Reply::tool_call("charge_card", json!({"q": "40 EUR"}))
                .and_tool_call("book_ticket", json!({"q": "row 7"})),
            Reply::text("Done."),
        ],
    )
    .await;
    first_save(&store, &session).await;
    let before = store.writes();
    let turn = spawn_turn(&session, "pay and book");
    opened(&card.started, "the charge's body to start").await;
    opened(&ticket.started, "the booking's body to start").await;
    assert_eq!(
        store.writes() - before,
        1,
        "one write holds both calls before either body starts"
    );
    card.done.open();
    ticket.done.open();
    turn.await.unwrap().unwrap();
    session.close().await.unwrap();
}

#[actix::test]
async fn a_restart_tool_s_body_waits_for_no_write() {
    tokio::time::pause();
    let store = Faulty::default();
    let lookup = Counted::new("charge_card", RestorePolicy::Restart);
    let session = start(&store, vec![lookup.tool()], charge_then_answer()).await;
    first_save(&store, &session).await;
    let before = store.writes();
    let turn = spawn_turn(&session, "look it up");
    opened(&lookup.started, "the lookup's body to start").await;
    assert_eq!(store.writes(), before, "no write before a Restart body");
    lookup.done.open();
    turn.await.unwrap().unwrap();
    session.close().await.unwrap();
}
