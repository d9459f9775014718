//! Uploading a call's output that is too long for the transcript straight to storage, with the
//! upload URL the server issued for the call (`tool_call.upload`), instead of sending it over
//! the WebSocket. The rules (URL resolution, the note, the limits) are `wuhu_core::blobs`.

use std::time::Duration;

use serde_json::Value;
use wuhu_core::blobs::{self, BlobRef};
use wuhu_core::wire::runner::UploadSlot;

use crate::tools::ToolOutput;

/// How long one upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// When `output` is a `bash` result whose output was cut (its details name the full output's
/// file), uploads that file to `slot` and points the result at the blob. Returns the blobs the
/// result refers to (none when nothing was cut, the file is over the slot's limit, or the
/// upload failed: then the result keeps its tail and the file's path, with a note).
pub async fn offload_output(
    server: &str,
    slot: &UploadSlot,
    output: &mut ToolOutput,
) -> Vec<BlobRef> {
    let Some(details) = &output.details else {
        return Vec::new();
    };
    if details.get("truncated").and_then(Value::as_bool) != Some(true) {
        return Vec::new();
    }
    let Some(path) = details
        .get("fullOutputPath")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Vec::new();
    };
    match upload_file(server, slot, &path, "text/plain").await {
        Ok(blob) => {
            output.content = blobs::replace_output_path(&output.content, &path, &blob);
            if let Some(Value::Object(map)) = &mut output.details {
                map.insert("blob".into(), Value::String(blob.uri.clone()));
            }
            vec![blob]
        }
        Err(problem) => {
            output.content.push_str(&format!(
                "\n[The full output stays on the runner: {problem}]"
            ));
            Vec::new()
        }
    }
}

/// Uploads the file at `path` as `media_type` to `slot`.
///
/// # Errors
/// Why not: unreadable, over the limit, or the server refused.
pub async fn upload_file(
    server: &str,
    slot: &UploadSlot,
    path: &str,
    media_type: &str,
) -> Result<BlobRef, String> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|e| format!("reading {path} failed: {e}"))?;
    let size = bytes.len() as u64;
    if size > slot.max_bytes {
        return Err(format!(
            "{size} bytes is over the upload limit of {} bytes",
            slot.max_bytes
        ));
    }
    let preview = media_type.starts_with("text/").then(|| {
        blobs::preview(&String::from_utf8_lossy(
            &bytes[..bytes.len().min(blobs::PREVIEW_BYTES)],
        ))
    });
    let url = blobs::resolve_upload_url(server, &slot.url);
    let client = reqwest::Client::builder()
        .timeout(UPLOAD_TIMEOUT)
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    let response = client
        .put(&url)
        .header("content-type", media_type)
        .header("content-length", size)
        .body(bytes)
        .send()
        .await
        .map_err(|e| format!("uploading failed: {e}"))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return Err(format!(
            "the upload was refused ({status}): {}",
            body.chars().take(300).collect::<String>()
        ));
    }
    Ok(BlobRef {
        uri: blobs::uri(&slot.blob_id),
        size,
        media_type: media_type.to_string(),
        preview,
    })
}
