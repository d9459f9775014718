//! Who a request is: the verified identity, how it was authenticated, and its passage between
//! Durable Objects in internal headers. Below `auth` (which verifies credentials), `access`
//! and `token_registry` (which both produce or check identities), so none of them imports
//! another in a circle.

use worker::{Date, Headers, Request};
use wuhu_core::authority::{Principal, Role};
use wuhu_core::wire::AuthVia;
use wuhu_core::wire::runner::RunnerKind;

use crate::http::{ApiError, ApiResult};

/// The `sub` of [`Identity::system`]. Calls sent with it are internal ones, which check no
/// person; a public call is never sent as the system.
pub(crate) const SYSTEM_SUB: &str = "wuhu";

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

    /// An actor acting on its own behalf in `tenant` (a report, a gate request, a child's
    /// event): no person, a member's rights.
    pub(crate) fn system(tenant: &str) -> Identity {
        Identity {
            sub: SYSTEM_SUB.to_string(),
            tenant: tenant.to_string(),
            role: Role::Member,
            runner_kind: None,
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

/// A verified request: who, and by which credential.
#[derive(Clone, Debug)]
pub(crate) struct Authenticated {
    pub(crate) identity: Identity,
    /// How the credential arrived.
    pub(crate) via: AuthVia,
    /// The registered credential's id (`jti`), for tokens from `/v1/tokens` and cookie sessions.
    pub(crate) jti: Option<String>,
    /// When the credential expires (unix seconds).
    pub(crate) expires_at: i64,
    /// When the credential was issued (its `iat`, unix seconds), when it says: for an Access
    /// sign-in, when the person signed in (minting needs a recent one).
    pub(crate) issued_at: Option<i64>,
}

/// Unix seconds now.
pub(crate) fn now_secs() -> i64 {
    (Date::now().as_millis() / 1000) as i64
}
