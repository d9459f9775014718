//! Calls from the router (or another actor) to a session actor.

use worker::{Env, Stub};
use wuhu_core::wire::GetSessionResponse;

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::internal::expect_ok;

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
        .await
        .map_err(|e| ApiError::new(503, crate::internal::UNREACHABLE, format!("no answer: {e}")))?;
    expect_ok(resp).await
}
