//! The protocol's rules, one test each, on the plain wire.

use super::*;
use crate::chat::{ChatItem, ChatMessage, FunctionCall, FunctionCallOutput};

fn wire() -> Wire {
    let mut wire = Wire::new(RealtimeSettings::new(), RealtimeCapabilities::OPENAI);
    let mut out = Vec::new();
    wire.connected(&mut out);
    wire.attach(
        AgentConfig {
            instructions: Arc::from("Be brief."),
            tools: Arc::from(Vec::new()),
            voice: None,
        },
        &ChatContext::new(),
        Instant::now(),
        &mut out,
    );
    wire
}

/// A wire whose step 1 was asked and whose response `r1` the server started; the clock
/// and the commands so far.
fn answering() -> (Wire, Instant, Vec<Out>) {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    wire.on_event(created(Some(1), "r1"), now, &mut out);
    (wire, now, out)
}

/// What went to the server, in short: `output call_a`, `call call_a`, `message`,
/// `response 2`, `delete c1`, `update`, or the event in full.
fn described(out: &[Out]) -> Vec<String> {
    sends(out)
        .into_iter()
        .map(|event| match event {
            ClientEvent::CreateItem { item, .. } => match item {
                RemoteItem::FunctionCallOutput { call_id, .. } => format!("output {call_id}"),
                RemoteItem::FunctionCall { call_id, .. } => format!("call {call_id}"),
                RemoteItem::Message { .. } => "message".to_owned(),
            },
            ClientEvent::CreateResponse { tag, .. } => format!("response {tag}"),
            ClientEvent::DeleteItem { id } => format!("delete {id}"),
            ClientEvent::UpdateSession(_) => "update".to_owned(),
            other => format!("{other:?}"),
        })
        .collect()
}

fn ask(step: u64) -> Ask {
    Ask {
        step,
        ..Ask::default()
    }
}

fn sends(out: &[Out]) -> Vec<&ClientEvent> {
    out.iter()
        .filter_map(|o| match o {
            Out::Send(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn creates(out: &[Out]) -> usize {
    sends(out)
        .iter()
        .filter(|e| matches!(e, ClientEvent::CreateResponse { .. }))
        .count()
}

fn cancels(out: &[Out]) -> usize {
    sends(out)
        .iter()
        .filter(|e| matches!(e, ClientEvent::CancelResponse { .. }))
        .count()
}

fn steps(out: &[Out]) -> Vec<(u64, &StepEvent)> {
    out.iter()
        .filter_map(|o| match o {
            Out::Step(step, e) => Some((*step, e)),
            _ => None,
        })
        .collect()
}

fn created(tag: Option<u64>, id: &str) -> ServerEvent {
    ServerEvent::ResponseCreated {
        response_id: id.to_owned(),
        tag,
    }
}

fn done(id: &str) -> ServerEvent {
    ServerEvent::ResponseDone {
        response_id: id.to_owned(),
        status: ResponseStatus::Completed,
        usage: None,
    }
}

fn speech_started(item: &str) -> ServerEvent {
    ServerEvent::SpeechStarted {
        item_id: item.to_owned(),
    }
}

fn speech_stopped(item: &str) -> ServerEvent {
    ServerEvent::SpeechStopped {
        item_id: item.to_owned(),
    }
}

fn committed(item: &str) -> ServerEvent {
    ServerEvent::AudioCommitted {
        item_id: item.to_owned(),
    }
}

fn message(id: &str) -> ServerEvent {
    ServerEvent::OutputItemAdded {
        response_id: "r".to_owned(),
        item_id: id.to_owned(),
        kind: OutputKind::Message,
    }
}

fn audio(item: &str, ms: usize) -> ServerEvent {
    ServerEvent::AudioDelta {
        item_id: item.to_owned(),
        audio: vec![0; ms * 48],
    }
}

fn call(item: &str, call_id: &str) -> ServerEvent {
    ServerEvent::FunctionCall {
        response_id: "r".to_owned(),
        item_id: item.to_owned(),
        call_id: call_id.to_owned(),
        name: "get_weather".to_owned(),
        arguments: "{}".to_owned(),
    }
}

fn chat_with_call(call_id: &str) -> ChatContext {
    let mut chat = ChatContext::new();
    chat.push(ChatItem::FunctionCall(FunctionCall {
        call_id: call_id.to_owned(),
        name: "get_weather".to_owned(),
        arguments: "{}".to_owned(),
    }));
    chat.push(ChatItem::FunctionCallOutput(FunctionCallOutput {
        call_id: call_id.to_owned(),
        name: "get_weather".to_owned(),
        output: "sunny".to_owned(),
        is_error: false,
    }));
    chat
}

#[test]
fn a_request_waits_while_a_response_is_active_and_goes_once_it_ended() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 1);
    wire.on_event(created(Some(1), "r1"), now, &mut out);
    out.clear();
    wire.open(ask(2), false, &ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 0, "one response at a time");
    wire.on_event(done("r1"), now, &mut out);
    assert_eq!(creates(&out), 1, "the waiting request goes once r1 ended");
}

#[test]
fn a_refused_request_is_asked_again_after_the_active_response() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    // The server answered the user's turn first and refuses ours.
    wire.on_event(created(None, "r_server"), now, &mut out);
    wire.on_event(
        ServerEvent::Error {
            code: Some("conversation_already_has_active_response".to_owned()),
            message: "Conversation already has an active response".to_owned(),
            event_id: Some(crate::realtime::response_event_id(1)),
        },
        now,
        &mut out,
    );
    assert!(steps(&out).is_empty(), "no failure for an expected refusal");
    out.clear();
    wire.on_event(done("r_server"), now, &mut out);
    assert_eq!(creates(&out), 1);
}

#[test]
fn no_request_while_the_user_speaks_or_the_server_is_about_to_answer() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.on_event(speech_started("u1"), now, &mut out);
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 0);
    wire.on_event(speech_stopped("u1"), now, &mut out);
    wire.on_event(committed("u1"), now, &mut out);
    assert_eq!(creates(&out), 0, "the server answers the turn first");
    wire.on_event(created(None, "r_server"), now, &mut out);
    wire.on_event(done("r_server"), now, &mut out);
    assert_eq!(creates(&out), 1);
}

#[test]
fn the_user_turn_adopts_the_servers_response_with_every_event_in_order() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.on_event(committed("u1"), now, &mut out);
    wire.on_event(created(None, "r1"), now, &mut out);
    wire.on_event(message("a1"), now, &mut out);
    wire.on_event(audio("a1", 20), now, &mut out);
    out.clear();
    wire.open(ask(7), true, &ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 0);
    let got = steps(&out);
    assert_eq!(got.len(), 2);
    assert!(matches!(got[0], (7, StepEvent::Message { .. })));
    assert!(matches!(got[1], (7, StepEvent::Audio(_))));
    out.clear();
    wire.on_event(audio("a1", 20), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    let got = steps(&out);
    assert!(matches!(got[1], (7, StepEvent::Done { .. })));
}

#[test]
fn a_step_waiting_to_adopt_takes_the_next_server_response() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.on_event(committed("u1"), now, &mut out);
    wire.open(ask(3), true, &ChatContext::new(), now, &mut out);
    wire.on_event(created(None, "r1"), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    assert!(matches!(steps(&out)[..], [(3, StepEvent::Done { .. })]));
    assert_eq!(creates(&out), 0);
}

#[test]
fn without_a_server_answer_the_user_turn_asks_for_its_own() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.on_event(committed("u1"), now, &mut out);
    wire.open(ask(3), true, &ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 0);
    let later = now + AUTO_RESPONSE_WAIT;
    assert_eq!(wire.deadline(), Some(later));
    wire.tick(later, &mut out);
    assert_eq!(creates(&out), 1);
}

#[test]
fn a_server_cancelled_response_gets_no_second_cancel() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(speech_started("u2"), now, &mut out);
    out.clear();
    wire.cancel(1, &mut out);
    wire.cancel(1, &mut out);
    assert_eq!(cancels(&out), 0, "the server cancelled it itself");
}

#[test]
fn a_cancel_goes_once_and_the_cut_responses_events_are_dropped() {
    let (mut wire, now, mut out) = answering();
    out.clear();
    wire.cancel(1, &mut out);
    wire.cancel(1, &mut out);
    assert_eq!(cancels(&out), 1);
    out.clear();
    wire.on_event(audio("a1", 20), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    assert!(steps(&out).is_empty());
}

#[test]
fn a_request_cancelled_before_its_response_cancels_it_when_it_starts() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    wire.cancel(1, &mut out);
    out.clear();
    wire.on_event(created(Some(1), "r1"), now, &mut out);
    assert_eq!(cancels(&out), 1);
    // And one never sent is never sent.
    let mut wire = self::wire();
    let mut out = Vec::new();
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    wire.open(ask(2), false, &ChatContext::new(), now, &mut out);
    wire.cancel(2, &mut out);
    out.clear();
    wire.on_event(created(Some(1), "r1"), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    assert_eq!(creates(&out), 0);
}

#[test]
fn a_truncation_is_clamped_to_the_audio_received_and_waits_for_its_response() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(message("a1"), now, &mut out);
    wire.on_event(audio("a1", 300), now, &mut out);
    wire.spoke(SpeechId(1), "a1".to_owned());
    out.clear();
    wire.truncate(SpeechId(1), 900, &mut out);
    assert!(sends(&out).is_empty(), "held while its response runs");
    wire.on_event(audio("a1", 100), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    let cut: Vec<_> = sends(&out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::TruncateItem { id, audio_end_ms } => Some((id.clone(), *audio_end_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(cut, vec![("a1".to_owned(), 400)]);
    out.clear();
    wire.truncate(SpeechId(1), 100, &mut out);
    assert!(sends(&out).is_empty(), "once per item");
}

#[test]
fn a_truncation_of_a_cancelled_response_goes_at_once() {
    for server_cancelled in [true, false] {
        let (mut wire, now, mut out) = answering();
        wire.on_event(message("a1"), now, &mut out);
        wire.on_event(audio("a1", 300), now, &mut out);
        wire.spoke(SpeechId(1), "a1".to_owned());
        if server_cancelled {
            wire.on_event(speech_started("u1"), now, &mut out);
        } else {
            wire.cancel(1, &mut out);
        }
        out.clear();
        wire.truncate(SpeechId(1), 200, &mut out);
        assert_eq!(
            sends(&out),
            vec![&ClientEvent::TruncateItem {
                id: "a1".to_owned(),
                audio_end_ms: 200
            }],
            "before the response's end (server cancelled: {server_cancelled})"
        );
        out.clear();
        wire.on_event(audio("a1", 100), now, &mut out);
        wire.on_event(done("r1"), now, &mut out);
        assert!(sends(&out).is_empty(), "once per item");
    }
}

#[test]
fn nothing_heard_deletes_the_item_instead_of_truncating_to_zero() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(message("a1"), now, &mut out);
    wire.on_event(audio("a1", 60), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    wire.spoke(SpeechId(1), "a1".to_owned());
    out.clear();
    wire.truncate(SpeechId(1), 0, &mut out);
    assert_eq!(
        sends(&out),
        vec![&ClientEvent::DeleteItem {
            id: "a1".to_owned()
        }]
    );
}

#[test]
fn calls_of_a_cut_response_are_deleted_before_the_next_request() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(call("c1", "call_cut"), now, &mut out);
    wire.cancel(1, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    out.clear();
    wire.open(ask(2), false, &ChatContext::new(), now, &mut out);
    assert_eq!(described(&out), ["delete c1", "response 2"]);
}

#[test]
fn every_call_is_answered_before_the_response_that_follows() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(call("c1", "call_a"), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    out.clear();
    wire.open(ask(2), false, &chat_with_call("call_a"), now, &mut out);
    assert_eq!(described(&out), ["output call_a", "response 2"]);
}

#[test]
fn a_new_agent_updates_the_session_before_anything_of_its_chat_and_keeps_the_voice() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(message("a1"), now, &mut out);
    wire.on_event(audio("a1", 20), now, &mut out);
    wire.on_event(done("r1"), now, &mut out);
    out.clear();
    let mut chat = ChatContext::new();
    chat.push(ChatItem::Message(ChatMessage {
        role: ChatRole::User,
        content: "book a table".to_owned(),
        interrupted: false,
        speech: None,
    }));
    wire.attach(
        AgentConfig {
            instructions: Arc::from("You take bookings."),
            tools: Arc::from(Vec::new()),
            voice: Some("cedar".to_owned()),
        },
        &chat,
        now,
        &mut out,
    );
    let sent = sends(&out);
    let ClientEvent::UpdateSession(update) = sent[0] else {
        panic!("the update first: {sent:?}");
    };
    assert_eq!(update.instructions.as_deref(), Some("You take bookings."));
    assert_eq!(update.voice, None, "the model has spoken: no voice change");
    assert!(update.settings.is_none());
    assert!(matches!(sent[1], ClientEvent::CreateItem { .. }));
}

#[test]
fn a_drop_mid_answer_asks_again_after_the_replay_with_what_was_said() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(message("a1"), now, &mut out);
    wire.on_event(
        ServerEvent::TextDelta {
            item_id: "a1".to_owned(),
            delta: "It is sun".to_owned(),
        },
        now,
        &mut out,
    );
    out.clear();
    wire.dropped(&mut out);
    assert!(steps(&out).is_empty(), "the step goes on");
    wire.connected(&mut out);
    out.clear();
    wire.open(ask(2), false, &ChatContext::new(), now, &mut out);
    let sent = sends(&out);
    assert!(
        matches!(sent[0], ClientEvent::CreateItem { item: RemoteItem::Message { text, .. }, .. } if text == "It is sun")
    );
    assert!(matches!(
        sent[1],
        ClientEvent::CreateResponse { tag: 1, .. }
    ));
    assert_eq!(creates(&out), 1, "step 2 waits for step 1's response");
}

#[test]
fn a_drop_after_the_calls_came_ends_the_step_so_they_run() {
    let (mut wire, now, mut out) = answering();
    wire.on_event(call("c1", "call_a"), now, &mut out);
    out.clear();
    wire.dropped(&mut out);
    assert!(matches!(
        steps(&out)[..],
        [(1, StepEvent::Done { failure: None, .. })]
    ));
    // On the new connection the call is replayed with its output, then the next step.
    wire.connected(&mut out);
    out.clear();
    wire.open(ask(2), false, &chat_with_call("call_a"), now, &mut out);
    assert_eq!(
        described(&out),
        ["call call_a", "output call_a", "response 2"]
    );
}

#[test]
fn requests_wait_for_the_replay_after_a_reconnection() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.dropped(&mut out);
    wire.connected(&mut out);
    out.clear();
    // An open carries its chat: that sync is the replay.
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 1);
    let mut wire = self::wire();
    let mut out = Vec::new();
    wire.open(ask(1), false, &ChatContext::new(), now, &mut out);
    wire.dropped(&mut out);
    wire.connected(&mut out);
    out.clear();
    wire.tick(now, &mut out);
    assert_eq!(
        creates(&out),
        0,
        "the request in flight waits for the replay"
    );
    wire.sync(&ChatContext::new(), now, &mut out);
    assert_eq!(creates(&out), 1);
}

#[test]
fn the_first_update_of_each_connection_carries_the_settings_and_the_agent() {
    let mut wire = wire();
    let mut out = Vec::new();
    wire.dropped(&mut out);
    wire.connected(&mut out);
    let sent = sends(&out);
    let ClientEvent::UpdateSession(update) = sent[0] else {
        panic!("{sent:?}");
    };
    assert!(update.settings.is_some());
    assert_eq!(update.instructions.as_deref(), Some("Be brief."));
}

#[test]
fn heard_turns_and_transcripts_go_to_the_session() {
    let mut wire = wire();
    let now = Instant::now();
    let mut out = Vec::new();
    wire.on_event(speech_started("u1"), now, &mut out);
    wire.on_event(committed("u1"), now, &mut out);
    wire.on_event(
        ServerEvent::InputTranscript {
            item_id: "u1".to_owned(),
            transcript: "hello".to_owned(),
        },
        now,
        &mut out,
    );
    let users: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Out::User(u) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(
        users,
        vec![
            &UserSignal::Started,
            &UserSignal::Heard {
                item: "u1".to_owned()
            },
            &UserSignal::Transcript {
                item: "u1".to_owned(),
                text: "hello".to_owned()
            }
        ]
    );
}
