//! `wuhu token mint`: HS256 tokens signed with the server's `WUHU_JWT_SECRET`, the claims of
//! `docs/api.md` (what `scripts/lib/mint-token.mjs` mints), and reading a token's claims for
//! `wuhu whoami`.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The server refuses shorter secrets (`server_misconfigured`).
pub const MIN_SECRET_BYTES: usize = 32;

/// The claims a token carries.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Claims {
    /// Username.
    pub sub: String,
    /// Tenant.
    pub tenant: String,
    /// Expiry, unix seconds.
    pub exp: i64,
    /// `admin` or `member`; absent means member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// `runner` for runner tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
    /// `local` or `cloud`, runner tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_kind: Option<String>,
}

/// What to mint.
#[derive(Clone, Debug)]
pub struct MintRequest {
    /// Username.
    pub sub: String,
    /// Tenant.
    pub tenant: String,
    /// Lifetime in days (fractions allowed).
    pub days: f64,
    /// `admin` or `member`.
    pub role: Option<String>,
    /// A runner token.
    pub runner: bool,
    /// `local` or `cloud` (implies a runner token).
    pub runner_kind: Option<String>,
}

/// The claims for `request`, expiring `days` after `now` (unix seconds).
///
/// # Errors
/// An invalid name, role, runner kind or lifetime.
pub fn claims(request: &MintRequest, now: i64) -> Result<Claims> {
    for (what, name) in [("sub", &request.sub), ("tenant", &request.tenant)] {
        if !wuhu_core::authority::valid_name(name) {
            bail!("--{what} must be 1-128 bytes of A-Z a-z 0-9 _ . @ + -, not . or ..");
        }
    }
    if let Some(role) = &request.role
        && role != "admin"
        && role != "member"
    {
        bail!("--role must be admin or member");
    }
    if let Some(kind) = &request.runner_kind
        && kind != "local"
        && kind != "cloud"
    {
        bail!("--runner-kind must be local or cloud");
    }
    if !request.days.is_finite() || request.days <= 0.0 || request.days > 100_000.0 {
        bail!("--days must be a positive number of days");
    }
    let runner = request.runner || request.runner_kind.is_some();
    Ok(Claims {
        sub: request.sub.clone(),
        tenant: request.tenant.clone(),
        exp: now + (request.days * 86_400.0).round() as i64,
        role: request.role.clone(),
        typ: runner.then(|| "runner".to_string()),
        runner_kind: request.runner_kind.clone(),
    })
}

/// Signs `claims` with HS256 (`wuhu_core::jwt`, the project's one signer).
///
/// # Errors
/// None today: HS256 signs with any key; the `Result` keeps callers ready for other algorithms.
pub fn sign(secret: &[u8], claims: &Claims) -> Result<String> {
    Ok(wuhu_core::jwt::sign_hs256(claims, secret))
}

/// The claims of a token, unverified (only the server can verify it).
///
/// # Errors
/// The token is not a JWT with these claims.
pub fn read_claims(token: &str) -> Result<serde_json::Value> {
    wuhu_core::jwt::Jws::parse(token)
        .and_then(|jws| jws.claims())
        .ok()
        .context("the token is not a JWT (three base64url parts with JSON claims)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> MintRequest {
        MintRequest {
            sub: "ana".into(),
            tenant: "acme".into(),
            days: 30.0,
            role: None,
            runner: false,
            runner_kind: None,
        }
    }

    #[test]
    fn claims_follow_the_mint_script() {
        let now = 1_800_000_000;
        let c = claims(&request(), now).unwrap();
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"sub":"ana","tenant":"acme","exp":now + 30 * 86400})
        );
        let c = claims(
            &MintRequest {
                role: Some("admin".into()),
                runner_kind: Some("cloud".into()),
                days: 0.5,
                ..request()
            },
            now,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"sub":"ana","tenant":"acme","exp":now + 43200,"role":"admin",
                "typ":"runner","runnerKind":"cloud"})
        );
        let runner = claims(
            &MintRequest {
                runner: true,
                ..request()
            },
            now,
        )
        .unwrap();
        assert_eq!(runner.typ.as_deref(), Some("runner"));
        assert_eq!(runner.runner_kind, None);
    }

    #[test]
    fn bad_inputs_are_refused() {
        let bad = [
            MintRequest {
                sub: "a b".into(),
                ..request()
            },
            MintRequest {
                tenant: "..".into(),
                ..request()
            },
            MintRequest {
                role: Some("root".into()),
                ..request()
            },
            MintRequest {
                runner_kind: Some("gpu".into()),
                ..request()
            },
            MintRequest {
                days: 0.0,
                ..request()
            },
            MintRequest {
                days: f64::NAN,
                ..request()
            },
        ];
        for (i, request) in bad.iter().enumerate() {
            assert!(claims(request, 0).is_err(), "case {i}");
        }
    }

    #[test]
    fn signed_tokens_verify_and_read_back() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let c = claims(&request(), 4_000_000_000).unwrap();
        let token = sign(secret, &c).unwrap();
        let read = read_claims(&token).unwrap();
        assert_eq!(read["sub"], "ana");
        // The server's check (`wuhu_core::jwt`, interop-tested against jsonwebtoken there).
        let jws = wuhu_core::jwt::Jws::parse(&token).unwrap();
        jws.verify_hs256(secret).unwrap();
        assert!(
            jws.verify_hs256(b"another secret, just as long as it")
                .is_err()
        );
        let decoded: Claims = jws.claims().unwrap();
        assert_eq!(decoded, c);
        assert!(read_claims("not-a-token").is_err());
    }
}
