//! The OpenAI Responses dialect of the fake LLM server ([`crate::FakeOpenAi`] routes
//! `POST /v1/responses` here). Streams are shaped like recorded Responses API streams:
//! `response.created`, per output item `response.output_item.added` … `.done` (a `reasoning`
//! item with `encrypted_content` when the reply has thinking, a `message` with
//! `response.output_text.delta`s, `function_call`s with `response.function_call_arguments.delta`s),
//! then `response.completed` with usage (cached and reasoning token details).

use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use serde_json::{Value, json};

use crate::fake_openai::{
    DEFAULT_TEXT_PARTS, Reply, StreamReply, split_text, write_chunk, write_json_with,
    write_stream_head,
};

static RESPONSE_COUNTER: AtomicU64 = AtomicU64::new(1);

/// Answers one `/v1/responses` request with `reply`. Returns whether the connection may serve
/// another.
pub(crate) fn respond(stream: &mut TcpStream, reply: Reply, model: &str) -> io::Result<bool> {
    match reply {
        Reply::Status {
            status,
            body,
            headers,
        } => {
            write_json_with(stream, status, &body, &headers)?;
            Ok(true)
        }
        Reply::Stream(reply) => {
            write_stream_head(stream)?;
            for frame in stream_frames(model, &reply) {
                if !reply.chunk_delay.is_zero() {
                    thread::sleep(reply.chunk_delay);
                }
                write_chunk(stream, frame.as_bytes())?;
            }
            write_chunk(stream, b"")?;
            Ok(true)
        }
        Reply::StreamError { text, error } => {
            write_stream_head(stream)?;
            let frames = stream_frames(model, &text_only(text));
            let cut = frames
                .iter()
                .position(|f| f.contains("output_text.delta"))
                .map_or(frames.len(), |i| i + 1);
            for frame in &frames[..cut] {
                write_chunk(stream, frame.as_bytes())?;
            }
            let mut event = json!({"type": "error", "param": null, "sequence_number": 99});
            if let (Some(event), Some(error)) = (event.as_object_mut(), error.as_object()) {
                event.extend(error.clone());
            }
            write_chunk(
                stream,
                format!("event: error\ndata: {event}\n\n").as_bytes(),
            )?;
            write_chunk(stream, b"")?;
            Ok(true)
        }
        Reply::Malformed => {
            write_stream_head(stream)?;
            write_chunk(
                stream,
                b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\n\n",
            )?;
            write_chunk(stream, b"data: this is not json at all\n\n")?;
            write_chunk(stream, b"")?;
            Ok(true)
        }
        Reply::Truncated { text } => {
            write_stream_head(stream)?;
            let frames = stream_frames(model, &text_only(text));
            let cut = frames
                .iter()
                .rposition(|f| f.contains("output_text.delta"))
                .map_or(frames.len(), |i| i + 1);
            for frame in &frames[..cut] {
                write_chunk(stream, frame.as_bytes())?;
            }
            stream.flush()?;
            let _ = stream.shutdown(std::net::Shutdown::Both);
            Ok(false)
        }
    }
}

fn text_only(text: String) -> StreamReply {
    StreamReply {
        text,
        tool_calls: Vec::new(),
        chunk_delay: std::time::Duration::ZERO,
        usage: None,
        cache: (0, 0),
        thinking: None,
        text_parts: DEFAULT_TEXT_PARTS,
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
