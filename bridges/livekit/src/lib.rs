//! Puts switchboard sessions behind a [LiveKit Agents](https://docs.livekit.io/agents/)
//! worker. LiveKit supplies the media: the room or the SIP call, STT, VAD, TTS and the
//! audio; switchboard keeps the conversation: agents, tools, handoffs, history, barge-in
//! and endpointing decisions, snapshots.
//!
//! The worker is a small Python package beside this crate (`bridges/livekit/python`,
//! `switchboard_livekit`), pinned to livekit-agents 1.8.9. For each call it opens one
//! WebSocket to a [`LiveKitBridge`] and forwards what the user does (started and stopped
//! speaking, interim and final transcripts, typed turns) and what was heard of each speech;
//! it plays the speech the session streams back with `AgentSession.say(...)` and carries
//! out interrupts, pauses and the end of the call. The frames are in [`protocol`];
//! `docs/livekit.md` describes them for a worker written in another language.
//!
//! ```no_run
//! use switchboard::prelude::*;
//! use switchboard::testing::{Reply, ScriptedLlm};
//! use switchboard_livekit::{BridgeOptions, BridgeToken, CallInfo, LiveKitBridge, SpeechSink};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::start()?;
//! let token = BridgeToken::new(std::env::var("SWITCHBOARD_BRIDGE_TOKEN")?)?;
//! let bridge = LiveKitBridge::bind("127.0.0.1:8765", BridgeOptions::new(token)).await?;
//! bridge
//!     .serve(move |call: CallInfo, speech: SpeechSink| {
//!         let engine = engine.clone();
//!         async move {
//!             let agent = Agent::builder("concierge")
//!                 .instructions("You answer the phone.")
//!                 .build()
//!                 .map_err(|e| e.to_string())?;
//!             let session = Session::builder()
//!                 .id(call.session)
//!                 .llm(ScriptedLlm::new([Reply::text("Hello!")]))
//!                 .agent(agent)
//!                 .output(speech.output())
//!                 .start(&engine)
//!                 .await
//!                 .map_err(|e| e.to_string())?;
//!             Ok(speech.local(session))
//!         }
//!     })
//!     .await;
//! # Ok(()) }
//! ```
//!
//! # What holds
//!
//! - **Each input once.** Inputs are numbered by the worker; the bridge applies each number
//!   once and in order, and acknowledges it. A worker that reconnects resends what was not
//!   acknowledged; what was applied is dropped (`InputLedger`).
//! - **Each output until acknowledged.** The bridge numbers the session's outputs and keeps
//!   each until the worker acknowledges it; on a reconnection it resends, in order, every
//!   output after the last one the worker says it applied (`Outbox`).
//! - **A call outlives its connection** for [`BridgeOptions::resume_window`]; then its
//!   session closes. A hangup closes it at once.
//! - **Only who holds the token gets in.** A hello with a wrong token is refused, and the
//!   token is never printed (`Debug` redacts it).
//!
//! # Layout
//!
//! - [`protocol`]: the frames.
//! - `server.rs`: [`LiveKitBridge`], the listener and the hello; [`HostFactory`].
//! - `link.rs`: one call's task: inputs to the host, outputs to the worker, reconnection.
//! - `delivery.rs`: the outbox and the applied-input ledger, plain types.
//! - `host.rs`: the seam: [`BridgeHost`], [`SpeechSink`], [`BridgeOutput`] and
//!   [`LocalCall`] (a session of this process).
//! - `remote.rs` (feature `cluster`): `RemoteCall`, a session of a switchboard worker pool
//!   (`switchboard-cluster`'s `RemoteSession`) as a bridge host.
//! - `token.rs`: [`BridgeToken`].
//! - `venv.rs`: [`worker_python`], the pinned livekit-agents venv the tests and the
//!   example run the worker in.

mod delivery;
mod host;
mod link;
pub mod protocol;
#[cfg(feature = "cluster")]
mod remote;
mod server;
mod token;
mod venv;

pub use host::{BridgeHost, BridgeOutput, CallInfo, HostError, LocalCall, SpeechSink};
#[cfg(feature = "cluster")]
pub use remote::RemoteCall;
pub use server::{BridgeError, BridgeOptions, HostFactory, LiveKitBridge};
pub use token::{BridgeToken, EmptyToken};
pub use venv::{worker_python, VenvError, WorkerPython, LIVEKIT_AGENTS};
