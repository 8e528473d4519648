#![doc = include_str!("../docs/wire-protocol.md")]
//!
//! (This module holds no code: it is the page, and the test that keeps the page true.)

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;
    use serde_json::{json, Value};
    use std::time::Duration;
    use switchboard::{
        AgentState, AgentWork, BuildError, ChatContext, ChatItem, ChatRole, DeferredReplyDecision,
        FunctionCall, FunctionCallOutput, IgnoredWords, LlmMetrics, LlmUsage, RunResult,
        SessionError, SessionEvent, SessionHistory, SpeechHandle, SpeechId, TurnFailure,
        TurnMetrics, Unfinished, UserState,
    };

    use crate::lease::{LeaseRecord, LeaseState};
    use crate::namespace::{Namespace, SessionKey};
    use crate::ownership::{OwnerRecord, OwnerState};
    use crate::permissions::Permissions;
    use crate::protocol::{
        Answer, EventPart, Failure, Input, InputOutcome, Reply, Request, SessionJob, WireElement,
        WireEvent, WireEventKind, WorkerInfo,
    };
    use crate::remote_event::{CloseReason, RemoteEventKind};
    use crate::snapshots::SnapshotKind;
    use crate::spec::{FactoryError, OutputMode, SessionSpec};

    /// The page, as the crate's docs include it.
    const PAGE: &str = include_str!("../docs/wire-protocol.md");

    /// Set to write the code's JSON into the page's examples instead of failing.
    const BLESS: &str = "WIRE_PROTOCOL_BLESS";

    /// The marker before each example: `<!-- wire: NAME -->`, then a ```json block.
    const MARKER: &str = "<!-- wire: ";

    fn speech(n: u64) -> SpeechId {
        serde_json::from_value(json!(n)).unwrap()
    }

    fn speech_handle(n: u64) -> SpeechHandle {
        serde_json::from_value(json!({ "id": n, "allow_interruptions": true })).unwrap()
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

    fn turn() -> RunResult {
        RunResult {
            events: vec![
                user("a table for two"),
                ChatItem::FunctionCall(call()),
                ChatItem::FunctionCallOutput(output()),
                assistant("I have a table at 8 pm."),
            ],
            interrupted: false,
            ..RunResult::default()
        }
    }

    fn event(seq: u64, kind: RemoteEventKind) -> WireEvent {
        WireEvent {
            seq,
            epoch: 1,
            kind: WireEventKind::Event(kind),
        }
    }

    /// One value of every kind of the cluster's own events (the engine's come as
    /// `session`, below). Matched without a wildcard, so a new kind does not compile until
    /// it has its example here and on the page.
    fn event_kinds() -> Vec<WireEventKind> {
        use RemoteEventKind as K;
        let kinds = vec![
            K::SessionStarted,
            K::StartFailed {
                reason: "no agent named \"booker\"".into(),
            },
            K::SessionMoving,
            K::SessionResumed { last_input: 5 },
            K::SessionClosed {
                reason: CloseReason::Host,
            },
            K::EventsLost { from: 12, to: 15 },
            K::EventsDropped { missed: 4 },
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
                K::Session { .. }
                | K::SessionStarted
                | K::StartFailed { .. }
                | K::SessionMoving
                | K::SessionResumed { .. }
                | K::SessionClosed { .. }
                | K::EventsLost { .. }
                | K::EventsDropped { .. }
                | K::SpeechStarted { .. }
                | K::SpeechChunk { .. }
                | K::SpeechFinished { .. }
                | K::SpeechInterrupted { .. }
                | K::SpeechPaused { .. }
                | K::SpeechResumed { .. } => {}
            }
        }
        let mut kinds: Vec<WireEventKind> = kinds.into_iter().map(WireEventKind::Event).collect();
        kinds.push(WireEventKind::InputDone {
            input: 3,
            outcome: InputOutcome::Turn { result: Ok(turn()) },
        });
        kinds
    }

    /// One of every engine event, as the engine serializes it (the engine's enum may grow:
    /// a new kind travels as the engine writes it, and is added here with its example).
    fn session_events() -> Vec<SessionEvent> {
        use SessionEvent as E;
        vec![
            E::UserInputTranscribed {
                text: "a table for".into(),
                is_final: false,
            },
            E::UserStateChanged {
                state: UserState::Speaking,
            },
            E::ChatContextSet {
                agent: "receptionist".into(),
                chat: ChatContext::from(vec![user("hello"), assistant("Hello, how can I help?")]),
            },
            E::ConversationItemAdded {
                agent: "receptionist".into(),
                item: user("a table for two"),
            },
            E::ConversationItemChanged {
                agent: "receptionist".into(),
                index: 3,
                item: assistant("I have a table"),
            },
            E::ConversationItemRemoved {
                agent: "receptionist".into(),
                index: 3,
            },
            E::DeferredReply {
                agent: "receptionist".into(),
                call_ids: vec!["call_7/finished".into()],
                decision: DeferredReplyDecision::Requested,
            },
            E::FunctionToolsExecuted {
                agent: "receptionist".into(),
                calls: vec![call()],
                outputs: vec![output()],
            },
            E::AgentStateChanged {
                agent: "receptionist".into(),
                state: AgentState::Thinking,
            },
            E::SpeechCreated {
                agent: "receptionist".into(),
                speech: speech_handle(3),
            },
            E::SpeechPlayedOut {
                speech: speech(3),
                interrupted: true,
                heard: Some("I have a".into()),
            },
            E::AgentFalseInterruption { resumed: true },
            E::AgentHandoff {
                from: Some("receptionist".into()),
                to: "booker".into(),
            },
            E::LlmMetrics(LlmMetrics {
                agent: "receptionist".into(),
                llm: "gpt-4o-mini".into(),
                time_to_first_chunk: Some(Duration::from_micros(212_500)),
                duration: Duration::from_millis(640),
                text_chunks: 9,
                tool_calls: 0,
                usage: Some(LlmUsage {
                    prompt_tokens: 812,
                    completion_tokens: 14,
                    cached_prompt_tokens: Some(768),
                    ..LlmUsage::default()
                }),
                cancelled: false,
            }),
            E::TurnMetrics(TurnMetrics {
                agent: "receptionist".into(),
                usage: switchboard::Usage {
                    requests: 2,
                    prompt_tokens: 1624,
                    cached_prompt_tokens: 1536,
                    completion_tokens: 28,
                    ..switchboard::Usage::default()
                },
                latency: switchboard::TurnLatency {
                    end_to_first_audio: Some(Duration::from_millis(742)),
                    time_to_first_token: Some(Duration::from_millis(212)),
                    tools: Duration::from_millis(35),
                    preemptive: false,
                },
                interrupted: false,
            }),
            E::UserWordsIgnored {
                text: "uh-huh".into(),
                reason: IgnoredWords::Backchannel,
            },
            E::UserTurnExceeded {
                transcript: "so first I ordered the blue one and then".into(),
                words: 9,
                duration: Duration::from_millis(12_500),
            },
            E::TurnInterrupted {
                agent: "receptionist".into(),
            },
            E::AgentWorkRefused {
                agent: "receptionist".into(),
                work: AgentWork::Handoff {
                    to: "booker".into(),
                },
                limit: 8,
            },
            E::RealtimeReconnecting {
                model: "gpt-realtime".into(),
                reason: "the connection closed".into(),
            },
            E::Fenced {
                reason: "another writer claimed session call-42".into(),
            },
            E::Unfinished(Unfinished::ToolBody {
                call_id: "call_7".into(),
                tool: "find_table".into(),
            }),
            E::Error {
                message: "the model did not answer in 30s".into(),
            },
            E::Closed,
        ]
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
            Input::InterruptSpeech {
                speech: speech(3),
                force: false,
            },
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
                "interrupt_speech",
                "update_agent",
                "playout_finished",
                "history",
                "close"
            ]
        );
        inputs
    }

    /// Failures by name: the engine's own errors (a few of them: every `SessionError`
    /// travels as the engine serializes it), the factory's, and an earlier one's message.
    fn failures() -> Vec<(&'static str, Failure)> {
        let failures = vec![
            ("session.closed", SessionError::Closed.into()),
            (
                "session.uninterruptible",
                SessionError::Uninterruptible.into(),
            ),
            (
                "session.queue_full",
                SessionError::QueueFull { limit: 32 }.into(),
            ),
            (
                "session.build",
                SessionError::Build(BuildError::NoLlm {
                    agent: "booker".into(),
                })
                .into(),
            ),
            (
                "session.turn_failed",
                SessionError::TurnFailed {
                    failure: TurnFailure::Tool {
                        tool: "find_table".into(),
                        call_id: "call_7".into(),
                        message: "the booking system is down".into(),
                    },
                    result: Box::new(RunResult {
                        events: vec![user("a table for two")],
                        ..RunResult::default()
                    }),
                }
                .into(),
            ),
            (
                "factory",
                Failure::Factory {
                    error: FactoryError::UnknownAgent {
                        name: "booker".into(),
                        known: vec!["receptionist".into()],
                    },
                },
            ),
            (
                "earlier",
                Failure::Earlier {
                    message: "the session already has 32 jobs queued".into(),
                },
            ),
        ];
        for (_, failure) in &failures {
            match failure {
                Failure::Session { .. } | Failure::Factory { .. } | Failure::Earlier { .. } => {}
            }
        }
        failures
    }

    fn close_reasons() -> Vec<CloseReason> {
        let reasons = vec![
            CloseReason::Host,
            CloseReason::Drained,
            CloseReason::Idle,
            CloseReason::Fenced,
        ];
        for reason in &reasons {
            match reason {
                CloseReason::Host
                | CloseReason::Drained
                | CloseReason::Idle
                | CloseReason::Fenced => {}
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
            Reply::Closed {
                reason: CloseReason::Idle,
            },
            Reply::Moving,
            Reply::OutOfOrder { expected: 4 },
            Reply::Replay {
                events: vec![
                    event(
                        12,
                        RemoteEventKind::SpeechChunk {
                            speech: speech(3),
                            text: "I have a table ".into(),
                        },
                    )
                    .into(),
                    // The first of the two parts of an event too big for one message.
                    WireElement {
                        seq: 13,
                        epoch: 1,
                        kind: None,
                        part: Some(EventPart {
                            index: 0,
                            count: 2,
                            text: r#"{"input_done":{"input":3,"outcome":{"kind":"history","#.into(),
                        }),
                    },
                ],
                complete: true,
            },
        ];
        for reply in &replies {
            match reply {
                Reply::Applied { .. }
                | Reply::Earlier { .. }
                | Reply::Closed { .. }
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
            Answer::Speech {
                speech: speech(3),
                allow_interruptions: true,
            },
            Answer::Failed {
                failure: Failure::Factory {
                    error: FactoryError::UnknownAgent {
                        name: "booker".into(),
                        known: vec!["receptionist".into()],
                    },
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

    fn history() -> SessionHistory {
        serde_json::from_value(json!({
            "agents": [{
                "agent": "receptionist",
                "activity": "activity/call-42/receptionist#1",
                "chat": [user("hello"), assistant("Hello, how can I help?")],
                "inherited": 0,
                "live": true
            }]
        }))
        .unwrap()
    }

    fn outcomes() -> Vec<InputOutcome> {
        let outcomes = vec![
            InputOutcome::Turn { result: Ok(turn()) },
            InputOutcome::Done { result: Ok(()) },
            InputOutcome::History { history: history() },
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
                silent: None,
            }),
        );
        add(
            "job.resume".into(),
            json_of(&SessionJob {
                session: key(),
                spec: None,
                silent: None,
            }),
        );
        add(
            "job.resume_silent".into(),
            json_of(&SessionJob {
                session: key(),
                spec: None,
                silent: Some(2),
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
            let name = match &kind {
                WireEventKind::Event(event) => tag(event, "type"),
                WireEventKind::InputDone { .. } => "input_done".to_owned(),
            };
            add(format!("event.{name}"), json_of(&kind));
        }
        for event in session_events() {
            let name = format!("event.session.{}", tag(&event, "type"));
            add(
                name,
                json_of(&WireEventKind::Event(RemoteEventKind::Session { event })),
            );
        }
        add(
            "agent_states".into(),
            json_of(&[
                AgentState::Initializing,
                AgentState::Listening,
                AgentState::Thinking,
                AgentState::Speaking,
            ]),
        );
        add(
            "user_states".into(),
            json_of(&[UserState::Speaking, UserState::Listening, UserState::Away]),
        );
        for outcome in outcomes() {
            add(
                format!("outcome.{}", tag(&outcome, "kind")),
                json_of(&outcome),
            );
        }
        for (name, failure) in failures() {
            add(format!("failure.{name}"), json_of(&failure));
        }
        for reason in close_reasons() {
            add(
                format!("close_reason.{}", tag(&reason, "reason")),
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
                lease: 8_211_409_376_504_113_291,
                epoch: 2,
                state,
            };
            add(format!("owner.{}", tag(&record, "state")), json_of(&record));
        }
        for state in [LeaseState::Live, LeaseState::Fenced, LeaseState::Ended] {
            let record = LeaseRecord {
                worker: "worker-1".into(),
                incarnation: 8_211_409_376_504_113_291,
                state,
            };
            add(format!("lease.{}", tag(&record, "state")), json_of(&record));
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
            SnapshotKind::Part,
        ] {
            names.push(kind.as_str().to_owned());
        }
        names.extend(crate::snapshots::HEADERS.iter().map(|h| (*h).to_owned()));
        names.push(crate::protocol::EPOCH_HEADER.to_owned());
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
