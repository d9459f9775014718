//! LLM providers, sans-IO: request building and stream decoding are pure functions; the host
//! performs the HTTP request and feeds the response bytes back in.
//!
//! A provider turns an [`LlmRequest`] into an [`HttpRequest`] and decodes the streamed reply into
//! [`LlmEvent`]s. [`AssistantBuilder`] folds events into the [`AssistantMessage`] that is
//! persisted. The `fake` provider needs no HTTP at all: [`fake::respond`] computes its reply.

pub mod fake;
pub mod openai;

use crate::wire::{AssistantMessage, ContentBlock, Message, StopReason, ToolCall, Usage};

/// A provider-neutral request: the whole context for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmRequest {
    /// Model name.
    pub model: String,
    /// System prompt.
    pub system_prompt: String,
    /// Context messages, oldest first. Tool calls always have their results.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<ToolSchema>,
}

/// A tool as the LLM sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSchema {
    /// Name.
    pub name: &'static str,
    /// What it does.
    pub description: &'static str,
    /// JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// An HTTP request the host must send.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpRequest {
    /// Absolute URL.
    pub url: String,
    /// Header name/value pairs (may hold an API key: never log them).
    pub headers: Vec<(String, String)>,
    /// JSON body.
    pub body: String,
}

/// One decoded streaming event.
#[derive(Clone, Debug, PartialEq)]
pub enum LlmEvent {
    /// Assistant text.
    TextDelta(String),
    /// A tool call starts at `index` (provider order).
    ToolCallStart {
        /// Provider index of the call.
        index: usize,
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More argument JSON text for the call at `index`.
    ToolCallArgumentsDelta {
        /// Provider index of the call.
        index: usize,
        /// JSON fragment.
        delta: String,
    },
    /// Token usage.
    Usage(Usage),
    /// The provider said why it stopped.
    Finish(StopReason),
}

/// Why an LLM request failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct LlmFailure {
    /// HTTP status, if the provider answered.
    pub status: Option<u16>,
    /// Lowercase human message (never contains secrets).
    pub message: String,
    /// Whether trying again may succeed (429, 5xx, network, truncated stream).
    pub retryable: bool,
}

impl LlmFailure {
    /// A failure from an HTTP error status and its body.
    pub fn from_status(status: u16, body: &str) -> Self {
        let detail = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| body.chars().take(300).collect());
        LlmFailure {
            status: Some(status),
            message: format!("provider returned http {status}: {detail}"),
            retryable: status == 429 || status >= 500,
        }
    }

    /// A network-level failure.
    pub fn network(message: impl Into<String>) -> Self {
        LlmFailure {
            status: None,
            message: message.into(),
            retryable: true,
        }
    }
}

/// Folds [`LlmEvent`]s into an [`AssistantMessage`].
#[derive(Debug, Default)]
pub struct AssistantBuilder {
    content: Vec<ContentBlock>,
    // (provider index, position in `content`, accumulated argument text)
    calls: Vec<(usize, usize, String)>,
    usage: Option<Usage>,
    stop_reason: Option<StopReason>,
}

impl AssistantBuilder {
    /// Applies one event.
    pub fn push(&mut self, event: LlmEvent) {
        match event {
            LlmEvent::TextDelta(delta) => match self.content.last_mut() {
                Some(ContentBlock::Text { text }) => text.push_str(&delta),
                _ => self.content.push(ContentBlock::Text { text: delta }),
            },
            LlmEvent::ToolCallStart { index, id, name } => {
                self.calls.push((index, self.content.len(), String::new()));
                self.content.push(ContentBlock::ToolCall(ToolCall {
                    id,
                    name,
                    arguments: serde_json::Value::Null,
                }));
            }
            LlmEvent::ToolCallArgumentsDelta { index, delta } => {
                if let Some(call) = self.calls.iter_mut().rev().find(|c| c.0 == index) {
                    call.2.push_str(&delta);
                }
            }
            LlmEvent::Usage(usage) => self.usage = Some(usage),
            LlmEvent::Finish(reason) => self.stop_reason = Some(reason),
        }
    }

    /// Whether the stream said it finished.
    pub fn finished(&self) -> bool {
        self.stop_reason.is_some()
    }

    /// The message. Arguments that are not valid JSON are kept as a string, so the tool
    /// executor can report the problem to the model.
    pub fn build(mut self, provider: &str, model: &str) -> AssistantMessage {
        for (_, position, text) in self.calls.drain(..) {
            if let Some(ContentBlock::ToolCall(call)) = self.content.get_mut(position) {
                call.arguments = if text.trim().is_empty() {
                    serde_json::json!({})
                } else {
                    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
                };
            }
        }
        let has_calls = self
            .content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolCall(_)));
        let stop_reason = match self.stop_reason {
            _ if has_calls => StopReason::ToolUse,
            Some(reason) => reason,
            None => StopReason::Stop,
        };
        self.content
            .retain(|b| !matches!(b, ContentBlock::Text { text } if text.is_empty()));
        AssistantMessage {
            provider: provider.to_string(),
            model: model.to_string(),
            content: self.content,
            usage: self.usage,
            stop_reason,
        }
    }
}
