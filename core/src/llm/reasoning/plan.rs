//! What a reasoning setting asks of a provider's request: a leaf, so the request builders
//! (`super::super::anthropic` and the others) take it without the rules that make it
//! (`super`), which name the providers.

use serde::{Deserialize, Serialize};

/// How hard the model should think.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    /// A little.
    Low,
    /// Some.
    Medium,
    /// A lot.
    High,
}

impl Effort {
    /// The name the APIs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }
}

/// What a provider request carries for a reasoning setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Anthropic: `thinking: {"type": "enabled", "budget_tokens"}` and this `max_tokens`.
    Thinking {
        /// The thinking budget.
        budget_tokens: u32,
        /// The request's `max_tokens` (above the budget).
        max_tokens: u32,
    },
    /// OpenAI: `reasoning.effort` (Responses) or `reasoning_effort` (Chat Completions).
    Effort(Effort),
}
