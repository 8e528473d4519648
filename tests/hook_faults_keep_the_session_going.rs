//! SPEC §2a: a fault in user code does not take the session down. Lifecycle hooks that
//! panic — before returning their future, or while it runs — and an
//! `on_user_turn_completed` that panics each give an error event; the handoff completes,
//! the reply goes ahead, and the session keeps working.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::wait_event;
use switchboard::prelude::*;
use switchboard::testing::{Reply, ScriptedLlm};

fn error_containing(text: &'static str) -> impl FnMut(&SessionEvent) -> Option<String> {
    move |event| match event {
        SessionEvent::Error { message } if message.contains(text) => Some(message.clone()),
        _ => None,
    }
}

#[actix::test]
async fn panicking_hooks_are_reported_and_the_conversation_goes_on() {
    let llm = ScriptedLlm::new([]);
    llm.otherwise(Reply::text("Still here."));
    let first = Agent::builder("first")
        .on_exit(|_ctx| async move { panic!("on_exit failed") })
        .on_user_turn_completed(|_chat, _message| panic!("turn hook failed"))
        .build()
        .unwrap();
    #[allow(unreachable_code)]
    let second = Agent::builder("second")
        .on_enter(|_ctx| -> std::future::Ready<()> { panic!("on_enter failed before its future") })
        .build()
        .unwrap();
    let session = Session::builder()
        .llm(llm)
        .agent(first)
        .start(&Engine::current().unwrap())
        .await
        .unwrap();
    let mut events = session.subscribe();

    let result = session.run("hello").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Still here."]
    );
    wait_event(&mut events, error_containing("turn hook failed")).await;

    session.update_agent(second).await.unwrap();
    wait_event(&mut events, error_containing("on_exit failed")).await;
    wait_event(
        &mut events,
        error_containing("on_enter failed before its future"),
    )
    .await;
    assert_eq!(session.current_agent().await.unwrap(), "second");
    let result = session.run("and now?").await.unwrap();
    assert_eq!(
        result.assistant_messages().collect::<Vec<_>>(),
        ["Still here."]
    );
    session.close().await.unwrap();
}
