//! The `openai` provider: the streaming OpenAI Responses API (`POST {base}/responses` with
//! `stream: true`).
//!
//! Requests are stateless (`store: false`): the whole context goes in `input` every step, and
//! reasoning items come back with `include: ["reasoning.encrypted_content"]` so they can be
//! carried to the next step, as the API requires for reasoning models calling tools.
//!
//! Input shape: user and custom messages are `{"role":"user","content"}`; an assistant message
//! becomes its items in order — `reasoning` (only this provider's, only with encrypted content),
//! `message` with `output_text`, `function_call` — and tool results `function_call_output`
//! (a result's images, `LlmRequest::images`, follow the run of outputs in one user message of
//! `input_text` captions and `input_image` data URLs).
//! Anthropic thinking blocks are dropped.
//!
//! Stream events used: `response.output_item.added` / `.done`, `response.output_text.delta`,
//! `response.reasoning_summary_text.delta` (shown as thinking while it streams; the reasoning
//! item at `.done` carries the whole summary), `response.function_call_arguments.delta` /
//! `.done`, `response.completed`, `response.incomplete`, `response.failed`, `error`. Others
//! (`response.created`, …) carry nothing we need.
//!
//! A reasoning setting (`super::reasoning`) is `reasoning: {"effort", "summary": "auto"}`.

use serde::Serialize;
use serde_json::{Value, json};

use super::inline_images::{self, InlineImages};
use super::reasoning::plan::Plan;
use super::stream::{Dialect, SseStream, event_kind, parse_json};
use super::{HttpRequest, LlmEvent, LlmFailure, LlmRequest, ToolParameters};
use crate::wire::{ContentBlock, Message, StopReason, Usage};

/// Provider id, as recorded in session headers and assistant messages.
pub const PROVIDER: &str = "openai";
/// Model used when none is configured.
pub const DEFAULT_MODEL: &str = "gpt-5-mini";

/// How much of a provider's in-stream error message is kept.
const MAX_ERROR_CHARS: usize = 500;

/// Builds the streaming Responses request. `base_url` is the OpenAI base (`…/v1`).
pub fn build_http_request(
    base_url: &str,
    api_key: Option<&str>,
    request: &LlmRequest,
) -> HttpRequest {
    let url = format!("{}/responses", base_url.trim_end_matches('/'));
    let mut headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("accept".to_string(), "text/event-stream".to_string()),
    ];
    if let Some(key) = api_key.map(str::trim).filter(|key| !key.is_empty()) {
        headers.push(("authorization".to_string(), format!("Bearer {key}")));
    }
    let body = ResponsesBody {
        model: &request.model,
        instructions: (!request.system_prompt.is_empty()).then_some(&request.system_prompt),
        input: input_items(&request.messages, &request.images),
        stream: true,
        store: false,
        include: &["reasoning.encrypted_content"],
        max_output_tokens: request.max_output_tokens,
        // The summary streams as thinking (`response.reasoning_summary_text.delta`).
        reasoning: match request.reasoning {
            Some(Plan::Effort(effort)) => Some(ReasoningParam {
                effort: effort.as_str(),
                summary: "auto",
            }),
            _ => None,
        },
        tools: request
            .tools
            .iter()
            .map(|tool| ResponsesTool {
                kind: "function",
                name: tool.name,
                description: tool.description,
                parameters: &tool.parameters,
                strict: false,
            })
            .collect(),
    };
    HttpRequest {
        url,
        headers,
        body: serde_json::to_string(&body).expect("a request body serialises"),
    }
}

/// A Responses request body. The tools are borrowed, not copied into `Value`s: their schemas
/// are most of a step's request (docs/benchmarks.md, session 27).
#[derive(Serialize)]
struct ResponsesBody<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a String>,
    input: Vec<Value>,
    stream: bool,
    store: bool,
    include: &'static [&'static str],
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<ReasoningParam>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ResponsesTool<'a>>,
}

/// `reasoning: {"effort", "summary": "auto"}`.
#[derive(Serialize)]
struct ReasoningParam {
    effort: &'static str,
    summary: &'static str,
}

#[derive(Serialize)]
struct ResponsesTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a ToolParameters,
    strict: bool,
}

fn input_items(messages: &[Message], images: &InlineImages) -> Vec<Value> {
    let mut items = Vec::with_capacity(messages.len());
    // A tool result's images (`input_image` data URLs) follow the run of function outputs they
    // belong to, in one user message.
    let mut pending_images: Vec<Value> = Vec::new();
    for message in messages {
        if !matches!(message, Message::ToolResult(_)) && !pending_images.is_empty() {
            items.push(json!({"role": "user", "content": std::mem::take(&mut pending_images)}));
        }
        match message {
            Message::User { content, .. } | Message::CustomMessage { content, .. } => {
                items.push(json!({"role": "user", "content": content}));
            }
            Message::ToolResult(result) => {
                let (text, shown) = inline_images::for_result(result, images);
                items.push(json!({
                    "type": "function_call_output",
                    "call_id": result.tool_call_id,
                    "output": text,
                }));
                for (uri, image) in shown {
                    pending_images.push(
                        json!({"type": "input_text", "text": inline_images::caption(result, uri)}),
                    );
                    pending_images
                        .push(json!({"type": "input_image", "image_url": image.data_url()}));
                }
            }
            Message::Assistant(assistant) => {
                let own = assistant.provider == PROVIDER;
                for block in &assistant.content {
                    match block {
                        ContentBlock::Text { text } if !text.is_empty() => items.push(json!({
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": text}],
                        })),
                        ContentBlock::ToolCall(call) => items.push(json!({
                            "type": "function_call",
                            "call_id": call.id,
                            "name": call.name,
                            "arguments": match &call.arguments {
                                Value::String(raw) => raw.clone(),
                                other => other.to_string(),
                            },
                        })),
                        // Without stored state a reasoning item is only usable with its
                        // encrypted content.
                        ContentBlock::Reasoning {
                            id,
                            summary,
                            encrypted_content: Some(encrypted),
                        } if own => items.push(json!({
                            "type": "reasoning",
                            "id": id,
                            "summary": summary
                                .iter()
                                .map(|text| json!({"type": "summary_text", "text": text}))
                                .collect::<Vec<_>>(),
                            "encrypted_content": encrypted,
                        })),
                        _ => {}
                    }
                }
            }
        }
    }
    if !pending_images.is_empty() {
        items.push(json!({"role": "user", "content": pending_images}));
    }
    items
}

/// A function call seen in the stream, by `output_index`.
#[derive(Debug)]
struct Call {
    index: usize,
    /// Arguments known before any delta (`arguments` of the added item).
    initial: String,
    /// Whether any argument text was emitted.
    emitted: bool,
}

/// Decodes a streamed Responses body into [`LlmEvent`]s.
///
/// Feed the body with [`push`](Self::push) in pieces of any size, then call
/// [`finish`](Self::finish) when the body ends. After an error the decoder keeps returning it.
#[derive(Debug)]
pub struct StreamDecoder(SseStream<ResponsesStream>);

impl Default for StreamDecoder {
    fn default() -> Self {
        StreamDecoder::new()
    }
}

impl StreamDecoder {
    /// A decoder at the start of a response body.
    pub fn new() -> Self {
        StreamDecoder(SseStream::new(ResponsesStream {
            calls: Vec::new(),
            summary_part: None,
            done: false,
        }))
    }

    /// Decodes the next piece of the body.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<LlmEvent>, LlmFailure> {
        self.0.push(bytes)
    }

    /// Ends the body: decodes a trailing event that lacks its blank line, and fails if the
    /// response never completed.
    pub fn finish(self) -> Result<Vec<LlmEvent>, LlmFailure> {
        self.0.finish()
    }
}

/// The Responses dialect's state between events.
#[derive(Debug)]
struct ResponsesStream {
    calls: Vec<Call>,
    /// The reasoning summary part streaming: (output index, summary index).
    summary_part: Option<(Option<usize>, Option<u64>)>,
    /// A terminal event (`response.completed` / `.incomplete`) was seen.
    done: bool,
}

impl Dialect for ResponsesStream {
    fn handle(
        &mut self,
        data: &str,
        sse_event: Option<&str>,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure> {
        // Some compatible servers end with Chat Completions' `[DONE]`; the terminal event
        // has already been seen (or the body ends early).
        if data == "[DONE]" {
            return Ok(());
        }
        let event = parse_json(data)?;
        let kind = event_kind(&event, sse_event).to_string();
        self.handle_event(&kind, &event, events)
    }

    fn done(&self) -> bool {
        self.done
    }
}

impl ResponsesStream {
    fn handle_event(
        &mut self,
        kind: &str,
        event: &Value,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure> {
        let index = event
            .get("output_index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        let text = |value: &Value, key: &str| -> String {
            value
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        match kind {
            "response.output_item.added" => {
                if let (Some(index), Some(item)) = (index, event.get("item"))
                    && item.get("type").and_then(Value::as_str) == Some("function_call")
                {
                    self.start_call(index, item, events);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = text(event, "delta");
                if !delta.is_empty() {
                    events.push(LlmEvent::TextDelta(delta));
                }
            }
            // A reasoning summary as it is written (`summary: "auto"`): parts after the first
            // of an item start on a paragraph of their own.
            "response.reasoning_summary_text.delta" => {
                let delta = text(event, "delta");
                let part = (index, event.get("summary_index").and_then(Value::as_u64));
                if !delta.is_empty() {
                    let new_part = self.summary_part != Some(part);
                    let same_item = self.summary_part.is_some_and(|(item, _)| item == index);
                    self.summary_part = Some(part);
                    events.push(LlmEvent::ReasoningSummaryDelta(if new_part && same_item {
                        format!("\n\n{delta}")
                    } else {
                        delta
                    }));
                }
            }
            "response.function_call_arguments.delta" => {
                let delta = text(event, "delta");
                if let Some(index) = index
                    && let Some(call) = self.calls.iter_mut().rev().find(|c| c.index == index)
                    && !delta.is_empty()
                {
                    call.emitted = true;
                    events.push(LlmEvent::ToolCallArgumentsDelta { index, delta });
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(index) = index {
                    self.complete_arguments(index, text(event, "arguments"), events);
                }
            }
            "response.output_item.done" => {
                let (Some(index), Some(item)) = (index, event.get("item")) else {
                    return Ok(());
                };
                match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => {
                        if !self.calls.iter().any(|c| c.index == index) {
                            self.start_call(index, item, events);
                        }
                        self.complete_arguments(index, text(item, "arguments"), events);
                    }
                    Some("reasoning") => events.push(LlmEvent::Reasoning {
                        id: text(item, "id"),
                        summary: item
                            .get("summary")
                            .and_then(Value::as_array)
                            .map(|parts| {
                                parts
                                    .iter()
                                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                                    .map(str::to_string)
                                    .collect()
                            })
                            .unwrap_or_default(),
                        encrypted_content: item
                            .get("encrypted_content")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    }),
                    _ => {}
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = event.get("response").unwrap_or(&Value::Null);
                if let Some(usage) = response.get("usage").filter(|u| u.is_object()) {
                    events.push(LlmEvent::Usage(usage_of(usage)));
                }
                let reason = if kind == "response.incomplete" {
                    match response
                        .pointer("/incomplete_details/reason")
                        .and_then(Value::as_str)
                    {
                        Some("max_output_tokens") => StopReason::Length,
                        _ => StopReason::Stop,
                    }
                } else if self.calls.is_empty() {
                    StopReason::Stop
                } else {
                    StopReason::ToolUse
                };
                events.push(LlmEvent::Finish(reason));
                self.done = true;
            }
            "response.failed" => {
                let error = event.pointer("/response/error").unwrap_or(&Value::Null);
                return Err(stream_error(error));
            }
            "error" => return Err(stream_error(event)),
            _ => {}
        }
        Ok(())
    }

    fn start_call(&mut self, index: usize, item: &Value, events: &mut Vec<LlmEvent>) {
        let field = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or("");
        let id = match (field("call_id"), field("id")) {
            ("", "") => format!("call_{index}"),
            ("", id) | (id, _) => id.to_string(),
        };
        events.push(LlmEvent::ToolCallStart {
            index,
            id,
            name: field("name").to_string(),
        });
        self.calls.push(Call {
            index,
            initial: field("arguments").to_string(),
            emitted: false,
        });
    }

    /// The final arguments of a call: emitted only when no delta carried them.
    fn complete_arguments(&mut self, index: usize, arguments: String, events: &mut Vec<LlmEvent>) {
        let Some(call) = self.calls.iter_mut().rev().find(|c| c.index == index) else {
            return;
        };
        if call.emitted {
            return;
        }
        let arguments = if arguments.is_empty() {
            std::mem::take(&mut call.initial)
        } else {
            arguments
        };
        if !arguments.is_empty() {
            call.emitted = true;
            events.push(LlmEvent::ToolCallArgumentsDelta {
                index,
                delta: arguments,
            });
        }
    }
}

fn usage_of(usage: &Value) -> Usage {
    let count = |path: &str| usage.pointer(path).and_then(Value::as_u64).unwrap_or(0);
    let input_tokens = count("/input_tokens");
    let output_tokens = count("/output_tokens");
    Usage {
        input_tokens,
        output_tokens,
        total_tokens: usage
            .get("total_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(input_tokens.saturating_add(output_tokens)),
        cache_read_tokens: count("/input_tokens_details/cached_tokens"),
        cache_write_tokens: 0,
        reasoning_tokens: count("/output_tokens_details/reasoning_tokens"),
        cost_usd: None,
    }
}

/// `error` events (`{code, message}`) and the `error` of a failed response.
fn stream_error(error: &Value) -> LlmFailure {
    let code = error.get("code").and_then(Value::as_str).unwrap_or("");
    let detail = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| error.to_string());
    let detail: String = detail.chars().take(MAX_ERROR_CHARS).collect();
    LlmFailure {
        status: None,
        message: if code.is_empty() {
            format!("provider stream error: {detail}")
        } else {
            format!("provider stream error: {code}: {detail}")
        },
        // A refused request fails the same way again; overload and server errors pass.
        retryable: !matches!(
            code,
            "invalid_prompt"
                | "context_length_exceeded"
                | "invalid_request_error"
                | "invalid_api_key"
                | "insufficient_quota"
        ),
        retry_after_ms: None,
    }
}

#[cfg(test)]
mod tests;
