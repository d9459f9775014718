//! The signature algorithms the Worker's JWTs use, as jsonwebtoken's crypto provider: HS256
//! (Wuhu's own tokens, `auth.rs`) and RS256 (Cloudflare Access, `access.rs`). Any other
//! algorithm is refused as an invalid algorithm.
//!
//! Why not the crate's `rust_crypto` feature: it links every algorithm jsonwebtoken knows
//! (P-256, P-384, Ed25519, RSA-PSS), about 130 KB of wasm the Worker never runs, inside a
//! bundle whose size is budgeted (docs/benchmarks.md).

use hmac::{Hmac, Mac};
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::signature::{self, Signer, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::{BigUint, Pkcs1v15Sign, RsaPublicKey};
use sha2::{Digest, Sha256};

static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: new_signer,
    verifier_factory: new_verifier,
    key_utils: KeyUtils::new_unimplemented(),
};

/// Makes the provider the process default. Idempotent and cheap: call it before any
/// jsonwebtoken `encode`/`decode` (jsonwebtoken panics when no provider is installed).
pub fn install() {
    // Err means it is already installed (by an earlier call): nothing to do.
    let _ = PROVIDER.install_default();
}

fn new_signer(algorithm: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    match algorithm {
        Algorithm::HS256 if key.family() == AlgorithmFamily::Hmac => {
            Ok(Box::new(Hs256::new(key.as_bytes())?))
        }
        Algorithm::HS256 => Err(ErrorKind::InvalidKeyFormat.into()),
        _ => Err(ErrorKind::InvalidAlgorithm.into()),
    }
}

fn new_verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    match (algorithm, key.family()) {
        (Algorithm::HS256, AlgorithmFamily::Hmac) => {
            Ok(Box::new(Hs256::new(key.try_get_as_bytes()?)?))
        }
        (Algorithm::RS256, AlgorithmFamily::Rsa) => {
            let public = match key.kind() {
                DecodingKeyKind::RsaModulusExponent { n, e } => {
                    RsaPublicKey::new(BigUint::from_bytes_be(n), BigUint::from_bytes_be(e))
                        .map_err(|e| ErrorKind::InvalidRsaKey(e.to_string()))?
                }
                DecodingKeyKind::SecretOrDer(der) => RsaPublicKey::from_pkcs1_der(der)
                    .map_err(|e| ErrorKind::InvalidRsaKey(e.to_string()))?,
            };
            Ok(Box::new(Rs256(public)))
        }
        (Algorithm::HS256 | Algorithm::RS256, _) => Err(ErrorKind::InvalidKeyFormat.into()),
        _ => Err(ErrorKind::InvalidAlgorithm.into()),
    }
}

struct Hs256(Hmac<Sha256>);

impl Hs256 {
    fn new(secret: &[u8]) -> Result<Self> {
        Hmac::new_from_slice(secret)
            .map(Hs256)
            .map_err(|_| ErrorKind::InvalidKeyFormat.into())
    }
}

impl Signer<Vec<u8>> for Hs256 {
    fn try_sign(&self, message: &[u8]) -> std::result::Result<Vec<u8>, signature::Error> {
        let mut mac = self.0.clone();
        mac.update(message);
        Ok(mac.finalize().into_bytes().to_vec())
    }
}

impl Verifier<Vec<u8>> for Hs256 {
    fn verify(
        &self,
        message: &[u8],
        signature: &Vec<u8>,
    ) -> std::result::Result<(), signature::Error> {
        let mut mac = self.0.clone();
        mac.update(message);
        // Constant-time comparison.
        mac.verify_slice(signature)
            .map_err(|_| signature::Error::new())
    }
}

impl JwtSigner for Hs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

impl JwtVerifier for Hs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

struct Rs256(RsaPublicKey);

impl Verifier<Vec<u8>> for Rs256 {
    fn verify(
        &self,
        message: &[u8],
        signature: &Vec<u8>,
    ) -> std::result::Result<(), signature::Error> {
        let digest = Sha256::digest(message);
        self.0
            .verify(Pkcs1v15Sign::new::<Sha256>(), &digest, signature)
            .map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for Rs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::RS256
    }
}
