//! Compact JSON Web Tokens (RFC 7519, JWS compact form) as Wuhu uses them: HS256 for its own
//! tokens (signed and verified here, HMAC-SHA256 with the server's secret) and RS256 for
//! Cloudflare Access (parsed here; the host verifies the RSA signature over
//! [`Jws::signing_input`] with the team's key, WebCrypto in the Worker, and calls
//! [`Jws::claims`] only after it holds).
//!
//! What is accepted:
//! - three base64url parts (no padding), the header a JSON object whose `alg` is the one
//!   expected (`none` or any other algorithm is refused before any key is used);
//! - the signature over `<header>.<payload>` exactly as they appear in the token;
//! - for Wuhu's tokens ([`check_registered`]): `exp` and `sub` present, `exp` after now, `nbf`
//!   (when present) not after now, no leeway; `iss` equal to the configured issuer and `aud` (a
//!   string or an array) containing the configured audience, each required when configured.
//!
//! Why not a JWT crate: the one the Worker used linked about 16 KB (gzip) of header and claim
//! machinery for the two algorithms Wuhu signs with (docs/benchmarks.md).

use hmac::{Hmac, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;

use crate::wire::Claims;

/// Why a token is refused (each is a 401).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not three base64url parts, or a header or payload that is not the JSON expected.
    #[error("invalid token")]
    Malformed,
    /// The header names another algorithm than the one this token must use.
    #[error("token algorithm is not the one expected")]
    Algorithm,
    /// The signature does not verify.
    #[error("bad token signature")]
    Signature,
    /// `exp` or `sub` is absent (or `iss` / `aud` while configured).
    #[error("token lacks a required claim")]
    MissingClaim,
    /// `exp` is not after now.
    #[error("token expired")]
    Expired,
    /// `nbf` is after now.
    #[error("token not valid yet")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("token issuer is not accepted")]
    Issuer,
    /// `aud` does not contain the configured audience.
    #[error("token audience is not accepted")]
    Audience,
}

/// A token split into its parts; nothing about it is trusted yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jws<'a> {
    /// The header's `alg`.
    pub alg: String,
    /// The header's `kid`, if any.
    pub kid: Option<String>,
    signing_input: &'a str,
    payload: &'a str,
    signature: Vec<u8>,
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

impl<'a> Jws<'a> {
    /// Splits and decodes `token` (header and signature; the payload is decoded by
    /// [`Jws::claims`]).
    ///
    /// # Errors
    /// [`JwtError::Malformed`].
    pub fn parse(token: &'a str) -> Result<Jws<'a>, JwtError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed);
        };
        let header: Header =
            serde_json::from_slice(&base64url_decode(header)?).map_err(|_| JwtError::Malformed)?;
        Ok(Jws {
            alg: header.alg,
            kid: header.kid,
            signing_input: &token[..token.len() - signature.len() - 1],
            payload,
            signature: base64url_decode(signature)?,
        })
    }

    /// The signed bytes: `<header>.<payload>` as they appear in the token.
    pub fn signing_input(&self) -> &[u8] {
        self.signing_input.as_bytes()
    }

    /// The decoded signature.
    pub fn signature(&self) -> &[u8] {
        &self.signature
    }

    /// The payload as `T`. Call it only once the signature is verified.
    ///
    /// # Errors
    /// [`JwtError::Malformed`], or [`JwtError::MissingClaim`] when a field `T` requires is
    /// absent.
    pub fn claims<T: DeserializeOwned>(&self) -> Result<T, JwtError> {
        serde_json::from_slice(&base64url_decode(self.payload)?).map_err(|e| {
            if e.to_string().starts_with("missing field") {
                JwtError::MissingClaim
            } else {
                JwtError::Malformed
            }
        })
    }

    /// Checks an HS256 token's algorithm and signature under `secret` (constant-time).
    ///
    /// # Errors
    /// [`JwtError::Algorithm`] or [`JwtError::Signature`].
    pub fn verify_hs256(&self, secret: &[u8]) -> Result<(), JwtError> {
        if self.alg != "HS256" {
            return Err(JwtError::Algorithm);
        }
        let mut mac = hmac_sha256(secret);
        mac.update(self.signing_input());
        mac.verify_slice(&self.signature)
            .map_err(|_| JwtError::Signature)
    }
}

fn hmac_sha256(secret: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length")
}

/// Signs `claims` with HS256 under `secret`: `{"alg":"HS256","typ":"JWT"}` as the header.
pub fn sign_hs256<T: Serialize>(claims: &T, secret: &[u8]) -> String {
    let payload = serde_json::to_vec(claims).unwrap_or_default();
    let mut token = base64url_encode(br#"{"typ":"JWT","alg":"HS256"}"#);
    token.push('.');
    token.push_str(&base64url_encode(&payload));
    let signature = hs256_signature(token.as_bytes(), secret);
    token.push('.');
    token.push_str(&signature);
    token
}

/// The base64url HS256 signature of `signing_input` (`header.payload`) under `secret`: what
/// [`sign_hs256`] appends, for callers that build their own header (tests of refused tokens).
pub fn hs256_signature(signing_input: &[u8], secret: &[u8]) -> String {
    let mut mac = hmac_sha256(secret);
    mac.update(signing_input);
    base64url_encode(&mac.finalize().into_bytes())
}

/// What the server expects of its own tokens' registered claims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expect<'a> {
    /// `WUHU_JWT_ISSUER`: `iss` must equal it.
    pub issuer: Option<&'a str>,
    /// `WUHU_JWT_AUDIENCE`: `aud` (a string or an array of strings) must contain it.
    pub audience: Option<&'a str>,
}

/// Checks the registered claims of a Wuhu token whose signature holds, at `now` (unix
/// seconds). `exp` and `sub` are required by [`Claims`]' type; what `sub`, `tenant` and the
/// lifetimes may be is [`crate::authority::check_claims`].
///
/// # Errors
/// The first [`JwtError`] that applies, in this order: missing `iss`/`aud`, `exp`, `nbf`,
/// `iss`, `aud`.
pub fn check_registered(claims: &Claims, expect: Expect<'_>, now: i64) -> Result<(), JwtError> {
    if (expect.issuer.is_some() && claims.iss.is_none())
        || (expect.audience.is_some() && claims.aud.is_none())
    {
        return Err(JwtError::MissingClaim);
    }
    if claims.exp <= now {
        return Err(JwtError::Expired);
    }
    if claims.nbf.is_some_and(|nbf| nbf > now) {
        return Err(JwtError::NotYetValid);
    }
    if let Some(issuer) = expect.issuer
        && claims.iss.as_deref() != Some(issuer)
    {
        return Err(JwtError::Issuer);
    }
    if let Some(audience) = expect.audience {
        let ok = match &claims.aud {
            Some(serde_json::Value::String(a)) => a == audience,
            Some(serde_json::Value::Array(list)) => {
                list.iter().any(|a| a.as_str() == Some(audience))
            }
            _ => false,
        };
        if !ok {
            return Err(JwtError::Audience);
        }
    }
    Ok(())
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// base64url without padding (RFC 4648 §5), as JWTs use it.
pub fn base64url_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// Decodes base64url without padding; refuses padding, other characters, an impossible length
/// and non-zero trailing bits (so each byte string has exactly one accepted encoding).
///
/// # Errors
/// [`JwtError::Malformed`].
pub fn base64url_decode(text: &str) -> Result<Vec<u8>, JwtError> {
    fn value(c: u8) -> Result<u32, JwtError> {
        Ok(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return Err(JwtError::Malformed),
        }))
    }
    let bytes = text.as_bytes();
    if bytes.len() % 4 == 1 {
        return Err(JwtError::Malformed);
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 2);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let full = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let keep = chunk.len() - 1;
        // The bits below the last whole byte must be zero.
        if keep < 3 && n & (0x00ff_ffff >> (8 * keep)) != 0 {
            return Err(JwtError::Malformed);
        }
        out.extend_from_slice(&full[..keep]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
