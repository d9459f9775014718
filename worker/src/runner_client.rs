//! Calls from a session actor to its tenant's `RunnerHub` (`wuhu_core::calls::hub`).

use worker::Env;
use wuhu_core::calls::hub::{CallRunner, Resolve};
use wuhu_core::jobs::JobRecord;
use wuhu_core::wire::runner::{
    EnvironmentContext, EnvironmentKind, RunnerMessage, ServerMessage, Snapshot,
};
use wuhu_core::wire::{
    ResolveEnvironmentRequest, ResolveEnvironmentResponse, RunnerCallRequest, RunnerCallResponse,
    RunnerPreference,
};

use crate::http::{ApiError, ApiResult};
use crate::identity::Identity;
use crate::internal;

/// Resolves `spec` to an environment and a runner for `sub`'s session.
pub(crate) async fn resolve(
    env: &Env,
    tenant: &str,
    sub: &str,
    session_id: &str,
    spec: &str,
    preference: &str,
    name: Option<&str>,
) -> ApiResult<ResolveEnvironmentResponse> {
    let preference: RunnerPreference =
        serde_json::from_value(serde_json::Value::String(preference.to_string()))
            .map_err(|e| ApiError::bad_request(format!("bad preference: {e}")))?;
    let call = Resolve(ResolveEnvironmentRequest {
        spec: spec.to_string(),
        preference,
        name: name.map(str::to_string),
        session_id: session_id.to_string(),
    });
    internal::call(&internal::hub(env, tenant)?, &acting(tenant, sub), &call).await
}

/// The identity a session's call to the hub carries: the person the session acts for.
fn acting(tenant: &str, sub: &str) -> Identity {
    Identity {
        sub: sub.to_string(),
        ..Identity::system(tenant)
    }
}

/// Sends `message` to `owner`'s runner `runner` and waits for its answer (`None` for `cancel`).
async fn runner_call(
    env: &Env,
    tenant: &str,
    sub: &str,
    runner: &str,
    owner: &str,
    message: &ServerMessage,
    timeout_ms: Option<u64>,
) -> ApiResult<RunnerCallResponse> {
    let call = CallRunner(RunnerCallRequest {
        runner: runner.to_string(),
        owner: owner.to_string(),
        message: message.clone(),
        timeout_ms,
    });
    internal::call(&internal::hub(env, tenant)?, &acting(tenant, sub), &call).await
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
    let reply = runner_call(env, tenant, sub, runner, owner, message, Some(timeout_ms)).await?;
    Ok((reply.epoch, reply.response))
}

/// Asks the runner to stop tool call `id` (it kills the command's process group). The hub
/// forwards it even when no call waits for that id (after a restart of the session or the
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
    runner_call(env, tenant, sub, runner, owner, &message, None)
        .await
        .map(|_| ())
}

/// How long one question about a job waits for the runner's answer.
const JOB_QUESTION_TIMEOUT_MS: u64 = 20_000;

/// The environment context a job request carries: the runner answers `job_status` from its
/// own records and reads none of it.
fn job_context(record: &JobRecord) -> EnvironmentContext {
    EnvironmentContext {
        name: record.environment.clone(),
        kind: EnvironmentKind::Local,
        root: String::from("/"),
        snapshot: Snapshot {
            cwd: String::new(),
            env: Default::default(),
            captured_at: 0,
        },
        repo_path: None,
        branch: None,
        cell: Default::default(),
    }
}

/// Asks `record`'s runner how its job stands (the session's owner asks).
pub(crate) async fn ask_job(
    env: &worker::Env,
    tenant: &str,
    owner: &str,
    session_id: &str,
    record: &JobRecord,
    tool: &str,
) -> ApiResult<RunnerMessage> {
    let message = ServerMessage::ToolCall {
        id: uuid::Uuid::new_v4().to_string(),
        session_id: session_id.to_string(),
        environment: job_context(record),
        tool: tool.to_string(),
        arguments: serde_json::json!({ "id": record.job_id }),
        timeout_ms: Some(JOB_QUESTION_TIMEOUT_MS),
        upload: None,
        secret_env: Default::default(),
    };
    let (_, answer) = call(
        env,
        tenant,
        owner,
        &record.runner,
        &record.runner_owner,
        &message,
        JOB_QUESTION_TIMEOUT_MS,
    )
    .await?;
    answer.ok_or_else(|| ApiError::internal("the runner gave no answer"))
}
