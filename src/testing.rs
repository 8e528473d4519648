//! Testing support, for users' tests and for ours: a scripted model, a recording speech
//! output, fluent assertions on a turn, a gate to hold a tool, bounded waits on session
//! events, and front code run over any session through the host API ([`front`]). No
//! network, no key, no sleeps.
//!
//! `docs/testing.md` ("Testing an agent") walks through all of it.

pub mod event;
mod expect;
pub mod front;
mod gate;
mod output;
mod scripted_llm;
mod wait;

pub use expect::{
    expect, EventAssert, ExpectError, FunctionCallAssert, HandoffAssert, MessageAssert,
    OutputAssert, RunExpect, RunResultExt,
};
pub use gate::Gate;
pub use output::{ConsoleOutput, OutputCall, RecordedSpeech, RecordingOutput};
pub use scripted_llm::{HeldRequest, Reply, ScriptedLlm};
pub use wait::{next_event, settled, EventMatcher, EventWaiter, WaitError};
