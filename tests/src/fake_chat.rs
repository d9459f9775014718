//! Fake chat platform APIs on an ephemeral port, speaking each platform's real wire format, and
//! the signing of hook requests with each platform's real algorithm.
//!
//! ```text
//! let slack = FakeChat::slack("xoxb-test");          // chat.postMessage / chat.update, slash response_url
//! let telegram = FakeChat::telegram("123:AA");       // /bot<token>/sendMessage, editMessageText, answerCallbackQuery
//! let discord = FakeChat::discord("app", "bot");     // channels/:id/messages, webhooks/:app/:token/messages/@original
//! let generic = FakeChat::generic("secret");         // POST /reply, signature checked
//! // a binding with "apiBaseUrl": fake.api_base_url() (generic: "replyUrl": fake.reply_url())
//! fake.fail_next(vec![FakeChat::rate_limited(1)]);   // the next call gets a 429 + Retry-After
//! fake.drop_answers(1);                              // the next post is taken, its answer lost
//! let posted = fake.wait_for_posts(1, Duration::from_secs(20));
//! ```
//!
//! Every call is recorded ([`ChatCall`]); a call without the right credential is refused the
//! way the platform refuses it, and recorded as not posted. The platforms' idempotency
//! mechanisms are real here: Discord's create message with `nonce` + `enforce_nonce: true`
//! returns the message created earlier with that nonce (recorded as not posted); Slack keeps
//! each message's `metadata` and answers `conversations.replies` / `conversations.history`
//! (with `include_all_metadata`) from what was posted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::fake_http::HttpReply;
use crate::fake_openai::RecordedRequest;
use crate::fake_server::FakeServer;

/// One API call the fake received.
#[derive(Clone, Debug)]
pub struct ChatCall {
    /// What was called, as the platform names it: `chat.postMessage`, `sendMessage`,
    /// `POST channels/C1/messages`, `PATCH webhooks/app/tok/messages/@original`, `reply`.
    pub method: String,
    /// The credential it carried (Slack bearer token, Telegram token in the path, Discord
    /// `Bot` token, or `"signed"` for a generic reply whose signature verified).
    pub token: Option<String>,
    /// The JSON body.
    pub body: Value,
    /// The message reference the fake answered with (`None`: refused, failed, a lookup, or a
    /// repeat Discord recognised by its nonce).
    pub ts: Option<String>,
    /// Taken (posted) but its answer was lost: the fake closed the connection instead.
    pub answer_dropped: bool,
}

impl ChatCall {
    /// The message text, whatever the platform calls it.
    pub fn text(&self) -> &str {
        ["/text", "/content", "/approval/text"]
            .iter()
            .find_map(|k| self.body.pointer(k).and_then(serde_json::Value::as_str))
            .unwrap_or_default()
    }

    /// Whether it edits an earlier message.
    pub fn is_edit(&self) -> bool {
        self.method == "chat.update"
            || self.method == "editMessageText"
            || self.method.starts_with("PATCH ")
            || self.body.get("replaces").is_some()
    }
}

#[derive(Clone)]
enum Kind {
    Slack { token: String },
    Telegram { token: String },
    Discord { token: String },
    Generic { secret: String },
}

/// A message the fake platform holds (Slack, Discord): what lookups and nonces see.
#[derive(Clone, Debug)]
struct Held {
    channel: String,
    thread_ts: Option<String>,
    reference: String,
    body: Value,
}

#[derive(Default)]
struct State {
    calls: Vec<ChatCall>,
    failures: VecDeque<HttpReply>,
    /// Posts still to take whose answer is then lost.
    drop_answers: usize,
    held: Vec<Held>,
    next_ref: u64,
    /// Discord: every interaction token is past its 15 minutes.
    interactions_expired: bool,
    /// Discord: the URL `GET /gateway/bot` names ([`FakeChat::set_gateway`]).
    gateway_url: Option<String>,
}

/// A fake chat platform API.
pub struct FakeChat {
    server: FakeServer,
    state: Arc<Mutex<State>>,
    kind: Kind,
}

/// Kept for the Slack tests' names.
pub type FakeSlack = FakeChat;

impl FakeChat {
    /// Slack's Web API accepting `bot_token`.
    pub fn slack(bot_token: &str) -> FakeChat {
        FakeChat::start_kind(Kind::Slack {
            token: bot_token.into(),
        })
    }

    /// Same as [`FakeChat::slack`].
    pub fn start(bot_token: &str) -> FakeChat {
        FakeChat::slack(bot_token)
    }

    /// Telegram's Bot API for the bot `bot_token`.
    pub fn telegram(bot_token: &str) -> FakeChat {
        FakeChat::start_kind(Kind::Telegram {
            token: bot_token.into(),
        })
    }

    /// Discord's API accepting `Bot <bot_token>`.
    pub fn discord(bot_token: &str) -> FakeChat {
        FakeChat::start_kind(Kind::Discord {
            token: bot_token.into(),
        })
    }

    /// A generic receiver of replies signed with `secret`.
    pub fn generic(secret: &str) -> FakeChat {
        FakeChat::start_kind(Kind::Generic {
            secret: secret.into(),
        })
    }

    fn start_kind(kind: Kind) -> FakeChat {
        let state = Arc::new(Mutex::new(State {
            next_ref: 1_700_000_000,
            ..State::default()
        }));
        let handler_state = state.clone();
        let handler_kind = kind.clone();
        let server = FakeServer::start("fake-chat", move |request| {
            let reply = {
                let mut state = handler_state.lock().unwrap();
                if let Some(reply) = gateway_bot(&handler_kind, &state, &request) {
                    return reply.response();
                }
                let (method, token) = call_name(&handler_kind, &request);
                let mut call = ChatCall {
                    method,
                    token,
                    body: request.body.clone(),
                    ts: None,
                    answer_dropped: false,
                };
                let reply = if let Some(failure) = state.failures.pop_front() {
                    failure
                } else if let Some(reply) = lookup(&handler_kind, &state, &call, &request) {
                    reply
                } else if let Some(existing) = nonce_repeat(&handler_kind, &state, &call, &request)
                {
                    // Discord: "that message will be returned and no new message will be
                    // created".
                    HttpReply::json(
                        &json!({"id": existing.reference, "content": existing.body["content"], "nonce": existing.body["nonce"]}),
                    )
                } else if state.interactions_expired && call.method.contains(" webhooks/") {
                    // What Discord answers for a token past its 15 minutes.
                    HttpReply::json(&json!({"message": "Invalid Webhook Token", "code": 50027}))
                        .with_status(401)
                } else if call.method == SLACK_RESPONSE_URL {
                    // A slash command's response_url: the URL authorizes; Slack answers `ok`.
                    state.next_ref += 1;
                    call.ts = Some(state.next_ref.to_string());
                    HttpReply::text(200, "ok")
                } else if let Some(refusal) = refuse(&handler_kind, &call) {
                    refusal
                } else {
                    state.next_ref += 1;
                    let reference = match &handler_kind {
                        Kind::Slack { .. } if call.method == "chat.update" => {
                            call.body["ts"].as_str().unwrap_or_default().to_string()
                        }
                        // Slack's ts: unix seconds and a sequence (lookups filter on `oldest`).
                        Kind::Slack { .. } => {
                            format!(
                                "{}.{:06}",
                                crate::util::unix_now(),
                                state.next_ref % 1_000_000
                            )
                        }
                        Kind::Telegram { .. } if call.method == "editMessageText" => {
                            call.body["message_id"].to_string()
                        }
                        Kind::Discord { .. } if call.method.starts_with("PATCH channels") => call
                            .method
                            .rsplit('/')
                            .next()
                            .unwrap_or_default()
                            .to_string(),
                        _ => state.next_ref.to_string(),
                    };
                    call.ts = Some(reference.clone());
                    hold(&handler_kind, &mut state, &call, &request, &reference);
                    if state.drop_answers > 0 {
                        state.drop_answers -= 1;
                        call.answer_dropped = true;
                    }
                    success(&handler_kind, &call, &reference)
                };
                let dropped = call.answer_dropped;
                state.calls.push(call);
                if dropped {
                    return crate::fake_server::no_answer();
                }
                reply
            };
            reply.response()
        });
        FakeChat {
            server,
            state,
            kind,
        }
    }

    /// The binding's `apiBaseUrl`.
    pub fn api_base_url(&self) -> String {
        match self.kind {
            Kind::Telegram { .. } => format!("http://{}", self.server.addr()),
            _ => format!("http://{}/api", self.server.addr()),
        }
    }

    /// Slack: a slash command's `response_url` (as Slack makes them:
    /// `…/commands/<team>/<id>/<secret>`), answered here; its calls are named
    /// [`SLACK_RESPONSE_URL`].
    pub fn slack_response_url(&self, n: u64) -> String {
        format!(
            "http://{}/commands/T1/{n}/{}",
            self.server.addr(),
            crate::util::random_hex(8)
        )
    }

    /// A generic binding's `replyUrl`.
    pub fn reply_url(&self) -> String {
        format!("http://{}/reply", self.server.addr())
    }

    /// The next calls get these replies instead of a success (recorded all the same).
    pub fn fail_next(&self, replies: Vec<HttpReply>) {
        self.state.lock().unwrap().failures.extend(replies);
    }

    /// The next `n` posts (calls that create or edit a message) are taken, then the connection
    /// is closed without an answer, as when a response is lost on its way back.
    pub fn drop_answers(&self, n: usize) {
        self.state.lock().unwrap().drop_answers += n;
    }

    /// Discord: from now on every interaction token is expired (as 15 minutes after the
    /// interaction): answering through it is refused with `401 Invalid Webhook Token`.
    pub fn expire_interactions(&self) {
        self.state.lock().unwrap().interactions_expired = true;
    }

    /// Discord: `GET /gateway/bot` names `url` (a [`crate::fake_gateway::FakeGateway`]);
    /// until then it answers 503. Not recorded as a call.
    pub fn set_gateway(&self, url: &str) {
        self.state.lock().unwrap().gateway_url = Some(url.to_string());
    }

    /// A `429` with `Retry-After: secs`, as every platform rate-limits (with its own body).
    pub fn rate_limited(secs: u64) -> HttpReply {
        HttpReply::json(&json!({"ok": false, "error": "ratelimited", "error_code": 429,
            "parameters": {"retry_after": secs}, "message": "You are being rate limited.", "retry_after": secs}))
        .with_status(429)
        .with_header("Retry-After", secs.to_string())
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<ChatCall> {
        self.state.lock().unwrap().calls.clone()
    }

    /// The calls that were answered with success.
    pub fn posts(&self) -> Vec<ChatCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.ts.is_some())
            .collect()
    }

    /// Waits until at least `n` calls succeeded; returns them all.
    #[track_caller]
    pub fn wait_for_posts(&self, n: usize, timeout: Duration) -> Vec<ChatCall> {
        crate::util::wait_for(&format!("{n} chat posts"), timeout, || {
            let posts = self.posts();
            (posts.len() >= n).then_some(posts)
        })
    }

    /// Waits until a successful call's text satisfies `pred`; returns all posts then.
    #[track_caller]
    pub fn wait_for_text(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Vec<ChatCall> {
        crate::util::wait_for(what, timeout, || {
            let posts = self.posts();
            posts.iter().any(|p| pred(p.text())).then_some(posts)
        })
    }
}

/// The [`ChatCall::method`] of a POST to a Slack slash command's `response_url`.
pub const SLACK_RESPONSE_URL: &str = "response_url";

/// Discord's `GET /gateway/bot` (the bot token authorizes it).
fn gateway_bot(kind: &Kind, state: &State, request: &RecordedRequest) -> Option<HttpReply> {
    let Kind::Discord { token } = kind else {
        return None;
    };
    if request.method != "GET" || !request.path.ends_with("/gateway/bot") {
        return None;
    }
    if request.header("authorization") != Some(format!("Bot {token}").as_str()) {
        return Some(
            HttpReply::json(&json!({"message": "401: Unauthorized", "code": 0})).with_status(401),
        );
    }
    Some(match &state.gateway_url {
        Some(url) => HttpReply::json(&json!({"url": url, "shards": 1, "session_start_limit":
            {"total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1}})),
        None => HttpReply::json(&json!({"message": "no gateway in this test"})).with_status(503),
    })
}

/// The call's name and the credential it carried.
fn call_name(kind: &Kind, request: &RecordedRequest) -> (String, Option<String>) {
    let path = request.path.split('?').next().unwrap_or_default();
    let header = |name: &str| request.header(name).map(str::to_string);
    match kind {
        Kind::Slack { .. } if path.starts_with("/commands/") => (
            SLACK_RESPONSE_URL.to_string(),
            header("authorization").and_then(|h| h.strip_prefix("Bearer ").map(str::to_string)),
        ),
        Kind::Slack { .. } => (
            path.trim_start_matches("/api/").to_string(),
            header("authorization").and_then(|h| h.strip_prefix("Bearer ").map(str::to_string)),
        ),
        Kind::Telegram { .. } => {
            let rest = path.trim_start_matches("/bot");
            match rest.rsplit_once('/') {
                Some((token, method)) => (method.to_string(), Some(token.to_string())),
                None => (rest.to_string(), None),
            }
        }
        Kind::Discord { .. } => (
            format!("{} {}", request.method, path.trim_start_matches("/api/")),
            header("authorization").and_then(|h| h.strip_prefix("Bot ").map(str::to_string)),
        ),
        Kind::Generic { secret } => {
            let signed = wuhu_core::channels::verify::generic(
                secret,
                request.header("x-wuhu-timestamp"),
                request.header("x-wuhu-signature"),
                request.raw_body.as_bytes(),
                crate::util::unix_now(),
            )
            .is_ok();
            (
                path.trim_start_matches('/').to_string(),
                signed.then(|| "signed".to_string()),
            )
        }
    }
}

/// Slack's `conversations.replies` (the thread's messages) and `conversations.history` (the
/// channel's top-level messages), from what was posted, newest first, with `metadata` only
/// when `include_all_metadata=true`.
fn lookup(
    kind: &Kind,
    state: &State,
    call: &ChatCall,
    request: &RecordedRequest,
) -> Option<HttpReply> {
    let Kind::Slack { token } = kind else {
        return None;
    };
    if call.method != "conversations.replies" && call.method != "conversations.history" {
        return None;
    }
    if call.token.as_deref() != Some(token.as_str()) {
        return Some(HttpReply::json(
            &json!({"ok": false, "error": "invalid_auth"}),
        ));
    }
    let query: Vec<(String, String)> = request
        .path
        .split_once('?')
        .map(|(_, q)| {
            q.split('&')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_string(), v.replace("%20", " ")))
                .collect()
        })
        .unwrap_or_default();
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let Some(channel) = param("channel") else {
        return Some(HttpReply::json(
            &json!({"ok": false, "error": "channel_not_found"}),
        ));
    };
    let thread = param("ts");
    if call.method == "conversations.replies" && thread.is_none() {
        return Some(HttpReply::json(
            &json!({"ok": false, "error": "thread_not_found"}),
        ));
    }
    let oldest: f64 = param("oldest").and_then(|o| o.parse().ok()).unwrap_or(0.0);
    let metadata = param("include_all_metadata").as_deref() == Some("true");
    let messages: Vec<Value> = state
        .held
        .iter()
        .rev()
        .filter(|m| m.channel == channel && m.thread_ts == thread)
        .filter(|m| m.reference.parse::<f64>().unwrap_or(0.0) >= oldest)
        .map(|m| {
            let mut message = json!({"type": "message", "ts": m.reference, "text": m.body["text"]});
            if metadata && !m.body["metadata"].is_null() {
                message["metadata"] = m.body["metadata"].clone();
            }
            message
        })
        .collect();
    Some(HttpReply::json(
        &json!({"ok": true, "messages": messages, "has_more": false}),
    ))
}

/// Discord: a create message with `enforce_nonce: true` whose nonce a message of the same
/// channel already has (the fake keeps them all; Discord checks "the past few minutes").
fn nonce_repeat(
    kind: &Kind,
    state: &State,
    call: &ChatCall,
    request: &RecordedRequest,
) -> Option<Held> {
    if let Kind::Generic { .. } = kind {
        // A receiver that dedupes on `Idempotency-Key`, as docs/channels.md asks.
        let key = request.header("idempotency-key")?;
        return state.held.iter().find(|m| m.channel == key).cloned();
    }
    let Kind::Discord { .. } = kind else {
        return None;
    };
    let channel = call
        .method
        .strip_prefix("POST channels/")?
        .strip_suffix("/messages")?;
    if call.body["enforce_nonce"] != json!(true) {
        return None;
    }
    let nonce = call.body["nonce"].as_str()?;
    state
        .held
        .iter()
        .find(|m| m.channel == channel && m.body["nonce"].as_str() == Some(nonce))
        .cloned()
}

/// Keeps what a successful call created (Slack `chat.postMessage`, Discord create message; a
/// generic reply under its `Idempotency-Key`).
fn hold(
    kind: &Kind,
    state: &mut State,
    call: &ChatCall,
    request: &RecordedRequest,
    reference: &str,
) {
    let (channel, thread_ts) = match kind {
        Kind::Slack { .. } if call.method == "chat.postMessage" => (
            call.body["channel"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            call.body["thread_ts"].as_str().map(str::to_string),
        ),
        Kind::Discord { .. } if call.method.starts_with("POST channels/") => (
            call.method
                .trim_start_matches("POST channels/")
                .trim_end_matches("/messages")
                .to_string(),
            None,
        ),
        Kind::Generic { .. } => match request.header("idempotency-key") {
            Some(key) => (key.to_string(), None),
            None => return,
        },
        _ => return,
    };
    state.held.push(Held {
        channel,
        thread_ts,
        reference: reference.to_string(),
        body: call.body.clone(),
    });
}

/// The platform's refusal of a call without the right credential.
fn refuse(kind: &Kind, call: &ChatCall) -> Option<HttpReply> {
    match kind {
        Kind::Slack { token } => (call.token.as_deref() != Some(token.as_str()))
            .then(|| HttpReply::json(&json!({"ok": false, "error": "invalid_auth"}))),
        Kind::Telegram { token } => (call.token.as_deref() != Some(token.as_str())).then(|| {
            HttpReply::json(&json!({"ok": false, "error_code": 401, "description": "Unauthorized"}))
                .with_status(401)
        }),
        // The interaction webhook is authorized by its token in the path.
        Kind::Discord { token } => (!call.method.contains("webhooks/")
            && call.token.as_deref() != Some(token.as_str()))
        .then(|| {
            HttpReply::json(&json!({"message": "401: Unauthorized", "code": 0})).with_status(401)
        }),
        Kind::Generic { .. } => call
            .token
            .is_none()
            .then(|| HttpReply::text(401, "bad signature")),
    }
}

fn success(kind: &Kind, call: &ChatCall, reference: &str) -> HttpReply {
    match kind {
        Kind::Slack { .. } => {
            HttpReply::json(&json!({"ok": true, "channel": call.body["channel"], "ts": reference}))
        }
        Kind::Telegram { .. } if call.method == "answerCallbackQuery" => {
            HttpReply::json(&json!({"ok": true, "result": true}))
        }
        Kind::Telegram { .. } => HttpReply::json(&json!({"ok": true, "result": {
            "message_id": reference.parse::<i64>().unwrap_or_default(),
            "chat": {"id": call.body["chat_id"]}, "text": call.body["text"]}})),
        Kind::Discord { .. } => {
            HttpReply::json(&json!({"id": reference, "content": call.body["content"]}))
        }
        Kind::Generic { .. } => HttpReply::json(&json!({"id": reference})),
    }
}

/// Slack's `X-Slack-Signature` of `body` at `timestamp`: `v0=<hex HMAC-SHA256(secret,
/// "v0:{timestamp}:{body}")>`.
pub fn slack_signature(signing_secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!(
        "v0={}",
        hmac_hex(
            signing_secret,
            &[format!("v0:{timestamp}:").as_bytes(), body]
        )
    )
}

/// The generic `X-Wuhu-Signature` of `body` at `timestamp`: `sha256=<hex HMAC-SHA256(secret,
/// "{timestamp}.{body}")>`.
pub fn generic_signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!(
        "sha256={}",
        hmac_hex(secret, &[format!("{timestamp}.").as_bytes(), body])
    )
}

/// Discord's `X-Signature-Ed25519` of `body` at `timestamp`: hex Ed25519 over
/// `{timestamp}{body}`.
pub fn discord_signature(key: &SigningKey, timestamp: i64, body: &[u8]) -> String {
    let mut message = timestamp.to_string().into_bytes();
    message.extend_from_slice(body);
    hex_encode(&key.sign(&message).to_bytes())
}

/// A fresh Ed25519 key pair for a Discord application: the signing key and the public key in
/// hex, as the Developer Portal shows it.
pub fn discord_keys() -> (SigningKey, String) {
    let hex = crate::util::random_hex(32);
    let seed: [u8; 32] = std::array::from_fn(|i| {
        u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("random_hex is hex")
    });
    let key = SigningKey::from_bytes(&seed);
    let public = hex_encode(&key.verifying_key().to_bytes());
    (key, public)
}

fn hmac_hex(secret: &str, parts: &[&[u8]]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("hmac takes any key");
    for part in parts {
        mac.update(part);
    }
    hex_encode(&mac.finalize().into_bytes())
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
