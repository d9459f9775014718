//! The client WebSocket of a session (`GET /v1/sessions/:id/socket`): its frames, their
//! validation and its close codes. Sans-IO; the Worker reads frames, calls [`parse_client_frame`]
//! and writes what this module encodes. docs/api.md ("Session socket") says the same in prose.
//!
//! **Server → client** frames are text, one JSON object each:
//! * a stream event: exactly the JSON of the follow stream's SSE `data:` (a
//!   [`StreamEvent`], tagged by `type`); an `entry_appended`'s cursor (SSE's `id:`) is its
//!   `entry.cursor`. The events, their order and the rules (backfill, dedupe by cursor, `status`
//!   after the backfill, `lagged`, the buffer bound) are those of `wuhu_core::follow`;
//! * a reply to a client frame: [`ReplyFrame`], `{"type":"reply","id",...}` with the HTTP
//!   status and either `body` (the HTTP route's JSON answer) or `error` (`{code, message}` as
//!   the HTTP error body has it).
//!
//! **Client → server** frames are text, at most [`MAX_CLIENT_FRAME_BYTES`]: [`ClientFrame`], each
//! with a client-chosen `id` (1 to [`MAX_FRAME_ID_CHARS`] characters) that the one reply echoes.
//! A frame that cannot be read gets a reply with `id: null` unless its `id` could be read.

use serde::{Deserialize, Serialize};

use crate::follow::EndReason;
use crate::wire::{CancelRequest, EnqueueRequest, ErrorDetail, StreamEvent};

/// Largest client frame accepted, in bytes; a larger one is answered with 413
/// `payload_too_large` (the socket stays open). Below the runtime's own WebSocket message limit
/// (1 MiB), so the answer is ours, not a dropped connection. An enqueue over the socket may
/// therefore carry less text than `POST /enqueue` (1 MiB body).
pub const MAX_CLIENT_FRAME_BYTES: usize = 256 * 1024;
/// Longest frame `id`, in characters.
pub const MAX_FRAME_ID_CHARS: usize = 128;

/// Close code: the credential the socket was opened with is no longer live (revoked, logged
/// out, expired). A reconnect gets 401.
pub const CLOSE_REVOKED: u16 = 4401;
/// Close code: the session was deleted. A reconnect gets 404.
pub const CLOSE_DELETED: u16 = 4404;
/// Close code: the socket fell too far behind (the `lagged` event says at which cursor);
/// reconnect with `?after=<cursor>` to resume losslessly.
pub const CLOSE_LAGGED: u16 = 4429;
/// Close code: reading the transcript or checking the credential failed; reconnect with
/// `?after=<last cursor>` to resume.
pub const CLOSE_FAILED: u16 = 4500;
/// Close code: the actor lost the socket's state (its attachment); reconnect with `?after=`.
pub const CLOSE_LOST_STATE: u16 = 1011;

/// The close code (and reason) for a stream that ended.
pub fn close_code(reason: EndReason) -> (u16, &'static str) {
    match reason {
        EndReason::Revoked => (CLOSE_REVOKED, "credential revoked"),
        EndReason::Deleted => (CLOSE_DELETED, "session deleted"),
        EndReason::Lagged => (CLOSE_LAGGED, "lagged"),
        EndReason::Failed => (CLOSE_FAILED, "stream failed; reconnect to resume"),
        EndReason::Done => (1000, "done"),
    }
}

/// A frame from the client.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientFrame {
    /// `POST /v1/sessions/:id/enqueue?lane=`: the same body, the same checks.
    Enqueue {
        /// Echoed in the reply.
        id: String,
        /// `steer` or `followUp` (the default), as the HTTP route's `lane` parameter.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lane: Option<String>,
        /// The HTTP route's body.
        body: EnqueueRequest,
    },
    /// `POST /v1/sessions/:id/stop`.
    Stop {
        /// Echoed in the reply.
        id: String,
    },
    /// `POST /v1/sessions/:id/cancel`: the same body (`{"id": <queue item id>}`).
    Cancel {
        /// Echoed in the reply.
        id: String,
        /// The HTTP route's body.
        body: CancelRequest,
    },
}

impl ClientFrame {
    /// The client's `id`.
    pub fn id(&self) -> &str {
        match self {
            ClientFrame::Enqueue { id, .. }
            | ClientFrame::Stop { id }
            | ClientFrame::Cancel { id, .. } => id,
        }
    }
}

/// The answer to one client frame. `B` is the body's type: the route's answer when encoding
/// (no intermediate JSON value), any JSON when decoding.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReplyFrame<B = serde_json::Value> {
    /// Exactly one per client frame.
    Reply {
        /// The frame's `id`; `null` when the frame's `id` could not be read.
        id: Option<String>,
        /// The HTTP status the route would have answered.
        status: u16,
        /// On success: the HTTP route's JSON answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<B>,
        /// On failure: the HTTP error's `{code, message}`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorDetail>,
    },
}

impl<B: Serialize> ReplyFrame<B> {
    /// A success.
    pub fn ok(id: &str, status: u16, body: B) -> ReplyFrame<B> {
        ReplyFrame::Reply {
            id: Some(id.to_string()),
            status,
            body: Some(body),
            error: None,
        }
    }

    /// A failure.
    pub fn error(id: Option<&str>, status: u16, code: &str, message: impl Into<String>) -> Self {
        ReplyFrame::Reply {
            id: id.map(str::to_string),
            status,
            body: None,
            error: Some(ErrorDetail {
                code: code.to_string(),
                message: message.into(),
            }),
        }
    }

    /// The frame's text.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"type":"reply","id":null,"status":500,"error":{"code":"internal","message":"reply serialisation failed"}}"#
                .to_string()
        })
    }
}

/// Any server frame, for clients.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum ServerFrame {
    /// A reply.
    Reply(ReplyFrame),
    /// A stream event.
    Event(StreamEvent),
}

/// A client frame that cannot be handled: the reply to send (the socket stays open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError {
    /// The frame's `id`, when it could be read.
    pub id: Option<String>,
    /// HTTP status.
    pub status: u16,
    /// Error code.
    pub code: &'static str,
    /// Message.
    pub message: String,
}

impl FrameError {
    fn bad(id: Option<String>, message: impl Into<String>) -> FrameError {
        FrameError {
            id,
            status: 400,
            code: "bad_request",
            message: message.into(),
        }
    }

    /// Its reply.
    pub fn reply(&self) -> ReplyFrame<()> {
        ReplyFrame::error(self.id.as_deref(), self.status, self.code, &self.message)
    }
}

/// Reads a client frame (`None`: a binary frame).
///
/// # Errors
/// The reply for a frame that is binary, too large, not a JSON object, without a valid `id`, of
/// an unknown `type`, or whose fields do not fit the type.
pub fn parse_client_frame(
    text: Option<&str>,
    binary_len: usize,
) -> Result<ClientFrame, FrameError> {
    let Some(text) = text else {
        if binary_len > MAX_CLIENT_FRAME_BYTES {
            return Err(too_large());
        }
        return Err(FrameError::bad(None, "frames must be text (JSON)"));
    };
    if text.len() > MAX_CLIENT_FRAME_BYTES {
        return Err(too_large());
    }
    // First only `id` and `type` (other fields skipped), so that any later refusal names the
    // frame's `id`.
    let envelope: Envelope = serde_json::from_str(text).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            FrameError::bad(None, format!("invalid json frame: {e}"))
        } else {
            not_an_object()
        }
    })?;
    if !text.trim_start().starts_with('{') {
        return Err(not_an_object());
    }
    let id = match envelope.id {
        Some(serde_json::Value::String(id))
            if !id.is_empty() && id.chars().count() <= MAX_FRAME_ID_CHARS =>
        {
            id
        }
        _ => {
            return Err(FrameError::bad(
                None,
                format!(
                    "a frame needs an \"id\": a string of 1 to {MAX_FRAME_ID_CHARS} characters"
                ),
            ));
        }
    };
    let kind = match envelope.kind.as_ref().and_then(|t| t.as_str()) {
        Some("enqueue") => Kind::Enqueue,
        Some("stop") => Kind::Stop,
        Some("cancel") => Kind::Cancel,
        Some(other) => {
            return Err(FrameError::bad(
                Some(id),
                format!(
                    "unknown frame type {:?}: use enqueue, stop or cancel",
                    other.chars().take(64).collect::<String>()
                ),
            ));
        }
        None => return Err(FrameError::bad(Some(id), "a frame needs a \"type\"")),
    };
    // Then every field, flat (no buffering of a tagged enum: a smaller Worker), and which of
    // them this type takes.
    let wire: WireFrame = serde_json::from_str(text)
        .map_err(|e| FrameError::bad(Some(id.clone()), format!("bad frame: {e}")))?;
    let refuse = |what: &str| {
        Err(FrameError::bad(
            Some(id.clone()),
            format!("bad frame: {what}"),
        ))
    };
    match (kind, wire.lane, wire.body) {
        (Kind::Stop | Kind::Cancel, Some(_), _) => refuse("unknown field `lane`"),
        (Kind::Enqueue | Kind::Cancel, _, None) => refuse("missing field `body`"),
        (Kind::Stop, None, Some(_)) => refuse("unknown field `body`"),
        (Kind::Stop, None, None) => Ok(ClientFrame::Stop { id }),
        (Kind::Enqueue, lane, Some(body)) => match (body.content, body.id) {
            (_, Some(_)) => refuse("unknown field `id` in `body`"),
            (None, None) => refuse("missing field `content` in `body`"),
            (Some(content), None) => Ok(ClientFrame::Enqueue {
                id,
                lane,
                body: EnqueueRequest { content },
            }),
        },
        (Kind::Cancel, None, Some(body)) => match (body.content, body.id) {
            (Some(_), _) => refuse("unknown field `content` in `body`"),
            (None, None) => refuse("missing field `id` in `body`"),
            (None, Some(item)) => Ok(ClientFrame::Cancel {
                id,
                body: CancelRequest { id: item },
            }),
        },
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Enqueue,
    Stop,
    Cancel,
}

/// `id` and `type` of a client frame; other fields are skipped.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default, rename = "type")]
    kind: Option<serde_json::Value>,
}

/// Every field a client frame may have.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireFrame {
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: String,
    #[allow(dead_code)]
    id: serde_json::Value,
    #[serde(default)]
    lane: Option<String>,
    #[serde(default)]
    body: Option<WireBody>,
}

/// Every field a client frame's `body` may have (`enqueue`: `content`; `cancel`: `id`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireBody {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    id: Option<String>,
}

fn not_an_object() -> FrameError {
    FrameError::bad(None, "a frame must be a JSON object")
}

fn too_large() -> FrameError {
    FrameError {
        id: None,
        status: 413,
        code: "payload_too_large",
        message: format!("frame exceeds {MAX_CLIENT_FRAME_BYTES} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClientFrame, FrameError> {
        parse_client_frame(Some(text), 0)
    }

    #[test]
    fn client_frames_table() {
        let long_id = "x".repeat(MAX_FRAME_ID_CHARS + 1);
        let ok_id = "x".repeat(MAX_FRAME_ID_CHARS);
        // (frame, Ok(type) | Err((id, status, message fragment)))
        type Want = Result<&'static str, (Option<&'static str>, u16, &'static str)>;
        let cases: Vec<(String, Want)> = vec![
            (
                r#"{"type":"enqueue","id":"a","body":{"content":"hi"}}"#.into(),
                Ok("enqueue"),
            ),
            (
                r#"{"type":"enqueue","id":"a","lane":"steer","body":{"content":"hi"}}"#.into(),
                Ok("enqueue"),
            ),
            // The lane and the content are checked by the route both doors share.
            (
                r#"{"type":"enqueue","id":"a","lane":"system","body":{"content":" "}}"#.into(),
                Ok("enqueue"),
            ),
            (r#"{"type":"stop","id":"s"}"#.into(), Ok("stop")),
            (
                r#"{"type":"cancel","id":"c","body":{"id":"item"}}"#.into(),
                Ok("cancel"),
            ),
            (format!(r#"{{"type":"stop","id":"{ok_id}"}}"#), Ok("stop")),
            ("not json".into(), Err((None, 400, "invalid json frame"))),
            ("[1,2]".into(), Err((None, 400, "JSON object"))),
            (
                r#"{"type":"stop"}"#.into(),
                Err((None, 400, "needs an \"id\"")),
            ),
            (
                r#"{"type":"stop","id":""}"#.into(),
                Err((None, 400, "needs an \"id\"")),
            ),
            (
                r#"{"type":"stop","id":7}"#.into(),
                Err((None, 400, "needs an \"id\"")),
            ),
            (
                format!(r#"{{"type":"stop","id":"{long_id}"}}"#),
                Err((None, 400, "needs an \"id\"")),
            ),
            (
                r#"{"type":"launch","id":"q"}"#.into(),
                Err((Some("q"), 400, "unknown frame type \"launch\"")),
            ),
            (
                r#"{"id":"q"}"#.into(),
                Err((Some("q"), 400, "needs a \"type\"")),
            ),
            (
                r#"{"type":"enqueue","id":"e"}"#.into(),
                Err((Some("e"), 400, "missing field `body`")),
            ),
            (
                r#"{"type":"enqueue","id":"e","body":{"content":"x","extra":1}}"#.into(),
                Err((Some("e"), 400, "unknown field `extra`")),
            ),
            (
                r#"{"type":"stop","id":"s","surprise":true}"#.into(),
                Err((Some("s"), 400, "unknown field `surprise`")),
            ),
            (
                r#"{"type":"cancel","id":"c","body":{}}"#.into(),
                Err((Some("c"), 400, "missing field `id`")),
            ),
            (
                r#"{"type":"stop","id":"s","body":{}}"#.into(),
                Err((Some("s"), 400, "unknown field `body`")),
            ),
            (
                r#"{"type":"cancel","id":"c","lane":"steer","body":{"id":"i"}}"#.into(),
                Err((Some("c"), 400, "unknown field `lane`")),
            ),
            (
                r#"{"type":"cancel","id":"c","body":{"id":"i","content":"x"}}"#.into(),
                Err((Some("c"), 400, "unknown field `content`")),
            ),
            (
                r#"{"type":"enqueue","id":"e","body":{"id":"i","content":"x"}}"#.into(),
                Err((Some("e"), 400, "unknown field `id`")),
            ),
            (
                r#"{"type":"enqueue","id":"e","body":{"content":7}}"#.into(),
                Err((Some("e"), 400, "invalid type")),
            ),
            ("\"text\"".into(), Err((None, 400, "JSON object"))),
            (
                format!(
                    r#"{{"type":"enqueue","id":"big","body":{{"content":"{}"}}}}"#,
                    "a".repeat(MAX_CLIENT_FRAME_BYTES)
                ),
                Err((None, 413, "exceeds")),
            ),
        ];
        for (text, want) in cases {
            let got = parse(&text);
            let shown = text.chars().take(80).collect::<String>();
            match (&got, want) {
                (Ok(frame), Ok(kind)) => {
                    let value = serde_json::to_value(frame).unwrap();
                    assert_eq!(value["type"], kind, "{shown}");
                    assert_eq!(value["id"].as_str(), Some(frame.id()), "{shown}");
                }
                (Err(e), Err((id, status, fragment))) => {
                    assert_eq!(e.id.as_deref(), id, "{shown}");
                    assert_eq!(e.status, status, "{shown}");
                    assert!(e.message.contains(fragment), "{shown}: {}", e.message);
                }
                _ => panic!("{shown}: got {got:?}"),
            }
        }
    }

    #[test]
    fn binary_frames_are_refused() {
        assert_eq!(parse_client_frame(None, 3).unwrap_err().status, 400);
        assert_eq!(
            parse_client_frame(None, MAX_CLIENT_FRAME_BYTES + 1)
                .unwrap_err()
                .status,
            413
        );
    }

    #[test]
    fn client_frames_round_trip() {
        let frames = [
            ClientFrame::Enqueue {
                id: "1".into(),
                lane: Some("steer".into()),
                body: EnqueueRequest {
                    content: "hi".into(),
                },
            },
            ClientFrame::Stop { id: "2".into() },
            ClientFrame::Cancel {
                id: "3".into(),
                body: CancelRequest { id: "item".into() },
            },
        ];
        for frame in frames {
            let text = serde_json::to_string(&frame).unwrap();
            assert_eq!(parse(&text).unwrap(), frame, "{text}");
        }
    }

    #[test]
    fn server_frames_are_replies_or_stream_events() {
        let reply = ReplyFrame::ok("a", 200, serde_json::json!({"id": "item"}));
        assert_eq!(
            reply.encode(),
            r#"{"type":"reply","id":"a","status":200,"body":{"id":"item"}}"#
        );
        let error = FrameError::bad(None, "nope").reply();
        assert_eq!(
            error.encode(),
            r#"{"type":"reply","id":null,"status":400,"error":{"code":"bad_request","message":"nope"}}"#
        );
        for (text, is_reply) in [
            (reply.encode(), true),
            (error.encode(), true),
            (r#"{"type":"idle"}"#.to_string(), false),
            (r#"{"type":"lagged","cursor":4}"#.to_string(), false),
            (
                r#"{"type":"assistant_text_delta","delta":"x"}"#.to_string(),
                false,
            ),
        ] {
            let frame: ServerFrame = serde_json::from_str(&text).unwrap();
            assert_eq!(matches!(frame, ServerFrame::Reply(_)), is_reply, "{text}");
        }
    }

    #[test]
    fn close_codes_follow_the_end_reason() {
        let cases = [
            (EndReason::Revoked, CLOSE_REVOKED),
            (EndReason::Deleted, CLOSE_DELETED),
            (EndReason::Lagged, CLOSE_LAGGED),
            (EndReason::Failed, CLOSE_FAILED),
            (EndReason::Done, 1000),
        ];
        for (reason, code) in cases {
            assert_eq!(close_code(reason).0, code, "{reason:?}");
            // Application close codes are 4000-4999; 1000 and 1011 are the standard ones.
            assert!(code == 1000 || (4000..5000).contains(&code));
        }
    }
}
