//! A local EC2 instance metadata service speaking IMDSv2, for the runner's credentials chain
//! (`AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:PORT`).
//!
//! As the real one: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1 to
//! 21600) issues a session token; every `GET` must carry a live one in
//! `X-aws-ec2-metadata-token` or gets 401 (no IMDSv1 fallback); `GET
//! /latest/meta-data/iam/security-credentials/` names the instance's role and `…/ROLE` answers
//! its temporary credentials. Each credentials answer has a new access key id
//! (`ASIAFAKEIMDS0001`, `…0002`, …) expiring [`FakeImds::set_lifetime`] seconds later, so a
//! test can see which keys signed which request and when the runner fetched new ones.

use std::sync::{Arc, Mutex};

use hyper::Response;

use crate::fake_openai::RecordedRequest;
use crate::fake_server::{Body, FakeServer, full};
use crate::util::{random_hex, rfc3339_utc, unix_now};

/// The role the fake instance has.
pub const ROLE: &str = "wuhu-runner-role";
/// The secret key of every credentials answer.
pub const SECRET_ACCESS_KEY: &str = "fake-imds-secret-access-key";

struct State {
    /// Live session tokens and when they expire (unix seconds).
    tokens: Vec<(String, i64)>,
    /// Seconds each credentials answer is valid.
    lifetime: i64,
    /// The credentials answered so far: key id and expiry (unix seconds).
    issued: Vec<(String, i64)>,
    /// Requests refused for a missing or dead token.
    refused: Vec<String>,
    requests: Vec<RecordedRequest>,
}

/// The server; dropping it stops it.
pub struct FakeImds {
    server: FakeServer,
    state: Arc<Mutex<State>>,
}

impl FakeImds {
    /// Starts on an ephemeral port of 127.0.0.1; credentials live an hour until
    /// [`FakeImds::set_lifetime`].
    pub fn start() -> FakeImds {
        let state = Arc::new(Mutex::new(State {
            tokens: Vec::new(),
            lifetime: 3600,
            issued: Vec::new(),
            refused: Vec::new(),
            requests: Vec::new(),
        }));
        let handler_state = state.clone();
        let server =
            FakeServer::start("fake-imds", move |request| respond(&handler_state, request));
        FakeImds { server, state }
    }

    /// `http://127.0.0.1:PORT`, the value of `AWS_EC2_METADATA_SERVICE_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// How long the next credentials are valid, in seconds.
    pub fn set_lifetime(&self, seconds: i64) {
        self.state.lock().unwrap().lifetime = seconds;
    }

    /// The credentials answered so far: access key id and expiry (unix seconds).
    pub fn issued(&self) -> Vec<(String, i64)> {
        self.state.lock().unwrap().issued.clone()
    }

    /// Requests refused for a missing or dead session token (`METHOD PATH`).
    pub fn refused(&self) -> Vec<String> {
        self.state.lock().unwrap().refused.clone()
    }

    /// Every request received.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.lock().unwrap().requests.clone()
    }
}

fn header<'a>(request: &'a RecordedRequest, name: &str) -> Option<&'a str> {
    request
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn text(status: u16, body: &str) -> Response<Body> {
    full(
        status,
        &[("Content-Type".to_string(), "text/plain".to_string())],
        body.to_string(),
    )
}

fn respond(state: &Mutex<State>, request: RecordedRequest) -> Response<Body> {
    let mut state = state.lock().unwrap();
    state.requests.push(request.clone());
    let now = unix_now();
    let path = request.path.split('?').next().unwrap_or("").to_string();
    if request.method == "PUT" && path == "/latest/api/token" {
        let Some(ttl) = header(&request, "x-aws-ec2-metadata-token-ttl-seconds")
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|ttl| (1..=21600).contains(ttl))
        else {
            return text(
                400,
                "missing or invalid x-aws-ec2-metadata-token-ttl-seconds",
            );
        };
        let token = random_hex(24);
        state.tokens.push((token.clone(), now + ttl));
        return full(
            200,
            &[
                ("Content-Type".to_string(), "text/plain".to_string()),
                (
                    "x-aws-ec2-metadata-token-ttl-seconds".to_string(),
                    ttl.to_string(),
                ),
            ],
            token,
        );
    }
    let live = header(&request, "x-aws-ec2-metadata-token")
        .is_some_and(|token| state.tokens.iter().any(|(t, at)| t == token && now < *at));
    if !live {
        state.refused.push(format!("{} {path}", request.method));
        return text(401, "");
    }
    if request.method != "GET" {
        return text(405, "");
    }
    let listing = "/latest/meta-data/iam/security-credentials/";
    if path == listing {
        return text(200, ROLE);
    }
    if path == format!("{listing}{ROLE}") {
        let n = state.issued.len() + 1;
        let key = format!("ASIAFAKEIMDS{n:04}");
        let expires = now + state.lifetime;
        state.issued.push((key.clone(), expires));
        let at = |secs: i64| {
            rfc3339_utc(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64))
        };
        let body = serde_json::json!({
            "Code": "Success",
            "LastUpdated": at(now),
            "Type": "AWS-HMAC",
            "AccessKeyId": key,
            "SecretAccessKey": SECRET_ACCESS_KEY,
            "Token": format!("fake-imds-session-token-{n}"),
            "Expiration": at(expires),
        });
        return full(
            200,
            &[("Content-Type".to_string(), "application/json".to_string())],
            body.to_string(),
        );
    }
    text(404, "")
}
