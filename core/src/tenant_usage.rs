//! Usage of a whole tenant (`GET /v1/usage?from=&to=&by=session|user|model`).
//!
//! Each session reports what its requests used to its tenant's index ([`UsageReport`]: the
//! assistant messages and compaction summaries after the cursor it last reported). The index
//! keeps hourly totals per session, provider and model ([`HourKey`]), with the session's owner,
//! and the cursor each session reported through, so a report sent twice counts once
//! ([`apply_report`]). A query adds up the hours in `[from, to)` by session, user (the session's
//! owner) or model ([`group`]); a member sees only the sessions they own, an admin the tenant.

use serde::{Deserialize, Serialize};

use crate::llm::models::{McpCalls, McpServerCalls, UsageTotals};
use crate::wire::{Budget, Entry, EntryPayload, Message, Spent, Usage};

/// Seconds in one bucket of the index.
pub const HOUR_SECONDS: i64 = 3600;
/// Most records one report carries (a session reports the rest in the next one).
pub const MAX_REPORT_RECORDS: usize = 256;
/// Most groups one answer lists (the costliest first); `truncated` says when more exist.
pub const MAX_GROUPS: usize = 1000;

/// A tenant's budget and what its sessions spent (as reported to its index, since usage is
/// reported): `GET|PUT /v1/budget`, and what a session asks before each step's request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TenantBudget {
    /// The budget (`None`: no limit).
    pub budget: Option<Budget>,
    /// Input plus output tokens and dollars of every reported request.
    pub spent: Spent,
}

impl TenantBudget {
    /// Which limit is reached, if any: a request starts only while none is. Each session
    /// reports its usage before it asks, and runs one request at a time, so concurrent sessions
    /// overshoot by at most one request (one step) each.
    pub fn exceeded(&self) -> Option<&'static str> {
        self.budget
            .as_ref()
            .and_then(|b| b.exceeded_by(&self.spent))
    }

    /// Whether the budget sets a USD limit: then every model a session uses needs a price
    /// (`crate::llm::choice::UsdLimits::tenant`).
    pub fn usd_limited(&self) -> bool {
        self.budget.is_some_and(|b| b.max_usd.is_some())
    }

    /// Adds what `rows` (of [`apply_report`]) used.
    pub fn add(&mut self, rows: &[(HourKey, UsageTotals)]) {
        for (_, totals) in rows {
            self.spent.tokens = self
                .spent
                .tokens
                .saturating_add(totals.input_tokens.saturating_add(totals.output_tokens));
            if totals.cost_usd.is_finite() && totals.cost_usd > 0.0 {
                self.spent.usd += totals.cost_usd;
            }
        }
    }
}

/// One request's usage, as a session reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UsageRecord {
    /// The entry that recorded it.
    pub cursor: u64,
    /// Unix seconds of the entry.
    pub at: i64,
    /// Provider of the request.
    pub provider: String,
    /// Model of the request.
    pub model: String,
    /// What it used.
    pub usage: Usage,
}

/// What a session tells its tenant's index (internal `POST /usage/report`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// The session.
    pub session: String,
    /// Its owner (usage by user is by owner).
    pub user: String,
    /// Every entry through this cursor has been looked at: records after it come later.
    pub through: u64,
    /// The requests among the entries after the previously reported cursor, oldest first.
    pub records: Vec<UsageRecord>,
    /// The MCP calls and failed MCP results among the same entries ([`mcp_records`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<McpRecord>,
}

/// Most MCP records one report carries (a report of [`MAX_REPORT_RECORDS`] entries whose
/// assistant messages each make many `mcp_call`s is cut here; the index refuses more).
pub const MAX_REPORT_MCP_RECORDS: usize = 4096;

/// One MCP use a session reports: an `mcp_call` the model made, or the error result of one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct McpRecord {
    /// The entry that recorded it.
    pub cursor: u64,
    /// Unix seconds of the entry.
    pub at: i64,
    /// The server the call named (empty for an error result: a result does not name it).
    pub server: String,
    /// An error result, not a call.
    pub error: bool,
}

/// The MCP records among `entries`: each `mcp_call` of an assistant message (by the server
/// its arguments name) and each `mcp_call` result that is an error, as the session's own usage
/// counts them (`crate::llm::models::SessionUsage`). At most [`MAX_REPORT_MCP_RECORDS`].
pub fn mcp_records(entries: &[Entry]) -> Vec<McpRecord> {
    let mut out = Vec::new();
    for entry in entries {
        match &entry.payload {
            EntryPayload::Message {
                message: Message::Assistant(m),
            } => {
                for call in m
                    .tool_calls()
                    .filter(|c| c.name == crate::tools::names::MCP_CALL)
                {
                    out.push(McpRecord {
                        cursor: entry.cursor,
                        at: entry.created_at,
                        server: call.arguments["server"]
                            .as_str()
                            .unwrap_or("")
                            .chars()
                            .take(200)
                            .collect(),
                        error: false,
                    });
                }
            }
            EntryPayload::Message {
                message: Message::ToolResult(r),
            } if r.tool_name == crate::tools::names::MCP_CALL && r.is_error => {
                out.push(McpRecord {
                    cursor: entry.cursor,
                    at: entry.created_at,
                    server: String::new(),
                    error: true,
                });
            }
            _ => {}
        }
    }
    out.truncate(MAX_REPORT_MCP_RECORDS);
    out
}

/// One MCP row of the index: an hour of one session's calls to one server (`server` empty:
/// error results, which do not name theirs).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct McpHourKey {
    /// Unix seconds of the hour's start.
    pub hour: i64,
    /// The session.
    pub session: String,
    /// The server.
    pub server: String,
}

/// Calls and errors of one [`McpHourKey`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct McpCounts {
    /// `mcp_call`s made.
    pub calls: u64,
    /// Error results.
    pub errors: u64,
}

/// The MCP rows `report` adds, given the cursor the index holds for the session (`stored`):
/// records at or before it were counted already, as in [`apply_report`].
pub fn apply_mcp(stored: u64, report: &UsageReport) -> Vec<(McpHourKey, McpCounts)> {
    let mut rows: Vec<(McpHourKey, McpCounts)> = Vec::new();
    for record in report.mcp.iter().filter(|r| r.cursor > stored) {
        let key = McpHourKey {
            hour: record.at.div_euclid(HOUR_SECONDS) * HOUR_SECONDS,
            session: report.session.clone(),
            server: record.server.clone(),
        };
        let counts = match rows.iter_mut().find(|(k, _)| *k == key) {
            Some((_, counts)) => counts,
            None => {
                rows.push((key, McpCounts::default()));
                &mut rows.last_mut().expect("just pushed").1
            }
        };
        if record.error {
            counts.errors += 1;
        } else {
            counts.calls += 1;
        }
    }
    rows
}

/// One MCP hour row as the index stores it, with the session's owner.
#[derive(Clone, Debug, PartialEq)]
pub struct McpHourRow {
    /// Which hour, session and server.
    pub key: McpHourKey,
    /// The session's owner.
    pub user: String,
    /// Its counts.
    pub counts: McpCounts,
}

/// The MCP calls of `rows` in `query`'s hours (a member's view: `only_user`), the servers with
/// the most calls first, at most [`MAX_GROUPS`].
pub fn group_mcp(
    rows: impl IntoIterator<Item = McpHourRow>,
    query: &UsageQuery,
    only_user: Option<&str>,
) -> McpCalls {
    let mut total = McpCalls::default();
    let mut by_server: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for row in rows {
        if row.key.hour < query.from
            || row.key.hour >= query.to
            || only_user.is_some_and(|u| u != row.user)
        {
            continue;
        }
        total.calls = total.calls.saturating_add(row.counts.calls);
        total.errors = total.errors.saturating_add(row.counts.errors);
        if row.counts.calls > 0 {
            *by_server.entry(row.key.server).or_default() += row.counts.calls;
        }
    }
    let mut servers: Vec<McpServerCalls> = by_server
        .into_iter()
        .map(|(server, calls)| McpServerCalls { server, calls })
        .collect();
    servers.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.server.cmp(&b.server)));
    servers.truncate(MAX_GROUPS);
    total.by_server = servers;
    total
}

/// How long a session relies on its index's last answer about the budget (unix ms).
pub const BUDGET_ANSWER_FRESH_MS: u64 = 60_000;

/// Whether a session asks its tenant's index for the budget before a request, given the state
/// the index last answered it and when (`last_answer`: from a report of all of the session's
/// own usage, or from an earlier question): when it has none, when that answer is older than
/// [`BUDGET_ANSWER_FRESH_MS`], or when it has a limit reached (an admin may have raised it
/// since). A fresh answer with no limit reached stands without a round trip: what other
/// sessions spent since then is seen in the answer to this session's next report, which
/// follows each of its requests. So once a limit is reached, each session still sends at most
/// one more request, as when every request asked.
pub fn must_ask_budget(last_answer: Option<(&TenantBudget, u64)>, now_ms: u64) -> bool {
    last_answer.is_none_or(|(state, at)| {
        state.exceeded().is_some() || now_ms.saturating_sub(at) > BUDGET_ANSWER_FRESH_MS
    })
}

/// What a session knows of its tenant's budget: the index's last answer to it (a report's or a
/// question's), when it came, and the session's settings hold when it was asked
/// ([`crate::tenant_config::SettingsCache::held_generation`]: `None` when the index did not hold
/// the session as a settings holder when the request left).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KnownBudget {
    /// The budget and what the tenant spent, as the index answered.
    pub state: TenantBudget,
    /// When the answer came (unix ms).
    pub at: u64,
    /// The settings hold's generation when the request was sent, if held.
    pub asked_while_held: Option<u64>,
}

/// How long a session that may skip the report before a request ([`unlimited_and_told`]) waits
/// before it reports its usage: the requests of a quick run of steps go to the index in one
/// report, one index write. Each write is a storage commit of the index; under `wrangler dev`
/// every commit blocks the one workerd thread for its `fsync`, and one per turn was about 0.6 ms of
/// the next turn's first delta (docs/benchmarks.md, session 28).
pub const USAGE_REPORT_DELAY_MS: u64 = 250;

/// Whether a step's request may leave without this session reporting its usage first and without
/// asking the index (decision 0022): the index's last answer sets no limit at all, is fresh
/// ([`BUDGET_ANSWER_FRESH_MS`]), and was asked while the index held this session as a settings
/// holder, with no forget since (`held_now`: the hold's generation now, `None` when not held).
/// A budget set on a tenant without one tells every holder to forget before `PUT /v1/budget`
/// answers, as a settings change does, so a step that starts after that answer finds this false:
/// it reports, learns the limit with all of its own requests counted, and a spent budget ends the
/// turn. With a limit set, every request is reported before the next one, so each session
/// overshoots by at most one step's requests, as before.
#[must_use]
pub fn unlimited_and_told(known: Option<&KnownBudget>, held_now: Option<u64>, now_ms: u64) -> bool {
    known.is_some_and(|known| {
        known.state.budget.is_none()
            && now_ms.saturating_sub(known.at) <= BUDGET_ANSWER_FRESH_MS
            && known.asked_while_held.is_some()
            && known.asked_while_held == held_now
    })
}

/// How long a session waits before it reports the usage of its newest requests: at once unless
/// its steps may go without reports ([`unlimited_and_told`]), then [`USAGE_REPORT_DELAY_MS`].
#[must_use]
pub fn usage_report_delay_ms(
    known: Option<&KnownBudget>,
    held_now: Option<u64>,
    now_ms: u64,
) -> u64 {
    if unlimited_and_told(known, held_now, now_ms) {
        USAGE_REPORT_DELAY_MS
    } else {
        0
    }
}

/// The index's answer to a [`UsageReport`]: the cursor it holds for the session, and the
/// tenant's budget with the report counted, so a session reporting before a request learns
/// whether it may send it from the same round trip.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportAnswer {
    /// The cursor the index holds for the session after the report.
    pub through: u64,
    /// The budget and what the tenant spent, this report included.
    pub budget: TenantBudget,
}

/// The records among `entries` (assistant messages and compaction summaries with usage).
pub fn records(entries: &[Entry]) -> Vec<UsageRecord> {
    entries
        .iter()
        .filter_map(|entry| {
            let (provider, model, usage) = match &entry.payload {
                EntryPayload::Message {
                    message: Message::Assistant(m),
                } => (&m.provider, &m.model, m.usage.as_ref()?),
                EntryPayload::Compaction(c) => (&c.provider, &c.model, c.usage.as_ref()?),
                _ => return None,
            };
            Some(UsageRecord {
                cursor: entry.cursor,
                at: entry.created_at,
                provider: provider.clone(),
                model: model.clone(),
                usage: *usage,
            })
        })
        .collect()
}

/// One row of the index: an hour of one session's use of one model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HourKey {
    /// Unix seconds of the hour's start.
    pub hour: i64,
    /// The session.
    pub session: String,
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
}

/// What the index adds for `report`, given the cursor it holds for that session (`stored`):
/// the new cursor and the totals to add per hour row. Records at or before `stored` were
/// counted already and are skipped, so applying a report twice counts it once.
pub fn apply_report(stored: u64, report: &UsageReport) -> (u64, Vec<(HourKey, UsageTotals)>) {
    let mut rows: Vec<(HourKey, UsageTotals)> = Vec::new();
    for record in report.records.iter().filter(|r| r.cursor > stored) {
        let key = HourKey {
            hour: record.at.div_euclid(HOUR_SECONDS) * HOUR_SECONDS,
            session: report.session.clone(),
            provider: record.provider.clone(),
            model: record.model.clone(),
        };
        match rows.iter_mut().find(|(k, _)| *k == key) {
            Some((_, totals)) => totals.add(&record.usage),
            None => {
                let mut totals = UsageTotals::default();
                totals.add(&record.usage);
                rows.push((key, totals));
            }
        }
    }
    (stored.max(report.through), rows)
}

/// How a query groups the hours.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum GroupBy {
    /// Per session.
    Session,
    /// Per owner of the sessions.
    User,
    /// Per provider and model.
    Model,
    /// Per UTC day (`YYYY-MM-DD`), oldest first: spend over time.
    Day,
}

/// A parsed `GET /v1/usage` query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageQuery {
    /// Unix seconds, inclusive (hours starting at or after it count).
    pub from: i64,
    /// Unix seconds, exclusive.
    pub to: i64,
    /// Grouping.
    pub by: GroupBy,
}

impl UsageQuery {
    /// Parses `from` and `to` (unix seconds; default: the beginning, and `now` plus an hour so
    /// the current hour counts) and `by` (default `model`).
    ///
    /// # Errors
    /// A message for a 400.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        by: Option<&str>,
        now: i64,
    ) -> Result<UsageQuery, String> {
        let seconds = |name: &str, value: Option<&str>, default: i64| match value {
            None | Some("") => Ok(default),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("{name} must be unix seconds")),
        };
        let from = seconds("from", from, 0)?;
        let to = seconds("to", to, now + HOUR_SECONDS)?;
        if from >= to {
            return Err("from must be before to".into());
        }
        let by = match by.unwrap_or("model") {
            "session" => GroupBy::Session,
            "user" => GroupBy::User,
            "model" => GroupBy::Model,
            "day" => GroupBy::Day,
            other => {
                return Err(format!(
                    "unknown by {other:?}: use session, user, model or day"
                ));
            }
        };
        Ok(UsageQuery { from, to, by })
    }
}

/// One hour row as the index stores it, with the session's owner.
#[derive(Clone, Debug, PartialEq)]
pub struct HourRow {
    /// Which hour, session and model.
    pub key: HourKey,
    /// The session's owner.
    pub user: String,
    /// Its totals.
    pub totals: UsageTotals,
}

/// One group of an answer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct UsageGroup {
    /// The session id, the user, or the model.
    pub key: String,
    /// The provider, when grouped by model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Its totals.
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// `GET /v1/usage`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TenantUsage {
    /// The query's `from`.
    pub from: i64,
    /// The query's `to`.
    pub to: i64,
    /// The grouping.
    pub by: GroupBy,
    /// Over every group, listed or not.
    pub total: UsageTotals,
    /// The groups, costliest first (then most tokens, then by key), at most [`MAX_GROUPS`].
    pub groups: Vec<UsageGroup>,
    /// Whether groups were left out.
    pub truncated: bool,
    /// The MCP calls of the same sessions and hours (`byServer`: the most called first).
    #[serde(default)]
    pub mcp: McpCalls,
}

fn add_totals(into: &mut UsageTotals, other: &UsageTotals) {
    into.messages += other.messages;
    into.input_tokens = into.input_tokens.saturating_add(other.input_tokens);
    into.output_tokens = into.output_tokens.saturating_add(other.output_tokens);
    into.cache_read_tokens = into
        .cache_read_tokens
        .saturating_add(other.cache_read_tokens);
    into.cache_write_tokens = into
        .cache_write_tokens
        .saturating_add(other.cache_write_tokens);
    into.reasoning_tokens = into.reasoning_tokens.saturating_add(other.reasoning_tokens);
    into.cost_usd += other.cost_usd;
    into.unpriced_messages += other.unpriced_messages;
}

/// Adds up `rows` for `query`. `only_user`: a member's view (only sessions they own).
pub fn group(
    rows: impl IntoIterator<Item = HourRow>,
    query: &UsageQuery,
    only_user: Option<&str>,
) -> TenantUsage {
    let mut groups: std::collections::BTreeMap<(String, Option<String>), UsageTotals> =
        std::collections::BTreeMap::new();
    let mut total = UsageTotals::default();
    for row in rows {
        if row.key.hour < query.from
            || row.key.hour >= query.to
            || only_user.is_some_and(|u| u != row.user)
        {
            continue;
        }
        let key = match query.by {
            GroupBy::Session => (row.key.session.clone(), None),
            GroupBy::User => (row.user.clone(), None),
            GroupBy::Model => (row.key.model.clone(), Some(row.key.provider.clone())),
            GroupBy::Day => {
                let day = crate::civil_time::CivilTime::from_unix(row.key.hour);
                (
                    format!("{:04}-{:02}-{:02}", day.year, day.month, day.day),
                    None,
                )
            }
        };
        add_totals(&mut total, &row.totals);
        add_totals(groups.entry(key).or_default(), &row.totals);
    }
    let mut groups: Vec<UsageGroup> = groups
        .into_iter()
        .map(|((key, provider), totals)| UsageGroup {
            key,
            provider,
            totals,
        })
        .collect();
    // Days in order (a chart of spend over time); anything else costliest first.
    groups.sort_by(|a, b| {
        if query.by == GroupBy::Day {
            return a.key.cmp(&b.key);
        }
        b.totals
            .cost_usd
            .total_cmp(&a.totals.cost_usd)
            .then_with(|| {
                let tokens = |t: &UsageTotals| t.input_tokens + t.output_tokens;
                tokens(&b.totals).cmp(&tokens(&a.totals))
            })
            .then_with(|| a.key.cmp(&b.key))
    });
    let truncated = groups.len() > MAX_GROUPS;
    groups.truncate(MAX_GROUPS);
    TenantUsage {
        from: query.from,
        to: query.to,
        by: query.by,
        total,
        groups,
        truncated,
        mcp: McpCalls::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AssistantMessage, Compaction, CompactionReason};

    fn usage(input: u64, cost: Option<f64>) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: 1,
            total_tokens: input + 1,
            cost_usd: cost,
            ..Usage::default()
        }
    }

    fn record(cursor: u64, at: i64, model: &str, input: u64) -> UsageRecord {
        UsageRecord {
            cursor,
            at,
            provider: "p".into(),
            model: model.into(),
            usage: usage(input, Some(input as f64 / 1000.0)),
        }
    }

    #[test]
    fn records_are_the_requests_with_usage() {
        let entry = |cursor: u64, payload: EntryPayload| Entry {
            cursor,
            id: format!("e{cursor}"),
            created_at: cursor as i64 * 10,
            payload,
        };
        let reply = |u: Option<Usage>| EntryPayload::Message {
            message: Message::Assistant(AssistantMessage {
                provider: "p".into(),
                model: "m".into(),
                usage: u,
                ..Default::default()
            }),
        };
        let entries = vec![
            entry(1, reply(Some(usage(5, None)))),
            entry(2, reply(None)),
            entry(
                3,
                EntryPayload::Compaction(Compaction {
                    summary: "s".into(),
                    first_kept_cursor: 1,
                    kept_cursors: vec![],
                    tokens_before: 0,
                    reason: CompactionReason::Auto,
                    instructions: None,
                    provider: "p".into(),
                    model: "m2".into(),
                    usage: Some(usage(7, Some(0.5))),
                }),
            ),
            entry(
                4,
                EntryPayload::Custom {
                    custom_type: "x".into(),
                    data: serde_json::Value::Null,
                },
            ),
        ];
        let got: Vec<(u64, i64, String)> = records(&entries)
            .into_iter()
            .map(|r| (r.cursor, r.at, r.model))
            .collect();
        assert_eq!(got, [(1, 10, "m".into()), (3, 30, "m2".into())]);
    }

    #[test]
    fn mcp_records_are_the_calls_and_the_error_results() {
        use crate::wire::{ContentBlock, ToolCall, ToolResult};
        let entry = |cursor: u64, payload: EntryPayload| Entry {
            cursor,
            id: format!("e{cursor}"),
            created_at: cursor as i64 * 10,
            payload,
        };
        let call = |name: &str, server: serde_json::Value| {
            ContentBlock::ToolCall(ToolCall {
                id: format!("c-{name}"),
                name: name.into(),
                arguments: serde_json::json!({"server": server, "tool": "t"}),
            })
        };
        let result = |name: &str, is_error: bool| EntryPayload::Message {
            message: Message::ToolResult(ToolResult {
                tool_call_id: "c".into(),
                tool_name: name.into(),
                content: "x".into(),
                is_error,
                blobs: vec![],
            }),
        };
        let entries = vec![
            entry(
                1,
                EntryPayload::Message {
                    message: Message::Assistant(AssistantMessage {
                        content: vec![
                            call("mcp_call", "github".into()),
                            call("bash", "github".into()),
                            call("mcp_call", "api/every".into()),
                            call("mcp_call", serde_json::Value::Null),
                        ],
                        ..Default::default()
                    }),
                },
            ),
            entry(2, result("mcp_call", false)),
            entry(3, result("mcp_call", true)),
            entry(4, result("bash", true)),
        ];
        let got: Vec<(u64, String, bool)> = mcp_records(&entries)
            .into_iter()
            .map(|r| (r.cursor, r.server, r.error))
            .collect();
        assert_eq!(
            got,
            [
                (1, "github".into(), false),
                (1, "api/every".into(), false),
                (1, String::new(), false),
                (3, String::new(), true),
            ]
        );
    }

    #[test]
    fn mcp_rows_count_once_and_group_by_server_for_the_viewer() {
        let mcp = |cursor: u64, at: i64, server: &str, error: bool| McpRecord {
            cursor,
            at,
            server: server.into(),
            error,
        };
        let report = UsageReport {
            session: "s".into(),
            user: "ana".into(),
            through: 9,
            records: vec![],
            mcp: vec![
                mcp(2, 10, "github", false),
                mcp(2, 10, "github", false),
                mcp(4, 20, "", true),
                mcp(6, 3700, "docs", false),
            ],
        };
        let counts = |rows: &[(McpHourKey, McpCounts)]| -> Vec<(i64, String, u64, u64)> {
            rows.iter()
                .map(|(k, c)| (k.hour, k.server.clone(), c.calls, c.errors))
                .collect()
        };
        assert_eq!(
            counts(&apply_mcp(0, &report)),
            [
                (0, "github".into(), 2, 0),
                (0, String::new(), 0, 1),
                (3600, "docs".into(), 1, 0)
            ]
        );
        // What was counted is not counted again.
        assert_eq!(
            counts(&apply_mcp(4, &report)),
            [(3600, "docs".into(), 1, 0)]
        );
        assert!(apply_mcp(9, &report).is_empty());

        let row = |hour: i64, user: &str, server: &str, calls: u64, errors: u64| McpHourRow {
            key: McpHourKey {
                hour,
                session: format!("s-{user}"),
                server: server.into(),
            },
            user: user.into(),
            counts: McpCounts { calls, errors },
        };
        let rows = vec![
            row(0, "ana", "github", 2, 0),
            row(0, "ana", "", 0, 1),
            row(0, "bo", "docs", 5, 0),
            row(7200, "ana", "github", 1, 0),
        ];
        let query = UsageQuery::parse(Some("0"), Some("3600"), None, 0).unwrap();
        let admin = group_mcp(rows.clone(), &query, None);
        assert_eq!((admin.calls, admin.errors), (7, 1));
        assert_eq!(
            admin.by_server,
            [
                McpServerCalls {
                    server: "docs".into(),
                    calls: 5
                },
                McpServerCalls {
                    server: "github".into(),
                    calls: 2
                }
            ]
        );
        let ana = group_mcp(rows, &query, Some("ana"));
        assert_eq!((ana.calls, ana.errors), (2, 1));
        assert_eq!(ana.by_server.len(), 1);
    }

    #[test]
    fn a_report_counts_once_per_hour_session_and_model() {
        let report = UsageReport {
            session: "s".into(),
            user: "ana".into(),
            through: 9,
            records: vec![
                record(2, 3599, "a", 10),
                record(4, 3600, "a", 20),
                record(5, 3700, "a", 30),
                record(7, 3700, "b", 40),
            ],
            mcp: vec![],
        };
        // (stored cursor, new cursor, rows as (hour, model, messages, input))
        type Row<'a> = (i64, &'a str, u64, u64);
        let cases: Vec<(u64, u64, Vec<Row>)> = vec![
            (
                0,
                9,
                vec![(0, "a", 1, 10), (3600, "a", 2, 50), (3600, "b", 1, 40)],
            ),
            (4, 9, vec![(3600, "a", 1, 30), (3600, "b", 1, 40)]),
            // Sent again after it was applied: nothing more.
            (9, 9, vec![]),
            // An older report never moves the cursor back.
            (12, 12, vec![]),
        ];
        for (stored, through, want) in cases {
            let (new, rows) = apply_report(stored, &report);
            assert_eq!(new, through, "stored {stored}");
            let got: Vec<(i64, &str, u64, u64)> = rows
                .iter()
                .map(|(k, t)| (k.hour, k.model.as_str(), t.messages, t.input_tokens))
                .collect();
            assert_eq!(got, want, "stored {stored}");
        }
    }

    fn row(hour: i64, session: &str, user: &str, model: &str, input: u64) -> HourRow {
        let mut totals = UsageTotals::default();
        totals.add(&usage(input, Some(input as f64)));
        HourRow {
            key: HourKey {
                hour,
                session: session.into(),
                provider: "p".into(),
                model: model.into(),
            },
            user: user.into(),
            totals,
        }
    }

    #[test]
    fn queries_add_up_the_hours_in_range_by_session_user_or_model() {
        let rows = vec![
            row(0, "s1", "ana", "a", 1),
            row(3600, "s1", "ana", "b", 10),
            row(3600, "s2", "bob", "a", 100),
            row(7200, "s3", "ana", "a", 1000),
        ];
        // (from, to, by, viewer, groups as (key, input))
        type Case<'a> = (i64, i64, GroupBy, Option<&'a str>, Vec<(&'a str, u64)>);
        let cases: Vec<Case> = vec![
            (
                0,
                10_800,
                GroupBy::Model,
                None,
                vec![("a", 1101), ("b", 10)],
            ),
            (
                0,
                10_800,
                GroupBy::Session,
                None,
                vec![("s3", 1000), ("s2", 100), ("s1", 11)],
            ),
            (
                0,
                10_800,
                GroupBy::User,
                None,
                vec![("ana", 1011), ("bob", 100)],
            ),
            (
                3600,
                7200,
                GroupBy::User,
                None,
                vec![("bob", 100), ("ana", 10)],
            ),
            (0, 10_800, GroupBy::User, Some("bob"), vec![("bob", 100)]),
            (
                0,
                10_800,
                GroupBy::Session,
                Some("ana"),
                vec![("s3", 1000), ("s1", 11)],
            ),
            (1, 3600, GroupBy::Model, None, vec![]),
        ];
        for (from, to, by, viewer, want) in cases {
            let query = UsageQuery { from, to, by };
            let answer = group(rows.clone(), &query, viewer);
            let got: Vec<(&str, u64)> = answer
                .groups
                .iter()
                .map(|g| (g.key.as_str(), g.totals.input_tokens))
                .collect();
            assert_eq!(got, want, "{from}..{to} by {by:?} as {viewer:?}");
            let sum: u64 = want.iter().map(|(_, n)| n).sum();
            assert_eq!(answer.total.input_tokens, sum);
            assert!(!answer.truncated);
        }
        let many: Vec<HourRow> = (0..MAX_GROUPS + 3)
            .map(|i| row(0, &format!("s{i}"), "ana", "a", 1))
            .collect();
        let answer = group(
            many,
            &UsageQuery {
                from: 0,
                to: 1,
                by: GroupBy::Session,
            },
            None,
        );
        assert!(answer.truncated);
        assert_eq!(answer.groups.len(), MAX_GROUPS);
        assert_eq!(answer.total.messages, MAX_GROUPS as u64 + 3);
    }

    #[test]
    fn a_session_asks_for_the_budget_unless_its_last_answer_has_no_limit_reached() {
        let state = |budget: Option<Budget>, tokens: u64| TenantBudget {
            budget,
            spent: Spent { tokens, usd: 0.0 },
        };
        let tokens = |max: u64| {
            Some(Budget {
                max_tokens: Some(max),
                max_usd: None,
            })
        };
        let now = 1_000_000;
        let fresh = now - BUDGET_ANSWER_FRESH_MS;
        // (last answer, when it came, must ask)
        let table = [
            (None, now, true),
            (Some(state(None, 0)), now, false),
            (Some(state(None, 1_000_000)), now, false),
            (Some(state(None, 0)), fresh, false),
            (Some(state(None, 0)), fresh - 1, true),
            (Some(state(tokens(100), 99)), now, false),
            (Some(state(tokens(100), 99)), fresh - 1, true),
            (Some(state(tokens(100), 100)), now, true),
            (Some(state(tokens(100), 101)), now, true),
            (Some(state(tokens(0), 0)), now, true),
            // A clock that went back does not make an answer stale.
            (Some(state(None, 0)), now + 5, false),
        ];
        for (last, at, want) in table {
            assert_eq!(
                must_ask_budget(last.as_ref().map(|s| (s, at)), now),
                want,
                "{last:?} at {at}"
            );
        }
    }

    #[test]
    fn a_step_skips_the_report_only_for_a_fresh_unlimited_answer_asked_while_held() {
        let known = |budget: Option<Budget>, at: u64, asked_while_held: Option<u64>| KnownBudget {
            state: TenantBudget {
                budget,
                spent: Spent {
                    tokens: 5_000,
                    usd: 0.0,
                },
            },
            at,
            asked_while_held,
        };
        let far = Some(Budget {
            max_tokens: Some(1_000_000),
            max_usd: None,
        });
        let now = 1_000_000;
        let fresh = now - BUDGET_ANSWER_FRESH_MS;
        // (what the session knows, its hold now, may skip)
        let table = [
            (None, Some(3), false),
            (Some(known(None, now, Some(3))), Some(3), true),
            (Some(known(None, fresh, Some(3))), Some(3), true),
            // Stale: asked again, as `must_ask_budget` says.
            (Some(known(None, fresh - 1, Some(3))), Some(3), false),
            // Asked before the index held the session: a budget set meanwhile was not told.
            (Some(known(None, now, None)), Some(3), false),
            // A forget came since (a settings change, a budget set, the holders' bound).
            (Some(known(None, now, Some(2))), Some(3), false),
            (Some(known(None, now, Some(3))), None, false),
            // Any limit, however far: every request is reported before the next.
            (Some(known(far, now, Some(3))), Some(3), false),
            // A clock that went back does not make an answer stale.
            (Some(known(None, now + 5, Some(3))), Some(3), true),
        ];
        for (known, held_now, want) in table {
            assert_eq!(
                unlimited_and_told(known.as_ref(), held_now, now),
                want,
                "{known:?} held {held_now:?}"
            );
            assert_eq!(
                usage_report_delay_ms(known.as_ref(), held_now, now),
                if want { USAGE_REPORT_DELAY_MS } else { 0 },
                "{known:?} held {held_now:?}"
            );
        }
    }

    #[test]
    fn the_tenant_budget_adds_up_reports_and_is_reached_at_its_limit() {
        let report = UsageReport {
            session: "s".into(),
            user: "ana".into(),
            through: 3,
            records: vec![record(1, 0, "a", 10), record(3, 7200, "b", 20)],
            mcp: vec![],
        };
        // (budget, exceeded after the report)
        let cases = [
            (None, None),
            (Some((Some(33), None)), None),
            (Some((Some(32), None)), Some("tokens")),
            (Some((None, Some(0.03))), Some("usd")),
            (Some((None, Some(0.031))), None),
        ];
        for (budget, want) in cases {
            let mut state = TenantBudget {
                budget: budget.map(|(max_tokens, max_usd)| Budget {
                    max_tokens,
                    max_usd,
                }),
                ..TenantBudget::default()
            };
            assert_eq!(state.exceeded(), None, "{budget:?} before");
            let (_, rows) = apply_report(0, &report);
            state.add(&rows);
            // Input plus output of both requests; their cost.
            assert_eq!(state.spent.tokens, 32);
            assert!((state.spent.usd - 0.03).abs() < 1e-9);
            assert_eq!(state.exceeded(), want, "{budget:?}");
        }
    }

    #[test]
    fn queries_are_parsed_with_defaults_and_refused_when_wrong() {
        let now = 10_000;
        let ok = |from, to, by| UsageQuery::parse(from, to, by, now);
        assert_eq!(
            ok(None, None, None),
            Ok(UsageQuery {
                from: 0,
                to: now + HOUR_SECONDS,
                by: GroupBy::Model
            })
        );
        assert_eq!(
            ok(Some("5"), Some("9"), Some("user")).map(|q| q.by),
            Ok(GroupBy::User)
        );
        for (from, to, by) in [
            (Some("x"), None, None),
            (Some("-1"), None, None),
            (Some("9"), Some("5"), None),
            (Some("5"), Some("5"), None),
            (None, None, Some("tenant")),
        ] {
            assert!(ok(from, to, by).is_err(), "{from:?} {to:?} {by:?}");
        }
    }

    #[test]
    fn by_day_adds_the_hours_of_each_utc_day_oldest_first() {
        let row = |hour: i64, session: &str, input: u64| HourRow {
            key: HourKey {
                hour,
                session: session.into(),
                provider: "p".into(),
                model: "m".into(),
            },
            user: "ana".into(),
            totals: {
                let mut t = UsageTotals::default();
                t.add(&usage(input, Some(input as f64 / 1000.0)));
                t
            },
        };
        const DAY: i64 = 86_400;
        // 2026-11-28 23:00, 2026-11-29 00:00 and 13:00, and 2026-11-27 00:00, costlier.
        let base = 1_795_910_400; // 2026-11-29T00:00:00Z
        let rows = vec![
            row(base - HOUR_SECONDS, "a", 10),
            row(base, "a", 20),
            row(base + 13 * HOUR_SECONDS, "b", 30),
            row(base - 2 * DAY, "a", 500),
        ];
        let query = UsageQuery::parse(Some("0"), None, Some("day"), base + DAY).unwrap();
        let usage = group(rows, &query, None);
        let got: Vec<(String, u64)> = usage
            .groups
            .iter()
            .map(|g| (g.key.clone(), g.totals.input_tokens))
            .collect();
        assert_eq!(
            got,
            [
                ("2026-11-27".into(), 500),
                ("2026-11-28".into(), 10),
                ("2026-11-29".into(), 50)
            ]
        );
        assert_eq!(usage.total.input_tokens, 560);
    }
}
