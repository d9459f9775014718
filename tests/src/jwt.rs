//! JWT minting for tests: HS256 tokens as the Worker expects them, and the broken kinds it
//! must refuse (expired, bad signature, `alg: none`). The signing is `wuhu_core::jwt`'s, the
//! project's one HS256 signer.

use serde_json::{Value, json};
use wuhu_core::jwt::{base64url_decode, base64url_encode, hs256_signature};

/// Signs `claims` with HS256 under `header` (normally `{"alg":"HS256","typ":"JWT"}`).
pub fn sign_hs256(secret: &[u8], header: &Value, claims: &Value) -> String {
    let signing_input = format!("{}.{}", encode_part(header), encode_part(claims));
    let signature = signature(secret, &signing_input);
    format!("{signing_input}.{signature}")
}

/// The base64url HMAC-SHA256 of `signing_input` (`header.payload`).
pub fn signature(secret: &[u8], signing_input: &str) -> String {
    hs256_signature(signing_input.as_bytes(), secret)
}

/// A standard HS256 token.
pub fn hs256(secret: &[u8], claims: &Value) -> String {
    wuhu_core::jwt::sign_hs256(claims, secret)
}

/// An unsigned token: header `{"alg":"none"}` and an empty signature.
pub fn alg_none(claims: &Value) -> String {
    format!(
        "{}.{}.",
        encode_part(&json!({"alg": "none", "typ": "JWT"})),
        encode_part(claims)
    )
}

/// User claims expiring `ttl_secs` from now (negative: already expired).
pub fn user_claims(sub: &str, tenant: &str, ttl_secs: i64) -> Value {
    json!({"sub": sub, "tenant": tenant, "exp": crate::util::unix_now() + ttl_secs})
}

/// Runner claims: user claims plus `typ: "runner"`.
pub fn runner_claims(sub: &str, tenant: &str, ttl_secs: i64) -> Value {
    let mut claims = user_claims(sub, tenant, ttl_secs);
    claims["typ"] = json!("runner");
    claims
}

/// The claims of a JWT, unverified (what a token says of itself, for assertions).
///
/// # Panics
/// When the token is not three base64url parts with a JSON payload.
pub fn decode_claims(token: &str) -> Value {
    let payload = token
        .split('.')
        .nth(1)
        .unwrap_or_else(|| panic!("not a JWT: {token}"));
    let bytes = base64url_decode(payload)
        .unwrap_or_else(|e| panic!("the payload is not base64url ({e}): {token}"));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("the payload is not JSON ({e})"))
}

fn encode_part(value: &Value) -> String {
    base64url_encode(&serde_json::to_vec(value).expect("serialize jwt part"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_jwt_io_example() {
        let input = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ";
        assert_eq!(
            signature(b"your-256-bit-secret", input),
            "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
        );
        let token = hs256(b"k", &json!({"sub": "a"}));
        let (input, sig) = token.rsplit_once('.').unwrap();
        assert_eq!(sig, signature(b"k", input));
    }

    #[test]
    fn claims_and_none_tokens_have_the_expected_shape() {
        let claims = runner_claims("alice", "acme", 60);
        assert_eq!(claims["typ"], "runner");
        assert!(claims["exp"].as_i64().unwrap() > crate::util::unix_now());
        let token = alg_none(&claims);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2], "");
        let header: Value =
            serde_json::from_slice(&wuhu_core::jwt::base64url_decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "none");
    }
}
