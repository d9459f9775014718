//! The calls a tenant's index (`TenantIndex`, one per tenant) answers: the session list and
//! its tree, the concurrency gate of spawned sessions, usage and budgets, the sessions that
//! keep a reading of the tenant's settings, and the sweep of expired request logs.

use serde::{Deserialize, Serialize};

use super::{
    CallError, Empty, Method, Target, call, call_enum, decode_body, query_text, query_u64,
};
use crate::authority::ToolReaders;
use crate::deletion::TreeRow;
use crate::orchestration::Slot;
use crate::secrets::{PutSecretRequest, SealedSecret, SecretInfo, SecretList, SecretScope};
use crate::tenant_usage::{ReportAnswer, TenantBudget, TenantUsage, UsageReport};
use crate::wire::{Budget, ListSessionsResponse, SessionInfo};

/// The tenant's index.
#[derive(Debug)]
pub struct Index;

impl Target for Index {
    const HOST: &'static str = "index";
}

/// Largest page of `GET /v1/sessions`.
pub const MAX_LIST_LIMIT: u32 = 200;

/// A session's row is refreshed (never a deleted one's), or a new session is recorded.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Upsert {
    /// The session as it is now.
    pub info: SessionInfo,
    /// A new session (a deleted id made again, for a chat thread, is listed again).
    pub created: bool,
}
call!(Upsert => Index, "upsert", Empty);

/// A deleted session leaves the list, for good.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Remove {
    /// The session.
    pub id: String,
}
call!(Remove => Index, "remove", Empty);

/// The listed children and forks of the tenant, for the forks rule of a deletion.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Tree;
call!(Tree => Index, "tree", Vec<TreeRow>);

/// `GET /v1/sessions`: the sessions the caller may see, newest first.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct List {
    /// At most this many (1 to [`MAX_LIST_LIMIT`]).
    pub limit: u32,
    /// Older than this session.
    pub before: Option<String>,
    /// Only children of this session.
    pub parent_id: Option<String>,
    /// A session's tools list for these readers (what every person the turn acts for may
    /// see); `None`: the caller's identity decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readers: Option<ToolReaders>,
}
call!(List => Index, "list", ListSessionsResponse);

/// Asks the gate for a slot for a spawned session.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GateRequest(pub Slot);
call!(GateRequest => Index, "gate_request", GateAnswer);

/// Frees a child's slot (or its place in line); answers the spawns granted in its stead.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GateRelease {
    /// The child.
    pub child: String,
    /// Frees the slot only when it was granted before this time (unix ms): a child's outbox
    /// releases the slot it held when it settled, never one granted to it again since
    /// (`wuhu_core::lifecycle`). `None`: whenever it was granted (a deletion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_before: Option<u64>,
}
call!(GateRelease => Index, "gate_release", Vec<Slot>);

/// The gate's answer to [`GateRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "admission", rename_all = "camelCase")]
pub enum GateAnswer {
    /// The child may run now.
    Granted,
    /// The child waits.
    Queued {
        /// Its place in line.
        position: u32,
        /// Which limit it waits for.
        reason: String,
    },
}

/// What a session's requests used; the answer carries the tenant's budget with it counted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReportUsage(pub UsageReport);
call!(ReportUsage => Index, "report_usage", ReportAnswer);

/// A session wrote request logs: the sweep of expired ones runs within a minute.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct LlmLogsWritten;
call!(LlmLogsWritten => Index, "llm_logs_written", Empty);

/// A session asks to be held as keeping a reading of the tenant's settings.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HoldSettings {
    /// The session.
    pub session: String,
}
call!(HoldSettings => Index, "hold_settings", Held);

/// Whether [`HoldSettings`] held the session (`false`: too many holders).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Held.
    pub held: bool,
}

/// A document under `config/` was written: every holder forgets its reading before this
/// answers (`503 unreachable` when some could not be told).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SettingsChanged;
call!(SettingsChanged => Index, "settings_changed", Empty);

/// `GET /v1/budget`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct GetBudget;
call!(GetBudget => Index, "budget", TenantBudget);

/// `PUT /v1/budget` (admins).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PutBudget(pub Budget);
call!(PutBudget => Index, "put_budget", TenantBudget);

/// `GET /v1/usage?from&to&by` (parsed by the index, which knows the time).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct GetUsage {
    /// Unix seconds.
    pub from: Option<String>,
    /// Unix seconds.
    pub to: Option<String>,
    /// `model`, `session`, `user`, …
    pub by: Option<String>,
}
call!(GetUsage => Index, "usage", TenantUsage);

/// `PUT /v1/secrets/:name`: stores a secret, sealed (tenant secrets: admins).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PutSecret {
    /// Its name ([`crate::secrets::check_name`]).
    pub name: String,
    /// The body, checked ([`crate::secrets::check_put`]).
    pub request: PutSecretRequest,
}
call!(PutSecret => Index, "put_secret", SecretInfo);

/// `DELETE /v1/secrets/:name?scope=`: removes a secret (default scope `user`: the caller's).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeleteSecret {
    /// Its name.
    pub name: String,
    /// Whose.
    pub scope: SecretScope,
}
call!(DeleteSecret => Index, "delete_secret", Empty);

/// `GET /v1/secrets`: the names the caller may see, never values.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct ListSecrets;
call!(ListSecrets => Index, "list_secrets", SecretList);

/// The tenant's secrets, sealed, for a session (between actors only): what its calls may
/// use and what it masks.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SealedSecrets;
call!(SealedSecrets => Index, "sealed_secrets", Vec<SealedSecret>);

call_enum! {
    /// Every call a tenant's index answers.
    pub enum IndexCall for Index {
        Upsert(Upsert),
        Remove(Remove),
        Tree(Tree),
        List(List),
        GateRequest(GateRequest),
        GateRelease(GateRelease),
        ReportUsage(ReportUsage),
        LlmLogsWritten(LlmLogsWritten),
        HoldSettings(HoldSettings),
        SettingsChanged(SettingsChanged),
        GetBudget(GetBudget),
        PutBudget(PutBudget),
        GetUsage(GetUsage),
        PutSecret(PutSecret),
        DeleteSecret(DeleteSecret),
        ListSecrets(ListSecrets),
        SealedSecrets(SealedSecrets),
    }
}

/// Decodes the public routes the index answers: `GET /v1/sessions`, `GET|PUT /v1/budget`,
/// `GET /v1/usage`, `GET /v1/secrets`, `PUT|DELETE /v1/secrets/:name` (`route` is the path
/// under `/v1`).
///
/// # Errors
/// A [`CallError`] for an unknown route or method, or input out of its bounds.
pub fn decode_public(
    method: Method,
    route: &[&str],
    query: &[(String, String)],
    body: &[u8],
) -> Result<IndexCall, CallError> {
    Ok(match (route, method) {
        (["sessions"], Method::Get) => {
            let limit = query_u64(query, "limit")?.unwrap_or(50);
            if limit == 0 || limit > u64::from(MAX_LIST_LIMIT) {
                return Err(CallError::BadRequest(format!(
                    "limit must be between 1 and {MAX_LIST_LIMIT}"
                )));
            }
            List {
                limit: limit as u32,
                before: query_text(query, "before"),
                parent_id: query_text(query, "parentId"),
                readers: None,
            }
            .into()
        }
        (["budget"], Method::Get) => GetBudget.into(),
        (["budget"], Method::Put) => {
            let budget: Budget = decode_body(body)?;
            budget.validate().map_err(CallError::BadRequest)?;
            PutBudget(budget).into()
        }
        (["usage"], Method::Get) => GetUsage {
            from: query_text(query, "from"),
            to: query_text(query, "to"),
            by: query_text(query, "by"),
        }
        .into(),
        (["secrets"], Method::Get) => ListSecrets.into(),
        (["secrets", name], method @ (Method::Put | Method::Delete)) => {
            crate::secrets::check_name(name).map_err(CallError::BadRequest)?;
            if method == Method::Put {
                let request: PutSecretRequest = decode_body(body)?;
                crate::secrets::check_put(&request).map_err(CallError::BadRequest)?;
                PutSecret {
                    name: name.to_string(),
                    request,
                }
                .into()
            } else {
                let scope = match query_text(query, "scope") {
                    None => SecretScope::User,
                    Some(text) => SecretScope::parse(&text).ok_or_else(|| {
                        CallError::BadRequest("scope must be tenant or user".into())
                    })?,
                };
                DeleteSecret {
                    name: name.to_string(),
                    scope,
                }
                .into()
            }
        }
        (["sessions" | "budget" | "usage" | "secrets"], _) | (["secrets", _], _) => {
            return Err(CallError::MethodNotAllowed);
        }
        _ => return Err(CallError::UnknownRoute),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(method: Method, route: &str, query: &[(&str, &str)], body: &str) -> String {
        let route: Vec<&str> = route.split('/').collect();
        let query: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match decode_public(method, &route, &query, body.as_bytes()) {
            Ok(IndexCall::List(l)) => format!("list {l:?}"),
            Ok(IndexCall::PutBudget(b)) => format!("put_budget {:?}", b.0),
            Ok(IndexCall::GetUsage(u)) => format!("usage {u:?}"),
            Ok(IndexCall::PutSecret(p)) => format!(
                "put_secret {} {:?} {:?}",
                p.name, p.request.scope, p.request.environments
            ),
            Ok(IndexCall::DeleteSecret(d)) => format!("delete_secret {d:?}"),
            Ok(other) => other.name().to_string(),
            Err(e) => format!("{:?}: {e}", e.status_and_code()),
        }
    }

    #[test]
    fn public_routes() {
        let cases = [
            (
                Method::Get,
                "sessions",
                vec![],
                "",
                "list List { limit: 50, before: None, parent_id: None, readers: None }",
            ),
            (
                Method::Get,
                "sessions",
                vec![("limit", "200"), ("before", "b"), ("parentId", "")],
                "",
                "list List { limit: 200, before: Some(\"b\"), parent_id: None, readers: None }",
            ),
            (
                Method::Get,
                "sessions",
                vec![("limit", "201")],
                "",
                "(400, \"bad_request\"): limit must be between 1 and 200",
            ),
            (
                Method::Get,
                "sessions",
                vec![("limit", "0")],
                "",
                "(400, \"bad_request\"): limit must be between 1 and 200",
            ),
            (Method::Get, "budget", vec![], "", "budget"),
            (
                Method::Put,
                "budget",
                vec![],
                r#"{"maxUsd":5}"#,
                "put_budget Budget { max_tokens: None, max_usd: Some(5.0) }",
            ),
            (
                Method::Put,
                "budget",
                vec![],
                r#"{"maxUsd":-5}"#,
                "(400, \"bad_request\"): budget.maxUsd must be a number of dollars, 0 or more",
            ),
            (
                Method::Post,
                "budget",
                vec![],
                "",
                "(405, \"method_not_allowed\"): method not allowed on this route",
            ),
            (
                Method::Get,
                "usage",
                vec![("by", "user")],
                "",
                "usage GetUsage { from: None, to: None, by: Some(\"user\") }",
            ),
            (
                Method::Delete,
                "usage",
                vec![],
                "",
                "(405, \"method_not_allowed\"): method not allowed on this route",
            ),
            (
                Method::Get,
                "nothing",
                vec![],
                "",
                "(404, \"not_found\"): no such route",
            ),
            (
                Method::Put,
                "sessions",
                vec![],
                "",
                "(405, \"method_not_allowed\"): method not allowed on this route",
            ),
            (Method::Get, "secrets", vec![], "", "list_secrets"),
            (
                Method::Put,
                "secrets/GITHUB_TOKEN",
                vec![],
                r#"{"value":"v","scope":"tenant","environments":["ci"]}"#,
                "put_secret GITHUB_TOKEN Tenant [\"ci\"]",
            ),
            (
                Method::Put,
                "secrets/github_token",
                vec![],
                r#"{"value":"v"}"#,
                "(400, \"bad_request\"): a secret's name is an environment variable name: 1 to 64 of A-Z, 0-9 and _, not starting with a digit (got \"github_token\")",
            ),
            (
                Method::Put,
                "secrets/A",
                vec![],
                r#"{"value":""}"#,
                "(400, \"bad_request\"): value must not be empty",
            ),
            (
                Method::Put,
                "secrets/A",
                vec![],
                r#"{"value":"v","extra":1}"#,
                "(400, \"bad_request\"): invalid json body: unknown field `extra`, expected one of `value`, `scope`, `hosts`, `environments` at line 1 column 20",
            ),
            (
                Method::Delete,
                "secrets/A",
                vec![],
                "",
                "delete_secret DeleteSecret { name: \"A\", scope: User }",
            ),
            (
                Method::Delete,
                "secrets/A",
                vec![("scope", "tenant")],
                "",
                "delete_secret DeleteSecret { name: \"A\", scope: Tenant }",
            ),
            (
                Method::Delete,
                "secrets/A",
                vec![("scope", "everyone")],
                "",
                "(400, \"bad_request\"): scope must be tenant or user",
            ),
            (
                Method::Get,
                "secrets/A",
                vec![],
                "",
                "(405, \"method_not_allowed\"): method not allowed on this route",
            ),
            (
                Method::Post,
                "secrets",
                vec![],
                "",
                "(405, \"method_not_allowed\"): method not allowed on this route",
            ),
        ];
        for (method, route, query, body, want) in cases {
            assert_eq!(
                decode(method, route, &query, body),
                want,
                "{method:?} {route}"
            );
        }
    }
}
