//! Sessions on many machines: switchboard sessions run on a pool of worker processes
//! behind [NATS](https://nats.io) with JetStream, and the host's front drives each one
//! through a gateway without knowing which worker holds it.
//!
//! NATS does the delivery; JetStream's work-queue stream, KV bucket and snapshots stream
//! do the queue, the ownership and the sessions' storage. This crate adds no consensus or
//! discovery of its own. An embedding that does not cluster does not depend on it, and
//! builds no NATS code.
//!
//! # The roles
//!
//! * A **worker** ([`Worker`]) runs sessions on a switchboard [`Engine`](switchboard::Engine).
//!   It pulls a session to start or resume from the jobs stream only when it has a free
//!   slot (its capacity is a hard bound), claims the session's owner record in the owners
//!   bucket and its snapshots by compare-and-set, keeps its own one lease alive (idle
//!   sessions cost the control plane nothing: `tests/cluster/idle_sessions_cost_the_control_plane_nothing.rs`), saves
//!   the session after every settled turn, and serves the session's subjects. When a
//!   worker dies or drains, the others resume its sessions from their snapshots. Agents and tools are code, so the worker's program supplies a
//!   [`SessionFactory`] that builds each session from its [`SessionSpec`] (an agent name
//!   and free-form JSON).
//! * A **gateway** ([`Gateway`]) is what the host's front (a WebSocket server, a telephony
//!   edge, a chat backend) holds: [`Gateway::start_session`] returns a [`RemoteSession`]
//!   with the host API of a local session — it implements the engine's
//!   [`HostSession`](switchboard::HostSession) (`run`, `generate_reply`, `say`,
//!   `transcript`, user speaking, `interrupt`, `update_agent`, `events`, `history`,
//!   `close`), in the engine's own types (`RunResult`, `SessionHistory`, `SessionEvent`,
//!   `SessionError`), so front code written for a local `Session` runs over it — plus
//!   playout reports and events with sequence numbers.
//!
//! ```no_run
//! use switchboard_cluster::{Gateway, GatewayOptions, NatsConnect, SessionSpec};
//!
//! # async fn front() -> Result<(), Box<dyn std::error::Error>> {
//! let client = NatsConnect::new("nats://nats.internal:4222")
//!     .user_and_password("front", "…")
//!     .connect()
//!     .await?;
//! let gateway = Gateway::new(client, GatewayOptions::new());
//! let session = gateway.start_session(SessionSpec::new("receptionist")).await?;
//! let mut events = session.subscribe_from(1); // speech chunks for the TTS, state, …
//! let turn = session.run("I'd like a table for two").await?;
//! println!("{:?}", turn.assistant_messages().collect::<Vec<_>>());
//! session.close().await?;
//! # drop(events);
//! # Ok(())
//! # }
//! ```
//!
//! The worker you deploy is [`runtime::run`] around your factory: settings from flags and
//! variables, health and metrics over HTTP, drain on SIGTERM (`examples/worker.rs`).
//!
//! `examples/local_cluster.rs` runs all of it on one machine: a local server, three worker
//! processes and a front; it kills the worker holding a conversation mid-call and drains
//! another under load, and the conversation goes on.
//!
//! # What holds
//!
//! * **No over-admission, no double dispatch.** A worker never holds more sessions than
//!   its capacity, and no session runs twice: a job becomes a session only after its
//!   owner record was created by compare-and-set (`tests/cluster/dispatch_never_over_admits.rs`:
//!   1,000 starts in a burst against four worker processes).
//! * **Exactly-once inputs.** Every input carries an id; the gateway sends a session's
//!   inputs one at a time and retries an unanswered one with the same id; the owner
//!   applies each id once and answers a retry with the first answer
//!   (`tests/cluster/inputs_apply_exactly_once.rs`, every kind of input, retries forced by
//!   freezing the worker). An input whose answer the front has is never sent to a new
//!   owner again, even when no snapshot holds it
//!   (`tests/cluster/answered_inputs_are_not_applied_again.rs`).
//! * **Ordered, complete events.** The owner numbers its events; the gateway delivers
//!   them in order, once each, and asks the owner for the ones it missed (a gap, a
//!   reconnection); those the owner no longer has arrive as one `EventsLost` event
//!   (`tests/cluster/sessions_survive_a_server_restart.rs`).
//! * **One host API.** Front code generic over `HostSession` gets the same record from a
//!   local session and from a remote one on a worker process built by the same factory:
//!   greeting, typed and spoken turns, a speech, a barge-in, a transfer, another agent,
//!   the conversation (`tests/cluster/a_front_runs_the_same_over_a_local_and_a_remote_session.rs`).
//!   A speech's handle (what `say` answers, and what its `SpeechCreated` carries)
//!   interrupts that speech alone, there as here: queued, it never plays; playing, it
//!   stops with its turn; ended, nothing happens
//!   (`tests/cluster/a_speech_handle_interrupts_its_own_speech.rs`).
//! * **Fencing.** A worker that lost its lease (paused, cut off), or whose connection
//!   dropped since its last renewal (its session may have been claimed meanwhile), answers
//!   nothing, publishes nothing and writes no snapshot until it renews; a newer owner's claim makes the store refuse
//!   a stale owner's snapshot writes ([`StoreError::Fenced`](switchboard::snapshot::StoreError)),
//!   on the engine's store contract: of two engines restoring one stored state from the
//!   JetStream store the second is refused, and a claimant that died is taken over
//!   explicitly (`src/snapshots/two_restorers.rs`);
//!   a worker whose renewal finds its lease fenced stops every session without writing
//!   anything more (`tests/cluster/a_paused_worker_is_fenced.rs`).
//! * **A crash loses at most the turn in flight.** When a worker dies its connection
//!   closes, and the gateway's next request to it finds nobody subscribed: the gateway
//!   asks the pool to claim the session at once, and a worker that finds the owner
//!   silent too claims it, without waiting for the lease (SIGKILL → next reply in tens of
//!   milliseconds with the default 10 s lease:
//!   `tests/cluster/a_killed_owner_is_replaced_without_waiting_for_its_lease.rs`); else
//!   (a frozen worker, one cut off with its connection left open, a session nobody
//!   talks to) its lease lapses and every worker's lease watch sees it. Either
//!   way another worker claims each session one epoch higher and restores it from its
//!   last snapshot; the gateway sends it the inputs that snapshot lacks, so every input is
//!   applied exactly once and a turn under way runs again and answers its caller
//!   (`tests/cluster/a_crashed_worker_s_sessions_go_on_elsewhere.rs`).
//! * **Who may connect.** Workers and gateways take NATS's own authentication and TLS
//!   ([`NatsConnect`]); tenants are NATS accounts, or share one with a namespace and an
//!   inbox prefix each; [`Permissions`] gives each role only its tenant's subjects
//!   (`tests/cluster/who_may_connect.rs`).
//! * **A NATS cluster.** With three servers and everything provisioned with three replicas
//!   ([`WorkerOptions::replicas`], [`provision_with_replicas`]), killing the server that
//!   leads the snapshots stream loses no session, snapshot or input
//!   (`tests/cluster/losing_one_of_three_servers_loses_nothing.rs`).
//! * **No message over the server's `max_payload`.** A long conversation's snapshot and
//!   an event as big as its whole history (a close's answer) go in parts and come back
//!   whole (`tests/cluster/a_long_conversation_moves_and_closes_whole.rs`: 5 MiB, moved
//!   and closed, at the server's default 1 MiB).
//! * **All of it at once.** Kills, freezes, drains, partitions and server restarts at
//!   random while 50 sessions talk: every input applied once, none answered lost, each
//!   conversation continuous (`tests/cluster/a_fault_campaign_loses_nothing.rs`).
//! * **Drain.** [`Worker::drain`] stops pulling, lets sessions settle until a deadline,
//!   interrupts the rest, stores each one's last snapshot and hands it over; the other
//!   workers resume them and their fronts go on (`tests/cluster/drain_moves_sessions.rs`:
//!   200 talking sessions, none lost, none doubled).
//!
//! # Layout
//!
//! One concept per file:
//!
//! | file | what |
//! |---|---|
//! | `namespace.rs` | [`Namespace`]: every subject, stream and bucket name, from one prefix; [`SessionKey`] |
//! | `spec.rs` | [`SessionSpec`], [`AgentSpec`], [`OutputMode`], [`SessionFactory`] |
//! | `protocol.rs` | what gateway and worker say: the job, inputs with ids, replies, replays, the events on the wire with the inputs' answers (an event too big for one message in parts), [`WorkerInfo`] |
//! | `remote_event.rs` | [`RemoteEvent`]: what a front sees of a session, with sequence number and epoch: the engine's events, the speech stream, the cluster's lifecycle; [`CloseReason`] |
//! | `dispatch.rs` | the jobs stream and its consumer; publishing a job |
//! | `ownership.rs` | the owners bucket's session records: claim (over a dead lease), hand-over, release |
//! | `lease.rs` | one lease per worker: taking, renewing, fencing and ending it, its clock (`LeaseClock`), the hosting index |
//! | `snapshots.rs`, `snapshots/parts.rs` | the snapshots stream and one owner's fenced writer of a session's snapshots (a `SnapshotStore`); messages over the server's `max_payload` as parts |
//! | `worker.rs` | [`Worker`]: the pull loop, capacity, claims, drain |
//! | `provisioning.rs` | [`provision`], [`provision_with_replicas`]: the streams and bucket, created once, R1 or R3 |
//! | `runtime.rs` | [`runtime`]: the worker you deploy — settings from flags and variables (`runtime/config.rs`), health, readiness and metrics over HTTP (`runtime/status.rs`, `runtime/http.rs`), drain on SIGTERM |
//! | `worker/hosted.rs` | one session's loop on its worker: the driver of its tenure, turning inputs, events, the lease, the drain and the writes into the tenure's events and its actions into I/O |
//! | `worker/tenure.rs` | `Tenure`: one worker's hold on one session as a plain machine — live, ending, moving, done — with a unit test per decision |
//! | `worker/residents.rs` | the sessions a worker hosts, by key: a new hosting of a key stops the old one first |
//! | `worker/apply.rs` | a host input applied to the engine with its id: its answer now, or the work its answer waits on |
//! | `worker/resume.rs` | the lease watch: a lease that lapsed or expired is fenced, and a dead lease's sessions are swept into resume jobs |
//! | `worker/lapses.rs` | the live worker leases a worker has seen, and when each lapses |
//! | `worker/silent_owner.rs` | before claiming a session whose owner a gateway found silent ("no responders"): is the owning worker gone? |
//! | `worker/ledger.rs`, `worker/event_log.rs`, `worker/output.rs`, `worker/counts.rs` | the input ledger, the numbered event log and its batches, the speech output that publishes, the counters |
//! | `gateway.rs` | [`Gateway`], [`GatewayError`] |
//! | `remote_session.rs` | [`RemoteSession`] (a `HostSession`), [`RemoteEvents`], [`RemoteSessionEvents`] |
//! | `remote_session/inputs.rs`, `remote_session/events.rs` | sending inputs in order with retries (a stale owner's reply taken as none); receiving events in order with replays, an event's parts joined |
//! | `remote_session/speeches.rs` | one handle per speech the front meets (a `say`'s answer, a `SpeechCreated`), linked to the session, ended by the session's `SpeechPlayedOut` |
//! | `connect.rs` | [`NatsConnect`] (auth, TLS), [`ClusterClient`] (reconnections, refusals) |
//! | `permissions.rs` | [`Permissions`] of a gateway and a worker, for a tenant's namespace and inbox prefix |
//! | `wire_protocol.rs` | [`wire_protocol`]: every name on NATS and every message, as JSON (a page, checked against the code by its test) |
//! | `local.rs`, `local/cluster.rs` | [`local::NatsServer`], [`local::NatsCluster`]: a real `nats-server`, or three clustered, for tests, examples and a laptop |
//!
//! The subjects, streams and buckets and every message on them are in [`wire_protocol`];
//! who writes what and what happens on each fault, in the repository's ARCHITECTURE.md,
//! "The cluster".

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use)]

mod conditional_write;
mod connect;
mod dispatch;
mod gateway;
mod lease;
pub mod local;
mod namespace;
mod ownership;
mod permissions;
mod protocol;
mod provisioning;
mod remote_event;
mod remote_session;
pub mod runtime;
mod snapshots;
mod spec;
pub mod wire_protocol;
mod worker;

pub use connect::{ClusterClient, ConnectError, NatsConnect};
pub use gateway::{Gateway, GatewayError, GatewayOptions, GatewayStats};
pub use namespace::{NameError, Namespace, SessionKey};
pub use permissions::{Permissions, DEFAULT_INBOX_PREFIX};
pub use protocol::WorkerInfo;
pub use provisioning::{provision, provision_with_replicas};
pub use remote_event::{CloseReason, RemoteEvent, RemoteEventKind};
pub use remote_session::{
    RemoteEvents, RemoteEventsError, RemoteSay, RemoteSession, RemoteSessionEvents,
};
pub use spec::{AgentSpec, FactoryError, OutputMode, SessionFactory, SessionSpec};
pub use worker::{DrainReport, Worker, WorkerError, WorkerOptions};

#[allow(dead_code)]
fn _assert_handles_are_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Gateway>();
    check::<RemoteSession>();
    check::<ClusterClient>();
    check::<Worker>();
}
