//! A Cloudflare Access team for tests: a local key-set server (`/cdn-cgi/access/certs` on a
//! [`FakeHttp`]) serving one RSA key generated here, and Access application tokens signed with
//! it as Cloudflare issues them (RS256, `kid`, `aud`, `iss`, `email`, `iat`).
//!
//! ```text
//! let team = AccessTeam::start("aud");
//! // the stack gets WUHU_ACCESS_TEAM_DOMAIN = team.domain(), WUHU_ACCESS_AUD = "aud"
//! let token = team.token("ana@example.com", 0); // signed in just now
//! ```

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rsa::pkcs1v15::SigningKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::fake_http::{FakeHttp, HttpReply};
use crate::util::unix_now;

/// Where Access publishes a team's keys.
pub const CERTS_PATH: &str = "/cdn-cgi/access/certs";
const KID: &str = "team-key-1";

/// A team: its key-set server and signing key.
pub struct AccessTeam {
    server: FakeHttp,
    key: RsaPrivateKey,
    audience: String,
}

impl AccessTeam {
    /// Generates a 2048-bit key and serves it as the team's key set.
    pub fn start(audience: &str) -> AccessTeam {
        let key = RsaPrivateKey::new(&mut rand::thread_rng(), 2048).expect("rsa key");
        let server = FakeHttp::start();
        let public = RsaPublicKey::from(&key);
        server.route(
            CERTS_PATH,
            HttpReply::json(&json!({"keys": [{
                "kid": KID, "kty": "RSA", "alg": "RS256", "use": "sig",
                "n": URL_SAFE_NO_PAD.encode(public.n().to_bytes_be()),
                "e": URL_SAFE_NO_PAD.encode(public.e().to_bytes_be()),
            }]})),
        );
        AccessTeam {
            server,
            key,
            audience: audience.to_string(),
        }
    }

    /// `WUHU_ACCESS_TEAM_DOMAIN`: `http://127.0.0.1:PORT` (loopback, so plain http is allowed).
    pub fn domain(&self) -> String {
        self.server.base_url()
    }

    /// The application claims of `email`, who signed in `signed_in_ago` seconds ago (`iat`);
    /// valid for ten more minutes.
    pub fn claims(&self, email: &str, signed_in_ago: i64) -> Value {
        let now = unix_now();
        json!({
            "aud": [self.audience], "email": email, "exp": now + 600, "iat": now - signed_in_ago,
            "nbf": now - signed_in_ago - 5, "iss": self.domain(), "type": "app",
            "identity_nonce": "n", "sub": "5b3b9c1e-0000-4000-8000-000000000000", "country": "DE",
        })
    }

    /// `claims` signed with the team's key.
    pub fn sign(&self, claims: &Value) -> String {
        let part = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).expect("json"));
        let input = format!(
            "{}.{}",
            part(&json!({"alg": "RS256", "kid": KID, "typ": "JWT"})),
            part(claims)
        );
        let signature = SigningKey::<Sha256>::new(self.key.clone()).sign(input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
    }

    /// The `Cf-Access-Jwt-Assertion` of `email`, signed in `signed_in_ago` seconds ago.
    pub fn token(&self, email: &str, signed_in_ago: i64) -> String {
        self.sign(&self.claims(email, signed_in_ago))
    }
}
