//! Durable delivery of a child's lifecycle to its parent (issue 35, decision 0041): the
//! **outbox** a child keeps in its own storage.
//!
//! * **Written with the change.** Each committed drain of a child that changes its state
//!   ([`crate::orchestration::turn_outcome`]) adds its events to the outbox in the same
//!   transaction as the drain: a report for the parent and, when the child settled, the release
//!   of its gate slot ([`events_for`]). A change that is committed is never without its events;
//!   one that is not committed has none.
//! * **In order, one at a time.** Only the head of the outbox is attempted ([`Outbox::due`]);
//!   nothing overtakes a row that has not been acknowledged, so the parent hears of a child's
//!   settling before the spawn that takes its slot runs.
//! * **Idempotent by event id.** A report's id is the id its parent gives the message it queues
//!   (`child-<id>-<state>-<cursor>`, [`crate::orchestration::parent_message`]); the parent keeps
//!   a report only when it is newer than what it recorded
//!   ([`crate::orchestration::accept_report`]), in the same transaction as the message it
//!   queues, so a report delivered twice wakes it once.
//! * **Acknowledged.** The parent answers after its commit; any answer is the acknowledgement
//!   (a report it already had is answered `accepted: false`). A parent that does not know the
//!   child, or is gone, answers 404: nobody is left to tell, and the row goes too.
//! * **Retried with a bounded backoff** ([`retry_delay_ms`]): 1 s after the first failure,
//!   doubling to at most [`MAX_RETRY_MS`] (60 s), by the child's alarm, until acknowledged; a row
//!   older than [`GIVE_UP_AFTER_MS`] (24 h) is dropped with a logged error.
//! * **Bounded.** A newer report supersedes every report before it that carries no message for
//!   the parent (`running`, `created`, `queued`: the parent keeps only the newest), and a newer
//!   release every release before it, so the outbox holds the settlings not yet told and one
//!   release; at most [`MAX_OUTBOX_ROWS`], the oldest report going first beyond it.
//! * **A release never frees a slot taken again.** A release names when the child settled
//!   (`settled_at`); the gate frees the slot only when it was granted before that
//!   ([`crate::orchestration::Gate::release`]), so a late release of a child that was given input
//!   and granted its slot again meanwhile changes nothing.

use serde::{Deserialize, Serialize};

use crate::orchestration::parent_message;
use crate::wire::ChildStatus;

/// At most this many rows wait in a child's outbox.
pub const MAX_OUTBOX_ROWS: usize = 64;
/// The first retry comes this long after the first failure.
pub const FIRST_RETRY_MS: u64 = 1_000;
/// Retries never wait longer than this.
pub const MAX_RETRY_MS: u64 = 60_000;
/// A row that could not be delivered for this long is dropped (logged).
pub const GIVE_UP_AFTER_MS: u64 = 24 * 60 * 60 * 1000;

/// What a row asks for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Event {
    /// Tell the parent (`ChildEvent`).
    Report {
        /// What the parent records.
        status: ChildStatus,
    },
    /// Free the child's gate slot, if it was granted before `settled_at`, and start the spawns
    /// the gate grants in its stead.
    #[serde(rename_all = "camelCase")]
    ReleaseSlot {
        /// When the child settled (unix ms).
        settled_at: u64,
    },
}

/// One row of the outbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The event id: unique in the child's outbox, and the same for the same event.
    pub id: String,
    /// What to do.
    pub event: Event,
    /// When it was written (unix ms).
    pub created_at: u64,
    /// Failed attempts so far.
    pub attempts: u32,
    /// When it may be attempted (unix ms).
    pub next_at: u64,
}

/// The id of a report: the id of the message its parent queues for it.
pub fn report_id(status: &ChildStatus) -> String {
    parent_message(status).map_or_else(
        || {
            format!(
                "child-{}-{}-{}",
                status.id,
                status.lifecycle.name(),
                status.cursor
            )
        },
        |m| m.id,
    )
}

/// The events of a child's committed change to `status` at `now`: its report, and for a
/// settled child the release of its slot after it.
pub fn events_for(status: &ChildStatus, now: u64) -> Vec<(String, Event)> {
    let mut events = vec![(
        report_id(status),
        Event::Report {
            status: status.clone(),
        },
    )];
    if status.lifecycle.is_settled() {
        events.push((
            format!("release-{}-{}", status.id, status.cursor),
            Event::ReleaseSlot { settled_at: now },
        ));
    }
    events
}

/// How long to wait after the `attempts`-th failure (1-based): 1 s, 2 s, 4 s … at most 60 s.
pub fn retry_delay_ms(attempts: u32) -> u64 {
    let shift = attempts.saturating_sub(1).min(16);
    (FIRST_RETRY_MS << shift).min(MAX_RETRY_MS)
}

/// How an attempt at a row went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Acknowledged (the parent committed the report, or the gate answered the release).
    Done,
    /// Nobody to tell: the parent does not know the child or is gone (404).
    Gone,
    /// Not acknowledged (unreachable, an error, a timeout): retried.
    Failed,
}

/// What the host does with a row after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterAttempt {
    /// Delete the row.
    Delete,
    /// Keep it, with this many failures, for another attempt at `next_at`.
    Retry {
        /// Failed attempts so far.
        attempts: u32,
        /// When to try again (unix ms).
        next_at: u64,
    },
    /// Delete it and log that it was given up after [`GIVE_UP_AFTER_MS`].
    GiveUp,
}

/// What a push changed: rows to insert and rows to delete, in the drain's transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pushed {
    /// New rows, in order.
    pub insert: Vec<Row>,
    /// Ids of rows superseded or beyond the bound.
    pub delete: Vec<String>,
}

/// A child's outbox: its rows in order (the host keeps them in a table).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outbox {
    rows: Vec<Row>,
}

impl Outbox {
    /// The outbox of these stored rows, in their stored order.
    pub fn new(rows: Vec<Row>) -> Outbox {
        Outbox { rows }
    }

    /// The rows, in order.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Adds the events of a committed change to `status` at `now` (see the module docs:
    /// superseded reports go, the bound holds, an id already present is not added again).
    pub fn push(&mut self, status: &ChildStatus, now: u64) -> Pushed {
        let mut pushed = Pushed::default();
        // The new report supersedes reports that carry nothing for the parent's system lane
        // (the parent keeps only the newest state), and a new release every release before it
        // (it frees whatever they would, later).
        let releases = status.lifecycle.is_settled();
        let events = events_for(status, now);
        let superseded: Vec<String> = self
            .rows
            .iter()
            // A change pushed again (a replayed drain) supersedes nothing of its own.
            .filter(|r| events.iter().all(|(id, _)| id != &r.id))
            .filter(|r| match &r.event {
                Event::Report { status } => parent_message(status).is_none(),
                Event::ReleaseSlot { .. } => releases,
            })
            .map(|r| r.id.clone())
            .collect();
        self.rows.retain(|r| !superseded.contains(&r.id));
        pushed.delete.extend(superseded);
        for (id, event) in events {
            if self.rows.iter().any(|r| r.id == id) {
                continue;
            }
            let row = Row {
                id,
                event,
                created_at: now,
                attempts: 0,
                next_at: now,
            };
            self.rows.push(row.clone());
            pushed.insert.push(row);
        }
        while self.rows.len() > MAX_OUTBOX_ROWS {
            // The oldest report goes (the release stays: a slot is never kept).
            let Some(i) = self
                .rows
                .iter()
                .position(|r| matches!(r.event, Event::Report { .. }))
            else {
                break;
            };
            let dropped = self.rows.remove(i);
            pushed.insert.retain(|r| r.id != dropped.id);
            if !pushed.delete.contains(&dropped.id) {
                pushed.delete.push(dropped.id);
            }
        }
        pushed
    }

    /// The row to attempt now: the head, when it is due. Nothing overtakes the head.
    pub fn due(&self, now: u64) -> Option<&Row> {
        self.rows.first().filter(|r| r.next_at <= now)
    }

    /// When the head is due (the alarm's time), if there is one.
    pub fn next_at(&self) -> Option<u64> {
        self.rows.first().map(|r| r.next_at)
    }

    /// Records how an attempt at row `id` went at `now`; what the host does with the row.
    /// `None` when the row is no longer there (superseded meanwhile).
    pub fn attempted(&mut self, id: &str, attempt: Attempt, now: u64) -> Option<AfterAttempt> {
        let i = self.rows.iter().position(|r| r.id == id)?;
        let after = match attempt {
            Attempt::Done | Attempt::Gone => AfterAttempt::Delete,
            Attempt::Failed if now.saturating_sub(self.rows[i].created_at) >= GIVE_UP_AFTER_MS => {
                AfterAttempt::GiveUp
            }
            Attempt::Failed => {
                let row = &mut self.rows[i];
                row.attempts = row.attempts.saturating_add(1);
                row.next_at = now + retry_delay_ms(row.attempts);
                return Some(AfterAttempt::Retry {
                    attempts: row.attempts,
                    next_at: row.next_at,
                });
            }
        };
        self.rows.remove(i);
        Some(after)
    }
}

#[cfg(test)]
mod tests;
