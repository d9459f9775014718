//! Blobs: tool output and files too large for the transcript.
//!
//! A blob is an object in the Worker's bucket under `{tenant}/blobs/{session}/{id}`
//! ([`object_key`]); the transcript holds a [`BlobRef`] (`wuhu://blob/<id>`, size, media
//! type, preview) instead of the bytes. Its id starts with its session's id ([`BlobId`]), so
//! whoever may read the session may read the blob (`GET /v1/blobs/:id`), a session's `read`
//! reaches only its own blobs, and deleting a session's prefix deletes its blobs.
//!
//! Runners upload blobs straight to storage with a short-lived upload URL the session issues
//! with each `tool_call` ([`UploadGrant`]): the Worker's own URL signed with HMAC-SHA256 (the
//! default, and what `wrangler dev` uses), or an S3 SigV4 presigned `PUT`
//! ([`crate::sigv4`]) when R2's S3 API credentials are configured (decision 0015).

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use crate::wire::BlobRef;

/// Scheme and host of a blob's URI: `wuhu://blob/<id>`.
pub const URI_PREFIX: &str = "wuhu://blob/";

/// Largest blob, in bytes: what an upload URL allows and what a runner uploads. Larger output
/// stays on the runner (its log file) and the transcript keeps its tail.
pub const MAX_BLOB_BYTES: u64 = 32 * 1024 * 1024;

/// Largest preview kept in a [`BlobRef`], in bytes (the head of a text blob).
pub const PREVIEW_BYTES: usize = 1024;

/// How long an upload URL stays valid after it was issued: room for the longest runner call
/// (`bash`'s default timeout and a slow upload), and short enough that a leaked URL is of
/// little use.
pub const UPLOAD_TTL_MS: u64 = 30 * 60 * 1000;

/// Path of the Worker's upload route; the runner resolves it against its server URL.
pub const UPLOAD_PATH: &str = "/v1/blobs/upload";

/// Largest `read` of a blob, in bytes: a blob is read whole to page it by lines.
pub const MAX_READ_BYTES: u64 = MAX_BLOB_BYTES;

/// Media types a blob may have; anything else is stored as `application/octet-stream`.
pub const MEDIA_TYPES: [&str; 7] = [
    "text/plain",
    "application/json",
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/octet-stream",
];

/// The parts of a blob id: `<session id>.<32 lowercase hex digits>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobId<'a> {
    /// The whole id.
    pub id: &'a str,
    /// The session it belongs to.
    pub session_id: &'a str,
}

/// A new blob id of `session_id` from 16 random bytes.
pub fn new_id(session_id: &str, random: [u8; 16]) -> String {
    format!("{session_id}.{}", hex::encode(random))
}

/// Parses a blob id; `None` unless it is a session id (36 characters of hex digits and `-`),
/// a `.` and 32 lowercase hex digits.
pub fn parse_id(id: &str) -> Option<BlobId<'_>> {
    let (session_id, random) = id.split_once('.')?;
    let session_ok = session_id.len() == 36
        && session_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-');
    let random_ok = random.len() == 32
        && random
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (session_ok && random_ok).then_some(BlobId { id, session_id })
}

/// `wuhu://blob/<id>`.
pub fn uri(id: &str) -> String {
    format!("{URI_PREFIX}{id}")
}

/// The blob id of a `wuhu://blob/<id>` path, if it is one (`None` for other paths; a malformed
/// id is `Some(Err)`).
pub fn id_from_uri(path: &str) -> Option<Result<BlobId<'_>, String>> {
    let id = path.strip_prefix(URI_PREFIX)?;
    Some(parse_id(id).ok_or_else(|| format!("{path} is not a blob (wuhu://blob/<id>)")))
}

/// The object key of blob `id` of `tenant`.
pub fn object_key(tenant: &str, id: BlobId<'_>) -> String {
    format!("{}{}", session_prefix(tenant, id.session_id), id.id)
}

/// The key prefix of every blob of a session: deleting it deletes them.
pub fn session_prefix(tenant: &str, session_id: &str) -> String {
    format!("{tenant}/blobs/{session_id}/")
}

/// The media type a blob is stored and served with: `media_type` without parameters,
/// lowercased, if it is in [`MEDIA_TYPES`]; else `application/octet-stream`.
pub fn normalize_media_type(media_type: &str) -> &'static str {
    let essence = media_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    MEDIA_TYPES
        .iter()
        .find(|m| **m == essence)
        .copied()
        .unwrap_or("application/octet-stream")
}

/// Whether a blob of `media_type` is an image a model may be shown.
pub fn is_image(media_type: &str) -> bool {
    normalize_media_type(media_type).starts_with("image/")
}

/// The media type of a file, by its name's extension (what a runner uploads a file as).
pub fn media_type_of_path(path: &str) -> &'static str {
    let extension = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "json" => "application/json",
        "txt" | "log" | "md" => "text/plain",
        _ => "application/octet-stream",
    }
}

/// The `Content-Type` a blob is served with: text gets a charset; what is not in
/// [`MEDIA_TYPES`] is served as `application/octet-stream`.
pub fn content_type(media_type: &str) -> String {
    match normalize_media_type(media_type) {
        m @ ("text/plain" | "application/json") => format!("{m}; charset=utf-8"),
        m => m.to_string(),
    }
}

/// The head of `text` as a preview: at most [`PREVIEW_BYTES`], cut at a char boundary.
pub fn preview(text: &str) -> String {
    let mut end = PREVIEW_BYTES.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Which bytes of a blob of `size` bytes a `Range` header asks for: `Ok(None)` for the whole
/// blob, `Ok(Some((offset, length)))` for one satisfiable `bytes=` range. Only a single range
/// is served; several ranges or another unit are ignored (the whole blob is served, as RFC 9110
/// allows).
///
/// # Errors
/// An unsatisfiable range (it starts at or past the end, or asks for an empty suffix): the
/// caller answers 416.
pub fn byte_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, RangeError> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let parse = |s: &str| s.trim().parse::<u64>().ok();
    match (first.trim().is_empty(), parse(first), parse(last)) {
        // `bytes=-N`: the last N bytes.
        (true, _, Some(suffix)) => {
            if suffix == 0 || size == 0 {
                return Err(RangeError::Unsatisfiable { size });
            }
            let length = suffix.min(size);
            Ok(Some((size - length, length)))
        }
        (false, Some(start), end) if end.is_some() || last.trim().is_empty() => {
            if start >= size {
                return Err(RangeError::Unsatisfiable { size });
            }
            let end = end.map_or(size - 1, |l| l.min(size - 1));
            if end < start {
                return Ok(None); // Invalid: ignored.
            }
            Ok(Some((start, end - start + 1)))
        }
        _ => Ok(None),
    }
}

/// A `Range` the blob cannot satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// The range starts past the end (or is empty).
    #[error("range not satisfiable: the blob has {size} bytes")]
    Unsatisfiable {
        /// The blob's size.
        size: u64,
    },
}

/// What an upload URL allows: one blob of one session of one tenant, at most `max_bytes`,
/// until `expires_at_ms`. Signed with HMAC-SHA256 under a key derived from the server secret
/// ([`upload_key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadGrant {
    /// The tenant.
    pub tenant: String,
    /// The blob id (it names its session).
    pub blob_id: String,
    /// Largest body accepted.
    pub max_bytes: u64,
    /// Unix milliseconds after which the URL is refused.
    pub expires_at_ms: u64,
}

/// Why an upload URL is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UploadRefusal {
    /// A parameter is missing or malformed.
    #[error("malformed upload URL: {0}")]
    Malformed(String),
    /// The signature does not match the parameters.
    #[error("upload URL signature does not match")]
    BadSignature,
    /// The URL is past its expiry.
    #[error("upload URL expired")]
    Expired,
    /// The body is larger than the URL allows (or its length is unknown).
    #[error("upload of {bytes} bytes exceeds the URL's limit of {max} bytes")]
    TooLarge {
        /// Bytes sent (`Content-Length`).
        bytes: u64,
        /// The URL's limit.
        max: u64,
    },
}

type HmacSha256 = Hmac<Sha256>;

/// The key upload URLs are signed with, derived from the server's secret so that an upload
/// signature is never a valid token signature (and the other way round).
pub fn upload_key(server_secret: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(server_secret).expect("HMAC takes any key length");
    mac.update(b"wuhu blob upload v1");
    mac.finalize().into_bytes().to_vec()
}

impl UploadGrant {
    /// A grant for blob `blob_id` of `tenant`, issued at `now_ms`, for at most
    /// [`MAX_BLOB_BYTES`], valid for [`UPLOAD_TTL_MS`].
    pub fn issue(tenant: &str, blob_id: &str, now_ms: u64) -> UploadGrant {
        UploadGrant {
            tenant: tenant.to_string(),
            blob_id: blob_id.to_string(),
            max_bytes: MAX_BLOB_BYTES,
            expires_at_ms: now_ms.saturating_add(UPLOAD_TTL_MS),
        }
    }

    fn string_to_sign(&self) -> String {
        format!(
            "wuhu-blob-upload-v1\n{}\n{}\n{}\n{}",
            self.tenant, self.blob_id, self.max_bytes, self.expires_at_ms
        )
    }

    fn mac(&self, key: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(self.string_to_sign().as_bytes());
        mac
    }

    /// The upload URL's path and query, relative to the server: `/v1/blobs/upload?…&sig=…`.
    pub fn relative_url(&self, key: &[u8]) -> String {
        let signature = hex::encode(self.mac(key).finalize().into_bytes());
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("tenant", &self.tenant)
            .append_pair("blob", &self.blob_id)
            .append_pair("max", &self.max_bytes.to_string())
            .append_pair("exp", &self.expires_at_ms.to_string())
            .append_pair("sig", &signature);
        format!("{UPLOAD_PATH}?{}", query.finish())
    }

    /// Checks an upload request: the URL's query pairs, its `Content-Length` and the time.
    /// Signature first (compared in constant time), then expiry, then size.
    ///
    /// # Errors
    /// [`UploadRefusal`]: the route answers 403 for a bad signature or an expired URL, 413
    /// for a body over the limit, 400 for a malformed URL.
    pub fn verify(
        pairs: &[(String, String)],
        key: &[u8],
        content_length: Option<u64>,
        now_ms: u64,
    ) -> Result<UploadGrant, UploadRefusal> {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| UploadRefusal::Malformed(format!("missing {name}")))
        };
        let number = |name: &str| {
            get(name)?
                .parse::<u64>()
                .map_err(|_| UploadRefusal::Malformed(format!("{name} is not a number")))
        };
        let grant = UploadGrant {
            tenant: get("tenant")?.to_string(),
            blob_id: get("blob")?.to_string(),
            max_bytes: number("max")?,
            expires_at_ms: number("exp")?,
        };
        let signature = hex::decode(get("sig")?).map_err(|_| UploadRefusal::BadSignature)?;
        grant
            .mac(key)
            .verify_slice(&signature)
            .map_err(|_| UploadRefusal::BadSignature)?;
        if parse_id(&grant.blob_id).is_none() {
            return Err(UploadRefusal::Malformed("bad blob id".into()));
        }
        if now_ms > grant.expires_at_ms {
            return Err(UploadRefusal::Expired);
        }
        match content_length {
            Some(bytes) if bytes <= grant.max_bytes => Ok(grant),
            bytes => Err(UploadRefusal::TooLarge {
                bytes: bytes.unwrap_or(u64::MAX),
                max: grant.max_bytes,
            }),
        }
    }
}

/// Where a runner `PUT`s a blob: an absolute `url` (a presigned S3 URL) as it is; a relative
/// one against the server the runner connected to (`http`/`https`, or `ws`/`wss` as
/// `http`/`https`).
pub fn resolve_upload_url(server: &str, url: &str) -> String {
    if url.starts_with("https://") || url.starts_with("http://") {
        return url.to_string();
    }
    let server = server.trim().trim_end_matches('/');
    let server = if let Some(rest) = server.strip_prefix("wss://") {
        format!("https://{rest}")
    } else if let Some(rest) = server.strip_prefix("ws://") {
        format!("http://{rest}")
    } else {
        server.to_string()
    };
    format!("{server}{url}")
}

/// The `content` note of a `bash` result whose full output went to a blob, in place of the
/// runner's log path: `Full output: <path>` becomes the blob's URI and how to page it.
pub fn replace_output_path(content: &str, path: &str, blob: &BlobRef) -> String {
    let note = format!(
        "Full output: {} ({} bytes); page it with read {{\"path\":\"{}\",\"offset\":1,\"limit\":2000}}",
        blob.uri, blob.size, blob.uri
    );
    let old = format!("Full output: {path}");
    if content.contains(&old) {
        content.replacen(&old, &note, 1)
    } else {
        format!("{content}\n[{note}]")
    }
}

/// Checks what a runner says it uploaded against what the session granted for the call and
/// what storage holds: the blob must be the granted one, exist, and be within the limit.
/// Returns the reference the transcript keeps (size and media type as stored; the preview
/// bounded to [`PREVIEW_BYTES`]).
///
/// # Errors
/// A message for the tool result: the reference is dropped and the output's tail stays.
pub fn accept_upload(
    claimed: &BlobRef,
    granted_id: &str,
    stored: Option<(u64, &str)>,
) -> Result<BlobRef, String> {
    let id = claimed.uri.strip_prefix(URI_PREFIX).unwrap_or_default();
    if id != granted_id {
        return Err(format!(
            "the runner named {}, not the granted blob",
            claimed.uri
        ));
    }
    let Some((size, media_type)) = stored else {
        return Err(format!("{} was not uploaded", claimed.uri));
    };
    if size > MAX_BLOB_BYTES {
        return Err(format!(
            "{} has {size} bytes, over the {MAX_BLOB_BYTES} byte limit",
            claimed.uri
        ));
    }
    let media_type = normalize_media_type(media_type);
    Ok(BlobRef {
        uri: claimed.uri.clone(),
        size,
        media_type: media_type.to_string(),
        // A preview is text; the pixel size is read from the stored bytes ([`accept_image`]).
        preview: (!is_image(media_type))
            .then(|| claimed.preview.as_deref().map(preview))
            .flatten(),
        width: None,
        height: None,
    })
}

/// Checks an accepted blob stored with an image media type against the head of its stored
/// bytes (`head`: at most [`crate::images::HEADER_BYTES`]): the magic bytes must say the same
/// media type and the size must be within [`crate::images::MAX_IMAGE_BYTES`]; the width and
/// height are what the stored header says, never what the runner claimed. Other blobs pass
/// unchanged.
///
/// # Errors
/// A message for the tool result: the reference is dropped.
pub fn accept_image(blob: BlobRef, head: &[u8]) -> Result<BlobRef, String> {
    if !is_image(&blob.media_type) {
        return Ok(blob);
    }
    let Some(info) = crate::images::inspect(head).filter(|i| i.media_type == blob.media_type)
    else {
        return Err(format!(
            "{} is stored as {} but its bytes are not one",
            blob.uri, blob.media_type
        ));
    };
    if blob.size > crate::images::MAX_IMAGE_BYTES {
        return Err(format!(
            "{} has {} bytes, over the {} byte limit for images",
            blob.uri,
            blob.size,
            crate::images::MAX_IMAGE_BYTES
        ));
    }
    Ok(BlobRef {
        width: info.width,
        height: info.height,
        preview: None,
        ..blob
    })
}

/// What `read {"path": "wuhu://blob/<id>"}` gives.
#[derive(Clone, Debug, PartialEq)]
pub enum BlobRead {
    /// Text, paged by lines like a file.
    Text,
    /// An image, attached to the result as this reference (media type and pixel size from its
    /// stored bytes), as `read` of an image file on a runner attaches it.
    Image(BlobRef),
}

/// Decides what a `read` of blob `uri` gives from the stored object: its media type, its size
/// and its first bytes (at least [`crate::images::HEADER_BYTES`] of them, or all of a shorter
/// blob). The bytes decide: a blob whose bytes are an image is an image whatever its stored
/// type says; one stored as an image whose bytes are not one is refused, as is text over
/// [`MAX_READ_BYTES`].
///
/// # Errors
/// The tool error: an image over [`crate::images::MAX_IMAGE_BYTES`], or no text to page.
pub fn read_kind(
    uri: &str,
    stored_media_type: &str,
    size: u64,
    head: &[u8],
) -> Result<BlobRead, String> {
    if let Some(info) = crate::images::inspect(head) {
        if let Some(why) = crate::images::refusal(uri, &info, size) {
            return Err(why);
        }
        return Ok(BlobRead::Image(BlobRef {
            uri: uri.to_string(),
            size,
            media_type: info.media_type.to_string(),
            preview: None,
            width: info.width,
            height: info.height,
        }));
    }
    if is_image(stored_media_type) || size > MAX_READ_BYTES {
        return Err(format!(
            "{uri} is {} ({size} bytes): not text to page",
            normalize_media_type(stored_media_type)
        ));
    }
    Ok(BlobRead::Text)
}

#[cfg(test)]
mod tests;
