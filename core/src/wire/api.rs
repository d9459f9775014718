//! HTTP API v1 request and response bodies. See `docs/api.md`.

use serde::{Deserialize, Serialize};

use super::{Entry, Status};

/// `POST /v1/sessions`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// The provider (default `fake`).
    #[serde(default)]
    #[cfg_attr(test, schemars(schema_with = "crate::llm::optional_provider_schema"))]
    pub provider: Option<String>,
    /// Model name; each provider has a default.
    #[serde(default)]
    pub model: Option<String>,
    /// System prompt; a built-in default when absent.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// A human-readable title.
    #[serde(default)]
    pub title: Option<String>,
    /// The session's budget from its start (as `PATCH {budget}` sets it later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// How much the model reasons (`crate::llm::reasoning`): checked against the model (a
    /// model that takes none, or a bad budget, is a `400 invalid_reasoning`). Absent: the
    /// provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<crate::llm::reasoning::Reasoning>,
}

/// A session as the API shows it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// UUID.
    pub id: String,
    /// Title, if set.
    pub title: Option<String>,
    /// Provider name.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// Execution status.
    pub status: Status,
    /// The `sub` of the creator.
    pub created_by: String,
    /// The owner: the first user who prompted it; its creator until then.
    #[serde(default)]
    pub owner: String,
    /// Who may see and prompt it: `private` (default) or `tenant` (a group chat).
    #[serde(default)]
    pub access: crate::authority::Access,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds of the last change.
    pub updated_at: i64,
    /// Cursor of the newest entry.
    pub last_cursor: u64,
    /// The session that spawned it (absent for a root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// 0 for a root, its parent's depth + 1 for a child.
    #[serde(default)]
    pub depth: u32,
    /// The session it was forked from and where: its history is that session's first
    /// `cursor` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// The session's reasoning setting, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<crate::llm::reasoning::Reasoning>,
}

/// Where a fork's history comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    /// The session forked.
    pub session_id: String,
    /// Its entries `1..=cursor` are the fork's history.
    pub cursor: u64,
}

/// `POST /v1/sessions/:id/fork`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkRequest {
    /// The fork's history is the first `at_cursor` entries (1 to the session's last cursor).
    pub at_cursor: u64,
    /// The fork's title (default: the forked session's).
    #[serde(default)]
    pub title: Option<String>,
}

impl ForkRequest {
    /// Checks the request against the forked session's last cursor.
    ///
    /// # Errors
    /// A message for a 400.
    pub fn validate(&self, last_cursor: u64) -> Result<(), String> {
        if self.at_cursor == 0 || self.at_cursor > last_cursor {
            return Err(format!(
                "atCursor must be between 1 and the session's last cursor ({last_cursor})"
            ));
        }
        if let Some(title) = &self.title {
            normalize_title(title)?;
        }
        Ok(())
    }
}

/// `GET /v1/sessions`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ListSessionsResponse {
    /// Newest first.
    pub sessions: Vec<SessionInfo>,
    /// Pass as `before` to get the next page; absent on the last page.
    pub next_before: Option<String>,
}

/// `GET /v1/sessions/:id`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GetSessionResponse {
    /// The session.
    pub session: SessionInfo,
    /// Entries after `sinceCursor` (and after `sinceTime`), oldest first, at most `limit`.
    pub transcript: Vec<Entry>,
    /// Pending queue items, oldest first.
    pub queue: Vec<QueueItemInfo>,
    /// When more entries follow: pass as `sinceCursor` for the next page.
    pub next_cursor: Option<u64>,
    /// Environments attached now.
    #[serde(default)]
    pub environments: Vec<crate::environments::Attachment>,
    /// The sessions it spawned, oldest first, as it last heard of them.
    #[serde(default)]
    pub children: Vec<super::ChildStatus>,
}

/// A queued item not yet delivered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct QueueItemInfo {
    /// Queue item id.
    pub id: String,
    /// Its lane.
    pub lane: super::Lane,
    /// Who enqueued it.
    pub author: String,
    /// The text.
    pub content: String,
    /// Unix seconds.
    pub enqueued_at: i64,
}

/// `POST /v1/sessions/:id/enqueue?lane=`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueueRequest {
    /// The message text.
    pub content: String,
    /// The sender's name for this message (an idempotency key: 1 to 128 printable ASCII
    /// characters, `wuhu_core::session::check_item_key`). The same author sending the same key
    /// to the same session again gets the first answer and queues nothing, while the first is
    /// queued or among the last 256 delivered, so a client unsure whether a message arrived (a
    /// lost reply) may send it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// How much the model reasons for the turn this message starts or joins (it wins over the
    /// session's setting until the turn ends); checked like the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<crate::llm::reasoning::Reasoning>,
}

/// Reply to an enqueue.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnqueueResponse {
    /// Queue item id, for cancel.
    pub id: String,
}

/// `POST /v1/sessions/:id/cancel`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelRequest {
    /// Queue item id.
    pub id: String,
}

/// `PATCH /v1/sessions/:id`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchSessionRequest {
    /// New title (1 to [`MAX_TITLE_CHARS`] characters once cleaned, see [`normalize_title`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// New access (owner or admin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::authority::Access>,
    /// Switch to this provider; without `model`, its default model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, schemars(schema_with = "crate::llm::optional_provider_schema"))]
    pub provider: Option<String>,
    /// Switch to this model (1 to [`MAX_MODEL_CHARS`] characters); without `provider`, on the
    /// session's provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A new budget (`{}` removes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// A new reasoning setting (`null` removes it), checked against the model as this patch
    /// leaves it: a switch to a model that cannot take the session's setting needs a setting
    /// it takes, or `null`, in the same patch.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(test, schemars(with = "Option<crate::llm::reasoning::Reasoning>"))]
    pub reasoning: Option<Option<crate::llm::reasoning::Reasoning>>,
}

/// A field that is present (`null` included) is `Some`; an absent one stays `None` (its
/// `default`).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// A session's budget: requests start only while what the session spent is under every limit
/// set (so one request may overshoot).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    /// Most input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most US dollars (from the model table's prices; unpriced models cost nothing here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<f64>,
}

/// What a session's requests used.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Spent {
    /// Input plus output tokens.
    pub tokens: u64,
    /// US dollars.
    pub usd: f64,
}

impl Spent {
    /// Whether nothing was spent.
    pub fn is_zero(&self) -> bool {
        self.tokens == 0 && self.usd == 0.0
    }

    /// This and `other` together.
    pub fn plus(&self, other: &Spent) -> Spent {
        Spent {
            tokens: self.tokens.saturating_add(other.tokens),
            usd: self.usd + other.usd,
        }
    }

    /// Adds one request's usage.
    pub fn add(&mut self, usage: &super::Usage) {
        self.tokens = self
            .tokens
            .saturating_add(usage.input_tokens.saturating_add(usage.output_tokens));
        if let Some(cost) = usage.cost_usd.filter(|c| c.is_finite() && *c > 0.0) {
            self.usd += cost;
        }
    }
}

impl Budget {
    /// Which limit `spent` reached, if any: `"tokens"` or `"usd"`.
    pub fn exceeded_by(&self, spent: &Spent) -> Option<&'static str> {
        if self.max_tokens.is_some_and(|max| spent.tokens >= max) {
            return Some("tokens");
        }
        if self.max_usd.is_some_and(|max| spent.usd >= max) {
            return Some("usd");
        }
        None
    }

    /// Checks the limits.
    ///
    /// # Errors
    /// A message for a 400 when a dollar limit is negative or not a number.
    pub fn validate(&self) -> Result<(), String> {
        if self
            .max_usd
            .is_some_and(|usd| !usd.is_finite() || usd < 0.0)
        {
            return Err("budget.maxUsd must be a number of dollars, 0 or more".into());
        }
        Ok(())
    }
}

/// Longest model name, in characters.
pub const MAX_MODEL_CHARS: usize = 200;

/// `POST /v1/sessions/:id/compact` (the body may be empty).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompactRequest {
    /// What the summary should focus on (at most [`MAX_COMPACT_INSTRUCTIONS_BYTES`] bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// Longest instructions of a manual compaction, in bytes.
pub const MAX_COMPACT_INSTRUCTIONS_BYTES: usize = 4096;

/// The answer to `POST /v1/sessions/:id/compact`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CompactResponse {
    /// Cursor of the `compaction` entry.
    pub cursor: u64,
    /// The entry's content.
    pub compaction: super::Compaction,
}

/// Longest session title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// A title as stored: cleaned (`crate::text::clean_title`: format characters such as bidi
/// controls and zero-width spaces removed, control characters and whitespace runs one space,
/// the ends trimmed), then 1 to [`MAX_TITLE_CHARS`] characters.
///
/// # Errors
/// A message for a 400 when nothing visible is left, or too much is.
pub fn normalize_title(title: &str) -> Result<String, String> {
    let title = crate::text::clean_title(title);
    if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS {
        return Err(format!(
            "title must be 1 to {MAX_TITLE_CHARS} characters once control and format characters are removed"
        ));
    }
    Ok(title)
}

impl PatchSessionRequest {
    /// Checks the request: at least one field, a valid title.
    ///
    /// # Errors
    /// A message for a 400.
    pub fn validate(&self) -> Result<(), String> {
        if self.title.is_none()
            && self.access.is_none()
            && self.provider.is_none()
            && self.model.is_none()
            && self.budget.is_none()
            && self.reasoning.is_none()
        {
            return Err("patch needs title, access, provider, model, budget or reasoning".into());
        }
        if let Some(budget) = &self.budget {
            budget.validate()?;
        }
        if let Some(title) = &self.title {
            normalize_title(title)?;
        }
        if let Some(provider) = &self.provider
            && !crate::llm::PROVIDERS.contains(&provider.as_str())
        {
            return Err(format!(
                "unknown provider {provider:?}: use one of {}",
                crate::llm::PROVIDERS.map(|p| format!("{p:?}")).join(", ")
            ));
        }
        if let Some(model) = &self.model
            && (model.trim().is_empty() || model.chars().count() > MAX_MODEL_CHARS)
        {
            return Err(format!("model must be 1 to {MAX_MODEL_CHARS} characters"));
        }
        Ok(())
    }

    /// The session's provider, model and reasoning after this patch, from `current`; `None`
    /// when the patch does not change them.
    pub fn switched(&self, current: &super::Header) -> Option<super::Header> {
        let reasoning = self.reasoning.unwrap_or(current.reasoning);
        if self.provider.is_none() && self.model.is_none() {
            return (reasoning != current.reasoning).then(|| super::Header {
                reasoning,
                ..current.clone()
            });
        }
        let provider = self
            .provider
            .clone()
            .unwrap_or_else(|| current.provider.clone());
        let model = match (&self.model, &self.provider) {
            (Some(model), _) => model.trim().to_string(),
            (None, Some(_)) if provider == current.provider => current.model.clone(),
            (None, _) => crate::llm::default_model(&provider).to_string(),
        };
        (provider != current.provider || model != current.model || reasoning != current.reasoning)
            .then(|| super::Header {
                system_prompt: current.system_prompt.clone(),
                provider,
                model,
                reasoning,
            })
    }
}

/// `POST /v1/sessions/:id/stop`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StopResponse {
    /// Status after the stop.
    pub status: Status,
    /// Tool calls that were given a "stopped" result.
    pub stopped_tool_calls: usize,
}

/// `GET /v1/sessions/:id/stats`: storage use of the session's actor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionStats {
    /// Size of the actor's SQLite database.
    pub database_bytes: u64,
    /// Entries held in SQLite.
    pub hot_entries: u64,
    /// Entries not yet archived to R2.
    pub unarchived: u64,
    /// Archived segments.
    pub segments: u64,
    /// Live follow streams.
    pub followers: u64,
}

/// `GET /v1/sessions/:id/usage`: the totals, per model, and the budget.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct UsageResponse {
    /// Tokens and cost over the assistant messages and compaction summaries.
    #[serde(flatten)]
    pub usage: crate::llm::models::SessionUsage,
    /// What the session's requests spent since budgets were counted.
    pub spent: Spent,
    /// The session's budget, if any.
    pub budget: Option<Budget>,
}

/// `GET /v1/sessions/:id/jobs`: the session's background jobs, newest first (the session keeps
/// at most [`crate::jobs::MAX_JOBS_KEPT`]), each as it last learnt of it (a running job's
/// `report` is from the last poll, about every 15 s).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct JobsResponse {
    /// The jobs.
    pub jobs: Vec<crate::jobs::JobRecord>,
}

/// `{"ok":true}`: the answer of routes that have nothing else to say (`POST /v1/auth/logout`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct OkResponse {
    /// Always `true`.
    pub ok: bool,
}

/// `DELETE /v1/tokens/:jti`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct RevokeTokenResponse {
    /// The token revoked.
    pub jti: String,
    /// Always `true` (failures are errors).
    pub revoked: bool,
    /// How many credentials made from it (its whole tree: tokens minted with it, their
    /// tokens, the cookie sessions made from any of them) were revoked with it.
    #[serde(default, rename = "alsoRevoked")]
    pub also_revoked: usize,
}

/// Every API error: `{"error":{"code","message"}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Machine code and human message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct ErrorDetail {
    /// Stable snake_case code such as `not_found`.
    pub code: String,
    /// Lowercase human message without a trailing period.
    pub message: String,
}

impl ErrorBody {
    /// Builds an error body.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message: message.into(),
            },
        }
    }
}

/// JWT claims of user and runner tokens.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Claims {
    /// Username (users) or owner (runners).
    pub sub: String,
    /// Tenant namespace.
    pub tenant: String,
    /// Expiry, unix seconds.
    pub exp: i64,
    /// `runner` for runner tokens; absent for user tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
    /// `admin` or `member` (default); see [`crate::authority::Role`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Not before, unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Runner tokens only: `cloud` lets the runner serve the whole tenant; anything else is `local`.
    #[serde(
        default,
        rename = "runnerKind",
        skip_serializing_if = "Option::is_none"
    )]
    pub runner_kind: Option<String>,
    /// Token id. Tokens minted by `POST /v1/tokens` and cookie sessions carry one, and are
    /// accepted only while the tenant's token registry lists it (revocation deletes the row);
    /// operator tokens minted with the secret have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// Issued at, unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    /// Issuer; checked when `WUHU_JWT_ISSUER` is set (and set on minted tokens then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// Audience (a string or an array); checked when `WUHU_JWT_AUDIENCE` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_model_patch_switches_only_what_it_names() {
        let current = super::super::Header {
            system_prompt: "s".into(),
            provider: "anthropic".into(),
            model: "claude-sonnet-4-5".into(),
            reasoning: None,
        };
        let patch = |body: serde_json::Value| -> Result<Option<(String, String)>, String> {
            let request: PatchSessionRequest =
                serde_json::from_value(body).map_err(|e| e.to_string())?;
            request.validate()?;
            Ok(request.switched(&current).map(|h| (h.provider, h.model)))
        };
        let some = |p: &str, m: &str| Ok(Some((p.to_string(), m.to_string())));
        let cases = [
            (serde_json::json!({"title": "t"}), Ok(None)),
            (
                serde_json::json!({"model": "claude-haiku-4-5"}),
                some("anthropic", "claude-haiku-4-5"),
            ),
            (
                serde_json::json!({"provider": "openai"}),
                some("openai", crate::llm::default_model("openai")),
            ),
            (
                serde_json::json!({"provider": "openai", "model": " gpt-5 "}),
                some("openai", "gpt-5"),
            ),
            // The same provider and model: nothing changes (no notice).
            (serde_json::json!({"provider": "anthropic"}), Ok(None)),
            (serde_json::json!({"model": "claude-sonnet-4-5"}), Ok(None)),
        ];
        for (body, expected) in cases {
            assert_eq!(patch(body.clone()), expected, "{body}");
        }
        for bad in [
            serde_json::json!({}),
            serde_json::json!({"provider": "gemini"}),
            serde_json::json!({"model": " "}),
            serde_json::json!({"model": "m".repeat(MAX_MODEL_CHARS + 1)}),
            serde_json::json!({"model": 3}),
        ] {
            assert!(patch(bad.clone()).is_err(), "{bad} accepted");
        }
        assert!(patch(serde_json::json!({"model": "m".repeat(MAX_MODEL_CHARS)})).is_ok());
    }

    /// `reasoning` in a patch: a setting sets, `null` clears, absent keeps; a change of
    /// reasoning alone is a change of the header too.
    #[test]
    fn a_reasoning_patch_sets_clears_or_keeps() {
        use crate::llm::reasoning::{Effort, Reasoning};
        let high = Reasoning {
            effort: Effort::High,
            budget_tokens: None,
        };
        let current = |reasoning: Option<Reasoning>| super::super::Header {
            system_prompt: "s".into(),
            provider: "anthropic".into(),
            model: "claude-sonnet-4-5".into(),
            reasoning,
        };
        let patch = |body: serde_json::Value, on: Option<Reasoning>| {
            let request: PatchSessionRequest = serde_json::from_value(body).unwrap();
            request.validate().unwrap();
            request
                .switched(&current(on))
                .map(|h| (h.model, h.reasoning))
        };
        let cases = [
            (
                json!({"reasoning": {"effort": "high"}}),
                None,
                Some(("claude-sonnet-4-5", Some(high))),
            ),
            (json!({"reasoning": {"effort": "high"}}), Some(high), None),
            (
                json!({"reasoning": null}),
                Some(high),
                Some(("claude-sonnet-4-5", None)),
            ),
            (json!({"reasoning": null}), None, None),
            // A switch keeps the setting unless the patch names one.
            (
                json!({"model": "claude-haiku-4-5"}),
                Some(high),
                Some(("claude-haiku-4-5", Some(high))),
            ),
            (
                json!({"model": "claude-haiku-4-5", "reasoning": null}),
                Some(high),
                Some(("claude-haiku-4-5", None)),
            ),
            (json!({"title": "t"}), Some(high), None),
        ];
        for (body, on, want) in cases {
            let want = want.map(|(m, r)| (m.to_string(), r));
            assert_eq!(patch(body.clone(), on), want, "{body} on {on:?}");
        }
        // Serialised back: `null` stays, absent stays absent.
        let cleared: PatchSessionRequest =
            serde_json::from_value(json!({"reasoning": null})).unwrap();
        assert_eq!(
            serde_json::to_value(&cleared).unwrap(),
            json!({"reasoning": null})
        );
        assert_eq!(
            serde_json::to_value(PatchSessionRequest::default()).unwrap(),
            json!({})
        );
        for bad in [
            json!({"reasoning": {"effort": "max"}}),
            json!({"reasoning": {"effort": "low", "extra": 1}}),
            json!({"reasoning": "high"}),
        ] {
            assert!(
                serde_json::from_value::<PatchSessionRequest>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
