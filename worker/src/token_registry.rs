//! `TokenRegistry`: one Durable Object per tenant holding its registered credentials (tokens
//! minted by `POST /v1/tokens`, browser cookie sessions), one SQLite row per `jti`.
//!
//! A JWT with a `jti` is accepted only while its row exists (`wuhu_core::tokens::credential_live`),
//! so revoking is deleting the row, and the next request anywhere is refused: every such
//! request asks `/check`, a primary-key lookup in this object's SQLite. Tokens without `jti`
//! (operator tokens) never come here. See `docs/decisions/0007-token-registry-and-revocation.md`.
//!
//! What is already open is cut too: revoking a runner token tells the tenant's runner hub,
//! which closes the sockets that connected with it (`POST /revoked` on the hub); follow streams
//! opened with a revocable credential ask `/check` again every
//! `wuhu_core::follow::CREDENTIAL_RECHECK_MS` and end when it is gone.
//!
//! Internal routes (identity in `x-wuhu-*` headers, set by the router from a verified
//! credential): `GET /check?jti`, `POST /register` (a `CredentialRecord`), `GET /list?sub|all`,
//! `POST /revoke?jti`.

use serde::Deserialize;
use worker::{
    DurableObject, Env, Headers, Method, Request, RequestInit, Response, SqlStorage, State,
    durable_object,
};
use wuhu_core::tokens::{
    CredentialRecord, credential_live, may_manage_tokens, may_register, sessions_to_evict,
};
use wuhu_core::wire::{CredentialKind, ListTokensResponse, RevokeTokenResponse};

use crate::http::{ApiError, ApiResult, json_response, parse_json, query, query_pairs, read_body};
use crate::identity::{Identity, now_secs};
use crate::internal;

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
        let who = Identity::from_headers(&req)?;
        let pairs = query_pairs(&req);
        let now = now_secs();
        match (req.method(), req.path().as_str()) {
            (Method::Get, "/check") => {
                let jti = query(&pairs, "jti").unwrap_or_default();
                let record = self.get(&jti)?;
                let live = credential_live(record.as_ref(), &who.sub, now);
                Ok(json_response(200, &serde_json::json!({ "live": live })))
            }
            (Method::Post, "/register") => {
                let record: CredentialRecord = parse_json(&read_body(&mut req).await?)?;
                self.prune(now)?;
                self.register(&record)?;
                Ok(json_response(200, &record.info()))
            }
            (Method::Get, "/list") => {
                self.prune(now)?;
                let principal = who.principal();
                let all = query(&pairs, "all").is_some_and(|v| v == "1" || v == "true");
                let rows: Vec<RecordRow> = if all {
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
                    let sub = query(&pairs, "sub")
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| who.sub.clone());
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
                Ok(json_response(200, &ListTokensResponse { tokens }))
            }
            (Method::Post, "/revoke") => {
                let jti = query(&pairs, "jti").unwrap_or_default();
                // Someone else's token is not found for a member: its existence is not theirs
                // to learn.
                let record = self
                    .get(&jti)?
                    .filter(|r| may_manage_tokens(&who.principal(), &r.sub))
                    .ok_or_else(|| ApiError::not_found("no such token"))?;
                // Sessions made from this token end with it.
                self.sql.exec(
                    "DELETE FROM credentials WHERE jti = ? OR parent = ?",
                    vec![record.jti.clone().into(), record.jti.clone().into()],
                )?;
                // Runners connected with it are cut now (the row is gone, so their reconnect
                // is refused). Follow streams notice by themselves within the recheck bound.
                if record.kind == CredentialKind::Runner {
                    self.disconnect_runners(&who, &record.jti).await;
                }
                Ok(json_response(
                    200,
                    &RevokeTokenResponse {
                        jti: record.jti,
                        revoked: true,
                    },
                ))
            }
            _ => Err(ApiError::not_found("no such registry route")),
        }
    }

    /// Asks the tenant's runner hub to close the sockets that connected with `jti` (one retry).
    /// A hub that cannot be reached is logged: the token is revoked either way, and the socket
    /// then lasts until the runner reconnects (refused).
    async fn disconnect_runners(&self, who: &Identity, jti: &str) {
        #[derive(Deserialize)]
        struct Closed {
            closed: usize,
        }
        let body = serde_json::json!({ "jti": jti });
        let mut last_error = String::new();
        for _ in 0..2 {
            match internal::hub_post::<_, Closed>(
                &self.env,
                &who.tenant,
                &who.sub,
                "/revoked",
                &body,
            )
            .await
            {
                Ok(Closed { closed }) => {
                    worker::console_log!(
                        "token registry: runner token revoked; {closed} connection(s) closed"
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
// Calls from the router.

fn stub(env: &Env, tenant: &str) -> ApiResult<worker::Stub> {
    Ok(env
        .durable_object("TOKENS")?
        .id_from_name(tenant)?
        .get_stub()?)
}

fn request(who: &Identity, method: Method, path: &str, body: Option<String>) -> ApiResult<Request> {
    let headers = Headers::new();
    who.set_headers(&headers)?;
    headers.set("content-type", "application/json")?;
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(headers);
    if let Some(body) = body {
        init.with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
    }
    Ok(Request::new_with_init(
        &format!("https://tokens{path}"),
        &init,
    )?)
}

fn encode(text: &str) -> String {
    js_sys::encode_uri_component(text).into()
}

/// Whether the credential `jti` of `who` is live (registered, theirs, not expired).
pub(crate) async fn check(env: &Env, who: &Identity, jti: &str) -> ApiResult<bool> {
    #[derive(Deserialize)]
    struct Live {
        live: bool,
    }
    let req = request(
        who,
        Method::Get,
        &format!("/check?jti={}", encode(jti)),
        None,
    )?;
    let live: Live = internal::send(&stub(env, &who.tenant)?, req).await?;
    Ok(live.live)
}

/// Registers a credential in `who`'s tenant (`who` is the caller; `record.sub` may differ for
/// admins). 429 `too_many_tokens` over the bounds.
pub(crate) async fn register(
    env: &Env,
    who: &Identity,
    record: &CredentialRecord,
) -> ApiResult<()> {
    let body = serde_json::to_string(record).map_err(|e| ApiError::internal(e.to_string()))?;
    let req = request(who, Method::Post, "/register", Some(body))?;
    let _: serde_json::Value = internal::send(&stub(env, &who.tenant)?, req).await?;
    Ok(())
}

/// `GET /v1/tokens`, forwarded with its query.
pub(crate) async fn list(env: &Env, who: &Identity, query: &str) -> ApiResult<Response> {
    let path = if query.is_empty() {
        "/list".to_string()
    } else {
        format!("/list?{query}")
    };
    Ok(stub(env, &who.tenant)?
        .fetch_with_request(request(who, Method::Get, &path, None)?)
        .await?)
}

/// Revokes `jti` (and the sessions made from it) if `who` may.
pub(crate) async fn revoke(env: &Env, who: &Identity, jti: &str) -> ApiResult<Response> {
    let path = format!("/revoke?jti={}", encode(jti));
    Ok(stub(env, &who.tenant)?
        .fetch_with_request(request(who, Method::Post, &path, None)?)
        .await?)
}
