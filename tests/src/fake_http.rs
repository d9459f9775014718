//! A small local HTTP server for what sandboxed scripts `fetch`: fixed replies per path,
//! every request recorded (also the ones no route answers), so a test can show both what a
//! script fetched and that a refused request never arrived.
//!
//! ```text
//! let api = FakeHttp::start();
//! api.route("/items", HttpReply::json(&json!({"items": [1, 2, 3]})));
//! // a script fetches api.url("/items?page=1") …
//! assert_eq!(api.requests_to("/items").len(), 1);
//! ```
//!
//! Unrouted paths answer `404 {"error":"no route for GET /x"}`. Connections are kept alive
//! unless the client says `Connection: close`.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fake_openai::RecordedRequest;
use crate::http::{self, BodyDecoder};

/// Time a connection may sit idle between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// A fixed answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// Headers besides `Content-Length`.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl HttpReply {
    /// `200` with a JSON body.
    pub fn json(value: &Value) -> HttpReply {
        HttpReply {
            status: 200,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: serde_json::to_vec(value).expect("serialize json"),
        }
    }

    /// A plain-text body with this status.
    pub fn text(status: u16, body: impl Into<String>) -> HttpReply {
        HttpReply {
            status,
            headers: vec![("Content-Type".into(), "text/plain; charset=utf-8".into())],
            body: body.into().into_bytes(),
        }
    }

    /// Replaces the status.
    pub fn with_status(mut self, status: u16) -> HttpReply {
        self.status = status;
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> HttpReply {
        self.headers.push((name.to_string(), value.into()));
        self
    }
}

#[derive(Default)]
struct State {
    routes: HashMap<String, HttpReply>,
    requests: Vec<RecordedRequest>,
}

/// The server. Dropping it stops accepting connections.
pub struct FakeHttp {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    shutdown: Arc<AtomicBool>,
}

impl FakeHttp {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub fn start() -> FakeHttp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake http");
        let addr = listener.local_addr().expect("fake http address");
        let state = Arc::new(Mutex::new(State::default()));
        let shutdown = Arc::new(AtomicBool::new(false));
        let (accept_state, accept_shutdown) = (state.clone(), shutdown.clone());
        thread::Builder::new()
            .name("fake-http-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_shutdown.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = accept_state.clone();
                    let _ = thread::Builder::new()
                        .name("fake-http-conn".into())
                        .spawn(move || {
                            let _ = serve_connection(stream, &state);
                        });
                }
            })
            .expect("spawn fake http");
        FakeHttp {
            addr,
            state,
            shutdown,
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `127.0.0.1:PORT`, the entry for `WUHU_SANDBOX_EGRESS_ALLOW`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An absolute URL for `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// Answers every request to `path` (any method, any query) with `reply`.
    pub fn route(&self, path: &str, reply: HttpReply) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_string(), reply);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Requests whose path (without the query) is `path`.
    pub fn requests_to(&self, path: &str) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.split('?').next() == Some(path))
            .collect()
    }
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve_connection(mut stream: TcpStream, state: &Mutex<State>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut raw = Vec::new();
    loop {
        let deadline = Instant::now() + IDLE_TIMEOUT;
        let Ok(head) = http::read_head(&mut stream, &mut raw, deadline) else {
            return Ok(()); // closed or idle: done with this connection.
        };
        let mut decoder = BodyDecoder::for_request(&head.headers)?;
        let mut body = Vec::new();
        loop {
            decoder.decode(&mut raw, &mut body)?;
            if decoder.is_done() {
                break;
            }
            if http::read_some(&mut stream, &mut raw, deadline)? == 0 {
                return Ok(());
            }
        }
        let mut parts = head.start_line.split(' ');
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let raw_body = String::from_utf8_lossy(&body).into_owned();
        let request = RecordedRequest {
            method,
            path,
            headers: head.headers.clone(),
            body: serde_json::from_str(&raw_body).unwrap_or(Value::Null),
            raw_body,
        };
        let reply = {
            let mut state = state.lock().unwrap();
            let route = request.path.split('?').next().unwrap_or_default();
            let reply = state.routes.get(route).cloned().unwrap_or_else(|| {
                HttpReply::json(
                    &json!({"error": format!("no route for {} {}", request.method, request.path)}),
                )
                .with_status(404)
            });
            state.requests.push(request.clone());
            reply
        };
        let head_only = request.method == "HEAD";
        write_reply(&mut stream, &reply, head_only)?;
        if http::find_header(&head.headers, "connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            return Ok(());
        }
    }
}

fn write_reply(stream: &mut TcpStream, reply: &HttpReply, head_only: bool) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Fake\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", reply.body.len()));
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(&reply.body)?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Request;

    #[test]
    fn routes_answer_and_every_request_is_recorded() {
        let server = FakeHttp::start();
        server.route(
            "/items",
            HttpReply::json(&json!({"items": [1, 2]})).with_header("X-Fake", "1"),
        );
        server.route(
            "/moved",
            HttpReply::text(302, "").with_header("Location", "/items"),
        );
        let response = Request::new("GET", server.url("/items?page=2"))
            .header("X-Test", "yes")
            .send()
            .unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.json(), json!({"items": [1, 2]}));
        assert_eq!(response.header("x-fake"), Some("1"));
        let response = Request::new("POST", server.url("/nowhere"))
            .json(&json!({"a": 1}))
            .send()
            .unwrap();
        assert_eq!(response.status, 404);
        assert_eq!(
            response.json()["error"],
            "no route for POST /nowhere",
            "{response}"
        );
        let moved = Request::new("GET", server.url("/moved")).send().unwrap();
        assert_eq!(
            (moved.status, moved.header("location")),
            (302, Some("/items"))
        );
        let items = server.requests_to("/items");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].path, "/items?page=2");
        assert_eq!(items[0].header("x-test"), Some("yes"));
        let nowhere = server.requests_to("/nowhere");
        assert_eq!(nowhere[0].body, json!({"a": 1}));
        assert_eq!(server.requests().len(), 3);
    }
}
