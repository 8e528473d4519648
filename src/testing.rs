//! Testing support: a scripted model and recording I/O, for users' tests and for ours.
//! No network, no key.

mod expect;
mod io;
mod scripted_llm;

pub use expect::{
    expect, EventAssert, ExpectError, FunctionCallAssert, HandoffAssert, MessageAssert,
    OutputAssert, RunExpect, RunResultExt,
};
pub use io::{ConsoleIo, RecordedSpeech, RecordingIo};
pub use scripted_llm::{Reply, ScriptedLlm};
