//! Each platform's check that a hook delivery is genuine, exactly as the platform specifies.
//! Pure: the host passes the headers, the raw body and the current time.
//!
//! | platform | check |
//! |---|---|
//! | Slack | `X-Slack-Signature: v0=<hex HMAC-SHA256(signing secret, "v0:{ts}:{body}")>`, `X-Slack-Request-Timestamp` within [`MAX_SKEW_SECS`] of now |
//! | Telegram | `X-Telegram-Bot-Api-Secret-Token` equals the binding's secret token |
//! | Discord | Ed25519 over `{X-Signature-Timestamp}{body}` with the application's public key (`X-Signature-Ed25519`, hex), timestamp within [`MAX_SKEW_SECS`] |
//! | generic | `X-Wuhu-Signature: sha256=<hex HMAC-SHA256(secret, "{X-Wuhu-Timestamp}.{body}")>`, timestamp within [`MAX_SKEW_SECS`] |
//!
//! Every comparison of secret material is constant-time.
//!
//! Discord's check is two steps: [`discord`] decides the key, the signature and the exact bytes
//! signed (and refuses stale or malformed deliveries), the host runs the Ed25519 verification
//! (WebCrypto in the Worker, so its wasm links no curve arithmetic; ed25519-dalek in this
//! crate's tests) and [`Ed25519Check::verdict`] turns its answer into the outcome.
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Largest difference between a signed timestamp and now: Slack's 5 minutes.
pub const MAX_SKEW_SECS: i64 = 300;

/// Why a delivery is refused (all of them are `401`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A header the platform always sends is absent.
    #[error("missing signature headers")]
    Missing,
    /// The timestamp is not a number or is too far from now.
    #[error("stale or invalid timestamp")]
    Stale,
    /// The signature does not match.
    #[error("bad signature")]
    BadSignature,
}

type HmacSha256 = Hmac<Sha256>;

fn fresh(timestamp: &str, now_secs: i64) -> Result<(), VerifyError> {
    let ts: i64 = timestamp.trim().parse().map_err(|_| VerifyError::Stale)?;
    if (now_secs - ts).abs() > MAX_SKEW_SECS {
        return Err(VerifyError::Stale);
    }
    Ok(())
}

fn hmac_hex_matches(
    secret: &[u8],
    message: &[&[u8]],
    hex_signature: &str,
) -> Result<(), VerifyError> {
    let signature = hex::decode(hex_signature).map_err(|_| VerifyError::BadSignature)?;
    let mut mac = HmacSha256::new_from_slice(secret).map_err(|_| VerifyError::BadSignature)?;
    for part in message {
        mac.update(part);
    }
    mac.verify_slice(&signature)
        .map_err(|_| VerifyError::BadSignature)
}

/// Hex HMAC-SHA256 of the parts, for signing (generic replies, tests).
pub fn hmac_hex(secret: &[u8], message: &[&[u8]]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    for part in message {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// Slack's request signing (v0): `v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{body}`.
///
/// # Errors
/// A [`VerifyError`]; the delivery must be refused with 401.
pub fn slack(
    signing_secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<(), VerifyError> {
    let scheme = TimestampedHmac {
        signature_prefix: "v0=",
        message_lead: b"v0:",
        separator: b":",
    };
    scheme.verify(signing_secret, timestamp, signature, body, now_secs)
}

/// The generic webhook signature: `sha256=` + hex HMAC-SHA256 of `{timestamp}.{body}`.
///
/// # Errors
/// A [`VerifyError`]; the delivery must be refused with 401.
pub fn generic(
    secret: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<(), VerifyError> {
    let scheme = TimestampedHmac {
        signature_prefix: "sha256=",
        message_lead: b"",
        separator: b".",
    };
    scheme.verify(secret, timestamp, signature, body, now_secs)
}

/// A signature over `{lead}{timestamp}{separator}{body}` with a fresh timestamp: Slack's and
/// the generic hook's scheme differ only in these three strings.
struct TimestampedHmac {
    signature_prefix: &'static str,
    message_lead: &'static [u8],
    separator: &'static [u8],
}

impl TimestampedHmac {
    fn verify(
        &self,
        secret: &str,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_secs: i64,
    ) -> Result<(), VerifyError> {
        let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
            return Err(VerifyError::Missing);
        };
        fresh(timestamp, now_secs)?;
        let hex_signature = signature
            .strip_prefix(self.signature_prefix)
            .ok_or(VerifyError::BadSignature)?;
        hmac_hex_matches(
            secret.as_bytes(),
            &[
                self.message_lead,
                timestamp.as_bytes(),
                self.separator,
                body,
            ],
            hex_signature,
        )
    }
}

/// Telegram's `X-Telegram-Bot-Api-Secret-Token`.
///
/// # Errors
/// A [`VerifyError`]; the delivery must be refused with 401.
pub fn telegram(secret_token: &str, header: Option<&str>) -> Result<(), VerifyError> {
    let header = header.ok_or(VerifyError::Missing)?;
    if constant_time_eq(secret_token.as_bytes(), header.as_bytes()) {
        Ok(())
    } else {
        Err(VerifyError::BadSignature)
    }
}

/// A Discord application public key from its hex form: 32 bytes as 64 hex characters. Whether
/// the bytes are a point of the curve is learnt when a delivery is verified (a key that is not
/// refuses every delivery).
pub fn discord_key(public_key_hex: &str) -> Option<[u8; 32]> {
    hex::decode(public_key_hex).ok()?.try_into().ok()
}

/// An Ed25519 verification for the host to run: `signature` over `message` with `public_key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ed25519Check {
    /// The application's public key.
    pub public_key: [u8; 32],
    /// The delivery's signature.
    pub signature: [u8; 64],
    /// The signed bytes: `{timestamp}{body}`.
    pub message: Vec<u8>,
}

impl Ed25519Check {
    /// The outcome once the host ran the verification: `valid` is its answer (false also when
    /// the key could not be used).
    ///
    /// # Errors
    /// [`VerifyError::BadSignature`] unless `valid`.
    pub fn verdict(&self, valid: bool) -> Result<(), VerifyError> {
        if valid {
            Ok(())
        } else {
            Err(VerifyError::BadSignature)
        }
    }
}

/// Discord's interaction signature (Ed25519 over timestamp + body), first step: what to verify.
/// Discord sets no freshness rule of its own; a timestamp far from now is refused as for the
/// other platforms.
///
/// # Errors
/// A [`VerifyError`]; the delivery must be refused with 401.
pub fn discord(
    public_key_hex: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_secs: i64,
) -> Result<Ed25519Check, VerifyError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(VerifyError::Missing);
    };
    fresh(timestamp, now_secs)?;
    let public_key = discord_key(public_key_hex).ok_or(VerifyError::BadSignature)?;
    let signature: [u8; 64] = hex::decode(signature)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(VerifyError::BadSignature)?;
    let mut message = Vec::with_capacity(timestamp.len() + body.len());
    message.extend_from_slice(timestamp.as_bytes());
    message.extend_from_slice(body);
    Ok(Ed25519Check {
        public_key,
        signature,
        message,
    })
}

/// Compares without an early exit, so timing does not tell how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

    /// Both steps, with ed25519-dalek as the host's verifier.
    fn discord(
        public_key_hex: &str,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_secs: i64,
    ) -> Result<(), VerifyError> {
        let check = super::discord(public_key_hex, timestamp, signature, body, now_secs)?;
        let valid = VerifyingKey::from_bytes(&check.public_key).is_ok_and(|key| {
            key.verify(&check.message, &Signature::from_bytes(&check.signature))
                .is_ok()
        });
        check.verdict(valid)
    }

    const NOW: i64 = 1_531_420_618;

    /// Slack's own example from "Verifying requests from Slack".
    #[test]
    fn slack_documentation_example() {
        let secret = "8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let sig = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
        let ts = "1531420618";
        assert_eq!(slack(secret, Some(ts), Some(sig), body, NOW), Ok(()));
        type Case<'a> = (Option<&'a str>, Option<&'a str>, &'a [u8], i64, VerifyError);
        let cases: [Case<'_>; 8] = [
            (None, Some(sig), body, NOW, VerifyError::Missing),
            (Some(ts), None, body, NOW, VerifyError::Missing),
            (
                Some(ts),
                Some(sig),
                b"token=other",
                NOW,
                VerifyError::BadSignature,
            ),
            (
                Some(ts),
                Some(&sig[3..]),
                body,
                NOW,
                VerifyError::BadSignature,
            ),
            (
                Some(ts),
                Some("v0=zz"),
                body,
                NOW,
                VerifyError::BadSignature,
            ),
            (
                Some(ts),
                Some(sig),
                body,
                NOW + MAX_SKEW_SECS + 1,
                VerifyError::Stale,
            ),
            (
                Some(ts),
                Some(sig),
                body,
                NOW - MAX_SKEW_SECS - 1,
                VerifyError::Stale,
            ),
            (Some("soon"), Some(sig), body, NOW, VerifyError::Stale),
        ];
        for (ts, sig, body, now, want) in cases {
            assert_eq!(
                slack(secret, ts, sig, body, now),
                Err(want),
                "{ts:?} {sig:?} {now}"
            );
        }
        // The window's edges are inside.
        for now in [NOW + MAX_SKEW_SECS, NOW - MAX_SKEW_SECS] {
            assert_eq!(slack(secret, Some(ts), Some(sig), body, now), Ok(()));
        }
        assert_eq!(
            slack("another-secret", Some(ts), Some(sig), body, NOW),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn generic_signatures() {
        let secret = "0123456789abcdef";
        let body = br#"{"thread":"t","user":"u","text":"hi"}"#;
        let ts = NOW.to_string();
        let sig = format!(
            "sha256={}",
            hmac_hex(secret.as_bytes(), &[ts.as_bytes(), b".", body])
        );
        assert_eq!(generic(secret, Some(&ts), Some(&sig), body, NOW), Ok(()));
        assert_eq!(
            generic(
                secret,
                Some(&ts),
                Some(&sig.replace("sha256=", "")),
                body,
                NOW
            ),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            generic(secret, Some(&(NOW - 1).to_string()), Some(&sig), body, NOW),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            generic(secret, Some(&ts), Some(&sig), body, NOW + 301),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            generic(secret, None, Some(&sig), body, NOW),
            Err(VerifyError::Missing)
        );
    }

    #[test]
    fn telegram_secret_token() {
        assert_eq!(telegram("abc_-1", Some("abc_-1")), Ok(()));
        assert_eq!(
            telegram("abc_-1", Some("abc_-2")),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            telegram("abc_-1", Some("abc_-")),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(telegram("abc_-1", Some("")), Err(VerifyError::BadSignature));
        assert_eq!(telegram("abc_-1", None), Err(VerifyError::Missing));
    }

    #[test]
    fn discord_ed25519() {
        let signing = SigningKey::from_bytes(&[9u8; 32]);
        let public = hex::encode(signing.verifying_key().to_bytes());
        let body = br#"{"type":1}"#;
        let ts = NOW.to_string();
        let mut message = ts.as_bytes().to_vec();
        message.extend_from_slice(body);
        let sig = hex::encode(signing.sign(&message).to_bytes());
        assert_eq!(discord(&public, Some(&ts), Some(&sig), body, NOW), Ok(()));
        assert_eq!(
            discord(&public, Some(&ts), Some(&sig), br#"{"type":2}"#, NOW),
            Err(VerifyError::BadSignature)
        );
        let other = hex::encode(
            SigningKey::from_bytes(&[8u8; 32])
                .verifying_key()
                .to_bytes(),
        );
        assert_eq!(
            discord(&other, Some(&ts), Some(&sig), body, NOW),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            discord(&public, Some(&ts), Some("00"), body, NOW),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            discord(&public, Some(&ts), Some(&sig), body, NOW + 301),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            discord(&public, None, Some(&sig), body, NOW),
            Err(VerifyError::Missing)
        );
        assert!(discord_key("00").is_none());
        assert!(discord_key(&format!("{public}00")).is_none());
        assert!(discord_key(&"g".repeat(64)).is_none());
        assert!(discord_key(&public).is_some());
        // What the host is asked to verify: exactly the timestamp then the body.
        let check = super::discord(&public, Some(&ts), Some(&sig), body, NOW).unwrap();
        assert_eq!(check.message, [ts.as_bytes(), body].concat());
        assert_eq!(hex::encode(check.public_key), public);
        assert_eq!(hex::encode(check.signature), sig);
        assert_eq!(check.verdict(false), Err(VerifyError::BadSignature));
    }
}
