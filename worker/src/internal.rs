//! Calls between Durable Objects: one place that builds internal requests with typed bodies
//! from `wuhu_core::wire`, and turns the replies back into values, or into [`ApiError`]s that
//! keep the callee's `code` (a hub's `502 runner_disconnected` stays `runner_disconnected` in
//! the session, never `internal`).
//!
//! Identity travels in `x-wuhu-tenant` / `x-wuhu-sub`, set only from a verified token or by the
//! actor on its owner's behalf. When the callee cannot be reached at all (its stub's `fetch`
//! failed: the object was reset, redeployed or overloaded), the error is `503 unreachable`, so a
//! caller can tell "it answered no" from "nobody answered".

use std::borrow::Cow;

use serde::Serialize;
use serde::de::DeserializeOwned;
use worker::{Env, Headers, Method, Request, RequestInit, Response, Stub};
use wuhu_core::wire::runner::ServerMessage;
use wuhu_core::wire::{ErrorBody, RunnerCallRequest, RunnerCallResponse};

use crate::http::{ApiError, ApiResult};

/// Code of an error where the callee gave no answer (its `fetch` failed).
pub(crate) const UNREACHABLE: &str = "unreachable";

/// Codes `/call` on the runner hub answers with; see `docs/api.md`.
pub(crate) mod codes {
    /// 503: the runner has no live connection; the request was not sent.
    pub(crate) const RUNNER_NOT_CONNECTED: &str = "runner_not_connected";
    /// 502: the runner's connection closed (or was replaced) while the request waited.
    pub(crate) const RUNNER_DISCONNECTED: &str = "runner_disconnected";
    /// 504: the runner did not answer within the call's timeout (the hub sent `cancel`).
    pub(crate) const TIMEOUT: &str = "timeout";
}

/// Decodes a 2xx JSON reply, or turns an error reply back into an [`ApiError`] with the
/// callee's status, code and message.
pub(crate) async fn expect_ok<T: DeserializeOwned>(mut resp: Response) -> ApiResult<T> {
    let status = resp.status_code();
    let text = resp.text().await?;
    if (200..300).contains(&status) {
        return serde_json::from_str(&text)
            .map_err(|e| ApiError::internal(format!("bad internal reply: {e}")));
    }
    Err(match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => ApiError {
            status,
            code: Cow::Owned(body.error.code),
            message: body.error.message,
        },
        // Not one of our error bodies (the runtime answered for the callee): keep the text.
        Err(_) => ApiError::new(status, code_for(status), text),
    })
}

/// The code of a bare status, for replies without an error body.
fn code_for(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        409 => "conflict",
        413 => "payload_too_large",
        429 => "too_many_requests",
        503 => UNREACHABLE,
        _ => "internal",
    }
}

/// Sends `request` to `stub` and decodes the reply (see [`expect_ok`]).
pub(crate) async fn send<T: DeserializeOwned>(stub: &Stub, request: Request) -> ApiResult<T> {
    let response = stub
        .fetch_with_request(request)
        .await
        .map_err(|e| ApiError::new(503, UNREACHABLE, format!("no answer: {e}")))?;
    expect_ok(response).await
}

/// A `POST` of `body` as JSON to `https://<host><path>`, on behalf of `sub` in `tenant`.
pub(crate) fn post_request<B: Serialize>(
    host: &str,
    path: &str,
    tenant: &str,
    sub: &str,
    body: &B,
) -> ApiResult<Request> {
    let body = serde_json::to_string(body)
        .map_err(|e| ApiError::internal(format!("encoding an internal request: {e}")))?;
    let headers = Headers::new();
    headers.set("x-wuhu-tenant", tenant)?;
    headers.set("x-wuhu-sub", sub)?;
    headers.set("content-type", "application/json")?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
    Ok(Request::new_with_init(
        &format!("https://{host}{path}"),
        &init,
    )?)
}

/// The tenant's runner hub.
pub(crate) fn hub(env: &Env, tenant: &str) -> ApiResult<Stub> {
    Ok(env
        .durable_object("RUNNERS")?
        .id_from_name(tenant)?
        .get_stub()?)
}

/// `POST` a typed body to the tenant's hub and decode the typed answer.
pub(crate) async fn hub_post<B: Serialize, T: DeserializeOwned>(
    env: &Env,
    tenant: &str,
    sub: &str,
    path: &str,
    body: &B,
) -> ApiResult<T> {
    let request = post_request("hub", path, tenant, sub, body)?;
    send(&hub(env, tenant)?, request).await
}

/// The hub's `POST /call`: sends `message` to `owner`'s runner `runner` and waits for its
/// answer (`None` for `cancel`).
pub(crate) async fn runner_call(
    env: &Env,
    tenant: &str,
    sub: &str,
    runner: &str,
    owner: &str,
    message: &ServerMessage,
    timeout_ms: Option<u64>,
) -> ApiResult<RunnerCallResponse> {
    let request = RunnerCallRequest {
        runner: runner.to_string(),
        owner: owner.to_string(),
        message: message.clone(),
        timeout_ms,
    };
    hub_post(env, tenant, sub, "/call", &request).await
}
