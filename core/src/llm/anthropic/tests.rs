//! The Messages codec against streams shaped like the ones in Anthropic's streaming docs
//! (`build-with-claude/streaming`: basic, tool use, extended thinking, error events).

use super::*;
use crate::llm::{AssistantBuilder, ToolSchema};
use crate::wire::{AssistantMessage, ToolCall, ToolResult};

fn user(content: &str) -> Message {
    Message::User {
        author: "alice".to_string(),
        content: content.to_string(),
        queue_item_id: None,
        lane: None,
        acting_for: None,
    }
}

fn request(messages: Vec<Message>, tools: Vec<ToolSchema>) -> LlmRequest {
    LlmRequest {
        model: "claude-test".to_string(),
        system_prompt: "be brief".to_string(),
        messages,
        tools,
        max_output_tokens: None,
        reasoning: None,
        images: Default::default(),
    }
}

fn body(http: &HttpRequest) -> Value {
    serde_json::from_str(&http.body).expect("body is json")
}

fn bash_tool() -> ToolSchema {
    ToolSchema {
        name: "bash",
        description: "runs a command",
        parameters: json!({"type": "object", "properties": {"command": {"type": "string"}}}).into(),
    }
}

#[test]
fn request_for_a_conversation_with_tools_thinking_and_cache_breakpoints() {
    let messages = vec![
        Message::CustomMessage {
            custom_type: custom_types::GLOBAL_CONTEXT.to_string(),
            content: "I like tea".to_string(),
            details: None,
        },
        user("list files"),
        Message::Assistant(AssistantMessage {
            provider: PROVIDER.to_string(),
            model: "claude-test".to_string(),
            content: vec![
                ContentBlock::Thinking {
                    thinking: "the user wants ls".to_string(),
                    signature: "sig-1".to_string(),
                },
                ContentBlock::RedactedThinking {
                    data: "opaque".to_string(),
                },
                ContentBlock::Text {
                    text: "sure".to_string(),
                },
                ContentBlock::ToolCall(ToolCall {
                    id: "toolu_1".to_string(),
                    name: "bash".to_string(),
                    arguments: json!({"command": "ls"}),
                }),
                ContentBlock::ToolCall(ToolCall {
                    id: "toolu_2".to_string(),
                    name: "bash".to_string(),
                    arguments: Value::String("{not json".to_string()),
                }),
            ],
            usage: None,
            stop_reason: StopReason::ToolUse,
        }),
        Message::ToolResult(ToolResult {
            tool_call_id: "toolu_1".to_string(),
            tool_name: "bash".to_string(),
            content: "a.txt".to_string(),
            is_error: false,
            blobs: Vec::new(),
        }),
        Message::ToolResult(ToolResult {
            tool_call_id: "toolu_2".to_string(),
            tool_name: "bash".to_string(),
            content: "invalid arguments".to_string(),
            is_error: true,
            blobs: Vec::new(),
        }),
        Message::CustomMessage {
            custom_type: "wuhu_system_input_v1".to_string(),
            content: "build finished".to_string(),
            details: None,
        },
        // Another provider's reasoning and an empty reply are not sent.
        Message::Assistant(AssistantMessage {
            provider: "openai".to_string(),
            content: vec![
                ContentBlock::Reasoning {
                    id: "rs_1".to_string(),
                    summary: vec![],
                    encrypted_content: Some("enc".to_string()),
                },
                ContentBlock::Thinking {
                    thinking: "foreign".to_string(),
                    signature: "x".to_string(),
                },
                ContentBlock::Text {
                    text: "done".to_string(),
                },
            ],
            ..AssistantMessage::default()
        }),
        Message::Assistant(AssistantMessage::default()),
        user(""),
    ];
    let http = build_http_request(
        "https://example.test/",
        Some("sk-ant-1"),
        &request(messages, vec![bash_tool(), bash_tool()]),
    );
    assert_eq!(http.url, "https://example.test/v1/messages");
    assert_eq!(
        http.headers,
        vec![
            ("content-type".to_string(), "application/json".to_string()),
            ("accept".to_string(), "text/event-stream".to_string()),
            ("anthropic-version".to_string(), "2023-06-01".to_string()),
            ("x-api-key".to_string(), "sk-ant-1".to_string()),
        ]
    );
    let cache = json!({"type": "ephemeral"});
    let tool = json!({
        "name": "bash",
        "description": "runs a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    });
    let mut last_tool = tool.clone();
    last_tool["cache_control"] = cache.clone();
    assert_eq!(
        body(&http),
        json!({
            "model": "claude-test",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "stream": true,
            "system": [{"type": "text", "text": "be brief", "cache_control": cache}],
            "tools": [tool, last_tool],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "I like tea", "cache_control": cache},
                    {"type": "text", "text": "list files"},
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "the user wants ls", "signature": "sig-1"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "sure"},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"invalid_arguments": "{not json"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "invalid arguments", "is_error": true},
                    {"type": "text", "text": "build finished"},
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "(empty message)", "cache_control": cache},
                ]},
            ],
        })
    );
}

#[test]
fn request_without_key_tools_or_system_prompt_and_breakpoints_stay_within_four() {
    for key in [None, Some(""), Some("  ")] {
        let mut req = request(vec![user("hi")], vec![]);
        req.system_prompt = String::new();
        req.max_output_tokens = Some(1000);
        let http = build_http_request("http://localhost:8080", key, &req);
        assert_eq!(http.url, "http://localhost:8080/v1/messages");
        assert!(http.headers.iter().all(|(name, _)| name != "x-api-key"));
        assert_eq!(
            body(&http),
            json!({
                "model": "claude-test",
                "max_tokens": 1000,
                "stream": true,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
                ]}],
            })
        );
    }
    // Many global-context-like messages and tools: never more than four breakpoints.
    let global = |text: &str| Message::CustomMessage {
        custom_type: custom_types::GLOBAL_CONTEXT.to_string(),
        content: text.to_string(),
        details: None,
    };
    let req = request(
        vec![global("a"), global("b"), user("x"), global("c"), user("y")],
        vec![bash_tool(); 5],
    );
    let text = build_http_request("http://h", None, &req).body;
    assert_eq!(text.matches("cache_control").count(), 4, "{text}");
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

fn build(events: Vec<LlmEvent>) -> AssistantMessage {
    let mut builder = AssistantBuilder::default();
    for event in events {
        builder.push(event);
    }
    builder.build(PROVIDER, "claude-test")
}

/// The docs' "streaming request with tool use" response, with cache usage in `message_start`
/// as prompt caching reports it.
const TOOL_USE: &str = concat!(
    "event: message_start\n",
    r#"data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-test","stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":2},"content":[],"stop_reason":null}}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    "\n\n",
    "event: ping\n",
    r#"data: {"type": "ping"}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay"}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", let's check ✓"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":0}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\"}"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":1}"#,
    "\n\n",
    "event: message_delta\n",
    r#"data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}"#,
    "\n\n",
    "event: message_stop\n",
    r#"data: {"type":"message_stop"}"#,
    "\n\n",
);

fn usage(input: u64, read: u64, write: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input + read + write,
        output_tokens: output,
        total_tokens: input + read + write + output,
        cache_read_tokens: read,
        cache_write_tokens: write,
        reasoning_tokens: 0,
        cost_usd: None,
    }
}

#[test]
fn tool_use_stream_in_any_pieces() {
    let want = vec![
        LlmEvent::Usage(usage(472, 2000, 100, 2)),
        LlmEvent::TextDelta("Okay".to_string()),
        LlmEvent::TextDelta(", let's check ✓".to_string()),
        LlmEvent::ToolCallStart {
            index: 1,
            id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".to_string(),
            name: "get_weather".to_string(),
        },
        LlmEvent::ToolCallArgumentsDelta {
            index: 1,
            delta: "{\"location\":".to_string(),
        },
        LlmEvent::ToolCallArgumentsDelta {
            index: 1,
            delta: " \"San Francisco, CA\"}".to_string(),
        },
        LlmEvent::Usage(usage(472, 2000, 100, 89)),
        LlmEvent::Finish(StopReason::ToolUse),
    ];
    let crlf = TOOL_USE.replace('\n', "\r\n");
    for (name, body) in [("lf", TOOL_USE), ("crlf", crlf.as_str())] {
        for piece in [body.len(), 1, 2, 3, 7, 64] {
            let events = decode_in_pieces(body.as_bytes(), piece)
                .unwrap_or_else(|failure| panic!("{name}/{piece}: {failure:?}"));
            assert_eq!(events, want, "{name}/{piece}");
        }
    }
    assert_eq!(
        build(want),
        AssistantMessage {
            provider: PROVIDER.to_string(),
            model: "claude-test".to_string(),
            content: vec![
                ContentBlock::Text {
                    text: "Okay, let's check ✓".to_string()
                },
                ContentBlock::ToolCall(ToolCall {
                    id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".to_string(),
                    name: "get_weather".to_string(),
                    arguments: json!({"location": "San Francisco, CA"}),
                }),
            ],
            usage: Some(usage(472, 2000, 100, 89)),
            stop_reason: StopReason::ToolUse,
        }
    );
}

/// The docs' "streaming request with extended thinking", then a tool call: the thinking block
/// and its signature are kept and go back unchanged in the next request.
const THINKING: &str = concat!(
    "event: message_start\n",
    r#"data: {"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 30, "output_tokens": 1}}}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me solve this step by step:\n\n1. First break down 27 * 453"}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "\n2. 453 = 400 + 50 + 3"}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type": "content_block_stop", "index": 0}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type": "content_block_stop", "index": 1}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "27 * 453 = 12,231"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type": "content_block_stop", "index": 2}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "echo hi"}}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type": "content_block_stop", "index": 3}"#,
    "\n\n",
    "event: message_delta\n",
    r#"data: {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 259}}"#,
    "\n\n",
    "event: message_stop\n",
    r#"data: {"type": "message_stop"}"#,
    "\n\n",
);

#[test]
fn thinking_blocks_are_kept_and_sent_back_unchanged() {
    for piece in [THINKING.len(), 1, 5] {
        let message = build(decode_in_pieces(THINKING.as_bytes(), piece).expect("decodes"));
        assert_eq!(
            message.content,
            vec![
                ContentBlock::Thinking {
                    thinking: "Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3".to_string(),
                    signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds...".to_string(),
                },
                ContentBlock::RedactedThinking {
                    data: "EmwKAhgBEgy3va3pzix/LafPsn4a".to_string()
                },
                ContentBlock::Text {
                    text: "27 * 453 = 12,231".to_string()
                },
                ContentBlock::ToolCall(ToolCall {
                    id: "toolu_9".to_string(),
                    name: "bash".to_string(),
                    arguments: json!({"command": "echo hi"}),
                }),
            ],
            "pieces of {piece}"
        );
        assert_eq!(message.usage, Some(usage(30, 0, 0, 259)));

        // The stored message (through its JSON form) goes back block for block.
        let stored: AssistantMessage =
            serde_json::from_str(&serde_json::to_string(&message).unwrap()).unwrap();
        let next = build_http_request(
            "http://h",
            None,
            &request(
                vec![
                    user("27 * 453?"),
                    Message::Assistant(stored),
                    Message::ToolResult(ToolResult {
                        tool_call_id: "toolu_9".to_string(),
                        tool_name: "bash".to_string(),
                        content: "hi".to_string(),
                        is_error: false,
                        blobs: Vec::new(),
                    }),
                ],
                vec![],
            ),
        );
        let sent = body(&next)["messages"][1].clone();
        let blocks: Vec<Value> = serde_json::from_str::<Value>(THINKING_BLOCKS_SENT)
            .unwrap()
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(sent, json!({"role": "assistant", "content": blocks}));
    }
}

const THINKING_BLOCKS_SENT: &str = r#"[
    {"type": "thinking", "thinking": "Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
    {"type": "text", "text": "27 * 453 = 12,231"},
    {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "echo hi"}}
]"#;

#[test]
fn framing_and_event_cases() {
    let text = |t: &str| LlmEvent::TextDelta(t.to_string());
    let cases: Vec<(&str, String, Vec<LlmEvent>)> = vec![
        (
            "data type wins over the sse event name; unknown events are ignored",
            concat!(
                "event: ping\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
                "event: future_thing\ndata: {\"type\":\"future_thing\",\"x\":1}\n\n",
                "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"citations_delta\",\"citation\":{}}}\n\n",
                "data: {\"type\":\"message_stop\"}\n\n",
            )
            .to_string(),
            vec![text("a")],
        ),
        (
            "sse event name when data has no type",
            "event: message_stop\ndata: {}\n\n".to_string(),
            vec![],
        ),
        (
            "everything after message_stop is ignored",
            "data: {\"type\":\"message_stop\"}\n\ndata: {not json\n\n".to_string(),
            vec![],
        ),
        (
            "stop reasons",
            concat!(
                "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n",
                "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n",
                "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\"}}\n\n",
            )
            .to_string(),
            vec![
                LlmEvent::Finish(StopReason::Length),
                LlmEvent::Finish(StopReason::Stop),
                LlmEvent::Finish(StopReason::Stop),
            ],
        ),
        (
            "a stop reason without message_stop is a complete reply",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}".to_string(),
            vec![LlmEvent::Finish(StopReason::Stop)],
        ),
        (
            "input deltas of a block that is not a tool call are ignored; missing id generated",
            concat!(
                "data: {\"type\":\"content_block_delta\",\"index\":4,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
                "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"name\":\"ls\",\"input\":{}}}\n\n",
                "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
                "data: {\"type\":\"message_stop\"}\n\n",
            )
            .to_string(),
            vec![LlmEvent::ToolCallStart {
                index: 2,
                id: "toolu_2".to_string(),
                name: "ls".to_string(),
            }],
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
fn errors_and_cuts() {
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n";
    // (name, body, message, retryable)
    let cases: Vec<(&str, String, &str, bool)> = vec![
        (
            "overloaded error event (the docs' example)",
            format!(
                "{start}event: error\ndata: {{\"type\": \"error\", \"error\": {{\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}}}\n\n"
            ),
            "provider stream error: overloaded_error: Overloaded",
            true,
        ),
        (
            "api error event",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal server error\"}}\n\n".to_string(),
            "provider stream error: api_error: Internal server error",
            true,
        ),
        (
            "invalid request error event is final",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 200001 tokens > 200000 maximum\"}}\n\n".to_string(),
            "provider stream error: invalid_request_error: prompt is too long: 200001 tokens > 200000 maximum",
            false,
        ),
        (
            "error event without its blank line",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}".to_string(),
            "provider stream error: overloaded_error: Overloaded",
            true,
        ),
        (
            "cut after a delta",
            start.to_string(),
            "provider stream ended early",
            true,
        ),
        (
            "cut inside an event",
            format!("{start}event: content_block_delta\ndata: {{\"type\":\"content_blo"),
            "provider stream ended early",
            true,
        ),
        (
            "cut inside a tool call",
            concat!(
                "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"ls\",\"input\":{}}}\n\n",
                "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"pa\"}}\n\n",
            )
            .to_string(),
            "provider stream ended early",
            true,
        ),
        ("empty body", String::new(), "provider stream ended early", true),
        (
            "malformed json mid-stream",
            format!("{start}data: {{\"type\":\n\n"),
            "provider stream has malformed json in a data line: EOF while parsing a value at line 1 column 8",
            true,
        ),
    ];
    for (name, body, message, retryable) in cases {
        for piece in [body.len().max(1), 1] {
            assert_eq!(
                decode_in_pieces(body.as_bytes(), piece),
                Err(LlmFailure {
                    status: None,
                    message: message.to_string(),
                    retryable,
                    retry_after_ms: None,
                }),
                "{name} (pieces of {piece})"
            );
        }
    }
}

#[test]
fn error_bodies_of_http_failures() {
    // Non-streaming error bodies, as the errors page documents them.
    let cases = [
        (
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#,
            "provider returned http 529: Overloaded",
            true,
        ),
        (
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
            "provider returned http 429: Number of request tokens has exceeded your per-minute rate limit",
            true,
        ),
        (
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#,
            "provider returned http 400: max_tokens: Field required",
            false,
        ),
        (
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            "provider returned http 401: invalid x-api-key",
            false,
        ),
        (
            500,
            r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
            "provider returned http 500: Internal server error",
            true,
        ),
        (
            502,
            "<html>bad gateway</html>",
            "provider returned http 502: <html>bad gateway</html>",
            true,
        ),
    ];
    for (status, body, message, retryable) in cases {
        let failure = LlmFailure::from_response(status, &[], body);
        assert_eq!(
            (failure.message.as_str(), failure.retryable),
            (message, retryable),
            "{status}"
        );
    }
}

#[test]
fn error_is_sticky() {
    let mut decoder = StreamDecoder::new();
    let failure = decoder
        .push(b"data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
        .expect_err("error event");
    assert_eq!(
        decoder.push(b"data: {\"type\":\"message_stop\"}\n\n"),
        Err(failure.clone())
    );
    assert_eq!(decoder.finish(), Err(failure));
}

#[test]
fn oversized_line_fails() {
    let mut decoder = StreamDecoder::new();
    let piece = vec![b'x'; 1024 * 1024];
    let outcome = (0..17).try_for_each(|_| decoder.push(&piece).map(drop));
    let failure = outcome.expect_err("line too long");
    assert!(failure.retryable);
    assert!(failure.message.contains("exceeds"), "{}", failure.message);
}

#[test]
fn garbage_never_panics() {
    let bodies: [&[u8]; 8] = [
        b"\xff\xfe\r\r\n\n",
        b"data: null\n\ndata: 5\n\ndata: []\n\n",
        b"data: {\"type\":5}\n\n",
        b"data: {\"type\":\"content_block_start\",\"index\":-1,\"content_block\":5}\n\n",
        b"data: {\"type\":\"content_block_delta\",\"index\":1e40,\"delta\":[]}\n\n",
        b"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-3},\"delta\":{\"stop_reason\":7}}\n\n",
        b"data: {\"type\":\"error\",\"error\":null}\n\n",
        b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":18446744073709551615,\"cache_read_input_tokens\":18446744073709551615}}}\n\n",
    ];
    for body in bodies {
        for piece in [body.len(), 1] {
            let _ = decode_in_pieces(body, piece);
        }
    }
}
