//! Chat channels: Slack, Telegram, Discord and generic webhooks bound to a tenant.
//!
//! A *binding* connects one bot (its credentials) to the tenant; each platform thread it sees
//! becomes one session with `access: tenant` (a group chat). Everything with a rule in it lives
//! here, sans-IO: what a binding may hold and how reads mask it ([`binding`]), credentials
//! sealed at rest ([`seal`]), each platform's signature check ([`verify`]), how a Slack delivery
//! reads and which thread it belongs to ([`slack`]), text for platform limits and dialects
//! ([`text`]), what a transcript page means for the thread ([`turn`]) and outbound delivery
//! retries ([`outbox`]). The Worker (`worker/src/channels/`) performs the I/O.

pub mod binding;
pub mod outbox;
pub mod seal;
pub mod slack;
pub mod text;
pub mod turn;
pub mod verify;

pub use binding::{
    ChannelBinding, ChannelDefaults, ChannelOptions, ChannelView, CreateChannelRequest,
    Credentials, PatchChannelRequest, Platform,
};

/// The identity a platform user has in Wuhu: `<platform>:<user id>` (`slack:U123`).
///
/// The colon never appears in a token's `sub` (see [`crate::authority::valid_name`]), so a
/// platform user can never be confused with, or impersonate, a person who signs in.
pub fn platform_identity(platform: Platform, user: &str) -> String {
    format!("{}:{user}", platform.as_str())
}

/// The system prompt of a channel's sessions when its binding sets none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are Wuhu, a helpful agent answering in a chat thread where several people may write. You start without an environment; use your tools when they help. Keep answers short enough to read in a chat.";

/// Which lane a message from a channel goes to: the binding's `busyLane` option. When the
/// session is idle both lanes start a turn at once, so the option only matters while one runs.
pub fn lane_for(options: &ChannelOptions) -> crate::wire::Lane {
    options.busy_lane
}

use serde::{Deserialize, Serialize};

/// Where in a platform a reply goes. Stored with each thread and each outbound message; holds
/// no secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "platform", rename_all = "lowercase")]
pub enum ReplyTarget {
    /// A Slack channel, in a thread when `thread_ts` is set.
    #[serde(rename_all = "camelCase")]
    Slack {
        /// Channel id.
        channel: String,
        /// The thread's root message.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_ts: Option<String>,
    },
    /// A generic webhook thread (replies go to the binding's `replyUrl`).
    Generic {
        /// The caller's thread id.
        thread: String,
    },
}

/// A person's message from a platform, verified and decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inbound {
    /// Keys that identify this delivery; any of them seen before makes it a duplicate.
    pub dedupe_keys: Vec<String>,
    /// The thread it belongs to: one session per key and binding.
    pub thread_key: String,
    /// Where replies go.
    pub reply_to: ReplyTarget,
    /// The platform's user id.
    pub user: String,
    /// The text, mentions of the bot removed.
    pub text: String,
    /// Whether it may start a session (a mention or a direct message); other messages only
    /// continue a thread that has one.
    pub may_start: bool,
}

/// Most dedupe keys a binding remembers; the oldest are forgotten first. Platforms retry for
/// minutes to hours, so keys also expire after [`DEDUPE_TTL_SECS`].
pub const MAX_DEDUPE_KEYS: usize = 10_000;
/// How long a dedupe key is remembered: a day (longer than any platform's retries).
pub const DEDUPE_TTL_SECS: i64 = 86_400;
/// Most threads a binding maps to sessions; past it the least recently used are forgotten (a
/// later message there starts a new session).
pub const MAX_THREADS: usize = 10_000;
/// Longest message text accepted from a platform, in bytes (longer is cut).
pub const MAX_INBOUND_TEXT_BYTES: usize = 64 * 1024;

/// `text` cut to [`MAX_INBOUND_TEXT_BYTES`] at a character boundary.
pub fn bounded_text(text: &str) -> String {
    if text.len() <= MAX_INBOUND_TEXT_BYTES {
        return text.to_string();
    }
    let mut end = MAX_INBOUND_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}
