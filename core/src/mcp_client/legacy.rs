//! One request to a server over the legacy HTTP+SSE transport (revision 2024-11-05, `"transport":
//! "sse"`), as a machine the host drives. The host opens the server's event stream (`GET`, with
//! [`LegacyExchange::open_headers`]), and then does what each [`LegacyStep`] says: read more of
//! the stream, or `POST` one message to the endpoint the server named.
//!
//! The transport keeps its session in that stream, which a Worker cannot keep between requests:
//! each exchange opens the stream, waits for the `endpoint` event, sends `initialize`, reads
//! its response from the stream, sends `notifications/initialized` and the request, reads the
//! request's response (and any progress notifications before it), and the host closes the
//! stream. Everything read is bounded by [`MAX_ANSWER_BYTES`] (the whole stream), as an answer
//! of the streamable HTTP transport is.
//!
//! The endpoint must be on the server URL's origin (scheme, host and port): the host sends the
//! server's credential there, and the egress rules and the credential's hosts were checked for
//! that origin only.

use std::collections::VecDeque;

use serde_json::{Value, json};

use super::exchange::{
    HttpRequest, MAX_ANSWER_BYTES, MAX_PROGRESS_NOTES, McpError, ProgressNote, media_type,
    response_result,
};
use crate::sse::{SseDecoder, SseFrame, SseItem};

/// The revision this client asks for over the legacy transport.
pub const LEGACY_PROTOCOL_VERSION: &str = "2024-11-05";
/// The revisions it accepts in the answer to `initialize`.
pub const LEGACY_ACCEPTED_VERSIONS: [&str; 3] = ["2024-11-05", "2025-03-26", "2025-06-18"];

/// What the host does next.
#[derive(Clone, Debug, PartialEq)]
pub enum LegacyStep {
    /// Read the next piece of the event stream and give it to [`LegacyExchange::read`] (or
    /// call [`LegacyExchange::ended`] when the stream ended).
    Read,
    /// `POST` this message to `url` and give its status to [`LegacyExchange::posted`] (its
    /// body is not read: the answer comes on the stream).
    Post {
        /// The endpoint the server named, resolved against the server's URL.
        url: String,
        /// The message.
        request: HttpRequest,
    },
    /// The request's result, or why it failed; the host closes the stream.
    Done(Result<Value, McpError>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The stream is not open yet.
    Opening,
    /// Waiting for the `endpoint` event.
    Connecting,
    /// `initialize` sent; waiting for its response.
    Initializing,
    /// `notifications/initialized` being sent.
    Notifying,
    /// The request sent (or being sent); waiting for its response.
    Requesting,
    Done,
}

/// One request over the legacy transport, with the session it opens for it.
#[derive(Debug)]
pub struct LegacyExchange {
    server: url::Url,
    method: String,
    params: Value,
    phase: Phase,
    endpoint: Option<String>,
    decoder: SseDecoder,
    bytes: usize,
    frames: VecDeque<SseFrame>,
    progress: Vec<ProgressNote>,
}

const INITIALIZE_ID: u64 = 1;
const REQUEST_ID: u64 = 2;

impl LegacyExchange {
    /// A request of `method` with `params` to the server whose event stream is at `server_url`.
    ///
    /// # Errors
    /// [`McpError::Transport`] when the URL does not parse.
    pub fn new(server_url: &str, method: &str, params: Value) -> Result<LegacyExchange, McpError> {
        let server = url::Url::parse(server_url)
            .map_err(|e| McpError::Transport(format!("the server's URL: {e}")))?;
        Ok(LegacyExchange {
            server,
            method: method.to_string(),
            params,
            phase: Phase::Opening,
            endpoint: None,
            decoder: SseDecoder::new(MAX_ANSWER_BYTES),
            bytes: 0,
            frames: VecDeque::new(),
            progress: Vec::new(),
        })
    }

    /// The headers of the `GET` that opens the stream (besides `Authorization`).
    pub fn open_headers() -> Vec<(&'static str, String)> {
        vec![("accept", "text/event-stream".to_string())]
    }

    fn fail(&mut self, error: McpError) -> LegacyStep {
        self.phase = Phase::Done;
        LegacyStep::Done(Err(error))
    }

    /// The answer to the `GET`: its status and `Content-Type`.
    pub fn opened(&mut self, status: u16, content_type: Option<&str>) -> LegacyStep {
        if self.phase != Phase::Opening {
            return self.fail(McpError::Malformed("the stream was opened twice".into()));
        }
        if !(200..300).contains(&status) {
            // A streamable HTTP server answers a bare `GET` with 400, 404 or 405.
            let detail = match status {
                400 | 404 | 405 => {
                    "its event stream did not open (a streamable HTTP server? then leave \"transport\" out)"
                }
                _ => "",
            };
            return self.fail(McpError::Http {
                status,
                detail: detail.to_string(),
            });
        }
        let media = media_type(content_type);
        if media != "text/event-stream" {
            return self.fail(McpError::Malformed(format!(
                "the server's stream has content type {:?}, not text/event-stream (is it a streamable HTTP server? then leave \"transport\" out)",
                if media.is_empty() { "(none)" } else { &media }
            )));
        }
        self.phase = Phase::Connecting;
        LegacyStep::Read
    }

    /// The next piece of the stream.
    pub fn read(&mut self, chunk: &[u8]) -> LegacyStep {
        if self.phase == Phase::Done {
            return LegacyStep::Done(Err(McpError::Malformed(
                "a read after the exchange ended".into(),
            )));
        }
        self.bytes = self.bytes.saturating_add(chunk.len());
        if self.bytes > MAX_ANSWER_BYTES {
            return self.fail(McpError::TooLarge);
        }
        let mut items = Vec::new();
        if self.decoder.push(chunk, &mut items).is_err() {
            return self.fail(McpError::TooLarge);
        }
        self.frames
            .extend(items.into_iter().filter_map(|item| match item {
                SseItem::Frame(frame) => Some(frame),
                SseItem::Comment(_) => None,
            }));
        self.advance()
    }

    /// The stream ended (the server closed it) before the exchange was done.
    pub fn ended(&mut self) -> LegacyStep {
        let mut items = Vec::new();
        let _ = self.decoder.finish(&mut items);
        self.frames
            .extend(items.into_iter().filter_map(|item| match item {
                SseItem::Frame(frame) => Some(frame),
                SseItem::Comment(_) => None,
            }));
        match self.advance() {
            LegacyStep::Read => {
                let waiting = match self.phase {
                    Phase::Connecting => "its endpoint event",
                    Phase::Initializing => "the response to initialize",
                    _ => "the response to the request",
                };
                self.fail(McpError::Malformed(format!(
                    "the server closed its stream before {waiting}"
                )))
            }
            step => step,
        }
    }

    /// The status of the last `POST`.
    pub fn posted(&mut self, status: u16) -> LegacyStep {
        if !(200..300).contains(&status) {
            return self.fail(McpError::Http {
                status,
                detail: String::new(),
            });
        }
        match self.phase {
            Phase::Notifying => {
                self.phase = Phase::Requesting;
                let mut body = json!({"jsonrpc": "2.0", "id": REQUEST_ID, "method": self.method});
                if !self.params.is_null() {
                    body["params"] = self.params.clone();
                }
                self.post(body, Some(REQUEST_ID))
            }
            Phase::Initializing | Phase::Requesting => self.advance(),
            Phase::Done => LegacyStep::Done(Err(McpError::Malformed(
                "a POST after the exchange ended".into(),
            ))),
            Phase::Opening | Phase::Connecting => {
                self.fail(McpError::Malformed("a POST before the endpoint".into()))
            }
        }
    }

    /// Progress notes read since the last call.
    pub fn take_progress(&mut self) -> Vec<ProgressNote> {
        std::mem::take(&mut self.progress)
    }

    fn post(&self, body: Value, expects: Option<u64>) -> LegacyStep {
        LegacyStep::Post {
            url: self.endpoint.clone().unwrap_or_default(),
            request: HttpRequest {
                headers: vec![("content-type", "application/json".to_string())],
                body: body.to_string(),
                expects,
            },
        }
    }

    /// Takes the frames read so far, until one asks for a `POST` or ends the exchange.
    fn advance(&mut self) -> LegacyStep {
        while let Some(frame) = self.frames.pop_front() {
            if let Some(step) = self.take(frame) {
                return step;
            }
        }
        LegacyStep::Read
    }

    fn take(&mut self, frame: SseFrame) -> Option<LegacyStep> {
        let event = frame.event.as_deref().unwrap_or("message");
        if self.phase == Phase::Connecting {
            // Nothing but the endpoint counts before it.
            if event != "endpoint" {
                return None;
            }
            let endpoint = match self.endpoint_of(frame.data.trim()) {
                Ok(endpoint) => endpoint,
                Err(e) => return Some(self.fail(e)),
            };
            self.endpoint = Some(endpoint);
            self.phase = Phase::Initializing;
            let body = json!({
                "jsonrpc": "2.0",
                "id": INITIALIZE_ID,
                "method": "initialize",
                "params": {
                    "protocolVersion": LEGACY_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "wuhu", "version": env!("CARGO_PKG_VERSION")},
                },
            });
            return Some(self.post(body, Some(INITIALIZE_ID)));
        }
        if event != "message" || frame.data.trim().is_empty() {
            return None;
        }
        let message: Value = match serde_json::from_str(&frame.data) {
            Ok(message) => message,
            Err(e) => {
                return Some(self.fail(McpError::Malformed(format!(
                    "an event that is not JSON ({e})"
                ))));
            }
        };
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(self.fail(McpError::Malformed(
                "a message that is not JSON-RPC 2.0".into(),
            )));
        }
        if let Some(note) = ProgressNote::of(&message) {
            if self.progress.len() == MAX_PROGRESS_NOTES {
                self.progress.remove(0);
            }
            self.progress.push(note);
            return None;
        }
        let is_response = message.get("result").is_some() || message.get("error").is_some();
        let id = message.get("id").and_then(Value::as_u64);
        // Other notifications, responses to nothing outstanding and the server's requests
        // (this client declares no capabilities) are not answered.
        match (self.phase, is_response, id) {
            (Phase::Initializing, true, Some(INITIALIZE_ID)) => {
                let result = match response_result(Ok(Some(message))) {
                    Ok(result) => result,
                    Err(e) => return Some(self.fail(e)),
                };
                let version = result
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !LEGACY_ACCEPTED_VERSIONS.contains(&version) {
                    return Some(self.fail(McpError::Malformed(format!(
                        "the server speaks protocol revision {version:?}; over \"sse\" this client speaks {}",
                        LEGACY_ACCEPTED_VERSIONS.join(", ")
                    ))));
                }
                self.phase = Phase::Notifying;
                Some(self.post(
                    json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                    None,
                ))
            }
            (Phase::Requesting, true, Some(REQUEST_ID)) => {
                self.phase = Phase::Done;
                Some(LegacyStep::Done(response_result(Ok(Some(message)))))
            }
            _ => None,
        }
    }

    /// The endpoint an `endpoint` event names, resolved against the server's URL; only on its
    /// origin.
    fn endpoint_of(&self, data: &str) -> Result<String, McpError> {
        let endpoint = self
            .server
            .join(data)
            .map_err(|e| McpError::Malformed(format!("the endpoint {data:?}: {e}")))?;
        if endpoint.origin() != self.server.origin() {
            return Err(McpError::Malformed(format!(
                "the endpoint {endpoint} is not on the server's origin ({}): its credential is not sent there",
                self.server.origin().ascii_serialization()
            )));
        }
        Ok(endpoint.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVER: &str = "https://mcp.example.com/sse";

    fn exchange() -> LegacyExchange {
        let mut exchange =
            LegacyExchange::new(SERVER, "tools/call", json!({"name": "echo"})).unwrap();
        assert_eq!(
            exchange.opened(200, Some("text/event-stream; charset=utf-8")),
            LegacyStep::Read
        );
        exchange
    }

    fn posted_body(step: &LegacyStep) -> (String, Value) {
        match step {
            LegacyStep::Post { url, request } => {
                (url.clone(), serde_json::from_str(&request.body).unwrap())
            }
            other => panic!("not a POST: {other:?}"),
        }
    }

    fn event(name: Option<&str>, data: &Value) -> String {
        match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        }
    }

    fn response(id: u64, result: Value) -> String {
        event(
            Some("message"),
            &json!({"jsonrpc": "2.0", "id": id, "result": result}),
        )
    }

    /// The whole conversation, the stream given to `read` in pieces of `piece` bytes.
    fn run(piece: usize) -> (Vec<String>, Result<Value, McpError>, Vec<ProgressNote>) {
        let mut exchange = exchange();
        let mut posts = Vec::new();
        let mut stream =
            String::from(": hello\n\nevent: endpoint\ndata: /message?sessionId=abc\n\n");
        let mut step = LegacyStep::Read;
        let mut offset = 0;
        let mut progress = Vec::new();
        loop {
            match step {
                LegacyStep::Read => {
                    assert!(
                        offset < stream.len(),
                        "the machine waits for more than was sent"
                    );
                    let end = (offset + piece).min(stream.len());
                    step = exchange.read(&stream.as_bytes()[offset..end]);
                    offset = end;
                }
                LegacyStep::Post { url, request } => {
                    let body: Value = serde_json::from_str(&request.body).unwrap();
                    posts.push(format!("{url} {}", body["method"].as_str().unwrap()));
                    // The server answers on the stream.
                    match body["method"].as_str().unwrap() {
                        "initialize" => stream.push_str(&response(
                            1,
                            json!({"protocolVersion": "2024-11-05", "capabilities": {}}),
                        )),
                        "notifications/initialized" => {}
                        _ => {
                            stream.push_str(&event(None, &json!({"jsonrpc": "2.0",
                                "method": "notifications/progress",
                                "params": {"progressToken": 1, "progress": 1, "total": 2, "message": "half"}})));
                            stream.push_str(&response(2, json!({"content": []})));
                        }
                    }
                    step = exchange.posted(202);
                }
                LegacyStep::Done(result) => {
                    progress.extend(exchange.take_progress());
                    return (posts, result, progress);
                }
            }
        }
    }

    #[test]
    fn a_request_opens_a_session_on_the_stream_at_every_piece_size() {
        for piece in [1, 2, 3, 7, 64, 4096] {
            let (posts, result, progress) = run(piece);
            assert_eq!(
                posts,
                [
                    "https://mcp.example.com/message?sessionId=abc initialize",
                    "https://mcp.example.com/message?sessionId=abc notifications/initialized",
                    "https://mcp.example.com/message?sessionId=abc tools/call",
                ],
                "piece {piece}"
            );
            assert_eq!(result, Ok(json!({"content": []})), "piece {piece}");
            assert_eq!(progress.len(), 1);
            assert_eq!(progress[0].line(), "[progress 1/2] half\n");
        }
    }

    #[test]
    fn the_initialize_request_asks_for_the_legacy_revision() {
        let mut exchange = exchange();
        let step = exchange.read(b"event: endpoint\ndata: /message\n\n");
        let (url, body) = posted_body(&step);
        assert_eq!(url, "https://mcp.example.com/message");
        assert_eq!(body["params"]["protocolVersion"], "2024-11-05");
        assert_eq!(body["id"], 1);
        // Nothing else arrived: the host reads.
        assert_eq!(exchange.posted(202), LegacyStep::Read);
    }

    #[test]
    fn endpoints_off_the_servers_origin_are_refused() {
        let cases = [
            (
                "/message?sessionId=1",
                Ok("https://mcp.example.com/message?sessionId=1"),
            ),
            ("message", Ok("https://mcp.example.com/message")),
            (
                "https://mcp.example.com:443/m",
                Ok("https://mcp.example.com/m"),
            ),
            (
                "https://evil.example.com/message",
                Err("not on the server's origin"),
            ),
            (
                "http://mcp.example.com/message",
                Err("not on the server's origin"),
            ),
            (
                "https://mcp.example.com:8443/message",
                Err("not on the server's origin"),
            ),
            ("//evil.example.com/x", Err("not on the server's origin")),
        ];
        for (data, expected) in cases {
            let mut exchange = exchange();
            let step = exchange.read(format!("event: endpoint\ndata: {data}\n\n").as_bytes());
            match (expected, step) {
                (Ok(url), LegacyStep::Post { url: got, .. }) => assert_eq!(got, url, "{data}"),
                (Err(message), LegacyStep::Done(Err(e))) => {
                    assert!(e.to_string().contains(message), "{data}: {e}")
                }
                (expected, step) => panic!("{data}: {step:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn failures_are_errors_that_say_what_happened() {
        // The GET.
        let mut e = LegacyExchange::new(SERVER, "tools/list", Value::Null).unwrap();
        assert!(matches!(
            e.opened(401, Some("text/event-stream")),
            LegacyStep::Done(Err(McpError::Http { status: 401, .. }))
        ));
        let mut e = LegacyExchange::new(SERVER, "tools/list", Value::Null).unwrap();
        let LegacyStep::Done(Err(error)) = e.opened(200, Some("application/json")) else {
            panic!()
        };
        assert!(
            error.to_string().contains("leave \"transport\" out"),
            "{error}"
        );
        let mut e = LegacyExchange::new(SERVER, "tools/list", Value::Null).unwrap();
        let LegacyStep::Done(Err(error)) = e.opened(400, Some("application/json")) else {
            panic!()
        };
        assert!(
            error
                .to_string()
                .starts_with("HTTP 400: its event stream did not open"),
            "{error}"
        );
        assert!(LegacyExchange::new("not a url", "x", Value::Null).is_err());

        // A POST refused.
        let mut e = exchange();
        let _ = e.read(b"event: endpoint\ndata: /m\n\n");
        assert!(matches!(
            e.posted(400),
            LegacyStep::Done(Err(McpError::Http { status: 400, .. }))
        ));

        // The stream ends early, at each phase.
        let mut e = exchange();
        let LegacyStep::Done(Err(error)) = e.ended() else {
            panic!()
        };
        assert!(
            error.to_string().contains("before its endpoint event"),
            "{error}"
        );
        let mut e = exchange();
        let _ = e.read(b"event: endpoint\ndata: /m\n\n");
        assert_eq!(e.posted(202), LegacyStep::Read);
        let LegacyStep::Done(Err(error)) = e.ended() else {
            panic!()
        };
        assert!(
            error
                .to_string()
                .contains("before the response to initialize"),
            "{error}"
        );

        // Not JSON, not JSON-RPC, an unknown revision, an error response.
        for (message, expected) in [
            ("data: {nope\n\n".to_string(), "not JSON"),
            (
                event(None, &json!({"id": 1, "result": {}})),
                "not JSON-RPC 2.0",
            ),
            (
                response(1, json!({"protocolVersion": "2023-01-01"})),
                "protocol revision \"2023-01-01\"",
            ),
            (
                event(
                    None,
                    &json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32600, "message": "no"}}),
                ),
                "error -32600: no",
            ),
        ] {
            let mut e = exchange();
            let _ = e.read(b"event: endpoint\ndata: /m\n\n");
            assert_eq!(e.posted(202), LegacyStep::Read);
            let LegacyStep::Done(Err(error)) = e.read(message.as_bytes()) else {
                panic!("{message}")
            };
            assert!(error.to_string().contains(expected), "{message}: {error}");
        }
    }

    #[test]
    fn the_stream_is_bounded() {
        let mut e = exchange();
        let _ = e.read(b"event: endpoint\ndata: /m\n\n");
        let _ = e.posted(202);
        let chunk = vec![b':'; 1024 * 1024];
        let mut last = LegacyStep::Read;
        for _ in 0..5 {
            last = e.read(&chunk);
            if matches!(last, LegacyStep::Done(_)) {
                break;
            }
        }
        assert_eq!(last, LegacyStep::Done(Err(McpError::TooLarge)));
    }

    #[test]
    fn what_is_not_for_this_exchange_is_ignored() {
        let mut e = exchange();
        // Messages before the endpoint, a response to another id, the server's own request.
        let step =
            e.read(format!("{}event: endpoint\ndata: /m\n\n", response(9, json!({}))).as_bytes());
        assert!(matches!(step, LegacyStep::Post { .. }));
        assert_eq!(e.posted(202), LegacyStep::Read);
        let noise = format!(
            "{}{}{}",
            response(7, json!({})),
            event(None, &json!({"jsonrpc": "2.0", "id": 5, "method": "ping"})),
            event(Some("other"), &json!({"x": 1})),
        );
        assert_eq!(e.read(noise.as_bytes()), LegacyStep::Read);
        let step = e.read(response(1, json!({"protocolVersion": "2025-03-26"})).as_bytes());
        let (_, body) = posted_body(&step);
        assert_eq!(body["method"], "notifications/initialized");
    }
}
