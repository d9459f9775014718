//! Bearer JWT verification (HS256, secret `WUHU_JWT_SECRET`). The signature is checked here; what
//! the claims may say is decided by `wuhu_core::authority::check_claims`.

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use worker::{Date, Env, Headers, Request};
use wuhu_core::authority::{
    self, DEFAULT_MAX_RUNNER_TOKEN_SECS, DEFAULT_MAX_USER_TOKEN_SECS, Principal, Role, TokenLimits,
};
use wuhu_core::wire::Claims;
use wuhu_core::wire::runner::RunnerKind;

pub(crate) use wuhu_core::authority::TokenKind;

use crate::http::{ApiError, ApiResult};

/// The verified identity of a request.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    pub(crate) sub: String,
    pub(crate) tenant: String,
    pub(crate) role: Role,
    /// Runner tokens only: the kind the token allows.
    pub(crate) runner_kind: Option<RunnerKind>,
}

impl Identity {
    pub(crate) fn principal(&self) -> Principal {
        Principal {
            sub: self.sub.clone(),
            tenant: self.tenant.clone(),
            role: self.role,
        }
    }

    /// Sets the internal identity headers (`x-wuhu-sub`, `x-wuhu-tenant`, `x-wuhu-role`). Only
    /// the router and actors build internal requests, so these are trusted on the other side.
    pub(crate) fn set_headers(&self, headers: &Headers) -> worker::Result<()> {
        headers.set("x-wuhu-sub", &self.sub)?;
        headers.set("x-wuhu-tenant", &self.tenant)?;
        headers.set("x-wuhu-role", self.role.as_str())?;
        if let Some(kind) = self.runner_kind {
            headers.set("x-wuhu-runner-kind", kind.as_str())?;
        }
        Ok(())
    }

    /// Reads the identity an internal request carries (see [`Identity::set_headers`]).
    pub(crate) fn from_headers(req: &Request) -> ApiResult<Identity> {
        let get = |name: &str| req.headers().get(name).ok().flatten();
        let (Some(sub), Some(tenant)) = (get("x-wuhu-sub"), get("x-wuhu-tenant")) else {
            return Err(ApiError::internal("internal request without identity"));
        };
        let role = get("x-wuhu-role")
            .and_then(|r| Role::parse(&r))
            .unwrap_or_default();
        let runner_kind = match get("x-wuhu-runner-kind").as_deref() {
            Some("cloud") => Some(RunnerKind::Cloud),
            Some(_) => Some(RunnerKind::Local),
            None => None,
        };
        Ok(Identity {
            sub,
            tenant,
            role,
            runner_kind,
        })
    }
}

/// Verifies the bearer token of `req` for a route that accepts `kind`.
///
/// A missing, empty or short secret fails every route with 500 `server_misconfigured`, before
/// the token is looked at: a server with a weak secret never works.
pub(crate) fn authenticate(req: &Request, env: &Env, kind: TokenKind) -> ApiResult<Identity> {
    let secret = env.secret("WUHU_JWT_SECRET").ok().map(|s| s.to_string());
    authority::check_secret(secret.as_deref())
        .map_err(|e| ApiError::new(500, "server_misconfigured", e.to_string()))?;
    let secret = secret.unwrap_or_default();
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
    let config = TokenConfig::from_env(env)?;
    verify(token.trim(), &secret, kind, &config)
}

/// Token settings from the environment.
struct TokenConfig {
    limits: TokenLimits,
    issuer: Option<String>,
    audience: Option<String>,
}

impl TokenConfig {
    fn from_env(env: &Env) -> ApiResult<TokenConfig> {
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
fn verify(token: &str, secret: &str, kind: TokenKind, config: &TokenConfig) -> ApiResult<Identity> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp", "sub"]);
    validation.leeway = 0;
    validation.validate_nbf = true;
    match &config.audience {
        Some(aud) => validation.set_audience(&[aud]),
        None => validation.validate_aud = false,
    }
    if let Some(iss) = &config.issuer {
        validation.set_issuer(&[iss]);
        validation.required_spec_claims.insert("iss".into());
    }
    let data = decode::<Claims>(
        token,
        &DecodingKey::from_secret(secret.as_bytes()),
        &validation,
    )
    .map_err(|e| {
        use jsonwebtoken::errors::ErrorKind;
        let why = match e.kind() {
            ErrorKind::ExpiredSignature => "token expired",
            ErrorKind::ImmatureSignature => "token not valid yet",
            ErrorKind::InvalidSignature => "bad token signature",
            ErrorKind::InvalidIssuer => "token issuer is not accepted",
            ErrorKind::InvalidAudience => "token audience is not accepted",
            ErrorKind::MissingRequiredClaim(_) => "token lacks a required claim",
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                "token algorithm must be HS256"
            }
            _ => "invalid token",
        };
        ApiError::unauthorized(why)
    })?;
    let now = (Date::now().as_millis() / 1000) as i64;
    let grant = authority::check_claims(&data.claims, kind, now, config.limits)
        .map_err(|e| ApiError::unauthorized(e.to_string()))?;
    Ok(Identity {
        sub: grant.principal.sub,
        tenant: grant.principal.tenant,
        role: grant.principal.role,
        runner_kind: grant.runner_kind,
    })
}
