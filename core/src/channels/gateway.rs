//! Discord's Gateway: the WebSocket a bot keeps open to receive ordinary messages (mentions,
//! direct messages, plain messages in a channel), sans-IO.
//!
//! [`Gateway`] is the connection's state machine: the driver (the binding's Durable Object,
//! `worker/src/channels/gateway.rs`) feeds it what happened ([`Gateway::handle`] with an
//! [`Input`]: the socket opened, a text frame, the socket closed, a timer fired), then performs
//! what it asks ([`Gateway::poll_action`]: open a socket, send a frame, close, deliver a message,
//! store the resume data) and sleeps until [`Gateway::poll_deadline`]. Time (`now`, unix
//! milliseconds, never going backwards) and randomness (`random` in `0..1`, for jitter) come in
//! as values.
//!
//! The protocol, as Discord documents it (API v10, JSON encoding):
//!
//! - The URL comes from `GET /gateway/bot` ([`read_gateway_bot`]), with `?v=10&encoding=json`.
//! - `op 10 HELLO` names the heartbeat interval: the first `op 1` heartbeat (with the last
//!   sequence number) goes after `interval × random`, then every interval. A heartbeat due while
//!   the last one has no `op 11 ACK` means a zombie connection: closed (a non-1000 code keeps
//!   the session) and resumed.
//! - After HELLO: `op 6 RESUME` (token, session id, last sequence) when a session is known,
//!   else `op 2 IDENTIFY` with [`INTENTS`]. `READY` gives the session id, the
//!   `resume_gateway_url` and the bot's own user id; `RESUMED` ends a replay.
//! - `op 7 RECONNECT`: close and resume. `op 9 INVALID_SESSION`: wait 1 to 5 s, then resume
//!   when `d` is true, else identify afresh. Every reconnect counts as an attempt (so a server
//!   that drops each connection at once meets the backoff, not a storm); `READY` or `RESUMED`
//!   resets the count. `op 1` from Discord: heartbeat at once.
//! - Close codes ([`close_code_rule`]): 4004 (authentication failed), 4010 to 4014 (shard,
//!   version, intents) forbid reconnecting: the machine stops with a visible error; 4007 and
//!   4009 need a new session; anything else resumes.
//! - Reconnects back off ([`reconnect_delay_ms`]: 1 s doubling to 5 minutes, a random half off);
//!   [`MAX_ATTEMPTS`] failed attempts in a row (no READY/RESUMED in between) stop it.
//!
//! What a `MESSAGE_CREATE` means for a binding is [`message`].

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Delivery, Inbound, ReplyTarget, bounded_text};

/// The Gateway intents Wuhu asks for: `GUILD_MESSAGES` (1 << 9), `DIRECT_MESSAGES` (1 << 12)
/// and `MESSAGE_CONTENT` (1 << 15, privileged: enabled in the Developer Portal).
pub const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);
/// The query every Gateway URL gets.
pub const QUERY: &str = "v=10&encoding=json";
/// Largest frame read, in bytes; a larger one is skipped (logged). Discord's own payloads are
/// far smaller for a bot without the `GUILDS` intent.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// Failed connection attempts in a row (no `READY` or `RESUMED` in between) before the machine
/// stops and says why; a `PATCH` of the binding starts it again.
pub const MAX_ATTEMPTS: u32 = 12;
/// Longest wait between two attempts.
pub const MAX_BACKOFF_MS: u64 = 5 * 60 * 1000;
/// How long an opened socket may take to say `HELLO`, and an `IDENTIFY`/`RESUME` to be answered
/// with `READY`/`RESUMED`, before the attempt counts as failed.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 30_000;
/// Longest heartbeat interval taken from a `HELLO` (Discord's is about 41 s); longer is cut.
pub const MAX_HEARTBEAT_MS: u64 = 120_000;
/// Shortest heartbeat interval taken from a `HELLO` (tests choose short ones).
pub const MIN_HEARTBEAT_MS: u64 = 100;
/// How often the binding's alarm checks that the connection is alive (the watchdog).
pub const WATCHDOG_MS: u64 = 30_000;
/// The close code Wuhu uses to drop a connection it means to resume (Discord keeps the
/// session for any code but 1000 and 1001).
pub const CLOSE_TO_RESUME: u16 = 4900;
/// The close code of a connection Wuhu ends for good (the session is invalidated).
pub const CLOSE_NORMAL: u16 = 1000;

/// What is kept across restarts of the Durable Object (stored as JSON): enough to resume the
/// session, and what the binding's status shows. Stored on every change of state and with a
/// heartbeat when the sequence number moved (at most one write per heartbeat interval for a
/// busy server, not one per message).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Saved {
    /// The Gateway session, when one is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Where a resume connects (`resume_gateway_url` of `READY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_url: Option<String>,
    /// The last sequence number received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The bot's own user id (from `READY`): what a mention names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// What the binding's status shows.
    pub status: GatewayStatus,
}

/// The Gateway connection of a Discord binding, as `GET /v1/channels/:id` shows it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// `connecting`, `connected`, `reconnecting` (waiting to try again) or `stopped` (a close
    /// code that forbids reconnecting, or [`MAX_ATTEMPTS`] failures: see `lastError`; a `PATCH`
    /// of the binding starts it again).
    pub state: GatewayState,
    /// Since when the connection is ready (unix milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected_since: Option<u64>,
    /// Failed attempts since the last ready connection.
    #[serde(default)]
    pub attempts: u32,
    /// The last error (a close code and reason, a refused `GET /gateway/bot`, a timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When it happened (unix milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<u64>,
}

/// The connection's state in [`GatewayStatus`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum GatewayState {
    /// Opening the socket, or waiting for `READY`.
    #[default]
    Connecting,
    /// `READY` (or `RESUMED`) seen; messages arrive.
    Connected,
    /// Waiting before the next attempt.
    Reconnecting,
    /// Given up: see `lastError`.
    Stopped,
}

/// What happened, for [`Gateway::handle`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input<'a> {
    /// The socket asked for by [`Action::Connect`] is open.
    Opened,
    /// It could not be opened. `fatal`: the bot token was refused (`401` from
    /// `GET /gateway/bot`): stop. `retry_after_ms`: Discord asked for this wait (identify
    /// limit used up).
    ConnectFailed {
        /// Why (shown in the status; never a token).
        error: String,
        /// Whether trying again is pointless.
        fatal: bool,
        /// A wait Discord asked for.
        retry_after_ms: Option<u64>,
    },
    /// A text frame.
    Frame(&'a str),
    /// The socket closed (by Discord or the network) with this code and reason.
    Closed {
        /// The close code (1006 when the connection just went).
        code: u16,
        /// The close reason.
        reason: String,
    },
    /// [`Gateway::poll_deadline`] passed.
    Timeout,
}

/// What the driver does next, from [`Gateway::poll_action`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open a socket: to `url` (with [`QUERY`]) when resuming, else to the URL
    /// `GET {apiBaseUrl}/gateway/bot` names ([`read_gateway_bot`]). Then [`Input::Opened`] or
    /// [`Input::ConnectFailed`].
    Connect {
        /// The resume URL, when resuming.
        url: Option<String>,
    },
    /// Send this text frame.
    Send(String),
    /// Close the socket with this code and forget it (no [`Input::Closed`] is expected).
    Close(u16),
    /// A `MESSAGE_CREATE`'s `d`: read it with [`message`].
    Message(Value),
    /// [`Gateway::saved`] changed: store it.
    Save,
}

/// Whether a close code lets the bot reconnect, and with which session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseRule {
    /// Reconnect and resume the session.
    Resume,
    /// Reconnect with a new session (identify).
    Identify,
    /// Do not reconnect.
    Stop,
}

/// What Discord's close `code` means ("Gateway Close Event Codes").
pub fn close_code_rule(code: u16) -> CloseRule {
    match code {
        // Authentication failed, invalid shard, sharding required, invalid API version,
        // invalid intents, disallowed intents.
        4004 | 4010 | 4011 | 4012 | 4013 | 4014 => CloseRule::Stop,
        // Invalid seq, session timed out; 1000/1001 end the session too.
        4007 | 4009 | 1000 | 1001 => CloseRule::Identify,
        _ => CloseRule::Resume,
    }
}

/// The wait before reconnect attempt `attempts` (1 for the first after a failure): 1 s
/// doubling to [`MAX_BACKOFF_MS`], a random half of it taken off so bindings do not retry in
/// step; at least `retry_after_ms` when Discord asked for a wait.
pub fn reconnect_delay_ms(attempts: u32, random: f64, retry_after_ms: Option<u64>) -> u64 {
    let backoff = 1000u64
        .saturating_mul(1u64 << attempts.saturating_sub(1).min(20))
        .min(MAX_BACKOFF_MS);
    let random = if random.is_finite() {
        random.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let jittered = backoff / 2 + ((backoff / 2) as f64 * random) as u64;
    jittered.max(retry_after_ms.unwrap_or(0).min(24 * 3600 * 1000))
}

/// What `GET /gateway/bot` answered: the URL to connect to, or why not.
///
/// # Errors
/// `(message, fatal, retry_after_ms)`: a `401` is fatal (the token is wrong); a used-up
/// identify limit (`session_start_limit.remaining` 0) waits its `reset_after`.
pub fn read_gateway_bot(status: u16, body: &Value) -> Result<String, (String, bool, Option<u64>)> {
    if status == 401 {
        return Err((
            "GET /gateway/bot: 401, the bot token was refused".into(),
            true,
            None,
        ));
    }
    if !(200..300).contains(&status) {
        return Err((format!("GET /gateway/bot: {status}"), false, None));
    }
    let limit = &body["session_start_limit"];
    if limit["remaining"].as_u64() == Some(0) {
        return Err((
            "the daily identify limit is used up".into(),
            false,
            limit["reset_after"].as_u64(),
        ));
    }
    match body["url"].as_str() {
        Some(url) if url_allowed(url) => Ok(url.to_string()),
        _ => Err(("GET /gateway/bot named no wss URL".into(), false, None)),
    }
}

/// Whether the bot token may be sent to Gateway `url`: `wss`, or `ws` to a loopback host (local
/// fakes), without userinfo; as the binding's `apiBaseUrl` is checked.
pub fn url_allowed(url: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    let loopback = matches!(
        parsed.host_str(),
        Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
    );
    let scheme_ok = match parsed.scheme() {
        "wss" => true,
        "ws" => loopback,
        _ => false,
    };
    scheme_ok
        && parsed.host_str().is_some_and(|h| !h.is_empty())
        && parsed.username().is_empty()
        && parsed.password().is_none()
}

/// `url` with the Gateway [`QUERY`] (replacing any query it had).
pub fn with_query(url: &str) -> String {
    let base = url.split('?').next().unwrap_or(url);
    let has_path = base
        .split_once("://")
        .is_some_and(|(_, rest)| rest.trim_end_matches('/').contains('/'));
    if has_path {
        format!("{base}?{QUERY}")
    } else {
        format!("{}/?{QUERY}", base.trim_end_matches('/'))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting to connect at `reconnect_at`.
    Waiting,
    /// [`Action::Connect`] given; waiting for the socket.
    Connecting,
    /// Open, waiting for `HELLO`.
    AwaitHello,
    /// `IDENTIFY` or `RESUME` sent, waiting for `READY` or `RESUMED`.
    Handshake,
    /// Messages arrive.
    Ready,
    /// Given up.
    Stopped,
}

/// One binding's Gateway connection. See the module docs for the call order.
#[derive(Debug)]
pub struct Gateway {
    token: String,
    saved: Saved,
    phase: Phase,
    reconnect_at: u64,
    handshake_deadline: Option<u64>,
    heartbeat_interval: Option<u64>,
    next_heartbeat_at: Option<u64>,
    awaiting_ack: bool,
    /// The sequence number last stored.
    saved_seq: Option<u64>,
    actions: VecDeque<Action>,
}

impl Gateway {
    /// A machine for the bot `token`, from what was stored (`Saved::default()` the first time).
    /// A stored `stopped` state stays stopped; otherwise the first [`Input::Timeout`] (the
    /// deadline is `now`) connects, resuming a stored session.
    pub fn new(token: String, saved: Saved) -> Gateway {
        let phase = if saved.status.state == GatewayState::Stopped {
            Phase::Stopped
        } else {
            Phase::Waiting
        };
        Gateway {
            token,
            saved,
            phase,
            reconnect_at: 0,
            handshake_deadline: None,
            heartbeat_interval: None,
            next_heartbeat_at: None,
            awaiting_ack: false,
            saved_seq: None,
            actions: VecDeque::new(),
        }
    }

    /// What is stored and shown.
    pub fn saved(&self) -> &Saved {
        &self.saved
    }

    /// Whether the machine gave up (nothing more will happen).
    pub fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }

    /// The next thing to do, in order; drain after every [`Gateway::handle`].
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Input::Timeout`] is due (`None`: nothing is timed: waiting for the socket, or
    /// stopped).
    #[must_use]
    pub fn poll_deadline(&self) -> Option<u64> {
        match self.phase {
            Phase::Waiting => Some(self.reconnect_at),
            Phase::AwaitHello | Phase::Handshake => {
                [self.handshake_deadline, self.next_heartbeat_at]
                    .into_iter()
                    .flatten()
                    .min()
            }
            Phase::Ready => self.next_heartbeat_at,
            Phase::Connecting | Phase::Stopped => None,
        }
    }

    /// Feeds what happened at `now`.
    pub fn handle(&mut self, now: u64, random: f64, input: Input<'_>) {
        match input {
            Input::Opened => {
                if self.phase == Phase::Connecting {
                    self.phase = Phase::AwaitHello;
                    self.handshake_deadline = Some(now + HANDSHAKE_TIMEOUT_MS);
                    self.heartbeat_interval = None;
                    self.next_heartbeat_at = None;
                    self.awaiting_ack = false;
                }
            }
            Input::ConnectFailed {
                error,
                fatal,
                retry_after_ms,
            } => {
                if fatal {
                    self.stop(now, error);
                } else {
                    self.failed(now, random, error, retry_after_ms);
                }
            }
            Input::Frame(text) => self.frame(now, random, text),
            Input::Closed { code, reason } => self.closed(now, random, code, &reason),
            Input::Timeout => self.timeout(now, random),
        }
    }

    fn timeout(&mut self, now: u64, random: f64) {
        match self.phase {
            Phase::Waiting if now >= self.reconnect_at => {
                self.phase = Phase::Connecting;
                self.saved.status.state = GatewayState::Connecting;
                let url = self
                    .saved
                    .session_id
                    .as_ref()
                    .and(self.saved.resume_url.as_deref())
                    .map(with_query);
                self.actions.push_back(Action::Connect { url });
            }
            Phase::AwaitHello | Phase::Handshake | Phase::Ready => {
                if self.handshake_deadline.is_some_and(|d| now >= d) {
                    let what = if self.phase == Phase::AwaitHello {
                        "no HELLO"
                    } else {
                        "no READY"
                    };
                    self.actions.push_back(Action::Close(CLOSE_TO_RESUME));
                    self.failed(
                        now,
                        random,
                        format!("{what} within {HANDSHAKE_TIMEOUT_MS} ms"),
                        None,
                    );
                    return;
                }
                if self.next_heartbeat_at.is_some_and(|t| now >= t) {
                    if self.awaiting_ack {
                        // A zombie: the last heartbeat was never acknowledged.
                        self.actions.push_back(Action::Close(CLOSE_TO_RESUME));
                        self.failed(
                            now,
                            random,
                            "no heartbeat ACK (zombie connection)".into(),
                            None,
                        );
                        return;
                    }
                    self.heartbeat(now);
                }
            }
            _ => {}
        }
    }

    /// Asks the driver to store [`Saved`].
    fn save(&mut self) {
        self.saved_seq = self.saved.seq;
        self.actions.push_back(Action::Save);
    }

    fn heartbeat(&mut self, now: u64) {
        self.actions.push_back(Action::Send(
            json!({"op": 1, "d": self.saved.seq}).to_string(),
        ));
        if self.saved.seq != self.saved_seq {
            self.save();
        }
        self.awaiting_ack = true;
        self.next_heartbeat_at = self.heartbeat_interval.map(|i| now + i);
    }

    fn frame(&mut self, now: u64, random: f64, text: &str) {
        if !matches!(
            self.phase,
            Phase::AwaitHello | Phase::Handshake | Phase::Ready
        ) {
            return;
        }
        let Ok(payload) = serde_json::from_str::<Value>(text) else {
            return;
        };
        if let Some(seq) = payload["s"].as_u64() {
            self.saved.seq = Some(seq);
        }
        match payload["op"].as_u64() {
            Some(10) => {
                let interval = payload["d"]["heartbeat_interval"]
                    .as_u64()
                    .unwrap_or(41_250)
                    .clamp(MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS);
                self.heartbeat_interval = Some(interval);
                let random = if random.is_finite() {
                    random.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                self.next_heartbeat_at = Some(now + (interval as f64 * random) as u64);
                self.awaiting_ack = false;
                let hello = match (&self.saved.session_id, self.saved.seq) {
                    (Some(session_id), seq) => json!({"op": 6, "d": {
                        "token": self.token, "session_id": session_id, "seq": seq}}),
                    (None, _) => json!({"op": 2, "d": {
                        "token": self.token,
                        "intents": INTENTS,
                        "properties": {"os": "cloudflare", "browser": "wuhu", "device": "wuhu"},
                    }}),
                };
                self.actions.push_back(Action::Send(hello.to_string()));
                self.phase = Phase::Handshake;
                self.handshake_deadline = Some(now + HANDSHAKE_TIMEOUT_MS);
            }
            Some(11) => self.awaiting_ack = false,
            Some(1) => self.heartbeat(now),
            Some(7) => {
                self.actions.push_back(Action::Close(CLOSE_TO_RESUME));
                self.failed(
                    now,
                    random,
                    "Discord asked to reconnect (op 7)".into(),
                    None,
                );
            }
            Some(9) => {
                let resumable = payload["d"].as_bool() == Some(true);
                self.actions.push_back(Action::Close(if resumable {
                    CLOSE_TO_RESUME
                } else {
                    CLOSE_NORMAL
                }));
                if !resumable {
                    self.forget_session();
                }
                // Discord: wait a random 1 to 5 s.
                let wait = 1000 + (4000.0 * random.clamp(0.0, 1.0)) as u64;
                self.failed(now, random, "invalid session (op 9)".into(), Some(wait));
            }
            Some(0) => self.dispatch(now, &payload),
            _ => {}
        }
    }

    fn dispatch(&mut self, now: u64, payload: &Value) {
        let d = &payload["d"];
        match payload["t"].as_str() {
            Some("READY") => {
                self.saved.session_id = d["session_id"].as_str().map(str::to_string);
                // A resume URL the token may not go to is not kept: the next connection
                // identifies at the URL `GET /gateway/bot` names.
                self.saved.resume_url = d["resume_gateway_url"]
                    .as_str()
                    .filter(|url| url_allowed(url))
                    .map(str::to_string);
                if let Some(id) = d["user"]["id"].as_str() {
                    self.saved.user_id = Some(id.to_string());
                }
                self.ready(now);
            }
            Some("RESUMED") => self.ready(now),
            // The sequence number is stored with the next heartbeat, not per message: a resume
            // from an older one replays a little more, and replays are deduplicated.
            Some("MESSAGE_CREATE") => self.actions.push_back(Action::Message(d.clone())),
            _ => {}
        }
    }

    fn ready(&mut self, now: u64) {
        self.phase = Phase::Ready;
        self.handshake_deadline = None;
        self.saved.status = GatewayStatus {
            state: GatewayState::Connected,
            connected_since: Some(now),
            attempts: 0,
            last_error: self.saved.status.last_error.take(),
            last_error_at: self.saved.status.last_error_at,
        };
        self.save();
    }

    fn closed(&mut self, now: u64, random: f64, code: u16, reason: &str) {
        if !matches!(
            self.phase,
            Phase::AwaitHello | Phase::Handshake | Phase::Ready
        ) {
            return;
        }
        let reason: String = reason.chars().take(200).collect();
        let error = format!("closed by Discord: {code} {reason}")
            .trim()
            .to_string();
        match close_code_rule(code) {
            CloseRule::Stop => self.stop(now, error),
            rule => {
                if rule == CloseRule::Identify {
                    self.forget_session();
                }
                self.failed(now, random, error, None);
            }
        }
    }

    fn forget_session(&mut self) {
        self.saved.session_id = None;
        self.saved.resume_url = None;
        self.saved.seq = None;
    }

    /// Waits `wait_ms`, then connects (resuming the session if one is kept).
    fn reconnect(&mut self, now: u64, wait_ms: u64) {
        self.phase = Phase::Waiting;
        self.reconnect_at = now + wait_ms;
        self.handshake_deadline = None;
        self.next_heartbeat_at = None;
        self.awaiting_ack = false;
        self.saved.status.state = GatewayState::Reconnecting;
        self.saved.status.connected_since = None;
        self.save();
    }

    fn note_error(&mut self, now: u64, error: String) {
        self.saved.status.last_error = Some(error);
        self.saved.status.last_error_at = Some(now);
    }

    /// An attempt failed: back off, or stop after [`MAX_ATTEMPTS`].
    fn failed(&mut self, now: u64, random: f64, error: String, retry_after_ms: Option<u64>) {
        self.note_error(now, error.clone());
        self.saved.status.attempts = self.saved.status.attempts.saturating_add(1);
        let attempts = self.saved.status.attempts;
        if attempts >= MAX_ATTEMPTS {
            self.stop(now, format!("gave up after {attempts} attempts: {error}"));
            return;
        }
        let wait = reconnect_delay_ms(attempts, random, retry_after_ms);
        self.reconnect(now, wait);
    }

    fn stop(&mut self, now: u64, error: String) {
        self.phase = Phase::Stopped;
        self.forget_session();
        self.handshake_deadline = None;
        self.next_heartbeat_at = None;
        self.note_error(now, error);
        self.saved.status.state = GatewayState::Stopped;
        self.saved.status.connected_since = None;
        self.save();
    }
}

/// Where a `MESSAGE_CREATE` (its `d`) comes from: its guild (what an allowlist names); none in
/// a direct message.
pub fn origin(d: &Value) -> super::admit::Origin {
    super::admit::Origin {
        place: d["guild_id"].as_str().map(str::to_string),
        ..super::admit::Origin::default()
    }
}

/// What a `MESSAGE_CREATE` (its `d`) means for a binding whose bot is `bot_user_id`.
///
/// Ignored: a bot's message (our own included), a webhook's, a system message, an empty one.
/// A message that mentions the bot (`mentions[]` holds it, or the text has `<@id>`/`<@!id>`)
/// or a direct message (no `guild_id`) may start a session for its channel (a thread is a
/// channel); any other message only continues one. The bot's mentions are taken out of the
/// text. The message id is its dedupe key (a resumed Gateway replays events).
pub fn message(d: &Value, bot_user_id: Option<&str>) -> Delivery {
    let author = &d["author"];
    let (Some(id), Some(channel), Some(user), Some(content)) = (
        d["id"].as_str(),
        d["channel_id"].as_str(),
        author["id"].as_str(),
        d["content"].as_str(),
    ) else {
        return Delivery::Ignored("not a person's text message");
    };
    if author["bot"].as_bool() == Some(true)
        || bot_user_id == Some(user)
        || d.get("webhook_id").is_some_and(|w| !w.is_null())
    {
        return Delivery::Ignored("a bot's message");
    }
    // 0: DEFAULT, 19: REPLY; the others are joins, pins, boosts, …
    if !matches!(d["type"].as_u64(), None | Some(0) | Some(19)) {
        return Delivery::Ignored("a system message");
    }
    let mut mentioned = false;
    let mut text = content.to_string();
    if let Some(bot) = bot_user_id {
        mentioned = d["mentions"]
            .as_array()
            .is_some_and(|m| m.iter().any(|u| u["id"].as_str() == Some(bot)));
        for form in [format!("<@{bot}>"), format!("<@!{bot}>")] {
            if text.contains(&form) {
                mentioned = true;
                text = text.replace(&form, " ");
            }
        }
    }
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return Delivery::Ignored("empty message");
    }
    let direct = d["guild_id"].as_str().is_none();
    Delivery::Message(Inbound {
        dedupe_keys: vec![format!("discord:message:{id}")],
        thread_key: format!("discord:{channel}"),
        reply_to: ReplyTarget::Discord {
            channel: channel.to_string(),
            interaction: None,
            since: None,
        },
        user: user.to_string(),
        text: bounded_text(&text),
        may_start: mentioned || direct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_000_000;

    /// Drives a machine and writes what it did as lines: `> frame` sent, `connect url`,
    /// `close code`, `message id`, `save state`; `@deadline`.
    struct Script {
        gateway: Gateway,
        now: u64,
        log: Vec<String>,
    }

    impl Script {
        fn new(saved: Saved) -> Script {
            Script {
                gateway: Gateway::new("TOKEN".into(), saved),
                now: T0,
                log: Vec::new(),
            }
        }

        fn input(&mut self, input: Input<'_>) -> &mut Self {
            self.gateway.handle(self.now, 0.5, input);
            self.drain();
            self
        }

        fn frame(&mut self, frame: Value) -> &mut Self {
            self.input(Input::Frame(&frame.to_string()))
        }

        /// Moves time to the next deadline and fires it.
        fn tick(&mut self) -> &mut Self {
            let deadline = self.gateway.poll_deadline().expect("a deadline");
            self.now = self.now.max(deadline);
            self.input(Input::Timeout)
        }

        fn drain(&mut self) {
            while let Some(action) = self.gateway.poll_action() {
                let line = match action {
                    Action::Connect { url } => {
                        format!("connect {}", url.as_deref().unwrap_or("gateway/bot"))
                    }
                    Action::Send(frame) => {
                        let v: Value = serde_json::from_str(&frame).unwrap();
                        format!("> op {} {}", v["op"], v["d"])
                    }
                    Action::Close(code) => format!("close {code}"),
                    Action::Message(d) => format!("message {}", d["id"]),
                    Action::Save => format!("save {:?}", self.gateway.saved().status.state),
                };
                self.log.push(format!("+{} {line}", self.now - T0));
            }
        }

        fn take(&mut self) -> Vec<String> {
            std::mem::take(&mut self.log)
        }

        /// Connects, says HELLO (interval 1000) and READY.
        fn ready(&mut self) -> &mut Self {
            self.tick()
                .input(Input::Opened)
                .frame(json!({"op": 10, "d": {"heartbeat_interval": 1000}}))
                .frame(
                    json!({"op": 0, "t": "READY", "s": 1, "d": {"session_id": "S1",
                    "resume_gateway_url": "wss://resume.example", "user": {"id": "B1"}}}),
                );
            self
        }
    }

    fn log(s: &mut Script) -> String {
        s.take().join("\n")
    }

    #[test]
    fn identify_heartbeat_and_messages() {
        let mut s = Script::new(Saved::default());
        s.ready();
        s.frame(json!({"op": 0, "t": "MESSAGE_CREATE", "s": 2, "d": {"id": "M1"}}));
        s.tick(); // the first heartbeat: interval × random (0.5)
        s.frame(json!({"op": 11}));
        s.tick();
        s.frame(json!({"op": 11}));
        s.frame(json!({"op": 1})); // Discord asks for one: sent at once
        assert_eq!(
            log(&mut s),
            [
                "+0 connect gateway/bot",
                r#"+0 > op 2 {"intents":37376,"properties":{"browser":"wuhu","device":"wuhu","os":"cloudflare"},"token":"TOKEN"}"#,
                "+0 save Connected",
                "+0 message \"M1\"",
                "+500 > op 1 2",
                "+500 save Connected",
                "+1500 > op 1 2",
                "+1500 > op 1 2",
            ]
            .join("\n")
        );
        assert_eq!(s.gateway.saved().seq, Some(2));
        assert_eq!(s.gateway.saved().user_id.as_deref(), Some("B1"));
        assert_eq!(s.gateway.saved().status.state, GatewayState::Connected);
        assert_eq!(INTENTS, 512 + 4096 + 32768);
    }

    /// A heartbeat due while the last has no ACK: closed (keeping the session) and resumed at
    /// `resume_gateway_url` with the last sequence; the replay and `RESUMED` follow.
    #[test]
    fn a_zombie_connection_is_resumed() {
        let mut s = Script::new(Saved::default());
        s.ready();
        s.take();
        s.tick().tick(); // a heartbeat at +500, never acknowledged; due again at +1500
        s.tick().input(Input::Opened);
        s.frame(json!({"op": 10, "d": {"heartbeat_interval": 1000}}));
        s.frame(json!({"op": 0, "t": "MESSAGE_CREATE", "s": 2, "d": {"id": "M1"}}));
        s.frame(json!({"op": 0, "t": "RESUMED", "s": 3, "d": null}));
        assert_eq!(
            log(&mut s),
            [
                "+500 > op 1 1",
                "+1500 close 4900",
                "+1500 save Reconnecting",
                // Backoff of the first failure: 1 s with half of a random half off.
                "+2250 connect wss://resume.example/?v=10&encoding=json",
                r#"+2250 > op 6 {"seq":1,"session_id":"S1","token":"TOKEN"}"#,
                // The replay comes before `RESUMED`.
                "+2250 message \"M1\"",
                "+2250 save Connected",
            ]
            .join("\n")
        );
        let status = &s.gateway.saved().status;
        assert_eq!(status.attempts, 0);
        assert_eq!(
            status.last_error.as_deref(),
            Some("no heartbeat ACK (zombie connection)")
        );
    }

    /// Op 7 resumes; op 9 waits 1 to 5 s, then resumes (`true`) or identifies (`false`); a
    /// close code resumes, identifies or stops as Discord's table says.
    #[test]
    fn reconnects_resume_or_identify() {
        let cases: [(Value, &str, &str); 6] = [
            (json!({"op": 7, "d": null}), "close 4900", "> op 6"),
            (json!({"op": 9, "d": true}), "close 4900", "> op 6"),
            (json!({"op": 9, "d": false}), "close 1000", "> op 2"),
            (json!({"close": 4000}), "", "> op 6"),
            (json!({"close": 1006}), "", "> op 6"),
            (json!({"close": 4009}), "", "> op 2"),
        ];
        for (event, close, hello) in cases {
            let mut s = Script::new(Saved::default());
            s.ready();
            s.take();
            match event["close"].as_u64() {
                Some(code) => s.input(Input::Closed {
                    code: code as u16,
                    reason: String::new(),
                }),
                None => s.frame(event.clone()),
            };
            let log = s.take();
            if !close.is_empty() {
                assert_eq!(log[0], format!("+0 {close}"), "{event}");
            }
            assert_eq!(s.gateway.saved().status.state, GatewayState::Reconnecting);
            let wait = s.gateway.poll_deadline().unwrap() - T0;
            if event["op"] == 9 {
                assert_eq!(wait, 3000, "{event}"); // 1 s + 4 s × 0.5
            } else {
                assert_eq!(wait, 750, "{event}");
            }
            s.tick().input(Input::Opened);
            s.frame(json!({"op": 10, "d": {"heartbeat_interval": 1000}}));
            let log = s.take();
            let want_url = if hello == "> op 6" {
                "wss://resume.example/?v=10&encoding=json"
            } else {
                "gateway/bot"
            };
            assert_eq!(log[0], format!("+{wait} connect {want_url}"), "{event}");
            assert!(
                log[1].starts_with(&format!("+{wait} {hello}")),
                "{event}: {log:?}"
            );
        }
    }

    /// Close codes that forbid reconnecting stop the machine with the error visible; nothing
    /// is timed any more.
    #[test]
    fn fatal_close_codes_stop() {
        for code in [4004u16, 4010, 4011, 4012, 4013, 4014] {
            let mut s = Script::new(Saved::default());
            s.ready();
            s.take();
            s.input(Input::Closed {
                code,
                reason: "Authentication failed.".into(),
            });
            assert_eq!(log(&mut s), "+0 save Stopped");
            assert!(s.gateway.is_stopped());
            assert_eq!(s.gateway.poll_deadline(), None);
            let status = &s.gateway.saved().status;
            assert_eq!(status.state, GatewayState::Stopped);
            assert_eq!(
                status.last_error.as_deref(),
                Some(format!("closed by Discord: {code} Authentication failed.").as_str())
            );
            // Stored stopped, a new instance stays stopped.
            let again = Gateway::new("TOKEN".into(), s.gateway.saved().clone());
            assert_eq!(again.poll_deadline(), None);
        }
        for (code, rule) in [
            (4000, CloseRule::Resume),
            (4008, CloseRule::Resume),
            (1006, CloseRule::Resume),
            (4007, CloseRule::Identify),
            (1000, CloseRule::Identify),
            (4004, CloseRule::Stop),
            (4014, CloseRule::Stop),
        ] {
            assert_eq!(close_code_rule(code), rule, "{code}");
        }
    }

    /// Failed attempts back off (1 s doubling to 5 minutes, jittered) and stop after
    /// `MAX_ATTEMPTS`; a refused token stops at once; a silent socket is an attempt failed.
    #[test]
    fn attempts_back_off_and_give_up() {
        let mut s = Script::new(Saved::default());
        let mut waits = Vec::new();
        for _ in 0..MAX_ATTEMPTS {
            s.tick();
            let before = s.now;
            s.input(Input::ConnectFailed {
                error: "GET /gateway/bot: 502".into(),
                fatal: false,
                retry_after_ms: None,
            });
            if let Some(at) = s.gateway.poll_deadline() {
                waits.push(at - before);
            }
        }
        assert_eq!(
            waits,
            [
                750, 1500, 3000, 6000, 12000, 24000, 48000, 96000, 192000, 225000, 225000
            ]
        );
        assert!(s.gateway.is_stopped());
        assert_eq!(
            s.gateway.saved().status.last_error.as_deref(),
            Some("gave up after 12 attempts: GET /gateway/bot: 502")
        );

        let mut s = Script::new(Saved::default());
        s.tick().input(Input::ConnectFailed {
            error: "GET /gateway/bot: 401, the bot token was refused".into(),
            fatal: true,
            retry_after_ms: None,
        });
        assert!(s.gateway.is_stopped());

        let mut s = Script::new(Saved::default());
        s.tick().input(Input::Opened).tick();
        assert_eq!(
            s.take()[1..],
            ["+30000 close 4900", "+30000 save Reconnecting"]
        );
        assert_eq!(
            s.gateway.saved().status.last_error.as_deref(),
            Some("no HELLO within 30000 ms")
        );
        assert_eq!(reconnect_delay_ms(1, 0.0, Some(60_000)), 60_000);
        assert_eq!(reconnect_delay_ms(30, 1.0, None), MAX_BACKOFF_MS);
    }

    /// A new instance resumes the stored session.
    #[test]
    fn a_stored_session_is_resumed() {
        let saved = Saved {
            session_id: Some("S9".into()),
            resume_url: Some("wss://r.example/?v=9".into()),
            seq: Some(41),
            user_id: Some("B1".into()),
            status: GatewayStatus::default(),
        };
        let mut s = Script::new(saved);
        s.tick().input(Input::Opened);
        s.frame(json!({"op": 10, "d": {"heartbeat_interval": 45000}}));
        assert_eq!(
            log(&mut s),
            [
                "+0 connect wss://r.example/?v=10&encoding=json",
                r#"+0 > op 6 {"seq":41,"session_id":"S9","token":"TOKEN"}"#,
            ]
            .join("\n")
        );
    }

    #[test]
    fn gateway_bot_answers() {
        let ok = json!({"url": "wss://gateway.discord.gg", "shards": 1,
            "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 1, "max_concurrency": 1}});
        assert_eq!(
            read_gateway_bot(200, &ok).unwrap(),
            "wss://gateway.discord.gg"
        );
        for (url, want) in [
            (
                "wss://gateway.discord.gg",
                "wss://gateway.discord.gg/?v=10&encoding=json",
            ),
            ("wss://g.example/", "wss://g.example/?v=10&encoding=json"),
            (
                "wss://g.example/?v=9",
                "wss://g.example/?v=10&encoding=json",
            ),
            (
                "ws://127.0.0.1:9/resume",
                "ws://127.0.0.1:9/resume?v=10&encoding=json",
            ),
        ] {
            assert_eq!(with_query(url), want);
        }
        assert!(read_gateway_bot(401, &json!({})).unwrap_err().1);
        assert!(!read_gateway_bot(502, &json!({})).unwrap_err().1);
        let spent =
            json!({"url": "wss://g", "session_start_limit": {"remaining": 0, "reset_after": 5000}});
        assert_eq!(read_gateway_bot(200, &spent).unwrap_err().2, Some(5000));
        for (url, allowed) in [
            ("wss://gateway.discord.gg", true),
            ("wss://gateway-us-east1-b.discord.gg/", true),
            ("ws://127.0.0.1:4000", true),
            ("ws://localhost:4000/resume", true),
            ("ws://gateway.discord.gg", false),
            ("https://gateway.discord.gg", false),
            ("wss://user:pw@gateway.discord.gg", false),
            ("gateway.discord.gg", false),
        ] {
            assert_eq!(url_allowed(url), allowed, "{url}");
            assert_eq!(
                read_gateway_bot(200, &json!({ "url": url })).is_ok(),
                allowed,
                "{url}"
            );
        }
    }

    /// Which messages start, continue or are ignored, and how the text reads.
    #[test]
    fn messages() {
        let base = |content: &str| {
            json!({"id": "M1", "channel_id": "C1", "guild_id": "G1", "type": 0,
                "author": {"id": "U1", "username": "ann"}, "content": content, "mentions": []})
        };
        let with = |mut v: Value, k: &str, x: Value| {
            v[k] = x;
            v
        };
        let cases: Vec<(Value, &str)> = vec![
            (base("<@B1> what is 2+2?"), "start: what is 2+2?"),
            (base("hey <@!B1>, look"), "start: hey , look"),
            (
                with(base("hello"), "mentions", json!([{"id": "B1"}])),
                "start: hello",
            ),
            (base("just chatting"), "continue: just chatting"),
            (base("<@U7> not us"), "continue: <@U7> not us"),
            (
                with(base("in a DM"), "guild_id", Value::Null),
                "start: in a DM",
            ),
            (
                with(base("<@B1> hi"), "author", json!({"id": "U2", "bot": true})),
                "ignored: a bot's message",
            ),
            (
                with(base("echo"), "author", json!({"id": "B1"})),
                "ignored: a bot's message",
            ),
            (
                with(base("hook"), "webhook_id", json!("W1")),
                "ignored: a bot's message",
            ),
            (
                with(base("pinned"), "type", json!(6)),
                "ignored: a system message",
            ),
            (with(base("<@B1> reply"), "type", json!(19)), "start: reply"),
            (base("<@B1>"), "ignored: empty message"),
            (json!({"id": "M1"}), "ignored: not a person's text message"),
        ];
        for (d, want) in cases {
            let got = match message(&d, Some("B1")) {
                Delivery::Message(m) => {
                    assert_eq!(m.dedupe_keys, ["discord:message:M1"]);
                    assert_eq!(m.thread_key, "discord:C1");
                    assert_eq!(m.user, "U1");
                    assert_eq!(
                        m.reply_to,
                        ReplyTarget::Discord {
                            channel: "C1".into(),
                            interaction: None,
                            since: None
                        }
                    );
                    let how = if m.may_start { "start" } else { "continue" };
                    format!("{how}: {}", m.text)
                }
                Delivery::Ignored(why) => format!("ignored: {why}"),
                other => format!("{other:?}"),
            };
            assert_eq!(got, want, "{d}");
        }
        // Before READY told the bot's id only direct messages start.
        let Delivery::Message(m) = message(&base("<@B1> hi"), None) else {
            panic!()
        };
        assert!(!m.may_start);
    }
}
