//! Testing support, for users' tests and for ours: a scripted model, a recording speech
//! output, fluent assertions on a turn, a gate to hold a tool, bounded waits on session
//! events, and front code run over any session through the host API ([`front`]). No
//! network, no key, no sleeps.
//!
//! For realtime agents: [`ScriptedRealtime`], a realtime model that answers from a
//! [`RealtimeScript`] in memory and checks every event the engine sends as the OpenAI
//! Realtime service does ([`SimReport`]); [`RealtimeServer`] (cargo feature `realtime`),
//! the same on a loopback WebSocket for the real provider; [`tone`] and [`silence`] to
//! play a caller through `Session::audio_input` ([`tone_in`] and [`silence_in`] in
//! G.711).
//!
//! `docs/testing.md` ("Testing an agent") walks through all of it.

pub mod event;
mod expect;
pub mod front;
mod g711;
mod gate;
mod output;
mod realtime_script;
#[cfg(feature = "realtime")]
mod realtime_server;
mod realtime_sim;
mod scripted_llm;
mod scripted_realtime;
mod wait;

pub use expect::{
    expect, EventAssert, ExpectError, FunctionCallAssert, HandoffAssert, MessageAssert,
    OutputAssert, RunExpect, RunResultExt,
};
pub use gate::Gate;
pub use output::{ConsoleOutput, OutputCall, RecordedSpeech, RecordingOutput};
pub use realtime_script::{silence, silence_in, tone, tone_in, RealtimeReply, RealtimeScript};
#[cfg(feature = "realtime")]
pub use realtime_server::RealtimeServer;
pub use realtime_sim::{SimReport, SpeechStart};
pub use scripted_llm::{HeldRequest, Reply, ScriptedLlm};
pub use scripted_realtime::ScriptedRealtime;
pub use wait::{next_event, settled, EventMatcher, EventWaiter, WaitError};
