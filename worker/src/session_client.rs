//! Calls from the router (or another actor) to a session actor, with the typed bodies of its
//! internal routes (`/init`, and between a parent's and a child's actors `/child_input`,
//! `/child_event`, `/start`, `/dispose`; see `docs/orchestration.md`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use worker::{Env, Stub};
use wuhu_core::authority::Access;
use wuhu_core::environments::Attachment;
use wuhu_core::orchestration::Lineage;
use wuhu_core::wire::{
    ChildLifecycle, ChildStatus, Entry, EntryPayload, ForkedFrom, GetSessionResponse, Lane,
    SessionInfo, StopResponse,
};

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

/// Body of a session actor's internal `POST /init`: from the router (a person creates a
/// session) or from a parent's `spawn_session` (then `child` is set).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InitRequest {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) created_by: String,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) system_prompt: Option<String>,
    pub(crate) title: Option<String>,
    /// `{path, version, content}` of the user's global context document.
    pub(crate) global_context: Option<GlobalContext>,
    /// The budget it starts with (`POST /v1/sessions {budget}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) budget: Option<wuhu_core::wire::Budget>,
    /// For a child session: where it sits, what it inherits and its task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) child: Option<ChildInit>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct GlobalContext {
    pub(crate) path: String,
    pub(crate) version: String,
    pub(crate) content: String,
}

/// What a child session is born with.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChildInit {
    pub(crate) lineage: Lineage,
    /// The parent's access (a child has the same).
    pub(crate) access: Access,
    /// Environments it starts with (`environment: "inherit"`).
    pub(crate) attachments: Vec<Attachment>,
    /// Its first message, sent by `created_by` through the concurrency gate.
    pub(crate) task: String,
    /// Entries its transcript starts with: the notice and AGENTS.md of an environment made for
    /// it (`environment: <spec>`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) entries: Vec<EntryPayload>,
}

/// A message for a child (`send_to_session`), through the gate when the child is settled.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChildInput {
    pub(crate) content: String,
    pub(crate) lane: Lane,
    pub(crate) author: String,
}

/// Where a child is after it was given input: `created` or `running` when it holds a slot,
/// `queued` when it waits for one. `cursor` orders it among the child's reports.
#[derive(Serialize, Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChildAdmission {
    #[serde(flatten)]
    pub(crate) lifecycle: ChildLifecycle,
    pub(crate) cursor: u64,
}

/// A child's `/init` answer.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChildCreated {
    pub(crate) session: SessionInfo,
    pub(crate) admission: ChildAdmission,
}

/// `POST`s `body` to the internal route `path` of session `id`, as `sub`.
async fn post<B: Serialize, T: DeserializeOwned>(
    env: &Env,
    tenant: &str,
    sub: &str,
    id: &str,
    path: &str,
    body: &B,
) -> ApiResult<T> {
    let request = crate::internal::post_request("session", path, tenant, sub, body)?;
    crate::internal::send(&stub(env, tenant, id)?, request).await
}

/// Body of a fork's internal `POST /fork_init`: from the router, once the person may read the
/// session forked (anyone may create sessions).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ForkInit {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) created_by: String,
    pub(crate) title: Option<String>,
    pub(crate) from: ForkedFrom,
}

/// Body of a session's internal `POST /prefix` (between actors: a fork reads its history).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PrefixRequest {
    pub(crate) since_cursor: u64,
    pub(crate) limit: u64,
    /// The last cursor of the history.
    pub(crate) through: u64,
}

/// A page of a history: entries after `since_cursor` and at most `through`, contiguous.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PrefixPage {
    pub(crate) entries: Vec<Entry>,
    pub(crate) next_cursor: Option<u64>,
}

/// Entries of session `id` after `since` and at most `through` (at most `limit`, a page's
/// bytes), read without an authority check: for a fork's actor only.
pub(crate) async fn prefix(
    env: &Env,
    tenant: &str,
    id: &str,
    since: u64,
    limit: u64,
    through: u64,
) -> ApiResult<PrefixPage> {
    let request = PrefixRequest {
        since_cursor: since,
        limit,
        through,
    };
    post(env, tenant, "wuhu", id, "/prefix", &request).await
}

/// Creates fork `init.id`.
pub(crate) async fn fork_init(env: &Env, init: &ForkInit) -> ApiResult<SessionInfo> {
    post(
        env,
        &init.tenant,
        &init.created_by,
        &init.id,
        "/fork_init",
        init,
    )
    .await
}

/// Session `id` as `viewer` sees it (404 when they may not read it).
pub(crate) async fn info(env: &Env, viewer: &Identity, id: &str) -> ApiResult<SessionInfo> {
    let headers = worker::Headers::new();
    viewer.set_headers(&headers)?;
    let mut init = worker::RequestInit::new();
    init.with_method(worker::Method::Get).with_headers(headers);
    let req = worker::Request::new_with_init("https://session/info", &init)?;
    crate::internal::send(&stub(env, &viewer.tenant, id)?, req).await
}

/// Creates child session `init.id` (see [`ChildInit`]).
pub(crate) async fn init_child(env: &Env, init: &InitRequest) -> ApiResult<ChildCreated> {
    post(env, &init.tenant, &init.created_by, &init.id, "/init", init).await
}

/// Gives child `id` input (`send_to_session`).
pub(crate) async fn child_input(
    env: &Env,
    tenant: &str,
    id: &str,
    input: &ChildInput,
) -> ApiResult<ChildAdmission> {
    post(env, tenant, &input.author, id, "/child_input", input).await
}

/// Tells parent `parent` what became of its child.
pub(crate) async fn child_event(
    env: &Env,
    tenant: &str,
    parent: &str,
    status: &ChildStatus,
) -> ApiResult<serde_json::Value> {
    post(env, tenant, "wuhu", parent, "/child_event", status).await
}

/// Deletes child `id` as its parent's deletion (`POST /dispose`: no person is checked; the
/// parent's deletion was authorised and checked the forks of the whole tree). `Ok` once the
/// child's deletion is finished; a child still deleting (202) is an error, retried.
pub(crate) async fn dispose(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    let request = crate::internal::post_request("session", "/dispose", tenant, "wuhu", &())?;
    let response = stub(env, tenant, id)?
        .fetch_with_request(request)
        .await
        .map_err(|e| ApiError::new(503, "unavailable", format!("no answer: {e}")))?;
    if response.status_code() == 202 {
        return Err(ApiError::new(
            503,
            "unavailable",
            format!("child {id} is still being deleted"),
        ));
    }
    crate::internal::expect_empty(response).await
}

/// Tells child `id` that the gate granted it a slot: it runs the input it kept.
pub(crate) async fn start(env: &Env, tenant: &str, id: &str) -> ApiResult<serde_json::Value> {
    post(env, tenant, "wuhu", id, "/start", &serde_json::json!({})).await
}

/// Tells session `id` that its tenant's settings changed: it forgets the reading it keeps
/// (`wuhu_core::tenant_config::SettingsCache`). Answered by any actor, a deleted one too.
pub(crate) async fn forget_settings(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    post(
        env,
        tenant,
        "wuhu",
        id,
        "/settings/forget",
        &serde_json::json!({}),
    )
    .await
    .map(|_: serde_json::Value| ())
}

/// Stops session `id` as `viewer` (the `/stop` route, with its authority check).
pub(crate) async fn stop(env: &Env, viewer: &Identity, id: &str) -> ApiResult<StopResponse> {
    let headers = worker::Headers::new();
    viewer.set_headers(&headers)?;
    let mut init = worker::RequestInit::new();
    init.with_method(worker::Method::Post).with_headers(headers);
    let req = worker::Request::new_with_init("https://session/stop", &init)?;
    crate::internal::send(&stub(env, &viewer.tenant, id)?, req).await
}

/// The configured orchestration limits (`WUHU_MAX_CHILDREN`, `WUHU_MAX_RUNNING_SESSIONS`,
/// `WUHU_MAX_SESSION_DEPTH`).
pub(crate) fn orchestration_limits(env: &Env) -> wuhu_core::orchestration::Limits {
    wuhu_core::orchestration::Limits::from_vars(|name| env.var(name).ok().map(|v| v.to_string()))
}

/// Tells each child the gate granted a slot to that it may run.
pub(crate) async fn start_granted(
    env: &Env,
    tenant: &str,
    granted: Vec<wuhu_core::orchestration::Slot>,
) {
    for slot in granted {
        if let Err(e) = start(env, tenant, &slot.child).await {
            worker::console_error!("starting child {} failed: {}", slot.child, e.message);
        }
    }
}
