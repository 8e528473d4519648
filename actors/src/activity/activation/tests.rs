//! The activation machine's decisions, one test each, and every state × input pair: no
//! actors, no runtime (paused tokio time where a timer matters).

use std::sync::Mutex;

use serde_json::json;
use tokio::sync::broadcast;
use tokio::sync::oneshot::error::TryRecvError;

use super::*;
use crate::llm::{Llm, ToolCallChunk};
use crate::outcome::Effect;
use crate::output::SpeechOutput;

/// A speech output that records every call, plays out at once or waits for a report,
/// and can pause if asked.
#[derive(Clone, Default)]
struct Output {
    calls: Arc<Mutex<Vec<String>>>,
    pending: bool,
    pausable: bool,
}

impl Output {
    fn pending() -> Self {
        Self {
            pending: true,
            ..Self::default()
        }
    }

    fn pausable() -> Self {
        Self {
            pending: true,
            pausable: true,
            ..Self::default()
        }
    }

    fn push(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl SpeechOutput for Output {
    fn speech_started(&mut self, speech: SpeechId, _agent: &str) {
        self.push(format!("start {speech}"));
    }
    fn speech_chunk(&mut self, speech: SpeechId, text: &str) {
        self.push(format!("chunk {speech} {text}"));
    }
    fn speech_finished(&mut self, speech: SpeechId) -> Playout {
        self.push(format!("finish {speech}"));
        if self.pending {
            Playout::Pending
        } else {
            Playout::Done
        }
    }
    fn interrupt(&mut self, speech: SpeechId) {
        self.push(format!("interrupt {speech}"));
    }
    fn can_pause(&self) -> bool {
        self.pausable
    }
    fn pause(&mut self, speech: SpeechId) {
        self.push(format!("pause {speech}"));
    }
    fn resume(&mut self, speech: SpeechId) {
        self.push(format!("resume {speech}"));
    }
}

/// A model the machine never calls (the tests feed its chunks).
struct Silent;

impl Llm for Silent {
    fn chat(&self, _request: LlmRequest) -> crate::llm::LlmStream {
        Box::pin(futures_util::stream::empty())
    }

    fn name(&self) -> &str {
        "scripted"
    }
}

/// Speech handles made by the machine interrupt through this; the tests feed
/// `InterruptSpeech` themselves.
struct NoPort;

impl SpeechPort for NoPort {
    fn interrupt(&self, _speech: SpeechId, _force: bool) {}
}

struct Fixture {
    machine: Activation,
    output: Output,
    events: broadcast::Receiver<SessionEvent>,
}

fn schema(name: &str) -> ToolSchema {
    ToolSchema {
        name: name.to_owned(),
        description: String::new(),
        parameters: json!({"type": "object"}),
    }
}

fn setup(output: Output, agent: Agent, chat: ChatContext, carried: Vec<PendingItem>) -> Fixture {
    let shared = SessionShared::for_tests(Box::new(output.clone()));
    let events = shared.events.subscribe();
    let tools = Tools {
        routes: [
            ("search".to_owned(), ToolsetKey(0)),
            ("book".to_owned(), ToolsetKey(1)),
        ]
        .into(),
        schemas: Arc::from(vec![schema("search"), schema("book")]),
        companions: false,
    };
    let machine = Activation::new(Setup {
        id: ActorId::new("activity/s1/a#1"),
        agent,
        llm: crate::realtime::Model::Text(Arc::new(Silent)),
        shared,
        speech_port: Arc::new(NoPort),
        tools,
        chat,
        order: 1,
        sub_task_of: None,
        handoff_from: None,
        carried,
        inherited: None,
    });
    Fixture {
        machine,
        output,
        events,
    }
}

fn agent() -> Agent {
    Agent::builder("a").instructions("Help.").build().unwrap()
}

fn created(output: Output) -> Fixture {
    setup(output, agent(), ChatContext::new(), Vec::new())
}

fn listening(output: Output) -> Fixture {
    let mut f = created(output);
    assert!(matches!(f.feed(Input::Enter)[..], [Command::RunEnterHook]));
    assert!(f.feed(Input::Entered).is_empty());
    f
}

type Done = oneshot::Receiver<TurnOutcome>;

impl Fixture {
    fn feed(&mut self, input: Input) -> Vec<Command> {
        let mut out = Vec::new();
        self.machine.handle(input, &mut out);
        out
    }

    fn state(&self) -> &'static str {
        self.machine.state.name()
    }

    /// Starts a user turn; returns its answer and the step it opened.
    fn user_turn(&mut self, text: &str) -> (Done, u64) {
        let (done, answer) = oneshot::channel();
        let out = self.feed(Input::RunTurn {
            kind: TurnKind::User(text.to_owned()),
            done,
            cause: Cause::default(),
        });
        (answer, opened(&out).expect("the turn opens a step"))
    }

    fn text(&mut self, step: u64, text: &str) -> Vec<Command> {
        self.feed(Input::Chunk {
            step,
            chunk: LlmChunk::Text(text.to_owned()),
        })
    }

    fn call(&mut self, step: u64, id: &str, name: &str, arguments: &str) {
        let out = self.feed(Input::Chunk {
            step,
            chunk: LlmChunk::ToolCall(ToolCallChunk {
                call_id: id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.to_owned(),
            }),
        });
        assert!(out.is_empty(), "{out:?}");
    }

    fn end(&mut self, step: u64) -> Vec<Command> {
        self.feed(Input::StreamEnded {
            step,
            failure: None,
        })
    }

    fn output(&mut self, step: u64, index: usize, output: CallOutput) -> Vec<Command> {
        self.feed(Input::CallOutput {
            step,
            index,
            output,
        })
    }

    fn chat(&self) -> Vec<String> {
        self.machine
            .chat()
            .items()
            .iter()
            .map(|item| match item {
                ChatItem::FunctionCall(c) => format!("call {}", c.call_id),
                ChatItem::FunctionCallOutput(o) => format!("out {} {}", o.call_id, o.output),
                ChatItem::Message(m) if m.interrupted => format!("{:?}~ {}", m.role, m.content),
                ChatItem::Message(m) => format!("{:?}: {}", m.role, m.content),
                ChatItem::AgentHandoff { to, .. } => format!("handoff {to}"),
            })
            .collect()
    }

    fn events(&mut self) -> Vec<SessionEvent> {
        let mut events = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            events.push(event);
        }
        events
    }

    /// Closes the activation to the end: what everything still waiting hears.
    fn close_fully(&mut self) {
        self.feed(Input::Close {
            reason: Arc::from("the session closed"),
        });
        self.feed(Input::ExitHookDone);
        self.feed(Input::ToolsetsStopped { calls: Vec::new() });
        self.feed(Input::Stopped);
    }
}

/// The step a command list opens, if it opens one.
fn opened(out: &[Command]) -> Option<u64> {
    out.iter().find_map(|c| match c {
        Command::OpenStream { step, .. } => Some(*step),
        _ => None,
    })
}

fn request(out: &[Command]) -> &LlmRequest {
    out.iter()
        .find_map(|c| match c {
            Command::OpenStream { request, .. } => Some(request),
            _ => None,
        })
        .expect("a request")
}

fn runs(out: &[Command]) -> Vec<(usize, usize, String)> {
    out.iter()
        .filter_map(|c| match c {
            Command::RunTool {
                index,
                toolset,
                call,
                ..
            } => Some((*index, toolset.0, call.name.clone())),
            _ => None,
        })
        .collect()
}

fn answered(done: &mut Done) -> TurnOutcome {
    done.try_recv().expect("the turn has answered")
}

fn still_running(done: &mut Done) {
    assert!(
        matches!(done.try_recv(), Err(TryRecvError::Empty)),
        "the turn has not answered yet"
    );
}

fn pending_item(scope: Scope, call_id: &str) -> PendingItem {
    let base = call_id.split('/').next().unwrap_or(call_id).to_owned();
    PendingItem {
        scope,
        call_id: call_id.to_owned(),
        items: Arc::from(
            crate::outcome::terminal_pair(
                crate::outcome::StoppedCall::stopped(FunctionCall {
                    call_id: base,
                    name: "search".to_owned(),
                    arguments: "{}".to_owned(),
                }),
                "later",
            )
            .map(|item| match item {
                ChatItem::FunctionCall(mut c) => {
                    c.call_id = call_id.to_owned();
                    ChatItem::FunctionCall(c)
                }
                ChatItem::FunctionCallOutput(mut o) => {
                    o.call_id = call_id.to_owned();
                    ChatItem::FunctionCallOutput(o)
                }
                other => other,
            })
            .to_vec(),
        ),
    }
}

fn deliver(
    scope: Scope,
    base: &str,
    call_id: &str,
    reply: bool,
) -> (Input, oneshot::Receiver<Result<(), UpdateError>>) {
    let (tx, rx) = oneshot::channel();
    let items = pending_item(scope.clone(), call_id).items.to_vec();
    (
        Input::Deliver {
            scope,
            base_call_id: base.to_owned(),
            items,
            reply,
            answer: DeliveryAnswer::to(tx),
        },
        rx,
    )
}

// ---- Turns -----------------------------------------------------------------------

#[test]
fn a_text_turn_streams_to_the_output_and_ends_with_its_message() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("hi");
    assert_eq!(f.state(), "running");
    assert!(f.text(step, "Hel").is_empty());
    f.text(step, "lo!");
    still_running(&mut done);
    assert!(f.end(step).is_empty(), "nothing to cancel or run");
    let outcome = answered(&mut done);
    assert!(!outcome.interrupted && outcome.failure.is_none());
    assert_eq!(f.chat(), ["User: hi", "Assistant: Hello!"]);
    assert_eq!(
        f.output.calls(),
        [
            "start speech_1",
            "chunk speech_1 Hel",
            "chunk speech_1 lo!",
            "finish speech_1"
        ]
    );
    assert_eq!(f.state(), "listening");
    assert_eq!(
        f.machine.shared.host_view.agent_state(),
        AgentState::Listening
    );
}

#[test]
fn a_turn_starts_only_when_the_activation_listens() {
    let mut in_states: Vec<Fixture> = Vec::new();
    in_states.push(created(Output::default()));
    let mut entering = created(Output::default());
    entering.feed(Input::Enter);
    in_states.push(entering);
    let mut running = listening(Output::default());
    let _first = running.user_turn("first");
    in_states.push(running);
    let mut paused = listening(Output::default());
    paused.feed(Input::Pause { spare: vec![] });
    in_states.push(paused);
    let mut closed = listening(Output::default());
    closed.close_fully();
    in_states.push(closed);
    for mut f in in_states {
        let state = f.state();
        let (tx, mut done) = oneshot::channel();
        let out = f.feed(Input::RunTurn {
            kind: TurnKind::Reply(None),
            done: tx,
            cause: Cause::default(),
        });
        assert!(opened(&out).is_none(), "{state}: no step opens");
        let outcome = answered(&mut done);
        assert!(
            matches!(outcome.failure, Some(SessionError::Closed)),
            "{state}: answered at once"
        );
        assert_eq!(f.state(), state, "unchanged");
    }
}

#[test]
fn a_user_turn_hook_that_stops_the_response_keeps_the_message_and_asks_nothing() {
    let agent = Agent::builder("a")
        .on_user_turn_completed(|_, _| crate::agent::TurnDecision::NoReply)
        .build()
        .unwrap();
    let mut f = setup(Output::default(), agent, ChatContext::new(), Vec::new());
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    let (tx, mut done) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::User("just noting".into()),
        done: tx,
        cause: Cause::default(),
    });
    assert!(opened(&out).is_none());
    answered(&mut done);
    assert_eq!(f.chat(), ["User: just noting"]);
}

#[test]
fn a_step_with_calls_runs_each_on_its_toolset_and_commits_once_all_outputs_are_in() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("find and book");
    f.call(step, "c1", "search", "{}");
    f.call(step, "c2", "book", "{}");
    let out = f.end(step);
    assert_eq!(
        runs(&out),
        [(0, 0, "search".to_owned()), (1, 1, "book".to_owned())]
    );
    assert_eq!(
        f.chat(),
        ["User: find and book"],
        "nothing before the last output"
    );
    assert!(f
        .output(step, 1, CallOutput::reply("booked".into()))
        .is_empty());
    assert_eq!(f.chat(), ["User: find and book"]);
    let out = f.output(step, 0, CallOutput::reply("found".into()));
    assert_eq!(
        f.chat(),
        [
            "User: find and book",
            "call c1",
            "call c2",
            "out c1 found",
            "out c2 booked"
        ]
    );
    let next = opened(&out).expect("the outputs want a reply: another step");
    assert_eq!(request(&out).chat.len(), 5);
    still_running(&mut done);
    f.text(next, "Done.");
    f.end(next);
    let outcome = answered(&mut done);
    assert_eq!(outcome.events.len(), 6, "the turn's items, in order");
}

#[test]
fn calls_that_may_not_run_are_answered_at_once() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("go");
    f.call(step, "c1", "nope", "{}");
    f.call(step, "c2", "search", &"x".repeat(70_000));
    let out = f.end(step);
    assert!(runs(&out).is_empty(), "nothing runs");
    let chat = f.machine.chat().clone();
    let unknown = chat.output_of("c1").unwrap();
    assert!(unknown.is_error);
    assert!(
        unknown.output.contains("available tools: search, book"),
        "{}",
        unknown.output
    );
    assert!(chat
        .output_of("c2")
        .unwrap()
        .output
        .contains("over the limit"));
    // Both are errors the model can act on: one more step.
    let next = opened(&out).expect("the model reads the errors");
    f.end(next);
    answered(&mut done);
}

#[test]
fn a_step_whose_text_goes_over_the_limit_says_what_fits_and_fails_the_turn() {
    let agent = Agent::builder("a").max_reply_bytes(10).build().unwrap();
    let mut f = setup(Output::default(), agent, ChatContext::new(), Vec::new());
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    let (mut done, step) = f.user_turn("talk");
    f.call(step, "c1", "search", "{}");
    assert!(f.text(step, "Hello ").is_empty());
    let out = f.text(step, "world, and on and on");
    assert!(
        matches!(out[..], [Command::CancelStream { step: s }] if s == step),
        "the stream is dropped at once: {out:?}"
    );
    assert!(runs(&out).is_empty(), "no call of the step runs");
    let outcome = answered(&mut done);
    assert!(matches!(
        outcome.failure,
        Some(SessionError::TurnFailed {
            failure: TurnFailure::ReplyTooLong { limit: 10 },
            ..
        })
    ));
    assert_eq!(f.chat(), ["User: talk", "Assistant~ Hello worl"]);
    assert_eq!(
        f.output.calls(),
        [
            "start speech_1",
            "chunk speech_1 Hello ",
            "chunk speech_1 worl",
            "finish speech_1"
        ],
        "the output got exactly what the chat keeps"
    );
    assert!(f.events().iter().any(|e| matches!(
        e,
        SessionEvent::Error { message } if message.contains("over the limit of 10 bytes")
    )));
    // Chunks the stream had already produced change nothing; the next turn runs.
    assert!(f.text(step, "more").is_empty());
    assert_eq!(f.state(), "listening");
    let (_done, next) = f.user_turn("again");
    assert!(f.text(next, "Short.").is_empty());
}

#[test]
fn a_text_exactly_at_the_limit_is_whole_and_the_step_goes_on() {
    let agent = Agent::builder("a").max_reply_bytes(5).build().unwrap();
    let mut f = setup(Output::default(), agent, ChatContext::new(), Vec::new());
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    let (mut done, step) = f.user_turn("hi");
    assert!(f.text(step, "Hel").is_empty());
    assert!(f.text(step, "lo").is_empty());
    f.end(step);
    assert!(answered(&mut done).failure.is_none());
    assert_eq!(f.chat(), ["User: hi", "Assistant: Hello"]);
}

#[test]
fn calls_over_the_size_limits_keep_bounded_stand_ins_and_do_not_run() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("go");
    f.call(step, "c1", &"n".repeat(1 << 20), "{}");
    f.call(
        step,
        &"i".repeat(1 << 20),
        "search",
        &"x".repeat(10_000_000),
    );
    f.call(step, "c3", "search", "{}");
    let out = f.end(step);
    assert_eq!(runs(&out), [(2, 0, "search".to_owned())], "only c3 runs");
    let out = f.output(step, 2, CallOutput::reply("found".into()));
    let request = request(&out);
    let size: usize = request
        .chat
        .items()
        .iter()
        .map(|item| serde_json::to_string(item).unwrap().len())
        .sum();
    assert!(size < 2_000, "the next request carries {size} bytes");
    let calls: Vec<&FunctionCall> = request
        .chat
        .items()
        .iter()
        .filter_map(|item| match item {
            ChatItem::FunctionCall(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(calls[0].name, format!("{}_cut", "n".repeat(60)));
    assert_eq!(calls[1].call_id, "i".repeat(64));
    assert!(calls[1].arguments.contains("10000000 bytes of arguments"));
    let chat = request.chat.clone();
    assert!(chat
        .output_of("c1")
        .unwrap()
        .output
        .contains("was 1048576 bytes, over the limit of 64"));
    assert!(chat
        .output_of(&"i".repeat(64))
        .unwrap()
        .output
        .contains("are 10000000 bytes, over the limit of 65536; it did not run"));
    f.end(opened(&out).unwrap());
    answered(&mut done);
}

#[test]
fn a_step_goes_on_while_outputs_want_a_reply_and_stops_after_max_tool_steps() {
    let mut f = listening(Output::default());
    let (mut done, mut step) = f.user_turn("loop");
    for round in 1..=3 {
        f.call(step, &format!("c{round}"), "search", "{}");
        f.end(step);
        let out = f.output(step, 0, CallOutput::reply("more".into()));
        match opened(&out) {
            Some(next) => {
                assert!(round < 3, "step {round} of 3 opens the next");
                step = next;
            }
            None => assert_eq!(round, 3, "the third step is the last"),
        }
    }
    assert!(answered(&mut done).failure.is_none());
}

#[test]
fn a_quiet_step_ends_the_turn_and_a_handoff_ends_it_with_the_handoff() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("quiet");
    f.call(step, "c1", "search", "{}");
    f.end(step);
    let out = f.output(step, 0, CallOutput::quiet(String::new()));
    assert!(opened(&out).is_none());
    answered(&mut done);
    let (mut done, step) = f.user_turn("transfer");
    f.call(step, "c2", "search", "{}");
    f.end(step);
    let billing = Agent::builder("billing").build().unwrap();
    let handoff = CallOutput {
        output: "Transferring.".into(),
        is_error: false,
        effect: Effect::Handoff(crate::handoff::Handoff::to(billing)),
    };
    let out = f.output(step, 0, handoff);
    assert!(opened(&out).is_none());
    let outcome = answered(&mut done);
    assert_eq!(outcome.handoff.unwrap().agent.name(), "billing");
}

#[test]
fn a_failing_stream_fails_the_turn_and_keeps_what_was_said() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Partial");
    let out = f.feed(Input::StreamEnded {
        step,
        failure: Some(TurnFailure::Llm(crate::llm::LlmError::new("broken"))),
    });
    assert!(matches!(out[..], [Command::CancelStream { .. }]));
    let outcome = answered(&mut done);
    assert!(matches!(
        outcome.failure,
        Some(SessionError::TurnFailed {
            failure: TurnFailure::Llm(_),
            ..
        })
    ));
    assert_eq!(f.chat(), ["User: hi", "Assistant~ Partial"]);
    assert_eq!(f.state(), "listening", "the next turn can run");
}

// ---- Interruptions ---------------------------------------------------------------

#[test]
fn an_uninterruptible_turn_refuses_an_interruption_unless_forced() {
    let agent = Agent::builder("a")
        .allow_interruptions(false)
        .build()
        .unwrap();
    let mut f = setup(Output::default(), agent, ChatContext::new(), Vec::new());
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Listen");
    let (tx, mut waiter) = oneshot::channel();
    f.feed(Input::Interrupt {
        force: false,
        waiter: tx,
    });
    assert!(matches!(
        waiter.try_recv(),
        Ok(Err(SessionError::Uninterruptible))
    ));
    still_running(&mut done);
    let (tx, mut waiter) = oneshot::channel();
    let out = f.feed(Input::Interrupt {
        force: true,
        waiter: tx,
    });
    assert!(matches!(out[..], [Command::CancelStream { .. }]));
    assert!(matches!(waiter.try_recv(), Ok(Ok(()))));
    assert!(answered(&mut done).interrupted);
}

#[test]
fn an_interruption_while_generating_cuts_the_stream_and_waits_for_what_was_heard() {
    let mut f = listening(Output::pending());
    let (mut done, step) = f.user_turn("menu?");
    f.text(step, "Soup, fish and");
    let (tx, mut waiter) = oneshot::channel();
    let out = f.feed(Input::Interrupt {
        force: false,
        waiter: tx,
    });
    assert!(out
        .iter()
        .any(|c| matches!(c, Command::CancelStream { .. })));
    assert!(
        out.iter().any(|c| matches!(c, Command::ArmTimer { .. })),
        "it waits at most a while for the report"
    );
    assert!(f.output.calls().contains(&"interrupt speech_1".to_owned()));
    still_running(&mut done);
    assert!(matches!(waiter.try_recv(), Err(TryRecvError::Empty)));
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: true,
        heard: Some("Soup".into()),
    });
    let outcome = answered(&mut done);
    assert!(outcome.interrupted);
    assert!(matches!(waiter.try_recv(), Ok(Ok(()))));
    assert_eq!(f.chat(), ["User: menu?", "Assistant~ Soup"]);
}

#[test]
fn an_interruption_while_calling_interrupts_the_step_and_the_turn_ends_with_its_outputs() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("search");
    f.call(step, "c1", "search", "{}");
    f.end(step);
    let (tx, mut waiter) = oneshot::channel();
    let out = f.feed(Input::Interrupt {
        force: false,
        waiter: tx,
    });
    assert!(matches!(
        &out[..],
        [Command::InterruptStep { toolsets, .. }] if toolsets == &[ToolsetKey(0)]
    ));
    still_running(&mut done);
    let out = f.output(step, 0, CallOutput::moved_to_background());
    assert!(opened(&out).is_none(), "no further step");
    assert!(answered(&mut done).interrupted);
    assert!(matches!(waiter.try_recv(), Ok(Ok(()))));
    assert!(f.machine.chat().output_of("c1").is_some());
}

#[test]
fn a_final_transcript_interrupts_an_interruptible_turn() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Long answer");
    f.feed(Input::UserTranscript {
        is_final: true,
        interrupts: true,
        at: Instant::now(),
    });
    assert!(answered(&mut done).interrupted);
}

// ---- Preemptive requests ---------------------------------------------------------

fn preempting(output: Output) -> Fixture {
    let agent = Agent::builder("a")
        .turn_handling(
            crate::turn_handling::TurnHandling::new()
                .preemptive_generation(crate::turn_handling::PreemptiveGeneration::on()),
        )
        .build()
        .unwrap();
    let mut f = setup(output, agent, ChatContext::new(), Vec::new());
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    f
}

fn cancelled(out: &[Command]) -> Vec<u64> {
    out.iter()
        .filter_map(|c| match c {
            Command::CancelStream { step } => Some(*step),
            _ => None,
        })
        .collect()
}

#[test]
fn a_preemptive_answer_is_held_unsaid_then_its_turn_says_it_without_asking_again() {
    let output = Output::default();
    let mut f = preempting(output.clone());
    let out = f.feed(Input::Preflight {
        text: Some("a table".into()),
    });
    let step = opened(&out).expect("the model is asked at once");
    assert_eq!(
        request(&out).chat.items().last().and_then(|i| i.text()),
        Some("a table")
    );
    f.text(step, "For how many?");
    f.end(step);
    assert!(output.calls().is_empty(), "nothing said before the turn");
    assert!(f.chat().is_empty(), "nothing in the chat before the turn");
    let (done, mut answer) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::User("a table".into()),
        done,
        cause: Cause::default(),
    });
    assert_eq!(opened(&out), None, "the turn took the request over");
    assert!(cancelled(&out).is_empty());
    assert_eq!(f.chat(), ["User: a table", "Assistant: For how many?"]);
    assert!(
        output
            .calls()
            .iter()
            .any(|c| c.starts_with("chunk") && c.ends_with(" For how many?")),
        "{:?}",
        output.calls()
    );
    let outcome = answered(&mut answer);
    let report = outcome.report.as_deref().expect("a turn that ends reports");
    assert!(report.latency.preemptive);
    assert_eq!(report.usage.requests, 1);
    assert_eq!(outcome.events.len(), 2);
}

#[test]
fn a_preemptive_request_for_other_words_is_dropped_and_the_turn_asks_again() {
    let output = Output::default();
    let mut f = preempting(output.clone());
    let first = opened(&f.feed(Input::Preflight {
        text: Some("a table".into()),
    }))
    .unwrap();
    f.text(first, "For how many?");
    let (done, _answer) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::User("a table for two".into()),
        done,
        cause: Cause::default(),
    });
    assert_eq!(cancelled(&out), [first]);
    let again = opened(&out).expect("asked again");
    assert_ne!(again, first);
    // The dropped request's chunk never reached the output or the chat.
    assert!(output.calls().is_empty());
    assert_eq!(f.chat(), ["User: a table for two"]);
}

#[test]
fn a_newer_preemptive_request_a_drop_or_a_close_each_drop_the_one_under_way() {
    let mut f = preempting(Output::default());
    let first = opened(&f.feed(Input::Preflight {
        text: Some("a".into()),
    }))
    .unwrap();
    let out = f.feed(Input::Preflight {
        text: Some("a b".into()),
    });
    assert_eq!(cancelled(&out), [first]);
    let second = opened(&out).unwrap();
    assert_eq!(
        cancelled(&f.feed(Input::Preflight { text: None })),
        [second]
    );
    let third = opened(&f.feed(Input::Preflight {
        text: Some("a b c".into()),
    }))
    .unwrap();
    let out = f.feed(Input::Close {
        reason: Arc::from("the session closed"),
    });
    assert_eq!(cancelled(&out), [third]);
}

#[test]
fn an_agent_without_preemptive_generation_ignores_the_ask() {
    let mut f = listening(Output::default());
    assert!(f
        .feed(Input::Preflight {
            text: Some("a".into())
        })
        .is_empty());
}

// ---- Deferred replies ------------------------------------------------------------

#[test]
fn a_deferred_reply_is_due_unless_the_agent_spoke_with_the_newest_item_in_view() {
    assert!(reply_due(0, Some(0)), "never answered");
    assert!(reply_due(3, Some(5)), "the answer came before the item");
    assert!(
        reply_due(5, Some(5)),
        "the answer's context ended just before it"
    );
    assert!(!reply_due(6, Some(5)), "the answer saw it");
    assert!(!reply_due(0, None), "nothing pending");
}

#[test]
fn a_deferred_reply_names_the_pending_items_and_asks_without_tools() {
    let mut f = listening(Output::default());
    let (input, mut landed) = deliver(Scope::Session, "c1", "c1/update_1", true);
    assert!(f.feed(input).is_empty());
    assert!(matches!(landed.try_recv(), Ok(Ok(()))));
    let (tx, mut done) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::Deferred,
        done: tx,
        cause: Cause::default(),
    });
    let request = request(&out);
    assert_eq!(request.tool_choice, ToolChoice::None);
    assert_eq!(request.deferred_call_ids, ["c1/update_1"]);
    assert!(f.events().iter().any(|e| matches!(
        e,
        SessionEvent::DeferredReply {
            decision: DeferredReplyDecision::Requested,
            ..
        }
    )));
    let step = opened(&out).unwrap();
    f.end(step);
    answered(&mut done);
}

#[test]
fn a_deferred_reply_is_skipped_once_the_agent_answered_with_the_items_in_view() {
    let mut f = listening(Output::default());
    let (input, _landed) = deliver(Scope::Session, "c1", "c1/update_1", true);
    f.feed(input);
    // A user turn answers with the item in view.
    let (mut done, step) = f.user_turn("and?");
    f.text(step, "It is ready.");
    f.end(step);
    answered(&mut done);
    f.events();
    let (tx, mut done) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::Deferred,
        done: tx,
        cause: Cause::default(),
    });
    assert!(opened(&out).is_none(), "no request");
    answered(&mut done);
    assert!(f.events().iter().any(|e| matches!(
        e,
        SessionEvent::DeferredReply {
            decision: DeferredReplyDecision::AlreadyAnswered,
            ..
        }
    )));
}

#[test]
fn a_deferred_reply_first_inserts_the_items_an_agent_taken_over_lacks() {
    let carried = vec![pending_item(Scope::Session, "c9/update_2")];
    let mut f = setup(Output::default(), agent(), ChatContext::new(), carried);
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    assert!(f.chat().is_empty(), "carried items wait for the reply");
    let (tx, mut done) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::Deferred,
        done: tx,
        cause: Cause::default(),
    });
    assert_eq!(
        f.chat(),
        ["call c9/update_2", "out c9/update_2 Cancelled: later."]
    );
    assert_eq!(request(&out).deferred_call_ids, ["c9/update_2"]);
    f.end(opened(&out).unwrap());
    answered(&mut done);
}

#[test]
fn a_deferred_turn_with_nothing_pending_ends_at_once_without_an_event() {
    let mut f = listening(Output::default());
    f.events();
    let (tx, mut done) = oneshot::channel();
    assert!(f
        .feed(Input::RunTurn {
            kind: TurnKind::Deferred,
            done: tx,
            cause: Cause::default(),
        })
        .is_empty());
    answered(&mut done);
    assert!(!f
        .events()
        .iter()
        .any(|e| matches!(e, SessionEvent::DeferredReply { .. })));
}

// ---- Tool items ------------------------------------------------------------------

#[test]
fn tool_items_for_an_open_step_are_held_until_it_lands() {
    let mut f = listening(Output::default());
    let (_done, step) = f.user_turn("go");
    f.call(step, "c1", "search", "{}");
    f.call(step, "c2", "book", "{}");
    f.end(step);
    f.output(step, 0, CallOutput::reply("first update".into()));
    let (input, mut landed) = deliver(Scope::Session, "c1", "c1/update_1", true);
    f.feed(input);
    assert!(
        matches!(landed.try_recv(), Err(TryRecvError::Empty)),
        "held: its call's step is not in yet"
    );
    f.output(step, 1, CallOutput::quiet(String::new()));
    assert!(matches!(landed.try_recv(), Ok(Ok(()))));
    assert_eq!(
        f.chat(),
        [
            "User: go",
            "call c1",
            "call c2",
            "out c1 first update",
            "out c2 ",
            "call c1/update_1",
            "out c1/update_1 Cancelled: later."
        ]
    );
    f.machine.chat().check_invariant().unwrap();
}

#[test]
fn tool_items_are_refused_once_paused_or_closed_and_never_redirected() {
    let mut paused = listening(Output::default());
    paused.feed(Input::Pause { spare: vec![] });
    let mut closed = listening(Output::default());
    closed.close_fully();
    let mut created = created(Output::default());
    for f in [&mut paused, &mut closed, &mut created] {
        let (input, mut landed) = deliver(Scope::Session, "c1", "c1/update_1", true);
        f.feed(input);
        assert!(matches!(
            landed.try_recv(),
            Ok(Err(UpdateError::ScopeClosed { .. }))
        ));
        assert!(f.machine.chat().is_empty());
    }
}

#[test]
fn a_pause_hands_session_items_to_the_next_agent_and_drops_its_own() {
    let mut f = listening(Output::default());
    let mine = Scope::Activity(ActorId::new("activity/s1/a#1"));
    for (scope, id) in [(Scope::Session, "s"), (mine, "m")] {
        let (input, _) = deliver(scope, id, &format!("{id}/update_1"), true);
        f.feed(input);
    }
    let out = f.feed(Input::Pause { spare: vec![7] });
    assert!(matches!(
        &out[..],
        [Command::StopRuns { except, .. }] if except == &[7]
    ));
    let carried: Vec<String> = f
        .machine
        .take_carried()
        .into_iter()
        .map(|p| p.call_id)
        .collect();
    assert_eq!(carried, ["s/update_1"]);
    f.feed(Input::RunsStopped {
        calls: vec![crate::outcome::StoppedCall::stopped(FunctionCall {
            call_id: "bg".into(),
            name: "search".into(),
            arguments: "{}".into(),
        })],
        reason: Arc::from("the agent was paused for a sub-task"),
    });
    assert!(f.machine.chat().output_of("bg/finished").is_some());
}

#[test]
fn a_paused_turn_commits_its_step_on_resume_and_goes_on() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("survey");
    f.call(step, "c1", "search", "{}");
    f.end(step);
    f.feed(Input::Pause { spare: vec![1] });
    assert_eq!(f.state(), "paused");
    // The exempt call's output comes while paused: recorded, not committed.
    let out = f.output(step, 0, CallOutput::reply("survey done".into()));
    assert!(out.is_empty());
    assert_eq!(f.chat(), ["User: survey"]);
    let out = f.feed(Input::Resume {
        carried: Vec::new(),
    });
    assert_eq!(f.chat(), ["User: survey", "call c1", "out c1 survey done"]);
    let next = opened(&out).expect("the step's output wants a reply");
    f.end(next);
    answered(&mut done);
}

#[test]
fn a_pause_while_generating_interrupts_the_turn() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Let me");
    let out = f.feed(Input::Pause { spare: vec![] });
    assert!(out
        .iter()
        .any(|c| matches!(c, Command::CancelStream { .. })));
    assert!(answered(&mut done).interrupted);
    assert_eq!(f.state(), "paused");
}

// ---- Close -----------------------------------------------------------------------

#[test]
fn a_close_runs_on_exit_then_stops_toolsets_and_answers_the_turn_closed() {
    let mut f = listening(Output::default());
    let (mut done, step) = f.user_turn("search");
    f.call(step, "c1", "search", "{}");
    f.end(step);
    let reason: Arc<str> = Arc::from("the agent handed off to b");
    let out = f.feed(Input::Close {
        reason: reason.clone(),
    });
    assert!(matches!(out[..], [Command::RunExitHook]));
    let out = f.feed(Input::ExitHookDone);
    assert!(matches!(&out[..], [Command::StopToolsets { reason: r }] if *r == reason));
    still_running(&mut done);
    f.feed(Input::ToolsetsStopped { calls: Vec::new() });
    assert!(matches!(
        answered(&mut done).failure,
        Some(SessionError::Closed)
    ));
    assert_eq!(
        f.machine.chat().output_of("c1").unwrap().output,
        "Cancelled: the agent handed off to b."
    );
    assert_eq!(f.state(), "closed");
    assert!(f.machine.history_entry(false).is_some());
    // A second close waits for the same toolsets and runs no hook again.
    let out = f.feed(Input::Close {
        reason: Arc::from("the session closed"),
    });
    assert!(matches!(out[..], [Command::StopToolsets { .. }]));
}

#[test]
fn an_activation_never_entered_stops_its_toolsets_and_is_no_part_of_the_history() {
    let mut f = created(Output::default());
    let out = f.feed(Input::Close {
        reason: Arc::from("the session closed"),
    });
    assert!(
        matches!(out[..], [Command::StopToolsets { .. }]),
        "no on_exit"
    );
    f.feed(Input::ToolsetsStopped { calls: Vec::new() });
    f.feed(Input::Stopped);
    assert!(f.machine.history_entry(false).is_none());
}

// ---- Speeches --------------------------------------------------------------------

#[test]
fn a_playout_report_cuts_its_own_speech_and_a_late_one_changes_nothing() {
    let mut f = listening(Output::pending());
    let (mut done, step) = f.user_turn("two things");
    f.text(step, "First thing.");
    f.call(step, "c1", "search", "{}");
    f.end(step);
    let out = f.output(step, 0, CallOutput::reply("x".into()));
    let next = opened(&out).unwrap();
    f.text(next, "Second thing.");
    f.end(next);
    still_running(&mut done);
    // The first speech played in full, the second was cut with nothing heard.
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: false,
        heard: None,
    });
    f.feed(Input::Playout {
        speech: SpeechId(2),
        interrupted: true,
        heard: Some(String::new()),
    });
    answered(&mut done);
    let chat = f.chat();
    assert!(chat.contains(&"Assistant: First thing.".to_owned()));
    assert!(!chat.iter().any(|i| i.contains("Second")), "{chat:?}");
    // A late report for the first speech, after it played, changes nothing.
    let before = f.chat();
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: true,
        heard: Some(String::new()),
    });
    assert_eq!(f.chat(), before);
}

#[test]
fn a_report_while_the_text_streams_applies_when_it_ends() {
    let mut f = listening(Output::pending());
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Hello there, friend");
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: true,
        heard: Some("Hello there".into()),
    });
    assert_eq!(f.chat(), ["User: hi"], "not yet: the text still streams");
    f.end(step);
    answered(&mut done);
    assert_eq!(f.chat(), ["User: hi", "Assistant~ Hello there"]);
}

#[test]
fn a_report_is_final_once_recorded_and_a_repeat_or_a_late_one_changes_nothing() {
    let mut f = listening(Output::pending());
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Hello there, friend");
    // Twice while the text streams: the first one counts.
    for heard in ["Hello there", ""] {
        f.feed(Input::Playout {
            speech: SpeechId(1),
            interrupted: true,
            heard: Some(heard.into()),
        });
    }
    f.end(step);
    answered(&mut done);
    assert_eq!(f.chat(), ["User: hi", "Assistant~ Hello there"]);
    // The next turn's speech plays in full; a late report of it, during a third turn,
    // finds nothing to cut.
    let (mut done, step) = f.user_turn("and?");
    f.text(step, "That is all.");
    f.end(step);
    f.feed(Input::Playout {
        speech: SpeechId(2),
        interrupted: false,
        heard: None,
    });
    answered(&mut done);
    let (_done, step) = f.user_turn("ok");
    f.text(step, "Bye.");
    let before = f.chat();
    for speech in [1, 2] {
        f.feed(Input::Playout {
            speech: SpeechId(speech),
            interrupted: true,
            heard: Some(String::new()),
        });
    }
    assert_eq!(f.chat(), before);
    assert!(before.contains(&"Assistant: That is all.".to_owned()));
}

#[test]
fn heard_text_that_is_not_a_prefix_finds_the_cut_and_adds_no_words() {
    let mut f = listening(Output::pending());
    let (mut done, step) = f.user_turn("refund?");
    f.text(step, "Your refund of $5 is approved today.");
    f.end(step);
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: true,
        heard: Some("your refund of five dollars is".into()),
    });
    let outcome = answered(&mut done);
    assert_eq!(
        f.chat(),
        ["User: refund?", "Assistant~ Your refund of $5 is"]
    );
    assert!(matches!(
        &outcome.events[1],
        ChatItem::Message(m) if m.content == "Your refund of $5 is"
    ));
}

#[test]
fn a_say_turn_speaks_its_text_and_records_it() {
    let mut f = listening(Output::default());
    let speech = SpeechHandle::new(
        SpeechId(99),
        Interruptibility::new(true),
        SpeechStatus::Queued,
        Arc::new(NoPort),
        f.machine.shared.gone.clone(),
    );
    let (tx, mut done) = oneshot::channel();
    f.feed(Input::RunTurn {
        kind: TurnKind::Say {
            text: "One moment.".into(),
            speech: speech.clone(),
            add_to_chat: true,
        },
        done: tx,
        cause: Cause::default(),
    });
    answered(&mut done);
    assert_eq!(speech.outcome(), Some(SpeechOutcome::Played));
    assert_eq!(f.chat(), ["Assistant: One moment."]);
}

// ---- Barge-in --------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_barge_in_pauses_at_once_and_interrupts_when_the_minimum_passes() {
    let mut f = listening(Output::pausable());
    let (mut done, step) = f.user_turn("menu?");
    f.text(step, "Soup");
    let now = Instant::now();
    let out = f.feed(Input::UserStartedSpeaking { at: now });
    assert!(f.output.calls().contains(&"pause speech_1".to_owned()));
    let at = match out[..] {
        [Command::ArmTimer { at }] => at,
        _ => panic!("one timer: {out:?}"),
    };
    assert_eq!(at, now + Duration::from_millis(500));
    still_running(&mut done);
    f.feed(Input::Timer { now: at });
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: true,
        heard: Some("Soup".into()),
    });
    assert!(answered(&mut done).interrupted);
}

#[tokio::test(start_paused = true)]
async fn a_short_overlap_resumes_the_speech_after_the_false_interruption_timeout() {
    let mut f = listening(Output::pausable());
    let (mut done, step) = f.user_turn("menu?");
    f.text(step, "Soup");
    let t0 = Instant::now();
    f.feed(Input::UserStartedSpeaking { at: t0 });
    f.feed(Input::UserStoppedSpeaking {
        at: t0 + Duration::from_millis(100),
    });
    f.feed(Input::Timer {
        now: t0 + Duration::from_millis(500),
    });
    still_running(&mut done);
    f.feed(Input::Timer {
        now: t0 + Duration::from_millis(2100),
    });
    assert!(f.output.calls().contains(&"resume speech_1".to_owned()));
    assert!(f
        .events()
        .iter()
        .any(|e| matches!(e, SessionEvent::AgentFalseInterruption { resumed: true })));
    f.end(step);
    f.feed(Input::Playout {
        speech: SpeechId(1),
        interrupted: false,
        heard: None,
    });
    assert!(!answered(&mut done).interrupted);
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_starts_and_stops_arms_one_timer() {
    let mut f = listening(Output::pausable());
    let (_done, step) = f.user_turn("menu?");
    f.text(step, "Soup");
    let t0 = Instant::now();
    let mut timers = 0;
    for i in 0..10_000u64 {
        let at = t0 + Duration::from_micros(i);
        for input in [
            Input::UserStartedSpeaking { at },
            Input::UserStoppedSpeaking { at },
        ] {
            timers += f
                .feed(input)
                .iter()
                .filter(|c| matches!(c, Command::ArmTimer { .. }))
                .count();
        }
    }
    assert_eq!(timers, 1);
}

#[tokio::test(start_paused = true)]
async fn a_close_while_a_false_interruption_is_pending_stops_the_paused_speech() {
    let mut f = listening(Output::pausable());
    let (mut done, step) = f.user_turn("menu?");
    f.text(step, "Soup");
    f.end(step);
    let t0 = Instant::now();
    f.feed(Input::UserStartedSpeaking { at: t0 });
    f.feed(Input::UserStoppedSpeaking {
        at: t0 + Duration::from_millis(100),
    });
    assert!(f.output.calls().contains(&"pause speech_1".to_owned()));
    f.feed(Input::Close {
        reason: Arc::from("the session closed"),
    });
    assert_eq!(
        f.output.calls().last().map(String::as_str),
        Some("interrupt speech_1"),
        "the paused output is told to stop"
    );
    // The barge-in's timer, if it still fires, resumes nothing.
    f.feed(Input::Timer {
        now: t0 + Duration::from_secs(5),
    });
    f.feed(Input::ExitHookDone);
    f.feed(Input::ToolsetsStopped { calls: Vec::new() });
    assert!(matches!(
        answered(&mut done).failure,
        Some(SessionError::Closed)
    ));
    assert!(!f.output.calls().iter().any(|c| c.starts_with("resume")));
    assert!(!f
        .events()
        .iter()
        .any(|e| matches!(e, SessionEvent::AgentFalseInterruption { .. })));
}

#[test]
fn an_uninterruptible_turn_ignores_the_users_voice() {
    let agent = Agent::builder("a")
        .allow_interruptions(false)
        .build()
        .unwrap();
    let mut f = setup(Output::pausable(), agent, ChatContext::new(), Vec::new());
    f.feed(Input::Enter);
    f.feed(Input::Entered);
    let (mut done, step) = f.user_turn("hi");
    f.text(step, "Important");
    let out = f.feed(Input::UserStartedSpeaking { at: Instant::now() });
    assert!(out.is_empty());
    assert!(!f.output.calls().iter().any(|c| c.starts_with("pause")));
    still_running(&mut done);
}

// ---- Every state × every input ---------------------------------------------------

/// The machine in each state it can be in, with the answer of its turn if one runs.
fn every_state() -> Vec<(&'static str, Fixture, Option<Done>)> {
    let mut states = Vec::new();
    states.push(("created", created(Output::pending()), None));
    let mut entering = created(Output::pending());
    entering.feed(Input::Enter);
    states.push(("entering", entering, None));
    states.push(("listening", listening(Output::pending()), None));
    let mut generating = listening(Output::pending());
    let (done, step) = generating.user_turn("hi");
    generating.text(step, "Hello");
    states.push(("generating", generating, Some(done)));
    let mut calling = listening(Output::pending());
    let (done, step) = calling.user_turn("search");
    calling.call(step, "c1", "search", "{}");
    calling.end(step);
    states.push(("calling", calling, Some(done)));
    let mut playing = listening(Output::pending());
    let (done, step) = playing.user_turn("hi");
    playing.text(step, "Hello");
    playing.end(step);
    states.push(("playing", playing, Some(done)));
    let mut paused = listening(Output::pending());
    paused.feed(Input::Pause { spare: vec![] });
    states.push(("paused", paused, None));
    let mut paused_in_turn = listening(Output::pending());
    let (done, step) = paused_in_turn.user_turn("survey");
    paused_in_turn.call(step, "c1", "search", "{}");
    paused_in_turn.end(step);
    paused_in_turn.feed(Input::Pause { spare: vec![1] });
    states.push(("paused in a turn", paused_in_turn, Some(done)));
    let mut closing = listening(Output::pending());
    let (done, step) = closing.user_turn("search");
    closing.call(step, "c1", "search", "{}");
    closing.end(step);
    closing.feed(Input::Close {
        reason: Arc::from("handoff"),
    });
    states.push(("closing", closing, Some(done)));
    let mut closed = listening(Output::pending());
    closed.close_fully();
    states.push(("closed", closed, None));
    states
}

/// Every kind of input, with whatever waits for an answer to it.
fn every_input() -> Vec<(&'static str, Input, Vec<Answer>)> {
    let (turn, turn_rx) = oneshot::channel();
    let (interrupt, interrupt_rx) = oneshot::channel();
    let (delivery, delivery_rx) = deliver(Scope::Session, "c1", "c1/update_1", true);
    vec![
        ("enter", Input::Enter, vec![]),
        ("entered", Input::Entered, vec![]),
        (
            "run turn",
            Input::RunTurn {
                kind: TurnKind::User("again".into()),
                done: turn,
                cause: Cause::default(),
            },
            vec![Answer::Turn(turn_rx)],
        ),
        (
            "chunk",
            Input::Chunk {
                step: 1,
                chunk: LlmChunk::Text(" more".into()),
            },
            vec![],
        ),
        (
            "stream end",
            Input::StreamEnded {
                step: 1,
                failure: None,
            },
            vec![],
        ),
        (
            "call output",
            Input::CallOutput {
                step: 1,
                index: 0,
                output: CallOutput::reply("found".into()),
            },
            vec![],
        ),
        (
            "interrupt",
            Input::Interrupt {
                force: false,
                waiter: interrupt,
            },
            vec![Answer::Interrupt(interrupt_rx)],
        ),
        (
            "interrupt speech",
            Input::InterruptSpeech {
                speech: SpeechId(1),
                force: false,
            },
            vec![],
        ),
        (
            "preflight",
            Input::Preflight {
                text: Some("again".into()),
            },
            vec![],
        ),
        ("preflight dropped", Input::Preflight { text: None }, vec![]),
        (
            "user started",
            Input::UserStartedSpeaking { at: Instant::now() },
            vec![],
        ),
        (
            "user stopped",
            Input::UserStoppedSpeaking { at: Instant::now() },
            vec![],
        ),
        (
            "transcript",
            Input::UserTranscript {
                is_final: true,
                interrupts: true,
                at: Instant::now(),
            },
            vec![],
        ),
        (
            "playout",
            Input::Playout {
                speech: SpeechId(1),
                interrupted: true,
                heard: Some("He".into()),
            },
            vec![],
        ),
        ("deliver", delivery, vec![Answer::Delivery(delivery_rx)]),
        (
            "append",
            Input::Append(vec![ChatItem::message(ChatRole::System, "note")]),
            vec![],
        ),
        ("pause", Input::Pause { spare: vec![] }, vec![]),
        (
            "runs stopped",
            Input::RunsStopped {
                calls: Vec::new(),
                reason: Arc::from("paused"),
            },
            vec![],
        ),
        (
            "resume",
            Input::Resume {
                carried: Vec::new(),
            },
            vec![],
        ),
        (
            "close",
            Input::Close {
                reason: Arc::from("the session closed"),
            },
            vec![],
        ),
        ("exit hook done", Input::ExitHookDone, vec![]),
        (
            "toolsets stopped",
            Input::ToolsetsStopped { calls: Vec::new() },
            vec![],
        ),
        (
            "timer",
            Input::Timer {
                now: Instant::now() + Duration::from_secs(60),
            },
            vec![],
        ),
        ("stopped", Input::Stopped, vec![]),
    ]
}

/// Someone waiting for an answer.
enum Answer {
    Turn(Done),
    Interrupt(oneshot::Receiver<Result<(), SessionError>>),
    Delivery(oneshot::Receiver<Result<(), UpdateError>>),
}

impl Answer {
    fn heard(&mut self) -> bool {
        match self {
            Self::Turn(rx) => !matches!(rx.try_recv(), Err(TryRecvError::Empty)),
            Self::Interrupt(rx) => !matches!(rx.try_recv(), Err(TryRecvError::Empty)),
            Self::Delivery(rx) => !matches!(rx.try_recv(), Err(TryRecvError::Empty)),
        }
    }
}

/// Where the machine is, with the phase of its turn.
fn describe(f: &Fixture) -> &'static str {
    match &f.machine.state {
        State::Running(turn) => match turn.phase {
            Phase::Generating(_) => "generating",
            Phase::Calling { .. } => "calling",
            Phase::Playing { .. } => "playing",
        },
        State::Paused(Some(_)) => "paused in a turn",
        other => other.name(),
    }
}

/// Where each (state, input) pair leads; a pair not listed leaves the state as it was.
const TRANSITIONS: &[(&str, &str, &str)] = &[
    ("created", "enter", "entering"),
    ("created", "close", "closing"),
    ("created", "stopped", "closed"),
    ("entering", "entered", "listening"),
    ("entering", "pause", "paused"),
    ("entering", "close", "closing"),
    ("entering", "stopped", "closed"),
    ("listening", "run turn", "generating"),
    ("listening", "pause", "paused"),
    ("listening", "close", "closing"),
    ("listening", "stopped", "closed"),
    // Its speech still plays (the output reports later).
    ("generating", "stream end", "playing"),
    // Cut: the turn waits (a while) for what was heard.
    ("generating", "interrupt", "playing"),
    ("generating", "interrupt speech", "playing"),
    ("generating", "transcript", "playing"),
    ("generating", "pause", "paused in a turn"),
    ("generating", "close", "closing"),
    ("generating", "stopped", "closed"),
    // The output wants a reply: the next step.
    ("calling", "call output", "generating"),
    ("calling", "pause", "paused in a turn"),
    ("calling", "close", "closing"),
    ("calling", "stopped", "closed"),
    ("playing", "playout", "listening"),
    ("playing", "pause", "paused in a turn"),
    ("playing", "close", "closing"),
    ("playing", "stopped", "closed"),
    ("paused", "resume", "listening"),
    ("paused", "close", "closing"),
    ("paused", "stopped", "closed"),
    // Its step still waits for the exempt call.
    ("paused in a turn", "resume", "calling"),
    ("paused in a turn", "close", "closing"),
    ("paused in a turn", "stopped", "closed"),
    ("closing", "toolsets stopped", "closed"),
    ("closing", "stopped", "closed"),
];

fn expected(state: &'static str, input: &str) -> &'static str {
    TRANSITIONS
        .iter()
        .find(|(from, on, _)| *from == state && *on == input)
        .map_or(state, |(_, _, to)| to)
}

#[tokio::test(start_paused = true)]
async fn every_state_takes_every_input_and_everyone_waiting_is_answered_by_the_close() {
    let inputs = every_input().len();
    for index in 0..inputs {
        for (state, mut f, turn) in every_state() {
            let (input_name, input, mut answers) = every_input().swap_remove(index);
            f.feed(input);
            assert_eq!(
                describe(&f),
                expected(state, input_name),
                "{state} × {input_name}"
            );
            f.machine.chat().check_invariant().unwrap_or_else(|err| {
                panic!("{state} × {input_name}: the chat broke its invariant: {err}")
            });
            // Whatever still runs ends with the close: nobody waits for ever.
            f.feed(Input::Playout {
                speech: SpeechId(1),
                interrupted: false,
                heard: None,
            });
            f.close_fully();
            f.machine.chat().check_invariant().unwrap();
            for answer in &mut answers {
                assert!(
                    answer.heard(),
                    "{state} × {input_name}: an answer never came"
                );
            }
            if let Some(mut turn) = turn {
                assert!(
                    !matches!(turn.try_recv(), Err(TryRecvError::Empty)),
                    "{state} × {input_name}: the running turn never answered"
                );
            }
            assert_eq!(f.state(), "closed");
        }
    }
}

// ---- Realtime models ------------------------------------------------------------------

#[test]
fn a_heard_turn_adopts_the_servers_answer_and_its_words_come_later() {
    let mut f = listening(Output::default());
    let (done, answer) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::Heard {
            item: "item_1".to_owned(),
            text: String::new(),
        },
        done,
        cause: Cause::default(),
    });
    let adopts: Vec<bool> = out
        .iter()
        .filter_map(|c| match c {
            Command::OpenStream { adopt, .. } => Some(*adopt),
            _ => None,
        })
        .collect();
    assert_eq!(adopts, [true], "the first step adopts the server's answer");
    let step = opened(&out).unwrap();
    f.text(step, "Hi!");
    f.end(step);
    let mut answer = answer;
    answered(&mut answer);
    assert_eq!(f.chat(), ["User: ", "Assistant: Hi!"]);
    f.events();
    f.feed(Input::UserTranscribed {
        text: "hello there".to_owned(),
    });
    assert_eq!(f.chat(), ["User: hello there", "Assistant: Hi!"]);
    assert!(
        f.events()
            .iter()
            .any(|e| matches!(e, SessionEvent::ConversationItemChanged { index: 0, .. })),
        "the filled-in words are an event"
    );
}

#[test]
fn later_steps_of_a_heard_turn_ask_for_their_own_answer() {
    let mut f = listening(Output::default());
    let (done, _answer) = oneshot::channel();
    let out = f.feed(Input::RunTurn {
        kind: TurnKind::Heard {
            item: "item_1".to_owned(),
            text: "weather?".to_owned(),
        },
        done,
        cause: Cause::default(),
    });
    let step = opened(&out).unwrap();
    f.call(step, "call_1", "search", "{}");
    f.end(step);
    let out = f.output(step, 0, CallOutput::reply("sunny".to_owned()));
    let adopts: Vec<bool> = out
        .iter()
        .filter_map(|c| match c {
            Command::OpenStream { adopt, .. } => Some(*adopt),
            _ => None,
        })
        .collect();
    assert_eq!(adopts, [false]);
}

#[test]
fn audio_before_text_starts_the_speech_and_the_text_follows_in_it() {
    let mut f = listening(Output::default());
    let (_done, step) = f.user_turn("hi");
    let speech = f.machine.start_speech(step).expect("a generating step");
    assert_eq!(
        f.machine.start_speech(step),
        Some(speech),
        "one speech per step"
    );
    f.text(step, "Hello");
    assert_eq!(
        f.machine.start_speech(step + 100),
        None,
        "not a step that generates"
    );
    f.end(step);
    let calls = f.output.calls();
    let started = calls.iter().filter(|c| c.starts_with("start")).count();
    assert_eq!(started, 1, "{calls:?}");
}
