//! The OpenAI Realtime API (GA), a [`RealtimeModel`] over a WebSocket.
//!
//! [`OpenAiRealtime`] (cargo feature `realtime`, on by default) connects to
//! `wss://…/v1/realtime?model=…` with the API key as a bearer token, sets the session up
//! (`session.type: "realtime"`, audio formats, voice, turn detection, input transcription)
//! and carries the engine's events both ways. The engine keeps the protocol's rules (one
//! response at a time, every call answered before the next response, truncations clamped
//! to the audio received); this module only speaks the protocol:
//!
//! - [`codec`] — the events as JSON text, feature-free (the in-memory
//!   `testing::ScriptedRealtime` speaks it too);
//! - `socket` — the WebSocket: tungstenite over tokio, TLS with rustls and the `ring`
//!   provider, Mozilla's roots compiled in (no system OpenSSL or CA bundle), no
//!   permessage-deflate;
//! - `gather` — while a response's audio is well ahead of its playback, the socket lets
//!   the next pieces gather in the kernel (on Linux, up to 32 KiB or 5 ms, keeping 100 ms
//!   of audio unplayed) and reads them in one wake-up instead of one each.
//!
//! ```no_run
//! use std::sync::Arc;
//! use switchboard::prelude::*;
//! use switchboard::providers::openai_realtime::OpenAiRealtime;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // OPENAI_API_KEY (and optionally OPENAI_BASE_URL, OPENAI_REALTIME_MODEL):
//! let model = OpenAiRealtime::from_env()?;
//! let agent = Agent::builder("assistant").instructions("Be brief.").build()?;
//! let session = Session::builder()
//!     .realtime(Arc::new(model))
//!     .agent(agent)
//!     .start(&Engine::start()?)
//!     .await?;
//! let mut microphone = session.audio_input();
//! microphone.push(&[0u8; 960]); // 20 ms of PCM16 at 24 kHz
//! # Ok(()) }
//! ```

pub mod codec;
#[cfg(feature = "realtime")]
mod gather;
#[cfg(feature = "realtime")]
mod socket;

#[cfg(feature = "realtime")]
pub use builder::{OpenAiRealtime, OpenAiRealtimeBuilder, RealtimeConfigError};

#[cfg(feature = "realtime")]
mod builder {
    use std::fmt;
    use std::time::Duration;

    use futures_util::future::BoxFuture;
    use futures_util::FutureExt;

    use super::socket;
    use crate::realtime::{
        RealtimeCapabilities, RealtimeConnection, RealtimeError, RealtimeModel, RealtimeSettings,
    };

    /// The default model.
    const DEFAULT_MODEL: &str = "gpt-realtime";

    /// The default base URL.
    const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

    /// A configuration [`OpenAiRealtimeBuilder::build`] refuses.
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    #[non_exhaustive]
    pub enum RealtimeConfigError {
        /// No API key was given and `OPENAI_API_KEY` is not set.
        #[error("no API key: set OPENAI_API_KEY or call OpenAiRealtimeBuilder::api_key")]
        NoApiKey,
        /// The base URL is not `http(s)://` or `ws(s)://`.
        #[error("the base URL {url:?} must start with http://, https://, ws:// or wss://")]
        BadBaseUrl {
            /// The URL given.
            url: String,
        },
    }

    /// The OpenAI Realtime API as a [`RealtimeModel`] (see the module docs).
    pub struct OpenAiRealtime {
        url: String,
        api_key: String,
        model: String,
        settings: RealtimeSettings,
        connect_timeout: Duration,
    }

    impl fmt::Debug for OpenAiRealtime {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("OpenAiRealtime")
                .field("url", &self.url)
                .field("model", &self.model)
                .finish_non_exhaustive()
        }
    }

    impl OpenAiRealtime {
        /// A builder with OpenAI's base URL, `gpt-realtime` and the default settings.
        pub fn builder() -> OpenAiRealtimeBuilder {
            OpenAiRealtimeBuilder {
                base_url: DEFAULT_BASE_URL.to_owned(),
                api_key: None,
                model: DEFAULT_MODEL.to_owned(),
                settings: RealtimeSettings::new(),
                connect_timeout: Duration::from_secs(10),
            }
        }

        /// From the environment: `OPENAI_API_KEY` (required), `OPENAI_BASE_URL` and
        /// `OPENAI_REALTIME_MODEL` (optional).
        pub fn from_env() -> Result<Self, RealtimeConfigError> {
            let mut builder = Self::builder();
            if let Ok(url) = std::env::var("OPENAI_BASE_URL") {
                builder = builder.base_url(url);
            }
            if let Ok(model) = std::env::var("OPENAI_REALTIME_MODEL") {
                builder = builder.model(model);
            }
            builder.build()
        }

        /// The WebSocket URL it connects to.
        pub fn url(&self) -> &str {
            &self.url
        }
    }

    impl RealtimeModel for OpenAiRealtime {
        fn name(&self) -> &str {
            &self.model
        }

        fn capabilities(&self) -> RealtimeCapabilities {
            RealtimeCapabilities::OPENAI
        }

        fn settings(&self) -> &RealtimeSettings {
            &self.settings
        }

        fn connect(
            &self,
        ) -> BoxFuture<'static, Result<Box<dyn RealtimeConnection>, RealtimeError>> {
            let url = self.url.clone();
            let key = self.api_key.clone();
            let timeout = self.connect_timeout;
            let bytes_per_ms = self.settings.output_format.bytes_per_ms();
            async move {
                let socket = socket::Socket::open(&url, &key, timeout, bytes_per_ms).await?;
                Ok(Box::new(socket) as Box<dyn RealtimeConnection>)
            }
            .boxed()
        }
    }

    /// Builds an [`OpenAiRealtime`].
    #[derive(Debug)]
    pub struct OpenAiRealtimeBuilder {
        base_url: String,
        api_key: Option<String>,
        model: String,
        settings: RealtimeSettings,
        connect_timeout: Duration,
    }

    impl OpenAiRealtimeBuilder {
        /// The API's base URL (`https://api.openai.com/v1` by default; `http://127.0.0.1:…/v1`
        /// for a local server). `/realtime` and the model are added unless the URL names
        /// them; its query is kept (a loopback server's `?scenario=…`).
        pub fn base_url(mut self, url: impl Into<String>) -> Self {
            self.base_url = url.into();
            self
        }

        /// The API key (default: `OPENAI_API_KEY`).
        pub fn api_key(mut self, key: impl Into<String>) -> Self {
            self.api_key = Some(key.into());
            self
        }

        /// The model (default `gpt-realtime`).
        pub fn model(mut self, model: impl Into<String>) -> Self {
            self.model = model.into();
            self
        }

        /// The voice (default: the server's, `marin`).
        pub fn voice(mut self, voice: impl Into<String>) -> Self {
            self.settings.voice = Some(voice.into());
            self
        }

        /// Every session setting at once: formats, turn detection, transcription, the
        /// connection's age limit, the input pieces, reconnection.
        pub fn settings(mut self, settings: RealtimeSettings) -> Self {
            self.settings = settings;
            self
        }

        /// How long opening the connection may take (default 10 s).
        pub fn connect_timeout(mut self, timeout: Duration) -> Self {
            self.connect_timeout = timeout;
            self
        }

        /// Checks the configuration.
        pub fn build(self) -> Result<OpenAiRealtime, RealtimeConfigError> {
            let api_key = match self.api_key {
                Some(key) => key,
                None => {
                    std::env::var("OPENAI_API_KEY").map_err(|_| RealtimeConfigError::NoApiKey)?
                }
            };
            let url = websocket_url(&self.base_url, &self.model).ok_or(
                RealtimeConfigError::BadBaseUrl {
                    url: self.base_url.clone(),
                },
            )?;
            Ok(OpenAiRealtime {
                url,
                api_key,
                model: self.model,
                settings: self.settings,
                connect_timeout: self.connect_timeout,
            })
        }
    }

    /// `https://host/v1?x=y` → `wss://host/v1/realtime?x=y&model=…`.
    pub(super) fn websocket_url(base: &str, model: &str) -> Option<String> {
        let (scheme, rest) = base.split_once("://")?;
        let scheme = match scheme {
            "https" | "wss" => "wss",
            "http" | "ws" => "ws",
            _ => return None,
        };
        let (address, query) = match rest.split_once('?') {
            Some((address, query)) => (address, Some(query)),
            None => (rest, None),
        };
        let address = address.trim_end_matches('/');
        let path = if address.ends_with("/realtime") {
            address.to_owned()
        } else {
            format!("{address}/realtime")
        };
        let mut url = format!("{scheme}://{path}");
        let mut params: Vec<&str> = query
            .map(|q| q.split('&').filter(|p| !p.is_empty()).collect())
            .unwrap_or_default();
        let model_param = format!("model={model}");
        if !params.iter().any(|p| p.starts_with("model=")) {
            params.push(&model_param);
        }
        url.push('?');
        url.push_str(&params.join("&"));
        Some(url)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_websocket_url_follows_the_base_url() {
            assert_eq!(
                websocket_url("https://api.openai.com/v1", "gpt-realtime").as_deref(),
                Some("wss://api.openai.com/v1/realtime?model=gpt-realtime")
            );
            assert_eq!(
                websocket_url("http://127.0.0.1:9/v1?scenario=R1&tag=t", "m").as_deref(),
                Some("ws://127.0.0.1:9/v1/realtime?scenario=R1&tag=t&model=m")
            );
            assert_eq!(
                websocket_url("ws://h/v1/realtime?model=x", "m").as_deref(),
                Some("ws://h/v1/realtime?model=x")
            );
            assert_eq!(websocket_url("ftp://h", "m"), None);
        }
    }
}
