//! One request to a server over the streamable HTTP transport (revision 2025-06-18), as a
//! machine the host drives: it says which HTTP request to send next ([`Step::Send`]), the host
//! sends it and reads the answer with an [`AnswerReader`], and hands back an [`Answer`].
//!
//! An exchange opens an MCP session when it has none (`initialize`, then the
//! `notifications/initialized` notification), sends the request with the session's
//! `Mcp-Session-Id` and `MCP-Protocol-Version`, and, when a kept session has expired (`404`),
//! opens a new one and sends the request again, once.

use serde_json::{Value, json};

use crate::sse::{SseDecoder, SseItem};

/// The revision this client asks for.
pub const CLIENT_PROTOCOL_VERSION: &str = "2025-06-18";
/// The revisions it accepts from a server (the streamable HTTP transport's).
pub const ACCEPTED_PROTOCOL_VERSIONS: [&str; 2] = ["2025-06-18", "2025-03-26"];
/// The most bytes one answer may hold (a JSON body, or an event stream until the response).
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// The most progress notes one answer keeps (the latest win).
pub const MAX_PROGRESS_NOTES: usize = 64;
/// The longest part of an error body quoted in an error.
const QUOTED_BODY_CHARS: usize = 300;

/// An MCP session with a server, kept between calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpSession {
    /// The `Mcp-Session-Id` the server assigned (none: a server without sessions).
    pub id: Option<String>,
    /// The revision the server answered `initialize` with.
    pub protocol_version: String,
}

/// Why a request to a server failed. Its text is what the agent sees after the server's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// The request could not be sent, or its answer not read (said by the host).
    #[error("the request failed: {0}")]
    Transport(String),
    /// No answer within the server's timeout.
    #[error("no answer within {0} s")]
    Timeout(u32),
    /// An HTTP status other than success.
    #[error("HTTP {status}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Http {
        /// The status.
        status: u16,
        /// The head of the body.
        detail: String,
    },
    /// A JSON-RPC error answer.
    #[error("error {code}: {message}")]
    Rpc {
        /// Its code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// An answer that is not what the protocol says.
    #[error("a malformed answer: {0}")]
    Malformed(String),
    /// An answer larger than [`MAX_ANSWER_BYTES`].
    #[error("the answer is larger than {} MiB", MAX_ANSWER_BYTES / (1024 * 1024))]
    TooLarge,
}

/// A request the host sends to the server's URL. The host adds the credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    /// The headers, besides `Authorization`.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON-RPC message.
    pub body: String,
    /// The id of the request whose response ends the answer; `None`: a notification.
    pub expects: Option<u64>,
}

impl HttpRequest {
    /// The reader for this request's answer, given its `Content-Type`.
    pub fn reader(&self, content_type: Option<&str>) -> AnswerReader {
        AnswerReader::new(content_type, self.expects)
    }
}

/// What came back.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The HTTP status (0 when none came: the body says why).
    pub status: u16,
    /// Its `Mcp-Session-Id` header.
    pub session_id: Option<String>,
    /// The JSON-RPC response to the request (`Ok(None)`: none was expected or the body was
    /// empty), or why it could not be read.
    pub body: Result<Option<Value>, McpError>,
}

/// What the host does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Send this.
    Send(HttpRequest),
    /// The request's result, or why it failed.
    Done(Result<Value, McpError>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Initializing,
    Notifying,
    Requesting,
    Done,
}

/// One request, with whatever opening a session it takes.
#[derive(Debug)]
pub struct Exchange {
    session: Option<McpSession>,
    method: String,
    params: Value,
    phase: Phase,
    /// Whether the session was opened again already (after a `404`).
    reopened: bool,
    /// Whether the session was opened by this exchange (a `404` then is final).
    opened_here: bool,
    next_id: u64,
}

impl Exchange {
    /// A request of `method` with `params`, in `session` when one is kept.
    pub fn new(session: Option<McpSession>, method: &str, params: Value) -> Exchange {
        Exchange {
            session,
            method: method.to_string(),
            params,
            phase: Phase::Initializing,
            reopened: false,
            opened_here: false,
            next_id: 1,
        }
    }

    /// The first request to send.
    pub fn start(&mut self) -> Step {
        if self.session.is_some() {
            self.request()
        } else {
            self.initialize()
        }
    }

    /// The session to keep for the next exchange with the server.
    pub fn session(&self) -> Option<&McpSession> {
        self.session.as_ref()
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("accept", "application/json, text/event-stream".to_string()),
        ];
        if let Some(session) = &self.session {
            headers.push(("mcp-protocol-version", session.protocol_version.clone()));
            if let Some(id) = &session.id {
                headers.push(("mcp-session-id", id.clone()));
            }
        }
        headers
    }

    fn initialize(&mut self) -> Step {
        self.phase = Phase::Initializing;
        self.session = None;
        self.opened_here = true;
        let id = self.id();
        let body = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "initialize",
            "params": {
                "protocolVersion": CLIENT_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "wuhu", "version": env!("CARGO_PKG_VERSION")},
            },
        });
        Step::Send(HttpRequest {
            headers: self.headers(),
            body: body.to_string(),
            expects: Some(id),
        })
    }

    fn request(&mut self) -> Step {
        self.phase = Phase::Requesting;
        let id = self.id();
        let mut body = json!({"jsonrpc": "2.0", "id": id, "method": self.method});
        if !self.params.is_null() {
            body["params"] = self.params.clone();
        }
        Step::Send(HttpRequest {
            headers: self.headers(),
            body: body.to_string(),
            expects: Some(id),
        })
    }

    fn fail(&mut self, error: McpError) -> Step {
        self.phase = Phase::Done;
        Step::Done(Err(error))
    }

    /// The answer to the last request sent: the next step.
    pub fn answered(&mut self, answer: Answer) -> Step {
        // No HTTP answer at all: the host says why.
        if let Err(e @ (McpError::Transport(_) | McpError::Timeout(_))) = &answer.body {
            let e = e.clone();
            return self.fail(e);
        }
        let ok = (200..300).contains(&answer.status);
        match self.phase {
            Phase::Done => Step::Done(Err(McpError::Malformed(
                "an answer after the exchange ended".into(),
            ))),
            Phase::Initializing => {
                if !ok {
                    return self.fail(http_error(&answer));
                }
                let result = match response_result(answer.body) {
                    Ok(result) => result,
                    Err(e) => return self.fail(e),
                };
                let Some(version) = result.get("protocolVersion").and_then(Value::as_str) else {
                    return self.fail(McpError::Malformed(
                        "initialize answered without a protocolVersion".into(),
                    ));
                };
                if !ACCEPTED_PROTOCOL_VERSIONS.contains(&version) {
                    return self.fail(McpError::Malformed(format!(
                        "the server speaks protocol revision {version:?}; this client speaks {}",
                        ACCEPTED_PROTOCOL_VERSIONS.join(" and ")
                    )));
                }
                self.session = Some(McpSession {
                    id: answer.session_id.filter(|id| valid_session_id(id)),
                    protocol_version: version.to_string(),
                });
                self.phase = Phase::Notifying;
                Step::Send(HttpRequest {
                    headers: self.headers(),
                    body: json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                        .to_string(),
                    expects: None,
                })
            }
            Phase::Notifying => {
                if !ok {
                    return self.fail(http_error(&answer));
                }
                self.request()
            }
            Phase::Requesting => {
                let had_id = self.session.as_ref().is_some_and(|s| s.id.is_some());
                if answer.status == 404 && had_id && !self.opened_here && !self.reopened {
                    // The kept session expired: open a new one and send the request again.
                    self.reopened = true;
                    return self.initialize();
                }
                if !ok {
                    return self.fail(http_error(&answer));
                }
                match response_result(answer.body) {
                    Ok(result) => {
                        self.phase = Phase::Done;
                        Step::Done(Ok(result))
                    }
                    Err(e) => self.fail(e),
                }
            }
        }
    }
}

/// A session id is visible ASCII (0x21 to 0x7E), as the transport requires; a server that
/// sends another is treated as having none.
fn valid_session_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 1024 && id.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

fn http_error(answer: &Answer) -> McpError {
    let detail = match &answer.body {
        Ok(Some(message)) => match message.get("error") {
            Some(error) => error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            None => String::new(),
        },
        _ => String::new(),
    };
    McpError::Http {
        status: answer.status,
        detail: detail.chars().take(QUOTED_BODY_CHARS).collect(),
    }
}

/// The `result` of a response, or its error.
pub(super) fn response_result(body: Result<Option<Value>, McpError>) -> Result<Value, McpError> {
    let Some(message) = body? else {
        return Err(McpError::Malformed("no response in the answer".into()));
    };
    if let Some(error) = message.get("error") {
        return Err(McpError::Rpc {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
                .chars()
                .take(QUOTED_BODY_CHARS * 4)
                .collect(),
        });
    }
    message
        .get("result")
        .cloned()
        .ok_or_else(|| McpError::Malformed("a response with neither result nor error".into()))
}

/// The media type of a `Content-Type` (lower case, without parameters; empty when none).
pub(super) fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A progress notification a server sent while a request ran (`notifications/progress`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressNote {
    /// How far (the server's unit).
    pub progress: f64,
    /// Of how much, when known.
    pub total: Option<f64>,
    /// What it says.
    pub message: Option<String>,
}

impl ProgressNote {
    /// The note a message is, when it is a `notifications/progress` (its message cut to 500
    /// characters).
    pub fn of(message: &Value) -> Option<ProgressNote> {
        if message.get("method").and_then(Value::as_str) != Some("notifications/progress") {
            return None;
        }
        let params = message.get("params")?;
        Some(ProgressNote {
            progress: params.get("progress").and_then(Value::as_f64)?,
            total: params.get("total").and_then(Value::as_f64),
            message: params
                .get("message")
                .and_then(Value::as_str)
                .map(|m| m.chars().take(500).collect()),
        })
    }

    /// One line for a follower: `[progress 3/10] message`.
    pub fn line(&self) -> String {
        let amount = match self.total {
            Some(total) => format!("{}/{}", self.progress, total),
            None => format!("{}", self.progress),
        };
        match &self.message {
            Some(message) => format!("[progress {amount}] {message}\n"),
            None => format!("[progress {amount}]\n"),
        }
    }
}

#[derive(Debug)]
enum Reading {
    /// `application/json`: the whole body.
    Json(Vec<u8>),
    /// `text/event-stream`: messages until the response.
    Events(SseDecoder),
    /// Anything else (read, for the error's sake).
    Other(String),
}

/// Reads one answer's body, in pieces: a JSON body whole, an event stream until the response
/// to the request arrives (a server may keep the stream open after it). Bounded by
/// [`MAX_ANSWER_BYTES`].
#[derive(Debug)]
pub struct AnswerReader {
    reading: Reading,
    expects: Option<u64>,
    bytes: usize,
    response: Option<Value>,
    progress: Vec<ProgressNote>,
}

impl AnswerReader {
    /// A reader for a body of `content_type`, answering the request `expects`.
    pub fn new(content_type: Option<&str>, expects: Option<u64>) -> AnswerReader {
        let media = media_type(content_type);
        let reading = match media.as_str() {
            "application/json" => Reading::Json(Vec::new()),
            "text/event-stream" => Reading::Events(SseDecoder::new(MAX_ANSWER_BYTES)),
            _ => Reading::Other(media),
        };
        AnswerReader {
            reading,
            expects,
            bytes: 0,
            response: None,
            progress: Vec::new(),
        }
    }

    /// Takes the next piece of the body: `Ok(true)` once the response has arrived (the host
    /// stops reading).
    ///
    /// # Errors
    /// [`McpError::TooLarge`] past the bound, [`McpError::Malformed`] for an event that is
    /// not JSON-RPC.
    pub fn push(&mut self, chunk: &[u8]) -> Result<bool, McpError> {
        self.bytes = self.bytes.saturating_add(chunk.len());
        if self.bytes > MAX_ANSWER_BYTES {
            return Err(McpError::TooLarge);
        }
        match &mut self.reading {
            Reading::Json(body) => {
                body.extend_from_slice(chunk);
                Ok(false)
            }
            Reading::Other(_) => Ok(false),
            Reading::Events(decoder) => {
                let mut items = Vec::new();
                decoder
                    .push(chunk, &mut items)
                    .map_err(|_| McpError::TooLarge)?;
                self.take_events(items)
            }
        }
    }

    fn take_events(&mut self, items: Vec<SseItem>) -> Result<bool, McpError> {
        for item in items {
            let SseItem::Frame(frame) = item else {
                continue;
            };
            if frame.data.trim().is_empty() {
                continue;
            }
            let message: Value = serde_json::from_str(&frame.data)
                .map_err(|e| McpError::Malformed(format!("an event that is not JSON ({e})")))?;
            self.take_message(message)?;
            if self.response.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn take_message(&mut self, message: Value) -> Result<(), McpError> {
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(McpError::Malformed(
                "a message that is not JSON-RPC 2.0".into(),
            ));
        }
        let is_response = message.get("result").is_some() || message.get("error").is_some();
        if is_response {
            if message.get("id").and_then(Value::as_u64) == self.expects {
                self.response = Some(message);
            }
            // A response to another request (none is outstanding): ignored.
            return Ok(());
        }
        if let Some(note) = ProgressNote::of(&message) {
            if self.progress.len() == MAX_PROGRESS_NOTES {
                self.progress.remove(0);
            }
            self.progress.push(note);
        }
        // Other notifications, and requests from the server (sampling, elicitation, roots:
        // capabilities this client does not declare), are not answered.
        Ok(())
    }

    /// Progress notes read since the last call.
    pub fn take_progress(&mut self) -> Vec<ProgressNote> {
        std::mem::take(&mut self.progress)
    }

    /// The body ended (or the response arrived): the response, if one was expected.
    ///
    /// # Errors
    /// [`McpError::Malformed`]: not JSON, not JSON-RPC, no response to the request, an
    /// unexpected content type.
    pub fn finish(mut self) -> Result<Option<Value>, McpError> {
        if let Some(response) = self.response.take() {
            // What follows the response (a stream left open, cut anywhere) is not read.
            return Ok(Some(response));
        }
        let reading = std::mem::replace(&mut self.reading, Reading::Other(String::new()));
        match reading {
            Reading::Json(body) => {
                if body.iter().all(u8::is_ascii_whitespace) {
                    return match self.expects {
                        None => Ok(None),
                        Some(_) => Err(McpError::Malformed("an empty body".into())),
                    };
                }
                let value: Value = serde_json::from_slice(&body)
                    .map_err(|e| McpError::Malformed(format!("a body that is not JSON ({e})")))?;
                // Revision 2025-03-26 allowed a batch: its messages are read one by one.
                match value {
                    Value::Array(messages) => {
                        for message in messages {
                            self.take_message(message)?;
                        }
                    }
                    message => self.take_message(message)?,
                }
            }
            Reading::Events(mut decoder) => {
                let mut items = Vec::new();
                decoder.finish(&mut items).map_err(|_| McpError::TooLarge)?;
                self.take_events(items)?;
            }
            Reading::Other(media) => {
                if self.expects.is_some() {
                    return Err(McpError::Malformed(format!(
                        "content type {:?}, not application/json or text/event-stream",
                        if media.is_empty() { "(none)" } else { &media }
                    )));
                }
                return Ok(None);
            }
        }
        match (self.expects, self.response) {
            (None, _) => Ok(None),
            (Some(_), Some(response)) => Ok(Some(response)),
            (Some(id), None) => Err(McpError::Malformed(format!(
                "the answer holds no response to request {id}"
            ))),
        }
    }
}
