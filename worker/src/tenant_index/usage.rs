//! The tenant's usage (hourly totals per session, provider and model; the cursor each session
//! reported through) and its budget (`wuhu_core::tenant_usage`).

use serde::Deserialize;
use wuhu_core::authority::Principal;
use wuhu_core::calls::index::GetUsage;
use wuhu_core::llm::models::UsageTotals;
use wuhu_core::tenant_usage::{
    self, HourKey, HourRow, McpCounts, McpHourKey, McpHourRow, TenantBudget, TenantUsage,
    UsageQuery, UsageReport,
};
use wuhu_core::wire::Budget;

use super::{TenantIndex, every_holder_told};
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};

impl TenantIndex {
    pub(super) fn load_budget(&self) -> ApiResult<TenantBudget> {
        self.load_state("budget")
    }

    fn save_budget(&self, budget: &TenantBudget) -> ApiResult<()> {
        self.save_state("budget", budget)
    }

    /// Counts a session's report once (by its cursor) and answers with the tenant's budget.
    pub(super) fn report_usage(
        &self,
        report: &UsageReport,
    ) -> ApiResult<tenant_usage::ReportAnswer> {
        if report.records.len() > tenant_usage::MAX_REPORT_RECORDS
            || report.mcp.len() > tenant_usage::MAX_REPORT_MCP_RECORDS
        {
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
        for (key, counts) in tenant_usage::apply_mcp(stored, report) {
            self.sql.exec(
                "INSERT INTO mcp_hours (hour, session, server, user, calls, errors) VALUES (?, ?, ?, ?, ?, ?) \
                 ON CONFLICT(hour, session, server) DO UPDATE SET user = excluded.user, \
                 calls = calls + excluded.calls, errors = errors + excluded.errors",
                vec![
                    key.hour.into(),
                    key.session.into(),
                    key.server.into(),
                    report.user.clone().into(),
                    (counts.calls as i64).into(),
                    (counts.errors as i64).into(),
                ],
            )?;
        }
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
    pub(super) async fn put_budget(
        &self,
        who: &Identity,
        budget: Budget,
    ) -> ApiResult<TenantBudget> {
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

    /// The rows of `table` (`usage_hours`, `mcp_hours`) in the query's hours; only those of
    /// `only_user`'s sessions when given.
    fn hour_rows<T: serde::de::DeserializeOwned>(
        &self,
        table: &'static str,
        query: &UsageQuery,
        only_user: Option<&str>,
    ) -> ApiResult<Vec<T>> {
        let mut sql = format!("SELECT * FROM {table} WHERE hour >= ? AND hour < ?");
        let mut bindings = vec![query.from.into(), query.to.into()];
        if let Some(user) = only_user {
            sql.push_str(" AND user = ?");
            bindings.push(user.to_string().into());
        }
        Ok(self.sql.exec(&sql, bindings)?.to_array()?)
    }

    /// `GET /v1/usage`: members see the sessions they own; admins the whole tenant.
    pub(super) fn usage(&self, viewer: &Principal, asked: &GetUsage) -> ApiResult<TenantUsage> {
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
        let rows: Vec<HourSqlRow> = self.hour_rows("usage_hours", &usage_query, only_user)?;
        let mcp_rows: Vec<McpSqlRow> = self.hour_rows("mcp_hours", &usage_query, only_user)?;
        let mut usage =
            tenant_usage::group(rows.into_iter().map(HourRow::from), &usage_query, only_user);
        usage.mcp = tenant_usage::group_mcp(
            mcp_rows.into_iter().map(McpHourRow::from),
            &usage_query,
            only_user,
        );
        Ok(usage)
    }
}

#[derive(Deserialize)]
struct McpSqlRow {
    hour: f64,
    session: String,
    server: String,
    user: String,
    calls: f64,
    errors: f64,
}

impl From<McpSqlRow> for McpHourRow {
    fn from(r: McpSqlRow) -> McpHourRow {
        McpHourRow {
            key: McpHourKey {
                hour: r.hour as i64,
                session: r.session,
                server: r.server,
            },
            user: r.user,
            counts: McpCounts {
                calls: r.calls as u64,
                errors: r.errors as u64,
            },
        }
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
