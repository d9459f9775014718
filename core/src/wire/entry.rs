//! Transcript entries: the append-only record of a session.

use serde::{Deserialize, Serialize};

/// One transcript entry. `cursor` is monotonic per session and is the SSE event id.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Position in the transcript, starting at 1, strictly increasing, never reused.
    pub cursor: u64,
    /// A UUID, unique across sessions.
    pub id: String,
    /// Unix seconds.
    pub created_at: i64,
    /// What the entry records.
    #[serde(flatten)]
    pub payload: EntryPayload,
}

/// The kinds of entry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryPayload {
    /// The first entry: system prompt and model settings.
    Header(Header),
    /// A message that takes part in the LLM context.
    Message {
        /// The message.
        message: Message,
    },
    /// The context was compacted: later requests send the pinned context (system prompt,
    /// global context, attached environments' AGENTS.md), then `summary`, then the entries
    /// at `kept_cursors` (the user messages of a turn cut inside), then the entries from
    /// `first_kept_cursor` on. Earlier entries stay in the transcript.
    Compaction(Compaction),
    /// A notice for people and tools; never sent to the LLM.
    Custom {
        /// A versioned type name such as `wuhu_execution_stopped_v1`.
        custom_type: String,
        /// Free-form details.
        #[serde(default)]
        data: serde_json::Value,
    },
}

/// A `compaction` entry (see [`EntryPayload::Compaction`] and `crate::compaction`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Compaction {
    /// What the LLM wrote about the entries before `first_kept_cursor`.
    pub summary: String,
    /// The oldest entry later requests send as it is.
    pub first_kept_cursor: u64,
    /// Older entries later requests still send as they are, right after the summary: the
    /// user messages of the turn being answered when the cut fell inside that turn (ascending,
    /// each before `first_kept_cursor`, at most `crate::compaction::MAX_KEPT_MESSAGES`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_cursors: Vec<u64>,
    /// The estimated input tokens of the context before it was compacted.
    pub tokens_before: u64,
    /// Why: `auto` (the next request would pass the threshold), `overflow` (the provider
    /// refused the context as too long), `manual` (`POST /v1/sessions/:id/compact`).
    pub reason: CompactionReason,
    /// Instructions given to a manual compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Provider of the model that wrote the summary.
    pub provider: String,
    /// Model that wrote the summary.
    pub model: String,
    /// Tokens and cost of the summary request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Why a context was compacted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CompactionReason {
    /// The next request would have passed the threshold (or the entry bound).
    Auto,
    /// The provider answered that the context was too long.
    Overflow,
    /// Someone asked for it.
    Manual,
}

impl CompactionReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionReason::Auto => "auto",
            CompactionReason::Overflow => "overflow",
            CompactionReason::Manual => "manual",
        }
    }
}

/// Session settings recorded at creation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Header {
    /// The system prompt sent with every LLM request.
    pub system_prompt: String,
    /// Provider name (`fake`, `openai-compatible`).
    pub provider: String,
    /// Model name passed to the provider.
    pub model: String,
    /// How much the model reasons (`crate::llm::reasoning`); `None`: the provider's default.
    /// Changed with the model by `PATCH` (the header entry keeps the creation's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<crate::llm::reasoning::Reasoning>,
}

/// A message in the LLM context.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// A person's message, delivered from a lane.
    User {
        /// The `sub` of the token that enqueued it.
        author: String,
        /// The text.
        content: String,
        /// The queue item this message was delivered from.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            rename = "queueItemId"
        )]
        queue_item_id: Option<String>,
        /// The lane it came from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lane: Option<super::Lane>,
        /// Whom it acts for, when not its author alone: a child's task and a parent's messages
        /// act for the people the parent's turn acted for (`[]`: nobody, a turn the system
        /// started). Its tools get no more authority than every one of them has.
        #[serde(default, skip_serializing_if = "Option::is_none", rename = "actingFor")]
        acting_for: Option<Vec<String>>,
    },
    /// The model's reply.
    Assistant(AssistantMessage),
    /// The outcome of one tool call.
    ToolResult(ToolResult),
    /// A message from the system, sent to the LLM as a user message.
    CustomMessage {
        /// A versioned type name such as `wuhu_system_input_v1`.
        #[serde(rename = "customType")]
        custom_type: String,
        /// The text the LLM sees.
        content: String,
        /// Where the content came from (for example `{path, version}` of a context document).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<serde_json::Value>,
    },
}

/// The model's reply for one step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AssistantMessage {
    /// Provider that produced it.
    pub provider: String,
    /// Model that produced it.
    pub model: String,
    /// Text and tool calls, in stream order.
    pub content: Vec<ContentBlock>,
    /// Token usage, when the provider reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Why generation ended.
    pub stop_reason: StopReason,
}

impl AssistantMessage {
    /// The tool calls in this message, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|block| match block {
            ContentBlock::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// All text blocks joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// A piece of assistant content.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call.
    ToolCall(ToolCall),
    /// Anthropic extended thinking. Sent back to Anthropic unchanged (the signature proves it
    /// is the model's own); other providers never see it.
    Thinking {
        /// The thinking text (may be a summary).
        thinking: String,
        /// Opaque integrity signature from the provider.
        #[serde(default)]
        signature: String,
    },
    /// Anthropic thinking the provider encrypted; sent back unchanged, shown to nobody.
    RedactedThinking {
        /// Opaque encrypted data.
        data: String,
    },
    /// An OpenAI Responses reasoning item, carried between steps as the API requires (with
    /// `store: false` the encrypted content is what lets the model resume its reasoning).
    #[serde(rename_all = "camelCase")]
    Reasoning {
        /// Item id (`rs_…`).
        id: String,
        /// Readable summary parts, if the provider sent any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        summary: Vec<String>,
        /// Opaque encrypted reasoning.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
}

/// A tool call requested by the model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// Provider-assigned id; tool results refer to it.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as JSON. A model that sent unparseable arguments gets them as a string.
    pub arguments: serde_json::Value,
}

/// Token usage of one LLM request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Prompt tokens, all of them: cache reads and cache writes included.
    pub input_tokens: u64,
    /// Completion tokens (reasoning included).
    pub output_tokens: u64,
    /// Their sum, as the provider reported it.
    pub total_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Output tokens spent on reasoning (part of `output_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
    /// What the request cost in US dollars, from the model table (`crate::llm::models`);
    /// absent for models without a price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why the model stopped.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Finished its reply.
    #[default]
    Stop,
    /// Wants tool results.
    ToolUse,
    /// Hit the output token limit.
    Length,
}

/// The outcome of one tool call.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The call this answers.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool_name: String,
    /// Text the LLM sees.
    pub content: String,
    /// Whether the call failed.
    pub is_error: bool,
    /// Output or files too large for the transcript, stored as blobs (`content` says where).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blobs: Vec<BlobRef>,
}

/// A blob a tool produced: the transcript keeps this, the bytes are in storage
/// (`GET /v1/blobs/:id`, or `read {"path": uri}` in the session).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BlobRef {
    /// `wuhu://blob/<id>`.
    pub uri: String,
    /// Bytes.
    pub size: u64,
    /// Media type (`text/plain`, `image/png`, ...).
    pub media_type: String,
    /// The head of a text blob (at most 1 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
    /// Pixel width of an image blob, as its stored header says (`crate::images`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Pixel height of an image blob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
}

/// Custom entry types this server writes.
pub mod custom_types {
    /// The session was stopped; `data.by` names who stopped it.
    pub const EXECUTION_STOPPED: &str = "wuhu_execution_stopped_v1";
    /// A child session's lifecycle reached its parent (`custom_message` on the parent's
    /// `system` lane; `details` is the child's status: `id`, `title`, `state`, `finalText`,
    /// `message`, `cursor`). See `docs/orchestration.md`.
    pub const CHILD_STATUS: &str = "wuhu_child_status_v1";
    /// A background job ended (`custom_message` on the session's `system` lane; `details` is
    /// the runner's job report plus `runner`, `environment` and, for a job that failed because
    /// its runner went away, `reason`).
    /// See `docs/orchestration.md`.
    pub const JOB_FINISHED: &str = "wuhu_job_finished_v1";
    /// An LLM request failed; `data` has `message`, `status`, `attempt`, `willRetry`.
    pub const LLM_ERROR: &str = "wuhu_llm_error_v1";
    /// A system-lane item delivered to the LLM (a `custom_message`).
    pub const SYSTEM_INPUT: &str = "wuhu_system_input_v1";
    /// The user's global context document, injected at session start (a `custom_message`
    /// whose `details` has `path` and `version`).
    pub const GLOBAL_CONTEXT: &str = "wuhu_global_context_v1";
    /// A user other than the owner prompted the session for the first time (a `custom_message`
    /// the LLM sees as a user message; `details` has `owner` and `joined`). User messages after
    /// it reach the LLM as `[author]:\n\n<content>` (seed 001, "Group Chat Escalation").
    pub const GROUP_CHAT_REMINDER: &str = "wuhu_group_chat_reminder_v1";
    /// An environment was attached (`custom`; `data.text` is the line people see).
    pub const ENVIRONMENT_ATTACHED: &str = "wuhu_environment_attached_v1";
    /// An environment was detached (`custom`).
    pub const ENVIRONMENT_DETACHED: &str = "wuhu_environment_detached_v1";
    /// An environment's AGENTS.md (`custom_message`: the LLM sees it from then on).
    pub const AGENTS_MD: &str = "wuhu_agents_md_v1";
    /// A person must approve attaching an environment (`custom`; `data.approvalId`).
    pub const APPROVAL_REQUESTED: &str = "wuhu_approval_request_v1";
    /// The answer to an approval request (`custom`; `data.decision`, `data.by`).
    pub const APPROVAL_DECIDED: &str = "wuhu_approval_decision_v1";
    /// The environment a spawn asked for could not be made when the child got its slot
    /// (`custom_message`: the child's model sees why it has none; `details.environment`).
    pub const ENVIRONMENT_UNAVAILABLE: &str = "wuhu_environment_unavailable_v1";
    /// A snapshot was found stale after a reconnect or resume (`custom`).
    pub const ENVIRONMENT_STALE: &str = "wuhu_environment_stale_v1";
    /// A note for the agent after a resume (`custom_message`).
    pub const RESUME_NOTE: &str = "wuhu_resume_note_v1";
    /// Saving the session failed and it was reloaded from its last saved state (`custom`;
    /// `data.text`, `data.message`).
    pub const STORAGE_ERROR: &str = "wuhu_storage_error_v1";
    /// The saved loop state was behind the stored transcript and was moved past it on load
    /// (`custom`; `data.text`, `data.checkpointNextCursor`, `data.newestStoredCursor`).
    pub const STORAGE_REPAIRED: &str = "wuhu_storage_repaired_v1";
    /// The session's provider or model changed (`custom`; `data.text`, `data.from` and
    /// `data.to` as `{provider, model}`, `data.by`).
    pub const MODEL_CHANGED: &str = "wuhu_model_changed_v1";
    /// The session's reasoning setting changed (`custom`; `data.text`, `data.from` and
    /// `data.to` as `{effort, budgetTokens?}` or `null`, `data.by`).
    pub const REASONING_CHANGED: &str = "wuhu_reasoning_changed_v1";
    /// The first entry of a fork: `from` (session id), `atCursor`, `by`, `text`.
    pub const FORKED: &str = "wuhu_forked_v1";
    /// The session's budget was reached: the turn ended (`custom`; `data.text`, `data.limit`
    /// (`tokens` or `usd`), `data.spent`, `data.budget`).
    pub const BUDGET_EXCEEDED: &str = "wuhu_budget_exceeded_v1";
    /// A step's request was not sent: its model has no price while a USD budget applies
    /// (`crate::llm::choice::check_priced`); the turn ended. `data`: `text`, `provider`,
    /// `model`, `limits`.
    pub const UNPRICED_MODEL: &str = "wuhu_unpriced_model_v1";
    /// Someone set the session's budget (`custom`; `data.text`, `data.budget`, `data.spent`,
    /// `data.by`).
    pub const BUDGET_SET: &str = "wuhu_budget_set_v1";
    /// The summary of a compaction as the LLM sees it (a `custom_message` built for requests;
    /// the transcript holds the `compaction` entry instead).
    pub const COMPACTION_SUMMARY: &str = "wuhu_compaction_summary_v1";
    /// Stands in a row or an archive segment for an entry stored out of line (see
    /// `wuhu_core::out_of_line`). Never returned by the API: reads put the entry back.
    pub const OUT_OF_LINE: &str = "wuhu_out_of_line_v1";
    /// A chat channel gave up posting a message of this session (`custom`; `data.text`,
    /// `data.channel` (the binding id), `data.key` (the outbox key), `data.reason`). See
    /// `docs/channels.md`, "Delivery".
    pub const CHANNEL_UNDELIVERED: &str = "wuhu_channel_undelivered_v1";
    /// A policy rule decided on a tool call (`custom`; `data` is `crate::policy::Verdict` with
    /// `tool`, `toolCallId`, `text`, and for an ask the approval's `outcome`). See
    /// `docs/security.md`, "Policy".
    pub const POLICY_DECISION: &str = "wuhu_policy_decision_v1";
}
