//! Secrets, the host's side (`wuhu_core::secrets` has the rules): the keys from the
//! environment, fresh nonces, and opening the values a call was given.

use worker::Env;
use wuhu_core::channels::seal::NONCE_BYTES;
use wuhu_core::masking::Masker;
use wuhu_core::secrets::{self, SealedSecret, SecretKeys, Wanted};
use wuhu_core::wire::runner::SecretEnv;

use crate::http::{ApiError, ApiResult};

fn var(env: &Env, name: &str) -> Option<String> {
    env.secret(name)
        .map(|s| s.to_string())
        .or_else(|_| env.var(name).map(|v| v.to_string()))
        .ok()
}

/// The keys from `WUHU_SECRETS_KEY` (and `WUHU_SECRETS_KEY_PREVIOUS`), or 500
/// `server_misconfigured`.
pub(crate) fn keys(env: &Env) -> ApiResult<SecretKeys> {
    SecretKeys::parse(
        var(env, secrets::KEY_VAR).as_deref(),
        var(env, secrets::PREVIOUS_KEY_VAR).as_deref(),
    )
    .map_err(|m| ApiError::new(500, "server_misconfigured", m))
}

/// A fresh nonce for one seal.
pub(crate) fn nonce() -> ApiResult<[u8; NONCE_BYTES]> {
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::getrandom(&mut nonce)
        .map_err(|_| ApiError::internal("no randomness for a nonce"))?;
    Ok(nonce)
}

/// The values a call gets: [`secrets::choose`] over the tenant's `book`, opened.
///
/// # Errors
/// The tool error the agent sees (which secret may not be used here, or cannot be opened).
pub(crate) fn for_call(
    env: &Env,
    tenant: &str,
    book: &[SealedSecret],
    wanted: Wanted<'_>,
) -> Result<SecretEnv, String> {
    if wanted.names.is_empty() {
        return Ok(SecretEnv::default());
    }
    let chosen = secrets::choose(book, wanted)?;
    let keys = keys(env).map_err(|e| format!("the server cannot open secrets: {}", e.message))?;
    let mut values = SecretEnv::default();
    for secret in chosen {
        let info = &secret.info;
        let aad = secrets::aad(tenant, info.scope, info.owner.as_deref(), &info.name);
        let (value, _) = keys
            .open(&aad, &secret.sealed)
            .map_err(|e| format!("secret {}: {e}", info.name))?;
        values.0.insert(info.name.clone(), value);
    }
    Ok(values)
}

/// The masker of every secret in `book` (their values opened once), over the detector. A value
/// that does not open is left out and logged: the detector still applies.
pub(crate) fn masker(env: &Env, tenant: &str, book: &[SealedSecret]) -> Masker {
    if book.is_empty() {
        return Masker::default();
    }
    let keys = match keys(env) {
        Ok(keys) => keys,
        Err(e) => {
            worker::console_error!("masking without the tenant's secrets: {}", e.message);
            return Masker::default();
        }
    };
    let opened = book.iter().filter_map(|secret| {
        let info = &secret.info;
        let aad = secrets::aad(tenant, info.scope, info.owner.as_deref(), &info.name);
        match keys.open(&aad, &secret.sealed) {
            Ok((value, _)) => Some((info.name.clone(), value)),
            Err(e) => {
                worker::console_error!("secret {} is not masked: {e}", info.name);
                None
            }
        }
    });
    Masker::new(opened)
}

/// `payload` with every string in it masked (an entry before it is stored).
pub(crate) fn mask_entry(
    masker: &Masker,
    payload: wuhu_core::wire::EntryPayload,
) -> wuhu_core::wire::EntryPayload {
    let Ok(mut value) = serde_json::to_value(&payload) else {
        return payload;
    };
    let before = value.clone();
    masker.mask_json(&mut value);
    if value == before {
        return payload;
    }
    serde_json::from_value(value).unwrap_or(payload)
}

/// `value` (a `js` `fetch` header) with its `{{secret:NAME}}` references replaced by the values
/// the turn may send to `host` ([`secrets::for_fetch`]).
///
/// # Errors
/// The script's error: a malformed reference, or a secret not for this host or this turn.
pub(crate) fn substitute_header(
    env: &Env,
    tenant: &str,
    book: &[SealedSecret],
    value: &str,
    host: &str,
    acting_for: &[String],
) -> Result<String, String> {
    let names = secrets::references(value)?;
    if names.is_empty() {
        return Ok(value.to_string());
    }
    let keys = keys(env).map_err(|e| format!("the server cannot open secrets: {}", e.message))?;
    let mut values = Vec::with_capacity(names.len());
    for name in names {
        let secret = secrets::for_fetch(book, &name, host, acting_for)?;
        let info = &secret.info;
        let aad = secrets::aad(tenant, info.scope, info.owner.as_deref(), &info.name);
        let (value, _) = keys
            .open(&aad, &secret.sealed)
            .map_err(|e| format!("secret {name}: {e}"))?;
        values.push((name, value));
    }
    Ok(secrets::substitute(value, &values))
}
