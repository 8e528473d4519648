//! SPEC §7 logging: expected errors (`ToolError`, `StopResponse`, argument errors) are
//! logged without a backtrace; an unexpected error is logged once, with its cause chain.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::Query;
use serde_json::json;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// One captured log event: level and all fields as text.
#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    text: String,
}

/// A tiny subscriber that keeps every event (what a `tracing-subscriber` test layer
/// would do, without the dependency).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            text: fields.0,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Capture {
    fn events(&self) -> Vec<Captured> {
        self.0.lock().unwrap().clone()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("ledger offline")]
struct LedgerOffline;

#[derive(Debug, thiserror::Error)]
#[error("could not post the entry")]
struct PostFailed(#[source] LedgerOffline);

#[actix::test]
async fn expected_errors_have_no_backtrace_and_unexpected_ones_are_logged_once() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());

    let declined = Tool::new("pay", "Pays", |_ctx: RunContext, _: Query| async move {
        Err::<(), _>(ToolError::new("card declined").into())
    });
    let post = Tool::new("post", "Posts", |_ctx: RunContext, _: Query| async move {
        Err::<(), _>(PostFailed(LedgerOffline).into())
    });
    let llm = ScriptedLlm::new([Reply::tool_call("pay", json!({"q": "x"}))
        .and_tool_call("post", json!({"q": "y"}))
        .and_raw_tool_call("c3", "pay", "{oops")]);
    llm.otherwise(Reply::text("Sorry."));
    let session = Session::builder()
        .llm(llm)
        .agent(
            Agent::builder("agent-a")
                .tool(declined)
                .tool(post)
                .build()
                .unwrap(),
        )
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    session.run("pay and post").await.unwrap();
    session.close().await.unwrap();

    let events = capture.events();
    let about = |needle: &str| -> Vec<Captured> {
        events
            .iter()
            .filter(|e| e.text.contains(needle))
            .cloned()
            .collect()
    };
    // The ToolError: one warn line, no backtrace.
    let declined = about("card declined");
    assert_eq!(declined.len(), 1, "{events:#?}");
    assert_eq!(declined[0].level, Level::WARN);
    assert!(!declined[0].text.to_lowercase().contains("backtrace"));
    // The unexpected error: exactly one error line, with its whole cause chain.
    let failed = about("could not post the entry");
    assert_eq!(failed.len(), 1, "logged once: {events:#?}");
    assert_eq!(failed[0].level, Level::ERROR);
    assert!(
        failed[0].text.contains("caused by: ledger offline"),
        "{:?}",
        failed[0]
    );
    // The argument error: a warning, not an error.
    let parse = about("did not parse");
    assert_eq!(parse.len(), 1, "{events:#?}");
    assert_eq!(parse[0].level, Level::WARN);
    assert!(events
        .iter()
        .all(|e| !e.text.to_lowercase().contains("backtrace")));
}

#[test]
#[allow(deprecated)]
fn a_toolset_wide_duplicate_policy_warns_once() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let tool = || {
        Tool::new("t", "T", |_ctx: RunContext, _: Query| async move {
            Ok::<_, ToolFailure>(())
        })
    };
    let _a = Toolset::new("one")
        .tool(tool())
        .on_duplicate(DuplicatePolicy::Allow);
    let _b = Toolset::new("two")
        .tool(tool())
        .on_duplicate(DuplicatePolicy::Reject);
    let warnings: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.text.contains("deprecated"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(warnings[0].level, Level::WARN);
}
