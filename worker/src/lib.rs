//! # wuhu-worker
//!
//! The Cloudflare host of Wuhu. The fetch handler authenticates and routes; five Durable
//! Object classes hold state: [`session_actor::SessionActor`] (one per session: transcript,
//! lanes, the agent loop), [`tenant_index::TenantIndex`] (one per tenant: the session list, the
//! concurrency gate, usage and budgets, settings holders), [`runner_hub::RunnerHub`] (one per
//! tenant: runners and environment definitions), [`token_registry::TokenRegistry`] (one per
//! tenant: revocable credentials) and [`channels::ChannelActor`] (one registry per tenant, one
//! per chat binding). They talk only through typed calls (`wuhu_core::calls`, sent by
//! [`internal`]). Session meaning lives in `wuhu-core`; this crate turns its effects into I/O
//! (SQLite, R2, `fetch`, alarms, SSE, WebSockets).

mod access;
mod auth;
mod blob_store;
mod builtin_tools;
mod channels;
mod cors;
mod environment_tools;
mod http;
mod identity;
mod internal;
mod js_tool;
mod llm_logs;
mod mcp;
mod mcp_client;
mod mcp_oauth;
mod mcp_turn;
mod model_choice;
mod model_tool;
mod observe;
mod orchestration_tools;
mod policy_book;
mod policy_gate;
mod rate_limit;
mod runner_calls;
mod runner_client;
mod runner_hub;
mod schema;
mod secrets;
mod session_actor;
mod session_client;
mod signin;
mod tenant_index;
mod token_registry;
mod tool_context;
mod webcrypto;
mod workspace_io;

use worker::{Context, Env, Headers, Method, Request, Response, event};
use wuhu_core::authority::WorkspaceWriter;
use wuhu_core::calls::hub::HubCall;
use wuhu_core::calls::index::IndexCall;
use wuhu_core::calls::session::{Deleted, Needs, SessionCall, SessionInit};
use wuhu_core::calls::{self, Method as CallMethod};
use wuhu_core::rate_limits::RateAction;
use wuhu_core::wire::{CreateSessionRequest, OkResponse};

use crate::auth::{Authenticated, Identity, TokenKind, authenticate};
use crate::http::{
    ApiError, ApiResult, json_response, parse_json, query, query_pairs, query_u64, read_body,
};

pub use channels::ChannelActor;
pub use runner_hub::RunnerHub;
pub use session_actor::SessionActor;
pub use tenant_index::TenantIndex;
pub use token_registry::TokenRegistry;

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> worker::Result<Response> {
    let started = worker::Date::now().as_millis();
    let request_id = uuid::Uuid::new_v4().to_string();
    let method = req.method().to_string();
    let path = req.path();
    let mut caller: Option<Identity> = None;
    let cors_origin = cors::listed_origin(&req, &env);
    let outcome = match cors::preflight(&req, &env) {
        Some(answer) => answer,
        None => route(req, env, &mut caller).await,
    };
    let (response, error_code): (Response, Option<String>) = match outcome {
        Ok(response) => (response, None),
        Err(error) => {
            let code = error.code.to_string();
            (error.into_response(), Some(code))
        }
    };
    observe::RequestLine {
        request_id: &request_id,
        method: &method,
        path: &path,
        tenant: caller.as_ref().map(|c| c.tenant.as_str()),
        sub: caller.as_ref().map(|c| c.sub.as_str()),
        status: response.status_code(),
        error_code: error_code.as_deref(),
        duration_ms: worker::Date::now().as_millis().saturating_sub(started),
    }
    .emit();
    // Every answer but a WebSocket upgrade carries the request id. Responses forwarded from an
    // actor have immutable headers, so they get a copy.
    if response.status_code() == 101 {
        return Ok(response);
    }
    let headers = Headers::new();
    for (name, value) in response.headers().entries() {
        let _ = headers.append(&name, &value);
    }
    let _ = headers.set("x-request-id", &request_id);
    if let Some(origin) = &cors_origin {
        cors::decorate(&headers, origin);
    }
    Ok(response.with_headers(headers))
}

async fn route(mut req: Request, env: Env, caller: &mut Option<Identity>) -> ApiResult<Response> {
    let path = req.path();
    let method = req.method();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if segments.as_slice() == ["healthz"] {
        return match method {
            Method::Get | Method::Head => Ok(json_response(200, &OkResponse { ok: true })),
            _ => Err(method_not_allowed()),
        };
    }
    // The API's description is public, like the repository's docs/openapi.json it is.
    if segments.as_slice() == ["v1", "openapi.json"] {
        return match method {
            Method::Get | Method::Head => openapi_response(&env).await,
            _ => Err(method_not_allowed()),
        };
    }
    if segments.first() == Some(&"hooks") {
        return channels::hook(req, &env, &segments).await;
    }
    // Wuhu as an MCP server: authenticated as every /v1 route is; its tools are /v1 requests.
    if segments.as_slice() == ["mcp"] {
        let authenticated = authenticate(&req, &env, TokenKind::User).await?;
        *caller = Some(authenticated.identity.clone());
        return mcp::route(req, &env, route_again).await;
    }
    if segments.first() != Some(&"v1") {
        return Err(ApiError::not_found("no such route"));
    }
    // A blob upload authenticates by its URL's signature (issued to a runner with a tool call).
    if segments.as_slice() == ["v1", "blobs", "upload"] {
        return match method {
            Method::Put => blob_store::upload_route(&req, &env).await,
            _ => Err(method_not_allowed()),
        };
    }
    // An MCP server's OAuth callback authenticates by its state alone (single use, 10 minutes,
    // issued to a person by `POST /v1/mcp/servers/:name/connect`): the browser comes back from
    // another site, without a token and without the SameSite cookie.
    if segments.as_slice() == ["v1", "mcp", "callback"] {
        return match method {
            Method::Get => mcp_oauth::callback_route(&req, &env).await,
            _ => Err(method_not_allowed()),
        };
    }
    // Every /v1 route authenticates before anything else is looked at. Runners connect with a
    // runner token; every other route takes a user token.
    if segments.as_slice() == ["v1", "runners", "connect"] {
        let authenticated = authenticate(&req, &env, TokenKind::Runner).await?;
        *caller = Some(authenticated.identity.clone());
        if method != Method::Get {
            return Err(method_not_allowed());
        }
        return connect_runner(&req, &env, &authenticated).await;
    }
    let authenticated = authenticate(&req, &env, TokenKind::User).await?;
    let identity = authenticated.identity.clone();
    *caller = Some(identity.clone());
    let call_method = call_method(&method);
    match (segments.as_slice(), method) {
        (["v1", "tokens" | "auth", ..], method) => {
            signin::route(&mut req, &env, &authenticated, &segments[1..], method).await
        }
        (["v1", "runners" | "environments", ..], _) => {
            let route = decode_segments(&segments[1..])?;
            let route: Vec<&str> = route.iter().map(String::as_str).collect();
            let body = read_body_for(&mut req, call_method).await?;
            let call = calls::hub::decode_public(call_method, &route, &body)
                .map_err(internal::call_error)?;
            hub_route(&env, &identity, call).await
        }
        (["v1", "blobs", id], Method::Get) => {
            blob_store::get_route(&req, &env, &identity, id).await
        }
        (["v1", "blobs", _], _) => Err(method_not_allowed()),
        (["v1", "secrets", rest @ ..], _) if rest.len() <= 1 => {
            let route = decode_segments(&segments[1..])?;
            let route: Vec<&str> = route.iter().map(String::as_str).collect();
            let body = read_body_for(&mut req, call_method).await?;
            let call = calls::index::decode_public(call_method, &route, &query_pairs(&req), &body)
                .map_err(internal::call_error)?;
            index_route(&env, &identity, call).await
        }
        (["v1", route @ ("usage" | "budget")], _) => {
            let body = read_body_for(&mut req, call_method).await?;
            let call =
                calls::index::decode_public(call_method, &[*route], &query_pairs(&req), &body)
                    .map_err(internal::call_error)?;
            index_route(&env, &identity, call).await
        }
        (["v1", "policy", "check"], Method::Get) => {
            policy_gate::check_route(&req, &env, &identity).await
        }
        (["v1", "policy", "check"], _) => Err(method_not_allowed()),
        (["v1", "mcp", "servers"], Method::Get) => mcp_client::servers_route(&env, &identity).await,
        (["v1", "mcp", "servers", name, "tools"], Method::Get) => {
            mcp_client::tools_route(&env, &identity, name).await
        }
        (["v1", "mcp", "finish"], Method::Post) => {
            mcp_oauth::finish_route(&mut req, &env, &identity).await
        }
        (["v1", "mcp", "finish"], _) => Err(method_not_allowed()),
        (["v1", "mcp", "servers", name, "connect"], Method::Post) => {
            mcp_oauth::connect_route(&req, &env, &identity, name).await
        }
        (["v1", "mcp", "servers", name, "connection"], Method::Delete) => {
            mcp_oauth::disconnect_route(&env, &identity, name).await
        }
        (
            ["v1", "mcp", "servers"]
            | [
                "v1",
                "mcp",
                "servers",
                _,
                "tools" | "connect" | "connection",
            ],
            _,
        ) => Err(method_not_allowed()),
        (["v1", "llm-logs"], Method::Get) => llm_logs::list(&req, &env, &identity).await,
        (["v1", "llm-logs"], _) => Err(method_not_allowed()),
        (["v1", "llm-logs", session, record], Method::Get) => {
            llm_logs::get(&env, &identity, session, record).await
        }
        (["v1", "llm-logs", _, _], _) => Err(method_not_allowed()),
        (["v1", "sessions"], Method::Post) => create_session(&mut req, &env, &identity).await,
        (["v1", "sessions"], _) => {
            let call =
                calls::index::decode_public(call_method, &["sessions"], &query_pairs(&req), &[])
                    .map_err(internal::call_error)?;
            index_route(&env, &identity, call).await
        }
        (["v1", "sessions", id, "fork"], Method::Post) => {
            fork_session(&mut req, &env, &identity, id).await
        }
        (["v1", "sessions", _, "fork"], _) => Err(method_not_allowed()),
        (["v1", "sessions", id, rest @ ..], _) => {
            session_route(&mut req, &env, &authenticated, id, rest, call_method).await
        }
        (["v1", "channels", ..], _) => {
            channels::api(&mut req, &env, &identity, &segments[1..], call_method).await
        }
        (["v1", "workspace", "docs"], Method::Get) => list_docs(&req, &env, &identity).await,
        (["v1", "workspace", "docs", rest @ ..], method) if !rest.is_empty() => {
            workspace_doc(&mut req, &env, &identity, rest, method).await
        }
        (["v1", "workspace", "docs"], _) => Err(method_not_allowed()),
        _ => Err(ApiError::not_found("no such route")),
    }
}

/// The method as the public routes' decoders see it (`HEAD` is not a method of any).
fn call_method(method: &Method) -> CallMethod {
    match method {
        Method::Get => CallMethod::Get,
        Method::Post => CallMethod::Post,
        Method::Put => CallMethod::Put,
        Method::Patch => CallMethod::Patch,
        Method::Delete => CallMethod::Delete,
        _ => CallMethod::Other,
    }
}

/// The body of a method that has one (empty for the others).
async fn read_body_for(req: &mut Request, method: CallMethod) -> ApiResult<Vec<u8>> {
    match method {
        CallMethod::Post | CallMethod::Put | CallMethod::Patch => read_body(req).await,
        _ => Ok(Vec::new()),
    }
}

/// `/v1/sessions/:id[/...]`: decoded and validated here, answered by the session's actor.
async fn session_route(
    req: &mut Request,
    env: &Env,
    authenticated: &Authenticated,
    id: &str,
    rest: &[&str],
    method: CallMethod,
) -> ApiResult<Response> {
    let who = &authenticated.identity;
    let stub = session_client::stub(env, &who.tenant, id)?;
    let body = read_body_for(req, method).await?;
    let last_event_id = req.headers().get("last-event-id").ok().flatten();
    let rest = decode_segments(rest)?;
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let call = calls::session::decode_public(
        method,
        &rest,
        &query_pairs(req),
        &body,
        last_event_id.as_deref(),
        authenticated.jti.as_deref(),
    )
    .map_err(internal::call_error)?;
    match call {
        // The stream carries its credential's `jti` so it can end when that is revoked.
        SessionCall::Follow(c) => internal::stream(&stub, who, &c).await,
        // A client WebSocket: the same authentication as `follow` (the upgrade passed the
        // cross-site check above), handed to the session's actor, which accepts it.
        SessionCall::Socket(c) => {
            http::require_websocket_upgrade(req)?;
            internal::upgrade(&stub, who, req, &c).await
        }
        SessionCall::Delete(c) => match internal::call(&stub, who, &c).await? {
            Deleted::Finished => Ok(Response::empty()?.with_status(204)),
            Deleted::Continuing => Ok(Response::empty()?.with_status(202)),
        },
        // Calls between actors are never decoded from a client's request (core's table tests);
        // should one be, it is not sent.
        call if call.needs() == Needs::Internal => Err(ApiError::not_found("no such route")),
        // Every other public call answers as the actor answers.
        call => internal::relay_any(&stub, who, &call).await,
    }
}

/// A hub call of a person (`/v1/runners`, `/v1/environments`).
async fn hub_route(env: &Env, who: &Identity, call: HubCall) -> ApiResult<Response> {
    let stub = internal::hub(env, &who.tenant)?;
    match call {
        HubCall::FreeRunner(c) => {
            internal::call(&stub, who, &c).await?;
            Ok(Response::empty()?.with_status(204))
        }
        HubCall::CreateEnvironment(c) => {
            let created = internal::call(&stub, who, &c).await?;
            Ok(json_response(201, &created))
        }
        HubCall::DeleteEnvironment(c) => {
            internal::call(&stub, who, &c).await?;
            Ok(Response::empty()?.with_status(204))
        }
        call => internal::relay_any(&stub, who, &call).await,
    }
}

/// An index call of a person (`/v1/sessions`, `/v1/usage`, `/v1/budget`).
async fn index_route(env: &Env, who: &Identity, call: IndexCall) -> ApiResult<Response> {
    let stub = internal::tenant_index(env, &who.tenant)?;
    // Every public call of the index answers as the index answers.
    internal::relay_any(&stub, who, &call).await
}

async fn list_docs(req: &Request, env: &Env, identity: &Identity) -> ApiResult<Response> {
    let pairs = query_pairs(req);
    let prefix = query(&pairs, "prefix").unwrap_or_default();
    let limit = query_u64(&pairs, "limit")?.unwrap_or(1000);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    let cursor = query(&pairs, "cursor").filter(|c| !c.is_empty());
    let page = workspace_io::list(env, &identity.tenant, &prefix, limit as u32, cursor).await?;
    Ok(json_response(200, &page))
}

async fn workspace_doc(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
    segments: &[&str],
    method: Method,
) -> ApiResult<Response> {
    // Segments arrive percent-encoded; the decoded path is validated by the workspace rules.
    let mut decoded = Vec::with_capacity(segments.len());
    for segment in segments {
        let text = js_sys::decode_uri_component(segment)
            .ok()
            .and_then(|v| v.as_string())
            .ok_or_else(|| ApiError::bad_request("invalid percent-encoding in path"))?;
        decoded.push(text);
    }
    let path = decoded.join("/");
    match method {
        Method::Get => match workspace_io::read(env, &identity.tenant, &path).await? {
            Some(doc) => Ok(json_response(200, &doc)),
            None => Err(ApiError::not_found(format!("no document at {path}"))),
        },
        Method::Put => {
            let bytes = read_body(req).await?;
            let text = String::from_utf8(bytes)
                .map_err(|_| ApiError::bad_request("document must be utf-8 text"))?;
            let summary = workspace_io::write(
                env,
                &identity.tenant,
                &WorkspaceWriter::Person(&identity.principal()),
                &path,
                &text,
            )
            .await?;
            Ok(json_response(200, &summary))
        }
        Method::Delete => {
            if workspace_io::remove(
                env,
                &identity.tenant,
                &WorkspaceWriter::Person(&identity.principal()),
                &path,
            )
            .await?
            {
                Ok(Response::empty()?.with_status(204))
            } else {
                Err(ApiError::not_found(format!("no document at {path}")))
            }
        }
        _ => Err(method_not_allowed()),
    }
}

/// Hands a runner's WebSocket upgrade to its tenant's hub, with the token's `jti` (if it has
/// one) so that revoking the token closes the socket.
async fn connect_runner(
    req: &Request,
    env: &Env,
    authenticated: &Authenticated,
) -> ApiResult<Response> {
    let identity = &authenticated.identity;
    http::require_websocket_upgrade(req)?;
    let call = calls::hub::Connect {
        jti: authenticated.jti.clone(),
    };
    internal::upgrade(&internal::hub(env, &identity.tenant)?, identity, req, &call).await
}

/// Percent-encoded path segments, decoded.
fn decode_segments(segments: &[&str]) -> ApiResult<Vec<String>> {
    segments
        .iter()
        .map(|segment| {
            js_sys::decode_uri_component(segment)
                .ok()
                .and_then(|v| v.as_string())
                .ok_or_else(|| ApiError::bad_request("invalid percent-encoding in path"))
        })
        .collect()
}

/// `docs/openapi.json`, generated from the wire types by `wuhu-core`'s test (`core/src/openapi.rs`).
/// `web/build.mjs` copies it as it is committed into the static assets at `v1/openapi.json`,
/// which only the Worker reaches (`/v1/*` runs the Worker first): it is read through the
/// `ASSETS` binding instead of living in the wasm (254 KB raw, about 21 KB of its gzip size).
async fn openapi_response(env: &Env) -> ApiResult<Response> {
    let missing = |why: String| {
        worker::console_error!("openapi: {why}");
        ApiError::new(
            500,
            "server_misconfigured",
            "the API description is missing from the static assets (build the web app)",
        )
    };
    let mut asset = env
        .assets("ASSETS")
        .map_err(|e| missing(e.to_string()))?
        .fetch("https://assets.invalid/v1/openapi.json", None)
        .await
        .map_err(|e| missing(e.to_string()))?;
    if asset.status_code() != 200 {
        return Err(missing(format!("status {}", asset.status_code())));
    }
    let body = asset.bytes().await.map_err(|e| missing(e.to_string()))?;
    let headers = Headers::new();
    let _ = headers.set("content-type", "application/json");
    let _ = headers.set("cache-control", "public, max-age=300");
    Ok(Response::builder()
        .with_status(200)
        .with_headers(headers)
        .fixed(body))
}

/// The router again, for a request the Worker makes to itself (an MCP tool's API request):
/// boxed, as the router is what calls it.
pub(crate) fn route_again(
    req: Request,
    env: Env,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ApiResult<Response>>>> {
    Box::pin(async move {
        let mut caller = None;
        route(req, env, &mut caller).await
    })
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

async fn create_session(req: &mut Request, env: &Env, identity: &Identity) -> ApiResult<Response> {
    rate_limit::check(
        env,
        RateAction::CreateSession,
        &identity.tenant,
        &identity.sub,
    )
    .await?;
    let body = read_body(req).await?;
    let request: CreateSessionRequest =
        calls::decode_optional_body(&body).map_err(internal::call_error)?;
    let valid = request.validate().map_err(ApiError::bad_request)?;
    let id = uuid::Uuid::new_v4().to_string();
    let init = SessionInit {
        id: id.clone(),
        tenant: identity.tenant.clone(),
        created_by: identity.sub.clone(),
        provider: valid.provider,
        model: valid.model,
        system_prompt: request.system_prompt,
        title: valid.title,
        global_context: workspace_io::global_context_for(
            env,
            &identity.tenant,
            &identity.sub,
            None,
        )
        .await?,
        budget: request.budget,
        reasoning: request.reasoning,
        channel: None,
    };
    let stub = session_client::stub(env, &identity.tenant, &id)?;
    let info = internal::call(&stub, identity, &calls::session::Create(init)).await?;
    Ok(json_response(201, &info))
}

/// `POST /v1/sessions/:id/fork`: whoever may read the session (and so create one) forks it.
async fn fork_session(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
    id: &str,
) -> ApiResult<Response> {
    rate_limit::check(
        env,
        RateAction::CreateSession,
        &identity.tenant,
        &identity.sub,
    )
    .await?;
    let body = read_body(req).await?;
    let request: wuhu_core::wire::ForkRequest = parse_json(&body)?;
    let forked = session_client::info(env, identity, id).await?;
    request
        .validate(forked.last_cursor)
        .map_err(ApiError::bad_request)?;
    let init = calls::session::ForkInit {
        id: uuid::Uuid::new_v4().to_string(),
        tenant: identity.tenant.clone(),
        created_by: identity.sub.clone(),
        // Checked by `validate`; the forked session's title went through the same rule when
        // it was set.
        title: request
            .title
            .as_deref()
            .and_then(|t| wuhu_core::wire::normalize_title(t).ok())
            .or(forked.title),
        from: wuhu_core::wire::ForkedFrom {
            session_id: forked.id,
            cursor: request.at_cursor,
        },
    };
    let info = session_client::fork_init(env, identity, init).await?;
    Ok(json_response(201, &info))
}
