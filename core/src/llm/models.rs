//! The model table: what each known model can take and what it costs, served read-only as
//! `wuhu://config/models.json`.
//!
//! Prices are US dollars per million tokens, as the providers list them (2025). A tenant's
//! admins may replace or add rows in the workspace document `config/models.json`
//! ([`ModelTable::with_tenant`]); an invalid document is an error, never a silent fallback. A
//! model that is in neither still works: it gets [`UNKNOWN_CONTEXT_WINDOW`], the provider
//! codec's default output limit, and no price (its messages record tokens but no cost).

use serde::{Deserialize, Serialize};

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
    /// Whether it takes a reasoning setting (`crate::llm::reasoning`).
    pub reasoning: bool,
}

/// Whether a built-in row reasons.
const REASONS: bool = true;
/// Whether a built-in row does not.
const PLAIN: bool = false;

const fn row(
    id: &'static str,
    provider: &'static str,
    context_window: u64,
    max_output_tokens: u32,
    prices: [f64; 4],
    reasoning: bool,
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
        reasoning,
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
        REASONS,
    ),
    row(
        "claude-sonnet-4-5",
        "anthropic",
        200_000,
        64_000,
        [3.0, 15.0, 0.3, 3.75],
        REASONS,
    ),
    row(
        "claude-sonnet-4",
        "anthropic",
        200_000,
        64_000,
        [3.0, 15.0, 0.3, 3.75],
        REASONS,
    ),
    row(
        "claude-haiku-4-5",
        "anthropic",
        200_000,
        64_000,
        [1.0, 5.0, 0.1, 1.25],
        REASONS,
    ),
    row(
        "gpt-5",
        "openai",
        400_000,
        128_000,
        [1.25, 10.0, 0.125, 0.0],
        REASONS,
    ),
    row(
        "gpt-5-mini",
        "openai",
        400_000,
        128_000,
        [0.25, 2.0, 0.025, 0.0],
        REASONS,
    ),
    row(
        "gpt-5-nano",
        "openai",
        400_000,
        128_000,
        [0.05, 0.4, 0.005, 0.0],
        REASONS,
    ),
    row(
        "gpt-4.1",
        "openai",
        1_047_576,
        32_768,
        [2.0, 8.0, 0.5, 0.0],
        PLAIN,
    ),
    row(
        "gpt-4o",
        "openai",
        128_000,
        16_384,
        [2.5, 10.0, 1.25, 0.0],
        PLAIN,
    ),
    row(
        "gpt-4o-mini",
        "openai",
        128_000,
        16_384,
        [0.15, 0.6, 0.075, 0.0],
        PLAIN,
    ),
];

/// Where a tenant's rows live: the workspace document `config/models.json`
/// (`wuhu://workspace/config/models.json`; admins write it, see `crate::authority`).
pub const TENANT_TABLE_PATH: &str = "config/models.json";

/// Most rows a tenant's table may hold.
pub const MAX_TENANT_ROWS: usize = 256;

/// Longest model id, in characters.
pub const MAX_ID_CHARS: usize = 200;

/// A model's prices, dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Prices {
    /// Uncached input tokens.
    pub input_per_mtok: f64,
    /// Output tokens.
    pub output_per_mtok: f64,
    /// Input tokens read from the prompt cache.
    pub cache_read_per_mtok: f64,
    /// Input tokens written to the prompt cache.
    pub cache_write_per_mtok: f64,
}

/// One row of a [`ModelTable`]: a built-in row, or a tenant's.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelRow {
    /// Model id as the provider names it.
    pub id: String,
    /// Provider id.
    pub provider: String,
    /// Context window in tokens.
    pub context_window: u64,
    /// Largest output per request in tokens (`None`: the provider codec's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Prices (`None`: the model's requests record tokens but no cost).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
    /// Whether the tenant's table set this row (replacing or adding one).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tenant: bool,
    /// Whether requests may show the model images (`"images": false` in a tenant row marks a
    /// text-only model: a tool result's image is then a note, `llm::inline_images`).
    #[serde(rename = "images", skip_serializing_if = "is_true")]
    pub accepts_images: bool,
    /// Whether the model takes a reasoning setting (`crate::llm::reasoning`): Anthropic's
    /// extended thinking, OpenAI's reasoning effort. `"reasoning": true` in a tenant row marks
    /// one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reasoning: bool,
}

fn is_true(value: &bool) -> bool {
    *value
}

impl From<&ModelInfo> for ModelRow {
    fn from(info: &ModelInfo) -> ModelRow {
        ModelRow {
            id: info.id.to_string(),
            provider: info.provider.to_string(),
            context_window: info.context_window,
            max_output_tokens: Some(info.max_output_tokens),
            prices: Some(Prices {
                input_per_mtok: info.input_per_mtok,
                output_per_mtok: info.output_per_mtok,
                cache_read_per_mtok: info.cache_read_per_mtok,
                cache_write_per_mtok: info.cache_write_per_mtok,
            }),
            tenant: false,
            accepts_images: true,
            reasoning: info.reasoning,
        }
    }
}

/// A row of a tenant's `config/models.json`. A row whose id is a built-in row's replaces that
/// row, and fields it leaves out keep the built-in values; a new id adds a row, which needs a
/// `provider` and otherwise gets [`UNKNOWN_CONTEXT_WINDOW`], the provider's default output
/// limit, and no price unless `inputPerMtok` and `outputPerMtok` are both given (cache prices
/// then default to the input price).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TenantRow {
    id: String,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    context_window: Option<u64>,
    #[serde(default)]
    max_output_tokens: Option<u32>,
    #[serde(default)]
    input_per_mtok: Option<f64>,
    #[serde(default)]
    output_per_mtok: Option<f64>,
    #[serde(default)]
    cache_read_per_mtok: Option<f64>,
    #[serde(default)]
    cache_write_per_mtok: Option<f64>,
    #[serde(default)]
    images: Option<bool>,
    #[serde(default)]
    reasoning: Option<bool>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantDoc {
    models: Vec<TenantRow>,
}

/// Why a tenant's `config/models.json` was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ModelTableError {
    /// Not JSON of the shape `{"models":[{id, provider?, contextWindow?, …}]}`.
    #[error("wuhu://workspace/config/models.json is not a valid model table: {0}")]
    Shape(String),
    /// A row breaks a rule (named in the message).
    #[error("wuhu://workspace/config/models.json, row {index} ({id:?}): {reason}")]
    Row {
        /// Zero-based row index.
        index: usize,
        /// The row's id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// More than [`MAX_TENANT_ROWS`] rows.
    #[error("wuhu://workspace/config/models.json has {0} rows: at most 256")]
    TooManyRows(usize),
}

/// The model table a session uses: the built-in rows with its tenant's rows over them.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelTable {
    rows: Vec<ModelRow>,
}

impl Default for ModelTable {
    fn default() -> ModelTable {
        ModelTable::builtin()
    }
}

impl ModelTable {
    /// The built-in table ([`MODELS`]).
    pub fn builtin() -> ModelTable {
        ModelTable {
            rows: MODELS.iter().map(ModelRow::from).collect(),
        }
    }

    /// The built-in table with a tenant's `config/models.json` (`text`) over it; `None`
    /// (no document) is the built-in table.
    ///
    /// # Errors
    /// [`ModelTableError`] for a document that is not a valid table: the caller shows it, it
    /// never falls back to the built-in table silently.
    pub fn with_tenant(text: Option<&str>) -> Result<ModelTable, ModelTableError> {
        let mut table = ModelTable::builtin();
        let Some(text) = text else {
            return Ok(table);
        };
        let doc: TenantDoc =
            serde_json::from_str(text).map_err(|e| ModelTableError::Shape(e.to_string()))?;
        if doc.models.len() > MAX_TENANT_ROWS {
            return Err(ModelTableError::TooManyRows(doc.models.len()));
        }
        let mut seen: Vec<&str> = Vec::with_capacity(doc.models.len());
        for (index, row) in doc.models.iter().enumerate() {
            let refuse = |reason: &str| ModelTableError::Row {
                index,
                id: row.id.clone(),
                reason: reason.to_string(),
            };
            if row.id.trim().is_empty() || row.id.chars().count() > MAX_ID_CHARS {
                return Err(refuse("id must be 1 to 200 characters"));
            }
            if seen.contains(&row.id.as_str()) {
                return Err(refuse("id appears twice"));
            }
            seen.push(&row.id);
            if let Some(provider) = &row.provider
                && !super::PROVIDERS.contains(&provider.as_str())
            {
                return Err(refuse(&format!(
                    "unknown provider {provider:?}: use one of {}",
                    super::PROVIDERS.join(", ")
                )));
            }
            if row.context_window == Some(0) || row.max_output_tokens == Some(0) {
                return Err(refuse("contextWindow and maxOutputTokens must be above 0"));
            }
            let prices = [
                row.input_per_mtok,
                row.output_per_mtok,
                row.cache_read_per_mtok,
                row.cache_write_per_mtok,
            ];
            if prices.iter().flatten().any(|p| !p.is_finite() || *p < 0.0) {
                return Err(refuse("prices must be numbers of dollars, 0 or more"));
            }
            let builtin = table.rows.iter().position(|r| r.id == row.id);
            let base = match builtin {
                Some(i) => table.rows[i].clone(),
                None => ModelRow {
                    id: row.id.clone(),
                    provider: row
                        .provider
                        .clone()
                        .ok_or_else(|| refuse("a new model needs a provider"))?,
                    context_window: UNKNOWN_CONTEXT_WINDOW,
                    max_output_tokens: None,
                    prices: None,
                    tenant: true,
                    accepts_images: true,
                    reasoning: false,
                },
            };
            let prices = match (row.input_per_mtok, row.output_per_mtok, base.prices) {
                (Some(input), Some(output), _) => Some(Prices {
                    input_per_mtok: input,
                    output_per_mtok: output,
                    cache_read_per_mtok: row.cache_read_per_mtok.unwrap_or(input),
                    cache_write_per_mtok: row.cache_write_per_mtok.unwrap_or(input),
                }),
                (None, None, Some(base)) => Some(Prices {
                    cache_read_per_mtok: row
                        .cache_read_per_mtok
                        .unwrap_or(base.cache_read_per_mtok),
                    cache_write_per_mtok: row
                        .cache_write_per_mtok
                        .unwrap_or(base.cache_write_per_mtok),
                    ..base
                }),
                (Some(input), None, Some(base)) => Some(Prices {
                    input_per_mtok: input,
                    ..base
                }),
                (None, Some(output), Some(base)) => Some(Prices {
                    output_per_mtok: output,
                    ..base
                }),
                (None, None, None)
                    if row.cache_read_per_mtok.is_none() && row.cache_write_per_mtok.is_none() =>
                {
                    None
                }
                _ => {
                    return Err(refuse(
                        "a model without a built-in price needs both inputPerMtok and outputPerMtok",
                    ));
                }
            };
            let merged = ModelRow {
                id: row.id.clone(),
                provider: row.provider.clone().unwrap_or(base.provider),
                context_window: row.context_window.unwrap_or(base.context_window),
                max_output_tokens: row.max_output_tokens.or(base.max_output_tokens),
                prices,
                tenant: true,
                accepts_images: row.images.unwrap_or(base.accepts_images),
                reasoning: row.reasoning.unwrap_or(base.reasoning),
            };
            match builtin {
                Some(i) => table.rows[i] = merged,
                None => table.rows.push(merged),
            }
        }
        Ok(table)
    }

    /// The row for `model`: an exact id, else the longest id that `model` starts with followed
    /// by `-` (dated snapshots such as `claude-sonnet-4-5-20250929` or `gpt-4o-2024-08-06`).
    pub fn lookup(&self, model: &str) -> Option<&ModelRow> {
        self.rows.iter().find(|m| m.id == model).or_else(|| {
            self.rows
                .iter()
                .filter(|m| {
                    model
                        .strip_prefix(m.id.as_str())
                        .is_some_and(|rest| rest.starts_with('-'))
                })
                .max_by_key(|m| m.id.len())
        })
    }

    /// The context window of `model` on `provider`: the table's, a `fake-window-N` model's
    /// `N`, or [`UNKNOWN_CONTEXT_WINDOW`].
    pub fn context_window(&self, provider: &str, model: &str) -> u64 {
        if provider == super::fake::PROVIDER
            && let Some(n) = model
                .strip_prefix(FAKE_WINDOW_PREFIX)
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
        {
            return n;
        }
        self.lookup(model)
            .map_or(UNKNOWN_CONTEXT_WINDOW, |m| m.context_window)
    }

    /// What `usage` cost on `model`, in dollars; `None` for a model without a price.
    pub fn cost_usd(&self, model: &str, usage: &Usage) -> Option<f64> {
        let prices = self.lookup(model)?.prices?;
        let uncached = usage
            .input_tokens
            .saturating_sub(usage.cache_read_tokens)
            .saturating_sub(usage.cache_write_tokens);
        let dollars = uncached as f64 * prices.input_per_mtok
            + usage.output_tokens as f64 * prices.output_per_mtok
            + usage.cache_read_tokens as f64 * prices.cache_read_per_mtok
            + usage.cache_write_tokens as f64 * prices.cache_write_per_mtok;
        Some(dollars / 1_000_000.0)
    }

    /// Whether requests may show `model` images: unless its row says `"images": false` (a
    /// model not in the table is assumed to accept them).
    pub fn accepts_images(&self, model: &str) -> bool {
        self.lookup(model).is_none_or(|row| row.accepts_images)
    }

    /// `wuhu://config/models.json`: the rows in effect and the defaults for unknown models.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "models": self.rows,
            "unknownModel": {
                "contextWindow": UNKNOWN_CONTEXT_WINDOW,
                "maxOutputTokens": "the provider's default (anthropic: 8192; others: not sent)",
                "price": null,
            },
            "pricesIn": "USD per million tokens",
            "tenantTable": format!("wuhu://workspace/{TENANT_TABLE_PATH}"),
        })
    }
}

/// Prefix of `fake` provider models whose context window the name sets: `fake-window-4000`
/// has a 4,000-token window (end-to-end tests of compaction use small windows).
pub const FAKE_WINDOW_PREFIX: &str = "fake-window-";

/// Token and cost totals over assistant messages (`GET /v1/sessions/:id/usage`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionUsage {
    /// Over every assistant message.
    #[serde(flatten)]
    pub total: UsageTotals,
    /// Per provider and model, in order of first use.
    pub by_model: Vec<ModelUsage>,
    /// The decisions policy rules made on the session's tool calls
    /// (`wuhu_policy_decision_v1` entries, `crate::policy`).
    #[serde(default)]
    pub policy: PolicyDecisions,
    /// The session's `mcp_call`s (`crate::mcp_client`).
    #[serde(default)]
    pub mcp: McpCalls,
}

/// How many MCP tool calls the model made, how many failed, and per server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpCalls {
    /// `mcp_call`s the model made.
    pub calls: u64,
    /// Of them, those whose result was an error.
    pub errors: u64,
    /// Calls per server, in order of first use.
    pub by_server: Vec<McpServerCalls>,
}

/// One server's share of [`McpCalls`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpServerCalls {
    /// The server's name.
    pub server: String,
    /// Calls to it.
    pub calls: u64,
}

/// How many tool calls policy rules allowed, asked about and refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecisions {
    /// Allowed by a rule.
    pub allowed: u64,
    /// Asked about (whatever the answer).
    pub asked: u64,
    /// Refused by a rule.
    pub denied: u64,
}

/// [`UsageTotals`] of one provider and model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Adds the assistant messages and compaction summaries among `entries`, and counts their
    /// policy decisions (other entries are ignored). Requests without reported usage are not
    /// counted.
    pub fn add_entries(&mut self, entries: &[crate::wire::Entry]) {
        use crate::wire::{EntryPayload, Message};
        for entry in entries {
            if let EntryPayload::Custom { custom_type, data } = &entry.payload
                && custom_type == crate::wire::custom_types::POLICY_DECISION
            {
                let counter = match data["decision"].as_str() {
                    Some("allow") => &mut self.policy.allowed,
                    Some("ask") => &mut self.policy.asked,
                    Some("deny") => &mut self.policy.denied,
                    _ => continue,
                };
                *counter += 1;
                continue;
            }
            if let EntryPayload::Message {
                message: Message::ToolResult(result),
            } = &entry.payload
            {
                if result.tool_name == crate::tools::names::MCP_CALL && result.is_error {
                    self.mcp.errors += 1;
                }
                continue;
            }
            if let EntryPayload::Message {
                message: Message::Assistant(message),
            } = &entry.payload
            {
                for call in message
                    .tool_calls()
                    .filter(|c| c.name == crate::tools::names::MCP_CALL)
                {
                    let server = call.arguments["server"].as_str().unwrap_or("").to_string();
                    self.mcp.calls += 1;
                    match self.mcp.by_server.iter_mut().find(|s| s.server == server) {
                        Some(row) => row.calls += 1,
                        None => self.mcp.by_server.push(McpServerCalls { server, calls: 1 }),
                    }
                }
            }
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
        let table = ModelTable::builtin();
        for (model, want) in cases {
            assert_eq!(table.lookup(model).map(|m| m.id.as_str()), want, "{model}");
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
        let policy = |decision: &str| Entry {
            cursor: 0,
            id: String::new(),
            created_at: 0,
            payload: EntryPayload::Custom {
                custom_type: crate::wire::custom_types::POLICY_DECISION.into(),
                data: serde_json::json!({"decision": decision}),
            },
        };
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
        let message = |message: Message| Entry {
            cursor: 0,
            id: String::new(),
            created_at: 0,
            payload: EntryPayload::Message { message },
        };
        let mcp_calls = |calls: &[(&str, &str, &str)]| {
            message(Message::Assistant(AssistantMessage {
                content: calls
                    .iter()
                    .map(|(id, name, server)| {
                        crate::wire::ContentBlock::ToolCall(crate::wire::ToolCall {
                            id: id.to_string(),
                            name: name.to_string(),
                            arguments: serde_json::json!({"server": server, "tool": "t"}),
                        })
                    })
                    .collect(),
                ..AssistantMessage::default()
            }))
        };
        let mcp_result = |id: &str, name: &str, is_error: bool| {
            message(Message::ToolResult(crate::wire::ToolResult {
                tool_call_id: id.into(),
                tool_name: name.into(),
                content: String::new(),
                is_error,
                blobs: Vec::new(),
            }))
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
                        acting_for: None,
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
            policy("deny"),
            policy("ask"),
            policy("deny"),
            policy("bogus"),
            mcp_calls(&[
                ("c1", "mcp_call", "docs"),
                ("c2", "mcp_call", "tracker"),
                ("c3", "bash", ""),
            ]),
            mcp_result("c1", "mcp_call", true),
            mcp_result("c2", "mcp_call", false),
            mcp_result("c3", "bash", true),
            mcp_calls(&[("c4", "mcp_call", "docs")]),
        ];
        let mut totals = SessionUsage::default();
        // Page by page gives the same sums as all at once; a decision it cannot read is not
        // counted.
        totals.add_entries(&entries[..2]);
        totals.add_entries(&entries[2..]);
        let json = serde_json::to_value(&totals).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "messages": 4, "inputTokens": 342, "outputTokens": 35, "cacheReadTokens": 171,
                "cacheWriteTokens": 0, "reasoningTokens": 0, "costUsd": 1.75, "unpricedMessages": 1,
                "policy": {"allowed": 0, "asked": 1, "denied": 2},
                "mcp": {"calls": 3, "errors": 1, "byServer": [{"server": "docs", "calls": 2}, {"server": "tracker", "calls": 1}]},
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
        let table = ModelTable::builtin();
        let cost = table
            .cost_usd("claude-sonnet-4-5-20250929", &usage)
            .unwrap();
        assert!((cost - (3.0 + 0.15 + 0.6 + 0.375)).abs() < 1e-9, "{cost}");
        assert_eq!(table.cost_usd("my-local-llama", &usage), None);
        // Reported cache counts larger than the input never make the cost negative.
        let odd = Usage {
            input_tokens: 10,
            cache_read_tokens: 50,
            ..Usage::default()
        };
        assert!(table.cost_usd("gpt-4o", &odd).unwrap() >= 0.0);
    }

    /// A tenant's table: what each document makes of a few models (window, max output,
    /// dollars for one million input plus one million output tokens, whether the tenant set
    /// it), or the error it is refused with.
    #[test]
    fn tenant_tables_replace_and_add_rows_or_are_refused() {
        let mtok = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            ..Usage::default()
        };
        let describe = |doc: Option<&str>| -> String {
            match ModelTable::with_tenant(doc) {
                Err(e) => format!("error: {e}"),
                Ok(table) => [
                    "gpt-4o",
                    "gpt-4o-2024-08-06",
                    "claude-sonnet-4-5",
                    "my-llama-3",
                    "my-llama",
                ]
                .iter()
                .map(|model| match table.lookup(model) {
                    None => format!(
                        "{model}: unknown window={}",
                        table.context_window("openai-compatible", model)
                    ),
                    Some(row) => {
                        format!(
                            "{model}: {} {}/{:?} ${:?}{}",
                            row.provider,
                            row.context_window,
                            row.max_output_tokens,
                            table.cost_usd(model, &mtok),
                            if row.tenant { " tenant" } else { "" }
                        ) + if table.accepts_images(model) {
                            ""
                        } else {
                            " text-only"
                        }
                    }
                })
                .collect::<Vec<_>>()
                .join("; "),
            }
        };
        let cases = [
            (
                None,
                "gpt-4o: openai 128000/Some(16384) $Some(12.5); gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(12.5); claude-sonnet-4-5: anthropic 200000/Some(64000) $Some(18.0); my-llama-3: unknown window=128000; my-llama: unknown window=128000",
            ),
            // Empty: the built-in table.
            (
                Some(r#"{"models":[]}"#),
                "gpt-4o: openai 128000/Some(16384) $Some(12.5); gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(12.5); claude-sonnet-4-5: anthropic 200000/Some(64000) $Some(18.0); my-llama-3: unknown window=128000; my-llama: unknown window=128000",
            ),
            // A negotiated price for a built-in model keeps its window; dated ids follow.
            (
                Some(r#"{"models":[{"id":"gpt-4o","inputPerMtok":1,"outputPerMtok":2}]}"#),
                "gpt-4o: openai 128000/Some(16384) $Some(3.0) tenant; gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(3.0) tenant; claude-sonnet-4-5: anthropic 200000/Some(64000) $Some(18.0); my-llama-3: unknown window=128000; my-llama: unknown window=128000",
            ),
            // Only the output price: the input price stays.
            (
                Some(
                    r#"{"models":[{"id":"claude-sonnet-4-5","outputPerMtok":10,"contextWindow":1000000}]}"#,
                ),
                "gpt-4o: openai 128000/Some(16384) $Some(12.5); gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(12.5); claude-sonnet-4-5: anthropic 1000000/Some(64000) $Some(13.0) tenant; my-llama-3: unknown window=128000; my-llama: unknown window=128000",
            ),
            // A new model: provider required; window and price as given, or the defaults.
            (
                Some(
                    r#"{"models":[{"id":"my-llama","provider":"openai-compatible","contextWindow":8192}]}"#,
                ),
                "gpt-4o: openai 128000/Some(16384) $Some(12.5); gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(12.5); claude-sonnet-4-5: anthropic 200000/Some(64000) $Some(18.0); my-llama-3: openai-compatible 8192/None $None tenant; my-llama: openai-compatible 8192/None $None tenant",
            ),
            (
                Some(
                    r#"{"models":[{"id":"my-llama","provider":"openai-compatible","inputPerMtok":0.5,"outputPerMtok":0.5,"maxOutputTokens":4096}]}"#,
                ),
                "gpt-4o: openai 128000/Some(16384) $Some(12.5); gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(12.5); claude-sonnet-4-5: anthropic 200000/Some(64000) $Some(18.0); my-llama-3: openai-compatible 128000/Some(4096) $Some(1.0) tenant; my-llama: openai-compatible 128000/Some(4096) $Some(1.0) tenant",
            ),
            // A text-only model (no images in its requests); a built-in row may be marked too.
            (
                Some(
                    r#"{"models":[{"id":"my-llama","provider":"openai-compatible","images":false},{"id":"gpt-4o","images":false}]}"#,
                ),
                "gpt-4o: openai 128000/Some(16384) $Some(12.5) tenant text-only; gpt-4o-2024-08-06: openai 128000/Some(16384) $Some(12.5) tenant text-only; claude-sonnet-4-5: anthropic 200000/Some(64000) $Some(18.0); my-llama-3: openai-compatible 128000/None $None tenant text-only; my-llama: openai-compatible 128000/None $None tenant text-only",
            ),
            // Refusals: never a silent fallback.
            (
                Some("{"),
                "error: wuhu://workspace/config/models.json is not a valid model table: EOF while parsing an object at line 1 column 1",
            ),
            (
                Some(r#"[]"#),
                "error: wuhu://workspace/config/models.json is not a valid model table: invalid length 0, expected struct TenantDoc with 1 element at line 1 column 2",
            ),
            (
                Some(r#"{"models":[{"id":"x","provider":"fake","price":3}]}"#),
                "error: wuhu://workspace/config/models.json is not a valid model table: unknown field `price`, expected one of `id`, `provider`, `contextWindow`, `maxOutputTokens`, `inputPerMtok`, `outputPerMtok`, `cacheReadPerMtok`, `cacheWritePerMtok`, `images`, `reasoning` at line 1 column 46",
            ),
            (
                Some(r#"{"models":[{"id":"my-llama"}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 0 ("my-llama"): a new model needs a provider"#,
            ),
            (
                Some(r#"{"models":[{"id":"my-llama","provider":"ollama"}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 0 ("my-llama"): unknown provider "ollama": use one of fake, openai-compatible, openai, anthropic"#,
            ),
            (
                Some(r#"{"models":[{"id":"my-llama","provider":"openai","inputPerMtok":1}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 0 ("my-llama"): a model without a built-in price needs both inputPerMtok and outputPerMtok"#,
            ),
            (
                Some(r#"{"models":[{"id":"gpt-4o","inputPerMtok":-1}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 0 ("gpt-4o"): prices must be numbers of dollars, 0 or more"#,
            ),
            (
                Some(r#"{"models":[{"id":"gpt-4o","contextWindow":0}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 0 ("gpt-4o"): contextWindow and maxOutputTokens must be above 0"#,
            ),
            (
                Some(r#"{"models":[{"id":"gpt-4o"},{"id":"gpt-4o"}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 1 ("gpt-4o"): id appears twice"#,
            ),
            (
                Some(r#"{"models":[{"id":" "}]}"#),
                r#"error: wuhu://workspace/config/models.json, row 0 (" "): id must be 1 to 200 characters"#,
            ),
        ];
        for (doc, want) in cases {
            assert_eq!(describe(doc), want, "{doc:?}");
        }
        let many = format!(
            r#"{{"models":[{}]}}"#,
            (0..=MAX_TENANT_ROWS)
                .map(|i| format!(r#"{{"id":"m{i}","provider":"fake"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            describe(Some(&many)),
            "error: wuhu://workspace/config/models.json has 257 rows: at most 256"
        );
        // The served table marks the tenant's rows.
        let table = ModelTable::with_tenant(Some(
            r#"{"models":[{"id":"my-llama","provider":"openai-compatible"}]}"#,
        ))
        .unwrap();
        let json = table.to_json();
        let rows = json["models"].as_array().unwrap();
        assert_eq!(rows.len(), MODELS.len() + 1);
        assert_eq!(
            rows.last().unwrap(),
            &serde_json::json!({"id":"my-llama","provider":"openai-compatible","contextWindow":128000,"tenant":true})
        );
        assert_eq!(rows[0]["inputPerMtok"], 15.0);
    }
}
