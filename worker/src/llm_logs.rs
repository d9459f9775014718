//! Request logs in R2 (`{tenant}/llm-logs/{session}/{step}-{startedAtMs}.json`): writing one
//! for a tenant with `llmRequestLogs: true`, the admin routes that read them, and retention.
//! What a record holds and how it is redacted is `wuhu_core::llm::request_log`.

use worker::{Bucket, Env};
use wuhu_core::llm::request_log::{
    self, Exchange, KnownSecrets, List, MAX_LIST, Summary, is_expired, object_key, session_prefix,
    tenant_prefix, valid_record_name,
};
use wuhu_core::tenant_config::TenantConfig;

use crate::http::{ApiError, ApiResult, json_response, query, query_pairs, query_u64};
use crate::identity::Identity;

const BUCKET: &str = "ARCHIVE";

/// Records a session's sweep deletes at most at once (one R2 listing page).
const SWEEP_MAX: u32 = 1000;

fn bucket(env: &Env) -> ApiResult<Bucket> {
    Ok(env.bucket(BUCKET)?)
}

fn now_ms() -> u64 {
    worker::Date::now().as_millis()
}

/// Writes the record of `exchange`, redacted of `known` (the provider keys, the tenant's
/// secrets) and what the detector finds.
pub(crate) async fn write(
    env: &Env,
    tenant: &str,
    session: &str,
    step: u64,
    exchange: &Exchange,
    known: KnownSecrets<'_>,
) -> ApiResult<()> {
    let record = request_log::record(session, step, exchange, known);
    let body = serde_json::to_vec(&record)
        .map_err(|e| ApiError::internal(format!("encoding a request log: {e}")))?;
    bucket(env)?
        .put(
            object_key(tenant, session, step, exchange.started_at_ms),
            body,
        )
        .execute()
        .await?;
    Ok(())
}

/// Deletes the session's records older than `days` (at most one listing page per call).
pub(crate) async fn sweep_session(
    env: &Env,
    tenant: &str,
    session: &str,
    days: u32,
) -> ApiResult<usize> {
    let bucket = bucket(env)?;
    let page = bucket
        .list()
        .prefix(session_prefix(tenant, session))
        .limit(SWEEP_MAX)
        .execute()
        .await?;
    let now = now_ms();
    let expired: Vec<String> = page
        .objects()
        .iter()
        .filter(|o| is_expired(o.uploaded().as_millis(), now, days))
        .map(|o| o.key())
        .collect();
    let n = expired.len();
    if n > 0 {
        bucket.delete_multiple(expired).await?;
    }
    Ok(n)
}

fn admin_only(identity: &Identity) -> ApiResult<()> {
    if identity.principal().is_admin() {
        Ok(())
    } else {
        Err(ApiError::new(
            403,
            "forbidden",
            "only an admin may read request logs",
        ))
    }
}

/// The tenant's retention in days; an invalid `config/tenant.json` is a 409 naming it.
async fn retention_days(env: &Env, tenant: &str) -> ApiResult<u32> {
    let config: TenantConfig = crate::workspace_io::tenant_config(env, tenant)
        .await?
        .map_err(|e| ApiError::new(409, "invalid_tenant_config", e.to_string()))?;
    Ok(config.llm_request_log_days)
}

/// `GET /v1/llm-logs?session=&after=&limit=` (admins): records in key order. Expired records
/// are not listed, and are deleted as the listing meets them.
pub(crate) async fn list(
    req: &worker::Request,
    env: &Env,
    identity: &Identity,
) -> ApiResult<worker::Response> {
    admin_only(identity)?;
    let pairs = query_pairs(req);
    let limit = query_u64(&pairs, "limit")?.unwrap_or(100);
    if limit == 0 || limit > MAX_LIST as u64 {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LIST}"
        )));
    }
    let session = query(&pairs, "session").filter(|s| !s.is_empty());
    if session
        .as_deref()
        .is_some_and(|s| !valid_record_name(&format!("{s}/0000000000-0000000000000.json")))
    {
        return Err(ApiError::bad_request("session must be a session id"));
    }
    let after = query(&pairs, "after").filter(|a| !a.is_empty());
    if after
        .as_deref()
        .is_some_and(|a| a.len() > 200 || a.contains(".."))
    {
        return Err(ApiError::bad_request(
            "after must be the nextAfter of a previous page",
        ));
    }
    let root = tenant_prefix(&identity.tenant);
    let prefix = match &session {
        Some(s) => session_prefix(&identity.tenant, s),
        None => root.clone(),
    };
    let days = retention_days(env, &identity.tenant).await?;
    let bucket = bucket(env)?;
    let mut request = bucket.list().prefix(prefix).limit(limit as u32);
    if let Some(after) = &after {
        request = request.start_after(format!("{root}{after}"));
    }
    let page = request.execute().await?;
    let now = now_ms();
    let mut records = Vec::new();
    let mut expired = Vec::new();
    let mut last = None;
    for object in page.objects() {
        let key = object.key();
        let name = key.strip_prefix(&root).unwrap_or_default().to_string();
        last = Some(name.clone());
        if is_expired(object.uploaded().as_millis(), now, days) {
            expired.push(key);
            continue;
        }
        if let Some(summary) = Summary::of(&name, object.size()) {
            records.push(summary);
        }
    }
    if !expired.is_empty() {
        bucket.delete_multiple(expired).await?;
    }
    let next_after = if page.truncated() { last } else { None };
    Ok(json_response(
        200,
        &List {
            records,
            next_after,
        },
    ))
}

/// `GET /v1/llm-logs/{session}/{record}` (admins): one record; 404 when absent or expired.
pub(crate) async fn get(
    env: &Env,
    identity: &Identity,
    session: &str,
    record: &str,
) -> ApiResult<worker::Response> {
    admin_only(identity)?;
    let name = format!("{session}/{record}");
    if !valid_record_name(&name) {
        return Err(ApiError::bad_request(
            "not a request log name: {session}/{step}-{startedAtMs}.json",
        ));
    }
    let key = format!("{}{name}", tenant_prefix(&identity.tenant));
    let days = retention_days(env, &identity.tenant).await?;
    let bucket = bucket(env)?;
    let Some(object) = bucket.get(key.clone()).execute().await? else {
        return Err(ApiError::not_found(format!("no request log {name}")));
    };
    if is_expired(object.uploaded().as_millis(), now_ms(), days) {
        bucket.delete(key).await?;
        return Err(ApiError::not_found(format!("no request log {name}")));
    }
    let body = object
        .body()
        .ok_or_else(|| ApiError::internal("request log has no body"))?
        .bytes()
        .await?;
    let headers = worker::Headers::new();
    let _ = headers.set("content-type", "application/json");
    Ok(worker::Response::from_bytes(body)?.with_headers(headers))
}
