//! The runner hub's SQLite tables: `runners` (every runner that ever said hello, with what it
//! offered), `environments` (definitions) and `hub_meta` (the connection epoch counter).

use serde::Deserialize;
use worker::SqlStorage;
use wuhu_core::wire::EnvironmentDefinition;
use wuhu_core::wire::runner::{OfferedEnvironment, RunnerKind};

use crate::http::{ApiError, ApiResult};
use crate::schema::Migration;

/// The hub's schema, in order (numbered from 1 by position; never reorder or remove one).
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS hub_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    ),
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS runners (owner TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, os TEXT NOT NULL, arch TEXT NOT NULL, environments TEXT NOT NULL, capabilities TEXT NOT NULL, version TEXT, last_seen_ms INTEGER NOT NULL, connected INTEGER NOT NULL, connected_at_ms INTEGER, epoch INTEGER NOT NULL, PRIMARY KEY (owner, name))",
    ),
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS environments (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, definition TEXT NOT NULL)",
    ),
    // A deleted session's workspaces a runner has not confirmed discarding yet
    // (`discards`); `sent_epoch` is the connection it was last sent on.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS pending_discards (owner TEXT NOT NULL, runner TEXT NOT NULL, session_id TEXT NOT NULL, created_ms INTEGER NOT NULL, sent_epoch INTEGER, PRIMARY KEY (owner, runner, session_id))",
    ),
    // The key a runner name is bound to (decision 0024): set at its first hello with a
    // key, deleted with the name.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS runner_keys (owner TEXT NOT NULL, name TEXT NOT NULL, public_key TEXT NOT NULL, bound_ms INTEGER NOT NULL, PRIMARY KEY (owner, name))",
    ),
];

#[derive(Deserialize)]
struct ValueRow {
    value: i64,
}

/// The next connection epoch (1, 2, ...), persisted so it grows across restarts.
pub(super) fn next_epoch(sql: &SqlStorage) -> ApiResult<u64> {
    let rows: Vec<ValueRow> = sql
        .exec(
            "INSERT INTO hub_meta (key, value) VALUES ('epoch', 1) ON CONFLICT(key) DO UPDATE SET value = value + 1 RETURNING value",
            None,
        )?
        .to_array()?;
    rows.first()
        .map(|r| r.value.max(0) as u64)
        .ok_or_else(|| ApiError::internal("epoch counter did not return a value"))
}

/// One row of `runners`.
#[derive(Deserialize, Clone, Debug)]
pub(super) struct RunnerRow {
    pub(super) owner: String,
    pub(super) name: String,
    pub(super) kind: String,
    pub(super) os: String,
    pub(super) arch: String,
    pub(super) environments: String,
    pub(super) capabilities: String,
    pub(super) version: Option<String>,
    pub(super) last_seen_ms: i64,
}

impl RunnerRow {
    pub(super) fn kind(&self) -> RunnerKind {
        if self.kind == "cloud" {
            RunnerKind::Cloud
        } else {
            RunnerKind::Local
        }
    }

    pub(super) fn environments(&self) -> Vec<OfferedEnvironment> {
        serde_json::from_str(&self.environments).unwrap_or_default()
    }

    pub(super) fn capabilities(&self) -> Vec<String> {
        serde_json::from_str(&self.capabilities).unwrap_or_default()
    }
}

/// Every known runner, sorted by owner and name.
pub(super) fn runners(sql: &SqlStorage) -> ApiResult<Vec<RunnerRow>> {
    Ok(sql
        .exec(
            "SELECT owner, name, kind, os, arch, environments, capabilities, version, last_seen_ms FROM runners ORDER BY owner, name",
            None,
        )?
        .to_array()?)
}

/// A runner row's name reservation: whose, which name, when last seen.
#[derive(Deserialize, Clone, Debug)]
pub(super) struct NameRow {
    pub(super) owner: String,
    pub(super) name: String,
    pub(super) last_seen_ms: i64,
}

impl NameRow {
    /// What the hub's rules know of the name (`hub::on_hello`, `hub::expired_rows`).
    pub(super) fn known(&self) -> wuhu_core::hub::KnownRunner<'_> {
        wuhu_core::hub::KnownRunner {
            owner: &self.owner,
            name: &self.name,
            last_seen_ms: self.last_seen_ms,
        }
    }
}

/// Every runner row's reservation (the cheap read `hello` and expiry need).
pub(super) fn names(sql: &SqlStorage) -> ApiResult<Vec<NameRow>> {
    Ok(sql
        .exec("SELECT owner, name, last_seen_ms FROM runners", None)?
        .to_array()?)
}

/// The row of `owner`'s runner `name`, if any.
pub(super) fn runner(sql: &SqlStorage, owner: &str, name: &str) -> ApiResult<Option<RunnerRow>> {
    let rows: Vec<RunnerRow> = sql
        .exec(
            "SELECT owner, name, kind, os, arch, environments, capabilities, version, last_seen_ms FROM runners WHERE owner = ? AND name = ?",
            vec![owner.into(), name.into()],
        )?
        .to_array()?;
    Ok(rows.into_iter().next())
}

/// Deletes `owner`'s runner `name` (frees the name), and the discards waiting for it: a runner
/// that registers the name later is another machine.
pub(super) fn delete_runner(sql: &SqlStorage, owner: &str, name: &str) -> ApiResult<()> {
    sql.exec(
        "DELETE FROM runners WHERE owner = ? AND name = ?",
        vec![owner.into(), name.into()],
    )?;
    sql.exec(
        "DELETE FROM pending_discards WHERE owner = ? AND runner = ?",
        vec![owner.into(), name.into()],
    )?;
    sql.exec(
        "DELETE FROM runner_keys WHERE owner = ? AND name = ?",
        vec![owner.into(), name.into()],
    )?;
    Ok(())
}

#[derive(Deserialize)]
struct KeyRow {
    public_key: String,
}

/// The key `owner`'s runner `name` is bound to (base64url), if any.
pub(super) fn runner_key(sql: &SqlStorage, owner: &str, name: &str) -> ApiResult<Option<String>> {
    let rows: Vec<KeyRow> = sql
        .exec(
            "SELECT public_key FROM runner_keys WHERE owner = ? AND name = ?",
            vec![owner.into(), name.into()],
        )?
        .to_array()?;
    Ok(rows.into_iter().next().map(|r| r.public_key))
}

/// Binds `owner`'s runner `name` to `public_key` (only where it is bound to none).
pub(super) fn bind_runner_key(
    sql: &SqlStorage,
    owner: &str,
    name: &str,
    public_key: &str,
    now: i64,
) -> ApiResult<()> {
    sql.exec(
        "INSERT INTO runner_keys (owner, name, public_key, bound_ms) VALUES (?, ?, ?, ?) ON CONFLICT(owner, name) DO NOTHING",
        vec![
            owner.into(),
            name.into(),
            public_key.into(),
            (now as f64).into(),
        ],
    )?;
    Ok(())
}

/// One pending discard.
#[derive(Deserialize, Clone, Debug)]
pub(super) struct DiscardRow {
    pub(super) owner: String,
    pub(super) runner: String,
    pub(super) session_id: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: i64,
}

/// Keeps a pending discard of `session_id` for `owner`'s runner `runner` (once).
pub(super) fn add_discard(
    sql: &SqlStorage,
    owner: &str,
    runner: &str,
    session_id: &str,
    now_ms: i64,
) -> ApiResult<()> {
    sql.exec(
        "INSERT INTO pending_discards (owner, runner, session_id, created_ms, sent_epoch) VALUES (?, ?, ?, ?, NULL) ON CONFLICT DO NOTHING",
        vec![owner.into(), runner.into(), session_id.into(), now_ms.into()],
    )?;
    Ok(())
}

/// How many discards are pending (all runners).
pub(super) fn count_discards(sql: &SqlStorage) -> ApiResult<usize> {
    let rows: Vec<CountRow> = sql
        .exec("SELECT COUNT(*) AS n FROM pending_discards", None)?
        .to_array()?;
    Ok(rows.first().map_or(0, |r| r.n.max(0) as usize))
}

/// Drops the `n` oldest pending discards; returns them.
pub(super) fn drop_oldest_discards(sql: &SqlStorage, n: usize) -> ApiResult<Vec<DiscardRow>> {
    let rows: Vec<DiscardRow> = sql
        .exec(
            "SELECT owner, runner, session_id FROM pending_discards ORDER BY created_ms LIMIT ?",
            vec![(n as i64).into()],
        )?
        .to_array()?;
    for row in &rows {
        remove_discard(sql, &row.owner, &row.runner, &row.session_id)?;
    }
    Ok(rows)
}

/// Pending discards of a runner not sent on connection `epoch` yet, oldest first, at most
/// `limit`; and how many were sent on it and not answered.
pub(super) fn discards_for(
    sql: &SqlStorage,
    owner: &str,
    runner: &str,
    epoch: u64,
    limit: usize,
) -> ApiResult<(Vec<DiscardRow>, usize)> {
    let waiting: Vec<DiscardRow> = sql
        .exec(
            "SELECT owner, runner, session_id FROM pending_discards WHERE owner = ? AND runner = ? AND (sent_epoch IS NULL OR sent_epoch != ?) ORDER BY created_ms LIMIT ?",
            vec![
                owner.into(),
                runner.into(),
                (epoch as i64).into(),
                (limit as i64).into(),
            ],
        )?
        .to_array()?;
    let in_flight: Vec<CountRow> = sql
        .exec(
            "SELECT COUNT(*) AS n FROM pending_discards WHERE owner = ? AND runner = ? AND sent_epoch = ?",
            vec![owner.into(), runner.into(), (epoch as i64).into()],
        )?
        .to_array()?;
    Ok((
        waiting,
        in_flight.first().map_or(0, |r| r.n.max(0) as usize),
    ))
}

/// Records that a pending discard was sent on connection `epoch`.
pub(super) fn mark_discard_sent(sql: &SqlStorage, row: &DiscardRow, epoch: u64) -> ApiResult<()> {
    sql.exec(
        "UPDATE pending_discards SET sent_epoch = ? WHERE owner = ? AND runner = ? AND session_id = ?",
        vec![
            (epoch as i64).into(),
            row.owner.clone().into(),
            row.runner.clone().into(),
            row.session_id.clone().into(),
        ],
    )?;
    Ok(())
}

/// Marks a pending discard as not sent (its runner answered an error): the next sweep or
/// connection sends it again.
pub(super) fn unsend_discard(
    sql: &SqlStorage,
    owner: &str,
    runner: &str,
    session_id: &str,
) -> ApiResult<()> {
    sql.exec(
        "UPDATE pending_discards SET sent_epoch = NULL WHERE owner = ? AND runner = ? AND session_id = ?",
        vec![owner.into(), runner.into(), session_id.into()],
    )?;
    Ok(())
}

/// Forgets a pending discard (its runner confirmed it).
pub(super) fn remove_discard(
    sql: &SqlStorage,
    owner: &str,
    runner: &str,
    session_id: &str,
) -> ApiResult<bool> {
    let rows: Vec<CountRow> = sql
        .exec(
            "DELETE FROM pending_discards WHERE owner = ? AND runner = ? AND session_id = ? RETURNING 1 AS n",
            vec![owner.into(), runner.into(), session_id.into()],
        )?
        .to_array()?;
    Ok(!rows.is_empty())
}

/// What a `hello` says about a runner.
pub(super) struct Hello<'a> {
    pub(super) owner: &'a str,
    pub(super) name: &'a str,
    pub(super) kind: RunnerKind,
    pub(super) os: &'a str,
    pub(super) arch: &'a str,
    pub(super) capabilities: &'a [String],
    pub(super) environments: &'a [OfferedEnvironment],
    pub(super) version: Option<&'a str>,
}

/// Records a runner as connected over connection `epoch`.
pub(super) fn upsert_runner(
    sql: &SqlStorage,
    hello: &Hello<'_>,
    epoch: u64,
    now_ms: i64,
) -> ApiResult<()> {
    let environments = serde_json::to_string(hello.environments).unwrap_or_else(|_| "[]".into());
    let capabilities = serde_json::to_string(hello.capabilities).unwrap_or_else(|_| "[]".into());
    sql.exec(
        "INSERT INTO runners (owner, name, kind, os, arch, environments, capabilities, version, last_seen_ms, connected, connected_at_ms, epoch) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?) \
         ON CONFLICT(owner, name) DO UPDATE SET kind = excluded.kind, os = excluded.os, arch = excluded.arch, \
         environments = excluded.environments, capabilities = excluded.capabilities, version = excluded.version, \
         last_seen_ms = excluded.last_seen_ms, connected = 1, connected_at_ms = excluded.connected_at_ms, epoch = excluded.epoch",
        vec![
            hello.owner.into(),
            hello.name.into(),
            hello.kind.as_str().into(),
            hello.os.into(),
            hello.arch.into(),
            environments.into(),
            capabilities.into(),
            hello.version.into(),
            now_ms.into(),
            now_ms.into(),
            (epoch as i64).into(),
        ],
    )?;
    Ok(())
}

/// Refreshes `last_seen` of the runner connected over `epoch` (no-op for an older connection).
pub(super) fn touch_runner(
    sql: &SqlStorage,
    owner: &str,
    name: &str,
    epoch: u64,
    last_seen_ms: i64,
) -> ApiResult<()> {
    sql.exec(
        "UPDATE runners SET last_seen_ms = MAX(last_seen_ms, ?) WHERE owner = ? AND name = ? AND epoch = ?",
        vec![
            last_seen_ms.into(),
            owner.into(),
            name.into(),
            (epoch as i64).into(),
        ],
    )?;
    Ok(())
}

/// Marks the runner disconnected if `epoch` is still its current connection (a replaced
/// connection closing must not mark the new one offline).
pub(super) fn disconnect_runner(
    sql: &SqlStorage,
    owner: &str,
    name: &str,
    epoch: u64,
    now_ms: i64,
) -> ApiResult<()> {
    sql.exec(
        "UPDATE runners SET connected = 0, connected_at_ms = NULL, last_seen_ms = MAX(last_seen_ms, ?) WHERE owner = ? AND name = ? AND epoch = ?",
        vec![
            now_ms.into(),
            owner.into(),
            name.into(),
            (epoch as i64).into(),
        ],
    )?;
    Ok(())
}

#[derive(Deserialize)]
struct DefinitionRow {
    definition: String,
}

fn decode_definitions(rows: Vec<DefinitionRow>) -> Vec<EnvironmentDefinition> {
    rows.into_iter()
        .filter_map(|r| serde_json::from_str(&r.definition).ok())
        .collect()
}

/// Every definition, sorted by name.
pub(super) fn definitions(sql: &SqlStorage) -> ApiResult<Vec<EnvironmentDefinition>> {
    let rows: Vec<DefinitionRow> = sql
        .exec("SELECT definition FROM environments ORDER BY name", None)?
        .to_array()?;
    Ok(decode_definitions(rows))
}

/// The definition with this id or name.
pub(super) fn definition(sql: &SqlStorage, key: &str) -> ApiResult<Option<EnvironmentDefinition>> {
    let rows: Vec<DefinitionRow> = sql
        .exec(
            "SELECT definition FROM environments WHERE id = ? OR name = ? LIMIT 1",
            vec![key.into(), key.into()],
        )?
        .to_array()?;
    Ok(decode_definitions(rows).into_iter().next())
}

/// Whether a definition other than `except_id` is named `name`.
pub(super) fn name_taken(sql: &SqlStorage, name: &str, except_id: &str) -> ApiResult<bool> {
    #[derive(Deserialize)]
    struct IdRow {
        #[allow(dead_code)]
        id: String,
    }
    let rows: Vec<IdRow> = sql
        .exec(
            "SELECT id FROM environments WHERE name = ? AND id != ?",
            vec![name.into(), except_id.into()],
        )?
        .to_array()?;
    Ok(!rows.is_empty())
}

/// Inserts or replaces a definition.
pub(super) fn put_definition(
    sql: &SqlStorage,
    definition: &EnvironmentDefinition,
) -> ApiResult<()> {
    let json = serde_json::to_string(definition).map_err(|e| ApiError::internal(e.to_string()))?;
    sql.exec(
        "INSERT INTO environments (id, name, definition) VALUES (?, ?, ?) ON CONFLICT(id) DO UPDATE SET name = excluded.name, definition = excluded.definition",
        vec![
            definition.id.clone().into(),
            definition.name.clone().into(),
            json.into(),
        ],
    )?;
    Ok(())
}

/// Deletes a definition by id.
pub(super) fn delete_definition(sql: &SqlStorage, id: &str) -> ApiResult<()> {
    sql.exec("DELETE FROM environments WHERE id = ?", vec![id.into()])?;
    Ok(())
}
