//! Reasoning controls (issue 36): how much a model thinks before it answers, set on a session
//! (`POST /v1/sessions {reasoning}`, `PATCH {reasoning}`) or for one turn (`POST …/enqueue
//! {reasoning}`), as `{"effort": "low" | "medium" | "high", "budgetTokens"?: n}`.
//!
//! [`plan`] checks a setting against the model it would be sent to and turns it into what the
//! provider's request carries ([`Plan`]); the request builders only write the plan down. A
//! setting the model cannot take is refused ([`ReasoningRefused`], a `400 invalid_reasoning`)
//! before any request is made:
//!
//! * **Which models.** The model table says which models reason (`"reasoning": true` in a row,
//!   [`super::models::ModelRow::reasoning`]; a tenant may mark its own rows). A model missing
//!   from the table, or whose row does not say so, is refused: the provider would reject the
//!   parameter, or ignore it, and neither is what the person asked for. The `fake` provider
//!   takes none.
//! * **Anthropic** (`anthropic`): extended thinking, `thinking: {"type": "enabled",
//!   "budget_tokens": n}`. `budgetTokens` is the budget; without it the effort picks one from
//!   [`EFFORT_BUDGETS`]. Anthropic's documented constraints: the budget is at least
//!   [`MIN_BUDGET_TOKENS`] and below `max_tokens`; `temperature` (and `top_k`) may not be set and
//!   `tool_choice` may only be `auto` or `none` (the request builder sets none of them); thinking
//!   blocks go back unchanged with the tool results (they already do, `super::anthropic`). The
//!   plan's `max_tokens` is the budget plus [`ANSWER_TOKENS`] for the answer, at most the
//!   model's output limit; a budget is allowed up to that limit less [`MIN_ANSWER_TOKENS`], so
//!   every answer has room. An effort's budget shrinks to fit a model with a small limit.
//! * **OpenAI Responses** (`openai`): `reasoning: {"effort": e, "summary": "auto"}`; the
//!   summaries stream as thinking. `budgetTokens` is refused: these models take an effort only.
//! * **Chat Completions** (`openai-compatible`): `reasoning_effort: e`, for models the table
//!   marks; `budgetTokens` is refused.

use serde::{Deserialize, Serialize};

use super::models::ModelTable;

pub mod plan;

pub use plan::{Effort, Plan};

/// A reasoning setting: an effort, and for Anthropic models an explicit thinking budget.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reasoning {
    /// `low`, `medium` or `high`.
    pub effort: Effort,
    /// Anthropic only: the thinking budget in tokens ([`MIN_BUDGET_TOKENS`] up to the model's
    /// output limit less [`MIN_ANSWER_TOKENS`]); without it the effort picks one
    /// ([`EFFORT_BUDGETS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u32>,
}

/// Anthropic's smallest thinking budget.
pub const MIN_BUDGET_TOKENS: u32 = 1024;
/// Output tokens a thinking request keeps for the answer at least: a budget may be the model's
/// output limit less this.
pub const MIN_ANSWER_TOKENS: u32 = 1024;
/// Output tokens a thinking request asks for on top of its budget, for the answer (the
/// Anthropic request's usual `max_tokens`), as far as the model's limit allows.
pub const ANSWER_TOKENS: u32 = super::anthropic::DEFAULT_MAX_TOKENS;

/// The Anthropic thinking budget of each effort when the setting names none: low 4,096,
/// medium 12,288, high 24,576 tokens (each shrinks to fit a model's output limit).
pub const EFFORT_BUDGETS: [(Effort, u32); 3] = [
    (Effort::Low, 4_096),
    (Effort::Medium, 12_288),
    (Effort::High, 24_576),
];

/// The budget of `effort` in [`EFFORT_BUDGETS`].
pub fn effort_budget(effort: Effort) -> u32 {
    EFFORT_BUDGETS
        .iter()
        .find(|(e, _)| *e == effort)
        .map_or(MIN_BUDGET_TOKENS, |(_, budget)| *budget)
}

/// Why a reasoning setting was refused (`400 invalid_reasoning`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReasoningRefused {
    /// The provider has no reasoning parameter.
    #[error("the {provider} provider takes no reasoning setting")]
    Provider {
        /// Provider id.
        provider: String,
    },
    /// The model is not in the model table.
    #[error(
        "model {model:?} is not in the model table, so whether it takes a reasoning setting is unknown: an admin can add it to wuhu://workspace/config/models.json with \"reasoning\": true"
    )]
    UnknownModel {
        /// Model id.
        model: String,
    },
    /// The model's row does not say it reasons.
    #[error(
        "model {model:?} takes no reasoning setting (the model table does not mark it \"reasoning\": true): choose a reasoning model, or leave reasoning out"
    )]
    NotReasoning {
        /// Model id.
        model: String,
    },
    /// `budgetTokens` for a provider that takes an effort only.
    #[error(
        "budgetTokens is for Anthropic models (extended thinking); {provider} models take an effort only"
    )]
    BudgetNotTaken {
        /// Provider id.
        provider: String,
    },
    /// `budgetTokens` out of bounds.
    #[error(
        "budgetTokens must be {MIN_BUDGET_TOKENS} to {max} for model {model:?} (its output limit less {MIN_ANSWER_TOKENS} tokens for the answer); got {got}"
    )]
    BudgetOutOfRange {
        /// Model id.
        model: String,
        /// The largest budget allowed.
        max: u32,
        /// The budget asked for.
        got: u32,
    },
    /// The model's output limit leaves no room for thinking.
    #[error(
        "model {model:?} has an output limit of {limit} tokens: too small for thinking ({MIN_BUDGET_TOKENS} tokens at least, and {MIN_ANSWER_TOKENS} for the answer)"
    )]
    LimitTooSmall {
        /// Model id.
        model: String,
        /// Its output limit.
        limit: u32,
    },
}

impl ReasoningRefused {
    /// The error code of the `400`.
    pub const CODE: &'static str = "invalid_reasoning";
}

/// Checks `reasoning` for `model` on `provider` (as `table` knows it) and plans the request
/// parameters.
///
/// # Errors
/// [`ReasoningRefused`], naming what is wrong and what would do.
pub fn plan(
    table: &ModelTable,
    provider: &str,
    model: &str,
    reasoning: &Reasoning,
) -> Result<Plan, ReasoningRefused> {
    let takes_budget = match provider {
        super::anthropic::PROVIDER => true,
        super::responses::PROVIDER | super::openai::PROVIDER => false,
        other => {
            return Err(ReasoningRefused::Provider {
                provider: other.to_string(),
            });
        }
    };
    let Some(row) = table.lookup(model) else {
        return Err(ReasoningRefused::UnknownModel {
            model: model.to_string(),
        });
    };
    if !row.reasoning {
        return Err(ReasoningRefused::NotReasoning {
            model: model.to_string(),
        });
    }
    if !takes_budget {
        if reasoning.budget_tokens.is_some() {
            return Err(ReasoningRefused::BudgetNotTaken {
                provider: provider.to_string(),
            });
        }
        return Ok(Plan::Effort(reasoning.effort));
    }
    // A row without a limit gets the codec's default `max_tokens`.
    let limit = row.max_output_tokens.unwrap_or(ANSWER_TOKENS);
    let max_budget = limit.saturating_sub(MIN_ANSWER_TOKENS);
    if max_budget < MIN_BUDGET_TOKENS {
        return Err(ReasoningRefused::LimitTooSmall {
            model: model.to_string(),
            limit,
        });
    }
    let budget_tokens = match reasoning.budget_tokens {
        Some(got) if !(MIN_BUDGET_TOKENS..=max_budget).contains(&got) => {
            return Err(ReasoningRefused::BudgetOutOfRange {
                model: model.to_string(),
                max: max_budget,
                got,
            });
        }
        Some(budget) => budget,
        None => effort_budget(reasoning.effort).min(max_budget),
    };
    Ok(Plan::Thinking {
        budget_tokens,
        max_tokens: budget_tokens.saturating_add(ANSWER_TOKENS).min(limit),
    })
}

#[cfg(test)]
mod tests;
