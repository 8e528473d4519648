//! Configuring an [`OpenAiLlm`]: the builder, the environment, and what can be wrong.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{Config, OpenAiLlm, RetryPolicy};
use crate::LlmTimeouts;

/// OpenAI's API, the default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The model [`OpenAiLlm::from_env`] uses against OpenAI's API when `OPENAI_MODEL` is
/// not set.
pub const DEFAULT_MODEL: &str = "gpt-4.1-mini";

/// The provider's own bounds on each attempt of a request (first chunk 4 s, between chunks
/// 10 s), inside the session's [`LlmTimeouts`] (10 s each by default).
///
/// The session's first-chunk bound is the outer one: it runs from the request over every
/// attempt, and when it ends the turn fails, whatever the provider was doing. So an
/// attempt must give up well before it for a retry to happen at all: with these defaults an
/// attempt that hears nothing for 4 s is dropped, the retry goes out after the 0.5 s
/// backoff of [`RetryPolicy::default`], and it too has 4 s, ending at 8.5 s, before the
/// session's 10 s. 4 s is several times the time to first token of a chat model on a
/// hosted API (well under 2 s usually), so a healthy answer is not cut; raise both this
/// and the session's bound for a model that thinks before it speaks (a reasoning model, a
/// local model loading on its first request).
///
/// Between chunks the provider waits as long as the session does by default: once text
/// was forwarded there is no retry (the agent would say it twice), so a shorter bound
/// would only fail a slow answer sooner. See "Timeouts in layers" in the [module docs](super#timeouts-in-layers).
pub const DEFAULT_ATTEMPT_TIMEOUTS: LlmTimeouts = LlmTimeouts {
    first_chunk: Duration::from_secs(4),
    between_chunks: Duration::from_secs(10),
};

/// Body fields the provider writes itself; [`OpenAiBuilder::extra_body`] refuses them.
const RESERVED_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
];

/// What is wrong with an [`OpenAiLlm`]'s configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenAiConfigError {
    /// [`OpenAiLlm::from_env`] needs this environment variable.
    #[error("environment variable {name} is not set: {why}")]
    MissingEnv {
        /// The variable.
        name: &'static str,
        /// Why it is needed here.
        why: &'static str,
    },
    /// No model was set.
    #[error("no model set: call `.model(\"…\")` on the builder")]
    MissingModel,
    /// The base URL has no scheme (`127.0.0.1:8000/v1`): the URL parser would read it as
    /// relative, or take the host for a scheme.
    #[error(
        "base URL {url:?} has no scheme: write \"http://{url}\" (a local server) or \
         \"https://{url}\""
    )]
    MissingScheme {
        /// The URL as given.
        url: String,
    },
    /// The base URL is not an `http` or `https` URL.
    #[error("invalid base URL {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An extra body field the provider writes itself.
    #[error("extra body field {field:?} is written by the provider; {hint}")]
    ReservedField {
        /// The field.
        field: String,
        /// What to use instead.
        hint: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {message}")]
    Client {
        /// What the HTTP library reported.
        message: String,
    },
}

/// Builds an [`OpenAiLlm`]: `OpenAiLlm::builder().model("gpt-4.1-mini").api_key(key).build()`.
/// Its `Debug` says whether a key is set, never the key, and shows the base URL without a
/// password or query values.
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct OpenAiBuilder {
    base_url: String,
    api_key: Option<String>,
    model: Option<String>,
    temperature: Option<f64>,
    parallel_tool_calls: Option<bool>,
    extra: Map<String, Value>,
    connect_timeout: Duration,
    timeouts: LlmTimeouts,
    retry: RetryPolicy,
}

impl std::fmt::Debug for OpenAiBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiBuilder")
            .field("base_url", &super::shown_url(&self.base_url))
            .field("api_key", &self.api_key.as_ref().map(|_| "…"))
            .field("model", &self.model)
            .field("temperature", &self.temperature)
            .field("parallel_tool_calls", &self.parallel_tool_calls)
            .field("extra", &self.extra.keys().collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .finish()
    }
}

impl Default for OpenAiBuilder {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            model: None,
            temperature: None,
            parallel_tool_calls: None,
            extra: Map::new(),
            connect_timeout: Duration::from_secs(10),
            timeouts: DEFAULT_ATTEMPT_TIMEOUTS,
            retry: RetryPolicy::default(),
        }
    }
}

impl OpenAiBuilder {
    /// The API's base URL, up to the version (`https://api.openai.com/v1`,
    /// `http://localhost:11434/v1` for Ollama, `http://localhost:8000/v1` for vLLM);
    /// requests go to `{base_url}/chat/completions`. The whole endpoint, as some servers'
    /// docs print it (`…/v1/chat/completions`), is taken to mean the same: the suffix is
    /// not added twice ([`OpenAiLlm::endpoint`] says where requests go). A query (an
    /// `api-version`) is kept.
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// The API key, sent as `Authorization: Bearer …` (local servers may need none).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The model name, e.g. `gpt-4.1-mini` (required).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sampling temperature (the server's default when not set).
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Whether the model may call several tools in one step (the server's default when not
    /// set; sent only on requests that carry tools, as OpenAI requires).
    pub fn parallel_tool_calls(mut self, parallel: bool) -> Self {
        self.parallel_tool_calls = Some(parallel);
        self
    }

    /// A field added to every request body as is, e.g. `max_completion_tokens`, `seed`,
    /// `reasoning_effort` or a server's own options. The fields the provider writes
    /// (model, messages, stream, tools, …) are refused by [`OpenAiBuilder::build`].
    pub fn extra_body(mut self, field: impl Into<String>, value: Value) -> Self {
        self.extra.insert(field.into(), value);
        self
    }

    /// How long opening the connection and getting the response headers may take
    /// (default 10 s). The headers are also awaited within the attempt's first-chunk bound
    /// ([`OpenAiBuilder::timeouts`]), whichever ends sooner: some proxies hold them back
    /// until the model starts answering.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the first chunk and each next chunk of one attempt may take (default:
    /// [`DEFAULT_ATTEMPT_TIMEOUTS`], 4 s and 10 s). The first-chunk wait starts when the
    /// attempt is sent. Keep the first-chunk bound, times the attempts that should fit,
    /// plus the backoffs, under the session's ([`LlmTimeouts`], 10 s by default): the
    /// session's bound covers every attempt, and ends the turn when it runs out.
    pub fn timeouts(mut self, timeouts: LlmTimeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// When to try a failed request again (default: [`RetryPolicy::default`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Checks the configuration and builds the model (one HTTP connection pool, shared by
    /// every session that uses it).
    pub fn build(self) -> Result<OpenAiLlm, OpenAiConfigError> {
        let model = self
            .model
            .filter(|m| !m.is_empty())
            .ok_or(OpenAiConfigError::MissingModel)?;
        if let Some(field) = self
            .extra
            .keys()
            .find(|k| RESERVED_FIELDS.contains(&k.as_str()))
        {
            let hint = match field.as_str() {
                "model" => "use `.model(..)`",
                "temperature" => "use `.temperature(..)`",
                "parallel_tool_calls" => "use `.parallel_tool_calls(..)`",
                _ => "it follows from the request",
            };
            return Err(OpenAiConfigError::ReservedField {
                field: field.clone(),
                hint,
            });
        }
        let endpoint = endpoint(&self.base_url)?;
        let host = endpoint.host_str().unwrap_or_default().to_owned();
        let shown = super::shown_url(endpoint.as_str());
        let client = reqwest::Client::builder()
            // Our own timeouts bound each wait (`LlmTimeouts`); reqwest's would cut a long
            // answer that is still streaming.
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|e| OpenAiConfigError::Client {
                message: e.to_string(),
            })?;
        Ok(OpenAiLlm {
            config: Arc::new(Config {
                endpoint,
                shown,
                host,
                api_key: self.api_key.filter(|k| !k.is_empty()),
                name: format!("openai/{model}"),
                model,
                temperature: self.temperature,
                parallel_tool_calls: self.parallel_tool_calls,
                extra: self.extra,
                connect_timeout: self.connect_timeout,
                timeouts: self.timeouts,
                retry: self.retry,
            }),
            client,
        })
    }

    /// A builder from the environment: `OPENAI_BASE_URL` (default OpenAI's API),
    /// `OPENAI_API_KEY` (required for OpenAI's API, optional for another base URL),
    /// `OPENAI_MODEL` (default [`DEFAULT_MODEL`] for OpenAI's API, required for another
    /// base URL, whose models have other names). Empty variables count as unset.
    pub fn from_env() -> Result<Self, OpenAiConfigError> {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, OpenAiConfigError> {
        let mut builder = Self::default();
        let custom_url = var("OPENAI_BASE_URL");
        match var("OPENAI_API_KEY") {
            Some(key) => builder = builder.api_key(key),
            None if custom_url.is_none() => {
                return Err(OpenAiConfigError::MissingEnv {
                    name: "OPENAI_API_KEY",
                    why: "OpenAI's API needs a key (set OPENAI_BASE_URL for a local server)",
                })
            }
            None => {}
        }
        match var("OPENAI_MODEL") {
            Some(model) => builder = builder.model(model),
            None if custom_url.is_none() => builder = builder.model(DEFAULT_MODEL),
            None => {
                return Err(OpenAiConfigError::MissingEnv {
                    name: "OPENAI_MODEL",
                    why: "a server other than OpenAI's has its own model names",
                })
            }
        }
        if let Some(url) = custom_url {
            builder = builder.base_url(url);
        }
        Ok(builder)
    }
}

/// Where requests go for `base_url`: `{base_url}/chat/completions`, the suffix added once.
fn endpoint(base_url: &str) -> Result<reqwest::Url, OpenAiConfigError> {
    let invalid = |reason: String| OpenAiConfigError::InvalidBaseUrl {
        url: super::shown_url(base_url),
        reason,
    };
    let trimmed = base_url.trim();
    if trimmed.is_empty() {
        return Err(invalid(format!(
            "it is empty; OpenAI's is {DEFAULT_BASE_URL}"
        )));
    }
    // `127.0.0.1:8000/v1` does not parse ("relative URL without a base") and
    // `localhost:11434/v1` parses with `localhost` as its scheme: both mean a missing
    // `http://`. A mistyped scheme (`http:/x`, `htps://x`) is left to the parser.
    if !trimmed.contains("://") && !trimmed.starts_with("http:") && !trimmed.starts_with("https:") {
        return Err(OpenAiConfigError::MissingScheme {
            url: trimmed.to_owned(),
        });
    }
    let mut url = reqwest::Url::parse(trimmed).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https".into()));
    }
    let path = url.path().trim_end_matches('/');
    let path = path.strip_suffix("/chat/completions").unwrap_or(path);
    let path = format!("{path}/chat/completions");
    url.set_path(&path);
    url.set_fragment(None);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn the_environment_names_the_missing_variable() {
        let err = OpenAiBuilder::from_vars(vars(&[])).unwrap_err();
        assert!(matches!(
            err,
            OpenAiConfigError::MissingEnv {
                name: "OPENAI_API_KEY",
                ..
            }
        ));
        let err =
            OpenAiBuilder::from_vars(vars(&[("OPENAI_BASE_URL", "http://x/v1")])).unwrap_err();
        assert!(err.to_string().contains("OPENAI_MODEL"), "{err}");
    }

    #[test]
    fn openai_needs_only_a_key_and_a_local_server_only_a_model() {
        let llm = OpenAiBuilder::from_vars(vars(&[("OPENAI_API_KEY", "sk")]))
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(llm.config.model, DEFAULT_MODEL);
        assert_eq!(crate::Llm::name(&llm), "openai/gpt-4.1-mini");
        assert_eq!(
            llm.config.endpoint.as_str(),
            "https://api.openai.com/v1/chat/completions"
        );
        let llm = OpenAiBuilder::from_vars(vars(&[
            ("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1/"),
            ("OPENAI_MODEL", "llama3.2"),
        ]))
        .unwrap()
        .build()
        .unwrap();
        assert_eq!(
            llm.config.endpoint.as_str(),
            "http://127.0.0.1:11434/v1/chat/completions"
        );
        assert_eq!(llm.config.api_key, None);
    }

    #[test]
    fn a_stalled_attempt_and_its_retry_fit_inside_the_sessions_first_chunk_bound() {
        let attempt = DEFAULT_ATTEMPT_TIMEOUTS.first_chunk;
        let backoff = RetryPolicy::default().delay(1, None).unwrap();
        let session = LlmTimeouts::default();
        assert!(
            attempt * 2 + backoff < session.first_chunk,
            "two attempts of {attempt:?} and a backoff of {backoff:?} must fit in the \
             session's {:?}",
            session.first_chunk
        );
        assert!(DEFAULT_ATTEMPT_TIMEOUTS.between_chunks <= session.between_chunks);
        let builder = OpenAiBuilder::default();
        assert_eq!(builder.timeouts, DEFAULT_ATTEMPT_TIMEOUTS);
    }

    #[test]
    fn the_endpoint_is_the_base_url_and_the_suffix_once_with_its_query() {
        let at = |base: &str| endpoint(base).unwrap().to_string();
        let expected = "http://127.0.0.1:8000/v1/chat/completions";
        for base in [
            "http://127.0.0.1:8000/v1",
            "http://127.0.0.1:8000/v1/",
            "http://127.0.0.1:8000/v1/chat/completions",
            "http://127.0.0.1:8000/v1/chat/completions/",
            " http://127.0.0.1:8000/v1 ",
        ] {
            assert_eq!(at(base), expected, "{base}");
        }
        assert_eq!(
            at("https://x.openai.azure.com/openai/deployments/d?api-version=2024-10-21"),
            "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            at("http://localhost:8080"),
            "http://localhost:8080/chat/completions"
        );
    }

    #[test]
    fn build_refuses_what_cannot_work() {
        assert_eq!(
            OpenAiBuilder::default().build().unwrap_err(),
            OpenAiConfigError::MissingModel
        );
        let err = OpenAiBuilder::default()
            .model("m")
            .base_url("ftp://x")
            .build()
            .unwrap_err();
        assert!(matches!(err, OpenAiConfigError::InvalidBaseUrl { .. }));
        let err = OpenAiBuilder::default()
            .model("m")
            .extra_body("temperature", Value::from(1))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains(".temperature("), "{err}");
        OpenAiBuilder::default()
            .model("m")
            .extra_body("max_completion_tokens", Value::from(100))
            .build()
            .unwrap();
    }
}
