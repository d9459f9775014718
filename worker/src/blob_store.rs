//! Blobs in R2 (the rules live in `wuhu_core::blobs`): issuing upload URLs, the upload route,
//! serving `GET /v1/blobs/:id`, checking what a runner uploaded, a session's `read` of its
//! blobs.

use worker::{Env, Headers, Range, Request, Response};
use wuhu_core::blobs::{self, BlobRead, BlobRef, UploadGrant, UploadRefusal};
use wuhu_core::images::{self, cache::ByteLru};
use wuhu_core::llm::inline_images::{InlineImage, InlineImages};
use wuhu_core::sigv4;
use wuhu_core::wire::runner::UploadSlot;

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult, query_pairs};

/// Blobs share the bucket of the archive and the workspace, under `{tenant}/blobs/`.
const BUCKET: &str = "ARCHIVE";

/// The R2 S3 API settings that switch uploads to SigV4 presigned URLs (decision 0015). All
/// four must be set; otherwise the Worker's own signed upload route is used.
const S3_ENDPOINT: &str = "WUHU_BLOB_S3_ENDPOINT";
const S3_BUCKET: &str = "WUHU_BLOB_S3_BUCKET";
const S3_ACCESS_KEY_ID: &str = "WUHU_BLOB_S3_ACCESS_KEY_ID";
const S3_SECRET_ACCESS_KEY: &str = "WUHU_BLOB_S3_SECRET_ACCESS_KEY";

fn setting(env: &Env, name: &str) -> Option<String> {
    env.secret(name)
        .map(|s| s.to_string())
        .or_else(|_| env.var(name).map(|v| v.to_string()))
        .ok()
        .filter(|v| !v.is_empty())
}

/// The key upload URLs are signed with (derived from `WUHU_JWT_SECRET`).
fn upload_key(env: &Env) -> ApiResult<Vec<u8>> {
    let secret = env
        .secret("WUHU_JWT_SECRET")
        .map(|s| s.to_string())
        .map_err(|_| ApiError::new(500, "server_misconfigured", "WUHU_JWT_SECRET is not set"))?;
    Ok(blobs::upload_key(secret.as_bytes()))
}

fn now_ms() -> u64 {
    worker::Date::now().as_millis()
}

/// A new upload slot for one blob of session `session_id` of `tenant`.
pub(crate) fn issue_slot(env: &Env, tenant: &str, session_id: &str) -> ApiResult<UploadSlot> {
    let blob_id = blobs::new_id(session_id, uuid::Uuid::new_v4().into_bytes());
    let grant = UploadGrant::issue(tenant, &blob_id, now_ms());
    let s3 = (
        setting(env, S3_ENDPOINT),
        setting(env, S3_BUCKET),
        setting(env, S3_ACCESS_KEY_ID),
        setting(env, S3_SECRET_ACCESS_KEY),
    );
    let url = if let (Some(endpoint), Some(bucket), Some(access_key_id), Some(secret)) = s3 {
        let id = blobs::parse_id(&blob_id).ok_or_else(|| ApiError::internal("bad blob id"))?;
        let path = format!("/{bucket}/{}", blobs::object_key(tenant, id));
        sigv4::presign_url(
            &sigv4::Credentials {
                access_key_id,
                secret_access_key: secret,
                region: "auto".into(),
            },
            &sigv4::Presign {
                method: "PUT",
                origin: endpoint.trim_end_matches('/'),
                path: &path,
                signed_headers: &[],
                now_unix: now_ms() / 1000,
                expires_seconds: blobs::UPLOAD_TTL_MS / 1000,
            },
        )
    } else {
        grant.relative_url(&upload_key(env)?)
    };
    Ok(UploadSlot {
        blob_id,
        url,
        max_bytes: grant.max_bytes,
        expires_at_ms: grant.expires_at_ms,
    })
}

/// `PUT /v1/blobs/upload?…&sig=…`: authenticated by its signature alone. Streams the body into
/// R2 under the granted key with the sent media type (normalised to the allow-list).
pub(crate) async fn upload_route(req: &Request, env: &Env) -> ApiResult<Response> {
    let pairs = query_pairs(req);
    let content_length = req
        .headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|v| v.trim().parse::<u64>().ok());
    let grant = UploadGrant::verify(&pairs, &upload_key(env)?, content_length, now_ms()).map_err(
        |refusal| match refusal {
            UploadRefusal::Malformed(_) => ApiError::bad_request(refusal.to_string()),
            UploadRefusal::TooLarge { .. } => {
                ApiError::new(413, "payload_too_large", refusal.to_string())
            }
            UploadRefusal::BadSignature | UploadRefusal::Expired => {
                ApiError::new(403, "forbidden", refusal.to_string())
            }
        },
    )?;
    let id = blobs::parse_id(&grant.blob_id).ok_or_else(|| ApiError::bad_request("bad blob id"))?;
    let media_type = blobs::normalize_media_type(
        &req.headers()
            .get("content-type")
            .ok()
            .flatten()
            .unwrap_or_default(),
    );
    let key = blobs::object_key(&grant.tenant, id);
    let body: worker::Data = match req.inner().body() {
        Some(stream) => stream.into(),
        None => worker::Data::Empty,
    };
    env.bucket(BUCKET)?
        .put(&key, body)
        .http_metadata(worker::HttpMetadata {
            content_type: Some(media_type.to_string()),
            ..Default::default()
        })
        .execute()
        .await
        .map_err(|e| {
            ApiError::new(
                500,
                "storage_error",
                format!("storing the blob failed: {e}"),
            )
        })?;
    Ok(crate::http::json_response(
        200,
        &serde_json::json!({"uri": blobs::uri(&grant.blob_id), "size": content_length}),
    ))
}

/// Size and media type of blob `blob_id` of `tenant`, if it exists.
pub(crate) async fn head(
    env: &Env,
    tenant: &str,
    blob_id: &str,
) -> ApiResult<Option<(u64, String)>> {
    let Some(id) = blobs::parse_id(blob_id) else {
        return Ok(None);
    };
    let object = env
        .bucket(BUCKET)?
        .head(blobs::object_key(tenant, id))
        .await?;
    Ok(object.map(|o| {
        let media = o.http_metadata().content_type.unwrap_or_default();
        (o.size(), media)
    }))
}

/// Checks the blobs a runner says it uploaded for a call granted `slot`; returns the accepted
/// references and, for refused ones, a note for the tool result.
pub(crate) async fn accept(
    env: &Env,
    tenant: &str,
    slot: Option<&UploadSlot>,
    claimed: &[BlobRef],
) -> (Vec<BlobRef>, Vec<String>) {
    let mut accepted = Vec::new();
    let mut notes = Vec::new();
    for blob in claimed {
        let Some(slot) = slot else {
            notes.push(format!("{} was not granted for this call", blob.uri));
            continue;
        };
        let stored = match head(env, tenant, &slot.blob_id).await {
            Ok(stored) => stored,
            Err(e) => {
                notes.push(format!("{} could not be checked: {}", blob.uri, e.message));
                continue;
            }
        };
        let blob = match blobs::accept_upload(
            blob,
            &slot.blob_id,
            stored.as_ref().map(|(s, m)| (*s, m.as_str())),
        ) {
            Ok(blob) => blob,
            Err(note) => {
                notes.push(note);
                continue;
            }
        };
        if !blobs::is_image(&blob.media_type) {
            accepted.push(blob);
            continue;
        }
        // An image: its stored bytes must be one, and its pixel size is what they say.
        let head = match read_bytes(env, tenant, &slot.blob_id, Some(images::HEADER_BYTES)).await {
            Ok(Some(head)) => head,
            Ok(None) => {
                notes.push(format!("{} was not uploaded", blob.uri));
                continue;
            }
            Err(e) => {
                notes.push(format!("{} could not be checked: {e}", blob.uri));
                continue;
            }
        };
        match blobs::accept_image(blob, &head) {
            Ok(blob) => accepted.push(blob),
            Err(note) => notes.push(note),
        }
    }
    (accepted, notes)
}

/// The bytes of blob `blob_id` of `tenant` (the first `at_most` of them, if given); `None` if
/// it does not exist. The caller bounds the size (a `HEAD` or the blob reference says it).
pub(crate) async fn read_bytes(
    env: &Env,
    tenant: &str,
    blob_id: &str,
    at_most: Option<usize>,
) -> Result<Option<Vec<u8>>, String> {
    let id = blobs::parse_id(blob_id).ok_or_else(|| format!("{blob_id} is not a blob id"))?;
    let bucket = env.bucket(BUCKET).map_err(|e| e.to_string())?;
    let get = bucket.get(blobs::object_key(tenant, id));
    let get = match at_most {
        Some(n) => get.range(Range::Prefix { length: n as u64 }),
        None => get,
    };
    let Some(object) = get.execute().await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let Some(body) = object.body() else {
        return Ok(Some(Vec::new()));
    };
    body.bytes().await.map(Some).map_err(|e| e.to_string())
}

/// `GET /v1/blobs/:id`: whoever may read the blob's session gets it (whole, or the one byte
/// range asked for); anyone else, and any other tenant, gets 404.
pub(crate) async fn get_route(
    req: &Request,
    env: &Env,
    identity: &Identity,
    blob_id: &str,
) -> ApiResult<Response> {
    let id = blobs::parse_id(blob_id).ok_or_else(|| ApiError::not_found("blob not found"))?;
    // The session's actor answers 404 to someone who may not read it.
    crate::session_client::info(env, identity, id.session_id)
        .await
        .map_err(|e| {
            if e.status == 404 {
                ApiError::not_found("blob not found")
            } else {
                e
            }
        })?;
    let key = blobs::object_key(&identity.tenant, id);
    let bucket = env.bucket(BUCKET)?;
    let Some(object) = bucket.head(&key).await? else {
        return Err(ApiError::not_found("blob not found"));
    };
    let size = object.size();
    let media_type = object.http_metadata().content_type.unwrap_or_default();
    let range_header = req.headers().get("range").ok().flatten();
    let range = blobs::byte_range(range_header.as_deref(), size)
        .map_err(|e| ApiError::new(416, "range_not_satisfiable", e.to_string()))?;
    let get = bucket.get(&key);
    let get = match range {
        Some((offset, length)) => get.range(Range::OffsetWithLength { offset, length }),
        None => get,
    };
    let Some(object) = get.execute().await? else {
        return Err(ApiError::not_found("blob not found"));
    };
    // The R2 body handed to the runtime as it is: no CPU spent streaming, and its length is
    // known, so the answer has a `Content-Length`.
    let body = object
        .body()
        .ok_or_else(|| ApiError::not_found("blob not found"))?
        .response_body()?;
    let headers = Headers::new();
    headers.set("content-type", &blobs::content_type(&media_type))?;
    // A blob is data, never a page of this origin: no sniffing, no scripts, no framing.
    headers.set("x-content-type-options", "nosniff")?;
    headers.set("content-security-policy", "sandbox; default-src 'none'")?;
    headers.set("cache-control", "private, max-age=300")?;
    headers.set("accept-ranges", "bytes")?;
    if !blobs::is_image(&media_type) && !media_type.starts_with("text/") {
        headers.set("content-disposition", "attachment")?;
    }
    let status = match range {
        Some((offset, length)) => {
            headers.set(
                "content-range",
                &format!("bytes {offset}-{}/{size}", offset + length - 1),
            )?;
            headers.set("content-length", &length.to_string())?;
            206
        }
        None => {
            headers.set("content-length", &size.to_string())?;
            200
        }
    };
    Ok(Response::from_body(body)?
        .with_status(status)
        .with_headers(headers))
}

/// What a `read` of a blob gives (`wuhu_core::blobs::read_kind` decides which).
pub(crate) enum BlobContent {
    /// The blob's text, to page by lines.
    Text(String),
    /// An image to attach to the result.
    Image(BlobRef),
}

/// Reads blob `blob_id` of session `session_id` for the `read` tool: its first
/// [`images::HEADER_BYTES`] decide whether it is an image (only they are fetched then) or text
/// (fetched whole when longer, up to [`blobs::MAX_READ_BYTES`]).
pub(crate) async fn read_blob(
    env: &Env,
    tenant: &str,
    session_id: &str,
    blob_id: &str,
) -> Result<BlobContent, String> {
    let uri = blobs::uri(blob_id);
    let id = blobs::parse_id(blob_id).ok_or_else(|| format!("{uri} is not a blob"))?;
    if id.session_id != session_id {
        return Err(format!("No blob {uri} in this session"));
    }
    let bucket = env.bucket(BUCKET).map_err(|e| e.to_string())?;
    let object = bucket
        .get(blobs::object_key(tenant, id))
        .range(Range::Prefix {
            length: images::HEADER_BYTES as u64,
        })
        .execute()
        .await
        .map_err(|e| format!("reading {uri} failed: {e}"))?
        .ok_or_else(|| format!("No blob {uri} in this session"))?;
    let media_type = object.http_metadata().content_type.unwrap_or_default();
    let size = object.size();
    let head = match object.body() {
        Some(body) => body
            .bytes()
            .await
            .map_err(|e| format!("reading {uri} failed: {e}"))?,
        None => Vec::new(),
    };
    match blobs::read_kind(&uri, &media_type, size, &head)? {
        BlobRead::Image(blob) => Ok(BlobContent::Image(blob)),
        BlobRead::Text if size <= head.len() as u64 => Ok(BlobContent::Text(
            String::from_utf8_lossy(&head).into_owned(),
        )),
        BlobRead::Text => {
            let bytes = read_bytes(env, tenant, blob_id, None)
                .await
                .map_err(|e| format!("reading {uri} failed: {e}"))?
                .ok_or_else(|| format!("No blob {uri} in this session"))?;
            Ok(BlobContent::Text(
                String::from_utf8_lossy(&bytes).into_owned(),
            ))
        }
    }
}

thread_local! {
    /// The isolate's image cache (`wuhu_core::images::cache`): wasm runs one thread, so every
    /// Durable Object of the isolate shares it, and its bound is the isolate's.
    static IMAGE_CACHE: std::cell::RefCell<ByteLru> =
        const { std::cell::RefCell::new(ByteLru::for_images()) };
}

/// How a request's images were found: in the isolate's cache or read from R2.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ImageLoads {
    /// Images found in the cache.
    pub(crate) hits: u32,
    /// Images read from R2.
    pub(crate) misses: u32,
}

/// The bytes of the image blobs an LLM request shows (`inline_images::to_load` picked them
/// within the per-request bounds): from the isolate's cache, else from R2 (and then cached). An
/// image that cannot be read is left out: the request says so in a note instead of failing.
pub(crate) async fn load_images(
    env: &Env,
    tenant: &str,
    chosen: &[BlobRef],
) -> (InlineImages, ImageLoads) {
    let mut loaded = InlineImages::new();
    let mut loads = ImageLoads::default();
    for blob in chosen {
        let Some(Ok(id)) = blobs::id_from_uri(&blob.uri) else {
            continue;
        };
        let key = blobs::object_key(tenant, id);
        let cached = IMAGE_CACHE.with_borrow_mut(|cache| {
            cache
                .get(&key)
                .map(|bytes| InlineImage::new(&blob.media_type, bytes))
        });
        if let Some(image) = cached {
            loads.hits += 1;
            loaded.insert(blob.uri.clone(), image);
            continue;
        }
        loads.misses += 1;
        match read_bytes(env, tenant, id.id, None).await {
            Ok(Some(bytes)) if bytes.len() as u64 <= images::MAX_IMAGE_BYTES => {
                loaded.insert(blob.uri.clone(), InlineImage::new(&blob.media_type, &bytes));
                IMAGE_CACHE.with_borrow_mut(|cache| cache.insert(key, bytes));
            }
            Ok(_) => {}
            Err(e) => worker::console_error!("loading {} for a request failed: {e}", blob.uri),
        }
    }
    (loaded, loads)
}

/// Drops the cached images of a deleted session from this isolate's cache; how many.
pub(crate) fn forget_session_images(tenant: &str, session_id: &str) -> usize {
    IMAGE_CACHE
        .with_borrow_mut(|cache| cache.remove_prefix(&blobs::session_prefix(tenant, session_id)))
}

/// The bytes this isolate's image cache holds.
pub(crate) fn cached_image_bytes() -> u64 {
    IMAGE_CACHE.with_borrow(|cache| cache.bytes())
}

/// Stores `bytes` the Worker itself produced (an MCP result's image or resource) as a new blob
/// of session `session_id`: an image by what its bytes are (with its pixel size, so the model
/// may be shown it), anything else as `media_type` normalised to the allow-list. `Ok((blob,
/// shown))`: `shown` says the blob is an image a model may see.
pub(crate) async fn put(
    env: &Env,
    tenant: &str,
    session_id: &str,
    bytes: Vec<u8>,
    media_type: &str,
) -> Result<(BlobRef, bool), String> {
    let size = bytes.len() as u64;
    if size > blobs::MAX_BLOB_BYTES {
        return Err(format!(
            "over the {} byte limit of a blob",
            blobs::MAX_BLOB_BYTES
        ));
    }
    let image = images::inspect(&bytes);
    let media_type = match &image {
        Some(info) => info.media_type,
        None => blobs::normalize_media_type(media_type),
    };
    let shown = image
        .as_ref()
        .is_some_and(|info| images::refusal("", info, size).is_none());
    let preview = (!blobs::is_image(media_type) && media_type != "application/octet-stream")
        .then(|| blobs::preview(&String::from_utf8_lossy(&bytes)));
    let blob_id = blobs::new_id(session_id, uuid::Uuid::new_v4().into_bytes());
    let id = blobs::parse_id(&blob_id).ok_or("a blob id that does not parse")?;
    let headers = worker::HttpMetadata {
        content_type: Some(media_type.to_string()),
        ..Default::default()
    };
    env.bucket(BUCKET)
        .map_err(|e| e.to_string())?
        .put(blobs::object_key(tenant, id), bytes)
        .http_metadata(headers)
        .execute()
        .await
        .map_err(|e| format!("storing it failed: {e}"))?;
    Ok((
        BlobRef {
            uri: blobs::uri(&blob_id),
            size,
            media_type: media_type.to_string(),
            preview,
            width: image.and_then(|i| i.width),
            height: image.and_then(|i| i.height),
        },
        shown,
    ))
}
