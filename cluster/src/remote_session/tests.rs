//! A remote session against scripted owners on a real `nats-server`: each test answers the
//! gateway's requests on the session's input subject as owners at chosen epochs would, in
//! an order the cluster makes possible but rarely (a newer owner's `SessionResumed` that
//! comes late, a fenced owner that still answers), and checks what the front gets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::watch;

use super::RemoteSession;
use crate::gateway::{GatewayInner, GatewayOptions, GatewayStats};
use crate::local::NatsServer;
use crate::namespace::SessionKey;
use crate::protocol::{
    Answer, InputOutcome, Reply, Request, WireElement, WireEvent, WireEventKind, EPOCH_HEADER,
};
use crate::remote_event::{CloseReason, RemoteEventKind};
use crate::ClusterClient;
use switchboard::SessionHistory;

/// The longest a test waits for anything.
const PATIENCE: Duration = Duration::from_secs(10);

/// What a scripted owner answers a request with: the epoch it answers at and the reply;
/// `None`: no answer (the gateway times out and asks again).
type Script = Box<dyn FnMut(&Request, usize) -> Option<Answering> + Send>;

/// An owner's answer to one request.
struct Answering {
    epoch: u64,
    reply: Reply,
    /// Sent only once the test opens the scene's gate.
    gated: bool,
}

/// The answer of the owner at `epoch`, at once.
fn at(epoch: u64, reply: Reply) -> Option<Answering> {
    Some(Answering {
        epoch,
        reply,
        gated: false,
    })
}

/// A gateway's remote session on `key`, its client, and the requests the owners got.
struct Scene {
    _server: NatsServer,
    client: ClusterClient,
    session: RemoteSession,
    gateway: Arc<GatewayInner>,
    key: SessionKey,
    requests: Arc<Mutex<Vec<Request>>>,
    /// How many requests came, as they come.
    asked: watch::Receiver<usize>,
    /// Opened by the test: gated answers go.
    gate: Arc<tokio::sync::Notify>,
}

impl Scene {
    /// Starts a server, a gateway's session on it, and owners answering as `script`
    /// says (its second argument: how many requests for the same input or replay came
    /// before this one).
    async fn new(mut script: Script) -> Self {
        let server = NatsServer::start().expect("a test server starts");
        let client = server
            .connect()
            .connect()
            .await
            .expect("the test server takes a client");
        let options = GatewayOptions::new().attempt_timeout(Duration::from_millis(200));
        let gateway = Arc::new(GatewayInner {
            js: jetstream::new(client.nats().clone()),
            client: client.clone(),
            options,
            stats: watch::channel(GatewayStats::default()).0,
        });
        let key = SessionKey::new("scripted").expect("a valid key");
        let namespace = gateway.options.namespace.clone();
        let mut inputs = client
            .nats()
            .subscribe(namespace.session_inputs(&key))
            .await
            .expect("the owners subscribe");
        client.nats().flush().await.expect("the subscription is in");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let owners = client.nats().clone();
        let (count, asked) = watch::channel(0);
        let gate = Arc::new(tokio::sync::Notify::new());
        let opened = gate.clone();
        tokio::spawn(async move {
            while let Some(message) = inputs.next().await {
                let Some(reply_to) = message.reply else {
                    continue;
                };
                let request: Request = serde_json::from_slice(&message.payload).expect("a request");
                let before = {
                    let mut seen = seen.lock().expect("not poisoned");
                    let before = seen.iter().filter(|r| same_target(r, &request)).count();
                    seen.push(request.clone());
                    before
                };
                count.send_modify(|n| *n += 1);
                if let Some(Answering {
                    epoch,
                    reply,
                    gated,
                }) = script(&request, before)
                {
                    if gated {
                        opened.notified().await;
                    }
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(EPOCH_HEADER, epoch.to_string().as_str());
                    let json = serde_json::to_vec(&reply).expect("a reply serializes");
                    let _ = owners
                        .publish_with_headers(reply_to, headers, Bytes::from(json))
                        .await;
                }
            }
        });
        // The client counts its first connection when the library reports it, which may
        // come after the session opened: the session would take it for a reconnection and
        // ask for a catch-up, racing what the test scripts. Counted first, it is not news.
        let mut connections = client.connections();
        tokio::time::timeout(PATIENCE, connections.wait_for(|n| *n >= 1))
            .await
            .expect("the client's first connection is counted")
            .expect("the client lives");
        let session = RemoteSession::open(gateway.clone(), key.clone())
            .await
            .expect("the session opens");
        Self {
            _server: server,
            client,
            session,
            gateway,
            key,
            requests,
            asked,
            gate,
        }
    }

    /// Waits until `n` requests came.
    async fn asked(&mut self, n: usize) {
        tokio::time::timeout(PATIENCE, self.asked.wait_for(|asked| *asked >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} requests within {PATIENCE:?}"))
            .expect("the owners listen");
    }

    /// Publishes `events` as one batch, as the owner at their epoch would.
    async fn publish(&self, events: &[WireEvent]) {
        let subject = self.gateway.options.namespace.session_events(&self.key);
        let json = serde_json::to_vec(events).expect("events serialize");
        self.client
            .nats()
            .publish(subject, json.into())
            .await
            .expect("published");
        self.client.nats().flush().await.expect("flushed");
    }

    /// The input ids the owners were asked for, in order.
    /// The input ids asked, in order, a retry of the same id (an answer slower than the
    /// attempt timeout, as on a loaded machine) counted once.
    fn inputs_in_order(&self) -> Vec<u64> {
        let mut ids = self.inputs_asked();
        ids.dedup();
        ids
    }

    fn inputs_asked(&self) -> Vec<u64> {
        self.requests
            .lock()
            .expect("not poisoned")
            .iter()
            .filter_map(|r| match r {
                Request::Input { id, .. } => Some(*id),
                Request::Replay { .. } => None,
            })
            .collect()
    }

    /// The owner at epoch 1 starts the session; inputs 1, 2 and 3 (final transcripts)
    /// are sent and answered as the script says.
    async fn three_inputs_answered(&self) {
        self.publish(&[event(1, 1, RemoteEventKind::SessionStarted)])
            .await;
        for text in ["one", "two", "three"] {
            self.transcript(text).await.expect("answered");
        }
    }

    async fn transcript(&self, text: &str) -> Result<(), crate::GatewayError> {
        tokio::time::timeout(PATIENCE, self.session.transcript(text, true))
            .await
            .unwrap_or_else(|_| panic!("the transcript {text:?} is answered within {PATIENCE:?}"))
    }
}

/// Whether two requests ask for the same input or the same replay.
fn same_target(a: &Request, b: &Request) -> bool {
    match (a, b) {
        (Request::Input { id: x, .. }, Request::Input { id: y, .. }) => x == y,
        (Request::Replay { from: x, epoch: e }, Request::Replay { from: y, epoch: f }) => {
            x == y && e == f
        }
        _ => false,
    }
}

fn applied(id: u64, saved: u64) -> Reply {
    Reply::Applied {
        id,
        answer: Answer::Done,
        saved,
    }
}

/// The answer to a catch-up (the client's first connection may be counted late, and
/// a catch-up follows) of an owner at `epoch` that has nothing more.
fn nothing_missed(epoch: u64) -> Option<Answering> {
    let nothing = Reply::Replay {
        events: Vec::new(),
        complete: true,
    };
    at(epoch.max(1), nothing)
}

fn event(seq: u64, epoch: u64, kind: RemoteEventKind) -> WireEvent {
    WireEvent {
        seq,
        epoch,
        kind: WireEventKind::Event(kind),
    }
}

/// The owner at epoch 2 took the session over (its `SessionResumed` has not reached the
/// gateway) and answered inputs 2 and 3, reporting a stored snapshot that holds them: the
/// gateway forgets them. Then the owner at epoch 1 — fenced, but not aware of it yet —
/// answers input 4 first, from its ledger that ends at 1: "out of order, expected 2". That
/// answer is a stale owner's and is ignored; taken, it read as inputs lost (the front gave
/// its session up), as once in a ten-minute fault campaign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_owner_s_answer_is_ignored_once_a_newer_owner_answered() {
    let scene = Scene::new(Box::new(|request, before| {
        let id = match request {
            Request::Input { id, .. } => id,
            Request::Replay { epoch, .. } => return nothing_missed(*epoch),
        };
        match (*id, before) {
            (1, _) => at(1, applied(1, 0)),
            (2, _) => at(2, applied(2, 2)),
            (3, _) => at(2, applied(3, 3)),
            (4, 0) => at(1, Reply::OutOfOrder { expected: 2 }),
            (id, _) => at(2, applied(id, 3)),
        }
    }))
    .await;
    scene.three_inputs_answered().await;
    scene
        .transcript("four")
        .await
        .expect("the stale owner's answer is not the session's; the newest one answers");
    // Input 4 asked again after the stale answer, and never an input before it.
    assert_eq!(scene.inputs_in_order(), [1, 2, 3, 4]);
    assert!(
        scene.inputs_asked().iter().filter(|&&id| id == 4).count() >= 2,
        "{:?}",
        scene.inputs_asked()
    );
    assert_eq!(scene.gateway.stats.borrow().stale_replies, 1);
}

/// The owner at epoch 2 answered inputs 2 and 3 (its snapshot held 1; a stored one holds
/// 3 now, so the gateway forgot 2) before its `SessionResumed { last_input: 1 }` reached
/// the gateway — events come on their own task and may come late. That event says nothing
/// new of an owner that answered already: the next input goes on from 3, and nothing is
/// sent again (taken as news, it sent the owner back to input 2, which the gateway no
/// longer had: inputs lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_session_resumed_of_an_owner_that_answered_sends_nothing_again() {
    let scene = Scene::new(Box::new(|request, _| {
        let id = match request {
            Request::Input { id, .. } => id,
            Request::Replay { epoch, .. } => return nothing_missed(*epoch),
        };
        match *id {
            1 => at(1, applied(1, 0)),
            2 => at(2, applied(2, 2)),
            id => at(2, applied(id, 3)),
        }
    }))
    .await;
    let mut events = scene.session.subscribe();
    scene.three_inputs_answered().await;
    scene
        .publish(&[event(
            1,
            2,
            RemoteEventKind::SessionResumed { last_input: 1 },
        )])
        .await;
    loop {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("the late SessionResumed arrives")
            .expect("events go on");
        if matches!(event.kind, RemoteEventKind::SessionResumed { .. }) {
            break;
        }
    }
    scene
        .transcript("four")
        .await
        .expect("the owner that answered has every input up to 3");
    // Nothing sent again: the gateway never went back to an input before 4.
    assert_eq!(scene.inputs_in_order(), [1, 2, 3, 4]);
}

/// A gap in the newest owner's events is filled by a replay. A fenced owner (epoch 1) that
/// still answers asks first with its own, older events: they are not the session's, so
/// the gateway asks again and gets the newest owner's — nothing is reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_from_a_fenced_owner_is_not_taken_for_a_loss() {
    let scene = Scene::new(Box::new(|request, before| {
        let Request::Replay { from, epoch } = request else {
            return None;
        };
        if *epoch < 2 {
            return nothing_missed(*epoch);
        }
        let stale = vec![WireElement::from(event(
            *from,
            1,
            RemoteEventKind::Session {
                event: switchboard::SessionEvent::Error {
                    message: "stale".into(),
                },
            },
        ))];
        let newest = vec![WireElement::from(event(
            2,
            2,
            RemoteEventKind::Session {
                event: switchboard::SessionEvent::Error {
                    message: "second".into(),
                },
            },
        ))];
        match before {
            0 => at(
                1,
                Reply::Replay {
                    events: stale,
                    complete: true,
                },
            ),
            _ => at(
                2,
                Reply::Replay {
                    events: newest,
                    complete: true,
                },
            ),
        }
    }))
    .await;
    let mut events = scene.session.subscribe();
    scene
        .publish(&[event(1, 1, RemoteEventKind::SessionStarted)])
        .await;
    scene
        .publish(&[event(
            1,
            2,
            RemoteEventKind::SessionResumed { last_input: 0 },
        )])
        .await;
    // Number 2 never came live: a gap before 3.
    scene
        .publish(&[event(
            3,
            2,
            RemoteEventKind::Session {
                event: switchboard::SessionEvent::Error {
                    message: "third".into(),
                },
            },
        )])
        .await;
    let mut said = Vec::new();
    while said.len() < 2 {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("the events after the resume arrive")
            .expect("events go on");
        match event.kind {
            RemoteEventKind::Session {
                event: switchboard::SessionEvent::Error { message },
            } => said.push(message),
            RemoteEventKind::EventsLost { from, to } => {
                panic!("events {from}..={to} reported lost; the newest owner had them")
            }
            _ => {}
        }
    }
    assert_eq!(said, ["second", "third"]);
    assert_eq!(scene.gateway.stats.borrow().events_lost, 0);
    let gap_replays = scene
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| matches!(r, Request::Replay { from: 2, epoch: 2 }))
        .count();
    assert_eq!(
        gap_replays, 2,
        "the stale answer was not taken: asked again"
    );
    assert!(scene.gateway.stats.borrow().stale_replies >= 1);
}

fn said(seq: u64, epoch: u64, text: &str) -> WireEvent {
    event(
        seq,
        epoch,
        RemoteEventKind::Session {
            event: switchboard::SessionEvent::Error {
                message: text.into(),
            },
        },
    )
}

/// A gap in the owner at epoch 1's events: the gateway asks it for a replay. Before its
/// answer comes, the owner at epoch 2 takes over and its first events arrive, with a hole
/// of their own (its number 2 was lost). The newer hole is not judged by the older owner's
/// answer (complete, but in another owner's numbering) but asked of the newer owner:
/// nothing is reported lost. (The older owner's events that come after the newer owner's
/// are dropped as a stale owner's, as always.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_owner_s_hole_seen_during_an_older_owner_s_replay_is_asked_of_it() {
    let mut scene = Scene::new(Box::new(|request, _| {
        let Request::Replay { from, epoch } = request else {
            return None;
        };
        match (*from, *epoch) {
            (2, 1) => Some(Answering {
                epoch: 1,
                reply: Reply::Replay {
                    events: vec![said(2, 1, "older second").into()],
                    complete: true,
                },
                gated: true,
            }),
            (2, 2) => at(
                2,
                Reply::Replay {
                    events: vec![said(2, 2, "newer second").into()],
                    complete: true,
                },
            ),
            (_, epoch) => nothing_missed(epoch),
        }
    }))
    .await;
    let mut events = scene.session.subscribe();
    scene
        .publish(&[event(1, 1, RemoteEventKind::SessionStarted)])
        .await;
    let started = tokio::time::timeout(PATIENCE, events.recv())
        .await
        .expect("the start arrives")
        .expect("events go on");
    assert!(matches!(started.kind, RemoteEventKind::SessionStarted));
    let before = *scene.asked.borrow();
    // The older owner's number 2 is missing: a replay is asked of it, and waits.
    scene.publish(&[said(3, 1, "older third")]).await;
    scene.asked(before + 1).await;
    scene
        .publish(&[event(
            1,
            2,
            RemoteEventKind::SessionResumed { last_input: 0 },
        )])
        .await;
    scene.publish(&[said(3, 2, "newer third")]).await;
    scene.gate.notify_one();
    let mut heard = Vec::new();
    while heard.last().is_none_or(|last| last != "newer third") {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the events arrive: {heard:?}; asked {:?}",
                    scene.requests.lock().unwrap()
                )
            })
            .expect("events go on");
        match event.kind {
            RemoteEventKind::Session {
                event: switchboard::SessionEvent::Error { message },
            } => heard.push(message),
            RemoteEventKind::SessionResumed { .. } => heard.push("resumed".into()),
            RemoteEventKind::EventsLost { from, to } => {
                panic!("events {from}..={to} reported lost after {heard:?}; their owner had them")
            }
            _ => {}
        }
    }
    assert!(
        heard.ends_with(&[
            "resumed".into(),
            "newer second".into(),
            "newer third".into()
        ]),
        "{heard:?}"
    );
    assert_eq!(scene.gateway.stats.borrow().events_lost, 0);
}

/// The owner applies a close and publishes its answer (the history) and its
/// `SessionClosed` before its reply to the close's request comes: on a loaded machine, a
/// close of a long conversation takes the owner longer than one attempt, and the retry
/// finds nobody (the owner is gone). The close went through: `close` returns the
/// history, not `Closed` (which a caller takes for a close that may not have happened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_whose_answer_came_before_its_reply_returns_the_history() {
    let scene = Scene::new(Box::new(|request, _| match request {
        // Late past every attempt: the owner is busy, then gone.
        Request::Input { .. } => None,
        Request::Replay { epoch, .. } => nothing_missed(*epoch),
    }))
    .await;
    scene
        .publish(&[event(1, 1, RemoteEventKind::SessionStarted)])
        .await;
    let history = SessionHistory::default();
    let closing = {
        let session = scene.session.clone();
        tokio::spawn(async move { session.close().await })
    };
    let mut asked = scene.asked.clone();
    tokio::time::timeout(PATIENCE, async {
        while scene.inputs_asked().is_empty() {
            asked.changed().await.expect("the owners listen");
        }
    })
    .await
    .expect("the close is asked within the patience");
    let close_id = *scene.inputs_asked().last().expect("the close was asked");
    scene
        .publish(&[
            WireEvent {
                seq: 2,
                epoch: 1,
                kind: WireEventKind::InputDone {
                    input: close_id,
                    outcome: InputOutcome::History {
                        history: history.clone(),
                    },
                },
            },
            event(
                3,
                1,
                RemoteEventKind::SessionClosed {
                    reason: CloseReason::Host,
                },
            ),
        ])
        .await;
    let closed = tokio::time::timeout(PATIENCE, closing)
        .await
        .expect("the close returns within the patience")
        .expect("the close's task ran");
    assert_eq!(
        closed.expect("the close went through: its answer came"),
        history
    );
}
