//! Calls from a session actor to its tenant's `RunnerHub`.

use serde::Deserialize;
use serde_json::{Value, json};
use worker::{Env, Headers, Method, Request, RequestInit, Stub};
use wuhu_core::wire::runner::{RunnerMessage, ServerMessage};

use crate::http::ApiResult;
use crate::session_client::expect_ok;

fn stub(env: &Env, tenant: &str) -> ApiResult<Stub> {
    Ok(env
        .durable_object("RUNNERS")?
        .id_from_name(tenant)?
        .get_stub()?)
}

async fn post(env: &Env, tenant: &str, sub: &str, path: &str, body: &Value) -> ApiResult<Value> {
    let headers = Headers::new();
    headers.set("x-wuhu-tenant", tenant)?;
    headers.set("x-wuhu-sub", sub)?;
    headers.set("content-type", "application/json")?;
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(wasm_bindgen::JsValue::from_str(&body.to_string())));
    let request = Request::new_with_init(&format!("https://hub{path}"), &init)?;
    let response = stub(env, tenant)?.fetch_with_request(request).await?;
    expect_ok(response).await
}

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
    let body =
        json!({"spec": spec, "preference": preference, "name": name, "sessionId": session_id});
    let value = post(env, tenant, sub, "/resolve", &body).await?;
    serde_json::from_value(value)
        .map_err(|e| crate::http::ApiError::internal(format!("bad resolve reply: {e}")))
}

#[derive(Deserialize)]
struct CallReply {
    epoch: u64,
    response: Option<RunnerMessage>,
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
    let body =
        json!({"runner": runner, "owner": owner, "message": message, "timeoutMs": timeout_ms});
    let value = post(env, tenant, sub, "/call", &body).await?;
    let reply: CallReply = serde_json::from_value(value)
        .map_err(|e| crate::http::ApiError::internal(format!("bad call reply: {e}")))?;
    Ok((reply.epoch, reply.response))
}
