//! Calls between Durable Objects: the one way a typed call (`wuhu_core::calls`) is sent, and
//! the one way a callee reads it and answers. No path is spelled out anywhere else: a caller
//! names the call's type, the callee matches on its Durable Object's call enum.
//!
//! Identity travels in `x-wuhu-tenant` / `x-wuhu-sub` / `x-wuhu-role`, set only from a
//! verified token or by an actor on its own behalf ([`Identity::system`]). An error reply keeps
//! the callee's status and `code` (a hub's `502 runner_disconnected` stays
//! `runner_disconnected` in the session, never `internal`). When the callee cannot be reached
//! at all (its stub's `fetch` failed: the object was reset, redeployed or overloaded), the
//! error is `503 unreachable`, so a caller can tell "it answered no" from "nobody answered".

use std::borrow::Cow;

use serde::Serialize;
use worker::{Env, Headers, Method, Request, RequestInit, Response, Stub};
use wuhu_core::calls::{CALL_HEADER, Call, CallEnum, CallError, Streamed, Target, Upgrade};
use wuhu_core::wire::ErrorBody;

use crate::http::{ApiError, ApiResult, json_response};
use crate::identity::Identity;

/// Code of an error where the callee gave no answer (its `fetch` failed).
pub(crate) const UNREACHABLE: &str = "unreachable";

/// Codes the runner hub's [`wuhu_core::calls::hub::CallRunner`] answers with; see `docs/api.md`.
pub(crate) mod codes {
    /// 503: the runner has no live connection; the request was not sent.
    pub(crate) const RUNNER_NOT_CONNECTED: &str = "runner_not_connected";
    /// 502: the runner's connection closed (or was replaced) while the request waited.
    pub(crate) const RUNNER_DISCONNECTED: &str = "runner_disconnected";
    /// 504: the runner did not answer within the call's timeout (the hub sent `cancel`).
    pub(crate) const TIMEOUT: &str = "timeout";
}

/// Largest call body a Durable Object reads: a public body of `http::MAX_BODY_BYTES` grows a
/// little when the router wraps it in its call (and JSON escapes may be re-written), so the
/// bound between actors is larger than the public one.
pub(crate) const MAX_CALL_BYTES: usize = 4 * crate::http::MAX_BODY_BYTES;

// Each function generic over the call only encodes it (and decodes its reply) and hands bytes to
// one non-generic future (`post`, `upgrade_with`): the Worker's size is budgeted, and a generic
// `async fn` would be a state machine of its own for every call type.

/// Sends `call` to `stub` on behalf of `who` and decodes its reply.
pub(crate) async fn call<C: Call>(stub: &Stub, who: &Identity, call: &C) -> ApiResult<C::Reply> {
    let reply = reply_bytes(post(stub, who, url::<C>(), encode(call)?).await?).await?;
    serde_json::from_slice(&reply)
        .map_err(|e| ApiError::internal(format!("bad internal reply: {e}")))
}

/// Sends `call` to `stub` and hands back the callee's response as it is: a reply of type
/// `C::Reply` (or an error) that the router passes to its client without decoding it again.
pub(crate) async fn relay<C: Call>(stub: &Stub, who: &Identity, call: &C) -> ApiResult<Response> {
    post(stub, who, url::<C>(), encode(call)?).await
}

/// [`relay`] for a call of a Durable Object's call enum (a decoded public call).
pub(crate) async fn relay_any<E: CallEnum>(
    stub: &Stub,
    who: &Identity,
    call: &E,
) -> ApiResult<Response> {
    let url = format!("https://{}/{}", <E::Target as Target>::HOST, call.name());
    let body = call
        .to_json()
        .map_err(|e| ApiError::internal(format!("encoding an internal call: {e}")))?;
    post(stub, who, url, body).await
}

/// Sends a call whose answer is a stream: the callee's response passes through.
pub(crate) async fn stream<C: Call<Reply = Streamed>>(
    stub: &Stub,
    who: &Identity,
    call: &C,
) -> ApiResult<Response> {
    post(stub, who, url::<C>(), encode(call)?).await
}

/// Hands a client's WebSocket upgrade to `stub` as `call`: the client's own headers go along
/// (the upgrade needs them) except its credentials and any `x-wuhu-*`; the call travels in
/// [`CALL_HEADER`]. The answer (`101` with the socket, or an error) passes through.
pub(crate) async fn upgrade<C: Upgrade>(
    stub: &Stub,
    who: &Identity,
    client: &Request,
    call: &C,
) -> ApiResult<Response> {
    upgrade_with(stub, who, client, url::<C>(), encode(call)?).await
}

async fn upgrade_with(
    stub: &Stub,
    who: &Identity,
    client: &Request,
    url: String,
    call: String,
) -> ApiResult<Response> {
    let headers = Headers::new();
    for (name, value) in client.headers().entries() {
        if name != "authorization" && name != "cookie" && !name.starts_with("x-wuhu-") {
            headers.set(&name, &value)?;
        }
    }
    who.set_headers(&headers)?;
    headers.set(CALL_HEADER, &call)?;
    let mut init = RequestInit::new();
    init.with_method(Method::Get).with_headers(headers);
    let request = Request::new_with_init(&url, &init)?;
    fetch(stub, request).await
}

/// `POST url` with `body` (a call's JSON) on behalf of `who`.
async fn post(stub: &Stub, who: &Identity, url: String, body: String) -> ApiResult<Response> {
    let headers = Headers::new();
    who.set_headers(&headers)?;
    headers.set("content-type", "application/json")?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
    let request = Request::new_with_init(&url, &init)?;
    fetch(stub, request).await
}

fn url<C: Call>() -> String {
    format!("https://{}/{}", <C::Target as Target>::HOST, C::NAME)
}

fn encode<T: Serialize>(value: &T) -> ApiResult<String> {
    serde_json::to_string(value)
        .map_err(|e| ApiError::internal(format!("encoding an internal call: {e}")))
}

async fn fetch(stub: &Stub, request: Request) -> ApiResult<Response> {
    stub.fetch_with_request(request)
        .await
        .map_err(|e| ApiError::new(503, UNREACHABLE, format!("no answer: {e}")))
}

/// The name and JSON of the call `req` carries: its path without the `/`, and its body (at
/// most [`MAX_CALL_BYTES`]) or, for an upgrade, [`CALL_HEADER`].
pub(crate) async fn call_parts(req: &mut Request) -> ApiResult<(String, Vec<u8>)> {
    let name = req.path().trim_start_matches('/').to_string();
    if let Some(header) = req.headers().get(CALL_HEADER).ok().flatten() {
        return Ok((name, header.into_bytes()));
    }
    let body = crate::http::read_body_bounded(req, MAX_CALL_BYTES).await?;
    Ok((name, body))
}

/// A call the callee could not decode, as the API answers it.
pub(crate) fn call_error(error: CallError) -> ApiError {
    let (status, code) = error.status_and_code();
    ApiError::new(status, code, error.to_string())
}

/// The callee's answer to `call`: its reply as JSON, `200`. The type ties the answer to the
/// call (a handler cannot answer a call with another call's reply).
pub(crate) fn reply<C: Call>(_call: &C, value: &C::Reply) -> Response {
    json_response(200, value)
}

/// The body of a 2xx reply, or the error reply turned back into an [`ApiError`] with the
/// callee's status, code and message.
async fn reply_bytes(mut resp: Response) -> ApiResult<Vec<u8>> {
    let status = resp.status_code();
    let retry_after = resp.headers().get("retry-after").ok().flatten();
    let bytes = resp.bytes().await?;
    if (200..300).contains(&status) {
        return Ok(bytes);
    }
    Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(body) => ApiError {
            status,
            code: Cow::Owned(body.error.code),
            message: body.error.message,
            retry_after: retry_after.and_then(|v| v.trim().parse().ok()),
        },
        // Not one of our error bodies (the runtime answered for the callee): keep the text.
        Err(_) => ApiError::new(
            status,
            code_for(status),
            String::from_utf8_lossy(&bytes).into_owned(),
        ),
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
    named_stub(env, "TENANTS", tenant)
}

/// The tenant's runner hub (`RunnerHub`, one per tenant).
pub(crate) fn hub(env: &Env, tenant: &str) -> ApiResult<Stub> {
    named_stub(env, "RUNNERS", tenant)
}

/// The tenant's token registry (`TokenRegistry`, one per tenant).
pub(crate) fn token_registry(env: &Env, tenant: &str) -> ApiResult<Stub> {
    named_stub(env, "TOKENS", tenant)
}

fn named_stub(env: &Env, binding: &str, name: &str) -> ApiResult<Stub> {
    Ok(env
        .durable_object(binding)?
        .id_from_name(name)?
        .get_stub()?)
}
