//! Calls from the router (or another actor) to a session actor.

use serde::de::DeserializeOwned;
use worker::{Env, Response, Stub};
use wuhu_core::wire::{ErrorBody, GetSessionResponse};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};

/// Whether `id` looks like a session id (a UUID). Anything else is simply not found.
pub(crate) fn valid_session_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The actor of session `id` of `tenant`. The tenant is part of the name, so one tenant can
/// never reach another tenant's session: the id names a different, empty actor.
pub(crate) fn stub(env: &Env, tenant: &str, id: &str) -> ApiResult<Stub> {
    if !valid_session_id(id) {
        return Err(ApiError::not_found("session not found"));
    }
    Ok(env
        .durable_object("SESSIONS")?
        .id_from_name(&format!("{tenant}/{id}"))?
        .get_stub()?)
}

/// Decodes a 2xx JSON reply, or turns an error reply back into an [`ApiError`].
pub(crate) async fn expect_ok<T: DeserializeOwned>(mut resp: Response) -> ApiResult<T> {
    let status = resp.status_code();
    let text = resp.text().await?;
    if (200..300).contains(&status) {
        serde_json::from_str(&text)
            .map_err(|e| ApiError::internal(format!("bad internal reply: {e}")))
    } else {
        let message = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.error.message)
            .unwrap_or(text);
        Err(ApiError {
            status,
            code: code_for(status),
            message,
        })
    }
}

fn code_for(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        404 => "not_found",
        409 => "conflict",
        413 => "payload_too_large",
        429 => "queue_full",
        _ => "internal",
    }
}

/// A transcript page of another session of `viewer`'s tenant, as `viewer` may read it.
pub(crate) async fn transcript(
    env: &Env,
    viewer: &Identity,
    id: &str,
    since: u64,
    limit: u64,
) -> ApiResult<GetSessionResponse> {
    let url = format!("https://session/transcript?sinceCursor={since}&limit={limit}");
    let headers = worker::Headers::new();
    viewer.set_headers(&headers)?;
    let mut init = worker::RequestInit::new();
    init.with_method(worker::Method::Get).with_headers(headers);
    let req = worker::Request::new_with_init(&url, &init)?;
    let resp = stub(env, &viewer.tenant, id)?
        .fetch_with_request(req)
        .await?;
    expect_ok(resp).await
}
