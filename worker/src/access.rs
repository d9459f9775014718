//! Cloudflare Access: verifies an Access application token (RS256, WebCrypto) against the team's key set,
//! which this isolate fetches and caches as `wuhu_core::access::JwksCache` decides. What the
//! claims must say is `wuhu_core::access::check_access_claims`.

use std::cell::RefCell;

use worker::{Env, Fetch, Method, Request, RequestInit};
use wuhu_core::access::{
    AccessClaims, AccessConfig, AccessVars, JwksCache, KeyLookup, MAX_JWKS_BYTES,
    check_access_claims, parse_jwks,
};
use wuhu_core::jwt::Jws;
use wuhu_core::wire::AuthVia;

use crate::http::{ApiError, ApiResult};
use crate::identity::{Authenticated, Identity, now_secs};

thread_local! {
    /// The team's keys, per isolate. A Worker isolate runs one request at a time per thread.
    static JWKS: RefCell<JwksCache> = RefCell::new(JwksCache::default());
}

/// Access settings, or `None` when Access is not configured. A half-configured Access is
/// 500 `server_misconfigured` naming the variable.
pub(crate) fn config(env: &Env) -> ApiResult<Option<AccessConfig>> {
    let var = |name: &str| {
        env.var(name)
            .ok()
            .map(|v| v.to_string())
            .filter(|v| !v.trim().is_empty())
    };
    let (team, aud, tenant, domains, admins) = (
        var("WUHU_ACCESS_TEAM_DOMAIN"),
        var("WUHU_ACCESS_AUD"),
        var("WUHU_ACCESS_TENANT"),
        var("WUHU_ACCESS_TENANT_DOMAINS"),
        var("WUHU_ACCESS_ADMINS"),
    );
    AccessConfig::from_vars(&AccessVars {
        team_domain: team.as_deref(),
        audience: aud.as_deref(),
        tenant: tenant.as_deref(),
        tenant_domains: domains.as_deref(),
        admins: admins.as_deref(),
    })
    .map_err(|e| ApiError::new(500, "server_misconfigured", e))
}

/// Verifies an Access token: header (`RS256`, a `kid`), signature with the team's key, claims.
pub(crate) async fn verify(token: &str, config: &AccessConfig) -> ApiResult<Authenticated> {
    let jws = Jws::parse(token).map_err(|_| ApiError::unauthorized("malformed access token"))?;
    if jws.alg != "RS256" {
        return Err(ApiError::unauthorized(
            "access token algorithm must be RS256",
        ));
    }
    let kid = jws
        .kid
        .as_deref()
        .ok_or_else(|| ApiError::unauthorized("access token has no kid"))?;
    let key = key_for(kid, config).await?;
    // The signature only; the claims are core's to judge.
    let valid =
        crate::webcrypto::verify_rs256(&key.n, &key.e, jws.signature(), jws.signing_input())
            .await
            .map_err(|why| {
                worker::console_warn!("access: the team's key {kid} is unusable: {why}");
                ApiError::unauthorized("the team's key for this kid is unusable")
            })?;
    if !valid {
        return Err(ApiError::unauthorized("bad access token signature"));
    }
    let claims: AccessClaims = jws
        .claims()
        .map_err(|_| ApiError::unauthorized("malformed access token"))?;
    let grant = check_access_claims(&claims, config, now_secs())
        .map_err(|e| ApiError::unauthorized(e.to_string()))?;
    Ok(Authenticated {
        identity: Identity {
            sub: grant.principal.sub,
            tenant: grant.principal.tenant,
            role: grant.principal.role,
            runner_kind: None,
        },
        via: AuthVia::Access,
        jti: None,
        expires_at: grant.expires_at,
        issued_at: grant.issued_at,
    })
}

/// The team's key `kid`, fetching the key set when the cache says so (at most twice: an
/// expired set, then an unknown kid).
async fn key_for(kid: &str, config: &AccessConfig) -> ApiResult<wuhu_core::access::Jwk> {
    for _ in 0..2 {
        let now = now_secs();
        match JWKS.with(|c| c.borrow().lookup(kid, now)) {
            KeyLookup::Use(key) => return Ok(key),
            KeyLookup::Unknown => {
                return Err(ApiError::unauthorized("access token kid is not the team's"));
            }
            KeyLookup::Unavailable => {
                return Err(ApiError::new(
                    503,
                    "unavailable",
                    "the Access key set could not be fetched; retry",
                ));
            }
            KeyLookup::Fetch => {
                JWKS.with(|c| c.borrow_mut().note_refresh(now));
                match fetch_keys(config).await {
                    Ok(keys) => JWKS.with(|c| c.borrow_mut().store(keys, now_secs())),
                    Err(why) => {
                        worker::console_warn!(
                            "access: fetching {} failed: {why}",
                            config.certs_url()
                        );
                        JWKS.with(|c| c.borrow_mut().failed(now_secs()));
                    }
                }
            }
        }
    }
    Err(ApiError::unauthorized("access token kid is not the team's"))
}

async fn fetch_keys(config: &AccessConfig) -> Result<Vec<wuhu_core::access::Jwk>, String> {
    let mut init = RequestInit::new();
    init.with_method(Method::Get);
    let request = Request::new_with_init(&config.certs_url(), &init).map_err(|e| e.to_string())?;
    let mut response = Fetch::Request(request)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status_code() != 200 {
        return Err(format!("status {}", response.status_code()));
    }
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    if body.len() > MAX_JWKS_BYTES {
        return Err(format!("more than {MAX_JWKS_BYTES} bytes"));
    }
    parse_jwks(&body)
}
