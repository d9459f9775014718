//! What a session persists between inputs.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::Millis;
use crate::compaction::Anchors;
use crate::llm::reasoning::Reasoning;
use crate::wire::{Budget, Spent};
use crate::wire::{Lane, Status, ToolCall};

/// The loop state the host writes after every drain, in one row.
///
/// Small and bounded: the transcript lives in its own rows, and so do queued items (each in its
/// own row, written and deleted through [`super::Effect::QueueInsert`] and
/// [`super::Effect::QueueDelete`]). What remains is a few numbers, at most
/// `REMEMBERED_DELIVERED` item ids and the tool calls of one assistant message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Execution status.
    pub status: Status,
    /// Where the loop is.
    pub phase: Phase,
    /// Queued items of a checkpoint written before items had rows of their own. Read, never
    /// written: [`super::Session::restore`] moves them into the queue and asks the host to
    /// insert their rows.
    #[serde(default, rename = "queue", skip_serializing)]
    pub legacy_queue: Vec<QueueItem>,
    /// Cursor the next entry gets.
    pub next_cursor: u64,
    /// Number of the latest LLM step.
    pub step: u64,
    /// Ids of recently delivered items.
    pub delivered: VecDeque<String>,
    /// Who the current turn acts for: the union of the acting-for sets of the user messages
    /// delivered since it started (a person's message acts for its author; a child's task and a
    /// parent's message for the parent turn's set), first one first. At most
    /// [`super::MAX_TURN_AUTHORS`] principals, then [`super::MORE_PRINCIPALS`] stands for the
    /// rest, so a set never loses anyone. Tools act on their behalf.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_authors: Vec<String>,
    /// The reasoning setting of the current turn: the latest one a user message delivered in
    /// it carried (`POST …/enqueue {reasoning}`); it wins over the session's until the turn
    /// ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_reasoning: Option<Reasoning>,
    /// Running tool calls that wait for a person's approval. They have not started their
    /// work, so after a restart they run again (and wait for the same approval) instead of
    /// losing their result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_approval: Vec<String>,
    /// The author of the first user message delivered; `None` until then (the creator owns
    /// the session meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Cursor of the group-chat reminder, once another user than the owner prompted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_chat_since: Option<u64>,
    /// Tokens and dollars the session's requests used (replies and compaction summaries)
    /// since budgets exist.
    #[serde(default, skip_serializing_if = "Spent::is_zero")]
    pub spent: Spent,
    /// What the session's children (and theirs, in turn) spent, as they last reported it:
    /// counted against this session's budget too ([`super::Session::handle_children_spent`]).
    #[serde(default, skip_serializing_if = "Spent::is_zero")]
    pub children_spent: Spent,
    /// The session's budget, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The older entries the LLM context needs (pinned messages, the latest compaction).
    #[serde(default, skip_serializing_if = "is_default_anchors")]
    pub context: Anchors,
}

fn is_default_anchors(anchors: &Anchors) -> bool {
    *anchors == Anchors::default()
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            status: Status::Idle,
            phase: Phase::Idle,
            legacy_queue: Vec::new(),
            next_cursor: 1,
            step: 0,
            delivered: VecDeque::new(),
            turn_authors: Vec::new(),
            turn_reasoning: None,
            awaiting_approval: Vec::new(),
            owner: None,
            group_chat_since: None,
            context: Anchors::default(),
            spent: Spent::default(),
            children_spent: Spent::default(),
            budget: None,
        }
    }
}

/// Where the loop is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "phase", rename_all = "camelCase")]
pub enum Phase {
    /// Waiting for input.
    Idle,
    /// An LLM request is in flight.
    Inference {
        /// Step number.
        step: u64,
        /// 1-based attempt.
        attempt: u32,
    },
    /// Waiting to retry a failed LLM request.
    RetryWait {
        /// Step number.
        step: u64,
        /// The attempt that will run.
        attempt: u32,
        /// When.
        at: Millis,
    },
    /// Tool calls of the last assistant message are running.
    Tools {
        /// Step number.
        step: u64,
        /// Calls started and not finished.
        running: Vec<ToolCall>,
        /// Batches not started yet.
        remaining: Vec<Vec<ToolCall>>,
    },
}

impl Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u64::deserialize(d).map(Millis)
    }
}

/// A queued message. The host keeps each in its own row until it is delivered or cancelled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QueueItem {
    /// Item id.
    pub id: String,
    /// Lane.
    pub lane: Lane,
    /// Who enqueued it.
    pub author: String,
    /// Who it acts for, when not its author alone: the acting-for set of the parent turn that
    /// sent a child its task or a message (possibly empty: nobody). `None`: its author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acting_for: Option<Vec<String>>,
    /// Text.
    pub content: String,
    /// The reasoning setting of the turn it starts or joins, when its sender gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    /// Unix seconds.
    pub enqueued_at: i64,
    /// For a `system` item from the server (a child's lifecycle, a finished job): the
    /// `custom_message` it becomes. Without it a system item is a `wuhu_system_input_v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemInput>,
}

/// The type and details of the `custom_message` a `system` item becomes when delivered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SystemInput {
    /// A versioned type name (`wuhu_child_status_v1`, …).
    pub custom_type: String,
    /// Structured facts for clients (the child's status, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl QueueItem {
    /// What the item counts against [`super::MAX_QUEUE_BYTES`]: its text.
    pub fn bytes(&self) -> usize {
        self.content.len()
    }
}
