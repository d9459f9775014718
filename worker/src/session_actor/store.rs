//! The session actor's SQLite tables. Every function here is synchronous. [`Store::commit`]
//! runs one drain's writes (entries, queue rows, meta, checkpoint) inside `transactionSync`:
//! they all commit or, when one fails, none does.
//!
//! Tables: `meta` (key/value: `session`, `checkpoint`, `environments`, `archived_through`),
//! `entries` (one row per entry, or its out-of-line placeholder), `queue` (one row per
//! undelivered item, in insertion order), `segments` (archived ranges), `lifecycle_outbox` (a
//! child's lifecycle events not yet acknowledged, in order: `wuhu_core::lifecycle`). A drain
//! also writes the parent's `children` rows its reports changed (`children::ChildStore`'s
//! table), so a report's record and the message it queues commit together.

use std::cell::RefCell;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use worker::{SqlStorage, SqlStorageValue};
use wuhu_core::archive::SegmentRef;
use wuhu_core::session::{Checkpoint, QueueItem};
use wuhu_core::wire::{Entry, Header, Lane};

use crate::schema::{Migration, migrate};

#[wasm_bindgen]
extern "C" {
    /// `ctx.storage`, for the one method workers-rs does not bind.
    #[wasm_bindgen(extends = js_sys::Object)]
    #[derive(Clone, Debug)]
    pub(crate) type RawStorage;

    #[wasm_bindgen(method, catch, js_name = transactionSync)]
    fn transaction_sync(this: &RawStorage, closure: &js_sys::Function) -> Result<JsValue, JsValue>;
}

/// What the actor knows about its session besides the loop state.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionMeta {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) created_by: String,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) title: Option<String>,
    pub(crate) header: Header,
    /// Who may see and prompt the session.
    #[serde(default)]
    pub(crate) access: wuhu_core::authority::Access,
    /// Where it sits in its session tree (a root has the default).
    #[serde(default)]
    pub(crate) lineage: wuhu_core::orchestration::Lineage,
    /// A child's input that waits for a slot of the concurrency gate (at most
    /// `children::MAX_PENDING_INPUTS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pending: Vec<PendingInput>,
    /// A child's environment resolved and approved by its spawn, made when the child gets its
    /// gate slot (`ChildInit::construct`); `None` once made (or when it could not be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) construct: Option<Box<wuhu_core::wire::ResolveEnvironmentResponse>>,
    /// The environment made for this child at its slot (what `construct` was), while it is
    /// attached: its worktree is removed when the child ends (`children::end_worktree`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) made: Option<Box<wuhu_core::wire::ResolveEnvironmentResponse>>,
    /// The branch and commit of the child's worktree when it was removed at the child's end:
    /// its reports carry them (`ChildStatus::branch`, `head`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) worktree_end: Option<WorktreeEnd>,
    /// For a fork: the session whose entries `1..=cursor` are its history (read from there,
    /// never copied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) forked_from: Option<wuhu_core::wire::ForkedFrom>,
    /// The chat binding whose thread it is, or whose thread's session spawned it
    /// (`SessionInit::channel`); `None` in sessions stored before it was kept, whose guests
    /// then have no workspace folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) channel: Option<String>,
}

/// Where a child's removed worktree left its work.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WorktreeEnd {
    pub(crate) branch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) head: Option<String>,
}

/// A message a child keeps until the gate gives it a slot.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PendingInput {
    pub(crate) content: String,
    pub(crate) lane: Lane,
    pub(crate) author: String,
    /// Whom it acts for (`ChildInput::acting_for`); `None` in rows kept before acting-for sets
    /// existed: nobody (the safe reading), not its author.
    #[serde(default)]
    pub(crate) acting_for: Option<Vec<String>>,
}

#[derive(Clone)]
pub(crate) struct Store {
    sql: SqlStorage,
    raw: RawStorage,
}

/// What a session has in storage.
pub(crate) struct Stored {
    pub(crate) meta: SessionMeta,
    pub(crate) checkpoint: Checkpoint,
    /// Undelivered items, in enqueue order.
    pub(crate) queue: Vec<QueueItem>,
    /// The newest cursor of any stored entry, in SQLite or in an archived segment (0: none).
    pub(crate) newest_cursor: u64,
}

/// One entry's row.
pub(crate) struct EntryRow {
    pub(crate) cursor: u64,
    pub(crate) created_at: i64,
    /// The entry's JSON or its out-of-line placeholder's.
    pub(crate) body: String,
}

/// The writes of one drain, committed together by [`Store::commit`].
#[derive(Default)]
pub(crate) struct Writes {
    pub(crate) queue_inserts: Vec<QueueItem>,
    pub(crate) entries: Vec<EntryRow>,
    pub(crate) queue_deletes: Vec<String>,
    /// The session meta's JSON, when it changed.
    pub(crate) meta: Option<String>,
    /// The checkpoint's JSON.
    pub(crate) checkpoint: String,
    /// Usage reported to the tenant index through this cursor, when a report moved it since
    /// the last commit (written with the next commit rather than in a commit of its own).
    pub(crate) usage_reported_through: Option<u64>,
    /// A child's lifecycle events, written with the change they tell of.
    pub(crate) outbox_inserts: Vec<wuhu_core::lifecycle::Row>,
    /// Outbox rows superseded by them.
    pub(crate) outbox_deletes: Vec<String>,
    /// A parent's records of its children that reports changed: `(child id, status JSON)`.
    pub(crate) children: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct QueueRow {
    id: String,
    lane: String,
    author: String,
    content: String,
    enqueued_at: f64,
    /// `QueueItem::system` as JSON, for items from the server.
    system: Option<String>,
    /// `QueueItem::acting_for` as JSON.
    #[serde(default)]
    acting_for: Option<String>,
    /// `QueueItem::reasoning` as JSON.
    #[serde(default)]
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct ValueRow {
    value: String,
}

#[derive(Deserialize)]
struct BodyRow {
    body: String,
}

#[derive(Deserialize)]
struct OutboxRow {
    row: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
    bytes: Option<f64>,
}

#[derive(Deserialize)]
struct MinRow {
    m: Option<f64>,
}

#[derive(Deserialize)]
struct SegmentRow {
    first: f64,
    last: f64,
}

type SqlResult<T> = worker::Result<T>;

/// The session's schema, in order (numbered from 1 by position; never reorder or remove one).
const MIGRATIONS: &[Migration] = &[
    // 1.
    Migration::Sql("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"),
    // 2.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS entries (cursor INTEGER PRIMARY KEY, created_at INTEGER NOT NULL, body TEXT NOT NULL)",
    ),
    // 3.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS segments (first INTEGER PRIMARY KEY, last INTEGER NOT NULL)",
    ),
    // 4. `seq` is the rowid: a new row always gets a larger one than every row present, so
    // ordering by it is enqueue order. `content` is raw text (at most a request body), not JSON,
    // so escaping cannot inflate a row past the 2 MB row limit.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS queue (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, lane TEXT NOT NULL, author TEXT NOT NULL, content TEXT NOT NULL, enqueued_at INTEGER NOT NULL)",
    ),
    // 5. Child sessions (issue 12): the `custom_message` type and details of a system item.
    Migration::AddColumn {
        table: "queue",
        column: "system",
        definition: "TEXT",
    },
    // 6. Acting-for sets (issue 29): whom a child's task or a parent's message acts for, as a
    // JSON array; NULL: its author.
    Migration::AddColumn {
        table: "queue",
        column: "acting_for",
        definition: "TEXT",
    },
    // 7. Reasoning settings (issue 36): the setting of the turn a message starts or joins, as
    // JSON; NULL: none.
    Migration::AddColumn {
        table: "queue",
        column: "reasoning",
        definition: "TEXT",
    },
    // 8. A child's lifecycle outbox (issue 35): `seq` is the order of delivery, `row` a
    // `wuhu_core::lifecycle::Row` as JSON (at most `MAX_OUTBOX_ROWS` rows).
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS lifecycle_outbox (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, row TEXT NOT NULL)",
    ),
];

impl Store {
    /// Creates the tables again after the storage was dropped (a deleted session created again
    /// in the same isolate).
    pub(crate) fn recreate(&self) -> SqlResult<()> {
        Store::open(self.sql.clone(), self.raw.clone()).map(|_| ())
    }

    pub(crate) fn open(sql: SqlStorage, raw: RawStorage) -> SqlResult<Store> {
        migrate(&sql, "session", MIGRATIONS).map_err(worker::Error::RustError)?;
        Ok(Store { sql, raw })
    }

    /// Runs `writes` in a transaction: all of them commit, or none does.
    ///
    /// # Errors
    /// The first failing write (nothing is then written), including an entry whose cursor is
    /// already stored with different content.
    pub(crate) fn commit(&self, writes: Writes) -> SqlResult<()> {
        self.transaction(move |store| store.write_all(&writes))
    }

    fn write_all(&self, writes: &Writes) -> SqlResult<()> {
        for item in &writes.queue_inserts {
            let lane = serde_json::to_value(item.lane)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            self.sql.exec(
                "INSERT INTO queue (id, lane, author, content, enqueued_at, system, acting_for, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                vec![
                    item.id.as_str().into(),
                    lane.into(),
                    item.author.as_str().into(),
                    item.content.as_str().into(),
                    item.enqueued_at.into(),
                    match &item.system {
                        Some(system) => serde_json::to_string(system)
                            .map_err(|e| worker::Error::RustError(e.to_string()))?
                            .into(),
                        None => SqlStorageValue::Null,
                    },
                    match &item.acting_for {
                        Some(set) => serde_json::to_string(set)
                            .map_err(|e| worker::Error::RustError(e.to_string()))?
                            .into(),
                        None => SqlStorageValue::Null,
                    },
                    match &item.reasoning {
                        Some(reasoning) => serde_json::to_string(reasoning)
                            .map_err(|e| worker::Error::RustError(e.to_string()))?
                            .into(),
                        None => SqlStorageValue::Null,
                    },
                ],
            )?;
        }
        for entry in &writes.entries {
            self.insert_entry(entry)?;
        }
        for id in &writes.queue_deletes {
            self.sql
                .exec("DELETE FROM queue WHERE id = ?", vec![id.as_str().into()])?;
        }
        if let Some(meta) = &writes.meta {
            self.put_meta("session", meta)?;
        }
        if let Some(through) = writes.usage_reported_through {
            self.save_usage_reported_through(through)?;
        }
        for id in &writes.outbox_deletes {
            self.outbox_delete(id)?;
        }
        for row in &writes.outbox_inserts {
            let json =
                serde_json::to_string(row).map_err(|e| worker::Error::RustError(e.to_string()))?;
            self.sql.exec(
                "INSERT INTO lifecycle_outbox (id, row) VALUES (?, ?) ON CONFLICT(id) DO NOTHING",
                vec![row.id.as_str().into(), json.into()],
            )?;
        }
        for (id, status) in &writes.children {
            self.sql.exec(
                "INSERT INTO children (id, status) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET status = excluded.status",
                vec![id.as_str().into(), status.as_str().into()],
            )?;
        }
        self.put_meta("checkpoint", &writes.checkpoint)
    }

    /// The child's lifecycle outbox, in order.
    pub(crate) fn outbox(&self) -> SqlResult<wuhu_core::lifecycle::Outbox> {
        let rows: Vec<OutboxRow> = self
            .sql
            .exec("SELECT row FROM lifecycle_outbox ORDER BY seq", None)?
            .to_array()?;
        Ok(wuhu_core::lifecycle::Outbox::new(
            rows.into_iter()
                .filter_map(|r| serde_json::from_str(&r.row).ok())
                .collect(),
        ))
    }

    /// Saves an outbox row after a failed attempt (its count and next time).
    pub(crate) fn outbox_update(&self, row: &wuhu_core::lifecycle::Row) -> SqlResult<()> {
        let json =
            serde_json::to_string(row).map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.sql.exec(
            "UPDATE lifecycle_outbox SET row = ? WHERE id = ?",
            vec![json.into(), row.id.as_str().into()],
        )?;
        Ok(())
    }

    /// Deletes an outbox row (acknowledged, superseded, or given up).
    pub(crate) fn outbox_delete(&self, id: &str) -> SqlResult<()> {
        self.sql
            .exec("DELETE FROM lifecycle_outbox WHERE id = ?", vec![id.into()])?;
        Ok(())
    }

    /// Inserts an entry row. Writing the same row again is a no-op; a different row under a
    /// stored cursor is an error: a cursor is never reused, so that would lose an entry.
    fn insert_entry(&self, row: &EntryRow) -> SqlResult<()> {
        let cursor = SqlStorageValue::try_from_i64(row.cursor as i64)?;
        // One statement in the usual case (a new cursor): the stored row is read only when
        // the cursor was taken. Every step commits at least one entry before its provider
        // request leaves (docs/benchmarks.md, session 27).
        let inserted = self
            .sql
            .exec(
                "INSERT INTO entries (cursor, created_at, body) VALUES (?, ?, ?) ON CONFLICT (cursor) DO NOTHING",
                vec![cursor.clone(), row.created_at.into(), row.body.as_str().into()],
            )?
            .rows_written();
        if inserted > 0 {
            return Ok(());
        }
        let existing: Vec<BodyRow> = self
            .sql
            .exec("SELECT body FROM entries WHERE cursor = ?", vec![cursor])?
            .to_array()?;
        match existing.first() {
            Some(stored) if stored.body == row.body => Ok(()),
            _ => Err(worker::Error::RustError(format!(
                "entry {} is already stored with different content",
                row.cursor
            ))),
        }
    }

    /// Runs `f` inside `ctx.storage.transactionSync`: when it fails, everything it wrote is
    /// rolled back.
    fn transaction<T: 'static>(
        &self,
        f: impl FnOnce(&Store) -> SqlResult<T> + 'static,
    ) -> SqlResult<T> {
        let store = self.clone();
        let outcome: Rc<RefCell<Option<SqlResult<T>>>> = Rc::default();
        let slot = outcome.clone();
        let closure: Closure<dyn FnMut() -> Result<JsValue, JsValue>> = Closure::once(move || {
            let result = f(&store);
            // Throwing is what makes transactionSync roll back.
            let thrown = result
                .as_ref()
                .err()
                .map(|e| JsValue::from_str(&e.to_string()));
            *slot.borrow_mut() = Some(result);
            match thrown {
                Some(error) => Err(error),
                None => Ok(JsValue::UNDEFINED),
            }
        });
        let called = self.raw.transaction_sync(closure.as_ref().unchecked_ref());
        let result = outcome.borrow_mut().take();
        match (called, result) {
            (Ok(_), Some(result)) | (Err(_), Some(result @ Err(_))) => result,
            (Err(error), _) => Err(worker::Error::from(error)),
            (Ok(_), None) => Err(worker::Error::RustError(
                "transactionSync did not run the transaction".into(),
            )),
        }
    }

    fn get_meta(&self, key: &str) -> SqlResult<Option<String>> {
        let rows: Vec<ValueRow> = self
            .sql
            .exec("SELECT value FROM meta WHERE key = ?", vec![key.into()])?
            .to_array()?;
        Ok(rows.into_iter().next().map(|r| r.value))
    }

    fn put_meta(&self, key: &str, value: &str) -> SqlResult<()> {
        self.sql.exec(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            vec![key.into(), value.into()],
        )?;
        Ok(())
    }

    pub(crate) fn load(&self) -> SqlResult<Option<Stored>> {
        let (Some(meta), Some(checkpoint)) =
            (self.get_meta("session")?, self.get_meta("checkpoint")?)
        else {
            return Ok(None);
        };
        let meta = serde_json::from_str(&meta)
            .map_err(|e| worker::Error::RustError(format!("corrupt session meta: {e}")))?;
        let checkpoint = serde_json::from_str(&checkpoint)
            .map_err(|e| worker::Error::RustError(format!("corrupt checkpoint: {e}")))?;
        let rows: Vec<QueueRow> = self
            .sql
            .exec(
                "SELECT id, lane, author, content, enqueued_at, system, acting_for, reasoning FROM queue ORDER BY seq",
                None,
            )?
            .to_array()?;
        let queue = rows
            .into_iter()
            .map(|row| {
                let lane: Lane = serde_json::from_value(serde_json::Value::String(row.lane))
                    .map_err(|e| {
                        worker::Error::RustError(format!("corrupt queue row {}: {e}", row.id))
                    })?;
                let system = match row.system {
                    Some(json) => Some(serde_json::from_str(&json).map_err(|e| {
                        worker::Error::RustError(format!("corrupt queue row {}: {e}", row.id))
                    })?),
                    None => None,
                };
                let acting_for = match row.acting_for {
                    Some(json) => Some(serde_json::from_str(&json).map_err(|e| {
                        worker::Error::RustError(format!("corrupt queue row {}: {e}", row.id))
                    })?),
                    None => None,
                };
                let reasoning = match row.reasoning {
                    Some(json) => Some(serde_json::from_str(&json).map_err(|e| {
                        worker::Error::RustError(format!("corrupt queue row {}: {e}", row.id))
                    })?),
                    None => None,
                };
                Ok(QueueItem {
                    id: row.id,
                    lane,
                    author: row.author,
                    acting_for,
                    content: row.content,
                    reasoning,
                    enqueued_at: row.enqueued_at as i64,
                    system,
                })
            })
            .collect::<SqlResult<Vec<_>>>()?;
        let newest_entry = self.max("SELECT MAX(cursor) AS m FROM entries")?;
        let newest_archived = self.max("SELECT MAX(last) AS m FROM segments")?;
        Ok(Some(Stored {
            meta,
            checkpoint,
            queue,
            newest_cursor: newest_entry.max(newest_archived),
        }))
    }

    fn max(&self, query: &str) -> SqlResult<u64> {
        let rows: Vec<MinRow> = self.sql.exec(query, None)?.to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| r.m)
            .map_or(0, |m| m as u64))
    }

    pub(crate) fn save_meta(&self, meta: &SessionMeta) -> SqlResult<()> {
        self.put_meta(
            "session",
            &serde_json::to_string(meta).map_err(|e| worker::Error::RustError(e.to_string()))?,
        )
    }

    /// Attached environments (empty when none).
    pub(crate) fn load_attachments(&self) -> SqlResult<Vec<wuhu_core::environments::Attachment>> {
        Ok(self
            .get_meta("environments")?
            .and_then(|v| serde_json::from_str(&v).ok())
            .unwrap_or_default())
    }

    pub(crate) fn save_attachments(
        &self,
        attachments: &[wuhu_core::environments::Attachment],
    ) -> SqlResult<()> {
        self.put_meta(
            "environments",
            &serde_json::to_string(attachments)
                .map_err(|e| worker::Error::RustError(e.to_string()))?,
        )
    }

    /// On which runner connection (epoch) each attached environment's snapshot was last
    /// validated, stored with the attachments (seed 004): an eviction of the actor forgets
    /// nothing, so it causes no validation and no resume note; a runner that reconnected has
    /// another epoch and is validated again.
    pub(crate) fn load_validated(&self) -> SqlResult<std::collections::HashMap<String, u64>> {
        Ok(self
            .get_meta("validated")?
            .and_then(|v| serde_json::from_str(&v).ok())
            .unwrap_or_default())
    }

    pub(crate) fn save_validated(
        &self,
        validated: &std::collections::HashMap<String, u64>,
    ) -> SqlResult<()> {
        self.put_meta(
            "validated",
            &serde_json::to_string(validated)
                .map_err(|e| worker::Error::RustError(e.to_string()))?,
        )
    }

    /// The runners this session attached a `folder-template` environment on (told to discard
    /// its workspaces when it is deleted; `wuhu_core::deletion::record_workspace_host`).
    pub(crate) fn load_workspace_hosts(
        &self,
    ) -> SqlResult<Vec<wuhu_core::wire::runner::WorkspaceHost>> {
        Ok(self
            .get_meta("workspace_hosts")?
            .and_then(|v| serde_json::from_str(&v).ok())
            .unwrap_or_default())
    }

    pub(crate) fn save_workspace_hosts(
        &self,
        hosts: &[wuhu_core::wire::runner::WorkspaceHost],
    ) -> SqlResult<()> {
        self.put_meta(
            "workspace_hosts",
            &serde_json::to_string(hosts).map_err(|e| worker::Error::RustError(e.to_string()))?,
        )
    }

    /// Entries with cursor > `since`, oldest first, at most `limit`.
    pub(crate) fn entries_after(&self, since: u64, limit: usize) -> SqlResult<Vec<Entry>> {
        let rows: Vec<BodyRow> = self
            .sql
            .exec(
                "SELECT body FROM entries WHERE cursor > ? ORDER BY cursor LIMIT ?",
                vec![(since as i64).into(), (limit as i64).into()],
            )?
            .to_array()?;
        Ok(decode_rows(rows))
    }

    /// The newest `limit` entries with the size of their JSON, oldest first.
    pub(crate) fn newest_entries(&self, limit: usize) -> SqlResult<Vec<(Entry, usize)>> {
        let rows: Vec<BodyRow> = self
            .sql
            .exec(
                "SELECT body FROM entries ORDER BY cursor DESC LIMIT ?",
                vec![(limit as i64).into()],
            )?
            .to_array()?;
        let mut entries: Vec<(Entry, usize)> = rows
            .into_iter()
            .filter_map(|r| {
                serde_json::from_str(&r.body)
                    .ok()
                    .map(|e| (e, r.body.len()))
            })
            .collect();
        entries.reverse();
        Ok(entries)
    }

    /// Entries held in SQLite.
    pub(crate) fn hot_count(&self) -> SqlResult<u64> {
        let rows: Vec<CountRow> = self
            .sql
            .exec("SELECT COUNT(*) AS n, 0 AS bytes FROM entries", None)?
            .to_array()?;
        Ok(rows.into_iter().next().map(|r| r.n as u64).unwrap_or(0))
    }

    /// The oldest cursor still in SQLite.
    pub(crate) fn hot_first(&self) -> SqlResult<Option<u64>> {
        let rows: Vec<MinRow> = self
            .sql
            .exec("SELECT MIN(cursor) AS m FROM entries", None)?
            .to_array()?;
        Ok(rows.into_iter().next().and_then(|r| r.m).map(|m| m as u64))
    }

    /// The cursor through which usage was reported to the tenant index (`None`: never).
    pub(crate) fn usage_reported_through(&self) -> SqlResult<Option<u64>> {
        Ok(self
            .get_meta("usage_reported_through")?
            .and_then(|v| v.parse().ok()))
    }

    pub(crate) fn save_usage_reported_through(&self, cursor: u64) -> SqlResult<()> {
        self.put_meta("usage_reported_through", &cursor.to_string())
    }

    pub(crate) fn archived_through(&self) -> SqlResult<u64> {
        Ok(self
            .get_meta("archived_through")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// Count and JSON bytes of entries not archived yet.
    pub(crate) fn unarchived(&self) -> SqlResult<(u64, u64)> {
        let through = self.archived_through()?;
        let rows: Vec<CountRow> = self
            .sql
            .exec(
                "SELECT COUNT(*) AS n, SUM(LENGTH(body)) AS bytes FROM entries WHERE cursor > ?",
                vec![(through as i64).into()],
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .map(|r| (r.n as u64, r.bytes.unwrap_or(0.0) as u64))
            .unwrap_or((0, 0)))
    }

    /// Records an archived segment and trims the hot tail to `keep` archived entries.
    pub(crate) fn record_segment(&self, first: u64, last: u64, keep: u64) -> SqlResult<()> {
        self.sql.exec(
            "INSERT OR REPLACE INTO segments (first, last) VALUES (?, ?)",
            vec![(first as i64).into(), (last as i64).into()],
        )?;
        self.put_meta("archived_through", &last.to_string())?;
        let cut = last.saturating_sub(keep);
        self.sql.exec(
            "DELETE FROM entries WHERE cursor <= ?",
            vec![(cut as i64).into()],
        )?;
        Ok(())
    }

    pub(crate) fn segments(&self) -> SqlResult<Vec<SegmentRef>> {
        let rows: Vec<SegmentRow> = self
            .sql
            .exec("SELECT first, last FROM segments ORDER BY first", None)?
            .to_array()?;
        Ok(rows
            .into_iter()
            .map(|r| SegmentRef {
                first: r.first as u64,
                last: r.last as u64,
            })
            .collect())
    }

    /// Bytes SQLite uses for this actor.
    pub(crate) fn database_size(&self) -> usize {
        self.sql.database_size()
    }
}

fn decode_rows(rows: Vec<BodyRow>) -> Vec<Entry> {
    rows.into_iter()
        .filter_map(|r| serde_json::from_str(&r.body).ok())
        .collect()
}
