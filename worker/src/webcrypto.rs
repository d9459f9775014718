//! The runtime's WebCrypto (`crypto.subtle`) for the public-key and AEAD operations the Worker
//! performs, so its wasm links no RSA, Ed25519 or AES code (docs/decisions/0018). What is
//! checked, over which bytes and when is `wuhu_core`'s (`jwt`, `channels::verify`,
//! `channels::seal`); this module only runs the primitive.

use js_sys::{Array, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = ["crypto", "subtle"], js_name = importKey, catch)]
    fn import_key(
        format: &str,
        key_data: &JsValue,
        algorithm: &JsValue,
        extractable: bool,
        usages: &Array,
    ) -> Result<Promise, JsValue>;

    #[wasm_bindgen(js_namespace = ["crypto", "subtle"], js_name = verify, catch)]
    fn subtle_verify(
        algorithm: &JsValue,
        key: &JsValue,
        signature: &[u8],
        data: &[u8],
    ) -> Result<Promise, JsValue>;
}

fn js_error(e: JsValue) -> String {
    e.as_string()
        .or_else(|| {
            js_sys::Reflect::get(&e, &"message".into())
                .ok()
                .and_then(|m| m.as_string())
        })
        .unwrap_or_else(|| "webcrypto failed".to_string())
}

fn json(text: &str) -> Result<JsValue, String> {
    js_sys::JSON::parse(text).map_err(js_error)
}

async fn run(promise: Result<Promise, JsValue>) -> Result<JsValue, String> {
    JsFuture::from(promise.map_err(js_error)?)
        .await
        .map_err(js_error)
}

async fn key(
    format: &str,
    data: &JsValue,
    algorithm: &JsValue,
    usage: &str,
) -> Result<JsValue, String> {
    let usages = Array::of1(&JsValue::from_str(usage));
    run(import_key(format, data, algorithm, false, &usages)).await
}

async fn verify(
    algorithm: &JsValue,
    key: &JsValue,
    signature: &[u8],
    data: &[u8],
) -> Result<bool, String> {
    Ok(run(subtle_verify(algorithm, key, signature, data))
        .await?
        .as_bool()
        .unwrap_or(false))
}

/// RSASSA-PKCS1-v1_5 with SHA-256 (JWT `RS256`) of `signature` over `data`, with the RSA public
/// key whose modulus and exponent are `n` and `e` (base64url, as in a JWK).
///
/// # Errors
/// A message when the key cannot be imported; `Ok(false)` for a signature that does not verify.
pub(crate) async fn verify_rs256(
    n: &str,
    e: &str,
    signature: &[u8],
    data: &[u8],
) -> Result<bool, String> {
    let algorithm = json(r#"{"name":"RSASSA-PKCS1-v1_5","hash":"SHA-256"}"#)?;
    let jwk = json(&serde_json::json!({"kty": "RSA", "n": n, "e": e}).to_string())?;
    let key = key("jwk", &jwk, &algorithm, "verify").await?;
    verify(&algorithm, &key, signature, data).await
}

/// Ed25519 (RFC 8032) of `signature` over `message` with the raw 32-byte `public_key`.
///
/// # Errors
/// A message when the key cannot be imported; `Ok(false)` for a signature that does not verify.
pub(crate) async fn verify_ed25519(
    public_key: &[u8; 32],
    signature: &[u8; 64],
    message: &[u8],
) -> Result<bool, String> {
    let algorithm = json(r#"{"name":"Ed25519"}"#)?;
    let raw = js_sys::Uint8Array::from(&public_key[..]);
    let key = key("raw", &raw, &algorithm, "verify").await?;
    verify(&algorithm, &key, signature, message).await
}
