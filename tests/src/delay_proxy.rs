//! An HTTP reverse proxy in front of the stack that holds back some requests: each request whose
//! path contains a given text is forwarded only after a delay; every other request at once.
//! Responses stream through as they come (a follow stream stays a stream).
//!
//! It moves one request relative to the others without touching the client or the server: a
//! client whose follow stream connects only after the turn it started has ended, for example.
//!
//! ```text
//! let proxy = DelayProxy::start(&stack.base_url(), "/follow", Duration::from_millis(500));
//! // point the client at proxy.url() …
//! ```
//!
//! Dropping it stops accepting and closes its connections.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use tokio::sync::watch;

use crate::fake_server::{Body, full, listen};

/// See the module docs.
pub struct DelayProxy {
    addr: SocketAddr,
    _stop: watch::Sender<()>,
}

impl DelayProxy {
    /// Forwards `127.0.0.1:<ephemeral>` to `upstream` (a base URL), holding each request whose
    /// path contains `matching` for `delay`.
    pub fn start(upstream: &str, matching: &str, delay: Duration) -> DelayProxy {
        let upstream = upstream.trim_end_matches('/').to_string();
        let matching = matching.to_string();
        let client = reqwest::Client::new();
        let (addr, stop) = listen("delay proxy", move |request| {
            forward(
                client.clone(),
                upstream.clone(),
                matching.clone(),
                delay,
                request,
            )
        });
        DelayProxy { addr, _stop: stop }
    }

    /// The proxy's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn forward(
    client: reqwest::Client,
    upstream: String,
    matching: String,
    delay: Duration,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (head, body) = request.into_parts();
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    if head.uri.path().contains(&matching) {
        tokio::time::sleep(delay).await;
    }
    let Ok(body) = body.collect().await else {
        return Ok(full(400, &[], "the request body was cut"));
    };
    let mut headers = head.headers.clone();
    headers.remove(hyper::header::HOST);
    let sent = client
        .request(head.method.clone(), format!("{upstream}{path}"))
        .headers(headers)
        .body(body.to_bytes())
        .send()
        .await;
    let upstream_response = match sent {
        Ok(response) => response,
        Err(error) => return Ok(full(502, &[], format!("delay proxy: {error}"))),
    };
    let mut response = Response::builder().status(upstream_response.status());
    for (name, value) in upstream_response.headers() {
        if name != hyper::header::CONTENT_LENGTH && name != hyper::header::TRANSFER_ENCODING {
            response = response.header(name, value);
        }
    }
    let frames = upstream_response
        .bytes_stream()
        .map_ok(Frame::data)
        .map_err(io::Error::other);
    let body: Body = BodyExt::boxed_unsync(StreamBody::new(frames));
    Ok(response
        .body(body)
        .unwrap_or_else(|_| full(502, &[], Bytes::new())))
}
