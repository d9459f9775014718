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
//! unless the client says `Connection: close` (hyper's HTTP/1 server, see
//! [`crate::fake_server`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::Response;
use serde_json::{Value, json};

use crate::fake_openai::RecordedRequest;
use crate::fake_server::{self, Body, FakeServer};

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
    server: FakeServer,
    state: Arc<Mutex<State>>,
}

impl FakeHttp {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub fn start() -> FakeHttp {
        let state = Arc::new(Mutex::new(State::default()));
        let handler_state = state.clone();
        let server =
            FakeServer::start("fake-http", move |request| respond(&handler_state, request));
        FakeHttp { server, state }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.server.addr().port()
    }

    /// `127.0.0.1:PORT`, the entry for `WUHU_SANDBOX_EGRESS_ALLOW`.
    pub fn host_port(&self) -> String {
        self.server.addr().to_string()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr())
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

/// Answers one request from the routes.
fn respond(state: &Mutex<State>, request: RecordedRequest) -> Response<Body> {
    let mut state = state.lock().unwrap();
    let route = request.path.split('?').next().unwrap_or_default();
    let reply = state.routes.get(route).cloned().unwrap_or_else(|| {
        HttpReply::json(
            &json!({"error": format!("no route for {} {}", request.method, request.path)}),
        )
        .with_status(404)
    });
    state.requests.push(request);
    reply.response()
}

impl HttpReply {
    /// As a response (hyper leaves out the body of an answer to `HEAD`).
    pub(crate) fn response(self) -> Response<Body> {
        fake_server::full(self.status, &self.headers, self.body)
    }
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
