//! The Anthropic Messages dialect of the fake LLM server ([`crate::FakeOpenAi`] routes
//! `POST /v1/messages` here). Streams are shaped like the examples of Anthropic's streaming
//! docs: `message_start`, per block `content_block_start` / `content_block_delta` /
//! `content_block_stop` (with `ping`s between), `message_delta` with the stop reason and
//! cumulative usage, `message_stop`. Errors use Anthropic's body
//! `{"type":"error","error":{"type","message"}}`.
//!
//! ```text
//! POST /v1/messages  {"model": "m-1", "stream": true, "max_tokens": …, ...}
//! ← 200 text/event-stream (chunked)
//!   event: message_start
//!   data: {"type":"message_start","message":{… "usage":{"input_tokens":…,"cache_read_input_tokens":…}}}
//!   event: content_block_start
//!   data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}
//!   event: content_block_delta
//!   data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}
//!   …
//!   event: message_stop
//!   data: {"type":"message_stop"}
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::Response;
use serde_json::{Value, json};

use crate::fake_openai::{Reply, StreamReply, json_response, split_text, sse_response, text_only};
use crate::fake_server::{Body, End};

static MESSAGE_COUNTER: AtomicU64 = AtomicU64::new(1);

/// Answers one `/v1/messages` request with `reply`.
pub(crate) fn respond(reply: Reply, model: &str) -> Response<Body> {
    match reply {
        Reply::Status {
            status,
            body,
            headers,
        } => json_response(status, &body, &headers),
        Reply::Stream(reply) => {
            sse_response(stream_frames(model, &reply), reply.chunk_delay, End::Complete)
        }
        Reply::StreamError { text, error } => {
            let mut frames = stream_frames(model, &text_only(text));
            // Everything up to the first text delta, then the error.
            let cut = frames
                .iter()
                .position(|f| f.contains("text_delta"))
                .map_or(frames.len(), |i| i + 1);
            frames.truncate(cut);
            let event = json!({"type": "error", "error": error});
            frames.push(format!("event: error\ndata: {event}\n\n"));
            sse_response(frames, Duration::ZERO, End::Complete)
        }
        Reply::Malformed => sse_response(
            vec![
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_broken\"\n\n".to_string(),
                "event: ping\ndata: this is not json at all\n\n".to_string(),
            ],
            Duration::ZERO,
            End::Complete,
        ),
        Reply::Truncated { text } => {
            let mut frames = stream_frames(model, &text_only(text));
            // message_start, the text block start and its deltas; no stop, no message_stop.
            let cut = frames
                .iter()
                .rposition(|f| f.contains("text_delta"))
                .map_or(frames.len(), |i| i + 1);
            frames.truncate(cut);
            sse_response(frames, Duration::ZERO, End::Cut)
        }
    }
}

/// The SSE events of a streamed reply, each ending with a blank line.
pub fn stream_frames(model: &str, reply: &StreamReply) -> Vec<String> {
    let n = MESSAGE_COUNTER.fetch_add(1, Ordering::Relaxed);
    let (prompt, completion) = reply.usage.unwrap_or((0, 0));
    let (cache_read, cache_write) = reply.cache;
    let uncached = prompt.saturating_sub(cache_read + cache_write);
    let mut events: Vec<Value> = vec![json!({
        "type": "message_start",
        "message": {
            "id": format!("msg_fake{n}"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {
                "input_tokens": uncached,
                "cache_creation_input_tokens": cache_write,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
            },
        },
    })];
    let mut index = 0;
    if let Some((thinking, signature)) = &reply.thinking {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}}));
        for piece in split_text(thinking, 3) {
            events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": piece}}));
        }
        events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}}));
        events.push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    }
    if !reply.text.is_empty() {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}));
        events.push(json!({"type": "ping"}));
        for piece in split_text(&reply.text, reply.text_parts) {
            events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}));
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    }
    for (call, (name, arguments)) in reply.tool_calls.iter().enumerate() {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": format!("toolu_fake{n}_{call}"), "name": name, "input": {},
        }}));
        events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": ""}}));
        for piece in split_text(&arguments.to_string(), 3) {
            events.push(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}));
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    }
    let stop_reason = if reply.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    events.push(json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": completion},
    }));
    events.push(json!({"type": "message_stop"}));
    events
        .into_iter()
        .map(|event| {
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeOpenAi;
    use crate::http::Request;
    use crate::sse::{SseItem, SseParser};

    fn post(server: &FakeOpenAi, body: Value) -> crate::http::Response {
        Request::new(
            "POST",
            format!("{}/v1/messages", server.anthropic_base_url()),
        )
        .json(&body)
        .send()
        .expect("request fake anthropic")
    }

    fn events(body: &[u8]) -> Vec<(String, Value)> {
        let mut parser = SseParser::new();
        parser.push(body).unwrap();
        let mut out = Vec::new();
        while let Some(item) = parser.next_item() {
            if let SseItem::Event(event) = item {
                out.push((
                    event.event.clone(),
                    serde_json::from_str(&event.raw_data).unwrap(),
                ));
            }
        }
        out
    }

    #[test]
    fn streams_thinking_text_and_tool_use_in_the_anthropic_format() {
        let server = FakeOpenAi::start();
        server.script(
            "c1",
            [Reply::tool_calls([("ls", json!({"path": "."}))])
                .with_text("Let me look.")
                .with_thinking("hmm", "sig")
                .with_usage(100, 20)
                .with_cache(60, 30)],
        );
        let response = post(&server, json!({"model": "c1", "stream": true}));
        assert_eq!(response.status, 200);
        let events = events(&response.body);
        assert!(
            events
                .iter()
                .all(|(name, data)| data["type"] == name.as_str())
        );
        let types: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(types.first(), Some(&"message_start"));
        assert_eq!(types.last(), Some(&"message_stop"));
        assert_eq!(
            events[0].1["message"]["usage"],
            json!({"input_tokens": 10, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 60, "output_tokens": 1})
        );
        let deltas = |kind: &str, key: &str| -> String {
            events
                .iter()
                .filter(|(_, d)| d["delta"]["type"] == kind)
                .filter_map(|(_, d)| d["delta"][key].as_str())
                .collect()
        };
        assert_eq!(deltas("thinking_delta", "thinking"), "hmm");
        assert_eq!(deltas("signature_delta", "signature"), "sig");
        assert_eq!(deltas("text_delta", "text"), "Let me look.");
        let input: Value =
            serde_json::from_str(&deltas("input_json_delta", "partial_json")).unwrap();
        assert_eq!(input, json!({"path": "."}));
        let stop = events.iter().find(|(n, _)| n == "message_delta").unwrap();
        assert_eq!(stop.1["delta"]["stop_reason"], "tool_use");
        assert_eq!(stop.1["usage"]["output_tokens"], 20);
        assert_eq!(server.requests()[0].path, "/v1/messages");
    }

    #[test]
    fn errors_with_headers_and_in_stream_errors() {
        let server = FakeOpenAi::start();
        server.script(
            "c2",
            [
                Reply::anthropic_overloaded().with_header("retry-after", "1"),
                Reply::stream_error(
                    "partial",
                    json!({"type": "overloaded_error", "message": "Overloaded"}),
                ),
            ],
        );
        let response = post(&server, json!({"model": "c2", "stream": true}));
        assert_eq!(response.status, 529);
        assert_eq!(response.header("retry-after"), Some("1"));
        assert_eq!(response.json()["error"]["type"], "overloaded_error");
        let response = post(&server, json!({"model": "c2", "stream": true}));
        let events = events(&response.body);
        let (name, data) = events.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(data["error"]["type"], "overloaded_error");
        assert!(events.iter().any(|(_, d)| d["delta"]["text"].is_string()));
    }
}
