//! Testing support: a scripted model and a recording speech output, for users' tests and
//! for ours.
//! No network, no key.

mod expect;
mod output;
mod scripted_llm;

pub use expect::{
    expect, EventAssert, ExpectError, FunctionCallAssert, HandoffAssert, MessageAssert,
    OutputAssert, RunExpect, RunResultExt,
};
pub use output::{ConsoleOutput, OutputCall, RecordedSpeech, RecordingOutput};
pub use scripted_llm::{Reply, ScriptedLlm};
