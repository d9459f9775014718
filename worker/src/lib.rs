//! # wuhu-worker
//!
//! The Cloudflare host of Wuhu. The fetch handler authenticates and routes; two Durable Object
//! classes hold state: [`session_actor::SessionActor`] (one per session: transcript, lanes, the
//! agent loop) and [`tenant_index::TenantIndex`] (one per tenant: the session list). Session
//! meaning lives in `wuhu-core`; this crate turns its effects into I/O (SQLite, R2, `fetch`,
//! alarms, SSE, WebSockets).

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
mod model_tool;
mod observe;
mod orchestration_tools;
mod runner_calls;
mod runner_client;
mod runner_hub;
mod session_actor;
mod session_client;
mod signin;
mod tenant_index;
mod token_registry;
mod tool_context;
mod webcrypto;
mod workspace_io;

use worker::{Context, Env, Headers, Method, Request, RequestInit, Response, event};
use wuhu_core::llm::{self, anthropic, fake, openai};
use wuhu_core::wire::{CreateSessionRequest, ListSessionsResponse, OkResponse};

use crate::auth::{Authenticated, Identity, TokenKind, authenticate};
use crate::http::{
    ApiError, ApiResult, json_response, parse_json, query, query_pairs, query_u64, read_body,
};
use crate::identity::JTI_HEADER;
use crate::internal::hub_api;
use wuhu_core::authority::WorkspaceWriter;

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
    match (segments.as_slice(), method) {
        (["v1", "tokens" | "auth", ..], method) => {
            signin::route(&mut req, &env, &authenticated, &segments[1..], method).await
        }
        (["v1", "runners"], Method::Get) => Ok(json_response(
            200,
            &hub_api::list_runners(&env, &identity).await?,
        )),
        (["v1", "runners", owner, name], Method::Delete) => {
            let (owner, name) = (decode_segment(owner)?, decode_segment(name)?);
            hub_api::free_runner(&env, &identity, &owner, &name).await?;
            Ok(Response::empty()?.with_status(204))
        }
        (["v1", "environments"], Method::Get) => Ok(json_response(
            200,
            &hub_api::list_environments(&env, &identity).await?,
        )),
        (["v1", "environments"], Method::Post) => {
            let body = parse_json(&read_body(&mut req).await?)?;
            let created = hub_api::create_environment(&env, &identity, &body).await?;
            Ok(json_response(201, &created))
        }
        (["v1", "environments", key], Method::Get) => {
            let key = decode_segment(key)?;
            let found = hub_api::environment(&env, &identity, &key).await?;
            Ok(json_response(200, &found))
        }
        (["v1", "environments", key], Method::Patch) => {
            let key = decode_segment(key)?;
            let body = parse_json(&read_body(&mut req).await?)?;
            let updated = hub_api::update_environment(&env, &identity, &key, &body).await?;
            Ok(json_response(200, &updated))
        }
        (["v1", "environments", key], Method::Delete) => {
            let key = decode_segment(key)?;
            hub_api::delete_environment(&env, &identity, &key).await?;
            Ok(Response::empty()?.with_status(204))
        }
        (
            ["v1", "runners"]
            | ["v1", "runners", _, _]
            | ["v1", "environments"]
            | ["v1", "environments", _],
            _,
        ) => Err(method_not_allowed()),
        (["v1", "sessions", id, "approvals", approval_id], Method::Post) => {
            let query = format!("id={approval_id}");
            let stub = session_client::stub(&env, &identity.tenant, id)?;
            let body = String::from_utf8_lossy(&read_body(&mut req).await?).into_owned();
            let internal = internal_request(
                "approval",
                &query,
                Method::Post,
                Some(body),
                &identity,
                None,
                None,
            )?;
            Ok(stub.fetch_with_request(internal).await?)
        }
        (["v1", "sessions", _, "approvals", _], _) => Err(method_not_allowed()),
        (["v1", "blobs", id], Method::Get) => {
            blob_store::get_route(&req, &env, &identity, id).await
        }
        (["v1", "blobs", _], _) => Err(method_not_allowed()),
        (["v1", "usage"], Method::Get) => {
            let query = req
                .url()
                .ok()
                .and_then(|u| u.query().map(str::to_string))
                .unwrap_or_default();
            tenant_index::usage(&env, &identity, &query).await
        }
        (["v1", "usage"], _) => Err(method_not_allowed()),
        (["v1", "budget"], Method::Get) => {
            tenant_index::budget_route(&env, &identity, Method::Get, None).await
        }
        (["v1", "budget"], Method::Put) => {
            let body = String::from_utf8_lossy(&read_body(&mut req).await?).into_owned();
            tenant_index::budget_route(&env, &identity, Method::Put, Some(body)).await
        }
        (["v1", "budget"], _) => Err(method_not_allowed()),
        (["v1", "llm-logs"], Method::Get) => llm_logs::list(&req, &env, &identity).await,
        (["v1", "llm-logs"], _) => Err(method_not_allowed()),
        (["v1", "llm-logs", session, record], Method::Get) => {
            llm_logs::get(&env, &identity, session, record).await
        }
        (["v1", "llm-logs", _, _], _) => Err(method_not_allowed()),
        (["v1", "sessions"], Method::Post) => create_session(&mut req, &env, &identity).await,
        (["v1", "sessions"], Method::Get) => list_sessions(&req, &env, &identity).await,
        (["v1", "sessions"], _) => Err(method_not_allowed()),
        (["v1", "sessions", id], Method::Get) => {
            forward(&mut req, &env, &identity, id, "transcript", Method::Get).await
        }
        (["v1", "sessions", id, "fork"], Method::Post) => {
            fork_session(&mut req, &env, &identity, id).await
        }
        (["v1", "sessions", _, "fork"], _) => Err(method_not_allowed()),
        (["v1", "sessions", id], Method::Delete) => {
            forward(&mut req, &env, &identity, id, "delete", Method::Delete).await
        }
        (["v1", "sessions", id], Method::Patch) => {
            forward(&mut req, &env, &identity, id, "title", Method::Post).await
        }
        (
            [
                "v1",
                "sessions",
                id,
                action @ ("enqueue" | "cancel" | "stop" | "compact"),
            ],
            Method::Post,
        ) => forward(&mut req, &env, &identity, id, action, Method::Post).await,
        // The stream carries its credential's `jti` so it can end when that is revoked.
        (["v1", "sessions", id, "follow"], Method::Get) => {
            let jti = authenticated.jti.as_deref();
            forward_with(&mut req, &env, &identity, id, "follow", Method::Get, jti).await
        }
        // A client WebSocket: the same authentication as `follow` (the upgrade passed the
        // cross-site check above), handed to the session's actor, which accepts it.
        (["v1", "sessions", id, "socket"], Method::Get) => {
            connect_session_socket(&req, &env, &authenticated, id).await
        }
        (["v1", "sessions", id, action @ ("stats" | "usage")], Method::Get) => {
            forward(&mut req, &env, &identity, id, action, Method::Get).await
        }
        (["v1", "sessions", _], _)
        | (
            [
                "v1",
                "sessions",
                _,
                "enqueue" | "cancel" | "stop" | "compact" | "follow" | "socket" | "stats" | "usage",
            ],
            _,
        ) => Err(method_not_allowed()),
        (["v1", "channels", ..], method) => {
            channels::api(&mut req, &env, &identity, &segments, method).await
        }
        (["v1", "workspace", "docs"], Method::Get) => list_docs(&req, &env, &identity).await,
        (["v1", "workspace", "docs", rest @ ..], method) if !rest.is_empty() => {
            workspace_doc(&mut req, &env, &identity, rest, method).await
        }
        (["v1", "workspace", "docs"], _) => Err(method_not_allowed()),
        _ => Err(ApiError::not_found("no such route")),
    }
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

/// The read-only documents under `wuhu://config/`: server settings without secrets, and the
/// model table in effect (the tenant's `config/models.json` over the built-in rows).
///
/// # Errors
/// The tenant's model table is invalid, or could not be read.
pub(crate) async fn config_doc(
    env: &Env,
    tenant: &str,
    path: &str,
) -> Result<Option<String>, String> {
    if path == "models.json" {
        let table = workspace_io::model_table(env, tenant)
            .await
            .map_err(|e| e.message)?
            .map_err(|e| e.to_string())?;
        return Ok(serde_json::to_string_pretty(&table.to_json()).ok());
    }
    if path != "server.json" {
        return Ok(None);
    }
    let var = |name: &str| env.var(name).ok().map(|v| v.to_string());
    let settings = serde_json::json!({
        "tenant": tenant,
        "providers": llm::PROVIDERS,
        "defaultProvider": fake::PROVIDER,
        "openaiBaseUrl": var("OPENAI_BASE_URL").unwrap_or_else(|| openai::DEFAULT_BASE_URL.to_string()),
        "openaiKeyConfigured": env.secret("OPENAI_API_KEY").is_ok() || env.var("OPENAI_API_KEY").is_ok(),
        "anthropicBaseUrl": var("ANTHROPIC_BASE_URL").unwrap_or_else(|| anthropic::DEFAULT_BASE_URL.to_string()),
        "anthropicKeyConfigured": env.secret("ANTHROPIC_API_KEY").is_ok() || env.var("ANTHROPIC_API_KEY").is_ok(),
        "workspace": "wuhu://workspace/",
        "globalContext": "wuhu://workspace/users/<you>/context.md",
        "tenantSettings": format!("wuhu://workspace/{}", wuhu_core::tenant_config::TENANT_CONFIG_PATH),
    });
    Ok(serde_json::to_string_pretty(&settings).ok())
}

/// The user's global context document, if they have one.
async fn global_context(env: &Env, identity: &Identity) -> ApiResult<Option<serde_json::Value>> {
    let path = format!("users/{}/context.md", identity.sub);
    if wuhu_core::workspace::normalize_doc_path(&path).is_err() {
        return Ok(None); // A sub that is not a valid path segment has no context document.
    }
    Ok(workspace_io::read(env, &identity.tenant, &path).await?.map(|doc| {
        serde_json::json!({"path": doc.summary.path, "version": doc.summary.version, "content": doc.content})
    }))
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
    hub_api::connect(env, identity, req, authenticated.jti.as_deref()).await
}

/// Hands a client's WebSocket upgrade to the session's actor (`GET /socket`), with the verified
/// identity and the credential's `jti` (a revocable one is re-checked while the socket is open).
async fn connect_session_socket(
    req: &Request,
    env: &Env,
    authenticated: &Authenticated,
    id: &str,
) -> ApiResult<Response> {
    http::require_websocket_upgrade(req)?;
    let identity = &authenticated.identity;
    let stub = session_client::stub(env, &identity.tenant, id)?;
    let headers = Headers::new();
    for (name, value) in req.headers().entries() {
        if name != "authorization" && name != "cookie" && !name.starts_with("x-wuhu-") {
            headers.set(&name, &value)?;
        }
    }
    identity.set_headers(&headers)?;
    if let Some(jti) = &authenticated.jti {
        headers.set(JTI_HEADER, jti)?;
    }
    let query = req
        .url()
        .ok()
        .and_then(|u| u.query().map(str::to_string))
        .unwrap_or_default();
    let url = if query.is_empty() {
        "https://session/socket".to_string()
    } else {
        format!("https://session/socket?{query}")
    };
    let mut init = RequestInit::new();
    init.with_method(Method::Get).with_headers(headers);
    let internal = Request::new_with_init(&url, &init)?;
    Ok(stub.fetch_with_request(internal).await?)
}

/// A percent-encoded path segment, decoded.
fn decode_segment(segment: &str) -> ApiResult<String> {
    js_sys::decode_uri_component(segment)
        .ok()
        .and_then(|v| v.as_string())
        .ok_or_else(|| ApiError::bad_request("invalid percent-encoding in path"))
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

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

async fn create_session(req: &mut Request, env: &Env, identity: &Identity) -> ApiResult<Response> {
    let body = read_body(req).await?;
    let request: CreateSessionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSessionRequest::default()
    } else {
        parse_json(&body)?
    };
    let provider = request
        .provider
        .clone()
        .unwrap_or_else(|| fake::PROVIDER.to_string());
    if !llm::PROVIDERS.contains(&provider.as_str()) {
        return Err(ApiError::bad_request(format!(
            "unknown provider {provider:?}: use one of {}",
            llm::PROVIDERS.map(|p| format!("{p:?}")).join(", ")
        )));
    }
    if request
        .model
        .as_deref()
        .is_some_and(|m| m.trim().is_empty() || m.len() > 200)
    {
        return Err(ApiError::bad_request("model must be 1 to 200 characters"));
    }
    if request
        .title
        .as_deref()
        .is_some_and(|t| t.chars().count() > 200)
    {
        return Err(ApiError::bad_request(
            "title must be at most 200 characters",
        ));
    }
    if let Some(budget) = &request.budget {
        budget.validate().map_err(ApiError::bad_request)?;
    }
    let id = uuid::Uuid::new_v4().to_string();
    let init = serde_json::json!({
        "id": id,
        "tenant": identity.tenant,
        "createdBy": identity.sub,
        "provider": provider,
        "model": request.model,
        "systemPrompt": request.system_prompt,
        "title": request.title,
        "globalContext": global_context(env, identity).await?,
        "budget": request.budget,
    });
    let stub = session_client::stub(env, &identity.tenant, &id)?;
    let internal = internal_request(
        "init",
        "",
        Method::Post,
        Some(init.to_string()),
        identity,
        None,
        None,
    )?;
    Ok(stub.fetch_with_request(internal).await?)
}

/// `POST /v1/sessions/:id/fork`: whoever may read the session (and so create one) forks it.
async fn fork_session(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
    id: &str,
) -> ApiResult<Response> {
    let body = read_body(req).await?;
    let request: wuhu_core::wire::ForkRequest = parse_json(&body)?;
    let forked = session_client::info(env, identity, id).await?;
    request
        .validate(forked.last_cursor)
        .map_err(ApiError::bad_request)?;
    let init = session_client::ForkInit {
        id: uuid::Uuid::new_v4().to_string(),
        tenant: identity.tenant.clone(),
        created_by: identity.sub.clone(),
        title: request
            .title
            .as_deref()
            .map(|t| t.trim().to_string())
            .or(forked.title),
        from: wuhu_core::wire::ForkedFrom {
            session_id: forked.id,
            cursor: request.at_cursor,
        },
    };
    let info = session_client::fork_init(env, &init).await?;
    Ok(json_response(201, &info))
}

async fn list_sessions(req: &Request, env: &Env, identity: &Identity) -> ApiResult<Response> {
    let pairs = query_pairs(req);
    let limit = query_u64(&pairs, "limit")?.unwrap_or(50);
    if limit == 0 || limit > 200 {
        return Err(ApiError::bad_request("limit must be between 1 and 200"));
    }
    let before = query(&pairs, "before").filter(|b| !b.is_empty());
    let parent = query(&pairs, "parentId").filter(|p| !p.is_empty());
    let page: ListSessionsResponse = tenant_index::list(
        env,
        identity,
        limit as u32,
        before.as_deref(),
        parent.as_deref(),
    )
    .await?;
    Ok(json_response(200, &page))
}

/// Forwards a request to the session's actor, with the verified identity in headers.
async fn forward(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
    id: &str,
    action: &str,
    method: Method,
) -> ApiResult<Response> {
    forward_with(req, env, identity, id, action, method, None).await
}

/// [`forward`], also passing the credential's `jti` in [`JTI_HEADER`] (follow streams).
async fn forward_with(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
    id: &str,
    action: &str,
    method: Method,
    jti: Option<&str>,
) -> ApiResult<Response> {
    let stub = session_client::stub(env, &identity.tenant, id)?;
    let body = if method == Method::Post {
        Some(String::from_utf8_lossy(&read_body(req).await?).into_owned())
    } else {
        None
    };
    // Validate JSON at the edge so bad input never costs an actor wake-up... except an
    // empty stop or compact body, which is allowed.
    if let Some(text) = &body
        && (!matches!(action, "stop" | "compact") || !text.trim().is_empty())
    {
        let _: serde_json::Value = parse_json(text.as_bytes())?;
    }
    let query = req
        .url()
        .ok()
        .and_then(|u| u.query().map(str::to_string))
        .unwrap_or_default();
    let last_event_id = req.headers().get("last-event-id").ok().flatten();
    let internal = internal_request(action, &query, method, body, identity, last_event_id, jti)?;
    Ok(stub.fetch_with_request(internal).await?)
}

fn internal_request(
    action: &str,
    query: &str,
    method: Method,
    body: Option<String>,
    identity: &Identity,
    last_event_id: Option<String>,
    jti: Option<&str>,
) -> ApiResult<Request> {
    let headers = Headers::new();
    identity.set_headers(&headers)?;
    if let Some(id) = last_event_id {
        headers.set("last-event-id", &id)?;
    }
    if let Some(jti) = jti {
        headers.set(JTI_HEADER, jti)?;
    }
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(headers);
    if let Some(body) = body {
        init.with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
    }
    let url = if query.is_empty() {
        format!("https://session/{action}")
    } else {
        format!("https://session/{action}?{query}")
    };
    Ok(Request::new_with_init(&url, &init)?)
}
