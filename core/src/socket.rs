//! The client WebSocket of a session (`GET /v1/sessions/:id/socket`): its frames, their
//! validation and its close codes. Sans-IO; the Worker reads frames, calls [`parse_client_frame`]
//! and writes what this module encodes. docs/api.md ("Session socket") says the same in prose.
//!
//! **Server → client** frames are JSON objects. A WebSocket message carries one or more of them,
//! separated by `\n` (JSON text has no raw newline): the events a socket has ready go out together,
//! up to [`MESSAGE_BYTES`] per message ([`MessagePacker`]), as an SSE stream writes several
//! events per chunk; a reply is a message of its own. A client splits every message at `\n`.
//! A frame is:
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
//! A frame that cannot be read gets a reply with `id: null` unless its `id` could be read. The
//! exception is `ack` (`{"type":"ack","received":N}`), which has no `id` and gets no reply.
//!
//! **Flow control** ([`AckWindow`]): a WebSocket `send` never waits and the runtime tells nothing
//! of what is unsent, so the client says what it read: `received` is the number of server frames
//! (events and replies) it has received on this socket. The server sends stream events only
//! while the frames sent and not acknowledged are fewer than [`MAX_UNACKED_FRAMES`] and their
//! bytes fewer than [`MAX_UNACKED_BYTES`] (the window; one frame may pass it, so one entry larger
//! than the window still goes out); then it stops sending and the events wait in the follow
//! queue, whose bound lags the socket (`lagged`, close 4429, resumable) as it lags a slow SSE
//! follower. Replies are not held back, but a frame that arrives when twice the window is
//! unacknowledged ends the socket the same way (unrun).

use std::collections::VecDeque;

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

/// Server frames sent and not acknowledged after which a socket's stream events wait (the
/// frame-count half of the window; bounds the runtime's per-message overhead for tiny frames).
pub const MAX_UNACKED_FRAMES: u64 = 256;
/// Bytes of server frames sent and not acknowledged after which a socket's stream events wait.
/// With one frame over it, this is what one socket may have in the runtime's send buffer; a
/// session's [`crate::follow::MAX_FOLLOWERS`] sockets together at most 64 MiB plus one frame each.
pub const MAX_UNACKED_BYTES: u64 = 256 * 1024;
/// What a client is expected to do: ack at least every this many frames received...
pub const ACK_EVERY_FRAMES: u64 = MAX_UNACKED_FRAMES / 4;
/// ... and at least every this many bytes received (a quarter of the window, so a client that
/// keeps up and acks as asked is never held back by one round trip).
pub const ACK_EVERY_BYTES: u64 = MAX_UNACKED_BYTES / 4;

/// Most bytes of frames packed into one server message (a larger frame is a message alone). Per
/// message the runtime and any proxy pay a fixed cost; 200 sockets each sent a message per
/// delta spent more on that than on the events (docs/benchmarks.md, follower lag).
pub const MESSAGE_BYTES: usize = 16 * 1024;

/// Packs a socket's ready frames into messages of at most [`MESSAGE_BYTES`] (one frame larger than
/// that is a message alone), separated by `\n`, in order.
#[derive(Debug, Default)]
pub struct MessagePacker {
    text: String,
}

impl MessagePacker {
    /// Adds a frame (one line of JSON). Returns the message to send first when the frame does
    /// not fit in the one being packed.
    pub fn push(&mut self, frame: &str) -> Option<String> {
        let full = (!self.text.is_empty() && self.text.len() + 1 + frame.len() > MESSAGE_BYTES)
            .then(|| std::mem::take(&mut self.text));
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        self.text.push_str(frame);
        full
    }

    /// The message packed so far, if any (to send before waiting for more).
    pub fn take(&mut self) -> Option<String> {
        (!self.text.is_empty()).then(|| std::mem::take(&mut self.text))
    }
}

/// The frames of one server message, in order.
pub fn frames_of(message: &str) -> impl Iterator<Item = &str> {
    message.split('\n').filter(|frame| !frame.is_empty())
}

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
    /// Flow control: the client has received this many server frames on this socket (events
    /// and replies, counted from 1 since the upgrade). No `id`, no reply.
    Ack {
        /// Server frames received so far.
        received: u64,
    },
}

impl ClientFrame {
    /// The client's `id` (`None`: an `ack`, which has none and gets no reply).
    pub fn id(&self) -> Option<&str> {
        match self {
            ClientFrame::Enqueue { id, .. }
            | ClientFrame::Stop { id }
            | ClientFrame::Cancel { id, .. } => Some(id),
            ClientFrame::Ack { .. } => None,
        }
    }
}

/// What one socket has sent and the client has not acknowledged (see the module's **Flow
/// control**). Sans-IO: the host calls [`AckWindow::sent`] for every frame it sends,
/// [`AckWindow::ack`] for every `ack` frame, and sends a stream event only when
/// [`AckWindow::may_send_event`] says so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AckWindow {
    /// Frames acknowledged (the highest `received`).
    acked: u64,
    /// The bytes of each frame sent and not acknowledged, oldest first (at most about twice
    /// [`MAX_UNACKED_FRAMES`] entries, as nothing more is sent past that).
    sizes: VecDeque<u64>,
    /// Their sum.
    bytes: u64,
}

impl AckWindow {
    /// The window of a socket re-registered after hibernation from what it saved
    /// ([`AckWindow::saved`]): the frame numbering goes on, and the unacknowledged bytes are
    /// released only when the last of the unacknowledged frames is acknowledged (the sizes of
    /// the others were not saved; conservative).
    pub fn restore(sent: u64, unacked_frames: u64, unacked_bytes: u64) -> AckWindow {
        let unacked = unacked_frames.min(sent);
        let mut sizes: VecDeque<u64> = (0..unacked).map(|_| 0).collect();
        if let Some(last) = sizes.back_mut() {
            *last = unacked_bytes;
        }
        AckWindow {
            acked: sent - unacked,
            bytes: if unacked == 0 { 0 } else { unacked_bytes },
            sizes,
        }
    }

    /// What survives hibernation: frames sent, frames and bytes not acknowledged.
    pub fn saved(&self) -> (u64, u64, u64) {
        (self.sent(), self.unacked_frames(), self.bytes)
    }

    /// Frames sent on the socket.
    pub fn sent(&self) -> u64 {
        self.acked + self.unacked_frames()
    }

    /// Frames sent and not acknowledged.
    pub fn unacked_frames(&self) -> u64 {
        self.sizes.len() as u64
    }

    /// Their bytes.
    pub fn unacked_bytes(&self) -> u64 {
        self.bytes
    }

    /// Records a frame of `bytes` sent.
    pub fn record_sent(&mut self, bytes: usize) {
        let bytes = bytes as u64;
        self.sizes.push_back(bytes);
        self.bytes += bytes;
    }

    /// Whether the next stream event may be sent: the window is not full. Everything sent was
    /// acknowledged, or fewer than [`MAX_UNACKED_FRAMES`] frames and [`MAX_UNACKED_BYTES`] bytes
    /// were not (so one frame larger than the window still goes out when nothing else is
    /// unacknowledged).
    pub fn may_send_event(&self) -> bool {
        self.sizes.is_empty()
            || (self.unacked_frames() < MAX_UNACKED_FRAMES && self.bytes < MAX_UNACKED_BYTES)
    }

    /// Whether a client frame may still be run and answered: less than twice the window is
    /// unacknowledged. Otherwise the client sends without reading; the socket is ended
    /// (`lagged`) instead.
    pub fn may_reply(&self) -> bool {
        self.unacked_frames() < 2 * MAX_UNACKED_FRAMES && self.bytes < 2 * MAX_UNACKED_BYTES
    }

    /// An `ack` frame: the client has received `received` frames. An older (smaller) count
    /// changes nothing.
    ///
    /// # Errors
    /// The reply for an ack of more frames than were sent (400 `bad_request`).
    pub fn ack(&mut self, received: u64) -> Result<(), FrameError> {
        if received > self.sent() {
            return Err(FrameError::bad(
                None,
                format!(
                    "ack of {received} frames, but {} were sent on this socket",
                    self.sent()
                ),
            ));
        }
        while self.acked < received {
            let size = self.sizes.pop_front().unwrap_or(0);
            self.bytes = self.bytes.saturating_sub(size);
            self.acked += 1;
        }
        Ok(())
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
    if envelope.kind.as_ref().and_then(|t| t.as_str()) == Some("ack") {
        let ack: WireAck = serde_json::from_str(text)
            .map_err(|e| FrameError::bad(None, format!("bad ack frame: {e}")))?;
        return Ok(ClientFrame::Ack {
            received: ack.received,
        });
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
                    "unknown frame type {:?}: use enqueue, stop, cancel or ack",
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
                body: EnqueueRequest {
                    content,
                    key: body.key,
                    reasoning: body.reasoning,
                },
            }),
        },
        (Kind::Cancel, None, Some(body)) => match (body.content, body.id) {
            _ if body.key.is_some() => refuse("unknown field `key` in `body`"),
            _ if body.reasoning.is_some() => refuse("unknown field `reasoning` in `body`"),
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

/// An `ack` frame: `type` and `received`, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireAck {
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: String,
    received: u64,
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

/// Every field a client frame's `body` may have (`enqueue`: `content` and `key`; `cancel`:
/// `id`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireBody {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    reasoning: Option<crate::llm::reasoning::Reasoning>,
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
            (r#"{"type":"ack","received":0}"#.into(), Ok("ack")),
            (r#"{"received":12,"type":"ack"}"#.into(), Ok("ack")),
            // An ack has no id and gets none back in its error reply.
            (
                r#"{"type":"ack","id":"a","received":1}"#.into(),
                Err((None, 400, "unknown field `id`")),
            ),
            (
                r#"{"type":"ack"}"#.into(),
                Err((None, 400, "missing field `received`")),
            ),
            (
                r#"{"type":"ack","received":-1}"#.into(),
                Err((None, 400, "bad ack frame")),
            ),
            (
                r#"{"type":"ack","received":"3"}"#.into(),
                Err((None, 400, "bad ack frame")),
            ),
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
                r#"{"type":"cancel","id":"c","body":{"id":"i","key":"k"}}"#.into(),
                Err((Some("c"), 400, "unknown field `key`")),
            ),
            // A message's reasoning setting (checked against the model by the route).
            (
                r#"{"type":"enqueue","id":"r","body":{"content":"x","reasoning":{"effort":"high","budgetTokens":2048}}}"#.into(),
                Ok("enqueue"),
            ),
            (
                r#"{"type":"enqueue","id":"r","body":{"content":"x","reasoning":{"effort":"max"}}}"#.into(),
                Err((Some("r"), 400, "unknown variant `max`")),
            ),
            (
                r#"{"type":"cancel","id":"c","body":{"id":"i","reasoning":{"effort":"low"}}}"#.into(),
                Err((Some("c"), 400, "unknown field `reasoning`")),
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
                    assert_eq!(value["id"].as_str(), frame.id(), "{shown}");
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
    fn ready_frames_are_packed_into_messages_in_order() {
        let big = "b".repeat(MESSAGE_BYTES);
        let half = "h".repeat(MESSAGE_BYTES / 2);
        // (frames pushed, messages sent: by `push` when full, then by `take`)
        let cases: Vec<(Vec<&str>, Vec<String>)> = vec![
            (vec![], vec![]),
            (vec!["a"], vec!["a".into()]),
            (vec!["a", "b", "c"], vec!["a\nb\nc".into()]),
            // Two halves and a separator do not fit: the second starts a message.
            (vec![&half, &half], vec![half.clone(), half.clone()]),
            // A frame larger than a message goes alone, between the others.
            (
                vec!["a", &big, "c"],
                vec!["a".into(), big.clone(), "c".into()],
            ),
            (vec![&big, &big], vec![big.clone(), big.clone()]),
        ];
        for (frames, want) in cases {
            let mut packer = MessagePacker::default();
            let mut sent: Vec<String> = frames.iter().filter_map(|f| packer.push(f)).collect();
            sent.extend(packer.take());
            assert_eq!(sent.len(), want.len(), "{} frames", frames.len());
            assert_eq!(sent, want);
            for message in &sent {
                assert!(message.len() <= MESSAGE_BYTES || !message.contains('\n'));
            }
            let back: Vec<&str> = sent.iter().flat_map(|m| frames_of(m)).collect();
            assert_eq!(back, frames, "the frames come back, in order");
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
                    key: None,
                    reasoning: None,
                },
            },
            ClientFrame::Enqueue {
                id: "4".into(),
                lane: None,
                body: EnqueueRequest {
                    content: "once".into(),
                    key: Some("msg-1".into()),
                    reasoning: None,
                },
            },
            ClientFrame::Stop { id: "2".into() },
            ClientFrame::Ack { received: 7 },
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

    /// The window: what is unacknowledged after each step, and whether an event or a reply
    /// may go out. Events stop at the window (one frame may pass it); replies at twice it.
    #[test]
    fn the_ack_window_table() {
        const K: usize = 1024;
        let window = MAX_UNACKED_BYTES as usize;
        let frames = MAX_UNACKED_FRAMES as usize;
        enum Step {
            Send(usize, usize),
            Ack(u64),
        }
        use Step::{Ack, Send};
        // (steps, want: (sent, unacked frames, unacked bytes, may send event, may reply))
        type Want = (u64, u64, u64, bool, bool);
        let cases: Vec<(&str, Vec<Step>, Want)> = vec![
            ("fresh", vec![], (0, 0, 0, true, true)),
            ("one frame", vec![Send(1, 100)], (1, 1, 100, true, true)),
            (
                "just under the bytes",
                vec![Send(1, window - 1)],
                (1, 1, window as u64 - 1, true, true),
            ),
            (
                "at the bytes: events wait",
                vec![Send(1, window - 1), Send(1, 1)],
                (2, 2, window as u64, false, true),
            ),
            (
                "one frame larger than the window goes out, then events wait",
                vec![Send(1, 3 * window)],
                (1, 1, 3 * window as u64, false, false),
            ),
            (
                "at the frames: events wait",
                vec![Send(frames, 1)],
                (frames as u64, frames as u64, frames as u64, false, true),
            ),
            (
                "one frame under",
                vec![Send(frames - 1, 1)],
                (
                    frames as u64 - 1,
                    frames as u64 - 1,
                    frames as u64 - 1,
                    true,
                    true,
                ),
            ),
            (
                "an ack opens the window again",
                vec![Send(frames, K), Ack(1)],
                (
                    frames as u64,
                    frames as u64 - 1,
                    (frames - 1) as u64 * K as u64,
                    true,
                    true,
                ),
            ),
            (
                "an ack releases exactly the bytes of the frames it covers",
                vec![Send(2, 10), Send(1, 200 * K), Ack(2)],
                (3, 1, 200 * K as u64, true, true),
            ),
            (
                "an older ack changes nothing",
                vec![Send(3, 10), Ack(2), Ack(1)],
                (3, 1, 10, true, true),
            ),
            (
                "everything acked",
                vec![Send(frames * 2, K), Ack(frames as u64 * 2)],
                (frames as u64 * 2, 0, 0, true, true),
            ),
            (
                "replies stop at twice the frames",
                vec![Send(2 * frames, 1)],
                (
                    2 * frames as u64,
                    2 * frames as u64,
                    2 * frames as u64,
                    false,
                    false,
                ),
            ),
            (
                "replies stop at twice the bytes",
                vec![Send(2, window)],
                (2, 2, 2 * window as u64, false, false),
            ),
        ];
        for (name, steps, want) in cases {
            let mut w = AckWindow::default();
            for step in steps {
                match step {
                    Send(n, bytes) => (0..n).for_each(|_| w.record_sent(bytes)),
                    Ack(received) => w.ack(received).unwrap(),
                }
            }
            let got = (
                w.sent(),
                w.unacked_frames(),
                w.unacked_bytes(),
                w.may_send_event(),
                w.may_reply(),
            );
            assert_eq!(got, want, "{name}");
            // What survives hibernation restores the same numbering and the same bound.
            let (sent, unacked, bytes) = w.saved();
            let r = AckWindow::restore(sent, unacked, bytes);
            assert_eq!(
                (r.sent(), r.unacked_frames(), r.unacked_bytes()),
                (sent, unacked, bytes),
                "{name}: restored"
            );
            assert_eq!(r.may_send_event(), w.may_send_event(), "{name}: restored");
        }
    }

    #[test]
    fn acks_of_frames_never_sent_are_refused() {
        let mut w = AckWindow::default();
        w.record_sent(5);
        let e = w.ack(2).unwrap_err();
        assert_eq!((e.id, e.status), (None, 400));
        assert!(
            e.message.contains("ack of 2 frames, but 1 were sent"),
            "{}",
            e.message
        );
        // Nothing changed.
        assert_eq!((w.sent(), w.unacked_frames(), w.unacked_bytes()), (1, 1, 5));
    }

    /// After a wake, the bytes of frames sent before it are released only with the last of
    /// them (their sizes were not saved): never earlier than the exact window would.
    #[test]
    fn a_restored_window_releases_its_bytes_with_its_last_frame() {
        let mut w = AckWindow::restore(10, 4, 300 * 1024);
        assert!(!w.may_send_event());
        w.ack(9).unwrap();
        assert_eq!((w.unacked_frames(), w.unacked_bytes()), (1, 300 * 1024));
        assert!(!w.may_send_event());
        w.ack(10).unwrap();
        assert_eq!((w.unacked_frames(), w.unacked_bytes()), (0, 0));
        assert!(w.may_send_event());
        w.record_sent(1);
        assert_eq!(
            (w.sent(), w.unacked_frames(), w.unacked_bytes()),
            (11, 1, 1)
        );
        assert_eq!(AckWindow::restore(3, 0, 0), {
            let mut x = AckWindow::default();
            (0..3).for_each(|_| x.record_sent(1));
            x.ack(3).unwrap();
            x
        });
        // A count larger than the frames sent (a corrupt attachment) is clamped.
        assert_eq!(AckWindow::restore(2, 5, 9).unacked_frames(), 2);
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
