//! Uploading a call's output that is too long for the transcript straight to storage, with the
//! upload URL the server issued for the call (`tool_call.upload`), instead of sending it over
//! the WebSocket; and images a `read` found, as image blobs. The rules (URL resolution, the
//! note, the limits, what bytes are an image) are `wuhu_core::blobs` and `wuhu_core::images`.

use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncReadExt;
use wuhu_core::blobs::{self, BlobRef};
use wuhu_core::images;
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

/// When `output` is a `read` of an image (`details.image` names the file), uploads the image
/// to `slot` as an image blob and makes the result refer to it; the file is read again and
/// checked again (by its bytes, within [`images::MAX_IMAGE_BYTES`]). Without a slot, or when
/// the upload fails, the result is a tool error saying why: an image is never sent as text.
pub async fn attach_image(
    server: &str,
    slot: Option<&UploadSlot>,
    output: &mut ToolOutput,
) -> Vec<BlobRef> {
    let Some(Value::Object(image)) = output.details.as_mut().and_then(|d| d.get_mut("image"))
    else {
        return Vec::new();
    };
    let path = match image.remove("path") {
        Some(Value::String(path)) => path,
        _ => return Vec::new(),
    };
    let shown = image
        .get("shown")
        .and_then(Value::as_str)
        .unwrap_or(&path)
        .to_string();
    match upload_image(server, slot, &path, &shown).await {
        Ok(blob) => {
            output.content = images::describe(
                &shown,
                &blob.uri,
                &blob.media_type,
                blob.size,
                blob.width,
                blob.height,
            );
            image.insert("blob".into(), Value::String(blob.uri.clone()));
            if let (Some(w), Some(h)) = (blob.width, blob.height) {
                image.insert("width".into(), w.into());
                image.insert("height".into(), h.into());
            }
            vec![blob]
        }
        Err(problem) => {
            *output = ToolOutput::error(problem);
            Vec::new()
        }
    }
}

async fn upload_image(
    server: &str,
    slot: Option<&UploadSlot>,
    path: &str,
    shown: &str,
) -> Result<BlobRef, String> {
    let Some(slot) = slot else {
        return Err(format!(
            "{shown} is an image, and the server issued no upload URL for this call to attach it"
        ));
    };
    // One byte over the limit is enough to refuse.
    let mut bytes = Vec::new();
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| format!("reading {shown} failed: {e}"))?;
    file.take(images::MAX_IMAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("reading {shown} failed: {e}"))?;
    let info = images::inspect(&bytes[..bytes.len().min(images::HEADER_BYTES)])
        .ok_or_else(|| format!("{shown} changed while it was read: it is no longer an image"))?;
    if let Some(reason) = images::refusal(shown, &info, bytes.len() as u64) {
        return Err(reason);
    }
    let blob = upload_bytes(server, slot, bytes, info.media_type)
        .await
        .map_err(|problem| format!("{shown} is an image, and attaching it failed: {problem}"))?;
    Ok(BlobRef {
        width: info.width,
        height: info.height,
        ..blob
    })
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
    // Over the limit is known from the file's size: never read it into memory then.
    let size = tokio::fs::metadata(path)
        .await
        .map_err(|e| format!("reading {path} failed: {e}"))?
        .len();
    if size > slot.max_bytes {
        return Err(format!(
            "{size} bytes is over the upload limit of {} bytes",
            slot.max_bytes
        ));
    }
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|e| format!("reading {path} failed: {e}"))?;
    upload_bytes(server, slot, bytes, media_type).await
}

/// Uploads `bytes` as `media_type` to `slot`.
///
/// # Errors
/// Why not: over the limit, or the server refused.
pub async fn upload_bytes(
    server: &str,
    slot: &UploadSlot,
    bytes: Vec<u8>,
    media_type: &str,
) -> Result<BlobRef, String> {
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
        width: None,
        height: None,
    })
}
