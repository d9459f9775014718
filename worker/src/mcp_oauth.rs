//! OAuth 2.1 for MCP servers whose entry says `"auth": {"type": "oauth"}` (decision 0039): a
//! person connects their own account (`POST /v1/mcp/servers/:name/connect`, then the browser
//! signs in at the server's authorization server, which sends it back to
//! `GET /v1/mcp/callback`, which sends it on to the web app, where the person who began it
//! finishes it: `POST /v1/mcp/finish`), and turns that act for that person alone carry their
//! token. Performs `wuhu_core::mcp_client::oauth`.
//!
//! Storage, in the `ARCHIVE` bucket, sealed with the secrets key (like the vault):
//! - a sign-in on its way under `mcp-oauth-pending/<sha-256 of its state>` (256 random bits,
//!   10 minutes: the callback's only credential; finished once, by the person who began it);
//! - a connection under `<tenant>/mcp-oauth/<sub>/<tenant|user>/<server>` (outside the
//!   workspace, so no document route lists or reads it).

use futures::StreamExt;
use futures::future::{Either, select};
use serde_json::{Value, json};
use worker::{Delay, Env, Fetch, Headers, Method, Request, RequestInit, RequestRedirect, Response};
use wuhu_core::mcp_client::config::{self, Auth, Server, Source};
use wuhu_core::mcp_client::oauth::{self, Connection, Pending};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::mcp_turn::Caller;

const BUCKET: &str = "ARCHIVE";
/// How long one request of a sign-in may take.
const REQUEST_SECONDS: u64 = 15;

fn now_ms() -> u64 {
    worker::Date::now().as_millis()
}

fn source_name(source: &Source) -> &'static str {
    match source {
        Source::Tenant => "tenant",
        Source::User(_) => "user",
        Source::Environment(_) => "environment",
    }
}

fn connection_key(tenant: &str, sub: &str, source: &str, server: &str) -> String {
    format!("{tenant}/mcp-oauth/{sub}/{source}/{server}")
}

fn pending_key(state: &str) -> String {
    format!("mcp-oauth-pending/{}", oauth::state_key(state))
}

fn random32() -> Result<[u8; 32], String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|_| "no randomness".to_string())?;
    Ok(bytes)
}

/// Seals `value` as JSON under `key` (the key is its associated data).
async fn put_sealed(env: &Env, key: &str, value: &impl serde::Serialize) -> Result<(), String> {
    let keys = crate::secrets::keys(env).map_err(|e| e.message)?;
    let nonce = crate::secrets::nonce().map_err(|e| e.message)?;
    let text = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let sealed = keys.seal(&format!("mcp-oauth:{key}"), nonce, &text);
    env.bucket(BUCKET)
        .map_err(|e| e.to_string())?
        .put(key.to_string(), sealed.into_bytes())
        .execute()
        .await
        .map_err(|e| format!("storing failed: {e}"))?;
    Ok(())
}

async fn get_sealed<T: serde::de::DeserializeOwned>(
    env: &Env,
    key: &str,
) -> Result<Option<T>, String> {
    let bucket = env.bucket(BUCKET).map_err(|e| e.to_string())?;
    let Some(object) = bucket
        .get(key.to_string())
        .execute()
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let Some(body) = object.body() else {
        return Ok(None);
    };
    let sealed = body.text().await.map_err(|e| e.to_string())?;
    let keys = crate::secrets::keys(env).map_err(|e| e.message)?;
    let (text, _) = keys.open(&format!("mcp-oauth:{key}"), &sealed)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| e.to_string())
}

async fn delete(env: &Env, key: &str) -> Result<bool, String> {
    let bucket = env.bucket(BUCKET).map_err(|e| e.to_string())?;
    let existed = bucket
        .head(key.to_string())
        .await
        .map_err(|e| e.to_string())?
        .is_some();
    bucket
        .delete(key.to_string())
        .await
        .map_err(|e| e.to_string())?;
    Ok(existed)
}

/// One request of a sign-in (metadata, registration, tokens): egress rules, no redirects,
/// bounded answers, a timeout. Returns the status, the body as JSON (`Null` when it is not) and
/// the `WWW-Authenticate` header.
async fn send(
    env: &Env,
    method: Method,
    url: &str,
    body: Option<(&str, String)>,
) -> Result<(u16, Value, Option<String>), String> {
    let url = crate::mcp_turn::egress(env)
        .check(url)
        .map_err(|e| e.to_string())?;
    let perform = async {
        let headers = Headers::new();
        let _ = headers.set("accept", "application/json");
        let mut init = RequestInit::new();
        init.with_method(method)
            .with_redirect(RequestRedirect::Manual);
        if let Some((content_type, body)) = body {
            let _ = headers.set("content-type", content_type);
            init.with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
        }
        init.with_headers(headers);
        let request = Request::new_with_init(&url, &init).map_err(|e| e.to_string())?;
        let mut response = Fetch::Request(request)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status_code();
        let challenge = response.headers().get("www-authenticate").ok().flatten();
        let mut bytes = Vec::new();
        if let Ok(mut stream) = response.stream() {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                if bytes.len() + chunk.len() > oauth::MAX_METADATA_BYTES {
                    return Err(format!(
                        "{url} answered more than {} bytes",
                        oauth::MAX_METADATA_BYTES
                    ));
                }
                bytes.extend_from_slice(&chunk);
            }
        }
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            challenge,
        ))
    };
    let timer = Delay::from(std::time::Duration::from_secs(REQUEST_SECONDS));
    match select(Box::pin(perform), Box::pin(timer)).await {
        Either::Left((result, _)) => result.map_err(|e| format!("{url}: {e}")),
        Either::Right(_) => Err(format!("{url}: no answer within {REQUEST_SECONDS} s")),
    }
}

/// The first of `urls` that answers 200 with JSON.
async fn first_json(env: &Env, urls: &[String]) -> Result<Value, String> {
    let mut tried = Vec::new();
    for url in urls {
        match send(env, Method::Get, url, None).await {
            Ok((200, body, _)) if body.is_object() => return Ok(body),
            Ok((status, _, _)) => tried.push(format!("{url}: {status}")),
            Err(e) => tried.push(e),
        }
    }
    Err(tried.join("; "))
}

/// Finds the server's authorization server: its protected-resource metadata at the well-known
/// places, else where a `401` to an unauthenticated `initialize` points.
async fn discover(
    env: &Env,
    server: &Server,
) -> Result<(oauth::ResourceMetadata, oauth::AuthorizationServer), String> {
    let url = &server.doc.url;
    let metadata = match first_json(env, &oauth::resource_metadata_urls(url)).await {
        Ok(body) => body,
        Err(tried) => {
            let probe = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": wuhu_core::mcp_client::exchange::CLIENT_PROTOCOL_VERSION,
                "capabilities": {}, "clientInfo": {"name": "wuhu", "version": "1"}}});
            let (_, _, challenge) = send(
                env,
                Method::Post,
                url,
                Some(("application/json", probe.to_string())),
            )
            .await?;
            let at = challenge
                .as_deref()
                .and_then(oauth::resource_metadata_from_challenge)
                .ok_or(format!("no protected-resource metadata ({tried})"))?;
            first_json(env, &[at]).await?
        }
    };
    let resource = oauth::parse_resource_metadata(&metadata, url)?;
    let body = first_json(
        env,
        &oauth::authorization_metadata_urls(&resource.authorization_server),
    )
    .await?;
    Ok((resource, oauth::parse_authorization_metadata(&body)?))
}

/// The servers a person's own turn sees, when `name` is one of them and signs in with OAuth
/// (`turn.server(name)` is then that server).
async fn persons_oauth_turn(
    env: &Env,
    identity: &Identity,
    name: &str,
) -> ApiResult<crate::mcp_turn::Turn> {
    if !config::valid_server_name(name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is not a server name"
        )));
    }
    let acting_for = [identity.sub.clone()];
    let caller = Caller::person(env, identity, &acting_for, "", &[]);
    let turn = crate::mcp_turn::turn(&caller)
        .await
        .map_err(|e| ApiError::new(409, "invalid_mcp_config", e))?;
    let server = turn.server(name).map_err(ApiError::not_found)?;
    if server.doc.auth != Auth::Oauth {
        return Err(ApiError::bad_request(format!(
            "MCP server {name:?} does not sign in with OAuth (its entry's auth is not {{\"type\": \"oauth\"}})"
        )));
    }
    Ok(turn)
}

/// `POST /v1/mcp/servers/:name/connect`: starts the caller's sign-in; answers the address their
/// browser goes to.
pub(crate) async fn connect_route(
    req: &Request,
    env: &Env,
    identity: &Identity,
    name: &str,
) -> ApiResult<Response> {
    let turn = persons_oauth_turn(env, identity, name).await?;
    let server = turn.server(name).map_err(ApiError::not_found)?;
    let failed = |e: String| {
        ApiError::new(
            502,
            "mcp_server_failed",
            format!("MCP server {name:?}: {e}"),
        )
    };
    let (resource, authorization) = discover(env, server).await.map_err(failed)?;
    let registration = authorization
        .registration_endpoint
        .as_deref()
        .ok_or_else(|| {
            failed("its authorization server offers no dynamic client registration".into())
        })?;
    let origin = req.url()?.origin().ascii_serialization();
    let redirect_uri = format!("{origin}{}", oauth::CALLBACK_PATH);
    let (status, body, _) = send(
        env,
        Method::Post,
        registration,
        Some((
            "application/json",
            oauth::registration_request(&redirect_uri).to_string(),
        )),
    )
    .await
    .map_err(failed)?;
    if !(200..300).contains(&status) {
        return Err(failed(format!(
            "its client registration answered {status}: {body}"
        )));
    }
    let client = oauth::parse_registration(&body).map_err(failed)?;
    let state = wuhu_core::jwt::base64url_encode(&random32().map_err(ApiError::internal)?);
    let (verifier, challenge) = oauth::pkce(random32().map_err(ApiError::internal)?);
    let expires_at_ms = now_ms() + oauth::PENDING_TTL_MS;
    let pending = Pending {
        tenant: identity.tenant.clone(),
        sub: identity.sub.clone(),
        source: source_name(&server.source).into(),
        server: name.to_string(),
        url: server.doc.url.clone(),
        resource: resource.resource.clone(),
        verifier,
        client,
        token_endpoint: authorization.token_endpoint.clone(),
        redirect_uri,
        expires_at_ms,
        code: None,
    };
    let url = oauth::authorization_url(
        &authorization,
        &pending,
        &challenge,
        &state,
        &resource.scopes,
    )
    .map_err(failed)?;
    put_sealed(env, &pending_key(&state), &pending)
        .await
        .map_err(ApiError::internal)?;
    Ok(crate::http::json_response(
        200,
        &oauth::ConnectResponse {
            authorization_url: url,
            expires_at: expires_at_ms / 1000,
        },
    ))
}

/// `GET /v1/mcp/callback?state=&code=`: where the authorization server sends the browser back.
/// The state is the request's credential (this route takes no other): unknown, used or expired
/// is `400`. It keeps the code with the sign-in and sends the browser to the web app's page that
/// finishes it as the person signed in there ([`finish_route`]): the browser that comes back
/// may not be the one of the person who began it.
pub(crate) async fn callback_route(req: &Request, env: &Env) -> ApiResult<Response> {
    let query = crate::http::query_pairs(req);
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let state = param("state").unwrap_or("");
    let (key, mut pending) = live_pending(env, state).await?;
    if pending.code.is_some() {
        return Err(ApiError::bad_request(
            "this sign-in was answered already: finish it in the web app, or connect again",
        ));
    }
    if let Some(error) = param("error") {
        delete(env, &key).await.map_err(ApiError::internal)?;
        let detail = param("error_description")
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        return Err(ApiError::bad_request(format!(
            "the authorization server did not sign you in to {:?}: {error}{detail}",
            pending.server
        )));
    }
    let code = param("code")
        .filter(|c| !c.is_empty() && c.len() <= 4096)
        .ok_or_else(|| ApiError::bad_request("the authorization server sent no code"))?;
    pending.code = Some(code.to_string());
    put_sealed(env, &key, &pending)
        .await
        .map_err(ApiError::internal)?;
    let mut response = Response::empty()?.with_status(302);
    response
        .headers_mut()
        .set("location", &oauth::finish_location(state))?;
    response.headers_mut().set("cache-control", "no-store")?;
    response
        .headers_mut()
        .set("referrer-policy", "no-referrer")?;
    Ok(response)
}

/// The sign-in `state` names, while it may still be finished (an expired one is deleted).
async fn live_pending(env: &Env, state: &str) -> ApiResult<(String, Pending)> {
    if !oauth::valid_state(state) {
        return Err(ApiError::bad_request("this sign-in has no valid state"));
    }
    let key = pending_key(state);
    let pending: Option<Pending> = get_sealed(env, &key).await.map_err(ApiError::internal)?;
    let Some(pending) = pending else {
        return Err(ApiError::bad_request(
            "this sign-in is unknown or was finished already: connect again",
        ));
    };
    if now_ms() > pending.expires_at_ms {
        delete(env, &key).await.map_err(ApiError::internal)?;
        return Err(ApiError::bad_request(
            "this sign-in took longer than 10 minutes: connect again",
        ));
    }
    Ok((key, pending))
}

/// `POST /v1/mcp/finish {state}`: the person who began a sign-in finishes it (the web app's page
/// the callback sent the browser to): the code becomes tokens, kept as their connection. Anyone
/// else is refused (`403`) and the sign-in is dropped; either way it is used once.
pub(crate) async fn finish_route(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
) -> ApiResult<Response> {
    let body = crate::http::read_body_bounded(req, 8 * 1024).await?;
    let request: oauth::FinishRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let (key, pending) = live_pending(env, &request.state).await?;
    // Used once, whoever finishes it.
    delete(env, &key).await.map_err(ApiError::internal)?;
    oauth::may_finish(&pending, &identity.tenant, &identity.sub)
        .map_err(|e| ApiError::new(403, "forbidden", e))?;
    let code = pending.code.as_deref().ok_or_else(|| {
        ApiError::new(
            409,
            "conflict",
            "the authorization server has not sent the browser back for this sign-in",
        )
    })?;
    let failed = |e: String| {
        ApiError::new(
            502,
            "mcp_server_failed",
            format!("MCP server {:?}: {e}", pending.server),
        )
    };
    let (_, body, _) = send(
        env,
        Method::Post,
        &pending.token_endpoint,
        Some((
            "application/x-www-form-urlencoded",
            oauth::code_request(&pending, code),
        )),
    )
    .await
    .map_err(failed)?;
    let now = now_ms();
    let (access_token, refresh_token, expires_at_ms) =
        oauth::parse_tokens(&body, now, None).map_err(failed)?;
    let connection = Connection {
        url: pending.url.clone(),
        access_token,
        refresh_token,
        expires_at_ms,
        client: pending.client.clone(),
        token_endpoint: pending.token_endpoint.clone(),
        resource: pending.resource.clone(),
        connected_at_ms: now,
    };
    let key = connection_key(
        &pending.tenant,
        &pending.sub,
        &pending.source,
        &pending.server,
    );
    put_sealed(env, &key, &connection)
        .await
        .map_err(ApiError::internal)?;
    Ok(crate::http::json_response(
        200,
        &oauth::FinishResponse {
            server: pending.server.clone(),
        },
    ))
}

/// `DELETE /v1/mcp/servers/:name/connection`: forgets the caller's connection.
pub(crate) async fn disconnect_route(
    env: &Env,
    identity: &Identity,
    name: &str,
) -> ApiResult<Response> {
    let turn = persons_oauth_turn(env, identity, name).await?;
    let server = turn.server(name).map_err(ApiError::not_found)?;
    let key = connection_key(
        &identity.tenant,
        &identity.sub,
        source_name(&server.source),
        name,
    );
    let existed = delete(env, &key).await.map_err(ApiError::internal)?;
    Ok(crate::http::json_response(
        200,
        &oauth::DisconnectResponse {
            disconnected: existed,
        },
    ))
}

/// Whether `sub` has connected `server`.
pub(crate) async fn connected(env: &Env, tenant: &str, sub: &str, server: &Server) -> bool {
    let key = connection_key(tenant, sub, source_name(&server.source), &server.doc.name);
    let Ok(bucket) = env.bucket(BUCKET) else {
        return false;
    };
    bucket.head(key).await.ok().flatten().is_some()
}

/// The `Authorization` header a turn's call to an OAuth server carries: the token of the one
/// person the turn acts for, refreshed first when it is about to expire (or `force`: the server
/// refused it).
///
/// # Errors
/// The tool error: the turn acts for several people or nobody, the person has not connected,
/// the server's URL changed since, the refresh failed.
pub(crate) async fn authorization(
    caller: &Caller<'_>,
    server: &Server,
    force: bool,
) -> Result<String, String> {
    let name = &server.doc.name;
    let Some(sub) = wuhu_core::authority::sole_member(caller.acting_for) else {
        return Err(format!(
            "MCP server {name:?} signs in per person (OAuth): it is used only in turns that act for one person"
        ));
    };
    let key = connection_key(caller.tenant, sub, source_name(&server.source), name);
    let Some(mut connection) = get_sealed::<Connection>(caller.env, &key).await? else {
        return Err(format!(
            "MCP server {name:?} is not connected for {sub}: they connect it on the web app's MCP page (POST /v1/mcp/servers/{name}/connect)"
        ));
    };
    if connection.url != server.doc.url {
        return Err(format!(
            "MCP server {name:?} moved to another URL since {sub} connected it: they connect it again"
        ));
    }
    if force || connection.stale(now_ms()) {
        let Some(request) = connection.refresh_request() else {
            return Err(format!(
                "MCP server {name:?}: {sub}'s sign-in expired and cannot be refreshed: they connect it again"
            ));
        };
        let (_, body, _) = send(
            caller.env,
            Method::Post,
            &connection.token_endpoint,
            Some(("application/x-www-form-urlencoded", request)),
        )
        .await?;
        let (access, refresh, expires) =
            oauth::parse_tokens(&body, now_ms(), connection.refresh_token.as_deref()).map_err(
                |e| format!("MCP server {name:?}: refreshing {sub}'s sign-in failed: {e}"),
            )?;
        connection.access_token = access;
        connection.refresh_token = refresh;
        connection.expires_at_ms = expires;
        put_sealed(caller.env, &key, &connection).await?;
    }
    Ok(format!("Bearer {}", connection.access_token))
}
