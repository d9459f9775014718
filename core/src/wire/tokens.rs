//! Sign-in bodies: `/v1/tokens` (tokens for programs) and `/v1/auth/*` (the browser's cookie
//! session). See `docs/api.md`, "Sign-in", and [`crate::tokens`] for the rules.

use serde::{Deserialize, Serialize};

use crate::authority::Role;
use crate::wire::runner::RunnerKind;

/// What a registered credential is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum CredentialKind {
    /// A person's token for programs (the CLI, scripts).
    User,
    /// A runner's token (`typ: runner`).
    Runner,
    /// A browser's cookie session (`POST /v1/auth/session`): listed with the tokens, and
    /// revoked like them (logout revokes it).
    Session,
}

impl CredentialKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::User => "user",
            CredentialKind::Runner => "runner",
            CredentialKind::Session => "session",
        }
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<CredentialKind> {
        match text {
            "user" => Some(CredentialKind::User),
            "runner" => Some(CredentialKind::Runner),
            "session" => Some(CredentialKind::Session),
            _ => None,
        }
    }
}

/// What a token minted by `POST /v1/tokens` is for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum MintKind {
    /// A person's token for programs (the CLI, scripts).
    User,
    /// A runner's token.
    Runner,
}

impl MintKind {
    /// The kind of credential it registers.
    pub fn credential(self) -> CredentialKind {
        match self {
            MintKind::User => CredentialKind::User,
            MintKind::Runner => CredentialKind::Runner,
        }
    }
}

/// `POST /v1/tokens`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MintTokenRequest {
    /// A label for the list (1–100 characters, no control characters).
    pub name: String,
    /// What the token is for.
    pub kind: MintKind,
    /// Lifetime in whole days (default 30, at most `WUHU_TOKEN_MAX_DAYS_USER` / `_RUNNER`).
    #[serde(default)]
    pub ttl_days: Option<i64>,
    /// Whose token: the caller by default; another user's only for admins.
    #[serde(default)]
    pub sub: Option<String>,
    /// `member` (default) or `admin` (admins only).
    #[serde(default)]
    pub role: Option<Role>,
    /// Runner tokens: `local` (default) or `cloud` (admins only).
    #[serde(default)]
    pub runner_kind: Option<RunnerKind>,
}

/// A registered token as `GET /v1/tokens` shows it: never the token itself.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// The token's id (`jti` claim); `DELETE /v1/tokens/:jti` revokes it.
    pub jti: String,
    /// Its label.
    pub name: String,
    /// `user`, `runner` or `session`.
    pub kind: CredentialKind,
    /// Whose token it is.
    pub sub: String,
    /// Its role.
    pub role: Role,
    /// Runner tokens: `local` or `cloud`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_kind: Option<RunnerKind>,
    /// Who minted it (an admin may mint for others).
    pub created_by: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds (the token's `exp`).
    pub expires_at: i64,
    /// The registered credential (a minted token or a cookie session) this one was made from:
    /// revoking that one revokes this one, and a token never outlives it. Absent for a
    /// credential made from the operator secret or an Access identity (see `root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What this credential's lineage rests on.
    #[serde(default)]
    pub root: LineageRoot,
    /// Whether this is the credential the request was made with (`GET /v1/tokens`).
    #[serde(default)]
    pub current: bool,
}

/// What a registered credential's lineage rests on: the first credential of its line that is
/// not itself registered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum LineageRoot {
    /// A token signed with the operator secret (no `jti`): it ends only when the secret is
    /// rotated.
    Operator,
    /// A Cloudflare Access identity: re-checked at every use against the Access settings
    /// (`WUHU_ACCESS_*`), so removing the email from `WUHU_ACCESS_ADMINS` demotes what it
    /// minted, and an email Access no longer maps to this tenant ends it.
    Access {
        /// The lowercased email.
        email: String,
    },
    /// Registered before lineage was recorded (issue 29): nothing to re-check.
    #[default]
    Unrecorded,
}

/// `POST /v1/tokens/revoke-all`: ends every registered credential of a user.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevokeAllRequest {
    /// Whose: the caller by default; another user's only for admins.
    #[serde(default)]
    pub sub: Option<String>,
}

/// `200` answer of `POST /v1/tokens/revoke-all`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RevokeAllResponse {
    /// Whose credentials were ended.
    pub sub: String,
    /// How many registered credentials were revoked: the user's tokens and cookie sessions,
    /// everything made from them (other users' tokens an admin minted from them included),
    /// and everything resting on their Access identity.
    pub revoked: usize,
    /// Of those, cookie sessions.
    pub sessions: usize,
    /// Runner connections closed at once (the other open things, follow streams and session
    /// sockets, end within `CREDENTIAL_RECHECK_MS`).
    pub runner_connections_closed: usize,
}

/// `201` answer of `POST /v1/tokens`: the token, shown this once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MintTokenResponse {
    /// What the list shows.
    #[serde(flatten)]
    pub info: TokenInfo,
    /// The bearer token. It is not stored and cannot be shown again.
    pub token: String,
}

/// `GET /v1/tokens`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ListTokensResponse {
    /// Newest first.
    pub tokens: Vec<TokenInfo>,
}

/// How a request was authenticated.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum AuthVia {
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The `wuhu_session` cookie.
    Cookie,
    /// Cloudflare Access (`Cf-Access-Jwt-Assertion` or the `CF_Authorization` cookie).
    Access,
}

/// `GET /v1/auth/me` and `POST /v1/auth/session`: who the caller is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// Username.
    pub sub: String,
    /// Tenant.
    pub tenant: String,
    /// Their role in the tenant.
    pub role: Role,
    /// How this request was authenticated.
    pub via: AuthVia,
    /// When the credential expires (unix seconds); for `POST /v1/auth/session`, the cookie's.
    pub expires_at: i64,
}
