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
use switchboard::ChatContext;
use tokio::sync::watch;

/// Arguments of test tools.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct Query {
    pub q: String,
}

/// A gate a test opens to let a tool body go on: explicit synchronisation, no sleeps.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }
    pub fn open(&self) {
        self.0.send_replace(true);
    }
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
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

/// Asserts SPEC §2's invariant with a readable failure.
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

/// Waits (up to 5 s of real time) for the first event matching `pred`, returning it.
pub async fn wait_event<T>(
    rx: &mut tokio::sync::broadcast::Receiver<SessionEvent>,
    mut pred: impl FnMut(&SessionEvent) -> Option<T>,
) -> T {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    if let Some(found) = pred(&event) {
                        return found;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    panic!("event subscriber lagged by {n}")
                }
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), wait)
        .await
        .expect("the awaited event did not come")
}

/// Matches the event that adds the output with this call id.
pub fn output_added(call_id: &'static str) -> impl FnMut(&SessionEvent) -> Option<()> {
    move |event| match event {
        SessionEvent::ConversationItemAdded {
            item: ChatItem::FunctionCallOutput(o),
            ..
        } if o.call_id == call_id => Some(()),
        _ => None,
    }
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
