//! Helpers shared by the integration tests.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    unreachable_pub
)]

use std::sync::{Arc, Mutex};

use switchboard::prelude::*;
use switchboard::testing::{event, next_event, EventMatcher};

/// Arguments of test tools.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Query {
    pub q: String,
}

/// An ordered log that tool bodies, drop guards and hooks write to.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }
    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    pub fn position(&self, entry: &str) -> Option<usize> {
        self.entries().iter().position(|e| e == entry)
    }
}

/// Writes to the log when dropped: proves a tool body's future is gone.
pub struct DropGuard(pub Log, pub &'static str);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.push(self.1);
    }
}

/// The call ids of a chat context's items, in order (`call` / `out:` prefix).
pub fn call_ids(chat: &ChatContext) -> Vec<String> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCall(c) => Some(format!("call {}", c.call_id)),
            ChatItem::FunctionCallOutput(o) => Some(format!("out {}", o.call_id)),
            _ => None,
        })
        .collect()
}

/// Asserts the chat-context invariant with a readable failure.
pub fn assert_invariant(chat: &ChatContext) {
    if let Err(breach) = chat.check_invariant() {
        panic!(
            "chat context invariant broken: {breach}\nitems: {:#?}",
            chat.items()
        );
    }
}

/// The text of every output, by call id.
pub fn output(chat: &ChatContext, call_id: &str) -> String {
    chat.output_of(call_id)
        .unwrap_or_else(|| panic!("no output for {call_id} in {:#?}", chat.items()))
        .output
        .clone()
}

/// A tool `transfer` that hands off to `agent`.
pub fn transfer_to(agent: Agent) -> Tool {
    let to = agent.name().to_owned();
    Tool::new(
        "transfer",
        format!("Transfers to {to}"),
        move |_ctx: RunContext, _: switchboard::NoArgs| {
            let agent = agent.clone();
            async move { Ok::<_, ToolFailure>(Handoff::to(agent)) }
        },
    )
}

/// The user's messages of a chat, in order.
pub fn user_messages(chat: &ChatContext) -> Vec<String> {
    said(chat)
        .into_iter()
        .filter(|(role, _)| *role == ChatRole::User)
        .map(|(_, text)| text)
        .collect()
}

/// Every message of a chat, with its role, in order.
pub fn said(chat: &ChatContext) -> Vec<(ChatRole, String)> {
    chat.items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::Message(m) => Some((m.role, m.content.clone())),
            _ => None,
        })
        .collect()
}

/// Waits (up to 5 s) for the first event `pick` returns `Some` for, returning it; the
/// failure says what it saw.
pub async fn wait_event<T>(
    rx: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    pick: impl FnMut(&SessionEvent) -> Option<T>,
) -> T {
    wait_on(rx, event::matching("the event the test picks", pick)).await
}

/// Waits (up to 5 s) for the first event a matcher of `switchboard::testing::event`
/// picks; the failure says what it waited for and what it saw.
pub async fn wait_on<M: EventMatcher>(
    rx: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    matcher: M,
) -> M::Output {
    next_event(rx, matcher, std::time::Duration::from_secs(5))
        .await
        .unwrap()
}

/// Waits (up to 30 s, virtual under paused time) for the session to settle; the failure
/// says which half was missing and what the session did meanwhile.
pub async fn settled(session: &Session) {
    switchboard::testing::settled(session, std::time::Duration::from_secs(30))
        .await
        .unwrap();
}

/// Runs a turn on the test's arbiter without awaiting it (it may wait on a sub-task, a
/// handoff or a playout the test drives).
pub fn spawn_turn(
    session: &Session,
    text: &str,
) -> tokio::task::JoinHandle<Result<RunResult, SessionError>> {
    let (session, text) = (session.clone(), text.to_owned());
    actix::spawn(async move { session.run(text).await })
}

/// Waits (up to 5 s) until the activity `id` has handled `StartActivity`.
pub async fn wait_started(inspector: &switchboard::Inspector, id: &str) {
    inspector
        .wait_for(id, "StartActivity", std::time::Duration::from_secs(5))
        .await
        .unwrap();
}

/// A fresh folder under the system's temporary folder, removed (with what is in it) when
/// dropped.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("switchboard-{label}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Restores `snapshot` on the test's engine with `agents` and `llm`, with no grace period
/// for tools (as the process that died gave them none).
pub async fn restored(
    snapshot: switchboard::snapshot::SessionSnapshot,
    agents: switchboard::snapshot::AgentRegistry,
    llm: Arc<dyn switchboard::Llm>,
) -> Session {
    Session::builder()
        .llm(llm)
        .restore(snapshot, agents)
        .grace_period(std::time::Duration::ZERO)
        .start(&Engine::current().unwrap())
        .await
        .unwrap()
}
