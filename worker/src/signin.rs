//! Sign-in routes: tokens for programs (`/v1/tokens`) and the browser's cookie session
//! (`/v1/auth/session`, `/v1/auth/logout`, `/v1/auth/me`). The rules are in
//! `wuhu_core::tokens`; the rows live in `token_registry`. `docs/api.md`, "Sign-in".

use worker::{Env, Headers, Method, Request, Response};
use wuhu_core::authority::valid_name;
use wuhu_core::tokens::lineage::{self, Making, Presented};
use wuhu_core::tokens::{
    CredentialRecord, MintError, SESSION_TYP, plan_mint, session_clear_cookie, session_expiry,
    session_set_cookie,
};
use wuhu_core::wire::{
    AuthVia, Claims, CredentialKind, MintTokenRequest, MintTokenResponse, OkResponse,
    RevokeAllRequest, WhoAmI,
};

use crate::auth::{Authenticated, TokenConfig, now_secs, sign};
use crate::http::{ApiError, ApiResult, json_response, parse_json, read_body};
use crate::token_registry;

/// Routes `/v1/tokens…` and `/v1/auth/…` (`rest` is the path after `/v1/`).
pub(crate) async fn route(
    req: &mut Request,
    env: &Env,
    auth: &Authenticated,
    rest: &[&str],
    method: Method,
) -> ApiResult<Response> {
    match (rest, method) {
        (["tokens"], Method::Post) => mint(req, env, auth).await,
        (["tokens"], Method::Get) => {
            let pairs = crate::http::query_pairs(req);
            let list = wuhu_core::calls::tokens::List {
                all: crate::http::query(&pairs, "all").is_some_and(|v| v == "1" || v == "true"),
                sub: crate::http::query(&pairs, "sub").filter(|s| !s.is_empty()),
                current: auth.jti.clone(),
            };
            let tokens = token_registry::list(env, &auth.identity, &list).await?;
            Ok(json_response(200, &tokens))
        }
        (["tokens", "revoke-all"], Method::Post) => revoke_all(req, env, auth).await,
        // Not a token id: `DELETE /v1/tokens/revoke-all` is a method this route does not take.
        (["tokens", jti], Method::Delete) if *jti != "revoke-all" => {
            let revoked = token_registry::revoke(env, &auth.identity, jti).await?;
            Ok(json_response(200, &revoked))
        }
        (["auth", "session"], Method::Post) => create_session(env, auth).await,
        (["auth", "logout"], Method::Post) => logout(env, auth).await,
        (["auth", "me"], Method::Get) => Ok(json_response(
            200,
            &who_am_i(auth, auth.via, auth.expires_at),
        )),
        (["tokens"] | ["tokens", _] | ["auth", "session" | "logout" | "me"], _) => {
            Err(ApiError::new(
                405,
                "method_not_allowed",
                "method not allowed on this route",
            ))
        }
        _ => Err(ApiError::not_found("no such route")),
    }
}

fn who_am_i(auth: &Authenticated, via: AuthVia, expires_at: i64) -> WhoAmI {
    WhoAmI {
        sub: auth.identity.sub.clone(),
        tenant: auth.identity.tenant.clone(),
        role: auth.identity.role,
        via,
        expires_at,
    }
}

/// Claims for a token the server signs, with `iss`/`aud` when the server checks them.
fn claims(
    config: &TokenConfig,
    record: &CredentialRecord,
    tenant: &str,
    typ: Option<&str>,
) -> Claims {
    Claims {
        sub: record.sub.clone(),
        tenant: tenant.to_string(),
        exp: record.expires_at,
        typ: typ.map(str::to_string),
        role: Some(record.role.as_str().to_string()),
        nbf: None,
        runner_kind: record.runner_kind.map(|k| k.as_str().to_string()),
        jti: Some(record.jti.clone()),
        iat: Some(record.created_at),
        iss: config.issuer.clone(),
        aud: config.audience.clone().map(serde_json::Value::String),
    }
}

fn mint_error(e: MintError) -> ApiError {
    let (status, code) = e.status_code();
    ApiError::new(status, code, e.to_string())
}

/// The request's credential as the lineage rules see it.
fn presented(auth: &Authenticated) -> Presented<'_> {
    match (auth.via, auth.jti.as_deref()) {
        (AuthVia::Bearer, Some(jti)) => Presented::Registered {
            jti,
            expires_at: auth.expires_at,
        },
        (AuthVia::Bearer, None) => Presented::Operator,
        (AuthVia::Cookie, _) => Presented::CookieSession,
        (AuthVia::Access, _) => Presented::Access {
            email: &auth.identity.sub,
            issued_at: auth.issued_at,
        },
    }
}

async fn mint(req: &mut Request, env: &Env, auth: &Authenticated) -> ApiResult<Response> {
    let request: MintTokenRequest = parse_json(&read_body(req).await?)?;
    let config = TokenConfig::from_env(env)?;
    let now = now_secs();
    // What it may be made from first: a cookie session is refused whatever it asks for.
    let source = lineage::source(presented(auth), Making::Token, now).map_err(mint_error)?;
    let plan =
        plan_mint(&auth.identity.principal(), &request, now, config.limits).map_err(mint_error)?;
    let (parent, root) = source.lineage();
    let mut record = CredentialRecord {
        jti: uuid::Uuid::new_v4().to_string(),
        sub: plan.sub,
        kind: plan.kind,
        name: plan.name,
        role: plan.role,
        runner_kind: plan.runner_kind,
        created_by: auth.identity.sub.clone(),
        created_at: now,
        expires_at: source.cap(plan.expires_at),
        parent,
        root,
    };
    // The registry adopts the parent's root and expiry as it holds them now.
    let registered = token_registry::register(env, &auth.identity, &record).await?;
    record.expires_at = registered.expires_at;
    record.root = registered.root;
    let typ = (record.kind == CredentialKind::Runner).then_some("runner");
    let token = sign(env, &claims(&config, &record, &auth.identity.tenant, typ))?;
    Ok(json_response(
        201,
        &MintTokenResponse {
            info: record.info(),
            token,
        },
    ))
}

async fn create_session(env: &Env, auth: &Authenticated) -> ApiResult<Response> {
    let config = TokenConfig::from_env(env)?;
    let now = now_secs();
    let source =
        lineage::source(presented(auth), Making::CookieSession, now).map_err(mint_error)?;
    let (parent, root) = source.lineage();
    let mut record = CredentialRecord {
        jti: uuid::Uuid::new_v4().to_string(),
        sub: auth.identity.sub.clone(),
        kind: CredentialKind::Session,
        name: format!("browser session ({})", via_name(auth.via)),
        role: auth.identity.role,
        runner_kind: None,
        created_by: auth.identity.sub.clone(),
        created_at: now,
        expires_at: source.cap(session_expiry(now, auth.expires_at)),
        parent,
        root,
    };
    let registered = token_registry::register(env, &auth.identity, &record).await?;
    record.expires_at = registered.expires_at;
    record.root = registered.root;
    let token = sign(
        env,
        &claims(&config, &record, &auth.identity.tenant, Some(SESSION_TYP)),
    )?;
    let body = who_am_i(auth, AuthVia::Cookie, record.expires_at);
    with_cookie(
        json_response(200, &body),
        &session_set_cookie(&token, record.expires_at - now),
    )
}

fn via_name(via: AuthVia) -> &'static str {
    match via {
        AuthVia::Bearer => "token",
        AuthVia::Cookie => "cookie",
        AuthVia::Access => "access",
    }
}

async fn logout(env: &Env, auth: &Authenticated) -> ApiResult<Response> {
    let (AuthVia::Cookie, Some(jti)) = (auth.via, auth.jti.as_deref()) else {
        return Err(ApiError::bad_request(
            "no cookie session to end: revoke tokens with DELETE /v1/tokens/:jti (Access: /cdn-cgi/access/logout)",
        ));
    };
    token_registry::revoke(env, &auth.identity, jti).await?;
    with_cookie(
        json_response(200, &OkResponse { ok: true }),
        &session_clear_cookie(),
    )
}

/// `POST /v1/tokens/revoke-all` (body optional: `{"sub"}` for an admin naming someone else):
/// every registered credential of the user and everything made from them. A caller who ends
/// their own cookie session this way gets the cookie cleared too.
async fn revoke_all(req: &mut Request, env: &Env, auth: &Authenticated) -> ApiResult<Response> {
    let body = read_body(req).await?;
    let request: RevokeAllRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RevokeAllRequest::default()
    } else {
        parse_json(&body)?
    };
    let sub = request.sub.unwrap_or_else(|| auth.identity.sub.clone());
    if !valid_name(&sub) {
        return Err(ApiError::bad_request(
            "sub must be 1-128 of A-Z a-z 0-9 _ . @ + -",
        ));
    }
    let answer = token_registry::revoke_all(env, &auth.identity, &sub).await?;
    let response = json_response(200, &answer);
    if auth.via == AuthVia::Cookie && sub == auth.identity.sub {
        with_cookie(response, &session_clear_cookie())
    } else {
        Ok(response)
    }
}

fn with_cookie(response: Response, cookie: &str) -> ApiResult<Response> {
    let headers = Headers::new();
    for (name, value) in response.headers().entries() {
        headers.append(&name, &value)?;
    }
    headers.append("set-cookie", cookie)?;
    headers.set("cache-control", "no-store")?;
    Ok(response.with_headers(headers))
}
