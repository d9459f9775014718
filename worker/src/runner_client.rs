//! Calls from a session actor to its tenant's `RunnerHub` (through [`crate::internal`]).

use serde::Deserialize;
use worker::Env;
use wuhu_core::wire::runner::{RunnerMessage, ServerMessage};
use wuhu_core::wire::{ResolveEnvironmentRequest, RunnerPreference};

use crate::http::{ApiError, ApiResult};
use crate::internal;

/// What `/resolve` found for a spec.
#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Resolved {
    pub(crate) spec: wuhu_core::wire::runner::EnvironmentSpec,
    pub(crate) runner: String,
    pub(crate) runner_owner: String,
    pub(crate) runner_kind: wuhu_core::wire::runner::RunnerKind,
    pub(crate) approval: wuhu_core::wire::ApprovalPolicy,
    #[serde(default)]
    pub(crate) definition_id: Option<String>,
}

/// Resolves `spec` to an environment and a runner for `sub`'s session.
pub(crate) async fn resolve(
    env: &Env,
    tenant: &str,
    sub: &str,
    session_id: &str,
    spec: &str,
    preference: &str,
    name: Option<&str>,
) -> ApiResult<Resolved> {
    let preference: RunnerPreference =
        serde_json::from_value(serde_json::Value::String(preference.to_string()))
            .map_err(|e| ApiError::bad_request(format!("bad preference: {e}")))?;
    let request = ResolveEnvironmentRequest {
        spec: spec.to_string(),
        preference,
        name: name.map(str::to_string),
        session_id: session_id.to_string(),
    };
    internal::hub_post(env, tenant, sub, "/resolve", &request).await
}

/// Sends `message` to a runner and waits for its answer. Returns the runner's connection epoch
/// (it changes when the runner reconnects) and the answer (`None` for `cancel`).
pub(crate) async fn call(
    env: &Env,
    tenant: &str,
    sub: &str,
    runner: &str,
    owner: &str,
    message: &ServerMessage,
    timeout_ms: u64,
) -> ApiResult<(u64, Option<RunnerMessage>)> {
    let reply =
        internal::runner_call(env, tenant, sub, runner, owner, message, Some(timeout_ms)).await?;
    Ok((reply.epoch, reply.response))
}

/// Asks the runner to stop tool call `id` (it kills the command's process group). The hub
/// forwards it even when no `/call` waits for that id (after a restart of the session or the
/// hub), and a runner that does not know the id ignores it.
pub(crate) async fn cancel(
    env: &Env,
    tenant: &str,
    sub: &str,
    runner: &str,
    owner: &str,
    id: &str,
) -> ApiResult<()> {
    let message = ServerMessage::Cancel { id: id.to_string() };
    internal::runner_call(env, tenant, sub, runner, owner, &message, None)
        .await
        .map(|_| ())
}
