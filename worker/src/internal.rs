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
use crate::identity::Identity;

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

/// The tenant's index (`TenantIndex`, one per tenant).
pub(crate) fn tenant_index(env: &Env, tenant: &str) -> ApiResult<Stub> {
    Ok(env
        .durable_object("TENANTS")?
        .id_from_name(tenant)?
        .get_stub()?)
}

/// Sends `request` to `stub` and decodes the reply (see [`expect_ok`]).
pub(crate) async fn send<T: DeserializeOwned>(stub: &Stub, request: Request) -> ApiResult<T> {
    let response = stub
        .fetch_with_request(request)
        .await
        .map_err(|e| ApiError::new(503, UNREACHABLE, format!("no answer: {e}")))?;
    expect_ok(response).await
}

/// Names a message a chat binding enqueues (its platform message id), so the session queues it
/// once however often it is sent (`wuhu_core::session::keyed_item_id`). Set only on requests
/// between actors: the router never forwards a client's headers.
pub(crate) const ITEM_KEY_HEADER: &str = "x-wuhu-item-key";

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

/// Decodes an empty success reply (`204`), or turns an error reply into an [`ApiError`] as
/// [`expect_ok`] does.
pub(crate) async fn expect_empty(resp: Response) -> ApiResult<()> {
    if (200..300).contains(&resp.status_code()) {
        return Ok(());
    }
    expect_ok::<serde_json::Value>(resp).await.map(|_| ())
}

/// A request of `method` to `https://<host><path>` on behalf of `who` (its sub, tenant and
/// role), with `body` as JSON when given.
pub(crate) fn request_as<B: Serialize>(
    host: &str,
    method: Method,
    path: &str,
    who: &Identity,
    body: Option<&B>,
) -> ApiResult<Request> {
    let headers = Headers::new();
    who.set_headers(&headers)?;
    let mut init = RequestInit::new();
    if let Some(body) = body {
        let body = serde_json::to_string(body)
            .map_err(|e| ApiError::internal(format!("encoding an internal request: {e}")))?;
        headers.set("content-type", "application/json")?;
        init.with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
    }
    init.with_method(method).with_headers(headers);
    Ok(Request::new_with_init(
        &format!("https://{host}{path}"),
        &init,
    )?)
}

/// A path segment, percent-encoded for an internal URL.
fn segment(text: &str) -> String {
    String::from(js_sys::encode_uri_component(text))
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

/// The runner hub's routes for people (`/v1/runners`, `/v1/environments`), as typed calls on
/// behalf of a verified identity. The hub applies the authority rules; errors keep its code.
pub(crate) mod hub_api {
    use worker::{Env, Headers, Method, Request, RequestInit, Response};
    use wuhu_core::wire::{
        CreateEnvironmentRequest, EnvironmentDefinition, ListEnvironmentsResponse,
        ListRunnersResponse, UpdateEnvironmentRequest,
    };

    use super::{expect_empty, expect_ok, hub, request_as, segment};
    use crate::http::{ApiError, ApiResult};
    use crate::identity::Identity;

    /// No body.
    const NONE: Option<&()> = None;

    async fn fetch(env: &Env, who: &Identity, request: Request) -> ApiResult<Response> {
        hub(env, &who.tenant)?
            .fetch_with_request(request)
            .await
            .map_err(|e| ApiError::new(503, super::UNREACHABLE, format!("no answer: {e}")))
    }

    /// Hands a runner's WebSocket upgrade (`GET /v1/runners/connect`) to its tenant's hub, with
    /// the runner's verified identity; the client's own `x-wuhu-*` and `authorization` headers
    /// are dropped. The answer (`101` with the socket, or an error) is passed through as is.
    /// `jti` is the runner token's, when it is revocable: the hub keeps it with the socket and
    /// closes the socket when the token is revoked.
    pub(crate) async fn connect(
        env: &Env,
        who: &Identity,
        req: &Request,
        jti: Option<&str>,
    ) -> ApiResult<Response> {
        let headers = Headers::new();
        for (name, value) in req.headers().entries() {
            if name != "authorization" && !name.starts_with("x-wuhu-") {
                headers.set(&name, &value)?;
            }
        }
        who.set_headers(&headers)?;
        if let Some(jti) = jti {
            headers.set(crate::identity::JTI_HEADER, jti)?;
        }
        let mut init = RequestInit::new();
        init.with_method(Method::Get).with_headers(headers);
        let internal = Request::new_with_init("https://hub/connect", &init)?;
        fetch(env, who, internal).await
    }

    /// `GET /v1/runners`.
    pub(crate) async fn list_runners(env: &Env, who: &Identity) -> ApiResult<ListRunnersResponse> {
        let request = request_as("hub", Method::Get, "/runners", who, NONE)?;
        expect_ok(fetch(env, who, request).await?).await
    }

    /// `DELETE /v1/runners/:owner/:name`.
    pub(crate) async fn free_runner(
        env: &Env,
        who: &Identity,
        owner: &str,
        name: &str,
    ) -> ApiResult<()> {
        let path = format!("/runners/{}/{}", segment(owner), segment(name));
        let request = request_as("hub", Method::Delete, &path, who, NONE)?;
        expect_empty(fetch(env, who, request).await?).await
    }

    /// `GET /v1/environments`.
    pub(crate) async fn list_environments(
        env: &Env,
        who: &Identity,
    ) -> ApiResult<ListEnvironmentsResponse> {
        let request = request_as("hub", Method::Get, "/environments", who, NONE)?;
        expect_ok(fetch(env, who, request).await?).await
    }

    /// `POST /v1/environments`.
    pub(crate) async fn create_environment(
        env: &Env,
        who: &Identity,
        body: &CreateEnvironmentRequest,
    ) -> ApiResult<EnvironmentDefinition> {
        let request = request_as("hub", Method::Post, "/environments", who, Some(body))?;
        expect_ok(fetch(env, who, request).await?).await
    }

    /// `GET /v1/environments/:idOrName`.
    pub(crate) async fn environment(
        env: &Env,
        who: &Identity,
        key: &str,
    ) -> ApiResult<EnvironmentDefinition> {
        let path = format!("/environments/{}", segment(key));
        let request = request_as("hub", Method::Get, &path, who, NONE)?;
        expect_ok(fetch(env, who, request).await?).await
    }

    /// `PATCH /v1/environments/:idOrName`.
    pub(crate) async fn update_environment(
        env: &Env,
        who: &Identity,
        key: &str,
        body: &UpdateEnvironmentRequest,
    ) -> ApiResult<EnvironmentDefinition> {
        let path = format!("/environments/{}", segment(key));
        let request = request_as("hub", Method::Patch, &path, who, Some(body))?;
        expect_ok(fetch(env, who, request).await?).await
    }

    /// `DELETE /v1/environments/:idOrName`.
    pub(crate) async fn delete_environment(env: &Env, who: &Identity, key: &str) -> ApiResult<()> {
        let path = format!("/environments/{}", segment(key));
        let request = request_as("hub", Method::Delete, &path, who, NONE)?;
        expect_empty(fetch(env, who, request).await?).await
    }
}
