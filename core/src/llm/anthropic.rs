//! The `anthropic` provider: the streaming Messages API (`POST {base}/v1/messages` with
//! `stream: true`, `anthropic-version: 2023-06-01`).
//!
//! [`build_http_request`] turns an [`LlmRequest`] into the HTTP request; [`StreamDecoder`]
//! turns the Server-Sent Events of the response, fed in arbitrary byte pieces, into
//! [`LlmEvent`]s.
//!
//! Request shape:
//! * the system prompt is a `system` text block; tools carry `input_schema`;
//! * user and custom messages are `user` text blocks, tool results `tool_result` blocks in a
//!   `user` message (results first, as the API requires), consecutive same-role messages are
//!   merged into one message; a tool result's images (`LlmRequest::images`) are `image` blocks
//!   (base64 source) inside its `tool_result` content, after its text;
//! * assistant `thinking` / `redacted_thinking` blocks produced by this provider go back
//!   unchanged (their signature must match); reasoning of other providers is dropped;
//! * a reasoning plan (`super::reasoning`) is `thinking: {"type": "enabled", "budget_tokens"}`
//!   with the plan's `max_tokens`;
//! * prompt caching: `cache_control: {"type": "ephemeral"}` breakpoints on the stable prefix —
//!   the last tool, the system prompt, the user's global context message — and on the last
//!   block of the conversation, so each step reads the previous step's prefix from the cache
//!   (at most 4 breakpoints, the API's limit).
//!
//! Stream shape (`message_start`, then per content block `content_block_start`,
//! `content_block_delta`s and `content_block_stop`, then `message_delta` with the stop reason
//! and cumulative usage, then `message_stop`; `ping` anywhere; `error` events such as
//! `overloaded_error` end the stream).

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::inline_images::{self, InlineImages};
use super::reasoning::plan::Plan;
use super::stream::{Dialect, SseStream, event_kind, parse_json};
use super::{HttpRequest, LlmEvent, LlmFailure, LlmRequest, ToolParameters};
use crate::wire::{ContentBlock, Message, StopReason, Usage, custom_types};

/// Provider id, as recorded in session headers and assistant messages.
pub const PROVIDER: &str = "anthropic";
/// Base URL used when none is configured (the path `/v1/messages` is appended).
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// Model used when none is configured.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";
/// The API version header value.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` when the request does not say (the API requires one); every current Claude
/// model accepts it.
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// How much of a provider's in-stream error message is kept.
const MAX_ERROR_CHARS: usize = 500;
/// What an empty user message becomes: the API rejects empty text blocks.
const EMPTY_TEXT: &str = "(empty message)";

/// Builds the streaming Messages request.
///
/// `base_url` may end with `/`. The `x-api-key` header is only sent for a non-empty key.
pub fn build_http_request(
    base_url: &str,
    api_key: Option<&str>,
    request: &LlmRequest,
) -> HttpRequest {
    let url = format!("{}/v1/messages", base_url.trim_end_matches('/'));
    let mut headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("accept".to_string(), "text/event-stream".to_string()),
        ("anthropic-version".to_string(), API_VERSION.to_string()),
    ];
    if let Some(key) = api_key.map(str::trim).filter(|key| !key.is_empty()) {
        headers.push(("x-api-key".to_string(), key.to_string()));
    }

    let last_tool = request.tools.len().saturating_sub(1);
    // Extended thinking (`super::reasoning` checked the budget against the model's limit):
    // `max_tokens` above the budget; no `temperature`, `top_k` or forced `tool_choice`, which
    // thinking does not allow (this body never sets them).
    let (thinking, max_tokens) = match request.reasoning {
        Some(Plan::Thinking {
            budget_tokens,
            max_tokens,
        }) => (
            Some(Thinking {
                kind: "enabled",
                budget_tokens,
            }),
            max_tokens,
        ),
        _ => (
            None,
            request.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        ),
    };
    let body = MessagesBody {
        model: &request.model,
        max_tokens,
        thinking,
        stream: true,
        system: (!request.system_prompt.is_empty()).then(|| {
            json!([{"type": "text", "text": request.system_prompt, "cache_control": ephemeral()}])
        }),
        tools: request
            .tools
            .iter()
            .enumerate()
            .map(|(i, tool)| MessagesTool {
                name: tool.name,
                description: tool.description,
                input_schema: &tool.parameters,
                cache_control: (i == last_tool).then(ephemeral),
            })
            .collect(),
        messages: messages_json(&request.messages, &request.images),
    };
    HttpRequest {
        url,
        headers,
        body: serde_json::to_string(&body).expect("a request body serialises"),
    }
}

/// A Messages request body. The tools are borrowed, not copied into `Value`s: their schemas
/// are most of a step's request (docs/benchmarks.md, session 27).
#[derive(Serialize)]
struct MessagesBody<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<MessagesTool<'a>>,
    messages: Vec<Value>,
}

/// `thinking: {"type": "enabled", "budget_tokens": n}`.
#[derive(Serialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct MessagesTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a ToolParameters,
    /// On the last tool: the tools are the prompt cache's stable prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Value>,
}

fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// The context as Messages API `messages`: alternating roles, each with content blocks.
fn messages_json(messages: &[Message], images: &InlineImages) -> Vec<Value> {
    // (role, blocks, whether a block of it is the global context)
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut global_context_at: Option<(usize, usize)> = None;
    for message in messages {
        let (role, blocks) = match message {
            Message::User { content, .. } => ("user", vec![text_block(content)]),
            Message::CustomMessage {
                custom_type,
                content,
                ..
            } => {
                if custom_type == custom_types::GLOBAL_CONTEXT && global_context_at.is_none() {
                    let index = match out.last() {
                        Some(("user", blocks)) => (out.len() - 1, blocks.len()),
                        _ => (out.len(), 0),
                    };
                    global_context_at = Some(index);
                }
                ("user", vec![text_block(content)])
            }
            Message::ToolResult(result) => {
                let mut block = Map::new();
                block.insert("type".into(), "tool_result".into());
                block.insert("tool_use_id".into(), result.tool_call_id.clone().into());
                // Images go inside the result: text first, then one image block each.
                let (text, shown) = inline_images::for_result(result, images);
                if shown.is_empty() {
                    if !text.is_empty() {
                        block.insert("content".into(), text.into());
                    }
                } else {
                    let mut content = Vec::new();
                    if !text.is_empty() {
                        content.push(json!({"type": "text", "text": text}));
                    }
                    content.extend(shown.iter().map(|(_, image)| {
                        json!({"type": "image", "source": {
                            "type": "base64",
                            "media_type": image.media_type,
                            "data": image.base64,
                        }})
                    }));
                    block.insert("content".into(), Value::Array(content));
                }
                if result.is_error {
                    block.insert("is_error".into(), true.into());
                }
                ("user", vec![Value::Object(block)])
            }
            Message::Assistant(assistant) => {
                let own = assistant.provider == PROVIDER;
                let blocks: Vec<Value> = assistant
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::Text { text } if text.is_empty() => None,
                        ContentBlock::Text { text } => Some(json!({"type": "text", "text": text})),
                        ContentBlock::ToolCall(call) => Some(json!({
                            "type": "tool_use",
                            "id": call.id,
                            "name": call.name,
                            "input": tool_input(&call.arguments),
                        })),
                        ContentBlock::Thinking {
                            thinking,
                            signature,
                        } if own => Some(json!({
                            "type": "thinking",
                            "thinking": thinking,
                            "signature": signature,
                        })),
                        ContentBlock::RedactedThinking { data } if own => {
                            Some(json!({"type": "redacted_thinking", "data": data}))
                        }
                        // Another provider's reasoning cannot be verified here: dropped.
                        _ => None,
                    })
                    .collect();
                // The API rejects an assistant message without content; an empty reply adds
                // nothing the model needs.
                if blocks.is_empty() {
                    continue;
                }
                ("assistant", blocks)
            }
        };
        match out.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }

    // Breakpoints: the global context (a stable prefix of every request) and the last block.
    if let Some((message, block)) = global_context_at
        && let Some(Value::Object(block)) = out
            .get_mut(message)
            .and_then(|(_, blocks)| blocks.get_mut(block))
    {
        block.insert("cache_control".into(), ephemeral());
    }
    if let Some(("user", blocks)) = out.last_mut()
        && let Some(Value::Object(block)) = blocks.last_mut()
    {
        block.insert("cache_control".into(), ephemeral());
    }

    out.into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // Tool results first: the API requires them at the start of the message.
                blocks.sort_by_key(|b| b.get("type") != Some(&Value::from("tool_result")));
            }
            json!({"role": role, "content": blocks})
        })
        .collect()
}

fn text_block(text: &str) -> Value {
    let text = if text.is_empty() { EMPTY_TEXT } else { text };
    json!({"type": "text", "text": text})
}

/// Tool input must be a JSON object. Arguments the model sent unparseable (a string) or as
/// another JSON value go back wrapped, so the model sees what it sent.
fn tool_input(arguments: &Value) -> Value {
    match arguments {
        Value::Object(_) => arguments.clone(),
        Value::Null => json!({}),
        Value::String(raw) => json!({"invalid_arguments": raw}),
        other => json!({"invalid_arguments": other.to_string()}),
    }
}

/// What a content block of the stream is.
#[derive(Debug)]
enum Block {
    ToolUse {
        /// `input` of `content_block_start`, as JSON text (normally `{}`).
        initial_input: String,
        /// Whether an `input_json_delta` arrived.
        got_delta: bool,
    },
    Other,
}

/// Usage as the stream reports it: `message_start` has the input side, `message_delta` the
/// cumulative output (and sometimes updated input counts).
#[derive(Debug, Default, Clone, Copy)]
struct RawUsage {
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
}

impl RawUsage {
    fn merge(&mut self, usage: &Value) {
        let set = |key: &str, field: &mut u64| {
            if let Some(n) = usage.get(key).and_then(Value::as_u64) {
                *field = n;
            }
        };
        set("input_tokens", &mut self.input);
        set("cache_read_input_tokens", &mut self.cache_read);
        set("cache_creation_input_tokens", &mut self.cache_write);
        set("output_tokens", &mut self.output);
    }

    fn usage(self) -> Usage {
        // Anthropic's `input_tokens` excludes cache reads and writes; ours includes them.
        let input_tokens = self
            .input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write);
        Usage {
            input_tokens,
            output_tokens: self.output,
            total_tokens: input_tokens.saturating_add(self.output),
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: 0,
            cost_usd: None,
        }
    }
}

/// Decodes a streamed Messages response into [`LlmEvent`]s.
///
/// Feed the body with [`push`](Self::push) in pieces of any size, then call
/// [`finish`](Self::finish) when the body ends. After an error the decoder keeps returning it.
#[derive(Debug)]
pub struct StreamDecoder(SseStream<MessagesStream>);

impl Default for StreamDecoder {
    fn default() -> Self {
        StreamDecoder::new()
    }
}

impl StreamDecoder {
    /// A decoder at the start of a response body.
    pub fn new() -> Self {
        StreamDecoder(SseStream::new(MessagesStream {
            blocks: Vec::new(),
            usage: RawUsage::default(),
            finished: false,
            done: false,
        }))
    }

    /// Decodes the next piece of the body.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<LlmEvent>, LlmFailure> {
        self.0.push(bytes)
    }

    /// Ends the body: decodes a trailing event that lacks its blank line, and fails if the
    /// stream never finished (neither `message_stop` nor a stop reason).
    pub fn finish(self) -> Result<Vec<LlmEvent>, LlmFailure> {
        self.0.finish()
    }
}

/// The Messages dialect's state between events.
#[derive(Debug)]
struct MessagesStream {
    /// Content blocks by their stream index.
    blocks: Vec<(usize, Block)>,
    usage: RawUsage,
    /// `message_delta` gave a stop reason.
    finished: bool,
    /// `message_stop` was seen; everything after it is ignored.
    done: bool,
}

impl Dialect for MessagesStream {
    fn handle(
        &mut self,
        data: &str,
        sse_event: Option<&str>,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure> {
        let event = parse_json(data)?;
        // The data's `type` names the event; the SSE `event` field is the fallback.
        let kind = event_kind(&event, sse_event).to_string();
        self.handle_event(&kind, &event, events)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn complete(&self) -> bool {
        self.done || self.finished
    }
}

impl MessagesStream {
    fn handle_event(
        &mut self,
        kind: &str,
        event: &Value,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure> {
        let index = event
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match kind {
            "message_start" => {
                if let Some(usage) = event.pointer("/message/usage") {
                    self.usage.merge(usage);
                    events.push(LlmEvent::Usage(self.usage.usage()));
                }
            }
            "content_block_start" => {
                let (Some(index), Some(block)) = (index, event.get("content_block")) else {
                    return Ok(());
                };
                let text = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
                let state = match text("type") {
                    "text" => {
                        if !text("text").is_empty() {
                            events.push(LlmEvent::TextDelta(text("text").to_string()));
                        }
                        Block::Other
                    }
                    "tool_use" => {
                        events.push(LlmEvent::ToolCallStart {
                            index,
                            id: match text("id") {
                                "" => format!("toolu_{index}"),
                                id => id.to_string(),
                            },
                            name: text("name").to_string(),
                        });
                        Block::ToolUse {
                            initial_input: block
                                .get("input")
                                .filter(|input| input.as_object().is_some_and(|o| !o.is_empty()))
                                .map(Value::to_string)
                                .unwrap_or_default(),
                            got_delta: false,
                        }
                    }
                    "thinking" => {
                        events.push(LlmEvent::ThinkingStart);
                        if !text("thinking").is_empty() {
                            events.push(LlmEvent::ThinkingDelta(text("thinking").to_string()));
                        }
                        if !text("signature").is_empty() {
                            events.push(LlmEvent::ThinkingSignature(text("signature").to_string()));
                        }
                        Block::Other
                    }
                    "redacted_thinking" => {
                        events.push(LlmEvent::RedactedThinking(text("data").to_string()));
                        Block::Other
                    }
                    // Server tools and other blocks carry nothing we replay.
                    _ => Block::Other,
                };
                self.blocks.push((index, state));
            }
            "content_block_delta" => {
                let (Some(index), Some(delta)) = (index, event.get("delta")) else {
                    return Ok(());
                };
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
                match text("type") {
                    "text_delta" if !text("text").is_empty() => {
                        events.push(LlmEvent::TextDelta(text("text").to_string()));
                    }
                    "input_json_delta" => {
                        if let Some((_, Block::ToolUse { got_delta, .. })) =
                            self.blocks.iter_mut().rev().find(|(i, _)| *i == index)
                        {
                            *got_delta = true;
                            if !text("partial_json").is_empty() {
                                events.push(LlmEvent::ToolCallArgumentsDelta {
                                    index,
                                    delta: text("partial_json").to_string(),
                                });
                            }
                        }
                    }
                    "thinking_delta" if !text("thinking").is_empty() => {
                        events.push(LlmEvent::ThinkingDelta(text("thinking").to_string()));
                    }
                    "signature_delta" if !text("signature").is_empty() => {
                        events.push(LlmEvent::ThinkingSignature(text("signature").to_string()));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(index) = index
                    && let Some((
                        _,
                        Block::ToolUse {
                            initial_input,
                            got_delta: false,
                        },
                    )) = self.blocks.iter_mut().rev().find(|(i, _)| *i == index)
                    && !initial_input.is_empty()
                {
                    events.push(LlmEvent::ToolCallArgumentsDelta {
                        index,
                        delta: std::mem::take(initial_input),
                    });
                }
            }
            "message_delta" => {
                if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
                    self.usage.merge(usage);
                    events.push(LlmEvent::Usage(self.usage.usage()));
                }
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.finished = true;
                    events.push(LlmEvent::Finish(match reason {
                        "tool_use" => StopReason::ToolUse,
                        "max_tokens" | "model_context_window_exceeded" => StopReason::Length,
                        _ => StopReason::Stop,
                    }));
                }
            }
            "message_stop" => self.done = true,
            "error" => return Err(stream_error(event.get("error").unwrap_or(event))),
            // `ping` and event types added later carry nothing we need.
            _ => {}
        }
        Ok(())
    }
}

/// An `error` event: `{"type":"error","error":{"type":"overloaded_error","message":"…"}}`.
fn stream_error(error: &Value) -> LlmFailure {
    let kind = error.get("type").and_then(Value::as_str).unwrap_or("");
    let detail = match error {
        Value::String(message) => message.clone(),
        other => match other.get("message").and_then(Value::as_str) {
            Some(message) => message.to_string(),
            None => other.to_string(),
        },
    };
    let detail: String = detail.chars().take(MAX_ERROR_CHARS).collect();
    LlmFailure {
        status: None,
        message: if kind.is_empty() {
            format!("provider stream error: {detail}")
        } else {
            format!("provider stream error: {kind}: {detail}")
        },
        // A request the provider refused mid-stream (invalid, too long, not allowed) fails the
        // same way again; overload, rate limits and server errors pass.
        retryable: !matches!(
            kind,
            "invalid_request_error"
                | "authentication_error"
                | "permission_error"
                | "not_found_error"
                | "request_too_large"
                | "billing_error"
        ),
        retry_after_ms: None,
    }
}

#[cfg(test)]
mod tests;
