//! Sign-in bodies: `/v1/tokens` (tokens for programs) and `/v1/auth/*` (the browser's cookie
//! session). See `docs/api.md`, "Sign-in", and [`crate::tokens`] for the rules.

use serde::{Deserialize, Serialize};

/// What a registered credential is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum CredentialKind {
    /// A person's token for programs (the CLI, scripts).
    User,
    /// A runner's token (`typ: runner`).
    Runner,
    /// A browser's cookie session (`POST /v1/auth/session`); never listed as a token.
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

/// `POST /v1/tokens`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MintTokenRequest {
    /// A label for the list (1–100 characters, no control characters).
    pub name: String,
    /// `user` or `runner`.
    pub kind: String,
    /// Lifetime in whole days (default 30, at most `WUHU_TOKEN_MAX_DAYS_USER` / `_RUNNER`).
    #[serde(default)]
    pub ttl_days: Option<i64>,
    /// Whose token: the caller by default; another user's only for admins.
    #[serde(default)]
    pub sub: Option<String>,
    /// `member` (default) or `admin` (admins only).
    #[serde(default)]
    pub role: Option<String>,
    /// Runner tokens: `local` (default) or `cloud` (admins only).
    #[serde(default)]
    pub runner_kind: Option<String>,
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
    /// `admin` or `member`.
    pub role: String,
    /// Runner tokens: `local` or `cloud`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_kind: Option<String>,
    /// Who minted it (an admin may mint for others).
    pub created_by: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds (the token's `exp`).
    pub expires_at: i64,
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
    /// `admin` or `member`.
    pub role: String,
    /// How this request was authenticated.
    pub via: AuthVia,
    /// When the credential expires (unix seconds); for `POST /v1/auth/session`, the cookie's.
    pub expires_at: i64,
}
