//! `TenantIndex`: one Durable Object per tenant, listing its sessions newest first, and holding
//! the tenant's concurrency gate for spawned sessions (`wuhu_core::orchestration::Gate`, saved
//! whole after every change, so it survives restarts).
//! It also keeps the tenant's usage: hourly totals per session, provider and model, and the
//! cursor each session reported through (`wuhu_core::tenant_usage`).
//! Internal routes: `POST /upsert` (SessionInfo; `?created=1` for a new session), `GET
//! /list?limit&before&parentId`, `GET /tree` (the lineage and forks of listed sessions, for the
//! forks rule of a deletion), `POST /remove` (`{id}`: a deleted session leaves the list),
//! `POST /gate/request` (a [`Slot`]), `POST /gate/release` (`{child}`),
//! `POST /usage/report` (a `UsageReport`), `GET /usage?from&to&by`, `POST /settings/hold`
//! (`{session}`: a session keeps a reading of the tenant's settings) and `POST
//! /settings/changed` (a document under `config/` was written: every holder is told to forget
//! its reading before this answers; `wuhu_core::tenant_config::SettingsCache`; a first budget
//! set by `PUT /budget` is told the same way, decision 0022).

use futures::StreamExt;
use serde::Deserialize;
use worker::{DurableObject, Env, Request, Response, SqlStorage, State, durable_object};
use wuhu_core::authority::{self, Principal, SessionAction, SessionFacts, ToolReaders, Verdict};
use wuhu_core::calls::index::{
    GateAnswer, GateRelease, GateRequest, GetBudget, GetUsage, Held, HoldSettings, Index,
    IndexCall, List, LlmLogsWritten, Remove, ReportUsage, Tree, Upsert,
};
use wuhu_core::calls::{Call, Empty};
use wuhu_core::deletion::TreeRow;
use wuhu_core::llm::models::UsageTotals;
use wuhu_core::llm::request_log;
use wuhu_core::orchestration::{Admission, Gate, Limits, Slot};
use wuhu_core::tenant_config::{SETTINGS_TELL_CONCURRENCY, max_settings_holders};
use wuhu_core::tenant_usage::{
    self, HourKey, HourRow, TenantBudget, TenantUsage, UsageQuery, UsageReport,
};
use wuhu_core::wire::{Budget, ListSessionsResponse, SessionInfo};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::internal::{self, reply};

#[durable_object]
pub struct TenantIndex {
    state: State,
    sql: SqlStorage,
    env: Env,
    limits: Limits,
}

#[derive(Deserialize)]
struct ValueRow {
    state: String,
}

#[derive(Deserialize)]
struct HolderRow {
    seq: f64,
    session: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
    #[serde(default)]
    mine: Option<f64>,
}

#[derive(Deserialize)]
struct ListRow {
    seq: f64,
    info: String,
}

/// Rows read from SQLite per batch while filtering a page.
const SCAN_BATCH: usize = 200;
/// Most rows one list request scans; past that the page is returned short, with `nextBefore`.
const MAX_SCANNED: usize = 2_000;

/// Whether `viewer` may see `info` in the list.
/// `503 unreachable` when `failed` settings holders could not be told of a change (they stay
/// holders; `message` says what was stored and how to tell them again).
fn every_holder_told(failed: usize, message: impl FnOnce(usize) -> String) -> ApiResult<()> {
    if failed == 0 {
        return Ok(());
    }
    Err(ApiError::new(
        503,
        crate::internal::UNREACHABLE,
        message(failed),
    ))
}

fn visible(viewer: &Principal, info: &SessionInfo) -> bool {
    authority::session_allows(viewer, facts_of(info), SessionAction::Read) == Verdict::Allow
}

/// A listed session's authority facts (its owner: the first prompter, else its creator).
fn facts_of(info: &SessionInfo) -> SessionFacts<'_> {
    let owner = if info.owner.is_empty() {
        &info.created_by
    } else {
        &info.owner
    };
    SessionFacts {
        owner,
        created_by: &info.created_by,
        access: info.access,
    }
}

#[derive(Deserialize)]
struct SeqRow {
    seq: f64,
}

/// A row of the tree query: a listed session that is a child or a fork.
#[derive(Deserialize)]
struct TreeSqlRow {
    id: String,
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(default)]
    forked_from: Option<String>,
}

impl DurableObject for TenantIndex {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        // `seq` orders sessions by creation: ids are random and times only have seconds.
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS session_list (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, info TEXT NOT NULL)",
            None,
        );
        // Deleted sessions: a refresh of a deleted session's row that was in flight when it was
        // removed must not list it again. One short row per deleted session.
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS deleted_sessions (id TEXT PRIMARY KEY)",
            None,
        );
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS gate (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
            None,
        );
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS usage_hours (hour INTEGER NOT NULL, session TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, user TEXT NOT NULL, messages INTEGER NOT NULL, input INTEGER NOT NULL, output INTEGER NOT NULL, cache_read INTEGER NOT NULL, cache_write INTEGER NOT NULL, reasoning INTEGER NOT NULL, cost REAL NOT NULL, unpriced INTEGER NOT NULL, PRIMARY KEY (hour, session, provider, model))",
            None,
        );
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS usage_cursor (session TEXT PRIMARY KEY, through INTEGER NOT NULL)",
            None,
        );
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS budget (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
            None,
        );
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS llm_log_sweep (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
            None,
        );
        // Sessions that keep a reading of the tenant's settings. `seq` changes with every hold, so
        // a change lets go only of the holds it told (a session that holds again meanwhile stays).
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS settings_holders (seq INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL UNIQUE)",
            None,
        );
        TenantIndex {
            state,
            sql,
            limits: crate::session_client::orchestration_limits(&env),
            env,
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        Ok(match self.route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }

    /// The sweep of the tenant's expired request logs (the only use of this alarm).
    async fn alarm(&self) -> worker::Result<Response> {
        if let Err(e) = self.sweep_llm_logs().await {
            worker::console_error!("sweeping expired request logs failed: {}", e.message);
            let _ = self
                .state
                .storage()
                .set_alarm(request_log::SWEEP_CONTINUE_MS as i64)
                .await;
        }
        Response::empty()
    }
}

impl TenantIndex {
    /// One run of the sweep: at most [`request_log::SWEEP_PAGES_PER_RUN`] listing pages of
    /// `{tenant}/llm-logs/`, their expired records deleted; the alarm is set for the rest, or
    /// for when the next record expires (`wuhu_core::llm::request_log::Sweep`).
    async fn sweep_llm_logs(&self) -> ApiResult<()> {
        let mut sweep: request_log::Sweep = self.load_state("llm_log_sweep")?;
        if sweep.tenant.is_empty() {
            return Ok(());
        }
        let config = crate::workspace_io::tenant_config(&self.env, &sweep.tenant)
            .await?
            .map_err(|e| ApiError::new(409, "invalid_tenant_config", e.to_string()))?;
        let bucket = self.env.bucket("ARCHIVE")?;
        for _ in 0..request_log::SWEEP_PAGES_PER_RUN {
            let mut list = bucket
                .list()
                .prefix(request_log::tenant_prefix(&sweep.tenant))
                .limit(1000);
            if let Some(cursor) = sweep.cursor.take() {
                list = list.cursor(cursor);
            }
            let page = list.execute().await?;
            let objects: Vec<(String, u64)> = page
                .objects()
                .iter()
                .map(|o| (o.key(), o.uploaded().as_millis()))
                .collect();
            let cursor = if page.truncated() {
                page.cursor()
            } else {
                None
            };
            let now = worker::Date::now().as_millis();
            let expired = sweep.page(&objects, cursor, now, config.llm_request_log_days);
            if !expired.is_empty() {
                bucket.delete_multiple(expired).await?;
            }
            if sweep.cursor.is_none() {
                break;
            }
        }
        let now = worker::Date::now().as_millis();
        let next = sweep.next_run_ms(now);
        self.save_state("llm_log_sweep", &sweep)?;
        if let Some(at) = next {
            self.state
                .storage()
                .set_alarm(at.saturating_sub(now) as i64)
                .await?;
        }
        Ok(())
    }

    /// Holds `session` (it keeps a reading of the settings). With `max_settings_holders`
    /// holders already, the one that held longest ago is told to forget its reading and let go
    /// first (it holds again at its next step); `false` when it could not be told (`session`
    /// then reads before each step).
    async fn hold_settings(&self, tenant: &str, session: &str) -> ApiResult<bool> {
        if !crate::session_client::valid_session_id(session) {
            return Err(ApiError::bad_request("session must be a session id"));
        }
        let rows: Vec<CountRow> = self
            .sql
            .exec(
                "SELECT COUNT(*) AS n, SUM(session = ?) AS mine FROM settings_holders",
                vec![session.to_string().into()],
            )?
            .to_array()?;
        let row = rows.first();
        let (n, mine) = row.map_or((0.0, 0.0), |r| (r.n, r.mine.unwrap_or(0.0)));
        let bound = max_settings_holders(
            self.env
                .var("WUHU_MAX_SETTINGS_HOLDERS")
                .ok()
                .map(|v| v.to_string())
                .as_deref(),
        );
        if mine == 0.0 && n as usize >= bound {
            let oldest: Vec<HolderRow> = self
                .sql
                .exec(
                    "SELECT seq, session FROM settings_holders ORDER BY seq LIMIT 1",
                    None,
                )?
                .to_array()?;
            if let Some(oldest) = oldest.first() {
                if let Err(e) =
                    crate::session_client::forget_settings(&self.env, tenant, &oldest.session).await
                {
                    worker::console_error!(
                        "letting go of session {} to hold another failed: {}",
                        oldest.session,
                        e.message
                    );
                    return Ok(false);
                }
                self.sql.exec(
                    "DELETE FROM settings_holders WHERE seq = ?",
                    vec![oldest.seq.into()],
                )?;
            }
        }
        // A new `seq` each time: see the table.
        self.sql.exec(
            "INSERT OR REPLACE INTO settings_holders (session) VALUES (?)",
            vec![session.to_string().into()],
        )?;
        Ok(true)
    }

    /// Tells every holder of a settings reading to forget it ([`SETTINGS_TELL_CONCURRENCY`] at
    /// a time) and lets go of those told; a deleted session counts as told. Returns how many
    /// could not be told: they stay holders, so the next change (or the same write again) tells
    /// them.
    async fn tell_settings_changed(&self, tenant: &str) -> ApiResult<usize> {
        let holders: Vec<HolderRow> = self
            .sql
            .exec("SELECT seq, session FROM settings_holders", None)?
            .to_array()?;
        let told: Vec<(f64, bool)> = futures::stream::iter(holders)
            .map(|holder| async move {
                let told =
                    crate::session_client::forget_settings(&self.env, tenant, &holder.session)
                        .await
                        .inspect_err(|e| {
                            worker::console_error!(
                                "telling session {} of a settings change failed: {}",
                                holder.session,
                                e.message
                            )
                        })
                        .is_ok();
                (holder.seq, told)
            })
            .buffer_unordered(SETTINGS_TELL_CONCURRENCY)
            .collect()
            .await;
        let mut failed = 0;
        for (seq, told) in told {
            if told {
                self.sql.exec(
                    "DELETE FROM settings_holders WHERE seq = ?",
                    vec![seq.into()],
                )?;
            } else {
                failed += 1;
            }
        }
        Ok(failed)
    }

    fn load_gate(&self) -> ApiResult<Gate> {
        self.load_state("gate")
    }

    fn save_gate(&self, gate: &Gate) -> ApiResult<()> {
        self.save_state("gate", gate)
    }

    fn load_budget(&self) -> ApiResult<TenantBudget> {
        self.load_state("budget")
    }

    fn save_budget(&self, budget: &TenantBudget) -> ApiResult<()> {
        self.save_state("budget", budget)
    }

    /// The one JSON row (`k = 0`) of `table` (`gate` or `budget`), or the default when absent.
    fn load_state<T: serde::de::DeserializeOwned + Default>(&self, table: &str) -> ApiResult<T> {
        let rows: Vec<ValueRow> = self
            .sql
            .exec(&format!("SELECT state FROM {table} WHERE k = 0"), None)?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| serde_json::from_str(&r.state).ok())
            .unwrap_or_default())
    }

    /// Writes the one JSON row (`k = 0`) of `table`.
    fn save_state<T: serde::Serialize>(&self, table: &str, state: &T) -> ApiResult<()> {
        let json = serde_json::to_string(state).map_err(|e| ApiError::internal(e.to_string()))?;
        self.sql.exec(
            &format!(
                "INSERT INTO {table} (k, state) VALUES (0, ?) ON CONFLICT(k) DO UPDATE SET state = excluded.state"
            ),
            vec![json.into()],
        )?;
        Ok(())
    }

    async fn route(&self, mut req: Request) -> ApiResult<Response> {
        let (name, body) = internal::call_parts(&mut req).await?;
        let call = IndexCall::decode(&name, &body).map_err(internal::call_error)?;
        let who = Identity::from_headers(&req)?;
        match call {
            IndexCall::GateRequest(c) => Ok(reply(&c, &self.gate_request(&who, c.0.clone())?)),
            IndexCall::GateRelease(c) => {
                let mut gate = self.load_gate()?;
                let granted = gate.release(&c.child, &self.limits);
                self.save_gate(&gate)?;
                Ok(reply(&c, &granted))
            }
            IndexCall::Upsert(c) => {
                self.upsert(&c.info, c.created)?;
                Ok(reply(&c, &Empty))
            }
            IndexCall::Remove(c) => {
                self.sql.exec(
                    "INSERT INTO deleted_sessions (id) VALUES (?) ON CONFLICT(id) DO NOTHING",
                    vec![c.id.clone().into()],
                )?;
                self.sql.exec(
                    "DELETE FROM settings_holders WHERE session = ?",
                    vec![c.id.clone().into()],
                )?;
                self.sql.exec(
                    "DELETE FROM session_list WHERE id = ?",
                    vec![c.id.clone().into()],
                )?;
                Ok(reply(&c, &Empty))
            }
            IndexCall::Tree(c) => {
                // Only children and forks matter to the forks rule; the rest is not read.
                let rows: Vec<TreeSqlRow> = self
                    .sql
                    .exec(
                        "SELECT id, json_extract(info, '$.parentId') AS parent_id, json_extract(info, '$.forkedFrom.sessionId') AS forked_from FROM session_list WHERE json_extract(info, '$.parentId') IS NOT NULL OR json_extract(info, '$.forkedFrom.sessionId') IS NOT NULL",
                        None,
                    )?
                    .to_array()?;
                let rows: Vec<TreeRow> = rows
                    .into_iter()
                    .map(|r| TreeRow {
                        id: r.id,
                        parent_id: r.parent_id,
                        forked_from: r.forked_from,
                    })
                    .collect();
                Ok(reply(&c, &rows))
            }
            IndexCall::List(c) => Ok(reply(&c, &self.list(&who, &c)?)),
            IndexCall::ReportUsage(c) => Ok(reply(&c, &self.report_usage(&c.0)?)),
            IndexCall::LlmLogsWritten(c) => {
                // A session wrote request logs: a sweep pass starts within a minute unless
                // one is already due.
                let mut sweep: request_log::Sweep = self.load_state("llm_log_sweep")?;
                if sweep.tenant != who.tenant {
                    sweep.tenant = who.tenant.clone();
                    self.save_state("llm_log_sweep", &sweep)?;
                }
                let storage = self.state.storage();
                if storage.get_alarm().await?.is_none() {
                    storage
                        .set_alarm(request_log::SWEEP_CONTINUE_MS as i64)
                        .await?;
                }
                Ok(reply(&c, &Empty))
            }
            IndexCall::HoldSettings(c) => {
                let held = self.hold_settings(&who.tenant, &c.session).await?;
                Ok(reply(&c, &Held { held }))
            }
            IndexCall::SettingsChanged(c) => {
                let failed = self.tell_settings_changed(&who.tenant).await?;
                every_holder_told(failed, |failed| {
                    format!(
                        "{failed} running session(s) of the tenant could not be told of the change; write the document again"
                    )
                })?;
                Ok(reply(&c, &Empty))
            }
            IndexCall::GetBudget(c) => Ok(reply(&c, &self.load_budget()?)),
            IndexCall::PutBudget(c) => Ok(reply(&c, &self.put_budget(&who, c.0).await?)),
            IndexCall::GetUsage(c) => Ok(reply(&c, &self.usage(&who.principal(), &c)?)),
        }
    }

    /// Asks the gate for a slot for `slot.child`; a spawn granted meanwhile starts.
    fn gate_request(&self, who: &Identity, slot: Slot) -> ApiResult<GateAnswer> {
        let mut gate = self.load_gate()?;
        // Limits may have grown since the last change: whoever fits now runs.
        let granted = gate.admit(&self.limits);
        let answer = match gate.request(slot, &self.limits) {
            Ok(Admission::Granted) => GateAnswer::Granted,
            Ok(Admission::Queued { position, reason }) => GateAnswer::Queued { position, reason },
            Err(full) => return Err(ApiError::new(429, "gate_full", full.to_string())),
        };
        self.save_gate(&gate)?;
        if !granted.is_empty() {
            let env = self.env.clone();
            let tenant = who.tenant.clone();
            wasm_bindgen_futures::spawn_local(async move {
                crate::session_client::start_granted(&env, &tenant, granted).await;
            });
        }
        Ok(answer)
    }

    /// Refreshes a session's row (never a deleted one's), or records a new session.
    fn upsert(&self, info: &SessionInfo, created: bool) -> ApiResult<()> {
        let json = serde_json::to_string(info).map_err(|e| ApiError::internal(e.to_string()))?;
        if created {
            self.sql.exec(
                "DELETE FROM deleted_sessions WHERE id = ?",
                vec![info.id.clone().into()],
            )?;
        } else {
            let deleted: Vec<SeqRow> = self
                .sql
                .exec(
                    "SELECT 0 AS seq FROM deleted_sessions WHERE id = ?",
                    vec![info.id.clone().into()],
                )?
                .to_array()?;
            if !deleted.is_empty() {
                return Ok(());
            }
        }
        self.sql.exec(
            "INSERT INTO session_list (id, info) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET info = excluded.info",
            vec![info.id.clone().into(), json.into()],
        )?;
        Ok(())
    }

    /// The sessions `viewer` may see, newest first.
    /// The sessions the caller may see (or, for a session's tools, its readers), newest first.
    fn list(&self, viewer: &Identity, list: &List) -> ApiResult<ListSessionsResponse> {
        let viewer_principal = viewer.principal();
        let visible = |info: &SessionInfo| match &list.readers {
            Some(readers) => {
                readers.may_read(&viewer.tenant, facts_of(info), info.parent_id.as_deref())
            }
            None => visible(&viewer_principal, info),
        };
        let limit = list.limit;
        let parent = list.parent_id.as_deref();
        let mut anchor = match list.before.as_deref() {
            None => i64::MAX,
            Some(before) => {
                let rows: Vec<SeqRow> = self
                    .sql
                    .exec(
                        "SELECT seq FROM session_list WHERE id = ?",
                        vec![before.into()],
                    )?
                    .to_array()?;
                let Some(row) = rows.into_iter().next() else {
                    return Err(ApiError::bad_request(
                        "before must be the id of a listed session",
                    ));
                };
                row.seq as i64
            }
        };
        // Sessions the viewer may not read are skipped (core's rule decides). A page scans at
        // most MAX_SCANNED rows; a short page then still has `nextBefore`.
        let mut sessions: Vec<SessionInfo> = Vec::new();
        let mut scanned = 0usize;
        let mut last_scanned: Option<String> = None;
        let mut exhausted = false;
        while sessions.len() <= limit as usize && scanned < MAX_SCANNED {
            let rows: Vec<ListRow> = self
                .sql
                .exec(
                    "SELECT seq, info FROM session_list WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                    vec![anchor.into(), (SCAN_BATCH as i64).into()],
                )?
                .to_array()?;
            if rows.len() < SCAN_BATCH {
                exhausted = true;
            }
            for row in rows {
                anchor = row.seq as i64;
                scanned += 1;
                let Ok(info) = serde_json::from_str::<SessionInfo>(&row.info) else {
                    continue;
                };
                last_scanned = Some(info.id.clone());
                let in_tree = parent.is_none_or(|p| info.parent_id.as_deref() == Some(p));
                if sessions.len() <= limit as usize && in_tree && visible(&info) {
                    sessions.push(info);
                }
            }
            if exhausted {
                break;
            }
        }
        let more = sessions.len() > limit as usize;
        sessions.truncate(limit as usize);
        let next_before = if more {
            sessions.last().map(|s| s.id.clone())
        } else if !exhausted {
            last_scanned
        } else {
            None
        };
        Ok(ListSessionsResponse {
            sessions,
            next_before,
        })
    }

    /// Counts a session's report once (by its cursor) and answers with the tenant's budget.
    fn report_usage(&self, report: &UsageReport) -> ApiResult<tenant_usage::ReportAnswer> {
        if report.records.len() > tenant_usage::MAX_REPORT_RECORDS {
            return Err(ApiError::bad_request("too many records in one report"));
        }
        // No await from here on: the writes commit together.
        let rows: Vec<ThroughRow> = self
            .sql
            .exec(
                "SELECT through FROM usage_cursor WHERE session = ?",
                vec![report.session.clone().into()],
            )?
            .to_array()?;
        let stored = rows.into_iter().next().map_or(0, |r| r.through as u64);
        let (through, rows) = tenant_usage::apply_report(stored, report);
        for (key, t) in rows.iter().cloned() {
            self.sql.exec(
                    "INSERT INTO usage_hours (hour, session, provider, model, user, messages, input, output, cache_read, cache_write, reasoning, cost, unpriced) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT(hour, session, provider, model) DO UPDATE SET user = excluded.user, \
                     messages = messages + excluded.messages, input = input + excluded.input, \
                     output = output + excluded.output, cache_read = cache_read + excluded.cache_read, \
                     cache_write = cache_write + excluded.cache_write, reasoning = reasoning + excluded.reasoning, \
                     cost = cost + excluded.cost, unpriced = unpriced + excluded.unpriced",
                    vec![
                        key.hour.into(),
                        key.session.into(),
                        key.provider.into(),
                        key.model.into(),
                        report.user.clone().into(),
                        (t.messages as i64).into(),
                        (t.input_tokens as i64).into(),
                        (t.output_tokens as i64).into(),
                        (t.cache_read_tokens as i64).into(),
                        (t.cache_write_tokens as i64).into(),
                        (t.reasoning_tokens as i64).into(),
                        t.cost_usd.into(),
                        (t.unpriced_messages as i64).into(),
                    ],
                )?;
        }
        let mut budget = self.load_budget()?;
        if !rows.is_empty() {
            budget.add(&rows);
            self.save_budget(&budget)?;
        }
        self.sql.exec(
                "INSERT INTO usage_cursor (session, through) VALUES (?, ?) ON CONFLICT(session) DO UPDATE SET through = excluded.through",
                vec![report.session.clone().into(), (through as i64).into()],
            )?;
        Ok(tenant_usage::ReportAnswer { through, budget })
    }

    /// `PUT /v1/budget` (admins only).
    async fn put_budget(&self, who: &Identity, budget: Budget) -> ApiResult<TenantBudget> {
        if !who.principal().is_admin() {
            return Err(ApiError::new(
                403,
                "forbidden",
                "only an admin may set the tenant's budget",
            ));
        }
        budget.validate().map_err(ApiError::bad_request)?;
        let mut state = self.load_budget()?;
        let was_unlimited = state.budget.is_none();
        state.budget = (budget.max_tokens.is_some() || budget.max_usd.is_some()).then_some(budget);
        self.save_budget(&state)?;
        // Sessions that know the tenant has no budget send requests without reporting
        // first, only while this index holds them as settings holders (decision 0022):
        // a first budget is told to them as a settings change is, before the answer.
        if was_unlimited && state.budget.is_some() {
            let failed = self.tell_settings_changed(&who.tenant).await?;
            every_holder_told(failed, |failed| {
                format!(
                    "the budget was saved, but {failed} running session(s) of the tenant could not be told of it; they see it with their next usage report, or put it again"
                )
            })?;
        }
        Ok(state)
    }

    /// `GET /v1/usage`: members see the sessions they own; admins the whole tenant.
    fn usage(&self, viewer: &Principal, asked: &GetUsage) -> ApiResult<TenantUsage> {
        let now = (worker::Date::now().as_millis() / 1000) as i64;
        let usage_query = UsageQuery::parse(
            asked.from.as_deref(),
            asked.to.as_deref(),
            asked.by.as_deref(),
            now,
        )
        .map_err(ApiError::bad_request)?;
        // Members see the sessions they own; admins the whole tenant.
        let only_user = (!viewer.is_admin()).then_some(viewer.sub.as_str());
        let rows: Vec<HourSqlRow> = match only_user {
            None => self.sql.exec(
                "SELECT * FROM usage_hours WHERE hour >= ? AND hour < ?",
                vec![usage_query.from.into(), usage_query.to.into()],
            )?,
            Some(user) => self.sql.exec(
                "SELECT * FROM usage_hours WHERE hour >= ? AND hour < ? AND user = ?",
                vec![
                    usage_query.from.into(),
                    usage_query.to.into(),
                    user.to_string().into(),
                ],
            )?,
        }
        .to_array()?;
        Ok(tenant_usage::group(
            rows.into_iter().map(HourRow::from),
            &usage_query,
            only_user,
        ))
    }
}

#[derive(Deserialize)]
struct ThroughRow {
    through: f64,
}

#[derive(Deserialize)]
struct HourSqlRow {
    hour: f64,
    session: String,
    provider: String,
    model: String,
    user: String,
    messages: f64,
    input: f64,
    output: f64,
    cache_read: f64,
    cache_write: f64,
    reasoning: f64,
    cost: f64,
    unpriced: f64,
}

impl From<HourSqlRow> for HourRow {
    fn from(r: HourSqlRow) -> HourRow {
        HourRow {
            key: HourKey {
                hour: r.hour as i64,
                session: r.session,
                provider: r.provider,
                model: r.model,
            },
            user: r.user,
            totals: UsageTotals {
                messages: r.messages as u64,
                input_tokens: r.input as u64,
                output_tokens: r.output as u64,
                cache_read_tokens: r.cache_read as u64,
                cache_write_tokens: r.cache_write as u64,
                reasoning_tokens: r.reasoning as u64,
                cost_usd: r.cost,
                unpriced_messages: r.unpriced as u64,
            },
        }
    }
}

/// Tells the index that a session of the tenant wrote request logs, so its sweep of expired
/// ones runs (see `TenantIndex::sweep_llm_logs`).
pub(crate) async fn llm_logs_written(env: &Env, tenant: &str) -> ApiResult<()> {
    system_call(env, tenant, &LlmLogsWritten).await.map(|_| ())
}

/// Tells the index what a session's requests used (see `wuhu_core::tenant_usage`); the answer
/// carries the tenant's budget with the report counted.
pub(crate) async fn report_usage(
    env: &Env,
    tenant: &str,
    report: &UsageReport,
) -> ApiResult<tenant_usage::ReportAnswer> {
    system_call(env, tenant, &ReportUsage(report.clone())).await
}

/// Asks the index to hold `session` as keeping a reading of the tenant's settings (see
/// `wuhu_core::tenant_config::SettingsCache`); `false`: refused (too many holders).
pub(crate) async fn hold_settings(env: &Env, tenant: &str, session: &str) -> ApiResult<bool> {
    let call = HoldSettings {
        session: session.to_string(),
    };
    Ok(system_call(env, tenant, &call).await?.held)
}

/// The tenant's budget and what it spent (for a session before a step's request, when
/// `tenant_usage::must_ask_budget` says so).
pub(crate) async fn budget(env: &Env, tenant: &str) -> ApiResult<TenantBudget> {
    system_call(env, tenant, &GetBudget).await
}

/// Refreshes a session in its tenant's index (never a deleted one).
pub(crate) async fn upsert(env: &Env, tenant: &str, info: &SessionInfo) -> ApiResult<()> {
    let call = Upsert {
        info: info.clone(),
        created: false,
    };
    system_call(env, tenant, &call).await.map(|_| ())
}

/// Records a new session in its tenant's index.
pub(crate) async fn create(env: &Env, tenant: &str, info: &SessionInfo) -> ApiResult<()> {
    let call = Upsert {
        info: info.clone(),
        created: true,
    };
    system_call(env, tenant, &call).await.map(|_| ())
}

/// Lists the sessions of `tenant` that `readers` may see (a session's tools), newest first.
pub(crate) async fn list_for(
    env: &Env,
    tenant: &str,
    readers: ToolReaders,
    limit: u32,
    before: Option<&str>,
) -> ApiResult<ListSessionsResponse> {
    let call = List {
        limit,
        before: before.map(str::to_string),
        parent_id: None,
        readers: Some(readers),
    };
    system_call(env, tenant, &call).await
}

/// Asks the tenant's gate for a slot for `slot.child`.
pub(crate) async fn gate_request(env: &Env, tenant: &str, slot: &Slot) -> ApiResult<GateAnswer> {
    system_call(env, tenant, &GateRequest(slot.clone())).await
}

/// Frees `child`'s slot (or its place in line); returns the spawns granted in its stead.
pub(crate) async fn gate_release(env: &Env, tenant: &str, child: &str) -> ApiResult<Vec<Slot>> {
    let call = GateRelease {
        child: child.to_string(),
    };
    system_call(env, tenant, &call).await
}

/// Removes a deleted session from its tenant's list (for good: see `deleted_sessions`).
pub(crate) async fn remove(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    let call = Remove { id: id.to_string() };
    system_call(env, tenant, &call).await.map(|_| ())
}

/// The listed children and forks of the tenant, for the forks rule
/// (`wuhu_core::deletion::blocking_forks`). One row per child or fork of the tenant.
pub(crate) async fn tree(env: &Env, tenant: &str) -> ApiResult<Vec<TreeRow>> {
    system_call(env, tenant, &Tree).await
}

/// A call of the tenant's own actors to its index.
async fn system_call<C: Call<Target = Index>>(
    env: &Env,
    tenant: &str,
    call: &C,
) -> ApiResult<C::Reply> {
    let who = Identity::system(tenant);
    internal::call(&internal::tenant_index(env, tenant)?, &who, call).await
}
