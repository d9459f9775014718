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
//! [`DelayProxy::losing_answers`] is the same proxy that, instead of holding requests, loses
//! the answers of the first few matching requests: it forwards the request and waits for the
//! server's whole answer, then closes the client's connection without a response (a reply lost
//! on its way back: the server acted, the client cannot know).
//!
//! Dropping it stops accepting and closes its connections.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Answers lost so far ([`DelayProxy::losing_answers`]).
    lost: Arc<AtomicUsize>,
    _stop: watch::Sender<()>,
}

/// What the proxy does to a matching request.
#[derive(Clone, Copy)]
enum Action {
    /// Forwards it after this long.
    Delay(Duration),
    /// Loses the answer of the first this many.
    LoseAnswers(usize),
}

impl DelayProxy {
    /// Forwards `127.0.0.1:<ephemeral>` to `upstream` (a base URL), holding each request whose
    /// path contains `matching` for `delay`.
    pub fn start(upstream: &str, matching: &str, delay: Duration) -> DelayProxy {
        DelayProxy::start_with(upstream, matching, Action::Delay(delay))
    }

    /// Forwards `127.0.0.1:<ephemeral>` to `upstream`, losing the answers of the first `count`
    /// requests whose path contains `matching` (see the module docs).
    pub fn losing_answers(upstream: &str, matching: &str, count: usize) -> DelayProxy {
        DelayProxy::start_with(upstream, matching, Action::LoseAnswers(count))
    }

    fn start_with(upstream: &str, matching: &str, action: Action) -> DelayProxy {
        let upstream = upstream.trim_end_matches('/').to_string();
        let matching = matching.to_string();
        let client = reqwest::Client::new();
        let lost = Arc::new(AtomicUsize::new(0));
        let counter = lost.clone();
        let (addr, stop) = listen("delay proxy", move |request| {
            forward(
                client.clone(),
                upstream.clone(),
                matching.clone(),
                action,
                counter.clone(),
                request,
            )
        });
        DelayProxy {
            addr,
            lost,
            _stop: stop,
        }
    }

    /// How many answers [`DelayProxy::losing_answers`] has lost.
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }

    /// The proxy's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Answers a request, or fails, which makes hyper close the connection without an answer.
async fn forward(
    client: reqwest::Client,
    upstream: String,
    matching: String,
    action: Action,
    lost: Arc<AtomicUsize>,
    request: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (head, body) = request.into_parts();
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let matches = head.uri.path().contains(&matching);
    if let (true, Action::Delay(delay)) = (matches, action) {
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
    if let (true, Action::LoseAnswers(count)) = (matches, action)
        && lost
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < count).then_some(n + 1)
            })
            .is_ok()
    {
        // The server's answer is read whole first: it has acted when the client loses it.
        let _ = upstream_response.bytes().await;
        return Err(io::Error::other("delay proxy: this answer is lost"));
    }
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
