//! A fake chat platform Web API (Slack's `chat.postMessage` / `chat.update` wire format) on an
//! ephemeral port, and the signing of hook requests with each platform's real algorithm.
//!
//! ```text
//! let slack = FakeSlack::start("xoxb-test");
//! // a binding with "apiBaseUrl": slack.api_base_url()
//! slack.fail_next(vec![FakeSlack::rate_limited(1)]); // the next call gets a 429
//! let posted = slack.wait_for_posts(1, Duration::from_secs(20));
//! ```
//!
//! Every call is recorded with its method, bearer token and JSON body; a call with another
//! token answers `{"ok":false,"error":"invalid_auth"}` like Slack.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::fake_http::HttpReply;
use crate::fake_server::FakeServer;

/// One Web API call the fake received.
#[derive(Clone, Debug)]
pub struct SlackCall {
    /// `chat.postMessage` or `chat.update`.
    pub method: String,
    /// The bearer token it carried.
    pub token: Option<String>,
    /// The JSON body.
    pub body: Value,
    /// The `ts` the fake answered with (`None` when it answered with an error).
    pub ts: Option<String>,
}

#[derive(Default)]
struct State {
    calls: Vec<SlackCall>,
    failures: VecDeque<HttpReply>,
    next_ts: u64,
}

/// The fake Slack Web API.
pub struct FakeSlack {
    server: FakeServer,
    state: Arc<Mutex<State>>,
}

impl FakeSlack {
    /// Starts a fake that accepts `bot_token`.
    pub fn start(bot_token: &str) -> FakeSlack {
        let state = Arc::new(Mutex::new(State {
            next_ts: 1_700_000_000,
            ..State::default()
        }));
        let handler_state = state.clone();
        let token = bot_token.to_string();
        let server = FakeServer::start("fake-slack", move |stream, request| {
            let method = request
                .path
                .split('?')
                .next()
                .unwrap_or_default()
                .trim_start_matches("/api/")
                .to_string();
            let bearer = request
                .header("authorization")
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(str::to_string);
            let reply = {
                let mut state = handler_state.lock().unwrap();
                if let Some(failure) = state.failures.pop_front() {
                    state.calls.push(SlackCall {
                        method,
                        token: bearer,
                        body: request.body.clone(),
                        ts: None,
                    });
                    failure
                } else if bearer.as_deref() != Some(token.as_str()) {
                    state.calls.push(SlackCall {
                        method,
                        token: bearer,
                        body: request.body.clone(),
                        ts: None,
                    });
                    HttpReply::json(&json!({"ok": false, "error": "invalid_auth"}))
                } else if method == "chat.postMessage" || method == "chat.update" {
                    state.next_ts += 1;
                    let ts = match method.as_str() {
                        "chat.update" => {
                            request.body["ts"].as_str().unwrap_or_default().to_string()
                        }
                        _ => format!("{}.000100", state.next_ts),
                    };
                    state.calls.push(SlackCall {
                        method,
                        token: bearer,
                        body: request.body.clone(),
                        ts: Some(ts.clone()),
                    });
                    HttpReply::json(
                        &json!({"ok": true, "channel": request.body["channel"], "ts": ts}),
                    )
                } else {
                    HttpReply::json(&json!({"ok": false, "error": "unknown_method"}))
                }
            };
            write_reply(stream, &reply)?;
            Ok(true)
        });
        FakeSlack { server, state }
    }

    /// `http://127.0.0.1:PORT/api`: a binding's `apiBaseUrl`.
    pub fn api_base_url(&self) -> String {
        format!("http://{}/api", self.server.addr())
    }

    /// The next calls get these replies instead of a success (recorded all the same).
    pub fn fail_next(&self, replies: Vec<HttpReply>) {
        self.state.lock().unwrap().failures.extend(replies);
    }

    /// A `429` with `Retry-After: secs`, as Slack rate-limits.
    pub fn rate_limited(secs: u64) -> HttpReply {
        HttpReply::json(&json!({"ok": false, "error": "ratelimited"}))
            .with_status(429)
            .with_header("Retry-After", secs.to_string())
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<SlackCall> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The calls that were answered with success.
    pub fn posts(&self) -> Vec<SlackCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.ts.is_some())
            .collect()
    }

    /// Waits until at least `n` calls succeeded; returns them all.
    #[track_caller]
    pub fn wait_for_posts(&self, n: usize, timeout: Duration) -> Vec<SlackCall> {
        crate::util::wait_for(&format!("{n} Slack posts"), timeout, || {
            let posts = self.posts();
            (posts.len() >= n).then_some(posts)
        })
    }
}

fn write_reply(stream: &mut TcpStream, reply: &HttpReply) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {} Fake\r\n", reply.status);
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", reply.body.len()));
    stream.write_all(head.as_bytes())?;
    stream.write_all(&reply.body)?;
    stream.flush()
}

/// Slack's `X-Slack-Signature` of `body` at `timestamp`: `v0=<hex HMAC-SHA256(secret,
/// "v0:{timestamp}:{body}")>`.
pub fn slack_signature(signing_secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(signing_secret.as_bytes()).expect("hmac takes any key");
    mac.update(format!("v0:{timestamp}:").as_bytes());
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("v0={hex}")
}
