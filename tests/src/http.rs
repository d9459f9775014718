//! Requests and responses as tests write them: [`Request`] (a builder sent on the shared
//! `reqwest` client of [`crate::net`]) and [`Response`] (status, headers in order, the whole
//! body, with assertions such as [`Response::expect_error`]).

use std::io;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use wuhu_core::wire::ErrorDetail;

use crate::net;

/// The default time a whole request may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// An outgoing request.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Absolute `http://host:port/path?query` URL.
    pub url: String,
    /// Extra headers (Host, Connection and Content-Length are added).
    pub headers: Vec<(String, String)>,
    /// The body, sent with a `Content-Length`.
    pub body: Option<Vec<u8>>,
    /// Deadline for the whole exchange.
    pub timeout: Duration,
}

impl Request {
    /// A request without body or extra headers.
    pub fn new(method: &str, url: impl Into<String>) -> Request {
        Request {
            method: method.to_string(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Request {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Adds `Authorization: Bearer <token>`.
    pub fn bearer(self, token: &str) -> Request {
        self.header("Authorization", format!("Bearer {token}"))
    }

    /// Sets a raw body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = Some(body.into());
        self
    }

    /// Sets a JSON body and its content type.
    pub fn json(self, value: &Value) -> Request {
        self.header("Content-Type", "application/json")
            .body(serde_json::to_vec(value).expect("serialize json"))
    }

    /// Sets the deadline.
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = timeout;
        self
    }

    /// Sends the request and reads the whole response (on the shared `reqwest` client, see
    /// [`crate::net`]). A `POST`, `PUT` or `PATCH` without a body is sent with
    /// `Content-Length: 0`.
    ///
    /// # Errors
    /// Connection, timeout and protocol errors, as [`crate::net::io_error`] classifies them; an
    /// invalid method or header is `InvalidInput`.
    pub fn send(&self) -> io::Result<Response> {
        // `wrangler dev`'s own proxy hop sometimes answers a POST 503 "Your worker restarted
        // mid-request" without the Worker having restarted or seen the request (no request
        // line in its log; cloudflare/workers-sdk#14641, retried by wrangler itself for GET and
        // HEAD only). Sent again, once or twice, as wrangler does for the others.
        let mut response = self.send_once()?;
        for _ in 0..2 {
            if response.status != 503 || !response.text().contains(DEV_PROXY_RESTART) {
                break;
            }
            response = self.send_once()?;
        }
        Ok(response)
    }

    fn send_once(&self) -> io::Result<Response> {
        let request = self.build()?;
        net::block_on(async {
            let response = net::client()
                .execute(request)
                .await
                .map_err(net::io_error)?;
            let status = response.status().as_u16();
            let headers = net::headers_of(response.headers());
            let body = response.bytes().await.map_err(net::io_error)?;
            Ok(Response {
                status,
                headers,
                body: body.to_vec(),
            })
        })
    }

    /// The `reqwest` request: method, URL, headers in order, body and the deadline.
    pub(crate) fn build(&self) -> io::Result<reqwest::Request> {
        let method = reqwest::Method::from_bytes(self.method.as_bytes())
            .map_err(|e| invalid_input(format!("method {:?}: {e}", self.method)))?;
        let mut builder = net::client()
            .request(method, &self.url)
            .timeout(self.timeout);
        for (name, value) in &self.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        match &self.body {
            Some(body) => builder = builder.body(body.clone()),
            None if matches!(self.method.as_str(), "POST" | "PUT" | "PATCH") => {
                builder = builder.header("Content-Length", "0");
            }
            None => {}
        }
        builder
            .build()
            .map_err(|e| invalid_input(format!("{} {}: {e}", self.method, self.url)))
    }
}

/// The body of `wrangler dev`'s spurious 503 (see [`Request::send`]).
const DEV_PROXY_RESTART: &str = "Your worker restarted mid-request";

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers as reqwest parsed them: names lowercase, each name's values together.
    pub headers: Vec<(String, String)>,
    /// Decoded body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, if it is JSON.
    pub fn try_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        self.try_json()
            .unwrap_or_else(|| panic!("expected a JSON body, got {self}"))
    }

    /// The body deserialized; panics with the body when it does not fit.
    pub fn parse<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!(
                "cannot decode {} from the response ({err}): {self}",
                std::any::type_name::<T>()
            )
        })
    }

    /// Panics unless the status is `status`.
    #[track_caller]
    pub fn expect_status(&self, status: u16) -> &Response {
        assert_eq!(self.status, status, "unexpected status: {self}");
        self
    }

    /// Panics unless the status is `status` and the body is exactly
    /// `{"error":{"code": <non-empty string>, "message": <non-empty string>}}`, served as JSON.
    /// Returns the error.
    #[track_caller]
    pub fn expect_error(&self, status: u16) -> ErrorDetail {
        assert_eq!(self.status, status, "unexpected status: {self}");
        let content_type = self.header("content-type").unwrap_or("");
        assert!(
            content_type.starts_with("application/json"),
            "error content-type {content_type:?}: {self}"
        );
        let value = self
            .try_json()
            .unwrap_or_else(|| panic!("error body is not JSON: {self}"));
        let object = value
            .as_object()
            .unwrap_or_else(|| panic!("error body is not an object: {self}"));
        assert_eq!(object.len(), 1, "error body must have only `error`: {self}");
        let error = object
            .get("error")
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("error body has no `error` object: {self}"));
        assert_eq!(
            error.len(),
            2,
            "`error` must have exactly code and message: {self}"
        );
        let code = error
            .get("code")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert!(!code.is_empty(), "error code missing or empty: {self}");
        assert!(
            !message.is_empty(),
            "error message missing or empty: {self}"
        );
        ErrorDetail {
            code: code.to_string(),
            message: message.to_string(),
        }
    }
}

impl std::fmt::Display for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.text();
        let shown: String = text.chars().take(2000).collect();
        write!(f, "HTTP {} {}", self.status, shown)?;
        if shown.len() < text.len() {
            write!(f, "… ({} bytes)", self.body.len())?;
        }
        Ok(())
    }
}

/// The first header with this name (case-insensitive).
pub fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}
