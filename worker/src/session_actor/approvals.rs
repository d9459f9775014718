//! Approvals in the session actor: stored in SQLite (table `approvals`, and
//! `approved_runner_owners` for the grants of `approve_session`: whose machine, for whom, until
//! when), answered through `AnswerApproval`, expired by the alarm, withdrawn by stop.
//!
//! A tool call that must wait ([`wuhu_core::approvals::required_approver`]) asks the
//! [`ActorApprovals`] gate: it stores the approval, appends the `wuhu_approval_request_v1`
//! entry and marks the call as waiting in the checkpoint, all in one synchronous write, then
//! waits on an in-memory channel. The row is the truth; the channel only wakes the task. After a
//! restart the call runs again (the checkpoint says it had not started) and finds its approval
//! by `(step, call id)`: pending → it waits again; answered meanwhile → it goes on.
//!
//! Who must approve, who may answer, expiry and the pending bound are rules in
//! `wuhu_core::approvals`; this file stores and routes.

use std::rc::Rc;

use futures::future::LocalBoxFuture;
use serde::Deserialize;
use serde_json::json;
use worker::{Env, SqlStorage, SqlStorageValue};
use wuhu_core::approvals::{
    self, Answer, AnswerError, Approver, Grant, GrantScope, MAX_GRANTS_PER_SESSION, Outcome,
    REMEMBERED_ENDED, State,
};
use wuhu_core::session::Millis;
use wuhu_core::wire::{AnswerApprovalRequest, AnswerApprovalResponse};
use wuhu_core::wire::{EntryPayload, custom_types};

use super::blob_io::storage_error;
use super::{Actor, now};
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::tool_context::{ApprovalGate, Ask};

type SqlResult<T> = worker::Result<T>;

/// One stored approval.
#[derive(Clone, Debug)]
pub(crate) struct StoredApproval {
    pub(crate) id: String,
    pub(crate) step: u64,
    pub(crate) call_id: String,
    /// Which approval of the call this is (`""`: the call's own action; a spawn with
    /// `inherit` asks one per shared environment, `share:<name>`).
    pub(crate) part: String,
    pub(crate) approver: Approver,
    pub(crate) expires_at: Millis,
    pub(crate) timeout_secs: u64,
    pub(crate) state: State,
    pub(crate) decided_by: Option<String>,
    /// Whom the call acted for when it asked (the request's `requestedBy`): what
    /// `approve_session` may cover.
    pub(crate) requested_by: Vec<String>,
    /// The rule an `always` answer adds to the approver's policy (JSON of
    /// `wuhu_core::policy::RuleDocument`); `None`: `always` is not offered.
    pub(crate) always_rule: Option<String>,
    /// Whether a policy rule asked (decision 0038).
    pub(crate) policy: bool,
}

#[derive(Deserialize)]
struct Row {
    id: String,
    step: f64,
    call_id: String,
    part: String,
    approver: String,
    expires_at: f64,
    timeout_secs: f64,
    state: String,
    decided_by: Option<String>,
    requested_by: String,
    always_rule: Option<String>,
    policy: f64,
}

impl Row {
    fn decode(self) -> Option<StoredApproval> {
        Some(StoredApproval {
            id: self.id,
            step: self.step as u64,
            call_id: self.call_id,
            part: self.part,
            approver: serde_json::from_str(&self.approver).ok()?,
            expires_at: Millis(self.expires_at as u64),
            timeout_secs: self.timeout_secs as u64,
            state: State::parse(&self.state)?,
            decided_by: self.decided_by,
            requested_by: serde_json::from_str(&self.requested_by).ok()?,
            always_rule: self.always_rule,
            policy: self.policy != 0.0,
        })
    }
}

#[derive(Deserialize)]
struct GrantRow {
    runner_owner: String,
    covers: String,
    expires_at: f64,
    scope: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
}

#[derive(Deserialize)]
struct MinRow {
    m: Option<f64>,
}

const COLUMNS: &str = "id, step, call_id, part, approver, expires_at, timeout_secs, state, decided_by, requested_by, always_rule, policy";

/// The approval tables of one session actor. Synchronous, like `Store`: writes between two
/// awaits commit together with the entries and the checkpoint.
pub(crate) struct ApprovalStore {
    sql: SqlStorage,
}

impl ApprovalStore {
    pub(crate) fn open(sql: SqlStorage) -> SqlResult<ApprovalStore> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS approvals (id TEXT PRIMARY KEY, step INTEGER NOT NULL, call_id TEXT NOT NULL, approver TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, timeout_secs INTEGER NOT NULL, state TEXT NOT NULL, decided_by TEXT)",
            None,
        )?;
        // Added with acting-for sets (issue 29): several approvals of one call (a spawn that
        // shares environments). Rows from before are the call's own.
        let columns = sql
            .exec("SELECT * FROM approvals LIMIT 0", None)?
            .column_names();
        if !columns.iter().any(|c| c == "part") {
            sql.exec(
                "ALTER TABLE approvals ADD COLUMN part TEXT NOT NULL DEFAULT ''",
                None,
            )?;
        }
        // Added with scoped `approve_session` (issue 29): whom the call acted for when it
        // asked. A request stored before acted for people unknown: `[]` (nobody), so
        // `approve_session` on it covers only turns for nobody.
        if !columns.iter().any(|c| c == "requested_by") {
            sql.exec(
                "ALTER TABLE approvals ADD COLUMN requested_by TEXT NOT NULL DEFAULT '[]'",
                None,
            )?;
        }
        // Added with the policy engine (decision 0038): the rule an `always` answer adds.
        if !columns.iter().any(|c| c == "always_rule") {
            sql.exec("ALTER TABLE approvals ADD COLUMN always_rule TEXT", None)?;
        }
        if !columns.iter().any(|c| c == "policy") {
            sql.exec(
                "ALTER TABLE approvals ADD COLUMN policy INTEGER NOT NULL DEFAULT 0",
                None,
            )?;
        }
        sql.exec(
            "CREATE INDEX IF NOT EXISTS approvals_by_call ON approvals (step, call_id)",
            None,
        )?;
        migrate_unscoped_grants(&sql)?;
        sql.exec(
            "CREATE TABLE IF NOT EXISTS approved_runner_owners (runner_owner TEXT NOT NULL, covers TEXT NOT NULL, by TEXT NOT NULL, at INTEGER NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (runner_owner, covers))",
            None,
        )?;
        // `approve_session` on a policy's ask (decision 0038): the same shape, another scope.
        sql.exec(
            "CREATE TABLE IF NOT EXISTS policy_grants (runner_owner TEXT NOT NULL, covers TEXT NOT NULL, by TEXT NOT NULL, at INTEGER NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (runner_owner, covers))",
            None,
        )?;
        Ok(ApprovalStore { sql })
    }

    fn select(&self, filter: &str, args: Vec<SqlStorageValue>) -> SqlResult<Vec<StoredApproval>> {
        let query = format!("SELECT {COLUMNS} FROM approvals {filter}");
        let rows: Vec<Row> = self.sql.exec(&query, args)?.to_array()?;
        Ok(rows.into_iter().filter_map(Row::decode).collect())
    }

    pub(crate) fn by_id(&self, id: &str) -> SqlResult<Option<StoredApproval>> {
        Ok(self.select("WHERE id = ?", vec![id.into()])?.pop())
    }

    fn by_call(&self, step: u64, call_id: &str, part: &str) -> SqlResult<Option<StoredApproval>> {
        Ok(self
            .select(
                "WHERE step = ? AND call_id = ? AND part = ? ORDER BY created_at DESC LIMIT 1",
                vec![(step as i64).into(), call_id.into(), part.into()],
            )?
            .pop())
    }

    fn pending(&self) -> SqlResult<Vec<StoredApproval>> {
        self.select("WHERE state = 'pending' ORDER BY expires_at", Vec::new())
    }

    fn insert(&self, approval: &StoredApproval, created_at: Millis) -> SqlResult<()> {
        let approver = serde_json::to_string(&approval.approver)
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        let requested_by = serde_json::to_string(&approval.requested_by)
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.sql.exec(
            &format!("INSERT INTO approvals ({COLUMNS}, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)"),
            vec![
                approval.id.as_str().into(),
                (approval.step as i64).into(),
                approval.call_id.as_str().into(),
                approval.part.as_str().into(),
                approver.into(),
                SqlStorageValue::try_from_i64(approval.expires_at.0 as i64)?,
                (approval.timeout_secs as i64).into(),
                approval.state.as_str().into(),
                requested_by.into(),
                approval
                    .always_rule
                    .as_deref()
                    .map_or(SqlStorageValue::Null, SqlStorageValue::from),
                i64::from(approval.policy).into(),
                SqlStorageValue::try_from_i64(created_at.0 as i64)?,
            ],
        )?;
        Ok(())
    }

    /// Ends an approval and forgets the oldest ended ones beyond [`REMEMBERED_ENDED`].
    fn end(&self, id: &str, state: State, by: Option<&str>) -> SqlResult<()> {
        let by = by.map_or(SqlStorageValue::Null, SqlStorageValue::from);
        self.sql.exec(
            "UPDATE approvals SET state = ?, decided_by = ? WHERE id = ?",
            vec![state.as_str().into(), by, id.into()],
        )?;
        self.sql.exec(
            "DELETE FROM approvals WHERE state != 'pending' AND id NOT IN (SELECT id FROM approvals WHERE state != 'pending' ORDER BY created_at DESC LIMIT ?)",
            vec![(REMEMBERED_ENDED as i64).into()],
        )?;
        Ok(())
    }

    /// When the next pending approval expires.
    pub(crate) fn next_expiry(&self) -> SqlResult<Option<Millis>> {
        let rows: Vec<MinRow> = self
            .sql
            .exec(
                "SELECT MIN(expires_at) AS m FROM approvals WHERE state = 'pending'",
                None,
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| r.m)
            .map(|m| Millis(m as u64)))
    }

    /// The grants that have not expired at `now`.
    pub(crate) fn grants(&self, now: Millis) -> SqlResult<Vec<Grant>> {
        let rows: Vec<GrantRow> = self
            .sql
            .exec(
                "SELECT runner_owner, covers, expires_at, 'machine' AS scope FROM approved_runner_owners WHERE expires_at > ? UNION ALL SELECT runner_owner, covers, expires_at, 'policy' AS scope FROM policy_grants WHERE expires_at > ?",
                vec![
                    SqlStorageValue::try_from_i64(now.0 as i64)?,
                    SqlStorageValue::try_from_i64(now.0 as i64)?,
                ],
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                Some(Grant {
                    scope: GrantScope::parse(&r.scope)?,
                    runner_owner: r.runner_owner,
                    covers: serde_json::from_str(&r.covers).ok()?,
                    expires_at: Millis(r.expires_at as u64),
                })
            })
            .collect())
    }

    /// Stores `grant` (a newer one for the same owner and people replaces the older), drops
    /// the expired ones, and keeps at most [`MAX_GRANTS_PER_SESSION`] (those that end last).
    fn remember_grant(&self, grant: &Grant, by: &str, at: Millis) -> SqlResult<()> {
        let covers = serde_json::to_string(&grant.covers)
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        let table = match grant.scope {
            GrantScope::Machine => "approved_runner_owners",
            GrantScope::Policy => "policy_grants",
        };
        self.sql.exec(
            &format!("INSERT OR REPLACE INTO {table} (runner_owner, covers, by, at, expires_at) VALUES (?, ?, ?, ?, ?)"),
            vec![
                grant.runner_owner.as_str().into(),
                covers.into(),
                by.into(),
                SqlStorageValue::try_from_i64(at.0 as i64)?,
                SqlStorageValue::try_from_i64(grant.expires_at.0 as i64)?,
            ],
        )?;
        self.sql.exec(
            &format!("DELETE FROM {table} WHERE expires_at <= ?"),
            vec![SqlStorageValue::try_from_i64(at.0 as i64)?],
        )?;
        self.sql.exec(
            &format!("DELETE FROM {table} WHERE rowid NOT IN (SELECT rowid FROM {table} ORDER BY expires_at DESC LIMIT ?)"),
            vec![(MAX_GRANTS_PER_SESSION as i64).into()],
        )?;
        Ok(())
    }
}

/// `approved_runner_owners` before scoped grants (issue 29) held one row per runner owner,
/// with no people and no end: an `approve_session` that covered every later prompt forever.
/// Such rows cannot be scoped after the fact (whom the approved request acted for was not
/// kept), so the table is dropped and made anew: those owners are asked again. Every step's
/// error is returned (the approval store is then unavailable and approvals are refused, never
/// granted).
fn migrate_unscoped_grants(sql: &SqlStorage) -> SqlResult<()> {
    let exists: Vec<CountRow> = sql
        .exec(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'approved_runner_owners'",
            None,
        )?
        .to_array()?;
    if exists.first().is_none_or(|r| r.n < 1.0) {
        return Ok(());
    }
    let columns = sql
        .exec("SELECT * FROM approved_runner_owners LIMIT 0", None)?
        .column_names();
    if columns.iter().any(|c| c == "covers") {
        return Ok(());
    }
    let rows: Vec<CountRow> = sql
        .exec("SELECT COUNT(*) AS n FROM approved_runner_owners", None)?
        .to_array()?;
    sql.exec("DROP TABLE approved_runner_owners", None)?;
    worker::console_log!(
        "approvals: dropped {} approve_session grant(s) stored without people or an end; their runner owners are asked again",
        rows.first().map_or(0, |r| r.n as u64)
    );
    Ok(())
}

/// The wait `WUHU_APPROVAL_TIMEOUT_SECONDS` configures; a bad value is logged and the default
/// used, so a typo never leaves calls waiting forever.
fn timeout_secs(env: &Env) -> u64 {
    let var = env
        .var("WUHU_APPROVAL_TIMEOUT_SECONDS")
        .ok()
        .map(|v| v.to_string());
    approvals::timeout_secs(var.as_deref()).unwrap_or_else(|message| {
        worker::console_error!("{message}; using {}", approvals::DEFAULT_TIMEOUT_SECS);
        approvals::DEFAULT_TIMEOUT_SECS
    })
}

/// How long `approve_session` lasts (`WUHU_APPROVE_SESSION_SECONDS`); a bad value is logged
/// and the default used.
fn grant_secs(env: &Env) -> u64 {
    let var = env
        .var("WUHU_APPROVE_SESSION_SECONDS")
        .ok()
        .map(|v| v.to_string());
    approvals::grant_secs(var.as_deref()).unwrap_or_else(|message| {
        worker::console_error!("{message}; using {}", approvals::DEFAULT_GRANT_SECS);
        approvals::DEFAULT_GRANT_SECS
    })
}

/// The approval gate a tool call gets: it stores the request and waits for its ending.
pub(crate) struct ActorApprovals {
    pub(crate) actor: Rc<Actor>,
    pub(crate) step: u64,
    /// The tool call the gate serves: its approvals show in the transcript with it and mark it
    /// as waiting.
    pub(crate) call_id: String,
}

impl ApprovalGate for ActorApprovals {
    fn grants(&self) -> Vec<Grant> {
        // Unreadable grants grant nothing: the owner is asked.
        self.actor
            .approval_store()
            .and_then(|s| Ok(s.grants(now())?))
            .unwrap_or_default()
    }

    fn request(&self, part: &str, ask: Ask<'_>) -> LocalBoxFuture<'static, Outcome> {
        let call_id = self.call_id.as_str();
        let ready = |outcome: Outcome| -> LocalBoxFuture<'static, Outcome> {
            Box::pin(futures::future::ready(outcome))
        };
        let actor = &self.actor;
        let store = match actor.approval_store() {
            Ok(store) => store,
            Err(e) => {
                return ready(Outcome::Refused(format!(
                    "Approvals are unavailable: {}",
                    e.message
                )));
            }
        };
        // A call that runs again after a restart waits for the approval it asked for before.
        match store.by_call(self.step, call_id, part) {
            Ok(Some(existing)) if existing.approver == ask.approver => {
                return match Outcome::of_state(
                    existing.state,
                    existing.decided_by.as_deref(),
                    existing.timeout_secs,
                ) {
                    Some(outcome) => ready(outcome),
                    None => actor.wait_for_approval(&existing.id),
                };
            }
            // Whoever must approve changed (the environment resolved elsewhere): ask anew.
            Ok(Some(existing)) if existing.state == State::Pending => {
                end_or_log(actor, &existing, State::Withdrawn, None, "withdrawn");
            }
            Ok(_) => {}
            Err(e) => return ready(Outcome::Refused(format!("Approvals are unavailable: {e}"))),
        }
        let pending = store.pending().map(|p| p.len()).unwrap_or(usize::MAX);
        if let Err(message) = approvals::admit(pending, &ask.action) {
            return ready(Outcome::Refused(message));
        }
        let timeout = timeout_secs(&actor.env);
        let created = now();
        let approval = StoredApproval {
            id: uuid::Uuid::new_v4().to_string(),
            step: self.step,
            call_id: call_id.to_string(),
            part: part.to_string(),
            approver: ask.approver.clone(),
            expires_at: approvals::expires_at(created, timeout),
            timeout_secs: timeout,
            state: State::Pending,
            decided_by: None,
            requested_by: ask.turn_authors.to_vec(),
            always_rule: ask
                .always
                .as_ref()
                .and_then(|rule| serde_json::to_string(rule).ok()),
            policy: ask.policy,
        };
        let answer_path = format!(
            "/v1/sessions/{}/approvals/{}",
            actor.session_id(),
            approval.id
        );
        let turn_authors = approval.requested_by.clone();
        let mut data = ask.data;
        data["approvalId"] = json!(approval.id);
        data["toolCallId"] = json!(call_id);
        if let Some(target) = &ask.target {
            data["runner"] = json!(target.runner);
            data["runnerOwner"] = json!(target.runner_owner);
            data["runnerKind"] = json!(target.runner_kind.as_str());
        }
        data["approver"] = json!(ask.approver);
        data["requestedBy"] = json!(turn_authors);
        // Whether "approve for this session" may answer it (not for a guest); it would last
        // this long and cover these people.
        let offered = matches!(ask.approver, Approver::RunnerOwner(_)) || ask.policy;
        data["sessionApproval"] = if offered && approvals::session_approval_offered(&turn_authors) {
            json!({"covers": turn_authors, "seconds": grant_secs(&actor.env)})
        } else {
            serde_json::Value::Null
        };
        // The rule "always" would add to the approver's policy (`null`: not offered).
        data["always"] = json!(ask.always);
        data["expiresAt"] = json!(approval.expires_at.unix_seconds());
        // What people read (the web app's card, `wuhu chat`, chat channels); `text` is the
        // model's, with how to answer through the API.
        data["summary"] = json!(approvals::people_text(
            &ask.action,
            ask.target.as_ref(),
            &turn_authors
        ));
        data["text"] = json!(approvals::request_text(
            &ask.action,
            ask.target.as_ref(),
            &ask.approver,
            &turn_authors,
            &answer_path,
            timeout,
            grant_secs(&actor.env),
        ));
        if let Err(e) = store.insert(&approval, created) {
            return ready(Outcome::Refused(format!(
                "Storing the approval failed: {e}"
            )));
        }
        let entry = EntryPayload::Custom {
            custom_type: custom_types::APPROVAL_REQUESTED.into(),
            data,
        };
        actor.with_session(|s| {
            s.handle_tool_progress(created, self.step, call_id, vec![entry]);
            s.handle_tool_awaiting_approval(self.step, call_id, true);
        });
        actor.pump();
        actor.arm_alarm_by(approval.expires_at);
        actor.wait_for_approval(&approval.id)
    }
}

/// Ends `approval` in `state`: stores it, shows the `wuhu_approval_decision_v1` entry, takes the
/// call's waiting mark off and wakes the call. The caller pumps.
/// Ends `approval` in `state`: stores it, records the decision in the transcript and wakes
/// the waiting call. A failed write is returned (the route answers `storage_failed`; the
/// alarm and stop paths log it), and then nothing else happens: the approval stays pending.
fn end(
    actor: &Rc<Actor>,
    approval: &StoredApproval,
    state: State,
    by: Option<&str>,
    decision: &str,
) -> ApiResult<()> {
    let store = actor.approval_store()?;
    store.end(&approval.id, state, by).map_err(|e| {
        storage_error(format!(
            "storing the end of approval {} failed: {e}",
            approval.id
        ))
    })?;
    let entry = EntryPayload::Custom {
        custom_type: custom_types::APPROVAL_DECIDED.into(),
        data: json!({"approvalId": approval.id, "decision": decision, "by": by}),
    };
    actor.with_session(|s| {
        s.handle_tool_progress(now(), approval.step, &approval.call_id, vec![entry]);
        s.handle_tool_awaiting_approval(approval.step, &approval.call_id, false);
    });
    if let Some(outcome) = Outcome::of_state(state, by, approval.timeout_secs) {
        actor.wake_approval(&approval.id, outcome);
    }
    Ok(())
}

/// [`end`] where there is no caller to answer (the alarm, stop, a replaced request).
fn end_or_log(
    actor: &Rc<Actor>,
    approval: &StoredApproval,
    state: State,
    by: Option<&str>,
    decision: &str,
) {
    if let Err(e) = end(actor, approval, state, by, decision) {
        worker::console_error!("{}", e.message);
    }
}

/// `AnswerApproval` (`POST /v1/sessions/:id/approvals/:approvalId`): `identity` answers the
/// approval `id`. Answers 200 only once the
/// decision and its transcript entry are committed.
pub(crate) async fn answer_route(
    actor: &Rc<Actor>,
    identity: &Identity,
    id: &str,
    body: &AnswerApprovalRequest,
) -> ApiResult<AnswerApprovalResponse> {
    let answer = body.decision;
    let store = actor.approval_store()?;
    let approval = store
        .by_id(id)?
        .ok_or_else(|| ApiError::not_found("no approval with this id in this session"))?;
    let t = now();
    let refuse = |e: AnswerError| {
        let (status, code) = e.status_and_code();
        ApiError::new(status, code, e.to_string())
    };
    let asked = approvals::Asked {
        approver: &approval.approver,
        state: approval.state,
        expires_at: approval.expires_at,
        requested_by: &approval.requested_by,
        always_offered: approval.always_rule.is_some(),
        policy_ask: approval.policy,
    };
    let state = match approvals::answer(&identity.principal(), &asked, t, answer) {
        Ok(state) => state,
        Err(AnswerError::Expired) if approval.state == State::Pending => {
            // Answered after the deadline, before the alarm: expire it now.
            end(actor, &approval, State::Expired, None, "expired")?;
            actor.pump().wait().await?;
            return Err(refuse(AnswerError::Expired));
        }
        Err(e) => return Err(refuse(e)),
    };
    let running = actor
        .with_loaded(|l| l.session.is_tool_running(approval.step, &approval.call_id))
        .unwrap_or(false);
    if !running {
        end(actor, &approval, State::Withdrawn, None, "withdrawn")?;
        actor.pump().wait().await?;
        return Err(refuse(AnswerError::Withdrawn));
    }
    if let (Answer::Always, Some(rule)) = (answer, &approval.always_rule) {
        // The rule is stored before the approval ends: when storing fails, nothing changed and
        // the person may answer again.
        add_always_rule(actor, identity, &approval.approver, rule).await?;
    }
    let by = identity.sub.as_str();
    end(actor, &approval, state, Some(by), answer.as_str())?;
    for grant in approvals::session_grants(
        &approval.approver,
        answer,
        &approval.requested_by,
        approval.policy,
        t,
        grant_secs(&actor.env),
    ) {
        store.remember_grant(&grant, by, t)?;
        // The approver's other pending approvals in this session that it covers are approved
        // with it (those for other people still wait).
        for other in store.pending()? {
            if approvals::covered_by(
                &other.approver,
                &other.requested_by,
                other.policy,
                &grant,
                t,
            ) {
                end(actor, &other, State::Approved, Some(by), answer.as_str())?;
            }
        }
    }
    actor.pump().wait().await?;
    Ok(AnswerApprovalResponse {
        approval_id: approval.id.clone(),
        decision: answer,
    })
}

/// Adds `rule` (an `always` answer's) first to the approver's own policy, as `identity` (the
/// approver or an admin, who may both write it). The write tells the sessions that keep a
/// reading of the settings, this one included, so the next call meets the rule.
async fn add_always_rule(
    actor: &Rc<Actor>,
    identity: &Identity,
    approver: &Approver,
    rule: &str,
) -> ApiResult<()> {
    let (Approver::RunnerOwner(sub) | Approver::SessionOwner(sub)) = approver;
    let rule: wuhu_core::policy::RuleDocument = serde_json::from_str(rule)
        .map_err(|e| ApiError::internal(format!("the stored rule is unreadable: {e}")))?;
    let path = wuhu_core::policy::user_policy_path(sub);
    let tenant = actor.tenant();
    let current = crate::workspace_io::read(&actor.env, &tenant, &path).await?;
    let text = wuhu_core::policy::add_rule_first(
        &path,
        current.as_ref().map(|d| d.content.as_str()),
        rule,
    )
    .map_err(|e| ApiError::new(409, "invalid_policy", e.to_string()))?;
    let principal = identity.principal();
    let writer = wuhu_core::authority::WorkspaceWriter::Person(&principal);
    crate::workspace_io::write(&actor.env, &tenant, &writer, &path, &text).await?;
    Ok(())
}

/// Expires the pending approvals whose time has come (the alarm calls this).
pub(crate) fn expire_due(actor: &Rc<Actor>) {
    let Ok(store) = actor.approval_store() else {
        return;
    };
    let t = now();
    let due: Vec<StoredApproval> = store
        .pending()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| approvals::is_due(a.state, a.expires_at, t))
        .collect();
    for approval in &due {
        end_or_log(actor, approval, State::Expired, None, "expired");
    }
    if !due.is_empty() {
        actor.pump();
    }
}

/// Withdraws every pending approval (the session is being stopped). The caller pumps.
pub(crate) fn withdraw_pending(actor: &Rc<Actor>) {
    let Ok(store) = actor.approval_store() else {
        return;
    };
    for approval in store.pending().unwrap_or_default() {
        end_or_log(actor, &approval, State::Withdrawn, None, "withdrawn");
    }
}

impl Actor {
    pub(crate) fn approval_store(&self) -> ApiResult<&ApprovalStore> {
        self.approvals
            .approval_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("approval storage unavailable: {e}")))
    }

    /// A future that ends when approval `id` ends (see [`Actor::wake_approval`]). A dropped
    /// waiter (the actor went away) counts as withdrawn: the call is rerun after a restart.
    pub(crate) fn wait_for_approval(&self, id: &str) -> LocalBoxFuture<'static, Outcome> {
        let (wake, ended) = futures::channel::oneshot::channel();
        self.approvals
            .approval_waiters
            .borrow_mut()
            .insert(id.to_string(), wake);
        Box::pin(async move { ended.await.unwrap_or(Outcome::Withdrawn) })
    }

    /// Wakes the call waiting for approval `id`, if any.
    pub(crate) fn wake_approval(&self, id: &str, outcome: Outcome) {
        if let Some(wake) = self.approvals.approval_waiters.borrow_mut().remove(id) {
            let _ = wake.send(outcome);
        }
    }
}
