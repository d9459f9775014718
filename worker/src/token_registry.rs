//! `TokenRegistry`: one Durable Object per tenant holding its registered credentials (tokens
//! minted by `POST /v1/tokens`, browser cookie sessions), one SQLite row per `jti`.
//!
//! A JWT with a `jti` is accepted only while its row exists (`wuhu_core::tokens::credential_live`),
//! so revoking is deleting the row, and the next request anywhere is refused: every such
//! request asks `Check`, a primary-key lookup in this object's SQLite. Tokens without `jti`
//! (operator tokens) never come here. See `docs/decisions/0007-token-registry-and-revocation.md`.
//!
//! What is already open is cut too: revoking a runner token tells the tenant's runner hub,
//! which closes the sockets that connected with it (`Revoked` on the hub); follow streams
//! opened with a revocable credential ask `Check` again every
//! `wuhu_core::follow::CREDENTIAL_RECHECK_MS` and end when it is gone.
//!
//! Its calls are `wuhu_core::calls::tokens::TokensCall` (identity in `x-wuhu-*` headers, set by
//! the router from a verified credential).

use serde::Deserialize;
use worker::{DurableObject, Env, Request, Response, SqlStorage, State, durable_object};
use wuhu_core::calls::hub::Revoked;
use wuhu_core::calls::tokens::{Check, List, Live, Register, Revoke, TokensCall};
use wuhu_core::tokens::{
    CredentialRecord, credential_live, may_manage_tokens, may_register, sessions_to_evict,
};
use wuhu_core::wire::{CredentialKind, ListTokensResponse, RevokeTokenResponse};

use crate::http::{ApiError, ApiResult};
use crate::identity::{Identity, now_secs};
use crate::internal::{self, reply};

#[durable_object]
pub struct TokenRegistry {
    sql: SqlStorage,
    env: Env,
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

impl DurableObject for TokenRegistry {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS credentials (jti TEXT PRIMARY KEY, sub TEXT NOT NULL, kind TEXT NOT NULL, parent TEXT, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, record TEXT NOT NULL)",
            None,
        );
        let _ = sql.exec(
            "CREATE INDEX IF NOT EXISTS credentials_by_sub ON credentials (sub, kind, created_at)",
            None,
        );
        let _ = sql.exec(
            "CREATE INDEX IF NOT EXISTS credentials_by_parent ON credentials (parent)",
            None,
        );
        TokenRegistry { sql, env }
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
        let (name, body) = internal::call_parts(&mut req).await?;
        let call = TokensCall::decode(&name, &body).map_err(internal::call_error)?;
        let who = Identity::from_headers(&req)?;
        let now = now_secs();
        match call {
            TokensCall::Check(c) => {
                let record = self.get(&c.jti)?;
                let live = credential_live(record.as_ref(), &who.sub, now);
                Ok(reply(&c, &Live { live }))
            }
            TokensCall::Register(c) => {
                self.prune(now)?;
                self.register(&c.0)?;
                Ok(reply(&c, &c.0.info()))
            }
            TokensCall::List(c) => {
                self.prune(now)?;
                Ok(reply(&c, &self.list(&who, &c)?))
            }
            TokensCall::Revoke(c) => Ok(reply(&c, &self.revoke(&who, &c.jti).await?)),
        }
    }

    /// `GET /v1/tokens`: the caller's (or, for an admin, a named user's or everyone's) tokens.
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
                    "SELECT record FROM credentials WHERE kind != 'session' ORDER BY created_at DESC, jti",
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
                    "SELECT record FROM credentials WHERE sub = ? AND kind != 'session' ORDER BY created_at DESC, jti",
                    vec![sub.into()],
                )?
                .to_array()?
        };
        let tokens = rows
            .into_iter()
            .filter_map(|r| serde_json::from_str::<CredentialRecord>(&r.record).ok())
            .map(|r| r.info())
            .collect();
        Ok(ListTokensResponse { tokens })
    }

    /// Revokes `jti` and the sessions made from it, if `who` may. Someone else's token is not
    /// found for a member: its existence is not theirs to learn.
    async fn revoke(&self, who: &Identity, jti: &str) -> ApiResult<RevokeTokenResponse> {
        let record = self
            .get(jti)?
            .filter(|r| may_manage_tokens(&who.principal(), &r.sub))
            .ok_or_else(|| ApiError::not_found("no such token"))?;
        // Sessions made from this token end with it.
        self.sql.exec(
            "DELETE FROM credentials WHERE jti = ? OR parent = ?",
            vec![record.jti.clone().into(), record.jti.clone().into()],
        )?;
        // Runners connected with it are cut now (the row is gone, so their reconnect is
        // refused). Follow streams notice by themselves within the recheck bound.
        if record.kind == CredentialKind::Runner {
            self.disconnect_runners(who, &record.jti).await;
        }
        Ok(RevokeTokenResponse {
            jti: record.jti,
            revoked: true,
        })
    }

    /// Asks the tenant's runner hub to close the sockets that connected with `jti` (one retry).
    /// A hub that cannot be reached is logged: the token is revoked either way, and the socket
    /// then lasts until the runner reconnects (refused).
    async fn disconnect_runners(&self, who: &Identity, jti: &str) {
        let call = Revoked {
            jti: jti.to_string(),
        };
        let mut last_error = String::new();
        for _ in 0..2 {
            let answer = match internal::hub(&self.env, &who.tenant) {
                Ok(hub) => internal::call(&hub, who, &call).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(closed) => {
                    worker::console_log!(
                        "token registry: runner token revoked; {} connection(s) closed",
                        closed.closed
                    );
                    return;
                }
                Err(e) => last_error = e.message,
            }
        }
        worker::console_error!(
            "token registry: telling the runner hub about a revoked token failed: {last_error}"
        );
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

// ---------------------------------------------------------------------------------------------
// Calls from the router and the actors.

/// Whether the credential `jti` of `who` is live (registered, theirs, not expired).
pub(crate) async fn check(env: &Env, who: &Identity, jti: &str) -> ApiResult<bool> {
    let call = Check {
        jti: jti.to_string(),
    };
    let live = internal::call(&internal::token_registry(env, &who.tenant)?, who, &call).await?;
    Ok(live.live)
}

/// Registers a credential in `who`'s tenant (`who` is the caller; `record.sub` may differ for
/// admins). 429 `too_many_tokens` over the bounds.
pub(crate) async fn register(
    env: &Env,
    who: &Identity,
    record: &CredentialRecord,
) -> ApiResult<()> {
    let call = Register(record.clone());
    internal::call(&internal::token_registry(env, &who.tenant)?, who, &call)
        .await
        .map(|_| ())
}

/// `GET /v1/tokens[?sub=|?all=1]`.
pub(crate) async fn list(env: &Env, who: &Identity, list: &List) -> ApiResult<ListTokensResponse> {
    internal::call(&internal::token_registry(env, &who.tenant)?, who, list).await
}

/// Revokes `jti` (and the sessions made from it) if `who` may.
pub(crate) async fn revoke(env: &Env, who: &Identity, jti: &str) -> ApiResult<RevokeTokenResponse> {
    let call = Revoke {
        jti: jti.to_string(),
    };
    internal::call(&internal::token_registry(env, &who.tenant)?, who, &call).await
}
