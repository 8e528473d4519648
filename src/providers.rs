//! Real models: [`Llm`](crate::Llm) implementations that talk to a provider over HTTP.
//!
//! - [`openai`] (cargo feature `openai`, on by default) — streaming chat completions against
//!   OpenAI or any compatible server (vLLM, Ollama, Groq, LiteLLM).
//! - [`CallIdMap`] — the call-id mapping that any provider adapter needs: the
//!   chat context keeps canonical ids such as `call_1~2/update_3`, which most providers
//!   refuse (`/`, `~`, more than 40 characters). Not behind a feature: a user who writes an
//!   adapter for another provider maps ids the same way.
//!
//! Bring your own model instead by implementing [`Llm`](crate::Llm); turn the default
//! feature off (`default-features = false`) and none of the HTTP stack is compiled.

mod call_ids;
#[cfg(feature = "openai")]
pub mod openai;

pub use call_ids::{decode_call_id, encode_call_id, CallIdMap, WIRE_ID_MAX_LEN};
