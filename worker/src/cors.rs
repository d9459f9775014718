//! CORS for the origins listed in `WUHU_ALLOWED_ORIGINS` (`wuhu_core::browser` decides the
//! headers): preflights are answered here, before authentication; every answer to a listed
//! origin carries `Access-Control-Allow-Origin`, streams included. Unlisted origins get no CORS
//! header at all (a preflight from one is 403).

use worker::{Env, Headers, Method, Request, Response};
use wuhu_core::browser::{AllowedOrigins, cors_preflight_headers, cors_response_headers};

use crate::http::{ApiError, ApiResult};

fn allowed(env: &Env) -> ApiResult<AllowedOrigins> {
    let list = env
        .var("WUHU_ALLOWED_ORIGINS")
        .ok()
        .map(|v| v.to_string())
        .unwrap_or_default();
    AllowedOrigins::parse(&list).map_err(|e| ApiError::new(500, "server_misconfigured", e))
}

/// The request's `Origin` when it is listed.
pub(crate) fn listed_origin(req: &Request, env: &Env) -> Option<String> {
    let origin = req.headers().get("origin").ok().flatten()?;
    allowed(env).ok()?.allows(&origin).then_some(origin)
}

/// Answers a CORS preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`);
/// `None` for any other request.
pub(crate) fn preflight(req: &Request, env: &Env) -> Option<ApiResult<Response>> {
    if req.method() != Method::Options {
        return None;
    }
    let headers = req.headers();
    let origin = headers.get("origin").ok().flatten()?;
    headers
        .get("access-control-request-method")
        .ok()
        .flatten()?;
    Some((|| {
        if !allowed(env)?.allows(&origin) {
            return Err(ApiError::new(
                403,
                "forbidden",
                "this origin is not in WUHU_ALLOWED_ORIGINS",
            ));
        }
        let out = Headers::new();
        for (name, value) in cors_preflight_headers(&origin) {
            out.set(name, &value)?;
        }
        Ok(Response::empty()?.with_status(204).with_headers(out))
    })())
}

/// Adds the CORS headers for a listed `origin` to a response's headers.
pub(crate) fn decorate(headers: &Headers, origin: &str) {
    for (name, value) in cors_response_headers(origin) {
        let _ = headers.set(name, &value);
    }
}
