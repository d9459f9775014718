//! The session actor's SQLite tables. Every function here is synchronous: writes made between
//! two awaits commit atomically, which is what makes a checkpoint and its entries one write.

use serde::{Deserialize, Serialize};
use worker::{SqlStorage, SqlStorageValue};
use wuhu_core::archive::SegmentRef;
use wuhu_core::session::Checkpoint;
use wuhu_core::wire::{Entry, Header};

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
}

pub(crate) struct Store {
    sql: SqlStorage,
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

impl Store {
    pub(crate) fn open(sql: SqlStorage) -> SqlResult<Store> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            None,
        )?;
        sql.exec(
            "CREATE TABLE IF NOT EXISTS entries (cursor INTEGER PRIMARY KEY, created_at INTEGER NOT NULL, body TEXT NOT NULL)",
            None,
        )?;
        sql.exec("CREATE TABLE IF NOT EXISTS segments (first INTEGER PRIMARY KEY, last INTEGER NOT NULL)", None)?;
        Ok(Store { sql })
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

    pub(crate) fn load(&self) -> SqlResult<Option<(SessionMeta, Checkpoint)>> {
        let (Some(meta), Some(checkpoint)) =
            (self.get_meta("session")?, self.get_meta("checkpoint")?)
        else {
            return Ok(None);
        };
        let meta = serde_json::from_str(&meta)
            .map_err(|e| worker::Error::RustError(format!("corrupt session meta: {e}")))?;
        let checkpoint = serde_json::from_str(&checkpoint)
            .map_err(|e| worker::Error::RustError(format!("corrupt checkpoint: {e}")))?;
        Ok(Some((meta, checkpoint)))
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

    pub(crate) fn save_checkpoint(&self, checkpoint: &Checkpoint) -> SqlResult<()> {
        self.put_meta(
            "checkpoint",
            &serde_json::to_string(checkpoint)
                .map_err(|e| worker::Error::RustError(e.to_string()))?,
        )
    }

    /// Inserts an entry; returns the size of its JSON.
    pub(crate) fn append(&self, entry: &Entry) -> SqlResult<usize> {
        let body =
            serde_json::to_string(entry).map_err(|e| worker::Error::RustError(e.to_string()))?;
        let bytes = body.len();
        let cursor = SqlStorageValue::try_from_i64(entry.cursor as i64)?;
        // OR IGNORE: an entry is never written twice, even if a driver bug replays one.
        self.sql.exec(
            "INSERT OR IGNORE INTO entries (cursor, created_at, body) VALUES (?, ?, ?)",
            vec![cursor, entry.created_at.into(), body.into()],
        )?;
        Ok(bytes)
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
