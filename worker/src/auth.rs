//! Request authentication: bearer JWTs (HS256, secret `WUHU_JWT_SECRET`), the browser's session
//! cookie, Cloudflare Access (see `access.rs`), and the registry check of revocable tokens.
//! Signatures are checked here; what the claims may say is decided by `wuhu_core::authority`,
//! `wuhu_core::tokens` and `wuhu_core::access`.

use worker::{Env, Request};
use wuhu_core::authority::{
    self, DEFAULT_MAX_RUNNER_TOKEN_SECS, DEFAULT_MAX_USER_TOKEN_SECS, TokenLimits,
};
use wuhu_core::browser::{check_cross_site, cross_site_method};
use wuhu_core::jwt::{self, Jws, JwtError};
use wuhu_core::tokens::{SESSION_COOKIE, SESSION_TYP, cookie_value};
use wuhu_core::wire::{AuthVia, Claims};

pub(crate) use wuhu_core::authority::TokenKind;

use crate::http::{ApiError, ApiResult};
pub(crate) use crate::identity::{Authenticated, Identity, now_secs};
use crate::{access, token_registry};

/// Authenticates `req` for a route that accepts `kind`.
///
/// Credentials, first found wins: `Authorization: Bearer` (HS256, the only one runners may
/// use), the `wuhu_session` cookie, Cloudflare Access's `Cf-Access-Jwt-Assertion` header, its
/// `CF_Authorization` cookie (both only when Access is configured). A JWT carrying `jti` is
/// accepted only while the tenant's token registry lists it: one registry call, only for such
/// tokens. Credentials a browser attaches by itself (cookies, Access) must pass the cross-site
/// check on state-changing methods (403 otherwise).
///
/// A missing, empty or short secret fails every route with 500 `server_misconfigured`, before
/// the token is looked at: a server with a weak secret never works.
pub(crate) async fn authenticate(
    req: &Request,
    env: &Env,
    kind: TokenKind,
) -> ApiResult<Authenticated> {
    let secret = env.secret("WUHU_JWT_SECRET").ok().map(|s| s.to_string());
    authority::check_secret(secret.as_deref())
        .map_err(|e| ApiError::new(500, "server_misconfigured", e.to_string()))?;
    let secret = secret.unwrap_or_default();
    let config = TokenConfig::from_env(env)?;
    let header = |name: &str| req.headers().get(name).ok().flatten();
    let authenticated = if let Some(value) = header("authorization") {
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| {
                ApiError::unauthorized("authorization header must be 'Bearer <token>'")
            })?;
        let (identity, claims) = verify(token.trim(), &secret, kind, &config)?;
        Authenticated {
            identity,
            via: AuthVia::Bearer,
            jti: claims.jti,
            expires_at: claims.exp,
            issued_at: claims.iat,
        }
    } else if kind == TokenKind::Runner {
        return Err(ApiError::unauthorized("missing bearer token"));
    } else {
        let cookies = header("cookie").unwrap_or_default();
        let authenticated = if let Some(token) = cookie_value(&cookies, SESSION_COOKIE) {
            let (identity, claims) = verify(token, &secret, kind, &config)?;
            if claims.typ.as_deref() != Some(SESSION_TYP) || claims.jti.is_none() {
                return Err(ApiError::unauthorized(
                    "the wuhu_session cookie does not hold a session",
                ));
            }
            Authenticated {
                identity,
                via: AuthVia::Cookie,
                jti: claims.jti,
                expires_at: claims.exp,
                issued_at: claims.iat,
            }
        } else {
            let access_token = header("cf-access-jwt-assertion")
                .or_else(|| cookie_value(&cookies, "CF_Authorization").map(str::to_string));
            match (access::config(env)?, access_token) {
                (Some(config), Some(token)) => access::verify(&token, &config).await?,
                _ => return Err(ApiError::unauthorized("missing bearer token")),
            }
        };
        // Ambient credentials: a foreign page could make the browser send them.
        let host = header("host")
            .or_else(|| {
                req.url().ok().and_then(|u| {
                    u.host_str()
                        .map(|h| u.port().map_or(h.to_string(), |p| format!("{h}:{p}")))
                })
            })
            .unwrap_or_default();
        // A WebSocket upgrade is a GET that opens a channel of actions: checked as
        // state-changing (cross-site WebSocket hijacking).
        check_cross_site(
            cross_site_method(req.method().as_ref(), header("upgrade").as_deref()),
            header("sec-fetch-site").as_deref(),
            header("origin").as_deref(),
            &host,
        )
        .map_err(|e| ApiError::new(403, "forbidden", e.to_string()))?;
        authenticated
    };
    // A registered credential must still be in the registry, and acts with no more than its
    // lineage's root grants now (an Access identity demoted since it minted it).
    let mut authenticated = authenticated;
    if let Some(jti) = &authenticated.jti {
        match token_registry::check(env, &authenticated.identity, jti).await? {
            Ok(role) => {
                authenticated.identity.role = authenticated.identity.role.at_most(role);
            }
            Err(reason) => return Err(ApiError::unauthorized(reason)),
        }
    }
    Ok(authenticated)
}

/// Token settings from the environment.
pub(crate) struct TokenConfig {
    pub(crate) limits: TokenLimits,
    pub(crate) issuer: Option<String>,
    pub(crate) audience: Option<String>,
}

impl TokenConfig {
    pub(crate) fn from_env(env: &Env) -> ApiResult<TokenConfig> {
        let var = |name: &str| {
            env.var(name)
                .ok()
                .map(|v| v.to_string())
                .filter(|v| !v.is_empty())
        };
        let days = |name: &str, default_secs: i64| -> ApiResult<i64> {
            match var(name) {
                None => Ok(default_secs),
                Some(v) => v
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|d| *d > 0)
                    .map(|d| d * 86_400)
                    .ok_or_else(|| {
                        ApiError::new(
                            500,
                            "server_misconfigured",
                            format!("{name} must be a positive number of days"),
                        )
                    }),
            }
        };
        Ok(TokenConfig {
            limits: TokenLimits {
                max_user_secs: days("WUHU_TOKEN_MAX_DAYS_USER", DEFAULT_MAX_USER_TOKEN_SECS)?,
                max_runner_secs: days("WUHU_TOKEN_MAX_DAYS_RUNNER", DEFAULT_MAX_RUNNER_TOKEN_SECS)?,
            },
            issuer: var("WUHU_JWT_ISSUER"),
            audience: var("WUHU_JWT_AUDIENCE"),
        })
    }
}

/// Verifies a token string: signature, algorithm, `iss`/`aud` when configured, then the claims.
fn verify(
    token: &str,
    secret: &str,
    kind: TokenKind,
    config: &TokenConfig,
) -> ApiResult<(Identity, Claims)> {
    let parsed = Jws::parse(token).map_err(|e| ApiError::unauthorized(e.to_string()))?;
    parsed.verify_hs256(secret.as_bytes()).map_err(|e| {
        ApiError::unauthorized(match e {
            JwtError::Algorithm => "token algorithm must be HS256".to_string(),
            e => e.to_string(),
        })
    })?;
    let claims: Claims = parsed
        .claims()
        .map_err(|e| ApiError::unauthorized(e.to_string()))?;
    let expect = jwt::Expect {
        issuer: config.issuer.as_deref(),
        audience: config.audience.as_deref(),
    };
    jwt::check_registered(&claims, expect, now_secs())
        .map_err(|e| ApiError::unauthorized(e.to_string()))?;
    let grant = authority::check_claims(&claims, kind, now_secs(), config.limits)
        .map_err(|e| ApiError::unauthorized(e.to_string()))?;
    let identity = Identity {
        sub: grant.principal.sub,
        tenant: grant.principal.tenant,
        role: grant.principal.role,
        runner_kind: grant.runner_kind,
    };
    Ok((identity, claims))
}

/// Signs `claims` with the server's secret (HS256): tokens from `/v1/tokens` and cookie
/// sessions.
pub(crate) fn sign(env: &Env, claims: &Claims) -> ApiResult<String> {
    let secret = env.secret("WUHU_JWT_SECRET").ok().map(|s| s.to_string());
    authority::check_secret(secret.as_deref())
        .map_err(|e| ApiError::new(500, "server_misconfigured", e.to_string()))?;
    let secret = secret.unwrap_or_default();
    Ok(jwt::sign_hs256(claims, secret.as_bytes()))
}
