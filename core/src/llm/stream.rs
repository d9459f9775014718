//! What the three streaming dialects (Chat Completions, Responses, Anthropic Messages) share:
//! SSE framing with a line bound, an error that sticks once returned, and the end-of-body rules
//! (a trailing event without its blank line is decoded; a body that ends before the dialect said
//! it finished is "ended early", retryable, even when its last line was cut mid-JSON).

use serde_json::Value;

use super::{LlmEvent, LlmFailure};
use crate::sse::{SseDecoder, SseItem};

/// The longest SSE line accepted from a provider. Bounds what one event may buffer.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

const MALFORMED_JSON: &str = "provider stream has malformed json in a data line";

/// One provider dialect's reading of its events.
pub(crate) trait Dialect {
    /// Handles the (trimmed, non-empty) data of one SSE event; `event` is its `event:` field.
    fn handle(
        &mut self,
        data: &str,
        event: Option<&str>,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure>;

    /// A terminal marker was seen: everything after it is ignored, even bytes over the line bound.
    fn done(&self) -> bool;

    /// The stream said it finished (a terminal marker or a stop reason).
    fn complete(&self) -> bool {
        self.done()
    }

    /// Called once when the body ends complete, for events held back until the end.
    fn on_end(&mut self, _events: &mut Vec<LlmEvent>) {}
}

/// A dialect fed through SSE framing. Feed the body with [`push`](Self::push) in pieces of any
/// size, then call [`finish`](Self::finish). After an error it keeps returning that error.
#[derive(Debug)]
pub(crate) struct SseStream<D> {
    sse: SseDecoder,
    dialect: D,
    failed: Option<LlmFailure>,
}

impl<D: Dialect> SseStream<D> {
    pub(crate) fn new(dialect: D) -> Self {
        SseStream {
            sse: SseDecoder::new(MAX_LINE_BYTES),
            dialect,
            failed: None,
        }
    }

    /// Decodes the next piece of the body.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Vec<LlmEvent>, LlmFailure> {
        if let Some(failure) = &self.failed {
            return Err(failure.clone());
        }
        let mut events = Vec::new();
        let outcome = if self.dialect.done() {
            Ok(())
        } else {
            let mut frames = Vec::new();
            let result = self.sse.push(bytes, &mut frames);
            self.handle_frames(frames, &mut events)
                .and_then(|()| match result {
                    Err(_) if !self.dialect.done() => Err(too_large()),
                    _ => Ok(()),
                })
        };
        match outcome {
            Ok(()) => Ok(events),
            Err(failure) => {
                self.failed = Some(failure.clone());
                Err(failure)
            }
        }
    }

    /// Ends the body: decodes a trailing event that lacks its blank line, and fails if the
    /// stream never said it finished.
    pub(crate) fn finish(mut self) -> Result<Vec<LlmEvent>, LlmFailure> {
        if let Some(failure) = self.failed.take() {
            return Err(failure);
        }
        let mut events = Vec::new();
        if !self.dialect.done() {
            let mut frames = Vec::new();
            let result = self.sse.finish(&mut frames);
            let trailing = self
                .handle_frames(frames, &mut events)
                .and_then(|()| result.map_err(|_| too_large()));
            let complete = self.dialect.complete();
            match trailing {
                // A cut-off last event is an early end, not a provider bug.
                Err(failure) if !complete && failure.message.starts_with(MALFORMED_JSON) => {
                    return Err(ended_early());
                }
                Err(failure) => return Err(failure),
                Ok(()) if !complete => return Err(ended_early()),
                Ok(()) => self.dialect.on_end(&mut events),
            }
        }
        Ok(events)
    }

    fn handle_frames(
        &mut self,
        frames: Vec<SseItem>,
        events: &mut Vec<LlmEvent>,
    ) -> Result<(), LlmFailure> {
        for item in frames {
            if self.dialect.done() {
                break;
            }
            if let SseItem::Frame(frame) = item {
                let data = frame.data.trim();
                if !data.is_empty() {
                    self.dialect.handle(data, frame.event.as_deref(), events)?;
                }
            }
        }
        Ok(())
    }
}

/// Parses one event's data as JSON; a failure is retryable (the stream may have been cut).
pub(crate) fn parse_json(data: &str) -> Result<Value, LlmFailure> {
    serde_json::from_str(data).map_err(|error| LlmFailure {
        message: format!("{MALFORMED_JSON}: {error}"),
        retryable: true,
        ..LlmFailure::default()
    })
}

/// The event's kind: the data's `type`, else the SSE `event` field.
pub(crate) fn event_kind<'a>(event: &'a Value, sse_event: Option<&'a str>) -> &'a str {
    event
        .get("type")
        .and_then(Value::as_str)
        .or(sse_event)
        .unwrap_or("")
}

fn ended_early() -> LlmFailure {
    LlmFailure {
        message: "provider stream ended early".to_string(),
        retryable: true,
        ..LlmFailure::default()
    }
}

fn too_large() -> LlmFailure {
    LlmFailure {
        message: format!("provider stream line exceeds {MAX_LINE_BYTES} bytes"),
        retryable: true,
        ..LlmFailure::default()
    }
}
