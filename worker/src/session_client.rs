//! Calls from the router or another actor to a session's actor, as typed calls
//! (`wuhu_core::calls::session`): between a parent's and a child's actors, a fork's, the
//! tenant's index, a chat binding, the tools (see `docs/orchestration.md`).

use worker::{Env, Stub};
use wuhu_core::authority::ToolReaders;
use wuhu_core::calls::session::{
    ChildAdmission, ChildCreated, ChildEvent, ChildInit, ChildInput, CreateChild, CreateFork,
    Deleted, Dispose, ForgetSettings, ForkInit, GiveChildInput, Info, Prefix, PrefixPage,
    PrefixRequest, ReadFor, SessionInit, SlotHeld, Start, Stop, Transcript,
};
use wuhu_core::wire::{ChildStatus, GetSessionResponse, SessionInfo, StopResponse};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::internal;

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
    let call = Transcript {
        since_cursor: since,
        since_time: None,
        limit,
    };
    internal::call(&stub(env, &viewer.tenant, id)?, viewer, &call).await
}

/// A transcript page of session `id` as a session's tools read it for `readers` (what every
/// person the reading turn acts for may read; 404 otherwise).
pub(crate) async fn read_for(
    env: &Env,
    tenant: &str,
    readers: ToolReaders,
    id: &str,
    since: u64,
    limit: u64,
) -> ApiResult<GetSessionResponse> {
    let call = ReadFor {
        readers,
        page: Transcript {
            since_cursor: since,
            since_time: None,
            limit,
        },
    };
    internal::call(&stub(env, tenant, id)?, &Identity::system(tenant), &call).await
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
    let call = Prefix(PrefixRequest {
        since_cursor: since,
        limit,
        through,
    });
    internal::call(&stub(env, tenant, id)?, &Identity::system(tenant), &call).await
}

/// Creates fork `init.id`.
pub(crate) async fn fork_init(env: &Env, who: &Identity, init: ForkInit) -> ApiResult<SessionInfo> {
    let stub = stub(env, &init.tenant, &init.id)?;
    internal::call(&stub, who, &CreateFork(init)).await
}

/// Session `id` as `viewer` sees it (404 when they may not read it).
pub(crate) async fn info(env: &Env, viewer: &Identity, id: &str) -> ApiResult<SessionInfo> {
    internal::call(&stub(env, &viewer.tenant, id)?, viewer, &Info).await
}

/// Creates child session `init.id` (see [`ChildInit`]).
pub(crate) async fn init_child(
    env: &Env,
    init: SessionInit,
    child: ChildInit,
) -> ApiResult<ChildCreated> {
    let stub = stub(env, &init.tenant, &init.id)?;
    let who = Identity::system(&init.tenant);
    internal::call(&stub, &who, &CreateChild { init, child }).await
}

/// Gives child `id` input (`send_to_session`).
pub(crate) async fn child_input(
    env: &Env,
    tenant: &str,
    id: &str,
    input: ChildInput,
) -> ApiResult<ChildAdmission> {
    let who = Identity::system(tenant);
    internal::call(&stub(env, tenant, id)?, &who, &GiveChildInput(input)).await
}

/// Tells parent `parent` what became of its child.
pub(crate) async fn child_event(
    env: &Env,
    tenant: &str,
    parent: &str,
    status: &ChildStatus,
) -> ApiResult<bool> {
    let who = Identity::system(tenant);
    let call = ChildEvent(status.clone());
    Ok(internal::call(&stub(env, tenant, parent)?, &who, &call)
        .await?
        .accepted)
}

/// Deletes child or fork `id` as part of another session's deletion (no person is checked: that
/// deletion was authorised; decisions 0017, 0033). `Ok` once its deletion is finished; one
/// still deleting is an error, retried.
pub(crate) async fn dispose(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    let who = Identity::system(tenant);
    match internal::call(&stub(env, tenant, id)?, &who, &Dispose).await? {
        Deleted::Finished => Ok(()),
        Deleted::Continuing => Err(ApiError::new(
            503,
            "unavailable",
            format!("session {id} is still being deleted"),
        )),
    }
}

/// Tells child `id` that the gate granted it a slot: it runs the input it kept.
pub(crate) async fn start(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    let who = Identity::system(tenant);
    internal::call(&stub(env, tenant, id)?, &who, &Start)
        .await
        .map(|_| ())
}

/// Asks child `id` whether it still needs the gate slot it holds (the gate's reconciliation).
pub(crate) async fn slot_held(env: &Env, tenant: &str, id: &str) -> ApiResult<bool> {
    let who = Identity::system(tenant);
    internal::call(&stub(env, tenant, id)?, &who, &SlotHeld)
        .await
        .map(|holder| holder.running)
}

/// Tells session `id` that its tenant's settings changed: it forgets the reading it keeps
/// (`wuhu_core::tenant_config::SettingsCache`). Answered by any actor, a deleted one too.
pub(crate) async fn forget_settings(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    let who = Identity::system(tenant);
    internal::call(&stub(env, tenant, id)?, &who, &ForgetSettings)
        .await
        .map(|_| ())
}

/// Stops session `id` as `viewer` (with the authority check of a person's stop).
pub(crate) async fn stop(env: &Env, viewer: &Identity, id: &str) -> ApiResult<StopResponse> {
    internal::call(&stub(env, &viewer.tenant, id)?, viewer, &Stop).await
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
