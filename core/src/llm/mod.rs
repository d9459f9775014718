//! LLM providers, sans-IO: request building and stream decoding are pure functions; the host
//! performs the HTTP request and feeds the response bytes back in.
//!
//! A provider turns an [`LlmRequest`] into an [`HttpRequest`] and decodes the streamed reply into
//! [`LlmEvent`]s. [`AssistantBuilder`] folds events into the [`AssistantMessage`] that is
//! persisted. The `fake` provider needs no HTTP at all: [`fake::respond`] computes its reply.

pub mod anthropic;
pub mod choice;
pub mod fake;
pub mod inline_images;
pub mod masked_reply;
pub mod models;
pub mod openai;
pub mod reasoning;
pub mod request_log;
pub mod responses;
pub mod retry;
pub(crate) mod stream;

use crate::wire::{AssistantMessage, ContentBlock, Message, StopReason, ToolCall, Usage};

/// The system prompt of a compaction's summary request (`crate::compaction` sends it). Kept with
/// the requests rather than with compaction because providers are told summary requests by it:
/// the built-in `fake` one answers them with a summary.
pub const SUMMARY_SYSTEM_PROMPT: &str = "You write the summary that replaces the beginning of a conversation between users and an AI agent that works with tools. The agent will continue from your summary and the newest messages, and will not see the summarised messages again. Keep every fact, name, number, identifier, file path, decision, result, open question and unfinished task, and what the users asked for; drop pleasantries and repetition. Write plain text, without preamble: the summary only.";

/// A provider-neutral request: the whole context for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmRequest {
    /// Model name.
    pub model: String,
    /// System prompt.
    pub system_prompt: String,
    /// Context messages, oldest first. Tool calls always have their results.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<ToolSchema>,
    /// The most output tokens to ask for; `None`: the provider codec's default (a thinking
    /// plan sets its own `max_tokens`).
    pub max_output_tokens: Option<u32>,
    /// What the request asks of the model's reasoning (checked against the model table by
    /// [`reasoning::plan`]); `None`: the provider's default.
    pub reasoning: Option<reasoning::plan::Plan>,
    /// The bytes of the image blobs the request shows the model, by URI: loaded by the host
    /// ([`inline_images::to_load`]); a tool result's image missing here is a text note.
    pub images: inline_images::InlineImages,
}

/// A tool as the LLM sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSchema {
    /// Name.
    pub name: &'static str,
    /// What it does.
    pub description: &'static str,
    /// JSON Schema of its arguments.
    pub parameters: ToolParameters,
}

/// A tool's parameter schema as compact JSON text, made once. Every step's request carries the
/// catalogue (`tools::catalogue`, built once): cloning it shares the text, and a codec writes
/// the text as it is (`serde_json::value::RawValue`) instead of walking and escaping every
/// schema again (docs/benchmarks.md, session 27).
#[derive(Clone, Debug)]
pub struct ToolParameters(std::sync::Arc<serde_json::value::RawValue>);

impl ToolParameters {
    /// Bytes of the JSON text (for token estimates).
    pub fn text_len(&self) -> usize {
        self.0.get().len()
    }
}

impl From<serde_json::Value> for ToolParameters {
    fn from(schema: serde_json::Value) -> ToolParameters {
        let text = serde_json::value::to_raw_value(&schema)
            .expect("a serde_json::Value always serialises");
        ToolParameters(text.into())
    }
}

impl PartialEq for ToolParameters {
    fn eq(&self, other: &ToolParameters) -> bool {
        // Both texts are serde_json's compact form of a Value (sorted keys): equal schemas
        // have equal text.
        self.0.get() == other.0.get()
    }
}

impl serde::Serialize for ToolParameters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// An HTTP request the host must send.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpRequest {
    /// Absolute URL.
    pub url: String,
    /// Header name/value pairs (may hold an API key: never log them).
    pub headers: Vec<(String, String)>,
    /// JSON body.
    pub body: String,
}

/// One decoded streaming event.
#[derive(Clone, Debug, PartialEq)]
pub enum LlmEvent {
    /// Assistant text.
    TextDelta(String),
    /// A tool call starts at `index` (provider order).
    ToolCallStart {
        /// Provider index of the call.
        index: usize,
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More argument JSON text for the call at `index`.
    ToolCallArgumentsDelta {
        /// Provider index of the call.
        index: usize,
        /// JSON fragment.
        delta: String,
    },
    /// A thinking block starts (Anthropic extended thinking).
    ThinkingStart,
    /// More text of the current thinking block.
    ThinkingDelta(String),
    /// More of the current thinking block's signature.
    ThinkingSignature(String),
    /// A whole redacted thinking block (its opaque data).
    RedactedThinking(String),
    /// More of a reasoning item's readable summary as it streams (OpenAI Responses): shown to
    /// followers as thinking; the item itself ([`LlmEvent::Reasoning`]) carries the whole
    /// summary, so this adds nothing to the message.
    ReasoningSummaryDelta(String),
    /// A whole reasoning item (OpenAI Responses).
    Reasoning {
        /// Item id.
        id: String,
        /// Readable summary parts.
        summary: Vec<String>,
        /// Opaque encrypted reasoning.
        encrypted_content: Option<String>,
    },
    /// Token usage (the latest wins).
    Usage(Usage),
    /// The provider said why it stopped.
    Finish(StopReason),
}

/// Why an LLM request failed.
#[derive(Clone, Debug, PartialEq, Default, thiserror::Error)]
#[error("{message}")]
pub struct LlmFailure {
    /// HTTP status, if the provider answered.
    pub status: Option<u16>,
    /// Lowercase human message (never contains secrets).
    pub message: String,
    /// Whether trying again may succeed (429, 5xx, network, truncated stream).
    pub retryable: bool,
    /// How long the provider asked us to wait before trying again (`retry-after-ms` or
    /// `retry-after`), in milliseconds. See [`retry`].
    pub retry_after_ms: Option<u64>,
}

impl LlmFailure {
    /// A failure from an HTTP error status and its body.
    pub fn from_status(status: u16, body: &str) -> Self {
        let detail = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| body.chars().take(300).collect());
        LlmFailure {
            status: Some(status),
            message: format!("provider returned http {status}: {detail}"),
            // 408 (request timeout) and 409 (lock conflict) are transient too, as the providers'
            // own SDKs treat them; 529 is Anthropic's "overloaded".
            retryable: matches!(status, 408 | 409 | 429) || status >= 500,
            retry_after_ms: None,
        }
    }

    /// [`from_status`](Self::from_status) with the response headers: honours the provider's
    /// `retry-after-ms` / `retry-after` and an explicit `x-should-retry`.
    pub fn from_response(status: u16, headers: &[(String, String)], body: &str) -> Self {
        let mut failure = LlmFailure::from_status(status, body);
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim())
        };
        failure.retry_after_ms =
            retry::parse_retry_after(header("retry-after-ms"), header("retry-after"));
        match header("x-should-retry") {
            Some("true") => failure.retryable = true,
            Some("false") => failure.retryable = false,
            _ => {}
        }
        failure
    }

    /// Whether the provider refused the request because its context is too long (OpenAI
    /// `context_length_exceeded`, Anthropic "prompt is too long", and the like). Such a
    /// request never succeeds as it is: the host compacts once and tries again.
    pub fn is_context_overflow(&self) -> bool {
        if !matches!(self.status, Some(400 | 413)) {
            return false;
        }
        let message = self.message.to_ascii_lowercase();
        [
            "context_length_exceeded",
            "context length",
            "context window",
            "context limit",
            "prompt is too long",
            "too many tokens",
            "input is too long",
            "request too large",
        ]
        .iter()
        .any(|needle| message.contains(needle))
    }

    /// A network-level failure.
    pub fn network(message: impl Into<String>) -> Self {
        LlmFailure {
            status: None,
            message: message.into(),
            retryable: true,
            retry_after_ms: None,
        }
    }
}

/// Folds [`LlmEvent`]s into an [`AssistantMessage`].
#[derive(Debug, Default)]
pub struct AssistantBuilder {
    content: Vec<ContentBlock>,
    // (provider index, position in `content`, accumulated argument text)
    calls: Vec<(usize, usize, String)>,
    usage: Option<Usage>,
    stop_reason: Option<StopReason>,
}

impl AssistantBuilder {
    /// Applies one event.
    pub fn push(&mut self, event: LlmEvent) {
        match event {
            LlmEvent::TextDelta(delta) => match self.content.last_mut() {
                Some(ContentBlock::Text { text }) => text.push_str(&delta),
                _ => self.content.push(ContentBlock::Text { text: delta }),
            },
            LlmEvent::ToolCallStart { index, id, name } => {
                self.calls.push((index, self.content.len(), String::new()));
                self.content.push(ContentBlock::ToolCall(ToolCall {
                    id,
                    name,
                    arguments: serde_json::Value::Null,
                }));
            }
            LlmEvent::ToolCallArgumentsDelta { index, delta } => {
                if let Some(call) = self.calls.iter_mut().rev().find(|c| c.0 == index) {
                    call.2.push_str(&delta);
                }
            }
            LlmEvent::ThinkingStart => self.content.push(ContentBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            }),
            LlmEvent::ThinkingDelta(delta) => match self.last_thinking() {
                Some((thinking, _)) => thinking.push_str(&delta),
                None => self.content.push(ContentBlock::Thinking {
                    thinking: delta,
                    signature: String::new(),
                }),
            },
            LlmEvent::ThinkingSignature(delta) => match self.last_thinking() {
                Some((_, signature)) => signature.push_str(&delta),
                None => self.content.push(ContentBlock::Thinking {
                    thinking: String::new(),
                    signature: delta,
                }),
            },
            LlmEvent::RedactedThinking(data) => {
                self.content.push(ContentBlock::RedactedThinking { data })
            }
            LlmEvent::Reasoning {
                id,
                summary,
                encrypted_content,
            } => self.content.push(ContentBlock::Reasoning {
                id,
                summary,
                encrypted_content,
            }),
            LlmEvent::Usage(usage) => self.usage = Some(usage),
            LlmEvent::Finish(reason) => self.stop_reason = Some(reason),
            LlmEvent::ReasoningSummaryDelta(_) => {}
        }
    }

    /// The thinking block being streamed: the last block, if it is one.
    fn last_thinking(&mut self) -> Option<(&mut String, &mut String)> {
        match self.content.last_mut() {
            Some(ContentBlock::Thinking {
                thinking,
                signature,
            }) => Some((thinking, signature)),
            _ => None,
        }
    }

    /// Whether the stream said it finished.
    pub fn finished(&self) -> bool {
        self.stop_reason.is_some()
    }

    /// The message. Arguments that are not valid JSON are kept as a string, so the tool
    /// executor can report the problem to the model.
    pub fn build(mut self, provider: &str, model: &str) -> AssistantMessage {
        for (_, position, text) in self.calls.drain(..) {
            if let Some(ContentBlock::ToolCall(call)) = self.content.get_mut(position) {
                call.arguments = if text.trim().is_empty() {
                    serde_json::json!({})
                } else {
                    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
                };
            }
        }
        let has_calls = self
            .content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolCall(_)));
        let stop_reason = match self.stop_reason {
            _ if has_calls => StopReason::ToolUse,
            Some(reason) => reason,
            None => StopReason::Stop,
        };
        self.content
            .retain(|b| !matches!(b, ContentBlock::Text { text } if text.is_empty()));
        AssistantMessage {
            provider: provider.to_string(),
            model: model.to_string(),
            content: self.content,
            usage: self.usage,
            stop_reason,
        }
    }
}

/// The providers a session may name.
pub const PROVIDERS: [&str; 4] = [
    fake::PROVIDER,
    openai::PROVIDER,
    responses::PROVIDER,
    anthropic::PROVIDER,
];

/// The schema of an optional provider field: one of [`PROVIDERS`] (the Rust field stays a
/// string: the provider is checked where it is used, with the server's own rules, such as
/// `fake` being off).
#[cfg(test)]
pub(crate) fn optional_provider_schema(
    _generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    let mut values: Vec<serde_json::Value> = PROVIDERS.iter().map(|p| (*p).into()).collect();
    values.push(serde_json::Value::Null);
    schemars::json_schema!({
        "type": ["string", "null"],
        "enum": values,
    })
}

/// The model a session of `provider` uses when it names none.
pub fn default_model(provider: &str) -> &'static str {
    match provider {
        fake::PROVIDER => fake::DEFAULT_MODEL,
        anthropic::PROVIDER => anthropic::DEFAULT_MODEL,
        responses::PROVIDER => responses::DEFAULT_MODEL,
        _ => openai::DEFAULT_MODEL,
    }
}

/// How to reach an HTTP provider: the names of its settings, its defaults and its codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpProvider {
    /// Provider id.
    pub id: &'static str,
    /// Variable holding the base URL.
    pub base_url_var: &'static str,
    /// Base URL when the variable is unset.
    pub default_base_url: &'static str,
    /// Secret (or variable) holding the API key.
    pub api_key_var: &'static str,
}

impl HttpProvider {
    /// The HTTP provider named `provider`; `None` for `fake` and unknown names.
    pub fn named(provider: &str) -> Option<HttpProvider> {
        match provider {
            openai::PROVIDER => Some(HttpProvider {
                id: openai::PROVIDER,
                base_url_var: "OPENAI_BASE_URL",
                default_base_url: openai::DEFAULT_BASE_URL,
                api_key_var: "OPENAI_API_KEY",
            }),
            // Responses and Chat Completions share OpenAI's base URL and key.
            responses::PROVIDER => Some(HttpProvider {
                id: responses::PROVIDER,
                base_url_var: "OPENAI_BASE_URL",
                default_base_url: openai::DEFAULT_BASE_URL,
                api_key_var: "OPENAI_API_KEY",
            }),
            anthropic::PROVIDER => Some(HttpProvider {
                id: anthropic::PROVIDER,
                base_url_var: "ANTHROPIC_BASE_URL",
                default_base_url: anthropic::DEFAULT_BASE_URL,
                api_key_var: "ANTHROPIC_API_KEY",
            }),
            _ => None,
        }
    }

    /// The streaming request for `request`.
    pub fn build_http_request(
        &self,
        base_url: &str,
        api_key: Option<&str>,
        request: &LlmRequest,
    ) -> HttpRequest {
        match self.id {
            anthropic::PROVIDER => anthropic::build_http_request(base_url, api_key, request),
            responses::PROVIDER => responses::build_http_request(base_url, api_key, request),
            _ => openai::build_http_request(base_url, api_key, request),
        }
    }

    /// A decoder for the streamed response.
    pub fn decoder(&self) -> StreamDecoder {
        match self.id {
            anthropic::PROVIDER => StreamDecoder::Anthropic(anthropic::StreamDecoder::new()),
            responses::PROVIDER => StreamDecoder::Responses(responses::StreamDecoder::new()),
            _ => StreamDecoder::OpenAi(openai::StreamDecoder::new()),
        }
    }
}

/// A streamed response decoder of any HTTP provider.
#[derive(Debug)]
pub enum StreamDecoder {
    /// Chat Completions.
    OpenAi(openai::StreamDecoder),
    /// Anthropic Messages.
    Anthropic(anthropic::StreamDecoder),
    /// OpenAI Responses.
    Responses(responses::StreamDecoder),
}

impl StreamDecoder {
    /// Decodes the next piece of the body.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<LlmEvent>, LlmFailure> {
        match self {
            StreamDecoder::OpenAi(decoder) => decoder.push(bytes),
            StreamDecoder::Anthropic(decoder) => decoder.push(bytes),
            StreamDecoder::Responses(decoder) => decoder.push(bytes),
        }
    }

    /// Ends the body.
    pub fn finish(self) -> Result<Vec<LlmEvent>, LlmFailure> {
        match self {
            StreamDecoder::OpenAi(decoder) => decoder.finish(),
            StreamDecoder::Anthropic(decoder) => decoder.finish(),
            StreamDecoder::Responses(decoder) => decoder.finish(),
        }
    }
}
