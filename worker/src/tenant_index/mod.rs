//! `TenantIndex`: one Durable Object per tenant. By job:
//! - `sessions`: the tenant's session list, newest first (with tombstones of deleted sessions),
//!   and the children and forks the forks rule of a deletion reads;
//! - `gate`: the concurrency gate of spawned sessions (`wuhu_core::orchestration::Gate`, saved
//!   whole after every change, so it survives restarts), reconciled by the alarm while it holds
//!   anything;
//! - `usage`: hourly usage totals per session, provider and model, the cursor each session
//!   reported through, and the tenant's budget (`wuhu_core::tenant_usage`);
//! - `settings`: the sessions that keep a reading of the tenant's settings, each told before a
//!   change under `config/` is answered (`wuhu_core::tenant_config::SettingsCache`, decision
//!   0021; a first budget is told the same way, decision 0022);
//! - `secrets`: the tenant's and its users' secrets, sealed (`wuhu_core::secrets`); a change
//!   is told to the settings holders, so sessions use it from their next step;
//! - `sweep`: the deletion of the tenant's expired request logs (the alarm runs it and the
//!   gate's reconciliation, each when due: `wuhu_core::bookkeeping::IndexAlarms`);
//! - `client`: the calls the tenant's other actors and the router send it.
//!
//! Its calls are `wuhu_core::calls::index::IndexCall`; its schema is `MIGRATIONS`.

mod client;
mod gate;
mod secrets;
mod sessions;
mod settings;
mod sweep;
mod usage;

pub(crate) use client::*;

use serde::Deserialize;
use worker::{DurableObject, Env, Request, Response, SqlStorage, State, durable_object};
use wuhu_core::calls::Empty;
use wuhu_core::calls::index::{Held, IndexCall};
use wuhu_core::llm::request_log;
use wuhu_core::orchestration::Limits;

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::internal::{self, reply};
use crate::schema::{Migration, migrate};

#[durable_object]
pub struct TenantIndex {
    state: State,
    sql: SqlStorage,
    env: Env,
    limits: Limits,
    /// Whether the schema migrated; every call answers its error otherwise.
    schema: Result<(), String>,
}

/// The index's schema, in order (numbered from 1 by position; never reorder or remove one).
const MIGRATIONS: &[Migration] = &[
    // 1. `seq` orders sessions by creation: ids are random and times only have seconds.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS session_list (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, info TEXT NOT NULL)",
    ),
    // 2. Deleted sessions: a refresh of a deleted session's row that was in flight when it was
    // removed must not list it again. One short row per deleted session.
    Migration::Sql("CREATE TABLE IF NOT EXISTS deleted_sessions (id TEXT PRIMARY KEY)"),
    // 3.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS gate (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
    ),
    // 4.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS usage_hours (hour INTEGER NOT NULL, session TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL, user TEXT NOT NULL, messages INTEGER NOT NULL, input INTEGER NOT NULL, output INTEGER NOT NULL, cache_read INTEGER NOT NULL, cache_write INTEGER NOT NULL, reasoning INTEGER NOT NULL, cost REAL NOT NULL, unpriced INTEGER NOT NULL, PRIMARY KEY (hour, session, provider, model))",
    ),
    // 5.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS usage_cursor (session TEXT PRIMARY KEY, through INTEGER NOT NULL)",
    ),
    // 6.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS budget (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
    ),
    // 7.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS llm_log_sweep (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
    ),
    // 8. Sessions that keep a reading of the tenant's settings. `seq` changes with every hold,
    // so a change lets go only of the holds it told (a session that holds again meanwhile
    // stays).
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS settings_holders (seq INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL UNIQUE)",
    ),
    // 9. Secrets: `owner` is '' for the tenant's. `info` is the listed JSON (`SecretInfo`),
    // `sealed` the value (`wuhu_core::secrets::SecretKeys`).
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS secrets (scope TEXT NOT NULL, owner TEXT NOT NULL, name TEXT NOT NULL, info TEXT NOT NULL, sealed TEXT NOT NULL, PRIMARY KEY (scope, owner, name))",
    ),
    // 10. The alarm's timers (`gate::AlarmState`): the request-log sweep and the gate's
    // reconciliation share the one alarm.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS alarms (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
    ),
    // 11. MCP calls by hour, session and server (`server` '' holds error results, which do
    // not name theirs), with the session's owner, counted once by the `usage_cursor`.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS mcp_hours (hour INTEGER NOT NULL, session TEXT NOT NULL, server TEXT NOT NULL, user TEXT NOT NULL, calls INTEGER NOT NULL, errors INTEGER NOT NULL, PRIMARY KEY (hour, session, server))",
    ),
];

#[derive(Deserialize)]
struct ValueRow {
    state: String,
}

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

impl DurableObject for TenantIndex {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        let schema = migrate(&sql, "tenant_index", MIGRATIONS);
        if let Err(e) = &schema {
            worker::console_error!("tenant index: {e}");
        }
        TenantIndex {
            state,
            sql,
            limits: crate::session_client::orchestration_limits(&env),
            env,
            schema,
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        Ok(match self.route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }

    /// The alarm serves two timers (`wuhu_core::bookkeeping::IndexAlarms`): the gate's
    /// reconciliation and the sweep of the tenant's expired request logs.
    async fn alarm(&self) -> worker::Result<Response> {
        if let Err(e) = self.run_alarm().await {
            worker::console_error!("the tenant index's alarm failed: {}", e.message);
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
    /// Does what is due of the alarm's timers and sets it for the next.
    async fn run_alarm(&self) -> ApiResult<()> {
        let now = worker::Date::now().as_millis();
        let mut state = self.load_alarms()?;
        let run = state.alarms.take_due(now);
        // Saved at once: a gate change while this runs sets its own time.
        self.save_state("alarms", &state)?;
        let mut next = wuhu_core::bookkeeping::IndexAlarms::default();
        if run.reconcile && !state.tenant.is_empty() {
            let again = self
                .reconcile_gate(&state.tenant)
                .await
                .unwrap_or_else(|e| {
                    worker::console_error!("reconciling the gate failed: {}", e.message);
                    true
                });
            if again {
                next.reconcile_by(now + wuhu_core::orchestration::RECONCILE_EVERY_MS);
            }
        }
        if run.sweep {
            match self.sweep_llm_logs().await {
                Ok(Some(at)) => next.sweep_by(at, false),
                Ok(None) => {}
                Err(e) => {
                    worker::console_error!("sweeping expired request logs failed: {}", e.message);
                    next.sweep_by(now + request_log::SWEEP_CONTINUE_MS, false);
                }
            }
        }
        // With the times set while this ran: the earlier of each wins.
        let mut current = self.load_alarms()?;
        if let Some(at) = next.reconcile_at {
            current.alarms.reconcile_by(at);
        }
        if let Some(at) = next.sweep_at {
            current.alarms.sweep_by(at, true);
        }
        self.save_alarms(&current).await
    }

    async fn route(&self, mut req: Request) -> ApiResult<Response> {
        if let Err(e) = &self.schema {
            return Err(ApiError::new(500, "storage_failed", e.clone()));
        }
        let (name, body) = internal::call_parts(&mut req).await?;
        let call = IndexCall::decode(&name, &body).map_err(internal::call_error)?;
        let who = Identity::from_headers(&req)?;
        match call {
            IndexCall::GateRequest(c) => {
                Ok(reply(&c, &self.gate_request(&who, c.0.clone()).await?))
            }
            IndexCall::GateRelease(c) => Ok(reply(
                &c,
                &self.gate_release(&who, &c.child, c.granted_before).await?,
            )),
            IndexCall::Upsert(c) => {
                self.upsert(&c.info, c.created)?;
                Ok(reply(&c, &Empty))
            }
            IndexCall::Remove(c) => {
                self.remove(&c.id)?;
                Ok(reply(&c, &Empty))
            }
            IndexCall::Tree(c) => Ok(reply(&c, &self.tree()?)),
            IndexCall::List(c) => Ok(reply(&c, &self.list(&who, &c)?)),
            IndexCall::ReportUsage(c) => Ok(reply(&c, &self.report_usage(&c.0)?)),
            IndexCall::LlmLogsWritten(c) => {
                self.llm_logs_written(&who.tenant).await?;
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
            IndexCall::PutSecret(c) => Ok(reply(&c, &self.put_secret(&who, &c).await?)),
            IndexCall::DeleteSecret(c) => {
                self.delete_secret(&who, &c).await?;
                Ok(reply(&c, &Empty))
            }
            IndexCall::ListSecrets(c) => Ok(reply(&c, &self.list_secrets(&who)?)),
            IndexCall::SealedSecrets(c) => Ok(reply(&c, &self.sealed_secrets(&who.tenant)?)),
        }
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
}
