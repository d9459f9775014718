//! The runner's key (decision 0024): an Ed25519 key pair made at its first start and kept in
//! `~/.wuhu/runner-key` (mode `0600`, base64url of its PKCS#8 document). The hub binds the
//! runner's name to the public key at its first `hello` with it; every later `hello` signs the
//! connection's nonce, so a copy of the runner token alone cannot pose as the runner. No cell
//! can read the file (a protected path).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use ring::signature::{Ed25519KeyPair, KeyPair};
use wuhu_core::jwt::{base64url_decode, base64url_encode};
use wuhu_core::wire::runner::{HelloKey, hello_signing_input};

/// A runner's key pair.
pub struct RunnerKey(Ed25519KeyPair);

impl std::fmt::Debug for RunnerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunnerKey({})", self.public_key())
    }
}

impl RunnerKey {
    /// Reads the key at `path`, or makes one there (a private file) when there is none;
    /// `true` when it was made now.
    ///
    /// # Errors
    /// A file others may read, or one that is not a key, or one that cannot be written.
    pub fn load_or_create(path: &Path) -> Result<(RunnerKey, bool), String> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mode = std::fs::metadata(path)
                    .map(|m| m.permissions().mode())
                    .unwrap_or(0);
                wuhu_core::cell::check_secret_file_mode(
                    &path.to_string_lossy(),
                    "the runner's key",
                    mode,
                )?;
                let der = base64url_decode(text.trim())
                    .map_err(|_| format!("{} is not a runner key", path.display()))?;
                let pair = Ed25519KeyPair::from_pkcs8(&der)
                    .map_err(|_| format!("{} is not a runner key", path.display()))?;
                Ok((RunnerKey(pair), false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let rng = ring::rand::SystemRandom::new();
                let document = Ed25519KeyPair::generate_pkcs8(&rng)
                    .map_err(|_| String::from("cannot make a key pair"))?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                }
                // A new file, never through a link planted at its name, private from the start.
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                file.write_all(format!("{}\n", base64url_encode(document.as_ref())).as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let pair = Ed25519KeyPair::from_pkcs8(document.as_ref())
                    .map_err(|_| String::from("cannot read the key pair just made"))?;
                Ok((RunnerKey(pair), true))
            }
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The public key, base64url.
    pub fn public_key(&self) -> String {
        base64url_encode(self.0.public_key().as_ref())
    }

    /// The `key` of a `hello` as `name` on the connection with `nonce`.
    pub fn hello_key(&self, nonce: &str, name: &str) -> HelloKey {
        let signature = self.0.sign(hello_signing_input(nonce, name).as_bytes());
        HelloKey {
            public_key: self.public_key(),
            signature: base64url_encode(signature.as_ref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_privately_and_signs_the_nonce() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner-key");
        let (made, created) = RunnerKey::load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let (read, created) = RunnerKey::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(made.public_key(), read.public_key());
        let key = read.hello_key("n0nce", "mac");
        let public = base64url_decode(&key.public_key).unwrap();
        let signature = base64url_decode(&key.signature).unwrap();
        let verifier = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public);
        assert!(
            verifier
                .verify(b"wuhu-runner-hello-v1\nn0nce\nmac", &signature)
                .is_ok()
        );
        assert!(
            verifier
                .verify(b"wuhu-runner-hello-v1\nother\nmac", &signature)
                .is_err()
        );
        // Readable by others: refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            RunnerKey::load_or_create(&path)
                .unwrap_err()
                .contains("chmod 600")
        );
        std::fs::write(dir.path().join("bad"), "not a key\n").unwrap();
        std::fs::set_permissions(
            dir.path().join("bad"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        assert!(RunnerKey::load_or_create(&dir.path().join("bad")).is_err());
    }
}
