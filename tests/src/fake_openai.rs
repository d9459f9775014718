//! A local LLM server speaking the real streaming wire formats: OpenAI Chat Completions
//! (`POST /v1/chat/completions`), OpenAI Responses (`POST /v1/responses`, see
//! [`crate::fake_responses`]) and Anthropic Messages (`POST /v1/messages`, see
//! [`crate::fake_anthropic`]). One script serves every dialect: a [`Reply`] says what to
//! answer, the request path says in which format.
//!
//! Replies are scripted per model name, so tests sharing one server (and one Worker) never
//! take each other's replies: create each session with its own `model` and script that model.
//! Requests are recorded with their headers and JSON body.
//!
//! ```text
//! POST /v1/chat/completions  {"model": "m-1", "stream": true, ...}
//! ← 200 text/event-stream (chunked)
//!   data: {"object":"chat.completion.chunk","choices":[{"delta":{"role":"assistant","content":""}}]}
//!   data: {... "delta":{"content":"Hel"} ...}
//!   data: {... "delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"list_sessions","arguments":""}}]}}
//!   data: {... "delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"li"}}]}}
//!   data: {... "delta":{},"finish_reason":"stop"}
//!   data: {"choices":[],"usage":{"prompt_tokens":..,"completion_tokens":..,"total_tokens":..}}
//!   data: [DONE]
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use serde_json::{Value, json};

use crate::fake_server::{self, Body, End, FakeServer, Gate};
use crate::http;

/// One scripted answer to a chat completion request.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// A well-formed stream (or JSON completion when the request had `stream: false`).
    Stream(StreamReply),
    /// An HTTP error status with this body (served as JSON).
    Status {
        /// Status code.
        status: u16,
        /// Body text.
        body: String,
        /// Extra response headers (such as `retry-after`).
        headers: Vec<(String, String)>,
    },
    /// A valid start with some text, then an in-stream error event with this JSON payload
    /// (Anthropic: `event: error`; Chat Completions: a `data: {"error": …}` chunk).
    StreamError {
        /// Text sent before the error.
        text: String,
        /// The `error` object.
        error: Value,
    },
    /// `200 text/event-stream` whose `data:` lines are not JSON, ended without `[DONE]`.
    Malformed,
    /// A valid start (role and some text), then the connection is dropped mid-body.
    Truncated {
        /// Text sent before the cut.
        text: String,
    },
}

/// A streamed completion.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamReply {
    /// Assistant text (split into several content deltas).
    pub text: String,
    /// Tool calls: name and arguments (arguments are streamed in fragments).
    pub tool_calls: Vec<(String, Value)>,
    /// Pause before each chunk.
    pub chunk_delay: Duration,
    /// `(prompt_tokens, completion_tokens)` for the usage chunk.
    pub usage: Option<(u64, u64)>,
    /// `(cache_read, cache_write)` prompt tokens (part of `prompt_tokens`), where the dialect
    /// reports them.
    pub cache: (u64, u64),
    /// A thinking block `(text, signature)` before the text, where the dialect has one.
    pub thinking: Option<(String, String)>,
    /// Content deltas the text is split into (at most one per character).
    pub text_parts: usize,
    /// Frames sent together in one write (after one `chunk_delay`): a provider whose deltas
    /// arrive in bursts. 1 unless [`Reply::with_frames_per_write`] says otherwise.
    pub frames_per_write: usize,
    /// Holds each write after the first until the test lets it out ([`Reply::with_gate`]).
    pub gate: Option<Gate>,
}

/// Content deltas of a text reply unless [`Reply::with_text_parts`] says otherwise.
pub const DEFAULT_TEXT_PARTS: usize = 4;

impl Reply {
    /// A text reply.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Stream(StreamReply {
            text: text.into(),
            tool_calls: Vec::new(),
            chunk_delay: Duration::ZERO,
            usage: Some((11, 7)),
            cache: (0, 0),
            thinking: None,
            text_parts: DEFAULT_TEXT_PARTS,
            frames_per_write: 1,
            gate: None,
        })
    }

    /// A reply that calls tools.
    pub fn tool_calls<N: Into<String>>(calls: impl IntoIterator<Item = (N, Value)>) -> Reply {
        Reply::Stream(StreamReply {
            text: String::new(),
            tool_calls: calls
                .into_iter()
                .map(|(name, args)| (name.into(), args))
                .collect(),
            chunk_delay: Duration::ZERO,
            usage: Some((23, 9)),
            cache: (0, 0),
            thinking: None,
            text_parts: DEFAULT_TEXT_PARTS,
            frames_per_write: 1,
            gate: None,
        })
    }

    /// An error status with a raw body.
    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply::Status {
            status,
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// An Anthropic error status: `{"type":"error","error":{"type","message"}}`.
    pub fn anthropic_error(status: u16, kind: &str, message: &str) -> Reply {
        let body = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"});
        Reply::status(status, body.to_string())
    }

    /// Anthropic's 529 `overloaded_error`.
    pub fn anthropic_overloaded() -> Reply {
        Reply::anthropic_error(529, "overloaded_error", "Overloaded")
    }

    /// Some text, then an in-stream error event.
    pub fn stream_error(text: impl Into<String>, error: Value) -> Reply {
        Reply::StreamError {
            text: text.into(),
            error,
        }
    }

    /// Adds a response header to an error status reply.
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Status { headers, .. } = &mut self {
            headers.push((name.to_string(), value.to_string()));
        }
        self
    }

    /// Sets the cache read / write tokens of a stream reply.
    pub fn with_cache(mut self, read: u64, write: u64) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.cache = (read, write);
        }
        self
    }

    /// Adds a thinking block (text and signature) to a stream reply.
    pub fn with_thinking(mut self, text: &str, signature: &str) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.thinking = Some((text.to_string(), signature.to_string()));
        }
        self
    }

    /// An error status with an OpenAI error body `{"error":{"message","type","code"}}`.
    pub fn error(status: u16, message: &str, kind: &str, code: &str) -> Reply {
        let body =
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
        Reply::status(status, body.to_string())
    }

    /// OpenAI's 429.
    pub fn rate_limited() -> Reply {
        Reply::error(
            429,
            "Rate limit reached for requests. Please try again in 1s.",
            "requests",
            "rate_limit_exceeded",
        )
    }

    /// A stream that is not SSE JSON.
    pub fn malformed() -> Reply {
        Reply::Malformed
    }

    /// A stream cut off mid-body.
    pub fn truncated() -> Reply {
        Reply::Truncated {
            text: "this reply is cut".to_string(),
        }
    }

    /// Adds text before the tool calls of a stream reply.
    pub fn with_text(mut self, text: impl Into<String>) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.text = text.into();
        }
        self
    }

    /// Splits the text of a stream reply into `parts` content deltas.
    pub fn with_text_parts(mut self, parts: usize) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.text_parts = parts.max(1);
        }
        self
    }

    /// Sends the frames of a stream reply `n` at a time (each group after the delay).
    pub fn with_frames_per_write(mut self, n: usize) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.frames_per_write = n.max(1);
        }
        self
    }

    /// Holds each write of a stream reply after the first until `gate` lets it out.
    pub fn with_gate(mut self, gate: &Gate) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.gate = Some(gate.clone());
        }
        self
    }

    /// Pauses before each chunk of a stream reply.
    pub fn with_delay(mut self, delay: Duration) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.chunk_delay = delay;
        }
        self
    }

    /// Sets the usage of a stream reply.
    pub fn with_usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Reply {
        if let Reply::Stream(stream) = &mut self {
            stream.usage = Some((prompt_tokens, completion_tokens));
        }
        self
    }
}

/// A request the server received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers as hyper parsed them: names lowercase, each name's values together.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it was not JSON).
    pub body: Value,
    /// The body as text.
    pub raw_body: String,
    /// When the whole request had arrived (the benchmarks split a turn's latency at it).
    pub received_at: std::time::Instant,
}

impl RecordedRequest {
    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        http::find_header(&self.headers, name)
    }

    /// `body.model`.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// `body.messages`.
    pub fn messages(&self) -> Vec<Value> {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    /// Names of `body.tools[].function.name`.
    pub fn tool_names(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| {
                        t.pointer("/function/name")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct State {
    scripts: HashMap<String, VecDeque<Reply>>,
    always: HashMap<String, Reply>,
    requests: Vec<RecordedRequest>,
}

/// The server. Dropping it stops accepting connections.
pub struct FakeOpenAi {
    server: FakeServer,
    state: Arc<Mutex<State>>,
}

impl FakeOpenAi {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub fn start() -> FakeOpenAi {
        let state = Arc::new(Mutex::new(State::default()));
        let handler_state = state.clone();
        let server = FakeServer::start("fake-openai", move |request| {
            respond(&handler_state, request)
        });
        FakeOpenAi { server, state }
    }

    /// `http://127.0.0.1:PORT/v1`, the value for `OPENAI_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.server.addr())
    }

    /// `http://127.0.0.1:PORT`, the value for `ANTHROPIC_BASE_URL` (the client appends
    /// `/v1/messages`).
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// When the newest request naming `model` arrived (without copying the recorded bodies).
    pub fn last_request_at(&self, model: &str) -> Option<std::time::Instant> {
        let state = self.state.lock().unwrap();
        state
            .requests
            .iter()
            .rev()
            .find(|r| r.model() == Some(model))
            .map(|r| r.received_at)
    }

    /// Queues replies for requests naming `model`.
    pub fn script(&self, model: &str, replies: impl IntoIterator<Item = Reply>) {
        let mut state = self.state.lock().unwrap();
        state
            .scripts
            .entry(model.to_string())
            .or_default()
            .extend(replies);
    }

    /// The reply for `model` once its queue is empty (instead of the built-in default).
    pub fn script_always(&self, model: &str, reply: Reply) {
        self.state
            .lock()
            .unwrap()
            .always
            .insert(model.to_string(), reply);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Requests naming `model`.
    pub fn requests_for(&self, model: &str) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.model() == Some(model))
            .collect()
    }

    /// Scripted replies for `model` not yet served.
    pub fn pending(&self, model: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .scripts
            .get(model)
            .map_or(0, VecDeque::len)
    }
}

/// Answers one request.
fn respond(state: &Mutex<State>, request: RecordedRequest) -> Response<Body> {
    let route = request
        .path
        .split('?')
        .next()
        .unwrap_or_default()
        .to_string();
    if request.method == "POST" && route == "/v1/messages" {
        let (reply, model) = next_reply(state, request);
        return crate::fake_anthropic::respond(reply, &model);
    }
    if request.method == "POST" && route == "/v1/responses" {
        let (reply, model) = next_reply(state, request);
        return crate::fake_responses::respond(reply, &model);
    }
    if request.method != "POST" || route != "/v1/chat/completions" {
        let body = json!({"error": {"message": format!("Unknown request URL: {} {}", request.method, request.path), "type": "invalid_request_error", "param": null, "code": "unknown_url"}});
        state.lock().unwrap().requests.push(request);
        return json_response(404, &body.to_string(), &[]);
    }
    let streaming = request
        .body
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let include_usage = request
        .body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let (reply, model) = next_reply(state, request);
    match reply {
        Reply::Status {
            status,
            body,
            headers,
        } => json_response(status, &body, &headers),
        Reply::StreamError { text, error } => {
            let frames = stream_frames(&model, &text_only(text), false);
            let mut frames: Vec<String> = frames
                .into_iter()
                .filter(|f| f.contains("\"content\""))
                .collect();
            frames.push(format!("data: {}\n\n", json!({"error": error})));
            sse_response(frames, Duration::ZERO, End::Complete)
        }
        Reply::Stream(reply) if !streaming => {
            json_response(200, &completion_json(&model, &reply).to_string(), &[])
        }
        Reply::Stream(reply) => {
            let frames = stream_frames(&model, &reply, include_usage || reply.usage.is_some());
            let frames = frames
                .chunks(reply.frames_per_write)
                .map(|group| Bytes::from(group.concat()))
                .collect();
            fake_server::streamed_gated(
                200,
                &sse_headers(),
                frames,
                reply.chunk_delay,
                End::Complete,
                reply.gate,
            )
        }
        Reply::Malformed => sse_response(
            vec![
                "data: {\"id\":\"chatcmpl-broken\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"oops\"\n\n".to_string(),
                "data: this is not json at all\n\n".to_string(),
            ],
            Duration::ZERO,
            End::Complete,
        ),
        Reply::Truncated { text } => {
            let mut frames = stream_frames(&model, &text_only(text), false);
            // Role chunk and the content chunks, but no finish, usage or [DONE].
            let cut = frames.iter().filter(|f| f.contains("\"content\"")).count();
            frames.truncate(cut);
            sse_response(frames, Duration::ZERO, End::Cut)
        }
    }
}

/// A reply of only this text, without usage: what error and truncated streams send first.
pub(crate) fn text_only(text: String) -> StreamReply {
    StreamReply {
        text,
        tool_calls: Vec::new(),
        chunk_delay: Duration::ZERO,
        usage: None,
        cache: (0, 0),
        thinking: None,
        text_parts: DEFAULT_TEXT_PARTS,
        frames_per_write: 1,
        gate: None,
    }
}

/// Records `request` and takes the reply scripted for its model: `(reply, model)`.
fn next_reply(state: &Mutex<State>, request: RecordedRequest) -> (Reply, String) {
    let model = request.model().unwrap_or_default().to_string();
    let mut state = state.lock().unwrap();
    state.requests.push(request);
    let scripted = state.scripts.get_mut(&model).and_then(VecDeque::pop_front);
    let reply = scripted
        .or_else(|| state.always.get(&model).cloned())
        .unwrap_or_else(|| Reply::text("fake-openai: nothing scripted for this model"));
    (reply, model)
}

/// A JSON response with extra headers, as the providers' APIs answer (with a request id).
pub(crate) fn json_response(
    status: u16,
    body: &str,
    headers: &[(String, String)],
) -> Response<Body> {
    let mut all = vec![
        ("Content-Type".to_string(), "application/json".to_string()),
        ("x-request-id".to_string(), "req_fake".to_string()),
    ];
    all.extend_from_slice(headers);
    fake_server::full(status, &all, body.to_string())
}

/// A `200 text/event-stream` response sending each frame as one chunk, each after `delay`.
pub(crate) fn sse_response(frames: Vec<String>, delay: Duration, end: End) -> Response<Body> {
    let chunks = frames.into_iter().map(Bytes::from).collect();
    fake_server::streamed(200, &sse_headers(), chunks, delay, end)
}

fn sse_headers() -> [(String, String); 3] {
    [
        ("Content-Type", "text/event-stream; charset=utf-8"),
        ("Cache-Control", "no-cache"),
        ("x-request-id", "req_fake"),
    ]
    .map(|(name, value)| (name.to_string(), value.to_string()))
}

static COMPLETION_COUNTER: AtomicU64 = AtomicU64::new(1);

/// The `data:` frames of a streamed reply, each ending with a blank line.
pub fn stream_frames(model: &str, reply: &StreamReply, with_usage: bool) -> Vec<String> {
    let n = COMPLETION_COUNTER.fetch_add(1, Ordering::Relaxed);
    let id = format!("chatcmpl-fake{n}");
    let created = crate::util::unix_now();
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    };
    let mut frames = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    )];
    for piece in split_text(&reply.text, reply.text_parts) {
        frames.push(chunk(json!({"content": piece}), Value::Null));
    }
    for (index, (name, arguments)) in reply.tool_calls.iter().enumerate() {
        let call_id = format!("call_fake{n}_{index}");
        frames.push(chunk(
            json!({"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
            Value::Null,
        ));
        let arguments = arguments.to_string();
        for piece in split_text(&arguments, 3) {
            frames.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                Value::Null,
            ));
        }
    }
    let finish = if reply.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    frames.push(chunk(json!({}), json!(finish)));
    let mut out: Vec<String> = frames
        .into_iter()
        .map(|f| format!("data: {f}\n\n"))
        .collect();
    if with_usage {
        let (prompt, completion) = reply.usage.unwrap_or((0, 0));
        let usage = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "fp_fake", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        });
        out.push(format!("data: {usage}\n\n"));
    }
    out.push("data: [DONE]\n\n".to_string());
    out
}

/// A non-streaming `chat.completion` object.
fn completion_json(model: &str, reply: &StreamReply) -> Value {
    let n = COMPLETION_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tool_calls: Vec<Value> = reply
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| json!({"id": format!("call_fake{n}_{i}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
        .collect();
    let (prompt, completion) = reply.usage.unwrap_or((0, 0));
    let mut message = json!({"role": "assistant", "content": if reply.text.is_empty() { Value::Null } else { json!(reply.text) }});
    if !tool_calls.is_empty() {
        message["tool_calls"] = json!(tool_calls);
    }
    json!({
        "id": format!("chatcmpl-fake{n}"), "object": "chat.completion", "created": crate::util::unix_now(), "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": if tool_calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    })
}

/// Splits text into about `parts` pieces on char boundaries (at least one piece unless empty).
pub(crate) fn split_text(text: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(parts.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;
    use crate::http::Request;
    use crate::sse::{SseItem, SseParser};

    fn post(server: &FakeOpenAi, body: Value) -> crate::http::Response {
        Request::new("POST", format!("{}/chat/completions", server.base_url()))
            .bearer("test-key")
            .json(&body)
            .send()
            .expect("request fake openai")
    }

    fn data_frames(body: &[u8]) -> Vec<String> {
        let mut parser = SseParser::new();
        parser.push(body).unwrap();
        let mut out = Vec::new();
        while let Some(item) = parser.next_item() {
            if let SseItem::Event(event) = item {
                out.push(event.raw_data);
            }
        }
        out
    }

    #[test]
    fn streams_text_and_tool_calls_in_the_openai_format() {
        let server = FakeOpenAi::start();
        server.script(
            "m1",
            [
                Reply::text("Hello there, world"),
                Reply::tool_calls([("list_sessions", json!({"limit": 5}))]),
            ],
        );
        let response = post(
            &server,
            json!({"model": "m1", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(response.status, 200);
        assert!(
            response
                .header("content-type")
                .unwrap()
                .starts_with("text/event-stream")
        );
        let frames = data_frames(&response.body);
        assert_eq!(frames.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str(f).unwrap())
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|c| {
                c.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
            })
            .collect();
        assert_eq!(text, "Hello there, world");
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        assert!(
            chunks
                .iter()
                .any(|c| c.pointer("/choices/0/finish_reason") == Some(&json!("stop")))
        );
        assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 18);

        let response = post(
            &server,
            json!({"model": "m1", "stream": true, "messages": []}),
        );
        let frames = data_frames(&response.body);
        let chunks: Vec<Value> = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str(f).unwrap())
            .collect();
        let first_call = chunks
            .iter()
            .find_map(|c| c.pointer("/choices/0/delta/tool_calls/0"))
            .unwrap();
        assert_eq!(first_call["function"]["name"], "list_sessions");
        assert!(first_call["id"].as_str().unwrap().starts_with("call_"));
        let args: String = chunks
            .iter()
            .filter_map(|c| {
                c.pointer("/choices/0/delta/tool_calls/0/function/arguments")
                    .and_then(Value::as_str)
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&args).unwrap(),
            json!({"limit": 5})
        );
        assert!(
            chunks
                .iter()
                .any(|c| c.pointer("/choices/0/finish_reason") == Some(&json!("tool_calls")))
        );

        let requests = server.requests_for("m1");
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].header("authorization"), Some("Bearer test-key"));
        assert_eq!(requests[0].messages()[0]["content"], "hi");
    }

    #[test]
    fn errors_malformed_and_truncated_replies() {
        let server = FakeOpenAi::start();
        server.script(
            "m2",
            [
                Reply::rate_limited(),
                Reply::malformed(),
                Reply::truncated(),
            ],
        );
        server.script_always(
            "m2",
            Reply::status(
                503,
                "{\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":null}}",
            ),
        );
        let response = post(&server, json!({"model": "m2", "stream": true}));
        assert_eq!(response.status, 429);
        assert_eq!(response.json()["error"]["code"], "rate_limit_exceeded");
        let response = post(&server, json!({"model": "m2", "stream": true}));
        assert_eq!(response.status, 200);
        assert!(
            data_frames(&response.body)
                .iter()
                .all(|f| serde_json::from_str::<Value>(f).is_err())
        );
        let err = Request::new("POST", format!("{}/chat/completions", server.base_url()))
            .json(&json!({"model": "m2", "stream": true}))
            .send()
            .expect_err("a truncated body is an error");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(post(&server, json!({"model": "m2"})).status, 503);
        assert_eq!(post(&server, json!({"model": "m2"})).status, 503);
        assert_eq!(server.pending("m2"), 0);
    }

    #[test]
    fn unknown_paths_get_an_openai_404_and_non_streaming_requests_get_json() {
        let server = FakeOpenAi::start();
        let response = Request::new("GET", format!("{}/models", server.base_url()))
            .send()
            .unwrap();
        assert_eq!(response.status, 404);
        assert_eq!(response.json()["error"]["type"], "invalid_request_error");
        server.script("m3", [Reply::text("plain")]);
        let response = post(&server, json!({"model": "m3", "stream": false}));
        assert_eq!(response.json()["choices"][0]["message"]["content"], "plain");
    }
}
