//! The model table: what each known model can take and what it costs, served read-only as
//! `wuhu://config/models.json`.
//!
//! Prices are US dollars per million tokens, as the providers list them (2025). A model that
//! is not in the table still works: it gets [`UNKNOWN_CONTEXT_WINDOW`], the provider codec's
//! default output limit, and no price (its messages record tokens but no cost).

use serde::Serialize;

use crate::wire::Usage;

/// Context window assumed for a model missing from the table.
pub const UNKNOWN_CONTEXT_WINDOW: u64 = 128_000;

/// One row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    /// Model id as the provider names it.
    pub id: &'static str,
    /// Provider id (`anthropic`, `openai`, `openai-compatible`).
    pub provider: &'static str,
    /// Context window in tokens.
    pub context_window: u64,
    /// Largest output per request in tokens.
    pub max_output_tokens: u32,
    /// Dollars per million uncached input tokens.
    pub input_per_mtok: f64,
    /// Dollars per million output tokens.
    pub output_per_mtok: f64,
    /// Dollars per million input tokens read from the prompt cache.
    pub cache_read_per_mtok: f64,
    /// Dollars per million input tokens written to the prompt cache.
    pub cache_write_per_mtok: f64,
}

const fn row(
    id: &'static str,
    provider: &'static str,
    context_window: u64,
    max_output_tokens: u32,
    prices: [f64; 4],
) -> ModelInfo {
    ModelInfo {
        id,
        provider,
        context_window,
        max_output_tokens,
        input_per_mtok: prices[0],
        output_per_mtok: prices[1],
        cache_read_per_mtok: prices[2],
        cache_write_per_mtok: prices[3],
    }
}

/// The built-in table. OpenAI bills no cache writes; Anthropic's are the 5-minute rate.
pub const MODELS: &[ModelInfo] = &[
    row(
        "claude-opus-4-1",
        "anthropic",
        200_000,
        32_000,
        [15.0, 75.0, 1.5, 18.75],
    ),
    row(
        "claude-sonnet-4-5",
        "anthropic",
        200_000,
        64_000,
        [3.0, 15.0, 0.3, 3.75],
    ),
    row(
        "claude-sonnet-4",
        "anthropic",
        200_000,
        64_000,
        [3.0, 15.0, 0.3, 3.75],
    ),
    row(
        "claude-haiku-4-5",
        "anthropic",
        200_000,
        64_000,
        [1.0, 5.0, 0.1, 1.25],
    ),
    row(
        "gpt-5",
        "openai",
        400_000,
        128_000,
        [1.25, 10.0, 0.125, 0.0],
    ),
    row(
        "gpt-5-mini",
        "openai",
        400_000,
        128_000,
        [0.25, 2.0, 0.025, 0.0],
    ),
    row(
        "gpt-5-nano",
        "openai",
        400_000,
        128_000,
        [0.05, 0.4, 0.005, 0.0],
    ),
    row("gpt-4.1", "openai", 1_047_576, 32_768, [2.0, 8.0, 0.5, 0.0]),
    row("gpt-4o", "openai", 128_000, 16_384, [2.5, 10.0, 1.25, 0.0]),
    row(
        "gpt-4o-mini",
        "openai",
        128_000,
        16_384,
        [0.15, 0.6, 0.075, 0.0],
    ),
];

/// The row for `model`: an exact id, else the longest id that `model` starts with followed
/// by `-` (dated snapshots such as `claude-sonnet-4-5-20250929` or `gpt-4o-2024-08-06`).
pub fn lookup(model: &str) -> Option<&'static ModelInfo> {
    MODELS.iter().find(|m| m.id == model).or_else(|| {
        MODELS
            .iter()
            .filter(|m| {
                model
                    .strip_prefix(m.id)
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|m| m.id.len())
    })
}

/// Prefix of `fake` provider models whose context window the name sets: `fake-window-4000`
/// has a 4,000-token window (end-to-end tests of compaction use small windows).
pub const FAKE_WINDOW_PREFIX: &str = "fake-window-";

/// The context window of `model` on `provider`: the table's, a `fake-window-N` model's `N`,
/// or [`UNKNOWN_CONTEXT_WINDOW`].
pub fn context_window(provider: &str, model: &str) -> u64 {
    if provider == super::fake::PROVIDER
        && let Some(n) = model
            .strip_prefix(FAKE_WINDOW_PREFIX)
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
    {
        return n;
    }
    lookup(model).map_or(UNKNOWN_CONTEXT_WINDOW, |m| m.context_window)
}

/// What `usage` cost on `model`, in dollars; `None` for a model without a price.
pub fn cost_usd(model: &str, usage: &Usage) -> Option<f64> {
    let info = lookup(model)?;
    let uncached = usage
        .input_tokens
        .saturating_sub(usage.cache_read_tokens)
        .saturating_sub(usage.cache_write_tokens);
    let dollars = uncached as f64 * info.input_per_mtok
        + usage.output_tokens as f64 * info.output_per_mtok
        + usage.cache_read_tokens as f64 * info.cache_read_per_mtok
        + usage.cache_write_tokens as f64 * info.cache_write_per_mtok;
    Some(dollars / 1_000_000.0)
}

/// `wuhu://config/models.json`: the table and the defaults for unknown models.
pub fn table_json() -> serde_json::Value {
    serde_json::json!({
        "models": MODELS,
        "unknownModel": {
            "contextWindow": UNKNOWN_CONTEXT_WINDOW,
            "maxOutputTokens": "the provider's default (anthropic: 8192; others: not sent)",
            "price": null,
        },
        "pricesIn": "USD per million tokens",
    })
}

/// Token and cost totals over assistant messages (`GET /v1/sessions/:id/usage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    /// Assistant messages counted.
    pub messages: u64,
    /// Prompt tokens (cache reads and writes included).
    pub input_tokens: u64,
    /// Output tokens (reasoning included).
    pub output_tokens: u64,
    /// Prompt tokens read from the cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the cache.
    pub cache_write_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Dollars, over the messages that have a cost.
    pub cost_usd: f64,
    /// Messages of models without a price (their tokens are counted, their cost is not).
    pub unpriced_messages: u64,
}

impl UsageTotals {
    /// Adds one message's usage.
    pub fn add(&mut self, usage: &Usage) {
        self.messages += 1;
        self.input_tokens = self.input_tokens.saturating_add(usage.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(usage.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(usage.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(usage.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(usage.reasoning_tokens);
        match usage.cost_usd {
            Some(cost) if cost.is_finite() && cost >= 0.0 => self.cost_usd += cost,
            _ => self.unpriced_messages += 1,
        }
    }
}

/// Usage of one session: the totals and the same per `(provider, model)`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionUsage {
    /// Over every assistant message.
    #[serde(flatten)]
    pub total: UsageTotals,
    /// Per provider and model, in order of first use.
    pub by_model: Vec<ModelUsage>,
}

/// [`UsageTotals`] of one provider and model.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelUsage {
    /// Provider id.
    pub provider: String,
    /// Model id.
    pub model: String,
    /// Its totals.
    #[serde(flatten)]
    pub totals: UsageTotals,
}

impl SessionUsage {
    /// Adds the assistant messages and compaction summaries among `entries` (other entries
    /// are ignored). Requests without reported usage are not counted.
    pub fn add_entries(&mut self, entries: &[crate::wire::Entry]) {
        use crate::wire::{EntryPayload, Message};
        for entry in entries {
            // Summaries of compactions are requests too: they count.
            let (provider, model, usage) = match &entry.payload {
                EntryPayload::Message {
                    message: Message::Assistant(message),
                } => (&message.provider, &message.model, &message.usage),
                EntryPayload::Compaction(compaction) => {
                    (&compaction.provider, &compaction.model, &compaction.usage)
                }
                _ => continue,
            };
            let Some(usage) = usage else {
                continue;
            };
            self.total.add(usage);
            let row = match self
                .by_model
                .iter()
                .position(|m| &m.provider == provider && &m.model == model)
            {
                Some(i) => &mut self.by_model[i],
                None => {
                    self.by_model.push(ModelUsage {
                        provider: provider.clone(),
                        model: model.clone(),
                        totals: UsageTotals::default(),
                    });
                    let last = self.by_model.len() - 1;
                    &mut self.by_model[last]
                }
            };
            row.totals.add(usage);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_matches_ids_and_dated_snapshots_only() {
        let cases = [
            ("claude-sonnet-4-5", Some("claude-sonnet-4-5")),
            ("claude-sonnet-4-5-20250929", Some("claude-sonnet-4-5")),
            ("claude-sonnet-4-20250514", Some("claude-sonnet-4")),
            ("gpt-4o-2024-08-06", Some("gpt-4o")),
            ("gpt-4o-mini-2024-07-18", Some("gpt-4o-mini")),
            ("gpt-5-mini", Some("gpt-5-mini")),
            ("gpt-4oo", None),
            ("gpt-4", None),
            ("my-local-llama", None),
            ("", None),
        ];
        for (model, want) in cases {
            assert_eq!(lookup(model).map(|m| m.id), want, "{model}");
        }
    }

    #[test]
    fn table_is_consistent() {
        for (i, m) in MODELS.iter().enumerate() {
            assert!(
                m.context_window > u64::from(m.max_output_tokens),
                "{}",
                m.id
            );
            assert!(m.cache_read_per_mtok < m.input_per_mtok, "{}", m.id);
            assert!(m.output_per_mtok > m.input_per_mtok, "{}", m.id);
            assert!(
                MODELS[..i].iter().all(|o| o.id != m.id),
                "duplicate {}",
                m.id
            );
            assert!(
                crate::llm::PROVIDERS.contains(&m.provider),
                "{}: {}",
                m.id,
                m.provider
            );
        }
    }

    #[test]
    fn session_usage_sums_per_model_and_skips_other_entries() {
        use crate::wire::{AssistantMessage, Entry, EntryPayload, Message};
        let assistant = |provider: &str, model: &str, usage: Option<Usage>| Entry {
            cursor: 0,
            id: String::new(),
            created_at: 0,
            payload: EntryPayload::Message {
                message: Message::Assistant(AssistantMessage {
                    provider: provider.into(),
                    model: model.into(),
                    usage,
                    ..AssistantMessage::default()
                }),
            },
        };
        let usage = |input: u64, output: u64, cost: Option<f64>| Usage {
            input_tokens: input,
            output_tokens: output,
            total_tokens: input + output,
            cache_read_tokens: input / 2,
            cost_usd: cost,
            ..Usage::default()
        };
        let entries = [
            assistant(
                "anthropic",
                "claude-sonnet-4-5",
                Some(usage(100, 10, Some(0.5))),
            ),
            Entry {
                cursor: 0,
                id: String::new(),
                created_at: 0,
                payload: EntryPayload::Message {
                    message: Message::User {
                        author: "a".into(),
                        content: "x".into(),
                        queue_item_id: None,
                        lane: None,
                    },
                },
            },
            assistant("openai", "gpt-5", Some(usage(40, 4, Some(0.25)))),
            assistant(
                "anthropic",
                "claude-sonnet-4-5",
                Some(usage(200, 20, Some(1.0))),
            ),
            assistant("fake", "fake-echo", Some(usage(2, 1, None))),
            assistant("fake", "fake-echo", None),
        ];
        let mut totals = SessionUsage::default();
        // Page by page gives the same sums as all at once.
        totals.add_entries(&entries[..2]);
        totals.add_entries(&entries[2..]);
        let json = serde_json::to_value(&totals).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "messages": 4, "inputTokens": 342, "outputTokens": 35, "cacheReadTokens": 171,
                "cacheWriteTokens": 0, "reasoningTokens": 0, "costUsd": 1.75, "unpricedMessages": 1,
                "byModel": [
                    {"provider": "anthropic", "model": "claude-sonnet-4-5", "messages": 2, "inputTokens": 300,
                     "outputTokens": 30, "cacheReadTokens": 150, "cacheWriteTokens": 0, "reasoningTokens": 0,
                     "costUsd": 1.5, "unpricedMessages": 0},
                    {"provider": "openai", "model": "gpt-5", "messages": 1, "inputTokens": 40, "outputTokens": 4,
                     "cacheReadTokens": 20, "cacheWriteTokens": 0, "reasoningTokens": 0, "costUsd": 0.25,
                     "unpricedMessages": 0},
                    {"provider": "fake", "model": "fake-echo", "messages": 1, "inputTokens": 2, "outputTokens": 1,
                     "cacheReadTokens": 1, "cacheWriteTokens": 0, "reasoningTokens": 0, "costUsd": 0.0,
                     "unpricedMessages": 1},
                ],
            })
        );
    }

    #[test]
    fn cost_splits_cached_input() {
        let usage = Usage {
            input_tokens: 1_000_000 + 2_000_000 + 100_000,
            output_tokens: 10_000,
            total_tokens: 0,
            cache_read_tokens: 2_000_000,
            cache_write_tokens: 100_000,
            reasoning_tokens: 5_000,
            cost_usd: None,
        };
        // 1M uncached × $3 + 10k × $15/M + 2M × $0.30/M + 100k × $3.75/M
        let cost = cost_usd("claude-sonnet-4-5-20250929", &usage).unwrap();
        assert!((cost - (3.0 + 0.15 + 0.6 + 0.375)).abs() < 1e-9, "{cost}");
        assert_eq!(cost_usd("my-local-llama", &usage), None);
        // Reported cache counts larger than the input never make the cost negative.
        let odd = Usage {
            input_tokens: 10,
            cache_read_tokens: 50,
            ..Usage::default()
        };
        assert!(cost_usd("gpt-4o", &odd).unwrap() >= 0.0);
    }
}
