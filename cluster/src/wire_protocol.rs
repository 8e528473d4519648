#![doc = include_str!("../docs/wire-protocol.md")]
//!
//! (This module holds no code: it is the page, and the test that keeps the page true.)

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;
    use serde_json::{json, Value};
    use switchboard::{ChatItem, ChatRole, FunctionCall, FunctionCallOutput, LlmUsage, SpeechId};

    use crate::namespace::{Namespace, SessionKey};
    use crate::ownership::{OwnerRecord, OwnerState};
    use crate::permissions::Permissions;
    use crate::protocol::{Answer, Input, Reply, Request, SessionJob, WorkerInfo};
    use crate::remote_event::{
        EndReason, InputOutcome, RemoteAgentChat, RemoteAgentState, RemoteEvent, RemoteEventKind,
        RemoteFailure, RemoteHistory, RemoteRunResult, RemoteUserState,
    };
    use crate::snapshots::SnapshotKind;
    use crate::spec::{OutputMode, SessionSpec};

    /// The page, as the crate's docs include it.
    const PAGE: &str = include_str!("../docs/wire-protocol.md");

    /// Set to write the code's JSON into the page's examples instead of failing.
    const BLESS: &str = "WIRE_PROTOCOL_BLESS";

    /// The marker before each example: `<!-- wire: NAME -->`, then a ```json block.
    const MARKER: &str = "<!-- wire: ";

    fn speech(n: u64) -> SpeechId {
        serde_json::from_value(json!(n)).unwrap()
    }

    fn key() -> SessionKey {
        SessionKey::new("call-42").unwrap()
    }

    fn user(text: &str) -> ChatItem {
        ChatItem::message(ChatRole::User, text)
    }

    fn assistant(text: &str) -> ChatItem {
        ChatItem::message(ChatRole::Assistant, text)
    }

    fn call() -> FunctionCall {
        FunctionCall {
            call_id: "call_7".into(),
            name: "find_table".into(),
            arguments: r#"{"party":2}"#.into(),
        }
    }

    fn output() -> FunctionCallOutput {
        FunctionCallOutput {
            call_id: "call_7".into(),
            name: "find_table".into(),
            output: "a table at 8 pm".into(),
            is_error: false,
        }
    }

    fn turn() -> RemoteRunResult {
        RemoteRunResult {
            items: vec![
                user("a table for two"),
                ChatItem::FunctionCall(call()),
                ChatItem::FunctionCallOutput(output()),
                assistant("I have a table at 8 pm."),
            ],
            interrupted: false,
            ..RemoteRunResult::default()
        }
    }

    fn event(seq: u64, kind: RemoteEventKind) -> RemoteEvent {
        RemoteEvent {
            seq,
            epoch: 1,
            kind,
        }
    }

    /// One value of every kind of event. Matched without a wildcard, so a new kind does not
    /// compile until it has its example here and on the page.
    fn event_kinds() -> Vec<RemoteEventKind> {
        use RemoteEventKind as K;
        let kinds = vec![
            K::SessionStarted,
            K::StartFailed {
                reason: "no agent named \"booker\"".into(),
            },
            K::InputDone {
                input: 3,
                outcome: InputOutcome::Turn { result: Ok(turn()) },
            },
            K::SessionMoving,
            K::SessionResumed { last_input: 5 },
            K::SessionEnded {
                reason: EndReason::Closed,
            },
            K::EventsLost { from: 12, to: 15 },
            K::EventsDropped { missed: 4 },
            K::UserInputTranscribed {
                text: "a table for".into(),
                is_final: false,
            },
            K::UserStateChanged {
                state: RemoteUserState::Speaking,
            },
            K::ChatContextSet {
                agent: "receptionist".into(),
                items: vec![user("hello"), assistant("Hello, how can I help?")],
            },
            K::ConversationItemAdded {
                agent: "receptionist".into(),
                item: user("a table for two"),
            },
            K::ConversationItemChanged {
                agent: "receptionist".into(),
                index: 3,
                item: assistant("I have a table"),
            },
            K::ConversationItemRemoved {
                agent: "receptionist".into(),
                index: 3,
            },
            K::DeferredReply {
                agent: "receptionist".into(),
                call_ids: vec!["call_7/finished".into()],
                requested: true,
            },
            K::FunctionToolsExecuted {
                agent: "receptionist".into(),
                calls: vec![call()],
                outputs: vec![output()],
            },
            K::AgentStateChanged {
                agent: "receptionist".into(),
                state: RemoteAgentState::Thinking,
            },
            K::SpeechCreated {
                agent: "receptionist".into(),
                speech: speech(3),
            },
            K::SpeechPlayedOut {
                speech: speech(3),
                interrupted: true,
                heard: Some("I have a".into()),
            },
            K::AgentFalseInterruption { resumed: true },
            K::AgentHandoff {
                from: Some("receptionist".into()),
                to: "booker".into(),
            },
            K::LlmMetrics {
                agent: "receptionist".into(),
                llm: "gpt-4o-mini".into(),
                time_to_first_chunk_ms: Some(212.5),
                duration_ms: 640.0,
                usage: Some(LlmUsage {
                    prompt_tokens: 812,
                    completion_tokens: 14,
                    cached_prompt_tokens: Some(768),
                    ..LlmUsage::default()
                }),
                cancelled: false,
            },
            K::TurnInterrupted {
                agent: "receptionist".into(),
            },
            K::TurnMetrics {
                agent: "receptionist".into(),
                usage: switchboard::Usage {
                    requests: 2,
                    prompt_tokens: 1624,
                    cached_prompt_tokens: 1536,
                    completion_tokens: 28,
                    ..switchboard::Usage::default()
                },
                latency: switchboard::TurnLatency {
                    end_to_first_audio: Some(std::time::Duration::from_millis(742)),
                    time_to_first_token: Some(std::time::Duration::from_millis(212)),
                    tools: std::time::Duration::from_millis(35),
                    preemptive: false,
                },
                interrupted: false,
            },
            K::UserWordsIgnored {
                text: "uh-huh".into(),
                reason: switchboard::IgnoredWords::Backchannel,
            },
            K::UserTurnExceeded {
                transcript: "so first I ordered the blue one and then".into(),
                words: 9,
                duration_ms: 12500.0,
            },
            K::Error {
                message: "the model did not answer in 30s".into(),
            },
            K::Closed,
            K::SpeechStarted {
                speech: speech(3),
                agent: "receptionist".into(),
            },
            K::SpeechChunk {
                speech: speech(3),
                text: "I have a table ".into(),
            },
            K::SpeechFinished { speech: speech(3) },
            K::SpeechInterrupted { speech: speech(3) },
            K::SpeechPaused { speech: speech(3) },
            K::SpeechResumed { speech: speech(3) },
        ];
        for kind in &kinds {
            // A new kind: add an example above, a marker on the page, and bless.
            match kind {
                K::SessionStarted
                | K::StartFailed { .. }
                | K::InputDone { .. }
                | K::SessionMoving
                | K::SessionResumed { .. }
                | K::SessionEnded { .. }
                | K::EventsLost { .. }
                | K::EventsDropped { .. }
                | K::UserInputTranscribed { .. }
                | K::UserStateChanged { .. }
                | K::ChatContextSet { .. }
                | K::ConversationItemAdded { .. }
                | K::ConversationItemChanged { .. }
                | K::ConversationItemRemoved { .. }
                | K::DeferredReply { .. }
                | K::FunctionToolsExecuted { .. }
                | K::AgentStateChanged { .. }
                | K::SpeechCreated { .. }
                | K::SpeechPlayedOut { .. }
                | K::AgentFalseInterruption { .. }
                | K::AgentHandoff { .. }
                | K::LlmMetrics { .. }
                | K::TurnInterrupted { .. }
                | K::TurnMetrics { .. }
                | K::UserWordsIgnored { .. }
                | K::UserTurnExceeded { .. }
                | K::Error { .. }
                | K::Closed
                | K::SpeechStarted { .. }
                | K::SpeechChunk { .. }
                | K::SpeechFinished { .. }
                | K::SpeechInterrupted { .. }
                | K::SpeechPaused { .. }
                | K::SpeechResumed { .. } => {}
            }
        }
        kinds
    }

    fn inputs() -> Vec<Input> {
        let inputs = vec![
            Input::Run {
                text: "I'd like a table for two".into(),
            },
            Input::GenerateReply {
                instructions: Some("Greet the caller.".into()),
            },
            Input::Say {
                text: "One moment, please.".into(),
                allow_interruptions: Some(false),
                add_to_chat: true,
            },
            Input::Transcript {
                text: "a table for".into(),
                is_final: false,
            },
            Input::UserStartedSpeaking,
            Input::UserStoppedSpeaking,
            Input::Interrupt { force: false },
            Input::UpdateAgent {
                agent: "booker".into(),
                data: json!({ "party": 2 }),
            },
            Input::PlayoutFinished {
                speech: speech(3),
                interrupted: true,
                heard: Some("I have a".into()),
            },
            Input::History,
            Input::Close,
        ];
        // `Input::name` matches every input without a wildcard: a new one has no name
        // until it is added there, and then this test asks for its example.
        let names: Vec<&str> = inputs.iter().map(Input::name).collect();
        assert_eq!(
            names,
            [
                "run",
                "generate_reply",
                "say",
                "transcript",
                "user_started_speaking",
                "user_stopped_speaking",
                "interrupt",
                "update_agent",
                "playout_finished",
                "history",
                "close"
            ]
        );
        inputs
    }

    fn failures() -> Vec<RemoteFailure> {
        let failures = vec![
            RemoteFailure::Closed,
            RemoteFailure::Uninterruptible,
            RemoteFailure::QueueFull { limit: 32 },
            RemoteFailure::Build {
                message: "agent booker: no model".into(),
            },
            RemoteFailure::TurnFailed {
                message: "the model did not answer in 30s".into(),
                result: Box::new(RemoteRunResult {
                    items: vec![user("a table for two")],
                    interrupted: false,
                    ..RemoteRunResult::default()
                }),
            },
            RemoteFailure::Factory {
                message: "no agent named \"booker\" (known: receptionist)".into(),
            },
            RemoteFailure::Engine {
                message: "the session refused the handoff".into(),
            },
        ];
        for failure in &failures {
            match failure {
                RemoteFailure::Closed
                | RemoteFailure::Uninterruptible
                | RemoteFailure::QueueFull { .. }
                | RemoteFailure::Build { .. }
                | RemoteFailure::TurnFailed { .. }
                | RemoteFailure::Factory { .. }
                | RemoteFailure::Engine { .. } => {}
            }
        }
        failures
    }

    fn end_reasons() -> Vec<EndReason> {
        let reasons = vec![
            EndReason::Closed,
            EndReason::Drained,
            EndReason::Idle,
            EndReason::Fenced,
        ];
        for reason in &reasons {
            match reason {
                EndReason::Closed | EndReason::Drained | EndReason::Idle | EndReason::Fenced => {}
            }
        }
        reasons
    }

    fn replies() -> Vec<Reply> {
        let replies = vec![
            Reply::Applied {
                id: 3,
                answer: Answer::Pending,
                saved: 2,
            },
            Reply::Earlier { id: 2, last: 5 },
            Reply::Ended {
                reason: EndReason::Idle,
            },
            Reply::Moving,
            Reply::OutOfOrder { expected: 4 },
            Reply::Replay {
                events: vec![event(
                    12,
                    RemoteEventKind::SpeechChunk {
                        speech: speech(3),
                        text: "I have a table ".into(),
                    },
                )],
                complete: true,
            },
        ];
        for reply in &replies {
            match reply {
                Reply::Applied { .. }
                | Reply::Earlier { .. }
                | Reply::Ended { .. }
                | Reply::Moving
                | Reply::OutOfOrder { .. }
                | Reply::Replay { .. } => {}
            }
        }
        replies
    }

    fn answers() -> Vec<Answer> {
        let answers = vec![
            Answer::Done,
            Answer::Pending,
            Answer::Speech { speech: speech(3) },
            Answer::Failed {
                failure: RemoteFailure::Factory {
                    message: "no agent named \"booker\" (known: receptionist)".into(),
                },
            },
        ];
        for answer in &answers {
            match answer {
                Answer::Done | Answer::Pending | Answer::Speech { .. } | Answer::Failed { .. } => {}
            }
        }
        answers
    }

    fn outcomes() -> Vec<InputOutcome> {
        let outcomes = vec![
            InputOutcome::Turn { result: Ok(turn()) },
            InputOutcome::Done { result: Ok(()) },
            InputOutcome::History {
                history: RemoteHistory {
                    agents: vec![RemoteAgentChat {
                        agent: "receptionist".into(),
                        activity: "activity/call-42/receptionist#1".into(),
                        items: vec![user("hello"), assistant("Hello, how can I help?")],
                        inherited: 0,
                        live: true,
                    }],
                },
            },
        ];
        for outcome in &outcomes {
            match outcome {
                InputOutcome::Turn { .. }
                | InputOutcome::Done { .. }
                | InputOutcome::History { .. } => {}
            }
        }
        outcomes
    }

    /// The tag a value's JSON carries in `field`.
    fn tag(value: &impl Serialize, field: &str) -> String {
        let json = serde_json::to_value(value).unwrap();
        json[field].as_str().unwrap().to_owned()
    }

    /// Every example of the page, by name, as the code writes it.
    fn examples() -> BTreeMap<String, Example> {
        let mut out = BTreeMap::new();
        let mut add = |name: String, value: Example| {
            assert!(out.insert(name.clone(), value).is_none(), "{name} twice");
        };

        add(
            "job.start".into(),
            json_of(&SessionJob {
                session: key(),
                spec: Some(
                    SessionSpec::new("receptionist")
                        .data(json!({ "caller": "+44 20 7946 0000" }))
                        .output(OutputMode::Voice { pausable: true }),
                ),
                lapsed: None,
            }),
        );
        add(
            "job.resume".into(),
            json_of(&SessionJob {
                session: key(),
                spec: None,
                lapsed: None,
            }),
        );
        add(
            "job.resume_lapsed".into(),
            json_of(&SessionJob {
                session: key(),
                spec: None,
                lapsed: Some(17),
            }),
        );
        for input in inputs() {
            let name = format!("request.input.{}", input.name());
            add(name, json_of(&Request::Input { id: 3, input }));
        }
        add(
            "request.replay".into(),
            json_of(&Request::Replay { from: 12, epoch: 2 }),
        );
        for reply in replies() {
            add(format!("reply.{}", tag(&reply, "reply")), json_of(&reply));
        }
        for answer in answers() {
            add(
                format!("answer.{}", tag(&answer, "answer")),
                json_of(&answer),
            );
        }
        add(
            "events.batch".into(),
            json_of(&vec![
                event(
                    7,
                    RemoteEventKind::SpeechChunk {
                        speech: speech(3),
                        text: "I have a table ".into(),
                    },
                ),
                event(
                    8,
                    RemoteEventKind::SpeechChunk {
                        speech: speech(3),
                        text: "at 8 pm.".into(),
                    },
                ),
                event(9, RemoteEventKind::SpeechFinished { speech: speech(3) }),
            ]),
        );
        for kind in event_kinds() {
            add(format!("event.{}", tag(&kind, "type")), json_of(&kind));
        }
        add(
            "agent_states".into(),
            json_of(&[
                RemoteAgentState::Initializing,
                RemoteAgentState::Listening,
                RemoteAgentState::Thinking,
                RemoteAgentState::Speaking,
                RemoteAgentState::Other,
            ]),
        );
        add(
            "user_states".into(),
            json_of(&[
                RemoteUserState::Speaking,
                RemoteUserState::Listening,
                RemoteUserState::Away,
                RemoteUserState::Other,
            ]),
        );
        for outcome in outcomes() {
            add(
                format!("outcome.{}", tag(&outcome, "kind")),
                json_of(&outcome),
            );
        }
        for failure in failures() {
            add(
                format!("failure.{}", tag(&failure, "kind")),
                json_of(&failure),
            );
        }
        for reason in end_reasons() {
            add(
                format!("end_reason.{}", tag(&reason, "reason")),
                json_of(&reason),
            );
        }
        add(
            "worker_info".into(),
            json_of(&WorkerInfo {
                name: "worker-1".into(),
                capacity: 100,
                live: 37,
                max_live: 52,
                jobs_pulled: 1206,
                started: 1204,
                ended: 1167,
                refused: 2,
                inputs_applied: 18_311,
                inputs_repeated: 9,
                fenced: 0,
                resumed: 14,
                moved: 0,
                snapshot_writes_refused: 0,
                snapshot_writes: 20_480,
                snapshot_write_failures: 1,
                draining: false,
            }),
        );
        for state in [OwnerState::Running, OwnerState::Moving, OwnerState::Ended] {
            let record = OwnerRecord {
                worker: "worker-1".into(),
                epoch: 2,
                state,
            };
            add(format!("owner.{}", tag(&record, "state")), json_of(&record));
        }
        out
    }

    /// An example as the code sends it: its JSON, and its text in the fields' own order.
    struct Example {
        value: Value,
        text: String,
    }

    /// How an example is written on the page: on one line when short, else indented.
    fn json_of(value: &impl Serialize) -> Example {
        let line = serde_json::to_string(value).unwrap();
        let text = if line.len() <= 96 {
            line
        } else {
            serde_json::to_string_pretty(value).unwrap()
        };
        Example {
            value: serde_json::to_value(value).unwrap(),
            text: text + "\n",
        }
    }

    /// An example of the page: its name, where its JSON text lies, and the JSON.
    struct Block {
        name: String,
        text: std::ops::Range<usize>,
        value: Option<Value>,
    }

    /// Every `<!-- wire: NAME -->` of `page` and the ```json block after it.
    fn blocks(page: &str) -> Vec<Block> {
        let mut found = Vec::new();
        let mut at = 0;
        while let Some(start) = page[at..].find(MARKER) {
            let start = at + start + MARKER.len();
            let end = start + page[start..].find(" -->").unwrap();
            let name = page[start..end].to_owned();
            let open = end + page[end..].find("```json\n").unwrap() + "```json\n".len();
            let close = open + page[open..].find("```").unwrap();
            found.push(Block {
                name,
                text: open..close,
                value: serde_json::from_str(&page[open..close]).ok(),
            });
            at = close;
        }
        found
    }

    #[test]
    fn every_message_on_the_page_is_the_one_the_code_sends() {
        let expected = examples();
        let found = blocks(PAGE);
        if std::env::var_os(BLESS).is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/wire-protocol.md");
            let mut page = PAGE.to_owned();
            for block in found.iter().rev() {
                if let Some(example) = expected.get(&block.name) {
                    page.replace_range(block.text.clone(), &example.text);
                }
            }
            std::fs::write(path, page).unwrap();
        }
        let on_page: Vec<&str> = found.iter().map(|b| b.name.as_str()).collect();
        let missing: Vec<&String> = expected
            .keys()
            .filter(|name| !on_page.contains(&name.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "examples the page lacks (add `<!-- wire: NAME -->` and a ```json block, then \
             run with {BLESS}=1): {missing:?}"
        );
        let mut wrong = Vec::new();
        for block in &found {
            match expected.get(&block.name) {
                None => wrong.push(format!(
                    "{}: the code sends nothing of that name",
                    block.name
                )),
                Some(example) if block.value.as_ref() != Some(&example.value) => {
                    wrong.push(format!("{}: the code sends\n{}", block.name, example.text))
                }
                Some(_) => {}
            }
        }
        assert!(
            wrong.is_empty(),
            "the page differs from the code (run with {BLESS}=1 to write the code's JSON):\n{}",
            wrong.join("\n")
        );
    }

    /// Every name a default cluster uses, and every subject of its roles' permissions, is
    /// on the page as the code spells it.
    #[test]
    fn the_names_and_permissions_on_the_page_are_the_code_s() {
        let ns = Namespace::default();
        let id = key();
        let placeholder = |name: String| name.replace(id.as_str(), "<id>");
        let mut names = vec![
            ns.jobs_subject(),
            ns.jobs_stream(),
            ns.jobs_consumer().to_owned(),
            ns.owners_bucket(),
            placeholder(ns.snapshot_subject(&id)),
            ns.snapshots_stream(),
            placeholder(ns.session_inputs(&id)),
            placeholder(ns.session_events(&id)),
            ns.worker_info("<name>"),
        ];
        for kind in [
            SnapshotKind::Claim,
            SnapshotKind::Full,
            SnapshotKind::Delta,
            SnapshotKind::Ended,
        ] {
            names.push(kind.as_str().to_owned());
        }
        names.extend(crate::snapshots::HEADERS.iter().map(|h| (*h).to_owned()));
        for name in &names {
            assert!(
                PAGE.contains(&format!("`{name}`")),
                "`{name}` is not on the page"
            );
        }
        let row = |role: &str, permissions: &Permissions| {
            let list = |subjects: &[String]| {
                subjects
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "| {role} | {} | {} |",
                list(&permissions.publish),
                list(&permissions.subscribe)
            )
        };
        let gateway = row("gateway", &Permissions::gateway(&ns));
        let worker = row(
            "worker (answers requests: `allow_responses`)",
            &Permissions::worker(&ns),
        );
        for line in [gateway, worker] {
            assert!(
                PAGE.lines().any(|l| l == line),
                "the page's permissions differ from the code's; the code's row:\n{line}"
            );
        }
    }
}
