//! Follow-stream events and their SSE framing.

use serde::{Deserialize, Serialize};

use super::{Entry, Status};

/// One event of `GET /v1/sessions/:id/follow`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// A persisted entry. Its cursor is the SSE `id:`.
    EntryAppended {
        /// The entry.
        entry: Entry,
    },
    /// Streaming assistant text not yet persisted.
    AssistantTextDelta {
        /// New text.
        delta: String,
    },
    /// Streaming thinking not yet persisted: an Anthropic thinking block, or an OpenAI
    /// reasoning summary, as the model writes it (masked as assistant text is). The assistant
    /// entry keeps the thinking (Anthropic) or the reasoning item with its summary (OpenAI).
    ThinkingDelta {
        /// New text.
        delta: String,
    },
    /// The arguments of a tool call as the model writes them, not persisted: the assistant
    /// entry holds the call. Masked of the tenant's secrets as text deltas are; at most
    /// `crate::llm::masked_reply::MAX_STREAMED_ARGUMENT_BYTES` per call are sent (the entry
    /// has the rest).
    ToolCallDelta {
        /// The call's id (as in the assistant entry that will hold it).
        #[serde(rename = "callId")]
        call_id: String,
        /// The tool.
        name: String,
        /// More of the arguments' JSON text.
        #[serde(rename = "argumentsDelta")]
        arguments_delta: String,
    },
    /// Output of a tool call still running (`bash` on a runner), not persisted: the call's
    /// result entry is the source of truth. Masked of the tenant's secrets; bounded as
    /// `crate::tool_output` says. A follower that joins while the call runs gets the call's
    /// last [`crate::tool_output::LIVE_TAIL_BYTES`] first, as one such event.
    ToolOutputDelta {
        /// The tool call's id (as in the assistant entry that made it).
        #[serde(rename = "callId")]
        call_id: String,
        /// Which output.
        stream: super::runner::OutputStream,
        /// New text.
        text: String,
    },
    /// A message was queued for the session (its `steer` or `followUp` lane; the internal
    /// `system` lane is not shown): every viewer sees it before it is delivered. Not persisted:
    /// `GET /v1/sessions/:id` lists the queue.
    QueueItemAdded {
        /// The item's id (as `DELETE …/queue/:id` takes it).
        id: String,
        /// Its lane.
        lane: super::Lane,
        /// Who queued it.
        author: String,
        /// Its first [`QUEUE_PREVIEW_CHARS`] characters.
        preview: String,
    },
    /// A queued message left the queue: delivered (its entry follows in the same drain) or
    /// cancelled.
    QueueItemRemoved {
        /// The item's id.
        id: String,
        /// Why.
        reason: QueueRemoval,
    },
    /// The session's status changed.
    Status {
        /// New status.
        status: Status,
    },
    /// The session has nothing left to do.
    Idle,
    /// A child session's lifecycle changed (see `docs/orchestration.md`).
    ChildStatus {
        /// The child as the session now knows it.
        child: super::ChildStatus,
    },
    /// The stream ends after this.
    Done,
    /// This follower fell too far behind (its buffer of live events is bounded) and the stream
    /// ends after this. Reconnect with `Last-Event-ID` (or `sinceCursor`) set to `cursor` to
    /// resume losslessly.
    Lagged {
        /// The last cursor this stream covered (sent, or skipped by `sinceTime`).
        cursor: u64,
    },
    /// Reading the transcript failed; the stream ends after this.
    Error {
        /// What went wrong.
        message: String,
    },
}

impl StreamEvent {
    /// The SSE `event:` name (also the `type` inside `data`).
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::EntryAppended { .. } => "entry_appended",
            StreamEvent::AssistantTextDelta { .. } => "assistant_text_delta",
            StreamEvent::ThinkingDelta { .. } => "thinking_delta",
            StreamEvent::ToolCallDelta { .. } => "tool_call_delta",
            StreamEvent::ToolOutputDelta { .. } => "tool_output_delta",
            StreamEvent::QueueItemAdded { .. } => "queue_item_added",
            StreamEvent::QueueItemRemoved { .. } => "queue_item_removed",
            StreamEvent::Status { .. } => "status",
            StreamEvent::Idle => "idle",
            StreamEvent::ChildStatus { .. } => "child_status",
            StreamEvent::Done => "done",
            StreamEvent::Lagged { .. } => "lagged",
            StreamEvent::Error { .. } => "error",
        }
    }

    /// Encodes one SSE frame: `id:` (entries only), `event:`, `data:` and a blank line.
    pub fn to_sse(&self) -> String {
        let data = serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"));
        match self {
            StreamEvent::EntryAppended { entry } => {
                format!(
                    "id: {}\nevent: {}\ndata: {}\n\n",
                    entry.cursor,
                    self.name(),
                    data
                )
            }
            _ => format!("event: {}\ndata: {}\n\n", self.name(), data),
        }
    }
}

/// The most characters of a queued message a [`StreamEvent::QueueItemAdded`] shows.
pub const QUEUE_PREVIEW_CHARS: usize = 200;

/// Why a queued message left the queue.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum QueueRemoval {
    /// It became the transcript's message.
    Delivered,
    /// Someone cancelled it.
    Cancelled,
}

/// An SSE comment line that keeps proxies from closing an idle stream.
pub const SSE_HEARTBEAT: &str = ": heartbeat\n\n";
