//! The OpenAI Responses dialect of the fake LLM server ([`crate::FakeOpenAi`] routes
//! `POST /v1/responses` here). Streams are shaped like recorded Responses API streams:
//! `response.created`, per output item `response.output_item.added` … `.done` (a `reasoning`
//! item with `encrypted_content` when the reply has thinking, its summary streamed by
//! `response.reasoning_summary_part.added`, `response.reasoning_summary_text.delta`s, `.done`
//! and `response.reasoning_summary_part.done`; a `message` with
//! `response.output_text.delta`s, `function_call`s with `response.function_call_arguments.delta`s),
//! then `response.completed` with usage (cached and reasoning token details).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::Response;
use serde_json::{Value, json};

use crate::fake_openai::{Reply, StreamReply, json_response, split_text, sse_response, text_only};
use crate::fake_server::{Body, End};

static RESPONSE_COUNTER: AtomicU64 = AtomicU64::new(1);

/// Answers one `/v1/responses` request with `reply`.
pub(crate) fn respond(reply: Reply, model: &str) -> Response<Body> {
    match reply {
        Reply::Status {
            status,
            body,
            headers,
        } => json_response(status, &body, &headers),
        Reply::Stream(reply) => sse_response(
            stream_frames(model, &reply),
            reply.chunk_delay,
            End::Complete,
        ),
        Reply::StreamError { text, error } => {
            let mut frames = stream_frames(model, &text_only(text));
            let cut = frames
                .iter()
                .position(|f| f.contains("output_text.delta"))
                .map_or(frames.len(), |i| i + 1);
            frames.truncate(cut);
            let mut event = json!({"type": "error", "param": null, "sequence_number": 99});
            if let (Some(event), Some(error)) = (event.as_object_mut(), error.as_object()) {
                event.extend(error.clone());
            }
            frames.push(format!("event: error\ndata: {event}\n\n"));
            sse_response(frames, Duration::ZERO, End::Complete)
        }
        Reply::Malformed => sse_response(
            vec![
                "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\n\n"
                    .to_string(),
                "data: this is not json at all\n\n".to_string(),
            ],
            Duration::ZERO,
            End::Complete,
        ),
        Reply::Truncated { text } => {
            let mut frames = stream_frames(model, &text_only(text));
            let cut = frames
                .iter()
                .rposition(|f| f.contains("output_text.delta"))
                .map_or(frames.len(), |i| i + 1);
            frames.truncate(cut);
            sse_response(frames, Duration::ZERO, End::Cut)
        }
    }
}

/// The SSE events of a streamed reply, each ending with a blank line. A reply's thinking
/// becomes a reasoning item: its text the summary, its signature the encrypted content.
pub fn stream_frames(model: &str, reply: &StreamReply) -> Vec<String> {
    let n = RESPONSE_COUNTER.fetch_add(1, Ordering::Relaxed);
    let response_id = format!("resp_fake{n}");
    let mut events: Vec<Value> = vec![json!({
        "type": "response.created",
        "response": {"id": response_id, "object": "response", "status": "in_progress", "model": model, "output": [], "usage": null},
    })];
    let mut index = 0;
    if let Some((summary, encrypted)) = &reply.thinking {
        let item = json!({"id": format!("rs_fake{n}"), "type": "reasoning", "summary": []});
        events.push(
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        );
        // The summary as it is written (`reasoning.summary: "auto"`), one part.
        let item_id = format!("rs_fake{n}");
        let part = json!({"type": "summary_text", "text": ""});
        events.push(json!({"type": "response.reasoning_summary_part.added", "item_id": item_id, "output_index": index, "summary_index": 0, "part": part}));
        for piece in split_text(summary, 3) {
            events.push(json!({"type": "response.reasoning_summary_text.delta", "item_id": item_id, "output_index": index, "summary_index": 0, "delta": piece}));
        }
        events.push(json!({"type": "response.reasoning_summary_text.done", "item_id": item_id, "output_index": index, "summary_index": 0, "text": summary}));
        events.push(json!({"type": "response.reasoning_summary_part.done", "item_id": item_id, "output_index": index, "summary_index": 0, "part": {"type": "summary_text", "text": summary}}));
        events.push(
            json!({"type": "response.output_item.done", "output_index": index, "item": {
                "id": format!("rs_fake{n}"), "type": "reasoning",
                "summary": [{"type": "summary_text", "text": summary}],
                "encrypted_content": encrypted,
            }}),
        );
        index += 1;
    }
    if !reply.text.is_empty() {
        let item_id = format!("msg_fake{n}");
        events.push(json!({"type": "response.output_item.added", "output_index": index, "item": {
            "id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": [],
        }}));
        for piece in split_text(&reply.text, reply.text_parts) {
            events.push(json!({"type": "response.output_text.delta", "item_id": item_id, "output_index": index, "content_index": 0, "delta": piece}));
        }
        events.push(json!({"type": "response.output_text.done", "item_id": item_id, "output_index": index, "content_index": 0, "text": reply.text}));
        events.push(
            json!({"type": "response.output_item.done", "output_index": index, "item": {
                "id": item_id, "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }}),
        );
        index += 1;
    }
    for (call, (name, arguments)) in reply.tool_calls.iter().enumerate() {
        let item_id = format!("fc_fake{n}_{call}");
        let call_id = format!("call_fake{n}_{call}");
        let arguments = arguments.to_string();
        events.push(json!({"type": "response.output_item.added", "output_index": index, "item": {
            "id": item_id, "type": "function_call", "status": "in_progress", "arguments": "", "call_id": call_id, "name": name,
        }}));
        for piece in split_text(&arguments, 3) {
            events.push(json!({"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": index, "delta": piece}));
        }
        events.push(json!({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": index, "arguments": arguments}));
        events.push(json!({"type": "response.output_item.done", "output_index": index, "item": {
            "id": item_id, "type": "function_call", "status": "completed", "arguments": arguments, "call_id": call_id, "name": name,
        }}));
        index += 1;
    }
    let (input, output) = reply.usage.unwrap_or((0, 0));
    let reasoning = if reply.thinking.is_some() {
        output / 2
    } else {
        0
    };
    events.push(json!({
        "type": "response.completed",
        "response": {
            "id": response_id, "object": "response", "status": "completed", "model": model,
            "usage": {
                "input_tokens": input,
                "input_tokens_details": {"cached_tokens": reply.cache.0},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": reasoning},
                "total_tokens": input + output,
            },
        },
    }));
    events
        .into_iter()
        .enumerate()
        .map(|(sequence, mut event)| {
            event["sequence_number"] = json!(sequence);
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap_or("")
            )
        })
        .collect()
}
