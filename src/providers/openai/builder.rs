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
#[derive(Clone, Debug)]
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
            timeouts: LlmTimeouts::default(),
            retry: RetryPolicy::default(),
        }
    }
}

impl OpenAiBuilder {
    /// The API's base URL, up to the version (`https://api.openai.com/v1`,
    /// `http://localhost:11434/v1` for Ollama, `http://localhost:8000/v1` for vLLM);
    /// requests go to `{base_url}/chat/completions`.
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
    /// (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the first chunk and each next chunk may take (default: [`LlmTimeouts`]'s,
    /// 10 s each). The first-chunk wait starts when the request is sent.
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
        let invalid = |reason: String| OpenAiConfigError::InvalidBaseUrl {
            url: self.base_url.clone(),
            reason,
        };
        let base = reqwest::Url::parse(&self.base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https".into()));
        }
        let host = base.host_str().unwrap_or_default().to_owned();
        let endpoint = reqwest::Url::parse(&format!(
            "{}/chat/completions",
            self.base_url.trim_end_matches('/')
        ))
        .map_err(|e| invalid(e.to_string()))?;
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
                host,
                api_key: self.api_key.filter(|k| !k.is_empty()),
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
