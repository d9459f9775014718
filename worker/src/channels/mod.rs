//! Chat channels: the admin API (`/v1/channels…`) and the platform hooks (`/hooks/…`).
//!
//! Rules live in `wuhu_core::channels`; this module routes and [`actor::ChannelActor`] stores
//! and performs. One `ChannelActor` per binding (`binding:<id>`) holds the binding's sealed
//! credentials, its dedupe keys, its thread → session map, the turns it watches and its outbox;
//! one per tenant (`registry:<tenant>`) lists the tenant's bindings (at most
//! `MAX_BINDINGS_PER_TENANT`). Hooks carry no token: the binding id in the URL names the actor,
//! and the platform's signature, checked there with the binding's secret, authenticates.

pub(crate) mod actor;

use worker::{Env, Method, Request, Response};
use wuhu_core::calls::channels::{self as channel_calls, RegistryCall};
use wuhu_core::calls::{CallError, Method as CallMethod};
use wuhu_core::channels::seal::ChannelKey;

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult, json_response, read_body};
use crate::internal;

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
    route: &[&str],
    method: CallMethod,
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
    let body = match method {
        CallMethod::Post | CallMethod::Patch | CallMethod::Put => read_body(req).await?,
        _ => Vec::new(),
    };
    let call = channel_calls::decode_public(method, route, &body, &origin).map_err(|e| {
        match e {
            // An id that is no binding id is the same unknown channel as any other.
            CallError::UnknownRoute => ApiError::not_found("no such channel"),
            other => internal::call_error(other),
        }
    })?;
    let stub = stub(env, &format!("registry:{}", identity.tenant))?;
    match call {
        RegistryCall::ListBindings(c) => internal::relay(&stub, identity, &c).await,
        RegistryCall::CreateBinding(c) => {
            let created = internal::call(&stub, identity, &c).await?;
            Ok(json_response(201, &created))
        }
        RegistryCall::GetBinding(c) => internal::relay(&stub, identity, &c).await,
        RegistryCall::PatchBinding(c) => internal::relay(&stub, identity, &c).await,
        RegistryCall::DeleteBinding(c) => {
            internal::call(&stub, identity, &c).await?;
            Ok(Response::empty()?.with_status(204))
        }
        RegistryCall::BindingMembers(c) => internal::relay(&stub, identity, &c).await,
        // Between actors only: `decode_public` never makes it.
        RegistryCall::SlackPinned(_) => Err(ApiError::not_found("no such channel")),
    }
}

/// `POST /hooks/<platform>/:id`: handed to the binding's actor, which verifies it.
pub(crate) async fn hook(mut req: Request, env: &Env, segments: &[&str]) -> ApiResult<Response> {
    let ["hooks", platform, id] = segments else {
        return Err(ApiError::not_found("no such route"));
    };
    let Some(platform) = wuhu_core::channels::Platform::parse(platform) else {
        return Err(ApiError::not_found("no such route"));
    };
    if req.method() != Method::Post {
        return Err(ApiError::new(405, "method_not_allowed", "hooks take POST"));
    }
    if !channel_calls::valid_binding_id(id) {
        // Same answer as an unknown binding: nothing tells ids apart.
        return Err(ApiError::unauthorized("unknown binding or bad signature"));
    }
    let body = read_body(&mut req).await?;
    let body = String::from_utf8(body)
        .map_err(|_| ApiError::bad_request("a hook's body must be utf-8 text"))?;
    // The actor takes no identity from a hook; identity headers are dropped all the same (the
    // generic platform's own `x-wuhu-signature` and `x-wuhu-timestamp` stay).
    let headers = req
        .headers()
        .entries()
        .filter(|(name, _)| {
            !matches!(
                name.as_str(),
                "x-wuhu-sub" | "x-wuhu-tenant" | "x-wuhu-role" | "x-wuhu-runner-kind"
            )
        })
        .collect();
    let call = channel_calls::Hook {
        platform,
        headers,
        body,
    };
    let stub = stub(env, &format!("binding:{id}"))?;
    internal::stream(&stub, &Identity::system(""), &call).await
}
