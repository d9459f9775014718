//! Requests and responses as tests write them: [`Request`] (a builder sent on the shared
//! `reqwest` client of [`crate::net`]) and [`Response`] (status, headers in order, the whole
//! body, with assertions such as [`Response::expect_error`]).
//!
//! The socket-level pieces ([`read_head`], [`BodyDecoder`]) remain for the fake servers, which
//! still serve from `std::net` sockets.

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;
use wuhu_core::wire::ErrorDetail;

use crate::net;

/// The default time a whole request may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

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

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers in order; names as sent.
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

/// A parsed `http://host:port/path` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `host:port`.
    pub host_port: String,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses a plain-HTTP URL.
    ///
    /// # Errors
    /// `InvalidInput` for anything but `http://`.
    pub fn parse(url: &str) -> io::Result<Url> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not an http:// url: {url}"),
            )
        })?;
        let (host_port, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let host_port = if host_port.contains(':') {
            host_port.to_string()
        } else {
            format!("{host_port}:80")
        };
        Ok(Url {
            host_port,
            path: path.to_string(),
        })
    }
}

/// Status line and headers of a response (or request line and headers of a request).
#[derive(Clone, Debug)]
pub struct Head {
    /// Status code (0 for requests).
    pub status: u16,
    /// The first line, e.g. `POST /v1/chat/completions HTTP/1.1`.
    pub start_line: String,
    /// Headers in order.
    pub headers: Vec<(String, String)>,
}

/// Reads up to the blank line that ends a head. Bytes after it stay in `raw`.
///
/// # Errors
/// Timeout, EOF before the head, or an oversized or garbled head.
pub fn read_head(stream: &mut TcpStream, raw: &mut Vec<u8>, deadline: Instant) -> io::Result<Head> {
    loop {
        if let Some(end) = find(raw, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).into_owned();
            raw.drain(..end + 4);
            return parse_head(&head);
        }
        if raw.len() > MAX_HEAD {
            return Err(invalid("head too large"));
        }
        if read_some(stream, raw, deadline)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before the head",
            ));
        }
    }
}

fn parse_head(text: &str) -> io::Result<Head> {
    let mut lines = text.split("\r\n");
    let start_line = lines.next().unwrap_or_default().to_string();
    let status = if start_line.starts_with("HTTP/") {
        start_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid(&format!("bad status line {start_line:?}")))?
    } else {
        0
    };
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid(&format!("bad header line {line:?}")))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(Head {
        status,
        start_line,
        headers,
    })
}

/// The first header with this name (case-insensitive).
pub fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Incremental body decoding: bytes go in as they arrive, decoded bytes come out.
#[derive(Clone, Debug)]
pub enum BodyDecoder {
    /// `Content-Length`: bytes still expected.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked(ChunkedDecoder),
    /// Neither: the body ends when the connection closes.
    UntilEof,
}

impl BodyDecoder {
    /// The decoder a response needs.
    ///
    /// # Errors
    /// A `Content-Length` that is not a number.
    pub fn for_response(
        method: &str,
        status: u16,
        headers: &[(String, String)],
    ) -> io::Result<BodyDecoder> {
        if method == "HEAD" || status == 204 || status == 304 || (100..200).contains(&status) {
            return Ok(BodyDecoder::Length(0));
        }
        Self::for_message(headers, true)
    }

    /// The decoder a request needs (no length means no body).
    ///
    /// # Errors
    /// A `Content-Length` that is not a number.
    pub fn for_request(headers: &[(String, String)]) -> io::Result<BodyDecoder> {
        Self::for_message(headers, false)
    }

    fn for_message(headers: &[(String, String)], eof_allowed: bool) -> io::Result<BodyDecoder> {
        if find_header(headers, "transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
        {
            return Ok(BodyDecoder::Chunked(ChunkedDecoder::default()));
        }
        match find_header(headers, "content-length") {
            Some(len) => len
                .parse()
                .map(BodyDecoder::Length)
                .map_err(|_| invalid("bad content-length")),
            None if eof_allowed => Ok(BodyDecoder::UntilEof),
            None => Ok(BodyDecoder::Length(0)),
        }
    }

    /// Moves what can be decoded from `input` to `out`.
    ///
    /// # Errors
    /// Garbled chunk framing.
    pub fn decode(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> io::Result<()> {
        match self {
            BodyDecoder::Length(left) => {
                let n = (*left).min(input.len() as u64) as usize;
                out.extend(input.drain(..n));
                *left -= n as u64;
                Ok(())
            }
            BodyDecoder::Chunked(chunked) => chunked.decode(input, out),
            BodyDecoder::UntilEof => {
                out.append(input);
                Ok(())
            }
        }
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        match self {
            BodyDecoder::Length(left) => *left == 0,
            BodyDecoder::Chunked(chunked) => chunked.done,
            BodyDecoder::UntilEof => false,
        }
    }

    /// Whether EOF is the normal end of this body.
    pub fn ends_at_eof(&self) -> bool {
        matches!(self, BodyDecoder::UntilEof)
    }
}

/// Decoder state of the chunked transfer coding.
#[derive(Clone, Debug, Default)]
pub struct ChunkedDecoder {
    state: ChunkState,
    done: bool,
}

#[derive(Clone, Debug, Default)]
enum ChunkState {
    #[default]
    Size,
    Data(usize),
    DataEnd,
    Trailer,
}

impl ChunkedDecoder {
    /// Moves what can be decoded from `input` to `out`.
    ///
    /// # Errors
    /// Garbled framing.
    pub fn decode(&mut self, input: &mut Vec<u8>, out: &mut Vec<u8>) -> io::Result<()> {
        while !self.done {
            match self.state {
                ChunkState::Size => {
                    let Some(end) = find(input, b"\r\n") else {
                        return Ok(());
                    };
                    let line = String::from_utf8_lossy(&input[..end]).into_owned();
                    input.drain(..end + 2);
                    let hex = line.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(hex, 16)
                        .map_err(|_| invalid(&format!("bad chunk size {line:?}")))?;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if input.is_empty() {
                        return Ok(());
                    }
                    let n = left.min(input.len());
                    out.extend(input.drain(..n));
                    self.state = if n == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n)
                    };
                }
                ChunkState::DataEnd => {
                    if input.len() < 2 {
                        return Ok(());
                    }
                    if &input[..2] != b"\r\n" {
                        return Err(invalid("chunk not followed by CRLF"));
                    }
                    input.drain(..2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer => {
                    let Some(end) = find(input, b"\r\n") else {
                        return Ok(());
                    };
                    input.drain(..end + 2);
                    if end == 0 {
                        self.done = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the terminating chunk and trailer were read.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

/// Connects to `host:port` before `deadline`.
///
/// # Errors
/// Resolution, connection or timeout errors.
pub fn connect(host_port: &str, deadline: Instant) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("cannot resolve {host_port}"),
    );
    for addr in host_port.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, remaining(deadline)?) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(err) => last = err,
        }
    }
    Err(last)
}

/// One `read` into `raw` bounded by `deadline`. Returns the byte count (0 at EOF).
///
/// # Errors
/// `TimedOut` past the deadline; other I/O errors.
pub fn read_some(
    stream: &mut TcpStream,
    raw: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<usize> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match stream.read(&mut buf) {
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                return Ok(n);
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "read deadline passed",
                ));
            }
            Err(err) => return Err(err),
        }
    }
}

/// Time left before `deadline`, never zero (a zero timeout means "forever" to std).
///
/// # Errors
/// `TimedOut` when the deadline has passed.
pub fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    } else {
        Ok(left.max(Duration::from_millis(1)))
    }
}

/// Position of `needle` in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_decoding_survives_any_split() {
        let wire = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n";
        for split in 0..wire.len() {
            let mut decoder = ChunkedDecoder::default();
            let mut input = wire[..split].to_vec();
            let mut out = Vec::new();
            decoder.decode(&mut input, &mut out).unwrap();
            input.extend_from_slice(&wire[split..]);
            decoder.decode(&mut input, &mut out).unwrap();
            assert!(decoder.is_done(), "split {split}");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "Wikipedia in\r\n\r\nchunks.",
                "split {split}"
            );
            assert!(input.is_empty());
        }
    }

    #[test]
    fn urls_parse() {
        let url = Url::parse("http://127.0.0.1:8787/v1/sessions?limit=2").unwrap();
        assert_eq!(
            url,
            Url {
                host_port: "127.0.0.1:8787".into(),
                path: "/v1/sessions?limit=2".into()
            }
        );
        assert_eq!(Url::parse("http://localhost").unwrap().path, "/");
        assert!(Url::parse("https://example.com/").is_err());
    }

    #[test]
    fn heads_parse() {
        let head =
            parse_head("HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nX-A:  b ")
                .unwrap();
        assert_eq!(head.status, 404);
        assert_eq!(
            find_header(&head.headers, "content-type"),
            Some("application/json")
        );
        assert_eq!(find_header(&head.headers, "x-a"), Some("b"));
    }
}
