//! What a session's model requests cost: tokens per agent and per model, and a price table
//! that turns them into money.
//!
//! The session keeps one [`SessionUsage`] for the whole call (across handoffs and
//! sub-tasks), adds every LLM request's usage to it when the request ends, and carries it
//! in its snapshots, so a restored or moved session goes on counting from where it was.
//! A turn's own share is [`RunResult::usage`](crate::RunResult::usage).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

use crate::llm::LlmUsage;

/// Tokens and requests, summed over some LLM requests.
///
/// Prompt and completion tokens are the totals the providers report; the cached and
/// audio counts are parts of them (OpenAI counts a cached or audio prompt token in
/// `prompt_tokens` too), kept apart because they are billed apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// LLM requests made, including those dropped before they ended.
    pub requests: u64,
    /// Preemptive requests (started before the user's turn was confirmed) that were
    /// thrown away because the user went on: counted in `requests` too. What preemptive
    /// generation costs beyond the requests it saved time on.
    pub discarded_preemptive: u64,
    /// Tokens of the requests (instructions, chat context, tool schemas).
    pub prompt_tokens: u64,
    /// Of the prompt tokens, those served from the provider's prompt cache.
    pub cached_prompt_tokens: u64,
    /// Of the prompt tokens, those that were audio.
    pub audio_prompt_tokens: u64,
    /// Tokens the models generated.
    pub completion_tokens: u64,
    /// Of the completion tokens, those that were audio.
    pub audio_completion_tokens: u64,
}

impl Usage {
    /// Adds one request's usage as the provider reported it (not a request: count those
    /// with [`Usage::requests`]).
    pub fn add_reported(&mut self, usage: &LlmUsage) {
        self.prompt_tokens += u64::from(usage.prompt_tokens);
        self.completion_tokens += u64::from(usage.completion_tokens);
        self.cached_prompt_tokens += u64::from(usage.cached_prompt_tokens.unwrap_or(0));
        self.audio_prompt_tokens += u64::from(usage.audio_prompt_tokens.unwrap_or(0));
        self.audio_completion_tokens += u64::from(usage.audio_completion_tokens.unwrap_or(0));
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// What these tokens cost at `price`: text prompt tokens that were neither cached nor
    /// audio at the prompt price, cached ones at the cached price, audio ones at the
    /// audio prices, the rest of the completion at the completion price.
    pub fn cost(&self, price: &ModelPrice) -> f64 {
        let text_prompt = self
            .prompt_tokens
            .saturating_sub(self.cached_prompt_tokens)
            .saturating_sub(self.audio_prompt_tokens);
        let text_completion = self
            .completion_tokens
            .saturating_sub(self.audio_completion_tokens);
        let per = |tokens: u64, per_million: f64| tokens as f64 * per_million / 1_000_000.0;
        per(text_prompt, price.prompt)
            + per(self.cached_prompt_tokens, price.cached_prompt)
            + per(self.audio_prompt_tokens, price.audio_prompt)
            + per(text_completion, price.completion)
            + per(self.audio_completion_tokens, price.audio_completion)
    }
}

impl AddAssign<&Usage> for Usage {
    fn add_assign(&mut self, other: &Usage) {
        self.requests += other.requests;
        self.discarded_preemptive += other.discarded_preemptive;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_prompt_tokens += other.cached_prompt_tokens;
        self.audio_prompt_tokens += other.audio_prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.audio_completion_tokens += other.audio_completion_tokens;
    }
}

/// One line of the ledger: what one agent's requests to one model used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageLine {
    /// The agent that made the requests.
    pub agent: String,
    /// The model that served them (its `Llm::name`, or the one a wrapper named).
    pub model: String,
    /// What they used.
    pub usage: Usage,
}

/// The usage ledger of a session: every LLM request's tokens, by agent and model, for the
/// whole call (across handoffs, sub-tasks, restores and moves). Read it with
/// `Session::usage()`; each turn's own share is in its `RunResult`.
///
/// The sum over agents equals the sum over models equals [`total`](Self::total): each
/// request is counted once, on the line of the agent that made it and the model that
/// served it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUsage {
    /// One line per (agent, model), in the order they were first used.
    lines: Vec<UsageLine>,
}

impl SessionUsage {
    /// Adds `usage` to the line of `agent` and `model`. Few lines per call (agents ×
    /// models), so a scan finds the line.
    pub(crate) fn add(&mut self, agent: &str, model: &str, usage: &Usage) {
        match self
            .lines
            .iter_mut()
            .find(|line| line.agent == agent && line.model == model)
        {
            Some(line) => line.usage += usage,
            None => self.lines.push(UsageLine {
                agent: agent.to_owned(),
                model: model.to_owned(),
                usage: *usage,
            }),
        }
    }

    /// Whether no request was counted yet.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Every line, in the order its agent and model were first used.
    pub fn lines(&self) -> &[UsageLine] {
        &self.lines
    }

    /// Everything the session used.
    pub fn total(&self) -> Usage {
        let mut total = Usage::default();
        for line in &self.lines {
            total += &line.usage;
        }
        total
    }

    /// What each agent used, by agent name (an agent that came back after a handoff is
    /// one entry).
    pub fn by_agent(&self) -> BTreeMap<String, Usage> {
        let mut out: BTreeMap<String, Usage> = BTreeMap::new();
        for line in &self.lines {
            *out.entry(line.agent.clone()).or_default() += &line.usage;
        }
        out
    }

    /// What each model served, by model name.
    pub fn by_model(&self) -> BTreeMap<String, Usage> {
        let mut out: BTreeMap<String, Usage> = BTreeMap::new();
        for line in &self.lines {
            *out.entry(line.model.clone()).or_default() += &line.usage;
        }
        out
    }

    /// What `agent` used (nothing if it made no request).
    pub fn agent(&self, agent: &str) -> Usage {
        let mut out = Usage::default();
        for line in self.lines.iter().filter(|l| l.agent == agent) {
            out += &line.usage;
        }
        out
    }

    /// What the call cost at `prices`, in the unit the prices are in. Models the table
    /// does not price are named in [`Cost::unpriced`] and cost nothing in the sums, so a
    /// missing price shows rather than reading as free.
    pub fn cost(&self, prices: &PriceTable) -> Cost {
        let mut cost = Cost::default();
        for line in &self.lines {
            let Some(price) = prices.price(&line.model) else {
                if !cost.unpriced.contains(&line.model) {
                    cost.unpriced.push(line.model.clone());
                }
                continue;
            };
            let amount = line.usage.cost(price);
            cost.total += amount;
            *cost.by_agent.entry(line.agent.clone()).or_default() += amount;
            *cost.by_model.entry(line.model.clone()).or_default() += amount;
        }
        cost
    }
}

/// What one model's tokens cost, per million tokens, in whatever unit the host bills in.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ModelPrice {
    /// Per million prompt tokens that are neither cached nor audio.
    pub prompt: f64,
    /// Per million cached prompt tokens.
    pub cached_prompt: f64,
    /// Per million audio prompt tokens.
    pub audio_prompt: f64,
    /// Per million completion tokens that are not audio.
    pub completion: f64,
    /// Per million audio completion tokens.
    pub audio_completion: f64,
}

impl ModelPrice {
    /// Text prices: `prompt` and `completion` per million tokens; cached prompt tokens at
    /// the prompt price until [`cached`](Self::cached) says otherwise, audio ones too
    /// until [`audio`](Self::audio).
    pub fn text(prompt: f64, completion: f64) -> Self {
        Self {
            prompt,
            cached_prompt: prompt,
            audio_prompt: prompt,
            completion,
            audio_completion: completion,
        }
    }

    /// The price of a million cached prompt tokens.
    pub fn cached(mut self, per_million: f64) -> Self {
        self.cached_prompt = per_million;
        self
    }

    /// The prices of a million audio prompt and audio completion tokens.
    pub fn audio(mut self, prompt: f64, completion: f64) -> Self {
        self.audio_prompt = prompt;
        self.audio_completion = completion;
        self
    }
}

/// Prices by model name, the host's to fill: the engine knows no prices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriceTable {
    models: HashMap<String, ModelPrice>,
}

impl PriceTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Prices `model` (by the name the ledger shows: its `Llm::name`).
    pub fn model(mut self, model: impl Into<String>, price: ModelPrice) -> Self {
        self.models.insert(model.into(), price);
        self
    }

    /// The price of `model`, if the table has one.
    pub fn price(&self, model: &str) -> Option<&ModelPrice> {
        self.models.get(model)
    }
}

/// What a session cost ([`SessionUsage::cost`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cost {
    /// Everything priced.
    pub total: f64,
    /// By agent.
    pub by_agent: BTreeMap<String, f64>,
    /// By model.
    pub by_model: BTreeMap<String, f64>,
    /// Models the session used that the table does not price (not in the sums).
    pub unpriced: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(prompt: u32, completion: u32) -> Usage {
        let mut usage = Usage {
            requests: 1,
            ..Usage::default()
        };
        usage.add_reported(&LlmUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_prompt_tokens: Some(prompt / 2),
            audio_prompt_tokens: None,
            audio_completion_tokens: Some(completion / 4),
        });
        usage
    }

    #[test]
    fn the_sums_by_agent_and_by_model_equal_the_total() {
        let mut ledger = SessionUsage::default();
        ledger.add("reception", "fast", &reported(100, 20));
        ledger.add("billing", "fast", &reported(300, 40));
        ledger.add("reception", "smart", &reported(50, 8));
        ledger.add("reception", "fast", &reported(10, 4));
        let total = ledger.total();
        assert_eq!(total.requests, 4);
        assert_eq!(total.prompt_tokens, 460);
        assert_eq!(total.cached_prompt_tokens, 50 + 150 + 25 + 5);
        let mut by_agent = Usage::default();
        for usage in ledger.by_agent().values() {
            by_agent += usage;
        }
        let mut by_model = Usage::default();
        for usage in ledger.by_model().values() {
            by_model += usage;
        }
        assert_eq!(by_agent, total);
        assert_eq!(by_model, total);
        assert_eq!(ledger.agent("reception").requests, 3);
        assert_eq!(ledger.lines().len(), 3, "one line per agent and model");
    }

    #[test]
    fn cost_prices_cached_and_audio_tokens_apart_and_names_unpriced_models() {
        let usage = Usage {
            requests: 1,
            prompt_tokens: 1_000_000,
            cached_prompt_tokens: 400_000,
            audio_prompt_tokens: 100_000,
            completion_tokens: 200_000,
            audio_completion_tokens: 50_000,
            discarded_preemptive: 0,
        };
        let price = ModelPrice::text(2.0, 8.0).cached(0.5).audio(40.0, 80.0);
        // 500k text prompt × 2 + 400k cached × 0.5 + 100k audio × 40 + 150k × 8 + 50k × 80.
        let expected = 1.0 + 0.2 + 4.0 + 1.2 + 4.0;
        assert!((usage.cost(&price) - expected).abs() < 1e-9);
        let mut ledger = SessionUsage::default();
        ledger.add("a", "priced", &usage);
        ledger.add("a", "mystery", &usage);
        let cost = ledger.cost(&PriceTable::new().model("priced", price));
        assert!((cost.total - expected).abs() < 1e-9);
        assert_eq!(cost.unpriced, ["mystery"]);
        assert!((cost.by_agent["a"] - expected).abs() < 1e-9);
    }
}
