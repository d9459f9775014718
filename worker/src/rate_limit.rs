//! Rate limits per tenant and per person (`wuhu_core::rate_limits` decides which limits an action
//! passes and under which keys): asks each of the Worker's Rate Limiting bindings and refuses with
//! `429 rate_limited` and `Retry-After` when one says no. `WUHU_RATE_LIMITS=off` turns them off.

use worker::Env;
use wuhu_core::rate_limits::{self, RateAction};

use crate::http::{ApiError, ApiResult};

/// Passes `action` by `who` (a person's `sub`, or a chat binding's id for channel sessions) in
/// `tenant`, or refuses it.
///
/// # Errors
/// `429 rate_limited` with the limit's period as `Retry-After`; `500 server_misconfigured` when a
/// limit's binding is missing from the deployment (so a broken configuration is loud, not open).
pub(crate) async fn check(env: &Env, action: RateAction, tenant: &str, who: &str) -> ApiResult<()> {
    let switch = env.var(rate_limits::SWITCH_VAR).ok().map(|v| v.to_string());
    if !rate_limits::enabled(switch.as_deref()) {
        return Ok(());
    }
    for limit in rate_limits::limits(action) {
        let limiter = env.rate_limiter(limit.binding).map_err(|e| {
            ApiError::new(
                500,
                "server_misconfigured",
                format!("the rate limit binding {} is missing: {e}", limit.binding),
            )
        })?;
        let outcome = limiter
            .limit(rate_limits::key(limit, tenant, who))
            .await
            .map_err(|e| ApiError::internal(format!("asking rate limit {}: {e}", limit.binding)))?;
        if !outcome.success {
            return Err(
                ApiError::new(429, "rate_limited", rate_limits::message(action, limit))
                    .retry_after(limit.period_secs),
            );
        }
    }
    Ok(())
}
