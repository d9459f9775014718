//! Channel credentials at rest: AES-256-GCM under the `WUHU_CHANNEL_KEY` secret.
//!
//! A sealed value is `v1.<nonce hex>.<ciphertext+tag hex>`. The binding id is the associated
//! data, so a sealed value copied into another binding does not open. The host supplies the
//! 12-byte nonce from a CSPRNG (a fresh one per seal: GCM must never reuse a nonce under a key).

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};

/// Length of `WUHU_CHANNEL_KEY` in hex characters (32 bytes).
pub const KEY_HEX_CHARS: usize = 64;
/// Length of a nonce in bytes.
pub const NONCE_BYTES: usize = 12;

/// The channel key, parsed.
#[derive(Clone)]
pub struct ChannelKey(Key<Aes256Gcm>);

impl std::fmt::Debug for ChannelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelKey(..)")
    }
}

/// Why a key or a sealed value is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// `WUHU_CHANNEL_KEY` is not set.
    #[error("WUHU_CHANNEL_KEY is not set")]
    MissingKey,
    /// `WUHU_CHANNEL_KEY` is not 64 hex characters.
    #[error("WUHU_CHANNEL_KEY must be 32 bytes as 64 hex characters")]
    BadKey,
    /// The sealed value is garbled, or was sealed under another key or for another binding.
    #[error("sealed credentials do not open with this key")]
    CannotOpen,
}

impl ChannelKey {
    /// Parses the secret's value.
    ///
    /// # Errors
    /// [`SealError::MissingKey`] or [`SealError::BadKey`].
    pub fn parse(text: Option<&str>) -> Result<ChannelKey, SealError> {
        let text = text.ok_or(SealError::MissingKey)?.trim();
        if text.len() != KEY_HEX_CHARS {
            return Err(SealError::BadKey);
        }
        let bytes: [u8; 32] = hex::decode(text)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or(SealError::BadKey)?;
        Ok(ChannelKey(Key::<Aes256Gcm>::from(bytes)))
    }

    /// Seals `plaintext` for binding `binding_id` with `nonce`.
    pub fn seal(&self, binding_id: &str, nonce: [u8; NONCE_BYTES], plaintext: &[u8]) -> String {
        let cipher = Aes256Gcm::new(&self.0);
        let sealed = cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad: binding_id.as_bytes(),
                },
            )
            // Encryption fails only for inputs of gigabytes; credentials are bounded far below.
            .unwrap_or_default();
        format!("v1.{}.{}", hex::encode(nonce), hex::encode(sealed))
    }

    /// Opens a value sealed for `binding_id`.
    ///
    /// # Errors
    /// [`SealError::CannotOpen`] for anything but an intact value of this key and binding.
    pub fn open(&self, binding_id: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
        let mut parts = sealed.split('.');
        let (Some("v1"), Some(nonce), Some(body), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::CannotOpen);
        };
        let nonce: [u8; NONCE_BYTES] = hex::decode(nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or(SealError::CannotOpen)?;
        let body = hex::decode(body).map_err(|_| SealError::CannotOpen)?;
        Aes256Gcm::new(&self.0)
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: &body,
                    aad: binding_id.as_bytes(),
                },
            )
            .map_err(|_| SealError::CannotOpen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn keys() {
        assert_eq!(ChannelKey::parse(None).unwrap_err(), SealError::MissingKey);
        for bad in [
            "",
            "00",
            &KEY[..62],
            &format!("{KEY}00"),
            &KEY.replace('0', "g"),
        ] {
            assert_eq!(
                ChannelKey::parse(Some(bad)).unwrap_err(),
                SealError::BadKey,
                "{bad}"
            );
        }
        assert!(ChannelKey::parse(Some(KEY)).is_ok());
        assert_eq!(
            format!("{:?}", ChannelKey::parse(Some(KEY)).unwrap()),
            "ChannelKey(..)"
        );
    }

    #[test]
    fn seal_and_open() {
        let key = ChannelKey::parse(Some(KEY)).unwrap();
        let sealed = key.seal("b1", [7; 12], b"xoxb-secret");
        assert!(!sealed.contains("xoxb"), "{sealed}");
        assert!(sealed.starts_with("v1.070707070707070707070707."));
        assert_eq!(key.open("b1", &sealed).unwrap(), b"xoxb-secret");
        // Another nonce gives another ciphertext of the same plaintext.
        assert_ne!(sealed, key.seal("b1", [8; 12], b"xoxb-secret"));
        // Another binding, another key, a flipped bit, garbage: nothing opens.
        assert_eq!(key.open("b2", &sealed), Err(SealError::CannotOpen));
        let other = ChannelKey::parse(Some(&KEY.replace("1f", "20"))).unwrap();
        assert_eq!(other.open("b1", &sealed), Err(SealError::CannotOpen));
        let mut flipped = sealed.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(key.open("b1", &flipped), Err(SealError::CannotOpen));
        for garbage in [
            "",
            "v1",
            "v1..",
            "v2.00.00",
            "v1.0707.00",
            &format!("{sealed}.x"),
        ] {
            assert_eq!(
                key.open("b1", garbage),
                Err(SealError::CannotOpen),
                "{garbage}"
            );
        }
    }
}
