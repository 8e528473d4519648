//! A failed request as a typed [`LlmError`], with what the retry rules need to know.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::Deserialize;

use crate::LlmError;

/// A failure of one attempt: the error the caller gets if it is not retried.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) error: LlmError,
    /// Whether another attempt may succeed (the retry rules still apply).
    pub(super) retryable: bool,
    /// How long the provider asked to wait first.
    pub(super) retry_after: Option<Duration>,
}

impl Failure {
    pub(super) fn retryable(error: LlmError) -> Self {
        Self {
            error,
            retryable: true,
            retry_after: None,
        }
    }

    pub(super) fn fatal(error: LlmError) -> Self {
        Self {
            error,
            retryable: false,
            retry_after: None,
        }
    }
}

/// OpenAI's error body: `{"error": {"message": …, "type": …, "code": …}}`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ErrorBody {
    #[serde(default)]
    pub(super) message: Option<String>,
    #[serde(default, rename = "type")]
    pub(super) kind: Option<String>,
    /// A string for OpenAI; some servers send a number.
    #[serde(default)]
    pub(super) code: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Envelope {
    error: ErrorBody,
}

impl ErrorBody {
    fn code(&self) -> Option<&str> {
        self.code.as_ref().and_then(|c| c.as_str())
    }

    /// Whether the provider says the request is longer than the model's context.
    pub(super) fn is_context_too_long(&self) -> bool {
        let named = |s: Option<&str>| s == Some("context_length_exceeded");
        named(self.code())
            || named(self.kind.as_deref())
            // vLLM and others say it only in words.
            || self.message.as_deref().is_some_and(|m| {
                let m = m.to_ascii_lowercase();
                m.contains("maximum context length") || m.contains("context length exceeded")
            })
    }
}

/// How much of a body that is not OpenAI's error JSON goes into the message.
const RAW_BODY_PREFIX: usize = 300;

/// The failure for an HTTP error status of a request to `endpoint`, from its headers and
/// body text.
pub(super) fn from_status(status: u16, headers: &HeaderMap, body: &str, endpoint: &str) -> Failure {
    let parsed = serde_json::from_str::<Envelope>(body).ok().map(|e| e.error);
    let message = match parsed.as_ref().and_then(|e| e.message.clone()) {
        Some(message) => message,
        None if body.trim().is_empty() => format!("HTTP {status} with an empty body"),
        None => prefix(body.trim(), RAW_BODY_PREFIX),
    };
    let retry_after = retry_after(headers);
    let context_too_long = parsed.as_ref().is_some_and(ErrorBody::is_context_too_long);
    let (error, retryable) = match status {
        _ if context_too_long => (LlmError::ContextTooLong { message }, false),
        401 | 403 => (LlmError::Auth { message }, false),
        429 => (
            LlmError::RateLimited {
                message,
                retry_after,
            },
            true,
        ),
        500..=599 => (LlmError::Server { status, message }, true),
        // Request timeout and conflict: the official clients retry these too.
        408 | 409 => (LlmError::Server { status, message }, true),
        // The URL is the likeliest mistake: say which one was asked.
        404 | 405 => {
            let message = match parsed {
                // The API answered (a model that does not exist, a path it knows is
                // wrong): its words, and where they came from.
                Some(_) => format!("{message} (POST {endpoint})"),
                // A router with nothing there.
                None => format!(
                    "no chat-completions endpoint at {endpoint}: check the base URL, which \
                     ends where `/chat/completions` is added (`https://api.openai.com/v1`, \
                     `http://localhost:11434/v1`); the server said: {message}"
                ),
            };
            (LlmError::BadRequest { status, message }, false)
        }
        _ => (LlmError::BadRequest { status, message }, false),
    };
    Failure {
        error,
        retryable,
        retry_after,
    }
}

/// The error of an `{"error": …}` object sent inside the stream.
pub(super) fn from_stream_error(body: ErrorBody) -> LlmError {
    let context_too_long = body.is_context_too_long();
    let message = body
        .message
        .unwrap_or_else(|| "the provider sent an error without a message".into());
    if context_too_long {
        LlmError::ContextTooLong { message }
    } else {
        LlmError::Other {
            message: format!("the provider reported an error mid-stream: {message}"),
        }
    }
}

/// `retry-after-ms` (OpenAI's, in milliseconds) or `Retry-After` in seconds. The HTTP-date
/// form of `Retry-After` is not read: the providers send seconds.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let value = headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()?;
        (value.is_finite() && value >= 0.0).then_some(value)
    };
    if let Some(ms) = number("retry-after-ms") {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    number("retry-after").map(Duration::from_secs_f64)
}

/// The error's text and its causes, for a transport failure.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// At most `max` bytes of `text`, cut on a character boundary.
pub(super) fn prefix(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    const URL: &str = "http://127.0.0.1:8000/v2/chat/completions";

    const OPENAI_429: &str = r#"{"error":{"message":"Rate limit reached for gpt-4.1-mini","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;

    #[test]
    fn statuses_map_to_typed_errors_with_the_providers_message() {
        let f = from_status(429, &headers(&[("retry-after", "2")]), OPENAI_429, URL);
        assert!(f.retryable);
        assert_eq!(
            f.error,
            LlmError::RateLimited {
                message: "Rate limit reached for gpt-4.1-mini".into(),
                retry_after: Some(Duration::from_secs(2)),
            }
        );
        let body = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        let f = from_status(401, &HeaderMap::new(), body, URL);
        assert!(!f.retryable);
        assert!(matches!(f.error, LlmError::Auth { message } if message.starts_with("Incorrect")));
        let body = r#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        assert!(matches!(
            from_status(400, &HeaderMap::new(), body, URL).error,
            LlmError::ContextTooLong { .. }
        ));
        let vllm = r#"{"object":"error","error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","code":400}}"#;
        assert!(matches!(
            from_status(400, &HeaderMap::new(), vllm, URL).error,
            LlmError::ContextTooLong { .. }
        ));
        let f = from_status(503, &HeaderMap::new(), "upstream overloaded", URL);
        assert!(f.retryable);
        assert_eq!(
            f.error,
            LlmError::Server {
                status: 503,
                message: "upstream overloaded".into()
            }
        );
        let f = from_status(404, &HeaderMap::new(), "", URL);
        assert!(!f.retryable);
        assert!(
            matches!(f.error, LlmError::BadRequest { status: 404, message } if message.contains("empty body") && message.contains(URL))
        );
    }

    #[test]
    fn a_404_names_the_url_and_says_whether_anything_answered_there() {
        let missing_model = r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
        let LlmError::BadRequest { message, .. } =
            from_status(404, &HeaderMap::new(), missing_model, URL).error
        else {
            panic!("a 404 is a bad request")
        };
        assert_eq!(
            message,
            format!(
                "The model `gpt-9` does not exist or you do not have access to it. (POST {URL})"
            )
        );
        let LlmError::BadRequest { message, .. } =
            from_status(404, &HeaderMap::new(), r#"{"detail":"Not Found"}"#, URL).error
        else {
            panic!("a 404 is a bad request")
        };
        assert!(
            message.starts_with(&format!(
                "no chat-completions endpoint at {URL}: check the base URL"
            )),
            "{message}"
        );
        assert!(
            message.ends_with(r#"the server said: {"detail":"Not Found"}"#),
            "{message}"
        );
    }

    #[test]
    fn retry_after_reads_milliseconds_first_then_seconds() {
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "250"), ("retry-after", "9")])),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "1.5")])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Wed, 21 Oct 2015 07:28:00 GMT"
            )])),
            None
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-1")])), None);
    }

    #[test]
    fn long_bodies_are_cut_on_a_character_boundary() {
        assert_eq!(prefix("ééé", 3), "é…");
        assert_eq!(prefix("abc", 3), "abc");
    }
}
