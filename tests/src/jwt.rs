//! JWT minting for tests: HS256 tokens as the Worker expects them, and the broken kinds it
//! must refuse (expired, bad signature, `alg: none`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// Signs `claims` with HS256 under `header` (normally `{"alg":"HS256","typ":"JWT"}`).
pub fn sign_hs256(secret: &[u8], header: &Value, claims: &Value) -> String {
    let signing_input = format!("{}.{}", encode_part(header), encode_part(claims));
    let signature = signature(secret, &signing_input);
    format!("{signing_input}.{signature}")
}

/// The base64url HMAC-SHA256 of `signing_input` (`header.payload`).
pub fn signature(secret: &[u8], signing_input: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac accepts any key length");
    mac.update(signing_input.as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// A standard HS256 token.
pub fn hs256(secret: &[u8], claims: &Value) -> String {
    sign_hs256(secret, &json!({"alg": "HS256", "typ": "JWT"}), claims)
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

fn encode_part(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).expect("serialize jwt part"))
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
        assert!(input.starts_with("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."));
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
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "none");
    }
}
