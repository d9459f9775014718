//! The session state machine: lanes, the agent loop, stop, retries, checkpoints.
//!
//! [`Session`] is sans-IO. The host calls a `handle_*` method for each input, then drains
//! [`Session::poll_effect`] until it returns `None` and performs each effect, then arms a timer
//! for [`Session::poll_deadline`]. After every drain the host persists the appended entries and
//! [`Session::checkpoint`] in **one** atomic write: a crash then loses nothing and writes nothing
//! twice. `now` must never go backwards.
//!
//! ## The loop
//!
//! `drain lanes → infer → persist assistant message → run tool calls (batches) → drain → …`
//!
//! * `steer` and `system` items are delivered at every step boundary: before inference and
//!   before each batch of tool calls. Delivering them skips the remaining tool calls of the
//!   current assistant message (each gets a "skipped" result).
//! * `followUp` items are delivered only when the agent would otherwise stop.
//! * Queued items can be cancelled until delivered.
//! * Stop ends the turn: in-flight inference is discarded, pending tool calls get a "stopped"
//!   result, status becomes `stopped`. The next enqueue resumes.
//! * A retryable LLM failure is retried after the provider's `retry-after` or a jittered
//!   backoff (visible notices, see [`crate::llm::retry`]); after [`MAX_LLM_ATTEMPTS`] (or the
//!   configured number) the turn ends with the session idle.
//!
//! ## Persistence
//!
//! The checkpoint stays small: queued items are not in it. Each item has its own row, which the
//! host inserts on [`Effect::QueueInsert`] and deletes on [`Effect::QueueDelete`]. Delivering an
//! item yields its `QueueDelete` and the `AppendEntry` of its message in the same drain, so one
//! atomic write removes the item and records its delivery. The queue is bounded in items
//! ([`MAX_QUEUE_ITEMS`]) and bytes ([`MAX_QUEUE_BYTES`]).
//!
//! A drain's writes either all commit or none does. When they fail, the host must drop the
//! session and restore it from storage ([`Session::restore`], then
//! [`Session::handle_stored_cursor`] and [`Session::handle_storage_failure`]): memory never runs
//! ahead of storage.

#[cfg(test)]
mod budget_tests;
mod checkpoint;
mod fork;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

pub use checkpoint::{Checkpoint, Phase, QueueItem, SystemInput};
pub use fork::ForkPrefix;

use crate::llm::LlmFailure;
use crate::llm::reasoning::Reasoning;
use crate::llm::retry::RetryPolicy;
use crate::rng::SplitMix64;
use crate::tools;
use crate::wire::{
    AssistantMessage, Budget, Compaction, Entry, EntryPayload, Header, Lane, Message, Spent,
    Status, ToolCall, ToolResult, custom_types,
};

/// Milliseconds since the Unix epoch, supplied by the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    /// Whole seconds, for entry times.
    pub fn unix_seconds(self) -> i64 {
        (self.0 / 1000) as i64
    }
}

/// How many LLM attempts a step gets before the turn gives up, unless configured otherwise
/// (see [`RetryPolicy`]).
pub const MAX_LLM_ATTEMPTS: u32 = crate::llm::retry::DEFAULT_MAX_ATTEMPTS;
/// How many undelivered queue items a session holds.
pub const MAX_QUEUE_ITEMS: usize = 1000;
/// How many bytes of text the undelivered queue items of a session hold together. Items live in
/// the actor's memory until delivered, so this bounds that memory; it leaves room for a few
/// items as large as a request body (1 MiB) behind a running turn.
pub const MAX_QUEUE_BYTES: usize = 4 * 1024 * 1024;
/// The queue item id of a message its sender names by `key` (a chat platform's message id),
/// scoped by author so two senders' keys never meet: `k-` and 32 hex digits of SHA-256.
#[must_use]
pub fn keyed_item_id(author: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in [author, key] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    format!("k-{}", hex::encode(&hasher.finalize()[..16]))
}

/// Longest key a client may name its message by (`EnqueueRequest::key`), in characters.
pub const MAX_ITEM_KEY_CHARS: usize = 128;

/// Whether `key` may name a client's message: 1 to [`MAX_ITEM_KEY_CHARS`] printable ASCII
/// characters (a UUID, a counter, a hash: anything a client can repeat exactly). The reason
/// when not.
///
/// # Errors
/// A message for the client when the key is empty, too long or not printable ASCII.
pub fn check_item_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("key must not be empty".into());
    }
    if key.len() > MAX_ITEM_KEY_CHARS {
        return Err(format!(
            "key must be at most {MAX_ITEM_KEY_CHARS} characters"
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("key must be printable ASCII without spaces".into());
    }
    Ok(())
}

/// How many delivered item ids are remembered, to tell "already delivered" from "unknown".
pub const REMEMBERED_DELIVERED: usize = 256;
/// How many distinct turn authors are recorded. Later authors of a turn that already has this
/// many are not added: two distinct authors already include someone other than any one runner
/// owner, so the approval rule (`crate::approvals`) decides the same.
pub const MAX_TURN_AUTHORS: usize = 32;

/// Stands for the principals a turn acts for past [`MAX_TURN_AUTHORS`]: it is nobody's `sub`
/// (`authority::valid_name` refuses `*`), so no rule that needs every principal's consent
/// finds it, and no set ever loses a member to the bound.
pub const MORE_PRINCIPALS: &str = "*";

/// Something the host must do.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum Effect {
    /// Persist this entry and send it to followers.
    AppendEntry(Entry),
    /// Persist this new queue item in its own row, in the same write as the checkpoint.
    QueueInsert(QueueItem),
    /// Delete the row of this queue item: it was delivered (its entry is in the same drain) or
    /// cancelled.
    QueueDelete {
        /// Item id.
        id: String,
        /// Why it left the queue.
        reason: crate::wire::QueueRemoval,
    },
    /// Tell followers the status changed.
    StatusChanged(Status),
    /// Start an LLM request for `step`: build the context from the transcript and stream it.
    /// Deliver the outcome with [`Session::handle_inference_done`].
    Infer {
        /// Step number; stale completions are ignored.
        step: u64,
    },
    /// Abandon the in-flight LLM request of `step`.
    CancelInference {
        /// Step number.
        step: u64,
    },
    /// Run these tool calls concurrently; report each with [`Session::handle_tool_done`].
    RunTools {
        /// Step number.
        step: u64,
        /// The calls.
        calls: Vec<ToolCall>,
    },
    /// Abandon the running tool calls of `step`.
    CancelTools {
        /// Step number.
        step: u64,
    },
    /// The session has nothing left to do: tell followers, flush the archive.
    Idle,
}

/// Why a cancel was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CancelError {
    /// No queued item has this id.
    #[error("no queued item with this id")]
    NotFound,
    /// The item already reached the transcript.
    #[error("the item was already delivered")]
    AlreadyDelivered,
}

/// Why an enqueue was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueError {
    /// Too many undelivered items.
    #[error("the queue is full ({MAX_QUEUE_ITEMS} undelivered items)")]
    QueueFull,
    /// The undelivered items would hold too many bytes.
    #[error(
        "the queue is full (undelivered items may hold {MAX_QUEUE_BYTES} bytes of text; {queued} are queued, this item has {item})"
    )]
    QueueBytes {
        /// Bytes already queued.
        queued: usize,
        /// Bytes of the refused item.
        item: usize,
    },
    /// The session spent its budget (see [`Session::handle_budget`]).
    #[error("the session's budget is spent ({limit}): raise it to continue")]
    BudgetExceeded {
        /// `tokens` or `usd`.
        limit: &'static str,
    },
    /// A message acts for more principals than a turn can.
    #[error("a message may act for at most {MAX_TURN_AUTHORS} people")]
    ActingForTooLarge,
}

/// Why a compaction was not recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "compaction keeping entries from cursor {first_kept_cursor} does not move the context forward"
)]
pub struct CompactionRefused {
    /// The refused compaction's first kept cursor.
    pub first_kept_cursor: u64,
}

/// One session's loop state. See the module docs for the call order.
#[derive(Debug)]
pub struct Session {
    state: Checkpoint,
    /// Undelivered items, in enqueue order (the host's queue rows).
    queue: Vec<QueueItem>,
    /// Sum of [`QueueItem::bytes`] over `queue`.
    queue_bytes: usize,
    rng: SplitMix64,
    effects: VecDeque<Effect>,
    retry: RetryPolicy,
}

impl Session {
    /// A new session. Emits its header entry, then one `custom_message` entry per context
    /// message (such as the user's global context), which the LLM sees from then on.
    pub fn create(now: Millis, seed: u64, header: Header, context: Vec<Message>) -> Session {
        let entries = context
            .into_iter()
            .map(|message| EntryPayload::Message { message })
            .collect();
        Session::create_with_entries(now, seed, header, entries)
    }

    /// A new session whose header is followed by `entries` (context messages, and notices such
    /// as the environment a child was given at its spawn).
    pub fn create_with_entries(
        now: Millis,
        seed: u64,
        header: Header,
        entries: Vec<EntryPayload>,
    ) -> Session {
        let mut session = Session::restore(Checkpoint::default(), Vec::new(), seed);
        session.append(now, EntryPayload::Header(header));
        for payload in entries {
            session.append(now, payload);
        }
        session
    }

    /// A session loaded from its last checkpoint and its queue rows (in enqueue order). `seed`
    /// must be fresh randomness: it feeds entry ids. Call [`Session::handle_stored_cursor`],
    /// then [`Session::handle_resume`] to re-issue work that was in flight.
    ///
    /// Items of an old checkpoint that still held the queue come first, each with a
    /// [`Effect::QueueInsert`] so the host gives it a row.
    pub fn restore(mut state: Checkpoint, queue: Vec<QueueItem>, seed: u64) -> Session {
        let legacy = std::mem::take(&mut state.legacy_queue);
        let effects = legacy.iter().cloned().map(Effect::QueueInsert).collect();
        let queue: Vec<QueueItem> = legacy.into_iter().chain(queue).collect();
        Session {
            state,
            queue_bytes: queue.iter().map(QueueItem::bytes).sum(),
            queue,
            rng: SplitMix64::new(seed),
            effects,
            retry: RetryPolicy::default(),
        }
    }

    /// Sets how failed LLM requests are retried (configuration, not persisted state).
    pub fn set_retry_policy(&mut self, policy: RetryPolicy) {
        self.retry = policy;
    }

    /// Checks a restored checkpoint against the newest cursor in storage (entries and archived
    /// segments). Every stored entry must be below `next_cursor`; when one is not, a write once
    /// stored entries without their checkpoint. The loop state is then older than the
    /// transcript: `next_cursor` moves past the stored entries (a new entry must never reuse a
    /// cursor) and a `wuhu_storage_repaired_v1` notice says so. Returns whether it repaired.
    pub fn handle_stored_cursor(&mut self, now: Millis, newest_stored: u64) -> bool {
        if newest_stored < self.state.next_cursor {
            return false;
        }
        let expected = self.state.next_cursor;
        self.state.next_cursor = newest_stored + 1;
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::STORAGE_REPAIRED.into(),
                data: serde_json::json!({
                    "text": format!(
                        "The saved loop state was behind the transcript (next cursor {expected}, newest stored entry {newest_stored}); it was moved past the stored entries. Work after the last saved state may run again."
                    ),
                    "checkpointNextCursor": expected,
                    "newestStoredCursor": newest_stored,
                }),
            },
        );
        true
    }

    /// Records, after a restore, that a write failed and the session was reloaded from storage:
    /// appends a `wuhu_storage_error_v1` notice (the failed write is lost; work it recorded is
    /// re-issued by [`Session::handle_resume`]).
    pub fn handle_storage_failure(&mut self, now: Millis, message: &str) {
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::STORAGE_ERROR.into(),
                data: serde_json::json!({
                    "text": format!(
                        "Saving the session failed ({message}); it was reloaded from its last saved state and resumed from there."
                    ),
                    "message": message,
                }),
            },
        );
    }

    /// What to persist after draining effects.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.state
    }

    /// Execution status.
    pub fn status(&self) -> Status {
        self.state.status
    }

    /// Cursor of the newest entry (0 before the header).
    pub fn last_cursor(&self) -> u64 {
        self.state.next_cursor.saturating_sub(1)
    }

    /// The author of the first user message delivered (the session's owner once prompted).
    pub fn owner(&self) -> Option<&str> {
        self.state.owner.as_deref()
    }

    /// Cursor of the group-chat reminder: user messages after it reach the LLM with their author.
    pub fn group_chat_since(&self) -> Option<u64> {
        self.state.group_chat_since
    }

    /// Undelivered queue items, oldest first.
    pub fn queue(&self) -> &[QueueItem] {
        &self.queue
    }

    /// Bytes the undelivered items hold (see [`MAX_QUEUE_BYTES`]).
    pub fn queue_bytes(&self) -> usize {
        self.queue_bytes
    }

    /// Who the current turn acts for: the union of the acting-for sets of the user messages
    /// delivered since the turn started (the follow-ups that started it, then any steer), first
    /// one first; a person's message acts for its author, a child's task for the people the
    /// parent's turn acted for. Empty before the first user message, and in a turn only the
    /// system started (nobody). A turn starts when the loop delivers input while it would
    /// otherwise stop; tool results and steer continue it.
    pub fn turn_authors(&self) -> &[String] {
        &self.state.turn_authors
    }

    /// The author of the user message that started the current turn.
    pub fn turn_author(&self) -> Option<&str> {
        self.state.turn_authors.first().map(String::as_str)
    }

    /// The next effect to perform.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// The reasoning setting of the current turn, when a message delivered in it carried one
    /// (it wins over the session's).
    pub fn turn_reasoning(&self) -> Option<Reasoning> {
        self.state.turn_reasoning
    }

    /// When [`Session::handle_timeout`] must be called, if ever.
    #[must_use]
    pub fn poll_deadline(&self) -> Option<Millis> {
        match self.state.phase {
            Phase::RetryWait { at, .. } => Some(at),
            _ => None,
        }
    }

    /// Queues a message. Starts a turn when the session is idle or stopped.
    ///
    /// # Errors
    /// [`EnqueueError::QueueFull`] when too many items wait, [`EnqueueError::QueueBytes`] when
    /// they would hold too many bytes.
    pub fn handle_enqueue(
        &mut self,
        now: Millis,
        item_id: String,
        lane: Lane,
        author: String,
        content: String,
    ) -> Result<(), EnqueueError> {
        self.handle_enqueue_for(now, item_id, lane, author, None, content)
    }

    /// [`Session::handle_enqueue`] of a message that acts for `acting_for` rather than its
    /// author alone (`None`: its author): a child's task, a parent's message to its child.
    ///
    /// # Errors
    /// As [`Session::handle_enqueue`]; [`EnqueueError::ActingForTooLarge`] for a set of more
    /// than [`MAX_TURN_AUTHORS`] principals.
    pub fn handle_enqueue_for(
        &mut self,
        now: Millis,
        item_id: String,
        lane: Lane,
        author: String,
        acting_for: Option<Vec<String>>,
        content: String,
    ) -> Result<(), EnqueueError> {
        self.enqueue(now, item_id, lane, author, acting_for, content, None)
    }

    /// A person's message with a reasoning setting for its turn (`POST …/enqueue
    /// {reasoning}`, checked by the host against the model): queued as
    /// [`Session::handle_enqueue`] does, or, when `once`, as [`Session::handle_enqueue_once`]
    /// does (`Ok(false)`: already known, not queued again). When delivered, its setting is the
    /// turn's ([`Session::turn_reasoning`]) until the turn ends.
    ///
    /// # Errors
    /// As [`Session::handle_enqueue`].
    #[allow(clippy::too_many_arguments)]
    pub fn handle_enqueue_with_reasoning(
        &mut self,
        now: Millis,
        item_id: String,
        lane: Lane,
        author: String,
        content: String,
        reasoning: Option<Reasoning>,
        once: bool,
    ) -> Result<bool, EnqueueError> {
        if once && self.knows_item(&item_id) {
            return Ok(false);
        }
        self.enqueue(now, item_id, lane, author, None, content, reasoning)
            .map(|()| true)
    }

    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &mut self,
        now: Millis,
        item_id: String,
        lane: Lane,
        author: String,
        acting_for: Option<Vec<String>>,
        content: String,
        reasoning: Option<Reasoning>,
    ) -> Result<(), EnqueueError> {
        if acting_for
            .as_ref()
            .is_some_and(|set| set.len() > MAX_TURN_AUTHORS + 1)
        {
            return Err(EnqueueError::ActingForTooLarge);
        }
        if self.queue.len() >= MAX_QUEUE_ITEMS {
            return Err(EnqueueError::QueueFull);
        }
        if self.queue_bytes + content.len() > MAX_QUEUE_BYTES {
            return Err(EnqueueError::QueueBytes {
                queued: self.queue_bytes,
                item: content.len(),
            });
        }
        if let Some(limit) = self.budget_exceeded() {
            return Err(EnqueueError::BudgetExceeded { limit });
        }
        let item = QueueItem {
            id: item_id,
            lane,
            author,
            acting_for,
            content,
            reasoning,
            enqueued_at: now.unix_seconds(),
            system: None,
        };
        self.queue_bytes += item.bytes();
        self.effects.push_back(Effect::QueueInsert(item.clone()));
        self.queue.push(item);
        if self.state.status == Status::Stopped {
            self.set_status(Status::Idle);
        }
        if self.state.phase == Phase::Idle {
            self.next_step(now, false);
        }
        Ok(())
    }

    /// Queues a message its sender names by an item id of its own ([`keyed_item_id`]): an id
    /// already queued or recently delivered (the last 256) is not queued again (`Ok(false)`), so
    /// a sender unsure whether a message arrived (a chat hook retried after a crash) may send it
    /// again.
    ///
    /// # Errors
    /// As [`Session::handle_enqueue`].
    pub fn handle_enqueue_once(
        &mut self,
        now: Millis,
        item_id: String,
        lane: Lane,
        author: String,
        content: String,
    ) -> Result<bool, EnqueueError> {
        if self.knows_item(&item_id) {
            return Ok(false);
        }
        self.handle_enqueue(now, item_id, lane, author, content)
            .map(|()| true)
    }

    /// Whether an item of this id waits in the queue or was delivered recently.
    fn knows_item(&self, item_id: &str) -> bool {
        self.queue.iter().any(|item| item.id == item_id)
            || self.state.delivered.iter().any(|id| id == item_id)
    }

    /// Queues a message from the server itself on the `system` lane (a child's lifecycle, a
    /// finished background job): delivered at the next step boundary as a `custom_message` of
    /// `input`'s type, starting a turn when the session is idle. A stopped session stays
    /// stopped (the item waits for whoever resumes it): only a person resumes a stopped session.
    ///
    /// `item_id` names the event: an id already queued or recently delivered is not queued
    /// again (returns `Ok(false)`), so a sender may repeat a report it is unsure arrived.
    ///
    /// # Errors
    /// As [`Session::handle_enqueue`].
    pub fn handle_system_message(
        &mut self,
        now: Millis,
        item_id: String,
        input: SystemInput,
        content: String,
    ) -> Result<bool, EnqueueError> {
        if self.knows_item(&item_id) {
            return Ok(false);
        }
        if self.queue.len() >= MAX_QUEUE_ITEMS {
            return Err(EnqueueError::QueueFull);
        }
        if self.queue_bytes + content.len() > MAX_QUEUE_BYTES {
            return Err(EnqueueError::QueueBytes {
                queued: self.queue_bytes,
                item: content.len(),
            });
        }
        let item = QueueItem {
            id: item_id,
            lane: Lane::System,
            author: "wuhu".into(),
            acting_for: None,
            content,
            reasoning: None,
            enqueued_at: now.unix_seconds(),
            system: Some(input),
        };
        self.queue_bytes += item.bytes();
        self.effects.push_back(Effect::QueueInsert(item.clone()));
        self.queue.push(item);
        // Unlike a person's enqueue, this leaves a stopped session stopped: `next_step` starts
        // nothing while the status is `stopped`.
        if self.state.phase == Phase::Idle {
            self.next_step(now, false);
        }
        Ok(true)
    }

    /// Cancels a queued item.
    ///
    /// # Errors
    /// [`CancelError`] when the item is unknown or already delivered.
    pub fn handle_cancel(&mut self, item_id: &str) -> Result<(), CancelError> {
        if let Some(pos) = self.queue.iter().position(|item| item.id == item_id) {
            let item = self.queue.remove(pos);
            self.queue_bytes -= item.bytes();
            self.effects.push_back(Effect::QueueDelete {
                id: item.id,
                reason: crate::wire::QueueRemoval::Cancelled,
            });
            return Ok(());
        }
        if self.state.delivered.iter().any(|id| id == item_id) {
            return Err(CancelError::AlreadyDelivered);
        }
        Err(CancelError::NotFound)
    }

    /// Stops the session. Returns how many tool calls were given a "stopped" result.
    pub fn handle_stop(&mut self, now: Millis, by: &str) -> usize {
        let phase = std::mem::replace(&mut self.state.phase, Phase::Idle);
        let mut stopped_calls = 0;
        match phase {
            Phase::Idle => {}
            Phase::Inference { step, .. } | Phase::RetryWait { step, .. } => {
                self.effects.push_back(Effect::CancelInference { step });
            }
            Phase::Tools {
                step,
                running,
                remaining,
            } => {
                self.effects.push_back(Effect::CancelTools { step });
                self.state.awaiting_approval.clear();
                for call in running.iter().chain(remaining.iter().flatten()) {
                    stopped_calls += 1;
                    self.append_tool_result(
                        now,
                        call,
                        "Tool call stopped: the session was stopped before it finished.".into(),
                        true,
                        Vec::new(),
                    );
                }
            }
        }
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::EXECUTION_STOPPED.into(),
                data: serde_json::json!({ "by": by, "stoppedToolCalls": stopped_calls }),
            },
        );
        self.set_status(Status::Stopped);
        stopped_calls
    }

    /// Delivers the outcome of the LLM request of `step`. Stale steps are ignored.
    pub fn handle_inference_done(
        &mut self,
        now: Millis,
        step: u64,
        outcome: Result<AssistantMessage, LlmFailure>,
    ) {
        let attempt = match self.state.phase {
            Phase::Inference {
                step: current,
                attempt,
            } if current == step => attempt,
            _ => return,
        };
        match outcome {
            Ok(message) => {
                let calls: Vec<ToolCall> = message.tool_calls().cloned().collect();
                self.append(
                    now,
                    EntryPayload::Message {
                        message: Message::Assistant(message),
                    },
                );
                if calls.is_empty() {
                    self.state.phase = Phase::Idle;
                    self.next_step(now, false);
                } else {
                    self.state.phase = Phase::Tools {
                        step,
                        running: Vec::new(),
                        remaining: batches(calls),
                    };
                    self.next_batch(now);
                }
            }
            Err(failure) => {
                // Jitter from the inputs, not `self.rng`: entry ids stay independent of retries.
                let jitter =
                    SplitMix64::new(now.0 ^ step.rotate_left(32) ^ u64::from(attempt)).next_u64();
                let delay = self.retry.delay_ms(&failure, attempt, jitter);
                let will_retry = delay.is_some();
                self.append(
                    now,
                    EntryPayload::Custom {
                        custom_type: custom_types::LLM_ERROR.into(),
                        data: serde_json::json!({
                            "message": failure.message,
                            "status": failure.status,
                            "attempt": attempt,
                            "willRetry": will_retry,
                            "retryInMs": delay,
                        }),
                    },
                );
                if let Some(delay) = delay {
                    self.state.phase = Phase::RetryWait {
                        step,
                        attempt: attempt + 1,
                        at: Millis(now.0.saturating_add(delay)),
                    };
                } else {
                    self.state.phase = Phase::Idle;
                    self.go_idle();
                }
            }
        }
    }

    /// Records a compaction (its summary written by the host's LLM call): appends the
    /// `compaction` entry, from which later requests are built (`crate::compaction`). Allowed
    /// in any phase: the summary covers only entries before `first_kept_cursor`, and every
    /// later one stays in the context. Returns the entry's cursor.
    ///
    /// # Errors
    /// [`CompactionRefused`] when `first_kept_cursor` is not after the latest compaction's
    /// (a concurrent compaction won) or is not an entry of this session, or `kept_cursors` is
    /// not an ascending list of at most `MAX_KEPT_MESSAGES` entries before it.
    pub fn handle_compaction(
        &mut self,
        now: Millis,
        compaction: Compaction,
    ) -> Result<u64, CompactionRefused> {
        let kept_ok = compaction.kept_cursors.len() <= crate::compaction::MAX_KEPT_MESSAGES
            && compaction.kept_cursors.windows(2).all(|w| w[0] < w[1])
            && compaction
                .kept_cursors
                .iter()
                .all(|&c| c > 0 && c < compaction.first_kept_cursor);
        if compaction.first_kept_cursor == 0
            || compaction.first_kept_cursor > self.last_cursor()
            || !self.state.context.accepts(compaction.first_kept_cursor)
            || !kept_ok
        {
            return Err(CompactionRefused {
                first_kept_cursor: compaction.first_kept_cursor,
            });
        }
        Ok(self.append(now, EntryPayload::Compaction(compaction)))
    }

    /// The host found the tenant's budget spent (`limit` reached, see
    /// `crate::tenant_usage::TenantBudget`) before the request of `step`: the turn ends there
    /// with a `wuhu_budget_exceeded_v1` notice (`scope: tenant`) instead. Changes nothing unless
    /// `step` still waits for its request. Returns whether the turn ended.
    pub fn handle_tenant_budget_exceeded(
        &mut self,
        now: Millis,
        step: u64,
        limit: &str,
        spent: Spent,
        budget: Budget,
    ) -> bool {
        if !matches!(self.state.phase, Phase::Inference { step: s, .. } if s == step) {
            return false;
        }
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::BUDGET_EXCEEDED.into(),
                data: serde_json::json!({
                    "text": format!(
                        "The tenant's budget is spent ({} tokens, ${:.4} used): the turn ended. An admin can raise it.",
                        spent.tokens, spent.usd
                    ),
                    "scope": "tenant",
                    "limit": limit,
                    "spent": spent,
                    "budget": budget,
                }),
            },
        );
        self.state.phase = Phase::Idle;
        self.go_idle();
        true
    }

    /// The host found that the request of `step` would go to a model without a price while a
    /// USD limit applies (`crate::llm::choice::check_priced`: a budget set, or a price removed,
    /// after the model was chosen): the turn ends there with a `wuhu_unpriced_model_v1` notice
    /// instead, and nothing is spent. Changes nothing unless `step` still waits for its
    /// request. Returns whether the turn ended.
    pub fn handle_unpriced_model(
        &mut self,
        now: Millis,
        step: u64,
        refused: &crate::llm::choice::UnpricedModel,
    ) -> bool {
        if !matches!(self.state.phase, Phase::Inference { step: s, .. } if s == step) {
            return false;
        }
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::UNPRICED_MODEL.into(),
                data: serde_json::json!({
                    "text": format!("The turn ended before its request: {refused}."),
                    "provider": refused.provider,
                    "model": refused.model,
                    "limits": refused.limits,
                }),
            },
        );
        self.state.phase = Phase::Idle;
        self.go_idle();
        true
    }

    /// Records that `by` switched the session from `from` to `to` (the host stores the new
    /// header): a `wuhu_model_changed_v1` notice. The next request is built for the new model,
    /// in its dialect; reasoning of another provider's replies is not sent (it cannot be
    /// verified there), and the notice says so.
    pub fn handle_model_changed(&mut self, now: Millis, from: &Header, to: &Header, by: &str) {
        let mut text = format!(
            "{by} switched the model from {} ({}) to {} ({}).",
            from.model, from.provider, to.model, to.provider
        );
        if from.provider != to.provider {
            text.push_str(&format!(
                " Reasoning of earlier {} replies is not sent to {}.",
                from.provider, to.provider
            ));
        }
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::MODEL_CHANGED.into(),
                data: serde_json::json!({
                    "text": text,
                    "from": {"provider": from.provider, "model": from.model},
                    "to": {"provider": to.provider, "model": to.model},
                    "by": by,
                }),
            },
        );
    }

    /// `PATCH {reasoning}` changed the session's reasoning setting (the host saved it in the
    /// header): a `wuhu_reasoning_changed_v1` notice, so readers of the transcript see from
    /// where on the model reasoned how much.
    ///
    /// `why`: a sentence saying why, when it was not asked for (a model switch the setting does
    /// not suit removed it).
    pub fn handle_reasoning_changed(
        &mut self,
        now: Millis,
        from: Option<Reasoning>,
        to: Option<Reasoning>,
        by: &str,
        why: Option<&str>,
    ) {
        let describe = |r: Option<Reasoning>| match r {
            None => "the provider's default".to_string(),
            Some(Reasoning {
                effort,
                budget_tokens: None,
            }) => format!("{} effort", effort.as_str()),
            Some(Reasoning {
                effort,
                budget_tokens: Some(budget),
            }) => format!("{} effort, {budget} thinking tokens", effort.as_str()),
        };
        let mut text = format!(
            "{by} changed the reasoning from {} to {}.",
            describe(from),
            describe(to)
        );
        if let Some(why) = why {
            text.push(' ');
            text.push_str(why);
        }
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::REASONING_CHANGED.into(),
                data: serde_json::json!({"text": text, "from": from, "to": to, "by": by}),
            },
        );
    }

    /// Entries that tell of something the host did outside a turn, appended in order (an
    /// environment made for a child when it got its gate slot: its notice and AGENTS.md).
    /// Changes nothing else: no turn starts.
    pub fn handle_notices(&mut self, now: Millis, entries: Vec<EntryPayload>) {
        for payload in entries {
            self.append(now, payload);
        }
    }

    /// A chat channel gave up posting a message of this session to its thread: a
    /// `wuhu_channel_undelivered_v1` notice, so people reading the session see what the thread
    /// did not get. Changes nothing else (no turn starts).
    pub fn handle_channel_undelivered(
        &mut self,
        now: Millis,
        channel: &str,
        key: &str,
        reason: &str,
    ) {
        let text = format!(
            "The chat channel {channel} could not post a message to its thread ({reason})."
        );
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::CHANNEL_UNDELIVERED.into(),
                data: serde_json::json!({
                    "text": text,
                    "channel": channel,
                    "key": key,
                    "reason": reason,
                }),
            },
        );
    }

    /// `by` sets the session's budget (an empty one: no limit), recorded in a
    /// `wuhu_budget_set_v1` notice. A raised budget lets the next enqueue start a turn again.
    pub fn handle_budget(&mut self, now: Millis, budget: Budget, by: &str) {
        self.state.budget = (budget != Budget::default()).then_some(budget);
        let spent = self.state.spent;
        self.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::BUDGET_SET.into(),
                data: serde_json::json!({
                    "text": format!("{by} set the session's budget."),
                    "budget": budget,
                    "spent": spent,
                    "by": by,
                }),
            },
        );
    }

    /// What the session's requests used.
    pub fn spent(&self) -> Spent {
        self.state.spent
    }

    /// The session's budget.
    pub fn budget(&self) -> Option<Budget> {
        self.state.budget
    }

    /// Which limit of the budget is reached, if any: the session's own requests and its
    /// children's count ([`Session::total_spent`]).
    pub fn budget_exceeded(&self) -> Option<&'static str> {
        self.state
            .budget
            .as_ref()
            .and_then(|b| b.exceeded_by(&self.total_spent()))
    }

    /// What the session and its children (as they last reported) spent: what its budget
    /// counts, and what it reports to its own parent.
    pub fn total_spent(&self) -> Spent {
        self.state.spent.plus(&self.state.children_spent)
    }

    /// The host summed what the session's children reported they spent (each child's own
    /// total, its children included; `orchestration::children_spent`). Counted against the
    /// session's budget from the next enqueue and the next step on.
    pub fn handle_children_spent(&mut self, spent: Spent) {
        self.state.children_spent = spent;
    }

    /// The older entries the context needs (see [`crate::compaction::Anchors`]).
    pub fn context_anchors(&self) -> &crate::compaction::Anchors {
        &self.state.context
    }

    /// Delivers one tool result. Stale or unknown calls are ignored.
    pub fn handle_tool_done(
        &mut self,
        now: Millis,
        step: u64,
        call_id: &str,
        content: String,
        is_error: bool,
    ) {
        self.handle_tool_done_with_blobs(now, step, call_id, content, is_error, Vec::new());
    }

    /// [`Session::handle_tool_done`] for a result that refers to blobs (output or files too
    /// large for the transcript, `crate::blobs`): the result entry keeps their references.
    pub fn handle_tool_done_with_blobs(
        &mut self,
        now: Millis,
        step: u64,
        call_id: &str,
        content: String,
        is_error: bool,
        blobs: Vec<crate::wire::BlobRef>,
    ) {
        let Phase::Tools {
            step: current,
            running,
            ..
        } = &mut self.state.phase
        else {
            return;
        };
        if *current != step {
            return;
        }
        let Some(pos) = running.iter().position(|call| call.id == call_id) else {
            return;
        };
        let call = running.remove(pos);
        let batch_done = running.is_empty();
        self.state.awaiting_approval.retain(|id| id != call_id);
        self.append_tool_result(now, &call, content, is_error, blobs);
        if batch_done {
            self.next_batch(now);
        }
    }

    /// Whether the call `call_id` of `step` is running (its result is still awaited).
    pub fn is_tool_running(&self, step: u64, call_id: &str) -> bool {
        matches!(&self.state.phase, Phase::Tools { step: current, running, .. }
            if *current == step && running.iter().any(|call| call.id == call_id))
    }

    /// Marks a running call as waiting for a person's approval (`awaiting`), or as past it.
    /// A waiting call has not started its work, so [`Session::handle_resume`] runs it again
    /// instead of giving it a "result lost" error. Ignored when the call is not running.
    pub fn handle_tool_awaiting_approval(&mut self, step: u64, call_id: &str, awaiting: bool) {
        if !self.is_tool_running(step, call_id) {
            return;
        }
        let marks = &mut self.state.awaiting_approval;
        marks.retain(|id| id != call_id);
        if awaiting {
            marks.push(call_id.to_string());
        }
    }

    /// Whether the running call `call_id` waits for a person's approval.
    pub fn is_tool_awaiting_approval(&self, call_id: &str) -> bool {
        self.state.awaiting_approval.iter().any(|id| id == call_id)
    }

    /// Appends entries a running tool produced before its result (an environment attached, an
    /// approval requested). Ignored when the call is no longer running.
    pub fn handle_tool_progress(
        &mut self,
        now: Millis,
        step: u64,
        call_id: &str,
        entries: Vec<EntryPayload>,
    ) {
        if self.is_tool_running(step, call_id) {
            for payload in entries {
                self.append(now, payload);
            }
        }
    }

    /// Call when [`Session::poll_deadline`] has passed.
    pub fn handle_timeout(&mut self, now: Millis) {
        if let Phase::RetryWait { step, attempt, at } = self.state.phase
            && now >= at
        {
            self.state.phase = Phase::Inference { step, attempt };
            self.effects.push_back(Effect::Infer { step });
        }
    }

    /// Re-issues the work that was in flight when the checkpoint was taken (after a restart).
    /// A half-streamed assistant message was never persisted, so inference simply runs again.
    /// Interrupted tool calls run again when idempotent or still waiting for an approval,
    /// otherwise get a "result lost" error.
    pub fn handle_resume(&mut self, now: Millis) {
        match &mut self.state.phase {
            Phase::Idle => {
                if self.state.status != Status::Stopped && !self.queue.is_empty() {
                    self.next_step(now, false);
                }
            }
            Phase::Inference { step, .. } => {
                let step = *step;
                self.effects.push_back(Effect::Infer { step });
            }
            Phase::RetryWait { .. } => self.handle_timeout(now),
            Phase::Tools { step, running, .. } => {
                let step = *step;
                let awaiting = &self.state.awaiting_approval;
                let (rerun, lost): (Vec<ToolCall>, Vec<ToolCall>) =
                    running.iter().cloned().partition(|call| {
                        tools::traits(&call.name).is_some_and(|t| t.idempotent)
                            || awaiting.contains(&call.id)
                    });
                running.retain(|call| rerun.iter().any(|r| r.id == call.id));
                for call in &lost {
                    self.append_tool_result(
                        now,
                        call,
                        "Tool result lost: the server restarted while the call was running.".into(),
                        true,
                        Vec::new(),
                    );
                }
                if !rerun.is_empty() {
                    self.effects
                        .push_back(Effect::RunTools { step, calls: rerun });
                } else {
                    self.next_batch(now);
                }
            }
        }
    }

    /// Delivers lanes at a step boundary and starts inference, or goes idle.
    /// `after_tools`: tool results are pending for the model, so it must be asked again.
    fn next_step(&mut self, now: Millis, after_tools: bool) {
        debug_assert_eq!(self.state.phase, Phase::Idle);
        if self.state.status == Status::Stopped {
            return;
        }
        if !after_tools {
            // The agent would stop here: whatever is delivered now starts a new turn.
            self.state.turn_authors.clear();
            self.state.turn_reasoning = None;
        }
        let mut delivered = self.deliver(now, |lane| matches!(lane, Lane::Steer | Lane::System));
        if !after_tools && delivered == 0 {
            delivered = self.deliver(now, |lane| lane == Lane::FollowUp);
        }
        if (after_tools || delivered > 0)
            && let Some(limit) = self.budget_exceeded()
        {
            // A request starts only under the budget: the turn ends here, visibly.
            let spent = self.total_spent();
            let budget = self.state.budget.unwrap_or_default();
            self.append(
                now,
                EntryPayload::Custom {
                    custom_type: custom_types::BUDGET_EXCEEDED.into(),
                    data: serde_json::json!({
                        "text": format!(
                            "The session's budget is spent ({} tokens, ${:.4} used): the turn ended. Raise the budget to continue.",
                            spent.tokens, spent.usd
                        ),
                        "limit": limit,
                        "spent": spent,
                        "budget": budget,
                    }),
                },
            );
            self.go_idle();
            return;
        }
        if after_tools || delivered > 0 {
            self.state.step += 1;
            let step = self.state.step;
            self.state.phase = Phase::Inference { step, attempt: 1 };
            self.set_status(Status::Running);
            self.effects.push_back(Effect::Infer { step });
        } else {
            self.go_idle();
        }
    }

    /// Starts the next batch of tool calls, or skips the rest when steer is waiting.
    fn next_batch(&mut self, now: Millis) {
        let Phase::Tools {
            step,
            running,
            remaining,
        } = &mut self.state.phase
        else {
            return;
        };
        debug_assert!(running.is_empty());
        let step = *step;
        let steer_waiting = self
            .queue
            .iter()
            .any(|item| matches!(item.lane, Lane::Steer | Lane::System));
        if steer_waiting || remaining.is_empty() {
            let skipped: Vec<ToolCall> = remaining.drain(..).flatten().collect();
            self.state.phase = Phase::Idle;
            for call in &skipped {
                self.append_tool_result(
                    now,
                    call,
                    "Tool call skipped: a new message arrived before it ran.".into(),
                    true,
                    Vec::new(),
                );
            }
            self.next_step(now, true);
            return;
        }
        let batch = remaining.remove(0);
        // Unknown tools fail at once; they never reach the host.
        let (known, unknown): (Vec<ToolCall>, Vec<ToolCall>) = batch
            .into_iter()
            .partition(|call| tools::traits(&call.name).is_some());
        running.extend(known.iter().cloned());
        for call in &unknown {
            let message = format!(
                "Unknown tool {:?}. Available tools: {}.",
                call.name,
                tool_names()
            );
            self.append_tool_result(now, call, message, true, Vec::new());
        }
        if known.is_empty() {
            self.next_batch(now);
        } else {
            self.effects
                .push_back(Effect::RunTools { step, calls: known });
        }
    }

    fn deliver(&mut self, now: Millis, lanes: impl Fn(Lane) -> bool) -> usize {
        let (take, keep): (Vec<QueueItem>, Vec<QueueItem>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|item| lanes(item.lane));
        self.queue = keep;
        let n = take.len();
        for item in take {
            self.queue_bytes -= item.bytes();
            // In the same drain as the entry below: one write removes the row and records the
            // delivery.
            self.effects.push_back(Effect::QueueDelete {
                id: item.id.clone(),
                reason: crate::wire::QueueRemoval::Delivered,
            });
            let message = match item.lane {
                Lane::System => {
                    let (custom_type, details) = match item.system {
                        Some(input) => (input.custom_type, input.details),
                        None => (custom_types::SYSTEM_INPUT.into(), None),
                    };
                    Message::CustomMessage {
                        custom_type,
                        content: item.content,
                        details,
                    }
                }
                lane => {
                    match &item.acting_for {
                        None => add_principal(&mut self.state.turn_authors, &item.author),
                        Some(set) => {
                            for principal in set {
                                add_principal(&mut self.state.turn_authors, principal);
                            }
                        }
                    }
                    self.note_prompter(now, &item.author);
                    if item.reasoning.is_some() {
                        self.state.turn_reasoning = item.reasoning;
                    }
                    Message::User {
                        author: item.author,
                        content: item.content,
                        queue_item_id: Some(item.id.clone()),
                        lane: Some(lane),
                        acting_for: item.acting_for,
                    }
                }
            };
            self.append(now, EntryPayload::Message { message });
            self.state.delivered.push_back(item.id);
            if self.state.delivered.len() > REMEMBERED_DELIVERED {
                self.state.delivered.pop_front();
            }
        }
        n
    }

    /// Group chat escalation (seed 001): the first prompter owns the session; the first time
    /// anyone else prompts, a reminder the LLM sees is appended before their message.
    fn note_prompter(&mut self, now: Millis, author: &str) {
        let Some(owner) = self.state.owner.clone() else {
            self.state.owner = Some(author.to_string());
            return;
        };
        if owner == author || self.state.group_chat_since.is_some() {
            return;
        }
        let cursor = self.append(
            now,
            EntryPayload::Message {
                message: Message::CustomMessage {
                    custom_type: custom_types::GROUP_CHAT_REMINDER.into(),
                    content: format!(
                        "System reminder: this session is now a group chat. It belongs to {owner}; {author} has joined. \
                         From now on every user message starts with `[username]:` naming its author. \
                         Answer the person who wrote each message, and act on requests with the owner's interests in mind."
                    ),
                    details: Some(serde_json::json!({"owner": owner, "joined": author})),
                },
            },
        );
        self.state.group_chat_since = Some(cursor);
    }

    fn go_idle(&mut self) {
        self.state.turn_reasoning = None;
        if self.state.status == Status::Running {
            self.set_status(Status::Idle);
        }
        self.effects.push_back(Effect::Idle);
    }

    fn set_status(&mut self, status: Status) {
        if self.state.status != status {
            self.state.status = status;
            self.effects.push_back(Effect::StatusChanged(status));
        }
    }

    fn append_tool_result(
        &mut self,
        now: Millis,
        call: &ToolCall,
        content: String,
        is_error: bool,
        blobs: Vec<crate::wire::BlobRef>,
    ) {
        let result = ToolResult {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            content,
            is_error,
            blobs,
        };
        self.append(
            now,
            EntryPayload::Message {
                message: Message::ToolResult(result),
            },
        );
    }

    fn append(&mut self, now: Millis, payload: EntryPayload) -> u64 {
        let cursor = self.state.next_cursor.max(1);
        self.state.next_cursor = cursor + 1;
        let entry = Entry {
            cursor,
            id: self.rng.uuid(),
            created_at: now.unix_seconds(),
            payload,
        };
        let _ = self.state.context.observe(&entry);
        match &entry.payload {
            EntryPayload::Message {
                message:
                    Message::Assistant(AssistantMessage {
                        usage: Some(usage), ..
                    }),
            } => self.state.spent.add(usage),
            EntryPayload::Compaction(Compaction {
                usage: Some(usage), ..
            }) => self.state.spent.add(usage),
            _ => {}
        }
        self.effects.push_back(Effect::AppendEntry(entry));
        cursor
    }
}

/// Splits calls into batches: a run of parallel-safe calls is one batch; any other call is
/// a batch of its own.
fn batches(calls: Vec<ToolCall>) -> Vec<Vec<ToolCall>> {
    let mut out: Vec<Vec<ToolCall>> = Vec::new();
    let mut last_parallel = false;
    for call in calls {
        let parallel = tools::traits(&call.name).is_some_and(|t| t.parallel_safe);
        match out.last_mut() {
            Some(batch) if parallel && last_parallel => batch.push(call),
            _ => out.push(vec![call]),
        }
        last_parallel = parallel;
    }
    out
}

fn tool_names() -> String {
    tools::catalogue()
        .iter()
        .map(|t| t.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adds `principal` to a turn's acting-for set: once, and past [`MAX_TURN_AUTHORS`] as
/// [`MORE_PRINCIPALS`], so the set never loses anyone to its bound.
fn add_principal(set: &mut Vec<String>, principal: &str) {
    if set.iter().any(|p| p == principal) {
        return;
    }
    if set.len() < MAX_TURN_AUTHORS {
        set.push(principal.to_string());
    } else if !set.iter().any(|p| p == MORE_PRINCIPALS) {
        set.push(MORE_PRINCIPALS.to_string());
    }
}
