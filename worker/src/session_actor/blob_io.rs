//! Out-of-line entries in R2 (the rule lives in `wuhu_core::out_of_line`): writing their
//! objects before their rows, and putting placeholders back wherever entries are read.
//!
//! Readers call [`resolve`] on what they read (rows or segment lines) before handing entries
//! on; it costs nothing when no entry is out of line.

use worker::Env;
use wuhu_core::out_of_line::{self, Blob};
use wuhu_core::wire::Entry;

use crate::http::{ApiError, ApiResult};

/// Out-of-line entries share the archive's bucket, under the session's prefix.
const BUCKET: &str = "ARCHIVE";
/// Test-only fault injection: when this variable is `fail`, every object write fails (as an R2
/// outage would). Unset in `wrangler.toml`; tests pass it with `--var`.
const FAULT_VAR: &str = "WUHU_FAULT_BLOB_WRITES";

/// Writes one entry's object. The row that refers to it is written only after this succeeds.
pub(crate) async fn write(env: &Env, blob: &Blob) -> ApiResult<()> {
    if env.var(FAULT_VAR).is_ok_and(|v| v.to_string() == "fail") {
        return Err(storage_error(format!(
            "writing {} failed: injected by {FAULT_VAR}",
            blob.key
        )));
    }
    env.bucket(BUCKET)?
        .put(&blob.key, blob.body.clone())
        .execute()
        .await
        .map_err(|e| storage_error(format!("writing {} failed: {e}", blob.key)))?;
    Ok(())
}

/// Replaces every out-of-line placeholder in `entries` (of session `session_id` of `tenant`) by
/// the entry it stands for. Entries stored inline pass through untouched.
///
/// # Errors
/// An object that is missing, unreadable or not the entry its placeholder names: a page must
/// never silently hold a placeholder.
pub(crate) async fn resolve(
    env: &Env,
    tenant: &str,
    session_id: &str,
    mut entries: Vec<Entry>,
) -> ApiResult<Vec<Entry>> {
    for entry in entries.iter_mut() {
        if !out_of_line::is_placeholder(entry) {
            continue;
        }
        let key = out_of_line::key_to_read(entry, tenant, session_id)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let object = env
            .bucket(BUCKET)?
            .get(&key)
            .execute()
            .await?
            .ok_or_else(|| ApiError::internal(format!("out-of-line entry {key} is missing")))?;
        let body = object
            .body()
            .ok_or_else(|| ApiError::internal(format!("out-of-line entry {key} has no body")))?
            .text()
            .await?;
        *entry =
            out_of_line::resolve(entry, &body).map_err(|e| ApiError::internal(e.to_string()))?;
    }
    Ok(entries)
}

/// A failed storage write, as the caller sees it.
pub(crate) fn storage_error(message: impl Into<String>) -> ApiError {
    ApiError::new(500, "storage_failed", message)
}
