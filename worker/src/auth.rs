//! Bearer JWT verification (HS256, secret `WUHU_JWT_SECRET`).

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use worker::{Env, Request};
use wuhu_core::wire::Claims;

use crate::http::{ApiError, ApiResult};

/// Which kind of token a route accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// A person's token (no `typ`).
    User,
    /// A runner's token (`typ: runner`).
    #[allow(dead_code)]
    Runner,
}

/// The verified identity of a request.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    pub(crate) sub: String,
    pub(crate) tenant: String,
}

/// Verifies the bearer token of `req` for a route that accepts `kind`.
pub(crate) fn authenticate(req: &Request, env: &Env, kind: TokenKind) -> ApiResult<Identity> {
    let secret = env
        .secret("WUHU_JWT_SECRET")
        .map(|s| s.to_string())
        .map_err(|_| ApiError::new(500, "server_misconfigured", "WUHU_JWT_SECRET is not set"))?;
    let header = req
        .headers()
        .get("authorization")
        .ok()
        .flatten()
        .ok_or_else(|| ApiError::unauthorized("missing bearer token"))?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or_else(|| ApiError::unauthorized("authorization header must be 'Bearer <token>'"))?;
    verify(token.trim(), &secret, kind)
}

/// Verifies a token string.
pub(crate) fn verify(token: &str, secret: &str, kind: TokenKind) -> ApiResult<Identity> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp", "sub"]);
    validation.leeway = 0;
    let data = decode::<Claims>(
        token,
        &DecodingKey::from_secret(secret.as_bytes()),
        &validation,
    )
    .map_err(|e| {
        use jsonwebtoken::errors::ErrorKind;
        let why = match e.kind() {
            ErrorKind::ExpiredSignature => "token expired",
            ErrorKind::InvalidSignature => "bad token signature",
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                "token algorithm must be HS256"
            }
            _ => "invalid token",
        };
        ApiError::unauthorized(why)
    })?;
    let claims = data.claims;
    let is_runner = claims.typ.as_deref() == Some("runner");
    match (kind, is_runner) {
        (TokenKind::User, true) => {
            return Err(ApiError::unauthorized(
                "runner tokens cannot call the user api",
            ));
        }
        (TokenKind::Runner, false) => {
            return Err(ApiError::unauthorized("a runner token is required"));
        }
        _ => {}
    }
    if claims.sub.is_empty() || claims.tenant.is_empty() || !valid_tenant(&claims.tenant) {
        return Err(ApiError::unauthorized(
            "token must name a sub and a tenant ([A-Za-z0-9_.-], up to 64 chars)",
        ));
    }
    Ok(Identity {
        sub: claims.sub,
        tenant: claims.tenant,
    })
}

/// Tenants become object-key prefixes and Durable Object names, so they are restricted.
fn valid_tenant(tenant: &str) -> bool {
    tenant.len() <= 64
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && tenant != "."
        && tenant != ".."
}
