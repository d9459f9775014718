//! The Responses codec against streams shaped like recorded Responses API streams (reasoning
//! item, function call with argument deltas, `response.completed` with usage details).

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
    builder.build(PROVIDER, "o3-test")
}

/// A reasoning model's step: reasoning item (encrypted), text, then a function call.
const TOOL_CALL: &str = concat!(
    "event: response.created\n",
    r#"data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"o3-test","output":[],"usage":null}}"#,
    "\n\n",
    "event: response.in_progress\n",
    r#"data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#,
    "\n\n",
    "event: response.output_item.added\n",
    r#"data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}"#,
    "\n\n",
    "event: response.output_item.done\n",
    r#"data: {"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Checking the weather tool."}],"encrypted_content":"gAAAA-enc"}}"#,
    "\n\n",
    "event: response.output_item.added\n",
    r#"data: {"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
    "\n\n",
    "event: response.content_part.added\n",
    r#"data: {"type":"response.content_part.added","sequence_number":5,"item_id":"msg_1","output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":6,"item_id":"msg_1","output_index":1,"content_index":0,"delta":"Let me "}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    r#"data: {"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_1","output_index":1,"content_index":0,"delta":"check ✓."}"#,
    "\n\n",
    "event: response.output_text.done\n",
    r#"data: {"type":"response.output_text.done","sequence_number":8,"item_id":"msg_1","output_index":1,"content_index":0,"text":"Let me check ✓."}"#,
    "\n\n",
    "event: response.output_item.done\n",
    r#"data: {"type":"response.output_item.done","sequence_number":9,"output_index":1,"item":{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Let me check ✓.","annotations":[]}]}}"#,
    "\n\n",
    "event: response.output_item.added\n",
    r#"data: {"type":"response.output_item.added","sequence_number":10,"output_index":2,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_Kfz","name":"weather"}}"#,
    "\n\n",
    "event: response.function_call_arguments.delta\n",
    r#"data: {"type":"response.function_call_arguments.delta","sequence_number":11,"item_id":"fc_1","output_index":2,"delta":"{\"city\":"}"#,
    "\n\n",
    "event: response.function_call_arguments.delta\n",
    r#"data: {"type":"response.function_call_arguments.delta","sequence_number":12,"item_id":"fc_1","output_index":2,"delta":" \"Detroit\"}"}"#,
    "\n\n",
    "event: response.function_call_arguments.done\n",
    r#"data: {"type":"response.function_call_arguments.done","sequence_number":13,"item_id":"fc_1","output_index":2,"arguments":"{\"city\": \"Detroit\"}"}"#,
    "\n\n",
    "event: response.output_item.done\n",
    r#"data: {"type":"response.output_item.done","sequence_number":14,"output_index":2,"item":{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"city\": \"Detroit\"}","call_id":"call_Kfz","name":"weather"}}"#,
    "\n\n",
    "event: response.completed\n",
    r#"data: {"type":"response.completed","sequence_number":15,"response":{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":78,"input_tokens_details":{"cached_tokens":64},"output_tokens":719,"output_tokens_details":{"reasoning_tokens":704},"total_tokens":797}}}"#,
    "\n\n",
);

#[test]
fn reasoning_text_and_function_call_in_any_pieces() {
    let want = vec![
        LlmEvent::Reasoning {
            id: "rs_1".to_string(),
            summary: vec!["Checking the weather tool.".to_string()],
            encrypted_content: Some("gAAAA-enc".to_string()),
        },
        LlmEvent::TextDelta("Let me ".to_string()),
        LlmEvent::TextDelta("check ✓.".to_string()),
        LlmEvent::ToolCallStart {
            index: 2,
            id: "call_Kfz".to_string(),
            name: "weather".to_string(),
        },
        LlmEvent::ToolCallArgumentsDelta {
            index: 2,
            delta: "{\"city\":".to_string(),
        },
        LlmEvent::ToolCallArgumentsDelta {
            index: 2,
            delta: " \"Detroit\"}".to_string(),
        },
        LlmEvent::Usage(Usage {
            input_tokens: 78,
            output_tokens: 719,
            total_tokens: 797,
            cache_read_tokens: 64,
            cache_write_tokens: 0,
            reasoning_tokens: 704,
            cost_usd: None,
        }),
        LlmEvent::Finish(StopReason::ToolUse),
    ];
    let crlf = TOOL_CALL.replace('\n', "\r\n");
    for (name, body) in [("lf", TOOL_CALL), ("crlf", crlf.as_str())] {
        for piece in [body.len(), 1, 3, 64] {
            let events = decode_in_pieces(body.as_bytes(), piece)
                .unwrap_or_else(|failure| panic!("{name}/{piece}: {failure:?}"));
            assert_eq!(events, want, "{name}/{piece}");
        }
    }
    let message = build(want);
    assert_eq!(
        message.content,
        vec![
            ContentBlock::Reasoning {
                id: "rs_1".to_string(),
                summary: vec!["Checking the weather tool.".to_string()],
                encrypted_content: Some("gAAAA-enc".to_string()),
            },
            ContentBlock::Text {
                text: "Let me check ✓.".to_string()
            },
            ContentBlock::ToolCall(ToolCall {
                id: "call_Kfz".to_string(),
                name: "weather".to_string(),
                arguments: json!({"city": "Detroit"}),
            }),
        ]
    );
    assert_eq!(message.stop_reason, StopReason::ToolUse);
}

#[test]
fn request_carries_reasoning_items_between_steps() {
    let message = build(decode_in_pieces(TOOL_CALL.as_bytes(), 7).expect("decodes"));
    let stored: AssistantMessage =
        serde_json::from_str(&serde_json::to_string(&message).unwrap()).unwrap();
    let request = LlmRequest {
        model: "o3-test".to_string(),
        system_prompt: "be brief".to_string(),
        messages: vec![
            user("weather in Detroit?"),
            Message::Assistant(stored),
            Message::ToolResult(ToolResult {
                tool_call_id: "call_Kfz".to_string(),
                tool_name: "weather".to_string(),
                content: "sunny".to_string(),
                is_error: false,
                blobs: Vec::new(),
            }),
            // Anthropic thinking and reasoning without encrypted content are not sent.
            Message::Assistant(AssistantMessage {
                provider: "anthropic".to_string(),
                content: vec![
                    ContentBlock::Thinking {
                        thinking: "t".to_string(),
                        signature: "s".to_string(),
                    },
                    ContentBlock::Text {
                        text: "It is sunny.".to_string(),
                    },
                ],
                ..AssistantMessage::default()
            }),
            Message::Assistant(AssistantMessage {
                provider: PROVIDER.to_string(),
                content: vec![ContentBlock::Reasoning {
                    id: "rs_2".to_string(),
                    summary: vec![],
                    encrypted_content: None,
                }],
                ..AssistantMessage::default()
            }),
            Message::CustomMessage {
                custom_type: "wuhu_system_input_v1".to_string(),
                content: "build finished".to_string(),
                details: None,
            },
        ],
        tools: vec![ToolSchema {
            name: "weather",
            description: "weather of a city",
            parameters: json!({"type": "object"}).into(),
        }],
        max_output_tokens: Some(4096),
        reasoning: None,
        images: Default::default(),
    };
    let http = build_http_request("https://api.example.test/v1/", Some("sk-1"), &request);
    assert_eq!(http.url, "https://api.example.test/v1/responses");
    assert!(
        http.headers
            .contains(&("authorization".to_string(), "Bearer sk-1".to_string()))
    );
    let body: Value = serde_json::from_str(&http.body).unwrap();
    assert_eq!(
        body,
        json!({
            "model": "o3-test",
            "instructions": "be brief",
            "stream": true,
            "store": false,
            "include": ["reasoning.encrypted_content"],
            "max_output_tokens": 4096,
            "tools": [{"type": "function", "name": "weather", "description": "weather of a city", "parameters": {"type": "object"}, "strict": false}],
            "input": [
                {"role": "user", "content": "weather in Detroit?"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Checking the weather tool."}], "encrypted_content": "gAAAA-enc"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check ✓."}]},
                {"type": "function_call", "call_id": "call_Kfz", "name": "weather", "arguments": "{\"city\":\"Detroit\"}"},
                {"type": "function_call_output", "call_id": "call_Kfz", "output": "sunny"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
                {"role": "user", "content": "build finished"},
            ],
        })
    );
    let bare = build_http_request(
        "http://h/v1",
        Some(" "),
        &LlmRequest {
            system_prompt: String::new(),
            tools: vec![],
            max_output_tokens: None,
            reasoning: None,
            images: Default::default(),
            ..request
        },
    );
    assert!(bare.headers.iter().all(|(name, _)| name != "authorization"));
    let body: Value = serde_json::from_str(&bare.body).unwrap();
    assert!(body.get("instructions").is_none() && body.get("tools").is_none());
}

#[test]
fn event_cases() {
    let text = |t: &str| LlmEvent::TextDelta(t.to_string());
    let completed = r#"data: {"type":"response.completed","response":{"status":"completed"}}"#;
    let cases: Vec<(&str, String, Vec<LlmEvent>)> = vec![
        (
            "text only, no usage",
            format!(
                "data: {{\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"hi\"}}\n\n{completed}\n\n"
            ),
            vec![text("hi"), LlmEvent::Finish(StopReason::Stop)],
        ),
        (
            "arguments only in the done item; call id falls back to the item id",
            concat!(
                "data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"type\":\"function_call\",\"id\":\"fc_9\",\"name\":\"ls\",\"arguments\":\"{}\"}}\n\n",
                "data: {\"type\":\"response.completed\",\"response\":{}}\n\n",
            )
            .to_string(),
            vec![
                LlmEvent::ToolCallStart { index: 0, id: "fc_9".to_string(), name: "ls".to_string() },
                LlmEvent::ToolCallArgumentsDelta { index: 0, delta: "{}".to_string() },
                LlmEvent::Finish(StopReason::ToolUse),
            ],
        ),
        (
            "arguments.done without deltas",
            concat!(
                "data: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"ls\",\"arguments\":\"\"}}\n\n",
                "data: {\"type\":\"response.function_call_arguments.done\",\"output_index\":1,\"arguments\":\"{\\\"a\\\":1}\"}\n\n",
                "data: {\"type\":\"response.output_item.done\",\"output_index\":1,\"item\":{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"ls\",\"arguments\":\"{\\\"a\\\":1}\"}}\n\n",
                "data: {\"type\":\"response.completed\",\"response\":{}}\n\n",
            )
            .to_string(),
            vec![
                LlmEvent::ToolCallStart { index: 1, id: "c".to_string(), name: "ls".to_string() },
                LlmEvent::ToolCallArgumentsDelta { index: 1, delta: "{\"a\":1}".to_string() },
                LlmEvent::Finish(StopReason::ToolUse),
            ],
        ),
        (
            "reasoning summary deltas: a new part of an item starts a paragraph, a new item does not",
            concat!(
                "data: {\"type\":\"response.reasoning_summary_part.added\",\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}}\n\n",
                "data: {\"type\":\"response.reasoning_summary_text.delta\",\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\"**Plan**\"}\n\n",
                "data: {\"type\":\"response.reasoning_summary_text.delta\",\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\" list files\"}\n\n",
                "data: {\"type\":\"response.reasoning_summary_text.delta\",\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":1,\"delta\":\"then\"}\n\n",
                "data: {\"type\":\"response.reasoning_summary_text.delta\",\"item_id\":\"rs_2\",\"output_index\":2,\"summary_index\":0,\"delta\":\"again\"}\n\n",
                "data: {\"type\":\"response.reasoning_summary_text.delta\",\"item_id\":\"rs_2\",\"output_index\":2,\"summary_index\":0,\"delta\":\"\"}\n\n",
                "data: {\"type\":\"response.completed\",\"response\":{}}\n\n",
            )
            .to_string(),
            vec![
                LlmEvent::ReasoningSummaryDelta("**Plan**".to_string()),
                LlmEvent::ReasoningSummaryDelta(" list files".to_string()),
                LlmEvent::ReasoningSummaryDelta("\n\nthen".to_string()),
                LlmEvent::ReasoningSummaryDelta("again".to_string()),
                LlmEvent::Finish(StopReason::Stop),
            ],
        ),
        (
            "incomplete at the output limit",
            "data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}}}\n\n".to_string(),
            vec![LlmEvent::Finish(StopReason::Length)],
        ),
        (
            "everything after completion is ignored",
            format!("{completed}\n\ndata: {{not json\n\n"),
            vec![LlmEvent::Finish(StopReason::Stop)],
        ),
        (
            "a trailing completed event without its blank line",
            completed.to_string(),
            vec![LlmEvent::Finish(StopReason::Stop)],
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
    let start = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hel\"}\n\n";
    let cases: Vec<(&str, String, &str, bool)> = vec![
        (
            "error event",
            format!("{start}event: error\ndata: {{\"type\":\"error\",\"code\":\"server_error\",\"message\":\"The server had an error\",\"param\":null,\"sequence_number\":3}}\n\n"),
            "provider stream error: server_error: The server had an error",
            true,
        ),
        (
            "failed response",
            "data: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"Rate limit reached\"}}}\n\n".to_string(),
            "provider stream error: rate_limit_exceeded: Rate limit reached",
            true,
        ),
        (
            "failed: context too long is final",
            "data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"too long\"}}}\n\n".to_string(),
            "provider stream error: context_length_exceeded: too long",
            false,
        ),
        ("cut after a delta", start.to_string(), "provider stream ended early", true),
        (
            "cut inside an event",
            format!("{start}data: {{\"type\":\"response.compl"),
            "provider stream ended early",
            true,
        ),
        ("empty body", String::new(), "provider stream ended early", true),
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
fn garbage_never_panics() {
    let bodies: [&[u8]; 6] = [
        b"\xff\xfe\r\r\n\n",
        b"data: null\n\ndata: 5\n\ndata: []\n\n",
        b"data: {\"type\":\"response.output_item.added\",\"output_index\":-1,\"item\":5}\n\n",
        b"data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"type\":\"reasoning\",\"summary\":7}}\n\n",
        b"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":-1}}}\n\n",
        b"data: {\"type\":\"response.failed\"}\n\n",
    ];
    for body in bodies {
        for piece in [body.len(), 1] {
            let _ = decode_in_pieces(body, piece);
        }
    }
}

#[test]
fn error_bodies_of_http_failures() {
    // Non-streaming error bodies of the OpenAI API, as its error-codes page documents them:
    // the message shown, whether it is retried, whether it is a context overflow (compaction
    // and one retry instead).
    let cases = [
        (
            429,
            r#"{"error":{"message":"Rate limit reached for gpt-5 in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
            "provider returned http 429: Rate limit reached for gpt-5 in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000.",
            true,
            false,
        ),
        (
            400,
            r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
            "provider returned http 400: Your input exceeds the context window of this model. Please adjust your input and try again.",
            false,
            true,
        ),
        (
            400,
            r#"{"error":{"message":"Invalid schema for function 'bash'.","type":"invalid_request_error","param":"tools[0].parameters","code":"invalid_function_parameters"}}"#,
            "provider returned http 400: Invalid schema for function 'bash'.",
            false,
            false,
        ),
        (
            401,
            r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
            "provider returned http 401: Incorrect API key provided.",
            false,
            false,
        ),
        (
            500,
            r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#,
            "provider returned http 500: The server had an error while processing your request. Sorry about that!",
            true,
            false,
        ),
        (
            503,
            r#"{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error","param":null,"code":null}}"#,
            "provider returned http 503: The engine is currently overloaded, please try again later",
            true,
            false,
        ),
    ];
    for (status, body, message, retryable, overflow) in cases {
        let failure = LlmFailure::from_response(status, &[], body);
        assert_eq!(
            (
                failure.message.as_str(),
                failure.retryable,
                failure.is_context_overflow()
            ),
            (message, retryable, overflow),
            "{status}"
        );
    }
}
