//! The harness's HTTP client: one `reqwest` client on one small tokio runtime, shared by every
//! test thread. Tests stay synchronous: [`crate::http::Request::send`] and
//! [`crate::sse::SseStream`] block on this runtime, so test code and the `Stack` API do not change.
//!
//! The client keeps no idle connections (`pool_max_idle_per_host(0)`): every request opens its
//! own connection, as the hand-written client did with `Connection: close`, so a test that kills
//! and restarts `wrangler dev` never sends on a connection the old process owned. It ignores
//! proxy variables (everything the harness talks to is on loopback) and stores no cookies
//! (cookie tests send `Cookie` themselves).

use std::future::Future;
use std::io;
use std::sync::OnceLock;
use std::time::Duration;

/// Worker threads of the shared runtime: they only drive sockets; the 2-core CI box is busy
/// enough with wrangler and the runners.
const RUNTIME_THREADS: usize = 2;

/// The shared runtime.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("e2e-http")
            .enable_all()
            .build()
            .expect("start the harness's tokio runtime")
    })
}

/// The shared client.
pub fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // Built inside the runtime: reqwest's connector needs its reactor.
        runtime().block_on(async {
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("build the harness's reqwest client")
        })
    })
}

/// Runs `future` to completion on the shared runtime, from a test thread.
pub fn block_on<F: Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// Runs `future` with a time limit: `TimedOut` when it is exceeded.
pub fn block_on_within<F: Future>(limit: Duration, future: F) -> io::Result<F::Output> {
    block_on(async { tokio::time::timeout(limit, future).await })
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
}

/// A reqwest error as an `io::Error` with a kind tests can match: `TimedOut`, `ConnectionRefused`
/// (nothing listens), `UnexpectedEof` (the body was cut short), else `Other`. The message keeps
/// the whole source chain.
pub fn io_error(error: reqwest::Error) -> io::Error {
    let kind = if error.is_timeout() {
        io::ErrorKind::TimedOut
    } else if error.is_connect() {
        io::ErrorKind::ConnectionRefused
    } else if error.is_body() || error.is_decode() {
        io::ErrorKind::UnexpectedEof
    } else {
        io::ErrorKind::Other
    };
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    io::Error::new(kind, message)
}

/// Headers as the harness keeps them (responses, and the requests the fakes record): lowercase
/// names, each name's values together, lossy UTF-8 values.
pub fn headers_of(map: &reqwest::header::HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}
