//! Chat channels: the admin API (`/v1/channels…`) and the platform hooks (`/hooks/…`).
//!
//! Rules live in `wuhu_core::channels`; this module routes and [`actor::ChannelActor`] stores
//! and performs. One `ChannelActor` per binding (`binding:<id>`) holds the binding's sealed
//! credentials, its dedupe keys, its thread → session map, the turns it watches and its outbox;
//! one per tenant (`registry:<tenant>`) lists the tenant's bindings (at most
//! `MAX_BINDINGS_PER_TENANT`). Hooks carry no token: the binding id in the URL names the actor,
//! and the platform's signature, checked there with the binding's secret, authenticates.

pub(crate) mod actor;

use worker::{Env, Headers, Method, Request, RequestInit, Response};
use wuhu_core::channels::seal::ChannelKey;

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult, read_body};

pub use actor::ChannelActor;

/// The channel key from `WUHU_CHANNEL_KEY`, or 500 `server_misconfigured`.
pub(crate) fn channel_key(env: &Env) -> ApiResult<ChannelKey> {
    let text = env
        .secret("WUHU_CHANNEL_KEY")
        .map(|s| s.to_string())
        .or_else(|_| env.var("WUHU_CHANNEL_KEY").map(|v| v.to_string()))
        .ok();
    ChannelKey::parse(text.as_deref())
        .map_err(|e| ApiError::new(500, "server_misconfigured", e.to_string()))
}

/// Whether `id` looks like a binding id (a UUID).
fn valid_binding_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn stub(env: &Env, name: &str) -> ApiResult<worker::Stub> {
    Ok(env
        .durable_object("CHANNELS")?
        .id_from_name(name)?
        .get_stub()?)
}

/// The public origin hook URLs are built on: `WUHU_PUBLIC_URL`, else the request's own.
fn origin(req: &Request, env: &Env) -> String {
    if let Ok(url) = env.var("WUHU_PUBLIC_URL") {
        let url = url.to_string();
        if !url.is_empty() {
            return url.trim_end_matches('/').to_string();
        }
    }
    req.url()
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_default()
}

/// `GET|POST /v1/channels`, `GET|PATCH|DELETE /v1/channels/:id`,
/// `GET|PUT|DELETE /v1/channels/:id/members`: admins only.
pub(crate) async fn api(
    req: &mut Request,
    env: &Env,
    identity: &Identity,
    segments: &[&str],
    method: Method,
) -> ApiResult<Response> {
    if !identity.principal().is_admin() {
        return Err(ApiError::new(
            403,
            "forbidden",
            "only an admin of the tenant may manage channels",
        ));
    }
    channel_key(env)?;
    let origin = origin(req, env);
    let (path, target) = match (segments, &method) {
        (["v1", "channels"], Method::Get) => ("/registry/list".to_string(), None),
        (["v1", "channels"], Method::Post) => ("/registry/create".to_string(), None),
        (["v1", "channels", id], Method::Get | Method::Patch | Method::Delete) => {
            if !valid_binding_id(id) {
                return Err(ApiError::not_found("no such channel"));
            }
            let action = match method {
                Method::Get => "get",
                Method::Patch => "patch",
                _ => "delete",
            };
            (format!("/registry/{action}?id={id}"), Some(*id))
        }
        (["v1", "channels", id, "members"], Method::Get | Method::Put | Method::Delete) => {
            if !valid_binding_id(id) {
                return Err(ApiError::not_found("no such channel"));
            }
            (format!("/registry/members?id={id}"), Some(*id))
        }
        (["v1", "channels"] | ["v1", "channels", _] | ["v1", "channels", _, "members"], _) => {
            return Err(ApiError::new(
                405,
                "method_not_allowed",
                "method not allowed on this route",
            ));
        }
        _ => return Err(ApiError::not_found("no such route")),
    };
    let _ = target;
    let body = match method {
        Method::Post | Method::Patch | Method::Put => Some(read_body(req).await?),
        _ => None,
    };
    let headers = Headers::new();
    identity.set_headers(&headers)?;
    headers.set("x-wuhu-origin", &origin)?;
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(headers);
    if let Some(body) = body {
        let array = js_sys::Uint8Array::from(body.as_slice());
        init.with_body(Some(array.into()));
    }
    let internal = Request::new_with_init(&format!("https://channels{path}"), &init)?;
    Ok(stub(env, &format!("registry:{}", identity.tenant))?
        .fetch_with_request(internal)
        .await?)
}

/// `POST /hooks/<platform>/:id`: handed to the binding's actor, which verifies it.
pub(crate) async fn hook(mut req: Request, env: &Env, segments: &[&str]) -> ApiResult<Response> {
    let ["hooks", platform, id] = segments else {
        return Err(ApiError::not_found("no such route"));
    };
    if wuhu_core::channels::Platform::parse(platform).is_none() {
        return Err(ApiError::not_found("no such route"));
    }
    if req.method() != Method::Post {
        return Err(ApiError::new(405, "method_not_allowed", "hooks take POST"));
    }
    if !valid_binding_id(id) {
        // Same answer as an unknown binding: nothing tells ids apart.
        return Err(ApiError::unauthorized("unknown binding or bad signature"));
    }
    let body = read_body(&mut req).await?;
    let headers = Headers::new();
    for (name, value) in req.headers().entries() {
        // The actor takes no identity from a hook; internal headers are dropped all the same.
        if matches!(
            name.as_str(),
            "x-wuhu-sub" | "x-wuhu-tenant" | "x-wuhu-role" | "x-wuhu-runner-kind" | "x-wuhu-origin"
        ) {
            continue;
        }
        headers.set(&name, &value)?;
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Post).with_headers(headers);
    let array = js_sys::Uint8Array::from(body.as_slice());
    init.with_body(Some(array.into()));
    let internal = Request::new_with_init(&format!("https://channels/hook/{platform}"), &init)?;
    Ok(stub(env, &format!("binding:{id}"))?
        .fetch_with_request(internal)
        .await?)
}
