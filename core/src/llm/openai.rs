//! The `openai-compatible` provider: streaming Chat Completions (`POST {base}/chat/completions`
//! with `stream: true`).
//!
//! [`build_http_request`] turns an [`LlmRequest`] into the HTTP request the host sends;
//! [`StreamDecoder`] turns the Server-Sent Events of the response body, fed in arbitrary byte
//! pieces, into [`LlmEvent`]s.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Value, json};

use super::inline_images;
use super::reasoning::plan::Plan;
use super::stream::{Dialect, SseStream, parse_json};
use super::{HttpRequest, LlmEvent, LlmFailure, LlmRequest, ToolParameters};
use crate::wire::{Message, StopReason, Usage};

/// Provider id, as recorded in session headers and assistant messages.
pub const PROVIDER: &str = "openai-compatible";
/// Base URL used when none is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// Model used when none is configured.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

/// How much of a provider's in-stream error message is kept.
const MAX_ERROR_CHARS: usize = 500;

/// Builds the streaming Chat Completions request.
///
/// `base_url` may end with `/`. The `authorization` header is only sent for a non-empty key.
pub fn build_http_request(
    base_url: &str,
    api_key: Option<&str>,
    request: &LlmRequest,
) -> HttpRequest {
    let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
    let mut headers = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("accept".to_string(), "text/event-stream".to_string()),
    ];
    if let Some(key) = api_key.map(str::trim).filter(|key| !key.is_empty()) {
        headers.push(("authorization".to_string(), format!("Bearer {key}")));
    }

    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system_prompt.is_empty() {
        messages.push(ChatMessage::System {
            content: &request.system_prompt,
        });
    }
    // A tool result's images follow the run of tool messages they belong to, in one user
    // message (`image_url` data URLs): nothing may come between an assistant's tool calls and
    // their tool messages.
    let mut pending_images: Vec<Value> = Vec::new();
    for message in &request.messages {
        if let Message::ToolResult(result) = message {
            let (text, shown) = inline_images::for_result(result, &request.images);
            messages.push(ChatMessage::Tool {
                tool_call_id: &result.tool_call_id,
                content: Cow::Owned(text),
            });
            for (uri, image) in shown {
                pending_images
                    .push(json!({"type": "text", "text": inline_images::caption(result, uri)}));
                pending_images
                    .push(json!({"type": "image_url", "image_url": {"url": image.data_url()}}));
            }
            continue;
        }
        if !pending_images.is_empty() {
            messages.push(ChatMessage::User {
                content: UserContent::Parts(std::mem::take(&mut pending_images)),
            });
        }
        messages.push(chat_message(message));
    }
    if !pending_images.is_empty() {
        messages.push(ChatMessage::User {
            content: UserContent::Parts(pending_images),
        });
    }

    let body = ChatBody {
        model: &request.model,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        messages,
        reasoning_effort: match request.reasoning {
            Some(Plan::Effort(effort)) => Some(effort.as_str()),
            _ => None,
        },
        tools: request
            .tools
            .iter()
            .map(|tool| ChatTool {
                kind: "function",
                function: ChatFunction {
                    name: tool.name,
                    description: tool.description,
                    parameters: &tool.parameters,
                },
            })
            .collect(),
    };
    HttpRequest {
        url,
        headers,
        body: serde_json::to_string(&body).expect("a request body serialises"),
    }
}

// The request body, serialised straight from borrowed parts: a step's request holds the whole
// context, and building it as `serde_json::Value` trees first (copying every message and tool
// schema) was most of the time between a step's start and its provider request
// (docs/benchmarks.md, session 27).

/// A Chat Completions request body.
#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    stream: bool,
    stream_options: StreamOptions,
    messages: Vec<ChatMessage<'a>>,
    /// Only for models the table marks as reasoning (`super::reasoning`).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ChatTool<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One context message in Chat Completions form.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` for a message of tool calls only.
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(&'a str),
    /// Text and image parts.
    Parts(Vec<Value>),
}

#[derive(Serialize)]
struct ChatCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatCallFunction<'a>,
}

#[derive(Serialize)]
struct ChatCallFunction<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

#[derive(Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Serialize)]
struct ChatFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a ToolParameters,
}

/// One context message (not a tool result with images) in Chat Completions form.
fn chat_message(message: &Message) -> ChatMessage<'_> {
    match message {
        Message::User { content, .. } | Message::CustomMessage { content, .. } => {
            ChatMessage::User {
                content: UserContent::Text(content),
            }
        }
        Message::Assistant(assistant) => {
            let text = assistant.text();
            let tool_calls: Vec<ChatCall> = assistant
                .tool_calls()
                .map(|call| ChatCall {
                    id: &call.id,
                    kind: "function",
                    function: ChatCallFunction {
                        name: &call.name,
                        arguments: arguments_text(&call.arguments),
                    },
                })
                .collect();
            let content = match (text.is_empty(), tool_calls.is_empty()) {
                (false, _) => Some(text),
                // Providers reject an assistant message with neither content nor tool calls.
                (true, true) => Some(String::new()),
                (true, false) => None,
            };
            ChatMessage::Assistant {
                content,
                tool_calls,
            }
        }
        Message::ToolResult(result) => ChatMessage::Tool {
            tool_call_id: &result.tool_call_id,
            content: Cow::Borrowed(&result.content),
        },
    }
}

/// The JSON text of tool call arguments. A string holds arguments the model sent unparseable:
/// they go back verbatim.
fn arguments_text(arguments: &Value) -> Cow<'_, str> {
    match arguments {
        Value::String(raw) => Cow::Borrowed(raw),
        other => Cow::Owned(other.to_string()),
    }
}

/// A tool call seen in the stream.
#[derive(Debug, Default)]
struct CallState {
    /// Provider index.
    index: usize,
    /// Id, once known (generated at the start if the provider sent none).
    id: String,
    /// Whether `ToolCallStart` was emitted (it needs the name).
    started: bool,
    /// Name, while not started.
    name: String,
    /// Argument text received before the start.
    pending_arguments: String,
}

/// Decodes a streamed Chat Completions response (Server-Sent Events) into [`LlmEvent`]s.
///
/// Feed the body with [`push`](Self::push) in pieces of any size, then call
/// [`finish`](Self::finish) when the body ends. After an error the decoder keeps returning it.
#[derive(Debug)]
pub struct StreamDecoder(SseStream<ChatStream>);

impl Default for StreamDecoder {
    fn default() -> Self {
        StreamDecoder::new()
    }
}

impl StreamDecoder {
    /// A decoder at the start of a response body.
    pub fn new() -> Self {
        StreamDecoder(SseStream::new(ChatStream {
            calls: Vec::new(),
            done: false,
            finished: false,
        }))
    }

    /// Decodes the next piece of the body.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<LlmEvent>, LlmFailure> {
        self.0.push(bytes)
    }

    /// Ends the body: decodes a trailing event that lacks its blank line, and fails if the
    /// stream never said it finished (neither `[DONE]` nor a `finish_reason`).
    pub fn finish(self) -> Result<Vec<LlmEvent>, LlmFailure> {
        self.0.finish()
    }
}

/// The Chat Completions dialect's state between events. Comments, `event` and `id` fields
/// carry nothing it needs: only each event's data.
#[derive(Debug)]
struct ChatStream {
    /// Tool calls, in order of first appearance.
    calls: Vec<CallState>,
    /// `data: [DONE]` was seen; everything after it is ignored.
    done: bool,
    /// A `finish_reason` was seen.
    finished: bool,
}

impl Dialect for ChatStream {
    fn handle(
        &mut self,
        data: &str,
        _sse_event: Option<&str>,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure> {
        self.handle_data(data, events)
    }

    fn done(&self) -> bool {
        self.done
    }

    fn complete(&self) -> bool {
        self.done || self.finished
    }

    fn on_end(&mut self, events: &mut Vec<LlmEvent>) {
        self.flush_unstarted_calls(events);
    }
}

impl ChatStream {
    /// Handles the data of one event: `[DONE]` or a `chat.completion.chunk`.
    fn handle_data(&mut self, data: &str, events: &mut Vec<LlmEvent>) -> Result<(), LlmFailure> {
        if data == "[DONE]" {
            self.flush_unstarted_calls(events);
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk = parse_json(data)?;
        if let Some(error) = chunk.get("error").filter(|error| !error.is_null()) {
            return Err(stream_error(error));
        }
        if let Some(choice) = chunk.get("choices").and_then(|choices| choices.get(0)) {
            if let Some(delta) = choice.get("delta") {
                if let Some(text) = delta.get("content").and_then(Value::as_str)
                    && !text.is_empty()
                {
                    events.push(LlmEvent::TextDelta(text.to_string()));
                }
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for (position, call) in calls.iter().enumerate() {
                        self.tool_call_delta(position, call, events);
                    }
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.flush_unstarted_calls(events);
                self.finished = true;
                events.push(LlmEvent::Finish(match reason {
                    "tool_calls" => StopReason::ToolUse,
                    "length" => StopReason::Length,
                    _ => StopReason::Stop,
                }));
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| usage.is_object()) {
            let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
            let input_tokens = count("prompt_tokens");
            let output_tokens = count("completion_tokens");
            let total_tokens = usage
                .get("total_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(input_tokens.saturating_add(output_tokens));
            let detail = |path: &str| usage.pointer(path).and_then(Value::as_u64).unwrap_or(0);
            events.push(LlmEvent::Usage(Usage {
                input_tokens,
                output_tokens,
                total_tokens,
                cache_read_tokens: detail("/prompt_tokens_details/cached_tokens"),
                cache_write_tokens: 0,
                reasoning_tokens: detail("/completion_tokens_details/reasoning_tokens"),
                cost_usd: None,
            }));
        }
        Ok(())
    }

    /// One entry of `delta.tool_calls`. `ToolCallStart` waits for the name; arguments that
    /// arrive before it are held back.
    fn tool_call_delta(&mut self, position: usize, call: &Value, events: &mut Vec<LlmEvent>) {
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|index| usize::try_from(index).ok())
            .unwrap_or(position);
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let arguments = function
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let id = call.get("id").and_then(Value::as_str).unwrap_or("");

        let existing = self.calls.iter().rposition(|state| {
            // Some providers send each whole call at the same index: a new id is a new call.
            state.index == index && !(state.started && !id.is_empty() && state.id != id)
        });
        let state = match existing {
            Some(found) => self.calls.get_mut(found),
            None => {
                self.calls.push(CallState {
                    index,
                    ..CallState::default()
                });
                self.calls.last_mut()
            }
        };
        let Some(state) = state else { return };
        if state.id.is_empty() && !id.is_empty() {
            state.id = id.to_string();
        }
        if !state.started {
            state.name.push_str(name);
            state.pending_arguments.push_str(arguments);
            if !state.name.is_empty() {
                start_call(state, events);
            }
        } else if !arguments.is_empty() {
            events.push(LlmEvent::ToolCallArgumentsDelta {
                index,
                delta: arguments.to_string(),
            });
        }
    }

    /// Starts calls that never got a name, so the tool executor can report them.
    fn flush_unstarted_calls(&mut self, events: &mut Vec<LlmEvent>) {
        for state in self.calls.iter_mut().filter(|state| !state.started) {
            start_call(state, events);
        }
    }
}

fn start_call(state: &mut CallState, events: &mut Vec<LlmEvent>) {
    state.started = true;
    if state.id.is_empty() {
        state.id = format!("call_{}", state.index);
    }
    events.push(LlmEvent::ToolCallStart {
        index: state.index,
        id: state.id.clone(),
        name: std::mem::take(&mut state.name),
    });
    let arguments = std::mem::take(&mut state.pending_arguments);
    if !arguments.is_empty() {
        events.push(LlmEvent::ToolCallArgumentsDelta {
            index: state.index,
            delta: arguments,
        });
    }
}

fn stream_error(error: &Value) -> LlmFailure {
    let detail = match error {
        Value::String(message) => message.clone(),
        other => match other.get("message").and_then(Value::as_str) {
            Some(message) => message.to_string(),
            None => other.to_string(),
        },
    };
    LlmFailure {
        status: None,
        message: format!(
            "provider stream error: {}",
            detail.chars().take(MAX_ERROR_CHARS).collect::<String>()
        ),
        retryable: true,
        retry_after_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{AssistantBuilder, ToolSchema};
    use crate::wire::{AssistantMessage, ContentBlock, ToolCall, ToolResult};

    fn request(messages: Vec<Message>, tools: Vec<ToolSchema>) -> LlmRequest {
        LlmRequest {
            model: "gpt-test".to_string(),
            system_prompt: "be brief".to_string(),
            messages,
            tools,
            max_output_tokens: None,
            reasoning: None,
            images: Default::default(),
        }
    }

    fn user(content: &str) -> Message {
        Message::User {
            author: "alice".to_string(),
            content: content.to_string(),
            queue_item_id: None,
            lane: None,
            acting_for: None,
        }
    }

    fn body(http: &HttpRequest) -> Value {
        serde_json::from_str(&http.body).expect("body is json")
    }

    #[test]
    fn request_for_a_conversation() {
        let messages = vec![
            user("list files"),
            Message::Assistant(AssistantMessage {
                provider: PROVIDER.to_string(),
                model: "gpt-test".to_string(),
                content: vec![
                    ContentBlock::Text {
                        text: "sure".to_string(),
                    },
                    ContentBlock::ToolCall(ToolCall {
                        id: "call_1".to_string(),
                        name: "bash".to_string(),
                        arguments: json!({"command": "ls"}),
                    }),
                    ContentBlock::ToolCall(ToolCall {
                        id: "call_2".to_string(),
                        name: "bash".to_string(),
                        arguments: Value::String("{not json".to_string()),
                    }),
                ],
                usage: None,
                stop_reason: StopReason::ToolUse,
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "call_1".to_string(),
                tool_name: "bash".to_string(),
                content: "a.txt".to_string(),
                is_error: false,
                blobs: Vec::new(),
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "call_2".to_string(),
                tool_name: "bash".to_string(),
                content: "invalid arguments".to_string(),
                is_error: true,
                blobs: Vec::new(),
            }),
            Message::Assistant(AssistantMessage {
                content: vec![ContentBlock::ToolCall(ToolCall {
                    id: "call_3".to_string(),
                    name: "read".to_string(),
                    arguments: json!({}),
                })],
                stop_reason: StopReason::ToolUse,
                ..AssistantMessage::default()
            }),
            Message::ToolResult(ToolResult {
                tool_call_id: "call_3".to_string(),
                tool_name: "read".to_string(),
                content: "x".to_string(),
                is_error: false,
                blobs: Vec::new(),
            }),
            Message::CustomMessage {
                custom_type: "wuhu_system_input_v1".to_string(),
                content: "build finished".to_string(),
                details: None,
            },
        ];
        let tools = vec![ToolSchema {
            name: "bash",
            description: "runs a command",
            parameters: json!({"type": "object", "properties": {"command": {"type": "string"}}})
                .into(),
        }];
        let http = build_http_request(
            "https://example.test/v1/",
            Some("sk-1"),
            &request(messages, tools),
        );

        assert_eq!(http.url, "https://example.test/v1/chat/completions");
        assert_eq!(
            http.headers,
            vec![
                ("content-type".to_string(), "application/json".to_string()),
                ("accept".to_string(), "text/event-stream".to_string()),
                ("authorization".to_string(), "Bearer sk-1".to_string()),
            ]
        );
        assert_eq!(
            body(&http),
            json!({
                "model": "gpt-test",
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "list files"},
                    {"role": "assistant", "content": "sure", "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}},
                        {"id": "call_2", "type": "function",
                         "function": {"name": "bash", "arguments": "{not json"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "invalid arguments"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_3", "type": "function",
                         "function": {"name": "read", "arguments": "{}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_3", "content": "x"},
                    {"role": "user", "content": "build finished"},
                ],
                "tools": [{"type": "function", "function": {
                    "name": "bash",
                    "description": "runs a command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                }}],
            })
        );
    }

    #[test]
    fn request_without_key_tools_or_system_prompt() {
        for key in [None, Some(""), Some("  ")] {
            let mut req = request(
                vec![
                    user("hi"),
                    Message::Assistant(AssistantMessage::default()),
                    user("again"),
                ],
                vec![],
            );
            req.system_prompt = String::new();
            let http = build_http_request("http://localhost:8080", key, &req);
            assert_eq!(http.url, "http://localhost:8080/chat/completions");
            assert!(
                http.headers.iter().all(|(name, _)| name != "authorization"),
                "{key:?}: {:?}",
                http.headers
            );
            assert_eq!(
                body(&http),
                json!({
                    "model": "gpt-test",
                    "stream": true,
                    "stream_options": {"include_usage": true},
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": ""},
                        {"role": "user", "content": "again"},
                    ],
                })
            );
        }
    }

    /// Feeds `body` in pieces of `piece` bytes, then finishes.
    fn decode_in_pieces(body: &[u8], piece: usize) -> Result<Vec<LlmEvent>, LlmFailure> {
        let mut decoder = StreamDecoder::new();
        let mut events = Vec::new();
        for bytes in body.chunks(piece) {
            events.extend(decoder.push(bytes)?);
        }
        events.extend(decoder.finish()?);
        Ok(events)
    }

    fn decode(body: &str) -> Result<Vec<LlmEvent>, LlmFailure> {
        decode_in_pieces(body.as_bytes(), body.len().max(1))
    }

    fn build(events: Vec<LlmEvent>) -> AssistantMessage {
        let mut builder = AssistantBuilder::default();
        for event in events {
            builder.push(event);
        }
        builder.build(PROVIDER, "gpt-test")
    }

    fn text(text: &str) -> LlmEvent {
        LlmEvent::TextDelta(text.to_string())
    }

    const REALISTIC: &str = concat!(
        ": keep-alive\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Let me "},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"check ✓."},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"bash","arguments":""}}]},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"comm"}}]},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\":\"ls\"}"}}]},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "\n\n",
        r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":12,"total_tokens":62}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );

    fn realistic_events() -> Vec<LlmEvent> {
        vec![
            text("Let me "),
            text("check ✓."),
            LlmEvent::ToolCallStart {
                index: 0,
                id: "call_abc".to_string(),
                name: "bash".to_string(),
            },
            LlmEvent::ToolCallArgumentsDelta {
                index: 0,
                delta: "{\"comm".to_string(),
            },
            LlmEvent::ToolCallArgumentsDelta {
                index: 0,
                delta: "and\":\"ls\"}".to_string(),
            },
            LlmEvent::Finish(StopReason::ToolUse),
            LlmEvent::Usage(Usage {
                input_tokens: 50,
                output_tokens: 12,
                total_tokens: 62,
                ..Usage::default()
            }),
        ]
    }

    #[test]
    fn realistic_stream_in_any_pieces() {
        let crlf = REALISTIC.replace('\n', "\r\n");
        let cr = REALISTIC.replace('\n', "\r");
        for (name, body) in [
            ("lf", REALISTIC),
            ("crlf", crlf.as_str()),
            ("cr", cr.as_str()),
        ] {
            for piece in [body.len(), 1, 2, 3, 7, 64] {
                let events = decode_in_pieces(body.as_bytes(), piece)
                    .unwrap_or_else(|failure| panic!("{name}/{piece}: {failure:?}"));
                assert_eq!(events, realistic_events(), "{name}/{piece}");
            }
        }

        let message = build(decode(REALISTIC).expect("decodes"));
        assert_eq!(
            message,
            AssistantMessage {
                provider: PROVIDER.to_string(),
                model: "gpt-test".to_string(),
                content: vec![
                    ContentBlock::Text {
                        text: "Let me check ✓.".to_string()
                    },
                    ContentBlock::ToolCall(ToolCall {
                        id: "call_abc".to_string(),
                        name: "bash".to_string(),
                        arguments: json!({"command": "ls"}),
                    }),
                ],
                usage: Some(Usage {
                    input_tokens: 50,
                    output_tokens: 12,
                    total_tokens: 62,
                    ..Usage::default()
                }),
                stop_reason: StopReason::ToolUse,
            }
        );
    }

    #[test]
    fn framing_cases() {
        let cases: Vec<(&str, String, Vec<LlmEvent>)> = vec![
            (
                "crlf split between cr and lf",
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n"
                    .to_string(),
                vec![text("a")],
            ),
            (
                "comments and other fields",
                ": hello\nevent: message\nid: 7\nretry: 100\n:another\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n: bye\n\ndata: [DONE]\n\n".to_string(),
                vec![text("b")],
            ),
            (
                "multi-line data joins with newline",
                "data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"c\"}}]}\n\ndata:[DONE]\n\n"
                    .to_string(),
                vec![text("c")],
            ),
            (
                "multi-line data with crlf",
                "data: {\"choices\":[{\"delta\":\r\ndata: {\"content\":\"g\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n"
                    .to_string(),
                vec![text("g")],
            ),
            (
                "byte order mark and data without space",
                "\u{feff}data:{\"choices\":[{\"delta\":{\"content\":\"d\"},\"finish_reason\":\"stop\"}]}\n\n"
                    .to_string(),
                vec![text("d"), LlmEvent::Finish(StopReason::Stop)],
            ),
            (
                "trailing event without blank line",
                "data: {\"choices\":[{\"delta\":{\"content\":\"e\"},\"finish_reason\":\"length\"}]}"
                    .to_string(),
                vec![text("e"), LlmEvent::Finish(StopReason::Length)],
            ),
            (
                "trailing done without newline",
                "data: {\"choices\":[{\"delta\":{\"content\":\"f\"}}]}\n\ndata: [DONE]".to_string(),
                vec![text("f")],
            ),
            (
                "everything after done is ignored",
                "data: [DONE]\n\ndata: {not json\n\n".to_string(),
                vec![],
            ),
            (
                "unknown finish reason is stop",
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n"
                    .to_string(),
                vec![LlmEvent::Finish(StopReason::Stop)],
            ),
            (
                "first tool chunk carries name and arguments",
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"x\",\"function\":{\"name\":\"read\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n".to_string(),
                vec![
                    LlmEvent::ToolCallStart { index: 1, id: "x".to_string(), name: "read".to_string() },
                    LlmEvent::ToolCallArgumentsDelta { index: 1, delta: "{}".to_string() },
                    LlmEvent::Finish(StopReason::ToolUse),
                ],
            ),
            (
                "name after arguments waits; missing id is generated",
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"ls\",\"arguments\":\":1}\"}}]}}]}\n\ndata: [DONE]\n\n".to_string(),
                vec![
                    LlmEvent::ToolCallStart { index: 0, id: "call_0".to_string(), name: "ls".to_string() },
                    LlmEvent::ToolCallArgumentsDelta { index: 0, delta: "{\"a\":1}".to_string() },
                ],
            ),
            (
                "whole calls repeated at one index with new ids are separate calls",
                concat!(
                    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"ls\",\"arguments\":\"{}\"}}]}}]}\n\n",
                    "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"b\",\"function\":{\"name\":\"cat\",\"arguments\":\"{\\\"p\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
                ).to_string(),
                vec![
                    LlmEvent::ToolCallStart { index: 0, id: "a".to_string(), name: "ls".to_string() },
                    LlmEvent::ToolCallArgumentsDelta { index: 0, delta: "{}".to_string() },
                    LlmEvent::ToolCallStart { index: 0, id: "b".to_string(), name: "cat".to_string() },
                    LlmEvent::ToolCallArgumentsDelta { index: 0, delta: "{\"p\":1}".to_string() },
                    LlmEvent::Finish(StopReason::ToolUse),
                ],
            ),
        ];
        for (name, body, expected) in cases {
            for piece in [body.len().max(1), 1] {
                assert_eq!(
                    decode_in_pieces(body.as_bytes(), piece).as_ref(),
                    Ok(&expected),
                    "{name} (pieces of {piece})"
                );
            }
        }
    }

    #[test]
    fn failures() {
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "error payload",
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n".to_string(),
                "provider stream error: overloaded",
            ),
            (
                "malformed json",
                "data: {\"choices\":[{\"delta\":\n\n".to_string(),
                "provider stream has malformed json in a data line: EOF while parsing a value at line 1 column 21",
            ),
            (
                "truncated stream",
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n".to_string(),
                "provider stream ended early",
            ),
            (
                "truncated inside an event",
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi".to_string(),
                "provider stream ended early",
            ),
            ("empty body", String::new(), "provider stream ended early"),
            (
                "trailing error payload without blank line",
                "data: {\"error\":{\"message\":\"rate limited\"}}".to_string(),
                "provider stream error: rate limited",
            ),
            (
                "malformed json after finish",
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: {\"usa"
                    .to_string(),
                "provider stream has malformed json in a data line: EOF while parsing a string at line 1 column 5",
            ),
        ];
        for (name, body, message) in cases {
            for piece in [body.len().max(1), 1] {
                assert_eq!(
                    decode_in_pieces(body.as_bytes(), piece),
                    Err(LlmFailure {
                        status: None,
                        message: message.to_string(),
                        retryable: true,
                        retry_after_ms: None
                    }),
                    "{name} (pieces of {piece})"
                );
            }
        }
    }

    #[test]
    fn error_is_sticky_and_events_before_it_are_returned_by_earlier_pushes() {
        let mut decoder = StreamDecoder::new();
        assert_eq!(
            decoder.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"),
            Ok(vec![text("a")])
        );
        let failure = decoder
            .push(b"data: {\"error\":\"boom\"}\n\n")
            .expect_err("error payload");
        assert_eq!(failure.message, "provider stream error: boom");
        assert_eq!(decoder.push(b"data: [DONE]\n\n"), Err(failure.clone()));
        assert_eq!(decoder.finish(), Err(failure));
    }

    #[test]
    fn utf8_split_across_pushes() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"é🦀\"}}]}\n\ndata: [DONE]\n\n";
        let bytes = body.as_bytes();
        let crab = body.find('🦀').expect("crab");
        for split in [crab + 1, crab + 2, crab + 3, crab - 1] {
            let mut decoder = StreamDecoder::new();
            let (head, tail) = bytes.split_at(split);
            let mut events = decoder.push(head).expect("head");
            events.extend(decoder.push(tail).expect("tail"));
            events.extend(decoder.finish().expect("finish"));
            assert_eq!(events, vec![text("é🦀")], "split at {split}");
        }
    }

    #[test]
    fn oversized_line_fails() {
        let mut decoder = StreamDecoder::new();
        let piece = vec![b'x'; 1024 * 1024];
        let mut outcome = Ok(vec![]);
        for _ in 0..17 {
            outcome = decoder.push(&piece);
            if outcome.is_err() {
                break;
            }
        }
        let failure = outcome.expect_err("line too long");
        assert!(failure.retryable);
        assert!(failure.message.contains("exceeds"), "{}", failure.message);

        // Many data lines of one event are bounded too.
        let mut decoder = StreamDecoder::new();
        let mut line = b"data: ".to_vec();
        line.extend(std::iter::repeat_n(b'y', 1024 * 1024));
        line.push(b'\n');
        let outcome = (0..17).try_for_each(|_| decoder.push(&line).map(drop));
        assert!(outcome.is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let bodies: [&[u8]; 8] = [
            b"\xff\xfe\r\r\n\n",
            b"data: null\n\ndata: 5\n\ndata: []\n\n",
            b"data: {\"choices\":5,\"usage\":7}\n\n",
            b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[5,{\"index\":-1},{\"index\":1e40}]}}]}\n\n",
            b"data: {\"choices\":[{\"delta\":{\"tool_calls\":{}}, \"finish_reason\": 3}]}\n\n",
            b"data: {\"error\":null,\"choices\":[]}\n\n",
            b"data: {\"usage\":{\"prompt_tokens\":-3,\"completion_tokens\":\"x\"}}\n\n",
            b"data\ndata:\n\n:\n\n",
        ];
        for body in bodies {
            for piece in [body.len(), 1] {
                let _ = decode_in_pieces(body, piece);
            }
        }
    }
}
