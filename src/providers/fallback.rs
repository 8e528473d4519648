//! A model made of several: [`FallbackLlm`] asks the first healthy one and moves to the
//! next when one fails before it answered (the rule is on the type).
//!
//! Nothing is spawned: the stream is an adapter over the current model's stream, read in
//! the caller's task. Dropping it (a barge-in, a close) drops the model's stream, which
//! closes its HTTP request.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use futures_util::FutureExt;
use tokio::time::Instant;

use crate::{Llm, LlmChunk, LlmError, LlmRequest, LlmStream};

/// Several [`Llm`]s in order of preference, as one: each request goes to the first healthy
/// model, and on to the next when one fails before the user could hear or see anything of
/// its answer. A model that failed is skipped for a cool-down. Cheap to clone; clones share
/// the models' health, and one instance may serve many sessions at once.
///
/// The rule, for each request:
///
/// 1. Ask the first model, in the order given, that is not cooling down.
/// 2. If it fails **before anything for the user was forwarded** — text or a tool call;
///    [`LlmChunk::Usage`] and [`LlmChunk::ServedBy`] say nothing to the user and do not
///    count (an adapter that reports usage first, then fails, still falls back) — with a
///    failure another model may not have ([`LlmError::Server`], [`LlmError::RateLimited`],
///    [`LlmError::Connect`], [`LlmError::Timeout`], [`LlmError::MalformedStream`],
///    [`LlmError::Panicked`]: a panic in the model's `chat` or while its stream is polled
///    is caught and counts as its failure), it cools down and the next model is asked the
///    same request. What it sent before failing is dropped. Models cooling down are asked
///    last, as a last resort, rather than failing the turn without trying them.
/// 3. A failure that is about the request or the configuration ([`LlmError::Auth`],
///    [`LlmError::BadRequest`], [`LlmError::ContextTooLong`], [`LlmError::Other`]) is
///    passed through as is: another model would refuse the same request, or the mistake
///    (a wrong key, a wrong URL) must be seen and fixed rather than hidden behind a backup.
/// 4. Once text or a tool call was forwarded, every failure is passed through as is: the
///    user heard the first words, and another model would start the answer again. The
///    model still cools down when the failure is its own (a stall, a broken stream).
///
/// A model that answers is healthy again at once; one that failed is skipped until its
/// cool-down ends, then asked first again. Fallbacks nest: a `FallbackLlm` among the
/// models of another moves on inside itself first, and fails to the outer one only when
/// all of its own models failed before answering.
///
/// Which model answered is in each [`SessionEvent::LlmMetrics`](crate::SessionEvent)
/// event ([`LlmMetrics::llm`](crate::LlmMetrics)): the stream yields
/// [`LlmChunk::ServedBy`] with the model's [`Llm::name`] just before that model's first
/// chunk (or its error, or its end); a nested fallback's own `ServedBy` follows it, so the
/// last one names the model that answered. The fallback's own name reads
/// `fallback(first, second, …)`.
///
/// The session's LLM timeouts bound the whole request, every model included, and the
/// fallback adds no timer of its own: each model must give up in time for the next one
/// (see "Timeouts in layers" in `docs/production.md`). With `OpenAiLlm` models, turn the
/// retries of all but the last off (`RetryPolicy::none()`): the first one's 4 s attempt
/// bound then leaves the next model 6 s of the session's 10.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use switchboard::prelude::*;
/// use switchboard::providers::FallbackLlm;
/// use switchboard::testing::{Reply, ScriptedLlm};
/// use switchboard::LlmError;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The primary is overloaded; the backup answers.
/// let overloaded = LlmError::Server { status: 503, message: "overloaded".into() };
/// let primary = ScriptedLlm::named("primary", [Reply::default().and_error(overloaded)]);
/// let backup = ScriptedLlm::named("backup", [Reply::text("Hello from the backup.")]);
/// let llm = FallbackLlm::builder()
///     .model(primary.clone())
///     .model(backup.clone())
///     .cool_down(Duration::from_secs(30))
///     .build()?;
/// assert_eq!(llm.name(), "fallback(primary, backup)");
///
/// let session = Session::builder()
///     .llm(Arc::new(llm))
///     .agent(Agent::builder("assistant").build()?)
///     .start(&Engine::start()?)
///     .await?;
/// let mut events = session.subscribe();
/// let result = session.run("hi").await?;
/// assert_eq!(result.assistant_messages().collect::<Vec<_>>(), ["Hello from the backup."]);
/// let served_by = loop {
///     if let SessionEvent::LlmMetrics(metrics) = events.recv().await? {
///         break metrics.llm;
///     }
/// };
/// assert_eq!(served_by, "backup");
/// assert_eq!((primary.request_count(), backup.request_count()), (1, 1));
/// session.close().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct FallbackLlm {
    models: Arc<[Model]>,
    cool_down: Duration,
    name: Arc<str>,
}

/// Builds a [`FallbackLlm`]: `FallbackLlm::builder().model(a).model(b).build()?`.
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct FallbackBuilder {
    models: Vec<Arc<dyn Llm>>,
    cool_down: Duration,
}

/// What is wrong with a [`FallbackLlm`]'s configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FallbackError {
    /// No model was added.
    #[error(
        "a fallback needs at least one model: add them in order of preference with \
         `.model(..)`"
    )]
    NoModels,
}

/// One model of the chain and its health.
struct Model {
    llm: Arc<dyn Llm>,
    /// Until when the model is skipped after a failure; `None` while it is healthy.
    cooling_until: Mutex<Option<Instant>>,
}

impl Model {
    fn cooling_until(&self) -> MutexGuard<'_, Option<Instant>> {
        // The guarded value is a plain instant: a panic elsewhere cannot leave it torn.
        self.cooling_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn is_healthy(&self, now: Instant) -> bool {
        self.cooling_until().is_none_or(|until| now >= until)
    }

    fn failed(&self, cool_down: Duration) {
        *self.cooling_until() = Some(Instant::now() + cool_down);
    }

    fn answered(&self) {
        *self.cooling_until() = None;
    }
}

impl FallbackLlm {
    /// How long a model that failed is skipped unless the builder says otherwise: 30 s,
    /// long enough not to ask a failing provider on every turn of a call, short enough
    /// that one that recovered is back within a few turns.
    pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(30);

    /// A builder; add models in order of preference.
    pub fn builder() -> FallbackBuilder {
        FallbackBuilder {
            models: Vec::new(),
            cool_down: Self::DEFAULT_COOL_DOWN,
        }
    }

    /// How long a model that failed is skipped.
    pub fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

impl FallbackBuilder {
    /// Adds a model after those added before: the first is asked first.
    pub fn model(mut self, llm: Arc<dyn Llm>) -> Self {
        self.models.push(llm);
        self
    }

    /// How long a model that failed is skipped (default [`FallbackLlm::DEFAULT_COOL_DOWN`], 30 s; zero
    /// asks the first model first on every request).
    pub fn cool_down(mut self, cool_down: Duration) -> Self {
        self.cool_down = cool_down;
        self
    }

    /// Checks the configuration and builds the fallback.
    pub fn build(self) -> Result<FallbackLlm, FallbackError> {
        if self.models.is_empty() {
            return Err(FallbackError::NoModels);
        }
        let names: Vec<&str> = self.models.iter().map(|m| m.name()).collect();
        let name = format!("fallback({})", names.join(", "));
        let models = self
            .models
            .into_iter()
            .map(|llm| Model {
                llm,
                cooling_until: Mutex::new(None),
            })
            .collect();
        Ok(FallbackLlm {
            models,
            cool_down: self.cool_down,
            name: name.into(),
        })
    }
}

impl fmt::Debug for FallbackLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = Instant::now();
        let health: Vec<(&str, bool)> = self
            .models
            .iter()
            .map(|m| (m.llm.name(), m.is_healthy(now)))
            .collect();
        f.debug_struct("FallbackLlm")
            .field("models (name, healthy)", &health)
            .field("cool_down", &self.cool_down)
            .finish()
    }
}

impl fmt::Debug for FallbackBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.models.iter().map(|m| m.name()).collect();
        f.debug_struct("FallbackBuilder")
            .field("models", &names)
            .field("cool_down", &self.cool_down)
            .finish()
    }
}

impl Llm for FallbackLlm {
    fn chat(&self, request: LlmRequest) -> LlmStream {
        let attempt = Attempt {
            models: self.models.clone(),
            cool_down: self.cool_down,
            tried: vec![false; self.models.len()],
            request,
            current: None,
            forwarded: false,
            early: Vec::new(),
            ready: VecDeque::new(),
            done: false,
        };
        Box::pin(stream::unfold(attempt, |mut attempt| async move {
            let item = attempt.next().await?;
            Some((item, attempt))
        }))
    }

    /// `fallback(first, second, …)`, from the models' own names.
    fn name(&self) -> &str {
        &self.name
    }
}

/// Whether another model may answer a request this one failed before answering: the
/// failure is the model's or its provider's, not the request's nor a mistake to fix.
fn another_model_may_answer(error: &LlmError) -> bool {
    match error {
        LlmError::Server { .. }
        | LlmError::RateLimited { .. }
        | LlmError::Connect { .. }
        | LlmError::Timeout { .. }
        | LlmError::MalformedStream { .. }
        | LlmError::Panicked { .. } => true,
        // The request (too long, malformed) would fail anywhere; a refused key or a wrong
        // URL is a mistake to see; an unknown failure is not assumed to be passing.
        LlmError::Auth { .. }
        | LlmError::BadRequest { .. }
        | LlmError::ContextTooLong { .. }
        | LlmError::Other { .. } => false,
        _ => false,
    }
}

/// Whether the user could hear or see a chunk: text, or a tool call (which runs a tool).
/// Usage and which model serves say nothing to the user: a model may fail after them and
/// the next one still answer as if it were the first.
fn reaches_the_user(chunk: &LlmChunk) -> bool {
    match chunk {
        LlmChunk::Text(_) | LlmChunk::ToolCall(_) => true,
        LlmChunk::Usage(_) | LlmChunk::ServedBy(_) => false,
        // A kind added later is taken as an answer: moving on after it could repeat it.
        _ => true,
    }
}

/// Asks `llm`, a panic in its `chat` becoming the stream's one error.
fn ask(llm: &dyn Llm, request: LlmRequest) -> LlmStream {
    match std::panic::catch_unwind(AssertUnwindSafe(|| llm.chat(request))) {
        Ok(stream) => stream,
        Err(panic) => stream::iter([Err(panicked(&*panic))]).boxed(),
    }
}

/// A model's panic as the failure it is: the model's, so the next one is asked.
fn panicked(panic: &(dyn Any + Send)) -> LlmError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned());
    LlmError::Panicked { message }
}

/// One request through the chain, advanced by each poll of its stream.
struct Attempt {
    models: Arc<[Model]>,
    cool_down: Duration,
    /// Which models this request has asked.
    tried: Vec<bool>,
    request: LlmRequest,
    /// The model asked now, by index, and its answer.
    current: Option<(usize, LlmStream)>,
    /// Whether a chunk the user could hear or see went to the engine: from then on, no
    /// other model.
    forwarded: bool,
    /// The current model's metadata (usage, an inner fallback's `ServedBy`) that came
    /// before anything for the user: yielded once the model answers, dropped if it fails
    /// and the next one is asked.
    early: Vec<LlmChunk>,
    /// Items to yield before asking the model for more: its `ServedBy`, its early
    /// metadata, then its first answer (or its end, or its error).
    ready: VecDeque<Result<LlmChunk, LlmError>>,
    done: bool,
}

impl Attempt {
    async fn next(&mut self) -> Option<Result<LlmChunk, LlmError>> {
        if let Some(item) = self.ready.pop_front() {
            return Some(item);
        }
        if self.done {
            return None;
        }
        loop {
            let (index, mut answer) = match self.current.take() {
                Some(current) => current,
                None => {
                    let index = self.pick()?;
                    self.tried[index] = true;
                    // A cheap clone: the chat context and the tools are shared (`Arc`),
                    // so each model asked costs no copy of the conversation.
                    let answer = ask(&*self.models[index].llm, self.request.clone());
                    (index, answer)
                }
            };
            // A panic while the model's stream is polled fails that model like any error
            // of its own; its stream is not polled again.
            let item = match AssertUnwindSafe(answer.next()).catch_unwind().await {
                Ok(item) => item,
                Err(panic) => Some(Err(panicked(&*panic))),
            };
            let model = &self.models[index];
            if self.forwarded {
                match &item {
                    Some(Ok(_)) => self.current = Some((index, answer)),
                    Some(Err(error)) => {
                        if another_model_may_answer(error) {
                            model.failed(self.cool_down);
                        }
                        self.done = true;
                    }
                    None => self.done = true,
                }
                return item;
            }
            match item {
                Some(Ok(chunk)) if !reaches_the_user(&chunk) => {
                    // Nothing the user hears yet: keep it until the model answers.
                    self.early.push(chunk);
                    self.current = Some((index, answer));
                    continue;
                }
                Some(Err(error)) if another_model_may_answer(&error) => {
                    model.failed(self.cool_down);
                    self.early.clear();
                    drop(answer); // closes its request before the next model is asked
                    if let Some(next) = self.pick() {
                        tracing::warn!(
                            model = model.llm.name(),
                            next = self.models[next].llm.name(),
                            %error,
                            cool_down = ?self.cool_down,
                            "model failed before answering; asking the next"
                        );
                        continue;
                    }
                    tracing::debug!(model = model.llm.name(), %error, "last model failed");
                    self.announce(index, Err(error));
                    self.done = true;
                }
                Some(Err(error)) => {
                    self.announce(index, Err(error));
                    self.done = true;
                }
                Some(Ok(chunk)) => {
                    model.answered();
                    self.announce(index, Ok(chunk));
                    self.forwarded = true;
                    self.current = Some((index, answer));
                }
                None => {
                    model.answered();
                    self.ready
                        .push_back(Ok(LlmChunk::ServedBy(model.llm.name().to_owned())));
                    self.ready.extend(self.early.drain(..).map(Ok));
                    self.done = true;
                }
            }
            return self.ready.pop_front();
        }
    }

    /// Queues what the model `index` said first: its name (so the session's first-chunk
    /// wait is not ended by a chunk that carries no answer, and the metrics name the model
    /// that answered), the metadata it sent before, then `first`.
    fn announce(&mut self, index: usize, first: Result<LlmChunk, LlmError>) {
        let name = self.models[index].llm.name().to_owned();
        self.ready.push_back(Ok(LlmChunk::ServedBy(name)));
        self.ready.extend(self.early.drain(..).map(Ok));
        self.ready.push_back(first);
    }

    /// The model to ask next: the first, in order, that this request has not asked and
    /// that is healthy; failing that, the first it has not asked at all.
    fn pick(&self) -> Option<usize> {
        let now = Instant::now();
        let untried = || (0..self.models.len()).filter(|&i| !self.tried[i]);
        untried()
            .find(|&i| self.models[i].is_healthy(now))
            .or_else(|| untried().next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TimeoutStage;

    #[test]
    fn failures_of_the_model_move_on_and_failures_of_the_request_do_not() {
        let message = || "m".to_owned();
        let moves_on = [
            LlmError::Server {
                status: 503,
                message: message(),
            },
            LlmError::RateLimited {
                message: message(),
                retry_after: None,
            },
            LlmError::Connect { message: message() },
            LlmError::Timeout {
                stage: TimeoutStage::FirstChunk,
                after: Duration::from_secs(4),
            },
            LlmError::MalformedStream { message: message() },
            LlmError::Panicked { message: message() },
        ];
        let passed_through = [
            LlmError::Auth { message: message() },
            LlmError::BadRequest {
                status: 400,
                message: message(),
            },
            LlmError::ContextTooLong { message: message() },
            LlmError::Other { message: message() },
        ];
        for error in moves_on {
            assert!(another_model_may_answer(&error), "{error}");
        }
        for error in passed_through {
            assert!(!another_model_may_answer(&error), "{error}");
        }
    }
}
