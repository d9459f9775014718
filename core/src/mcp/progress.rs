//! Progress of a `session_wait` (issue 33): when the client's `tools/call` carries
//! `_meta.progressToken` and accepts an event stream, the Worker answers with one, follows the
//! session while it waits, and sends what the agent writes as `notifications/progress` before
//! the result. This is the rule of what becomes a notification; the Worker's `mcp.rs` reads the
//! follow stream and writes the frames.
//!
//! * The agent's text deltas are the messages, batched as they arrive (one notification for
//!   what one read of the stream brought), each at most [`MAX_MESSAGE_CHARS`].
//! * A tool call the agent starts is a message of its own (`[calling bash]`), once per call.
//! * `progress` is the number of characters the agent has written so far, plus one per call: it
//!   only grows, as the spec asks. There is no `total`.
//! * At most [`MAX_NOTIFICATIONS`] notifications per wait; after that the wait goes on silently.
//! * The wait stops following at the session's `idle` event, or when the follow stream ends.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::wire::StreamEvent;

/// The longest message of one notification, in characters (the rest of a batch is cut).
pub const MAX_MESSAGE_CHARS: usize = 2_000;
/// The most notifications one wait sends.
pub const MAX_NOTIFICATIONS: usize = 1_000;
/// The most tool calls one wait remembers (to name each once).
const MAX_CALLS_SEEN: usize = 1_000;

/// Whether a request's `Accept` header takes an event stream (the transport requires clients to
/// list both `application/json` and `text/event-stream`; one that lists only JSON gets JSON).
pub fn accepts_stream(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|part| {
            part.split(';')
                .next()
                .is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
        })
    })
}

/// What to do after some of the follow stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The notification to send, if the events said anything.
    pub notification: Option<Value>,
    /// The session went idle (or the stream ended): stop following.
    pub stop: bool,
}

/// The progress of one wait.
#[derive(Debug)]
pub struct WaitProgress {
    token: Value,
    progress: u64,
    sent: usize,
    calls: HashSet<String>,
}

impl WaitProgress {
    /// The progress of a `tools/call` whose params carry `_meta.progressToken` (a string or an
    /// integer, as the spec says); `None` without one.
    pub fn of(params: &Value) -> Option<WaitProgress> {
        let token = params.pointer("/_meta/progressToken")?;
        if !(token.is_string() || token.is_i64() || token.is_u64()) {
            return None;
        }
        Some(WaitProgress {
            token: token.clone(),
            progress: 0,
            sent: 0,
            calls: HashSet::new(),
        })
    }

    /// Notifications sent so far.
    pub fn sent(&self) -> usize {
        self.sent
    }

    /// Takes the events one read of the follow stream brought.
    pub fn take(&mut self, events: &[StreamEvent]) -> Batch {
        let mut message = String::new();
        let mut stop = false;
        for event in events {
            match event {
                StreamEvent::AssistantTextDelta { delta } => {
                    self.progress += delta.chars().count() as u64;
                    message.push_str(delta);
                }
                StreamEvent::ToolCallDelta { call_id, name, .. }
                    if self.calls.len() < MAX_CALLS_SEEN && self.calls.insert(call_id.clone()) =>
                {
                    self.progress += 1;
                    if !message.is_empty() && !message.ends_with('\n') {
                        message.push('\n');
                    }
                    message.push_str(&format!("[calling {name}]\n"));
                }
                StreamEvent::Idle
                | StreamEvent::Done
                | StreamEvent::Lagged { .. }
                | StreamEvent::Error { .. } => stop = true,
                _ => {}
            }
        }
        let notification = if message.is_empty() || self.sent >= MAX_NOTIFICATIONS {
            None
        } else {
            self.sent += 1;
            let message: String = message.chars().take(MAX_MESSAGE_CHARS).collect();
            Some(json!({
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": self.token, "progress": self.progress, "message": message},
            }))
        };
        Batch { notification, stop }
    }
}

/// One message as an event of the answer's stream.
pub fn sse_frame(message: &Value) -> String {
    format!("event: message\ndata: {message}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(text: &str) -> StreamEvent {
        StreamEvent::AssistantTextDelta { delta: text.into() }
    }

    fn call(id: &str, name: &str) -> StreamEvent {
        StreamEvent::ToolCallDelta {
            call_id: id.into(),
            name: name.into(),
            arguments_delta: "{".into(),
        }
    }

    #[test]
    fn only_a_request_with_a_token_has_progress() {
        assert!(WaitProgress::of(&json!({"name": "session_wait"})).is_none());
        assert!(WaitProgress::of(&json!({"_meta": {}})).is_none());
        assert!(WaitProgress::of(&json!({"_meta": {"progressToken": 1.5}})).is_none());
        assert!(WaitProgress::of(&json!({"_meta": {"progressToken": null}})).is_none());
        assert!(WaitProgress::of(&json!({"_meta": {"progressToken": 7}})).is_some());
        assert!(WaitProgress::of(&json!({"_meta": {"progressToken": "t"}})).is_some());
    }

    #[test]
    fn the_accept_header_decides_the_answers_form() {
        for (accept, stream) in [
            (None, false),
            (Some("application/json"), false),
            (Some("application/json, text/event-stream"), true),
            (Some("text/event-stream;q=0.5 , application/json"), true),
            (Some("TEXT/EVENT-STREAM"), true),
            (Some("text/event-streams"), false),
            (Some("*/*"), false),
        ] {
            assert_eq!(accepts_stream(accept), stream, "{accept:?}");
        }
    }

    #[test]
    fn text_and_calls_become_notifications_whose_progress_grows() {
        let mut progress = WaitProgress::of(&json!({"_meta": {"progressToken": "w1"}})).unwrap();
        let first = progress.take(&[delta("Let me "), delta("look.")]);
        assert_eq!(
            first.notification,
            Some(json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "w1", "progress": 12, "message": "Let me look."}}))
        );
        assert!(!first.stop);
        // A call is named once, however many of its deltas come.
        let second = progress.take(&[call("c1", "bash"), call("c1", "bash"), delta("Done")]);
        let params = &second.notification.unwrap()["params"];
        assert_eq!(params["message"], "[calling bash]\nDone");
        assert_eq!(params["progress"], 12 + 1 + 4);
        // Nothing said: nothing sent; the session at rest: stop.
        let third = progress.take(&[
            StreamEvent::Status {
                status: crate::wire::Status::Idle,
            },
            StreamEvent::Idle,
        ]);
        assert_eq!(
            third,
            Batch {
                notification: None,
                stop: true
            }
        );
        assert_eq!(progress.sent(), 2);
    }

    #[test]
    fn the_ends_of_a_follow_stream_stop_the_wait() {
        for end in [
            StreamEvent::Idle,
            StreamEvent::Done,
            StreamEvent::Lagged { cursor: 3 },
            StreamEvent::Error {
                message: "x".into(),
            },
        ] {
            let mut progress = WaitProgress::of(&json!({"_meta": {"progressToken": 1}})).unwrap();
            let batch = progress.take(&[delta("last words"), end.clone()]);
            assert!(batch.stop, "{end:?}");
            // What came before the end is still sent.
            assert_eq!(
                batch.notification.unwrap()["params"]["message"],
                "last words"
            );
        }
    }

    #[test]
    fn messages_and_notifications_are_bounded() {
        let mut progress = WaitProgress::of(&json!({"_meta": {"progressToken": 1}})).unwrap();
        let long = "é".repeat(MAX_MESSAGE_CHARS + 10);
        let batch = progress.take(&[delta(&long)]);
        let params = &batch.notification.unwrap()["params"];
        assert_eq!(
            params["message"].as_str().unwrap().chars().count(),
            MAX_MESSAGE_CHARS
        );
        // Progress counts all of it.
        assert_eq!(params["progress"], (MAX_MESSAGE_CHARS + 10) as u64);
        for _ in 1..MAX_NOTIFICATIONS {
            assert!(progress.take(&[delta("x")]).notification.is_some());
        }
        assert!(progress.take(&[delta("x")]).notification.is_none());
        assert_eq!(progress.sent(), MAX_NOTIFICATIONS);
    }

    #[test]
    fn a_frame_is_one_message_event() {
        assert_eq!(
            sse_frame(&json!({"a": 1})),
            "event: message\ndata: {\"a\":1}\n\n"
        );
    }
}
