//! Real models: [`Llm`](crate::Llm) implementations that talk to a provider over HTTP.
//!
//! - `openai` (cargo feature `openai`, on by default) — streaming chat completions against
//!   OpenAI or any compatible server (vLLM, Ollama, Groq, LiteLLM).
//! - [`openai_realtime`] — the OpenAI Realtime API (GA) as a speech-to-speech
//!   [`RealtimeModel`](crate::realtime::RealtimeModel): `OpenAiRealtime` over a WebSocket
//!   (cargo feature `realtime`, on by default), and the protocol's JSON codec (no feature).
//! - [`FallbackLlm`] — several models as one: each request goes to the first healthy
//!   model and moves to the next on a failure of the model before anything was forwarded;
//!   a model that failed is skipped for a cool-down. Not behind a feature: it wraps any
//!   [`Llm`](crate::Llm).
//! - [`CallIdMap`] — the call-id mapping that any provider adapter needs: the
//!   chat context keeps canonical ids such as `call_1~2/update_3`, which most providers
//!   refuse (`/`, `~`, more than 40 characters). Not behind a feature: a user who writes an
//!   adapter for another provider maps ids the same way.
//!
//! Bring your own model instead by implementing [`Llm`](crate::Llm); turn the default
//! feature off (`default-features = false`) and none of the HTTP stack is compiled.

mod call_ids;
mod fallback;
#[cfg(feature = "openai")]
pub mod openai;
pub mod openai_realtime;

pub use call_ids::{decode_call_id, encode_call_id, CallIdMap, WIRE_ID_MAX_LEN};
pub use fallback::{FallbackBuilder, FallbackError, FallbackLlm};
