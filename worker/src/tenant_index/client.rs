//! The calls the tenant's other actors and the router send its index
//! (`wuhu_core::calls::index`).

use worker::Env;
use wuhu_core::authority::ToolReaders;
use wuhu_core::calls::Call;
use wuhu_core::calls::index::{
    GateAnswer, GateRelease, GateRequest, GetBudget, HoldSettings, Index, List, LlmLogsWritten,
    Remove, ReportUsage, SealedSecrets, Tree, Upsert,
};
use wuhu_core::deletion::TreeRow;
use wuhu_core::orchestration::Slot;
use wuhu_core::tenant_usage::{self, TenantBudget, UsageReport};
use wuhu_core::wire::{ListSessionsResponse, SessionInfo};

use crate::auth::Identity;
use crate::http::ApiResult;
use crate::internal;

/// Tells the index that a session of the tenant wrote request logs, so its sweep of expired
/// ones runs (see `TenantIndex::sweep_llm_logs`).
pub(crate) async fn llm_logs_written(env: &Env, tenant: &str) -> ApiResult<()> {
    system_call(env, tenant, &LlmLogsWritten).await.map(|_| ())
}

/// Tells the index what a session's requests used (see `wuhu_core::tenant_usage`); the answer
/// carries the tenant's budget with the report counted.
pub(crate) async fn report_usage(
    env: &Env,
    tenant: &str,
    report: &UsageReport,
) -> ApiResult<tenant_usage::ReportAnswer> {
    system_call(env, tenant, &ReportUsage(report.clone())).await
}

/// Asks the index to hold `session` as keeping a reading of the tenant's settings (see
/// `wuhu_core::tenant_config::SettingsCache`); `false`: refused (too many holders).
pub(crate) async fn hold_settings(env: &Env, tenant: &str, session: &str) -> ApiResult<bool> {
    let call = HoldSettings {
        session: session.to_string(),
    };
    Ok(system_call(env, tenant, &call).await?.held)
}

/// The tenant's budget and what it spent (for a session before a step's request, when
/// `tenant_usage::must_ask_budget` says so).
pub(crate) async fn budget(env: &Env, tenant: &str) -> ApiResult<TenantBudget> {
    system_call(env, tenant, &GetBudget).await
}

/// The tenant's secrets, sealed (for a session's settings reading: what its calls may use and
/// what it masks).
pub(crate) async fn sealed_secrets(
    env: &Env,
    tenant: &str,
) -> ApiResult<Vec<wuhu_core::secrets::SealedSecret>> {
    system_call(env, tenant, &SealedSecrets).await
}

/// Refreshes a session in its tenant's index (never a deleted one).
pub(crate) async fn upsert(env: &Env, tenant: &str, info: &SessionInfo) -> ApiResult<()> {
    let call = Upsert {
        info: info.clone(),
        created: false,
    };
    system_call(env, tenant, &call).await.map(|_| ())
}

/// Records a new session in its tenant's index.
pub(crate) async fn create(env: &Env, tenant: &str, info: &SessionInfo) -> ApiResult<()> {
    let call = Upsert {
        info: info.clone(),
        created: true,
    };
    system_call(env, tenant, &call).await.map(|_| ())
}

/// Lists the sessions of `tenant` that `readers` may see (a session's tools), newest first.
pub(crate) async fn list_for(
    env: &Env,
    tenant: &str,
    readers: ToolReaders,
    limit: u32,
    before: Option<&str>,
) -> ApiResult<ListSessionsResponse> {
    let call = List {
        limit,
        before: before.map(str::to_string),
        parent_id: None,
        readers: Some(readers),
    };
    system_call(env, tenant, &call).await
}

/// Asks the tenant's gate for a slot for `slot.child`.
pub(crate) async fn gate_request(env: &Env, tenant: &str, slot: &Slot) -> ApiResult<GateAnswer> {
    system_call(env, tenant, &GateRequest(slot.clone())).await
}

/// Frees `child`'s slot (or its place in line), when it was granted before `granted_before`
/// if that is given; returns the spawns granted in its stead.
pub(crate) async fn gate_release(
    env: &Env,
    tenant: &str,
    child: &str,
    granted_before: Option<u64>,
) -> ApiResult<Vec<Slot>> {
    let call = GateRelease {
        child: child.to_string(),
        granted_before,
    };
    system_call(env, tenant, &call).await
}

/// Removes a deleted session from its tenant's list (for good: see `deleted_sessions`).
pub(crate) async fn remove(env: &Env, tenant: &str, id: &str) -> ApiResult<()> {
    let call = Remove { id: id.to_string() };
    system_call(env, tenant, &call).await.map(|_| ())
}

/// The listed children and forks of the tenant: a deletion takes a session's forks with it
/// (`wuhu_core::deletion::forks_of`). One row per child or fork of the tenant.
pub(crate) async fn tree(env: &Env, tenant: &str) -> ApiResult<Vec<TreeRow>> {
    system_call(env, tenant, &Tree).await
}

/// A call of the tenant's own actors to its index.
async fn system_call<C: Call<Target = Index>>(
    env: &Env,
    tenant: &str,
    call: &C,
) -> ApiResult<C::Reply> {
    let who = Identity::system(tenant);
    internal::call(&internal::tenant_index(env, tenant)?, &who, call).await
}
