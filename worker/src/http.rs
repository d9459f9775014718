//! JSON responses, API errors and bounded body reading.

use std::borrow::Cow;

use serde::Serialize;
use serde::de::DeserializeOwned;
use worker::{Headers, Request, Response};
use wuhu_core::wire::ErrorBody;

/// Largest request body accepted.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

/// An API error: becomes `{"error":{"code","message"}}` with `status`.
///
/// `code` is owned when it came from another Durable Object's reply (see `internal::reply_bytes`),
/// so a `runner_disconnected` from the hub stays `runner_disconnected` in the session.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) code: Cow<'static, str>,
    pub(crate) message: String,
    /// Seconds after which to try again (`Retry-After`), for `429`s.
    pub(crate) retry_after: Option<u32>,
}

impl ApiError {
    pub(crate) fn new(
        status: u16,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error, telling the caller to try again after `seconds` (`Retry-After`).
    pub(crate) fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "bad_request", message)
    }
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found", message)
    }
    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, "unauthorized", message)
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "internal", message)
    }

    pub(crate) fn into_response(self) -> Response {
        let response = json_response(self.status, &ErrorBody::new(&self.code, self.message));
        match self.retry_after {
            Some(seconds) => {
                let _ = response.headers().set("retry-after", &seconds.to_string());
                response
            }
            None => response,
        }
    }
}

impl From<worker::Error> for ApiError {
    fn from(error: worker::Error) -> Self {
        ApiError::internal(format!("internal error: {error}"))
    }
}

/// Result type of handlers.
pub(crate) type ApiResult<T> = std::result::Result<T, ApiError>;

/// A JSON response. Never fails: a serialisation problem becomes a 500 body.
pub(crate) fn json_response<T: Serialize>(status: u16, value: &T) -> Response {
    let body = serde_json::to_string(value).unwrap_or_else(|_| {
        r#"{"error":{"code":"internal","message":"response serialisation failed"}}"#.to_string()
    });
    let headers = Headers::new();
    let _ = headers.set("content-type", "application/json");
    Response::builder()
        .with_status(status)
        .with_headers(headers)
        .fixed(body.into_bytes())
}

/// Reads the whole body, refusing more than [`MAX_BODY_BYTES`] with 413: at once when
/// `Content-Length` says so, otherwise while streaming (a chunked body is never buffered past
/// the limit).
pub(crate) async fn read_body(req: &mut Request) -> ApiResult<Vec<u8>> {
    read_body_bounded(req, MAX_BODY_BYTES).await
}

/// [`read_body`] with another bound (calls between actors: `internal::MAX_CALL_BYTES`).
pub(crate) async fn read_body_bounded(req: &mut Request, max: usize) -> ApiResult<Vec<u8>> {
    if let Ok(Some(length)) = req.headers().get("content-length")
        && length.trim().parse::<usize>().is_ok_and(|n| n > max)
    {
        return Err(too_large(max));
    }
    let mut stream = match req.stream() {
        Ok(stream) => stream,
        Err(worker::Error::BodyUsed) => {
            return Err(ApiError::internal("the request body was read twice"));
        }
        // No body at all (a GET, or a POST without one) reads as empty.
        Err(_) => return Ok(Vec::new()),
    };
    let mut body = Vec::new();
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let chunk = chunk.map_err(|_| ApiError::bad_request("could not read the request body"))?;
        if body.len() + chunk.len() > max {
            return Err(too_large(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(
        413,
        "payload_too_large",
        format!("request body exceeds {max} bytes"),
    )
}

/// Decodes JSON bytes with a 400 that says what is wrong.
/// Refuses (426 `upgrade_required`) a request that is not a WebSocket upgrade: the runner's
/// `/connect` and the session socket, at the router and again in the Durable Object.
pub(crate) fn require_websocket_upgrade(req: &Request) -> ApiResult<()> {
    let upgrade = req.headers().get("upgrade").ok().flatten();
    if upgrade.is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
        return Ok(());
    }
    Err(ApiError::new(
        426,
        "upgrade_required",
        "connect with a WebSocket upgrade",
    ))
}

pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid json body: {e}")))
}

/// Query parameters as pairs (decoded).
pub(crate) fn query_pairs(req: &Request) -> Vec<(String, String)> {
    req.url()
        .map(|url| {
            url.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// One query parameter.
pub(crate) fn query(pairs: &[(String, String)], name: &str) -> Option<String> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// A numeric query parameter; a present but malformed value is 400.
pub(crate) fn query_u64(pairs: &[(String, String)], name: &str) -> ApiResult<Option<u64>> {
    match query(pairs, name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "query parameter {name} must be a non-negative integer"
            ))
        }),
    }
}
