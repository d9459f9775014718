//! `TenantIndex`: one Durable Object per tenant, listing its sessions newest first.
//! Internal routes: `POST /upsert` (SessionInfo), `GET /list?limit&before`.

use serde::Deserialize;
use worker::{
    DurableObject, Env, Method, Request, RequestInit, Response, SqlStorage, State, durable_object,
};
use wuhu_core::wire::{ListSessionsResponse, SessionInfo};

use crate::http::{
    ApiError, ApiResult, json_response, parse_json, query, query_pairs, query_u64, read_body,
};

#[durable_object]
pub struct TenantIndex {
    sql: SqlStorage,
}

#[derive(Deserialize)]
struct InfoRow {
    info: String,
}

#[derive(Deserialize)]
struct SeqRow {
    seq: f64,
}

impl DurableObject for TenantIndex {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        // `seq` orders sessions by creation: ids are random and times only have seconds.
        let _ = sql.exec(
            "CREATE TABLE IF NOT EXISTS session_list (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, info TEXT NOT NULL)",
            None,
        );
        TenantIndex { sql }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        Ok(match self.route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }
}

impl TenantIndex {
    async fn route(&self, mut req: Request) -> ApiResult<Response> {
        match (req.method(), req.path().as_str()) {
            (Method::Post, "/upsert") => {
                let body = read_body(&mut req).await?;
                let info: SessionInfo = parse_json(&body)?;
                let json =
                    serde_json::to_string(&info).map_err(|e| ApiError::internal(e.to_string()))?;
                self.sql.exec(
                    "INSERT INTO session_list (id, info) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET info = excluded.info",
                    vec![info.id.clone().into(), json.into()],
                )?;
                Ok(json_response(200, &serde_json::json!({"ok": true})))
            }
            (Method::Get, "/list") => {
                let pairs = query_pairs(&req);
                let limit = query_u64(&pairs, "limit")?.unwrap_or(50);
                if limit == 0 || limit > 200 {
                    return Err(ApiError::bad_request("limit must be between 1 and 200"));
                }
                let rows: Vec<InfoRow> = match query(&pairs, "before").filter(|b| !b.is_empty()) {
                    None => self
                        .sql
                        .exec(
                            "SELECT info FROM session_list ORDER BY seq DESC LIMIT ?",
                            vec![(limit as i64 + 1).into()],
                        )?
                        .to_array()?,
                    Some(before) => {
                        let anchor: Vec<SeqRow> = self
                            .sql
                            .exec(
                                "SELECT seq FROM session_list WHERE id = ?",
                                vec![before.clone().into()],
                            )?
                            .to_array()?;
                        let Some(anchor) = anchor.into_iter().next() else {
                            return Err(ApiError::bad_request(
                                "before must be the id of a listed session",
                            ));
                        };
                        self.sql
                            .exec(
                                "SELECT info FROM session_list WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                                vec![(anchor.seq as i64).into(), (limit as i64 + 1).into()],
                            )?
                            .to_array()?
                    }
                };
                let mut sessions: Vec<SessionInfo> = rows
                    .into_iter()
                    .filter_map(|r| serde_json::from_str(&r.info).ok())
                    .collect();
                let more = sessions.len() > limit as usize;
                sessions.truncate(limit as usize);
                let next_before = if more {
                    sessions.last().map(|s| s.id.clone())
                } else {
                    None
                };
                Ok(json_response(
                    200,
                    &ListSessionsResponse {
                        sessions,
                        next_before,
                    },
                ))
            }
            _ => Err(ApiError::not_found("no such route")),
        }
    }
}

fn stub(env: &Env, tenant: &str) -> ApiResult<worker::Stub> {
    Ok(env
        .durable_object("TENANTS")?
        .id_from_name(tenant)?
        .get_stub()?)
}

/// Records (or refreshes) a session in its tenant's index.
pub(crate) async fn upsert(env: &Env, tenant: &str, info: &SessionInfo) -> ApiResult<()> {
    let body = serde_json::to_string(info).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
    let req = Request::new_with_init("https://index/upsert", &init)?;
    let resp = stub(env, tenant)?.fetch_with_request(req).await?;
    crate::session_client::expect_ok(resp)
        .await
        .map(|_: serde_json::Value| ())
}

/// Lists a tenant's sessions, newest first.
pub(crate) async fn list(
    env: &Env,
    tenant: &str,
    limit: u32,
    before: Option<&str>,
) -> ApiResult<ListSessionsResponse> {
    let mut url = url_with_query("https://index/list", &[("limit", &limit.to_string())]);
    if let Some(before) = before {
        url = url_with_query(&url, &[("before", before)]);
    }
    let resp = stub(env, tenant)?.fetch_with_str(&url).await?;
    crate::session_client::expect_ok(resp).await
}

fn url_with_query(base: &str, pairs: &[(&str, &str)]) -> String {
    let mut url = worker::Url::parse(base).expect("static base url parses");
    url.query_pairs_mut().extend_pairs(pairs);
    url.to_string()
}
