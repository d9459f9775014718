//! Tokens for programs, cookie sessions for browsers, and how both are revoked.
//!
//! A token minted by `POST /v1/tokens` and a browser's cookie session are both *registered
//! credentials*: a row in the tenant's token registry keyed by the JWT's `jti`. A JWT that
//! carries a `jti` is accepted only while its row exists and matches ([`credential_live`]);
//! revoking deletes the row, so the next request anywhere is refused. Tokens without a `jti`
//! are operator tokens minted with the secret: they are never looked up (and cannot be revoked
//! one by one). Decision record: `docs/decisions/0007-token-registry-and-revocation.md`.
//!
//! Every registered credential records what it was made from, and revoking one ends every
//! credential made from it ([`lineage`], decision 0032).
//!
//! The same module holds the cookie's wire format. Every function is pure.

use serde::{Deserialize, Serialize};

use crate::authority::{Principal, Role, TokenLimits, valid_name};
use crate::wire::runner::RunnerKind;
use crate::wire::{CredentialKind, LineageRoot, MintTokenRequest, TokenInfo};

pub mod lineage;

/// Most live tokens (`user` + `runner`) one user may hold; one more is `429 too_many_tokens`.
pub const MAX_TOKENS_PER_USER: usize = 50;
/// Most live cookie sessions one user may hold; a new one replaces the oldest.
pub const MAX_SESSIONS_PER_USER: usize = 20;
/// Most registry rows of one tenant (tokens and sessions; expired rows are pruned first).
pub const MAX_CREDENTIALS_PER_TENANT: usize = 5_000;
/// Longest token label, in characters.
pub const MAX_TOKEN_NAME_CHARS: usize = 100;
/// Lifetime of a token when `ttlDays` is absent.
pub const DEFAULT_TOKEN_TTL_DAYS: i64 = 30;
/// Lifetime of a cookie session (also capped by the credential it was exchanged for).
pub const SESSION_TTL_SECS: i64 = 12 * 3_600;
/// The cookie holding a browser's session token.
pub const SESSION_COOKIE: &str = "wuhu_session";
/// The `typ` claim of a cookie session's JWT.
pub const SESSION_TYP: &str = "session";

/// A registry row: everything about a registered credential but the token itself.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CredentialRecord {
    /// The JWT's `jti`.
    pub jti: String,
    /// Whose credential.
    pub sub: String,
    /// What it is.
    pub kind: CredentialKind,
    /// Its label.
    pub name: String,
    /// The role its JWT carries.
    pub role: Role,
    /// Runner tokens: `cloud` or `local`.
    pub runner_kind: Option<RunnerKind>,
    /// Who minted it.
    pub created_by: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds (the JWT's `exp`).
    pub expires_at: i64,
    /// The registered credential (a minted token) this one was made from; revoking that one
    /// ends this one, and everything made from this one.
    pub parent: Option<String>,
    /// What the lineage rests on (a child's is its parent's; [`lineage::adopt`]).
    #[serde(default)]
    pub root: LineageRoot,
}

impl CredentialRecord {
    /// What `GET /v1/tokens` shows (`current`: whether it is the credential of the request).
    pub fn info(&self) -> TokenInfo {
        self.info_for(None)
    }

    /// [`info`](Self::info), marking it as the request's own when its `jti` is `current`.
    pub fn info_for(&self, current: Option<&str>) -> TokenInfo {
        TokenInfo {
            jti: self.jti.clone(),
            name: self.name.clone(),
            kind: self.kind,
            sub: self.sub.clone(),
            role: self.role,
            runner_kind: self.runner_kind,
            created_by: self.created_by.clone(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            parent: self.parent.clone(),
            root: self.root.clone(),
            current: current == Some(self.jti.as_str()),
        }
    }
}

/// Whether a JWT with this `jti`, verified for `sub`, may be used now: its registry row
/// exists, belongs to `sub` and has not expired. `None` (no row: revoked, pruned or never
/// registered) is refused.
pub fn credential_live(record: Option<&CredentialRecord>, sub: &str, now: i64) -> bool {
    record.is_some_and(|r| r.sub == sub && r.expires_at > now)
}

/// Why a mint request is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MintError {
    /// Malformed input (400).
    #[error("{0}")]
    Bad(String),
    /// Not allowed for this caller (403).
    #[error("{0}")]
    Forbidden(String),
    /// Over [`MAX_TOKENS_PER_USER`] or [`MAX_CREDENTIALS_PER_TENANT`] (429).
    #[error("{0}")]
    TooMany(String),
    /// This credential may not mint without a fresh sign-in (403
    /// `reauthentication_required`): a cookie session, or an Access sign-in that is not recent
    /// ([`lineage::source`]).
    #[error("{0}")]
    Reauthenticate(String),
    /// The credential it would be made from is gone (401; [`lineage::adopt`]).
    #[error("{0}")]
    Revoked(String),
}

impl MintError {
    /// HTTP status and error code.
    pub fn status_code(&self) -> (u16, &'static str) {
        match self {
            MintError::Bad(_) => (400, "bad_request"),
            MintError::Forbidden(_) => (403, "forbidden"),
            MintError::TooMany(_) => (429, "too_many_tokens"),
            MintError::Reauthenticate(_) => (403, "reauthentication_required"),
            MintError::Revoked(_) => (401, "unauthorized"),
        }
    }
}

/// A validated mint request: the registry row to write (the caller adds `jti` and signs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MintPlan {
    /// Whose token.
    pub sub: String,
    /// `user` or `runner`.
    pub kind: CredentialKind,
    /// Its label (trimmed).
    pub name: String,
    /// Its role claim.
    pub role: Role,
    /// Runner tokens: `local` or `cloud`.
    pub runner_kind: Option<RunnerKind>,
    /// Unix seconds.
    pub expires_at: i64,
}

/// Checks `POST /v1/tokens` for `who` at `now`: label, kind, lifetime against the configured
/// maximum, and what only admins may ask for (another user's token, `role: admin`, a cloud
/// runner token).
///
/// # Errors
/// [`MintError::Bad`] or [`MintError::Forbidden`].
pub fn plan_mint(
    who: &Principal,
    request: &MintTokenRequest,
    now: i64,
    limits: TokenLimits,
) -> Result<MintPlan, MintError> {
    let name = request.name.trim();
    if name.is_empty()
        || name.chars().count() > MAX_TOKEN_NAME_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(MintError::Bad(format!(
            "name must be 1 to {MAX_TOKEN_NAME_CHARS} characters without control characters"
        )));
    }
    let kind = request.kind.credential();
    let max_secs = match kind {
        CredentialKind::Runner => limits.max_runner_secs,
        _ => limits.max_user_secs,
    };
    let max_days = (max_secs / 86_400).max(1);
    let days = request
        .ttl_days
        .unwrap_or(DEFAULT_TOKEN_TTL_DAYS)
        .min(max_days.max(1));
    if request.ttl_days.is_some_and(|d| d < 1 || d > max_days) {
        return Err(MintError::Bad(format!(
            "ttlDays must be between 1 and {max_days} for {} tokens",
            kind.as_str()
        )));
    }
    let sub = request.sub.clone().unwrap_or_else(|| who.sub.clone());
    if !valid_name(&sub) {
        return Err(MintError::Bad(
            "sub must be 1-128 of A-Z a-z 0-9 _ . @ + -".into(),
        ));
    }
    if sub != who.sub && !who.is_admin() {
        return Err(MintError::Forbidden(
            "only admins may mint tokens for other users".into(),
        ));
    }
    let role = request.role.unwrap_or_default();
    if role == Role::Admin && !who.is_admin() {
        return Err(MintError::Forbidden(
            "only admins may mint admin tokens".into(),
        ));
    }
    let runner_kind = match (kind, request.runner_kind) {
        (CredentialKind::Runner, None | Some(RunnerKind::Local)) => Some(RunnerKind::Local),
        (CredentialKind::Runner, Some(RunnerKind::Cloud)) if who.is_admin() => {
            Some(RunnerKind::Cloud)
        }
        (CredentialKind::Runner, Some(RunnerKind::Cloud)) => {
            return Err(MintError::Forbidden(
                "only admins may mint cloud runner tokens".into(),
            ));
        }
        (_, Some(_)) => {
            return Err(MintError::Bad(
                "runnerKind is only for runner tokens".into(),
            ));
        }
        (_, None) => None,
    };
    Ok(MintPlan {
        sub,
        kind,
        name: name.to_string(),
        role,
        runner_kind,
        expires_at: now + days * 86_400,
    })
}

/// Whether one more credential of `kind` may be registered for a user who holds
/// `user_live` live ones of that kind, in a tenant with `tenant_rows` rows (after pruning).
/// Sessions are never refused for the user bound: the oldest is replaced instead
/// ([`sessions_to_evict`]).
///
/// # Errors
/// [`MintError::TooMany`].
pub fn may_register(
    kind: CredentialKind,
    user_live: usize,
    tenant_rows: usize,
) -> Result<(), MintError> {
    if tenant_rows >= MAX_CREDENTIALS_PER_TENANT {
        return Err(MintError::TooMany(format!(
            "the tenant holds {MAX_CREDENTIALS_PER_TENANT} tokens and sessions; revoke some first"
        )));
    }
    if kind != CredentialKind::Session && user_live >= MAX_TOKENS_PER_USER {
        return Err(MintError::TooMany(format!(
            "a user may hold at most {MAX_TOKENS_PER_USER} tokens; revoke one first"
        )));
    }
    Ok(())
}

/// How many of a user's oldest sessions to end so that a new one fits under
/// [`MAX_SESSIONS_PER_USER`].
pub fn sessions_to_evict(live_sessions: usize) -> usize {
    (live_sessions + 1).saturating_sub(MAX_SESSIONS_PER_USER)
}

/// Whether `who` may list or revoke the credentials of `owner`: their own, or anyone's in the
/// tenant for an admin.
pub fn may_manage_tokens(who: &Principal, owner: &str) -> bool {
    who.is_admin() || who.sub == owner
}

/// Expiry of a cookie session made at `now` from a credential expiring at `credential_exp`:
/// [`SESSION_TTL_SECS`], never past the credential it came from.
pub fn session_expiry(now: i64, credential_exp: i64) -> i64 {
    (now + SESSION_TTL_SECS).min(credential_exp)
}

/// The value of cookie `name` in a `Cookie` header, if present and non-empty.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name)
            .then(|| value.trim().trim_matches('"'))
            .filter(|v| !v.is_empty())
    })
}

/// The `Set-Cookie` value that stores a session token for `max_age` seconds.
///
/// `Secure` always: browsers treat `http://localhost` and `http://127.0.0.1` as secure
/// contexts and keep `Secure` cookies there, so local development works too.
/// `SameSite=Strict`: never sent on cross-site requests; `HttpOnly`: scripts cannot read it.
pub fn session_set_cookie(token: &str, max_age: i64) -> String {
    format!(
        "{SESSION_COOKIE}={token}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
        max_age.max(0)
    )
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn session_clear_cookie() -> String {
    format!("{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(sub: &str, role: Role) -> Principal {
        Principal {
            sub: sub.into(),
            tenant: "acme".into(),
            role,
        }
    }

    fn request(json: serde_json::Value) -> MintTokenRequest {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn mint_table() {
        use serde_json::json;
        let now = 1_000_000;
        let day = 86_400;
        let limits = TokenLimits::default();
        let alice = who("alice", Role::Member);
        let root = who("root", Role::Admin);
        type Want = Result<(&'static str, CredentialKind, Role, Option<RunnerKind>, i64), u16>;
        let cases: Vec<(&Principal, serde_json::Value, Want)> = vec![
            (
                &alice,
                json!({"name":"laptop","kind":"user"}),
                Ok(("alice", CredentialKind::User, Role::Member, None, 30)),
            ),
            (
                &alice,
                json!({"name":"  ci  ","kind":"user","ttlDays":90}),
                Ok(("alice", CredentialKind::User, Role::Member, None, 90)),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","ttlDays":91}),
                Err(400),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","ttlDays":0}),
                Err(400),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","ttlDays":-3}),
                Err(400),
            ),
            (
                &alice,
                json!({"name":"mac","kind":"runner","ttlDays":400}),
                Ok((
                    "alice",
                    CredentialKind::Runner,
                    Role::Member,
                    Some(RunnerKind::Local),
                    400,
                )),
            ),
            (
                &alice,
                json!({"name":"mac","kind":"runner","ttlDays":401}),
                Err(400),
            ),
            (
                &alice,
                json!({"name":"mac","kind":"runner","runnerKind":"cloud"}),
                Err(403),
            ),
            (
                &alice,
                json!({"name":"mac","kind":"runner","runnerKind":"gpu"}),
                Err(400),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","runnerKind":"local"}),
                Err(400),
            ),
            (&alice, json!({"name":"x","kind":"session"}), Err(400)),
            (&alice, json!({"name":"x","kind":"admin"}), Err(400)),
            (&alice, json!({"name":"","kind":"user"}), Err(400)),
            (&alice, json!({"name":"   ","kind":"user"}), Err(400)),
            (&alice, json!({"name":"a\nb","kind":"user"}), Err(400)),
            (
                &alice,
                json!({"name":"x".repeat(101),"kind":"user"}),
                Err(400),
            ),
            (
                &alice,
                json!({"name":"é".repeat(100),"kind":"user"}),
                Ok(("alice", CredentialKind::User, Role::Member, None, 30)),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","sub":"bob"}),
                Err(403),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","sub":"alice"}),
                Ok(("alice", CredentialKind::User, Role::Member, None, 30)),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","role":"admin"}),
                Err(403),
            ),
            (
                &alice,
                json!({"name":"x","kind":"user","role":"root"}),
                Err(400),
            ),
            (
                &root,
                json!({"name":"x","kind":"user","sub":"bob"}),
                Ok(("bob", CredentialKind::User, Role::Member, None, 30)),
            ),
            (
                &root,
                json!({"name":"x","kind":"user","sub":"a/b"}),
                Err(400),
            ),
            (
                &root,
                json!({"name":"x","kind":"user","role":"admin"}),
                Ok(("root", CredentialKind::User, Role::Admin, None, 30)),
            ),
            (
                &root,
                json!({"name":"vm","kind":"runner","sub":"ops","runnerKind":"cloud"}),
                Ok((
                    "ops",
                    CredentialKind::Runner,
                    Role::Member,
                    Some(RunnerKind::Cloud),
                    30,
                )),
            ),
        ];
        for (caller, body, want) in cases {
            // A body that does not decode (a kind, role or runner kind outside its set) is the
            // route's 400, before any rule.
            let got = serde_json::from_value::<MintTokenRequest>(body.clone())
                .map_err(|_| 400)
                .and_then(|r| plan_mint(caller, &r, now, limits).map_err(|e| e.status_code().0))
                .map(|p| {
                    let days = (p.expires_at - now) / day;
                    (p.sub, p.kind, p.role, p.runner_kind, days)
                });
            let want =
                want.map(|(sub, kind, role, rk, days)| (sub.to_string(), kind, role, rk, days));
            assert_eq!(got, want, "{} {body}", caller.sub);
        }
        // A server configured for shorter tokens caps the default too.
        let short = TokenLimits {
            max_user_secs: 7 * day,
            max_runner_secs: 7 * day,
        };
        let plan = plan_mint(
            &alice,
            &request(json!({"name":"x","kind":"user"})),
            now,
            short,
        );
        assert_eq!(plan.unwrap().expires_at, now + 7 * day);
        assert!(
            plan_mint(
                &alice,
                &request(json!({"name":"x","kind":"user","ttlDays":8})),
                now,
                short
            )
            .is_err()
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let parsed: Result<MintTokenRequest, _> =
            serde_json::from_value(serde_json::json!({"name":"x","kind":"user","ttl":3}));
        assert!(parsed.is_err());
    }

    #[test]
    fn registry_bounds() {
        use CredentialKind::*;
        assert!(may_register(User, 0, 0).is_ok());
        assert!(may_register(Runner, MAX_TOKENS_PER_USER - 1, 10).is_ok());
        assert_eq!(
            may_register(User, MAX_TOKENS_PER_USER, 10).map_err(|e| e.status_code()),
            Err((429, "too_many_tokens"))
        );
        assert!(may_register(Session, 1_000, 10).is_ok());
        assert!(may_register(Session, 0, MAX_CREDENTIALS_PER_TENANT).is_err());
        assert!(may_register(User, 0, MAX_CREDENTIALS_PER_TENANT - 1).is_ok());
        assert_eq!(sessions_to_evict(0), 0);
        assert_eq!(sessions_to_evict(MAX_SESSIONS_PER_USER - 1), 0);
        assert_eq!(sessions_to_evict(MAX_SESSIONS_PER_USER), 1);
        assert_eq!(sessions_to_evict(MAX_SESSIONS_PER_USER + 4), 5);
    }

    #[test]
    fn liveness_and_management() {
        let record = CredentialRecord {
            jti: "j1".into(),
            sub: "alice".into(),
            kind: CredentialKind::User,
            name: "laptop".into(),
            role: Role::Member,
            runner_kind: None,
            created_by: "alice".into(),
            created_at: 10,
            expires_at: 100,
            parent: None,
            root: LineageRoot::Unrecorded,
        };
        assert!(credential_live(Some(&record), "alice", 99));
        assert!(!credential_live(Some(&record), "alice", 100));
        assert!(!credential_live(Some(&record), "bob", 50));
        assert!(!credential_live(None, "alice", 50));
        assert_eq!(record.info().kind, CredentialKind::User);
        let alice = who("alice", Role::Member);
        let root = who("root", Role::Admin);
        assert!(may_manage_tokens(&alice, "alice"));
        assert!(!may_manage_tokens(&alice, "bob"));
        assert!(may_manage_tokens(&root, "bob"));
        assert_eq!(session_expiry(0, 1_000_000), SESSION_TTL_SECS);
        assert_eq!(session_expiry(0, 60), 60);
    }

    #[test]
    fn cookies() {
        let cases = [
            ("wuhu_session=abc", Some("abc")),
            ("a=1; wuhu_session=abc.def-g_h; b=2", Some("abc.def-g_h")),
            ("a=1;wuhu_session=\"q\"", Some("q")),
            ("xwuhu_session=abc", None),
            ("wuhu_session=", None),
            ("wuhu_session", None),
            ("", None),
        ];
        for (header, want) in cases {
            assert_eq!(cookie_value(header, SESSION_COOKIE), want, "{header}");
        }
        let set = session_set_cookie("t", 60);
        for part in [
            "wuhu_session=t",
            "Path=/",
            "Max-Age=60",
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
        ] {
            assert!(set.contains(part), "{set}");
        }
        assert!(session_clear_cookie().contains("Max-Age=0"));
    }
}
