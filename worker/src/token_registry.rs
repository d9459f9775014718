//! `TokenRegistry`: one Durable Object per tenant holding its registered credentials (tokens
//! minted by `POST /v1/tokens`, browser cookie sessions), one SQLite row per `jti`, each with
//! the `jti` of the credential it was made from (`parent`) and its lineage's root.
//!
//! A JWT with a `jti` is accepted only while its row exists (`wuhu_core::tokens::lineage::standing`,
//! which also re-checks a credential resting on a Cloudflare Access identity against the Access
//! settings), so revoking is deleting rows, and the next request anywhere is refused: every
//! such request asks `Check`, a primary-key lookup in this object's SQLite. Revoking deletes
//! the credential's whole tree (`lineage::revocation_set`); `RevokeAll` every tree of a user.
//! Registering a child adopts its parent's root and expiry, and is refused once the parent is
//! gone (`lineage::adopt`). Tokens without `jti` (operator tokens) never come here. See
//! `docs/decisions/0007-token-registry-and-revocation.md` and `0032-token-lineage.md`.
//!
//! What is already open is cut too: revoking runner tokens tells the tenant's runner hub,
//! which closes the sockets that connected with them (`Revoked` on the hub); follow streams
//! and session sockets opened with a revocable credential ask `Check` again every
//! `wuhu_core::follow::CREDENTIAL_RECHECK_MS` and end when it is gone.
//!
//! Its calls are `wuhu_core::calls::tokens::TokensCall` (identity in `x-wuhu-*` headers, set by
//! the router from a verified credential).

use serde::Deserialize;
use worker::{DurableObject, Env, Request, Response, SqlStorage, State, durable_object};
use wuhu_core::authority::Role;
use wuhu_core::calls::hub::Revoked;
use wuhu_core::calls::tokens::{Check, List, Live, Register, Revoke, RevokeAll, TokensCall};
use wuhu_core::tokens::lineage::{self, Node, Revocation, Standing};
use wuhu_core::tokens::{
    CredentialRecord, MintError, may_manage_tokens, may_register, sessions_to_evict,
};
use wuhu_core::wire::{
    CredentialKind, LineageRoot, ListTokensResponse, RevokeAllResponse, RevokeTokenResponse,
};

use crate::http::{ApiError, ApiResult};
use crate::identity::{Identity, now_secs};
use crate::internal::{self, reply};
use crate::schema::{Migration, migrate};

#[durable_object]
pub struct TokenRegistry {
    sql: SqlStorage,
    env: Env,
    /// Whether the schema migrated; every call answers its error otherwise.
    schema: Result<(), String>,
}

#[derive(Deserialize)]
struct RecordRow {
    record: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
}

#[derive(Deserialize)]
struct JtiRow {
    jti: String,
}

/// The registry's schema, in order (numbered from 1 by position; never reorder or remove one).
const MIGRATIONS: &[Migration] = &[
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS credentials (jti TEXT PRIMARY KEY, sub TEXT NOT NULL, kind TEXT NOT NULL, parent TEXT, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, record TEXT NOT NULL)",
    ),
    Migration::Sql(
        "CREATE INDEX IF NOT EXISTS credentials_by_sub ON credentials (sub, kind, created_at)",
    ),
    Migration::Sql("CREATE INDEX IF NOT EXISTS credentials_by_parent ON credentials (parent)"),
];

impl DurableObject for TokenRegistry {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        let schema = migrate(&sql, "tokens", MIGRATIONS);
        if let Err(e) = &schema {
            worker::console_error!("token registry: {e}");
        }
        TokenRegistry { sql, env, schema }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        Ok(match self.route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }
}

impl TokenRegistry {
    async fn route(&self, mut req: Request) -> ApiResult<Response> {
        if let Err(e) = &self.schema {
            return Err(ApiError::new(500, "storage_failed", e.clone()));
        }
        let (name, body) = internal::call_parts(&mut req).await?;
        let call = TokensCall::decode(&name, &body).map_err(internal::call_error)?;
        let who = Identity::from_headers(&req)?;
        let now = now_secs();
        match call {
            TokensCall::Check(c) => Ok(reply(&c, &self.check(&who, &c.jti, now)?)),
            TokensCall::Register(c) => {
                self.prune(now)?;
                let parent = match c.0.parent.as_deref() {
                    Some(jti) => self.get(jti)?,
                    None => None,
                };
                let record =
                    lineage::adopt(c.0.clone(), parent.as_ref(), now).map_err(mint_error)?;
                self.register(&record)?;
                Ok(reply(&c, &record.info()))
            }
            TokensCall::List(c) => {
                self.prune(now)?;
                Ok(reply(&c, &self.list(&who, &c)?))
            }
            TokensCall::Revoke(c) => Ok(reply(&c, &self.revoke(&who, &c.jti).await?)),
            TokensCall::RevokeAll(c) => Ok(reply(&c, &self.revoke_all(&who, &c.sub).await?)),
        }
    }

    /// Whether `who`'s credential `jti` may be used now, and as what. The Access settings are
    /// read only for a credential resting on an Access identity.
    fn check(&self, who: &Identity, jti: &str, now: i64) -> ApiResult<Live> {
        let record = self.get(jti)?;
        let access = match record.as_ref().map(|r| &r.root) {
            Some(LineageRoot::Access { .. }) => crate::access::config(&self.env)?,
            _ => None,
        };
        Ok(
            match lineage::standing(record.as_ref(), &who.sub, &who.tenant, now, access.as_ref()) {
                Standing::Live { role } => Live {
                    live: true,
                    role: Some(role),
                    reason: None,
                },
                Standing::Refused(reason) => Live {
                    live: false,
                    role: None,
                    reason: Some(reason),
                },
            },
        )
    }

    /// `GET /v1/tokens`: the caller's (or, for an admin, a named user's or everyone's)
    /// tokens and cookie sessions, the caller's own marked `current`.
    fn list(&self, who: &Identity, list: &List) -> ApiResult<ListTokensResponse> {
        let principal = who.principal();
        let rows: Vec<RecordRow> = if list.all {
            if !principal.is_admin() {
                return Err(ApiError::new(
                    403,
                    "forbidden",
                    "only admins may list every user's tokens",
                ));
            }
            self.sql
                .exec(
                    "SELECT record FROM credentials ORDER BY created_at DESC, jti",
                    None,
                )?
                .to_array()?
        } else {
            let sub = list.sub.clone().unwrap_or_else(|| who.sub.clone());
            if !may_manage_tokens(&principal, &sub) {
                return Err(ApiError::new(
                    403,
                    "forbidden",
                    "only admins may list another user's tokens",
                ));
            }
            self.sql
                .exec(
                    "SELECT record FROM credentials WHERE sub = ? ORDER BY created_at DESC, jti",
                    vec![sub.into()],
                )?
                .to_array()?
        };
        let current = list.current.as_deref();
        let tokens = rows
            .into_iter()
            .filter_map(|r| serde_json::from_str::<CredentialRecord>(&r.record).ok())
            .map(|r| r.info_for(current))
            .collect();
        Ok(ListTokensResponse { tokens })
    }

    /// Revokes `jti` and everything made from it, if `who` may. Someone else's token is not
    /// found for a member: its existence is not theirs to learn.
    async fn revoke(&self, who: &Identity, jti: &str) -> ApiResult<RevokeTokenResponse> {
        let record = self
            .get(jti)?
            .filter(|r| may_manage_tokens(&who.principal(), &r.sub))
            .ok_or_else(|| ApiError::not_found("no such token"))?;
        let revoked = self.revoke_set(who, Revocation::One(&record.jti)).await?;
        Ok(RevokeTokenResponse {
            jti: record.jti,
            revoked: true,
            also_revoked: revoked.count.saturating_sub(1),
        })
    }

    /// Revokes every credential of `sub` and everything made from them, if `who` may (their
    /// own, or anyone's for an admin; a member naming someone else is `403`, as listing is).
    async fn revoke_all(&self, who: &Identity, sub: &str) -> ApiResult<RevokeAllResponse> {
        if !may_manage_tokens(&who.principal(), sub) {
            return Err(ApiError::new(
                403,
                "forbidden",
                "only admins may revoke another user's credentials",
            ));
        }
        let revoked = self.revoke_set(who, Revocation::AllOf(sub)).await?;
        Ok(RevokeAllResponse {
            sub: sub.to_string(),
            revoked: revoked.count,
            sessions: revoked.sessions,
            runner_connections_closed: revoked.runner_connections_closed,
        })
    }

    /// Deletes what `what` reaches (`lineage::revocation_set` over the tenant's rows), then
    /// has the runner hub close the sockets of the runner tokens among them. Follow streams and
    /// session sockets notice by themselves within the recheck bound.
    async fn revoke_set(&self, who: &Identity, what: Revocation<'_>) -> ApiResult<Outcome> {
        let records = self.all()?;
        let nodes: Vec<Node<'_>> = records.iter().map(Node::from).collect();
        let set = lineage::revocation_set(&nodes, what);
        let mut outcome = Outcome {
            count: set.len(),
            ..Outcome::default()
        };
        let mut runners = Vec::new();
        for jti in &set {
            self.sql.exec(
                "DELETE FROM credentials WHERE jti = ?",
                vec![jti.as_str().into()],
            )?;
            match records.iter().find(|r| &r.jti == jti).map(|r| r.kind) {
                Some(CredentialKind::Runner) => runners.push(jti.clone()),
                Some(CredentialKind::Session) => outcome.sessions += 1,
                _ => {}
            }
        }
        if !runners.is_empty() {
            outcome.runner_connections_closed = self.disconnect_runners(who, runners).await;
        }
        Ok(outcome)
    }

    /// Asks the tenant's runner hub to close the sockets that connected with `jtis` (one
    /// retry); returns how many it closed. A hub that cannot be reached is logged: the tokens
    /// are revoked either way, and a socket then lasts until its runner reconnects (refused).
    async fn disconnect_runners(&self, who: &Identity, jtis: Vec<String>) -> usize {
        let call = Revoked { jtis };
        let mut last_error = String::new();
        for _ in 0..2 {
            let answer = match internal::hub(&self.env, &who.tenant) {
                Ok(hub) => internal::call(&hub, who, &call).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(closed) => {
                    worker::console_log!(
                        "token registry: {} runner token(s) revoked; {} connection(s) closed",
                        call.jtis.len(),
                        closed.closed
                    );
                    return closed.closed;
                }
                Err(e) => last_error = e.message,
            }
        }
        worker::console_error!(
            "token registry: telling the runner hub about revoked tokens failed: {last_error}"
        );
        0
    }

    /// Every row of the tenant (at most `MAX_CREDENTIALS_PER_TENANT`): what a revocation walks.
    fn all(&self) -> ApiResult<Vec<CredentialRecord>> {
        let rows: Vec<RecordRow> = self
            .sql
            .exec("SELECT record FROM credentials", None)?
            .to_array()?;
        Ok(rows
            .into_iter()
            .filter_map(|r| serde_json::from_str(&r.record).ok())
            .collect())
    }

    fn get(&self, jti: &str) -> ApiResult<Option<CredentialRecord>> {
        if jti.is_empty() {
            return Ok(None);
        }
        let rows: Vec<RecordRow> = self
            .sql
            .exec(
                "SELECT record FROM credentials WHERE jti = ?",
                vec![jti.into()],
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| serde_json::from_str(&r.record).ok()))
    }

    /// Drops expired rows: an expired JWT is refused by its `exp` anyway.
    fn prune(&self, now: i64) -> ApiResult<()> {
        self.sql.exec(
            "DELETE FROM credentials WHERE expires_at <= ?",
            vec![(now as f64).into()],
        )?;
        Ok(())
    }

    fn count(&self, query: &str, params: Vec<worker::SqlStorageValue>) -> ApiResult<usize> {
        let rows: Vec<CountRow> = self.sql.exec(query, Some(params))?.to_array()?;
        Ok(rows.first().map_or(0, |r| r.n as usize))
    }

    fn register(&self, record: &CredentialRecord) -> ApiResult<()> {
        let tenant_rows = self.count("SELECT COUNT(*) AS n FROM credentials", vec![])?;
        let user_live = self.count(
            "SELECT COUNT(*) AS n FROM credentials WHERE sub = ? AND kind = ?",
            vec![record.sub.clone().into(), record.kind.as_str().into()],
        )?;
        let counted = if record.kind == CredentialKind::Session {
            user_live
        } else {
            self.count(
                "SELECT COUNT(*) AS n FROM credentials WHERE sub = ? AND kind != 'session'",
                vec![record.sub.clone().into()],
            )?
        };
        may_register(record.kind, counted, tenant_rows).map_err(|e| {
            let (status, code) = e.status_code();
            ApiError::new(status, code, e.to_string())
        })?;
        if record.kind == CredentialKind::Session {
            let evict = sessions_to_evict(user_live);
            if evict > 0 {
                let oldest: Vec<JtiRow> = self
                    .sql
                    .exec(
                        "SELECT jti FROM credentials WHERE sub = ? AND kind = 'session' ORDER BY created_at, jti LIMIT ?",
                        vec![record.sub.clone().into(), (evict as f64).into()],
                    )?
                    .to_array()?;
                for row in oldest {
                    self.sql.exec(
                        "DELETE FROM credentials WHERE jti = ?",
                        vec![row.jti.into()],
                    )?;
                }
            }
        }
        let json = serde_json::to_string(record).map_err(|e| ApiError::internal(e.to_string()))?;
        self.sql.exec(
            "INSERT INTO credentials (jti, sub, kind, parent, created_at, expires_at, record) VALUES (?, ?, ?, ?, ?, ?, ?)",
            vec![
                record.jti.clone().into(),
                record.sub.clone().into(),
                record.kind.as_str().into(),
                record.parent.clone().into(),
                (record.created_at as f64).into(),
                (record.expires_at as f64).into(),
                json.into(),
            ],
        )?;
        Ok(())
    }
}

/// What one revocation ended.
#[derive(Default)]
struct Outcome {
    count: usize,
    sessions: usize,
    runner_connections_closed: usize,
}

fn mint_error(e: MintError) -> ApiError {
    let (status, code) = e.status_code();
    ApiError::new(status, code, e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Calls from the router and the actors.

/// Whether the credential `jti` of `who` may be used now: `Ok(role)` (the most it may act as),
/// or `Err(reason)` when it is revoked, expired or its Access root no longer admits it.
pub(crate) async fn check(env: &Env, who: &Identity, jti: &str) -> ApiResult<Result<Role, String>> {
    let call = Check {
        jti: jti.to_string(),
    };
    let live = internal::call(&internal::token_registry(env, &who.tenant)?, who, &call).await?;
    Ok(match (live.live, live.role) {
        (true, Some(role)) => Ok(role),
        (true, None) => Ok(Role::Member),
        (false, _) => Err(live.reason.unwrap_or_else(|| "token revoked".to_string())),
    })
}

/// Whether a stream opened by `who` (with the role it had then) may go on: its credential is
/// still accepted, with at least that role.
pub(crate) async fn still_live(env: &Env, who: &Identity, jti: &str) -> ApiResult<bool> {
    Ok(check(env, who, jti)
        .await?
        .is_ok_and(|role| role.covers(who.role)))
}

/// Registers a credential in `who`'s tenant (`who` is the caller; `record.sub` may differ for
/// admins) and answers what was registered: a child's expiry may be capped at its parent's.
/// 429 `too_many_tokens` over the bounds, 401 when the credential it is made from is gone.
pub(crate) async fn register(
    env: &Env,
    who: &Identity,
    record: &CredentialRecord,
) -> ApiResult<wuhu_core::wire::TokenInfo> {
    let call = Register(record.clone());
    internal::call(&internal::token_registry(env, &who.tenant)?, who, &call).await
}

/// `GET /v1/tokens[?sub=|?all=1]`.
pub(crate) async fn list(env: &Env, who: &Identity, list: &List) -> ApiResult<ListTokensResponse> {
    internal::call(&internal::token_registry(env, &who.tenant)?, who, list).await
}

/// Revokes `jti` (and everything made from it) if `who` may.
pub(crate) async fn revoke(env: &Env, who: &Identity, jti: &str) -> ApiResult<RevokeTokenResponse> {
    let call = Revoke {
        jti: jti.to_string(),
    };
    internal::call(&internal::token_registry(env, &who.tenant)?, who, &call).await
}

/// `POST /v1/tokens/revoke-all`: every credential of `sub` (and everything made from them) if
/// `who` may.
pub(crate) async fn revoke_all(
    env: &Env,
    who: &Identity,
    sub: &str,
) -> ApiResult<RevokeAllResponse> {
    let call = RevokeAll {
        sub: sub.to_string(),
    };
    internal::call(&internal::token_registry(env, &who.tenant)?, who, &call).await
}
