//! The plumbing the fake servers share: hyper's HTTP/1 server (keep-alive, chunked bodies) on
//! an ephemeral loopback port, driven by the harness's tokio runtime ([`crate::net`]). Each
//! request is read whole into a [`RecordedRequest`] and handed to a synchronous handler, which
//! returns the response: a fixed body ([`full`]) or a stream of chunks ([`streamed`]) that may
//! pause between chunks and may end by cutting the connection ([`End::Cut`]), or no response at
//! all ([`no_answer`]: the connection is closed after the request was read).
//!
//! Dropping a [`FakeServer`] stops accepting and closes its open connections.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::watch;

use crate::fake_openai::RecordedRequest;
use crate::net;

/// Largest request body a fake reads (a whole LLM request with a long transcript fits many
/// times); a larger one is answered `413` and not recorded.
pub const MAX_REQUEST_BODY: usize = 64 * 1024 * 1024;

/// A response body: fixed or streamed.
pub type Body = UnsyncBoxBody<Bytes, io::Error>;

/// How a streamed body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The terminating chunk: a complete response.
    Complete,
    /// The connection is closed mid-body, after the chunks were sent (no terminating chunk).
    Cut,
}

/// A running server. Dropping it stops accepting and closes its connections.
pub struct FakeServer {
    addr: SocketAddr,
    /// Dropped with the server: the accept loop and every connection watch it close.
    _stop: watch::Sender<()>,
}

impl FakeServer {
    /// Starts on `127.0.0.1:0`. `handle` answers each request (read whole) with a response.
    pub fn start<F>(name: &str, handle: F) -> FakeServer
    where
        F: Fn(RecordedRequest) -> Response<Body> + Send + Sync + 'static,
    {
        let handle = Arc::new(handle);
        let (addr, stop) = listen(name, move |request| serve(handle.clone(), request));
        FakeServer { addr, _stop: stop }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Serves HTTP/1 (keep-alive) on `127.0.0.1:0` on the harness's runtime, `respond` answering
/// each request. Returns the address and the sender whose drop stops accepting and closes the
/// open connections.
pub fn listen<F, Fut, E>(name: &str, respond: F) -> (SocketAddr, watch::Sender<()>)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Body>, E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("bind the {name} server: {e}"));
    let addr = listener.local_addr().expect("server address");
    listener
        .set_nonblocking(true)
        .expect("server listener non-blocking");
    let listener = {
        let _runtime = net::runtime().enter();
        tokio::net::TcpListener::from_std(listener).expect("register the server")
    };
    let (stop, mut stopped) = watch::channel(());
    net::runtime().spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stopped.changed() => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            let _ = stream.set_nodelay(true);
            let respond = respond.clone();
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(respond));
                tokio::select! {
                    _ = connection => {}
                    _ = stopped.changed() => {}
                }
            });
        }
    });
    (addr, stop)
}

/// Reads one request whole and asks the handler for the response.
async fn serve<F>(handle: Arc<F>, request: Request<Incoming>) -> Result<Response<Body>, io::Error>
where
    F: Fn(RecordedRequest) -> Response<Body>,
{
    let (head, body) = request.into_parts();
    let Ok(body) = Limited::new(body, MAX_REQUEST_BODY).collect().await else {
        return Ok(full(413, &[], "request body too large or cut"));
    };
    let received_at = std::time::Instant::now();
    let raw_body = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    let recorded = RecordedRequest {
        method: head.method.to_string(),
        path: head
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string(),
        headers: net::headers_of(&head.headers),
        body: serde_json::from_str(&raw_body).unwrap_or(Value::Null),
        raw_body,
        received_at,
    };
    let response = handle(recorded);
    if response.extensions().get::<NoAnswer>().is_some() {
        // An error from the service makes hyper abort the connection without a response.
        return Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "fake server: request taken, answer dropped",
        ));
    }
    Ok(response)
}

/// Marks a [`no_answer`] response.
#[derive(Clone, Copy, Debug)]
struct NoAnswer;

/// Not a response: the request was read (and recorded), then the connection is closed without
/// an answer, as when a response is lost on its way back.
pub fn no_answer() -> Response<Body> {
    let mut response = full(200, &[], Bytes::new());
    response.extensions_mut().insert(NoAnswer);
    response
}

/// A response with a fixed body and these headers (`Content-Length` is hyper's).
pub fn full(status: u16, headers: &[(String, String)], body: impl Into<Bytes>) -> Response<Body> {
    let body = Full::new(body.into())
        .map_err(|never| match never {})
        .boxed_unsync();
    with_head(status, headers, body)
}

/// A chunked response sending `chunks` in order, each after `delay`, then ending as `end`
/// says.
pub fn streamed(
    status: u16,
    headers: &[(String, String)],
    chunks: Vec<Bytes>,
    delay: Duration,
    end: End,
) -> Response<Body> {
    streamed_gated(status, headers, chunks, delay, end, None)
}

/// Lets a test decide when each chunk of a streamed body after the first goes out: the body
/// waits for one permit per chunk ([`Gate::open`]). A test that ends without opening it leaves
/// the body waiting until its stack stops.
#[derive(Clone, Debug)]
pub struct Gate(Arc<tokio::sync::Semaphore>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate(Arc::new(tokio::sync::Semaphore::new(0)))
    }

    /// Lets `chunks` more chunks out.
    pub fn open(&self, chunks: usize) {
        self.0.add_permits(chunks);
    }
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Gate) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// [`streamed`], each chunk after the first held by `gate` when there is one.
pub fn streamed_gated(
    status: u16,
    headers: &[(String, String)],
    chunks: Vec<Bytes>,
    delay: Duration,
    end: End,
    gate: Option<Gate>,
) -> Response<Body> {
    let state = (chunks.into_iter().enumerate(), Some(end));
    let frames = futures_util::stream::unfold(state, move |(mut chunks, end)| {
        let gate = gate.clone();
        async move {
            if let Some((index, chunk)) = chunks.next() {
                if let Some(gate) = gate.filter(|_| index > 0)
                    && let Ok(permit) = gate.0.acquire().await
                {
                    permit.forget();
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                return Some((Ok(Frame::data(chunk)), (chunks, end)));
            }
            if end != Some(End::Cut) {
                return None;
            }
            // hyper drops the connection, and what it has not written yet, at a body error:
            // pause once so that it flushes the chunks before.
            tokio::task::yield_now().await;
            let cut = io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "fake server: cut mid-body",
            );
            Some((Err(cut), (chunks, None)))
        }
    });
    with_head(status, headers, StreamBody::new(frames).boxed_unsync())
}

fn with_head(status: u16, headers: &[(String, String)], body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(status).expect("a status code in 100..=999");
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid header name");
        let value = HeaderValue::from_str(value).expect("a valid header value");
        response.headers_mut().append(name, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Request;

    fn text(chunks: &[&str]) -> Vec<Bytes> {
        chunks.iter().map(|c| Bytes::from(c.to_string())).collect()
    }

    #[test]
    fn requests_are_recorded_whole_and_streams_end_or_cut() {
        let server = FakeServer::start("test", |request| match request.path.as_str() {
            "/cut" => streamed(200, &[], text(&["a", "b"]), Duration::ZERO, End::Cut),
            "/lost" => no_answer(),
            "/slow" => streamed(
                200,
                &[],
                text(&["a", "b", "c"]),
                Duration::from_millis(20),
                End::Complete,
            ),
            _ => full(
                201,
                &[("X-Echo".into(), request.raw_body.clone())],
                request.body.to_string(),
            ),
        });
        let url = |path: &str| format!("http://{}{path}", server.addr());
        let response = Request::new("POST", url("/echo?q=1"))
            .header("X-Test", "yes")
            .body(r#"{"a":1}"#)
            .send()
            .unwrap();
        assert_eq!(
            (response.status, response.header("x-echo"), response.text()),
            (201, Some(r#"{"a":1}"#), r#"{"a":1}"#.to_string())
        );
        assert_eq!(
            Request::new("GET", url("/slow")).send().unwrap().text(),
            "abc"
        );
        // The request is read whole, then the connection closes with no status line.
        let lost = Request::new("POST", url("/lost")).body("taken").send();
        assert!(lost.is_err(), "{lost:?}");
        let err = Request::new("GET", url("/cut")).send().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        // The chunks before a cut arrive: read the body as it comes.
        let response = crate::net::block_on(async {
            crate::net::client().get(url("/cut")).send().await.unwrap()
        });
        let mut response = response;
        let mut received = Vec::new();
        let end = loop {
            match crate::net::block_on(response.chunk()) {
                Ok(Some(chunk)) => received.extend_from_slice(&chunk),
                Ok(None) => break Ok(()),
                Err(err) => break Err(err),
            }
        };
        assert!(end.is_err(), "a cut body must not end cleanly");
        assert_eq!(received, b"ab");
        drop(server);
    }
}
