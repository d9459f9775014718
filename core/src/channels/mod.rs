//! Chat channels: Slack, Telegram, Discord and generic webhooks bound to a tenant.
//!
//! A *binding* connects one bot (its credentials) to the tenant; each platform thread it sees
//! becomes one session with `access: tenant` (a group chat). Everything with a rule in it lives
//! here, sans-IO: what a binding may hold and how reads mask it ([`binding`]), credentials
//! sealed at rest ([`seal`]), each platform's signature check ([`verify`]), how a Slack delivery
//! reads and which thread it belongs to ([`slack`]), text for platform limits and dialects
//! ([`text`]), what a transcript page means for the thread ([`turn`]) and outbound delivery
//! retries ([`outbox`]). Each platform's deliveries and Web API calls: [`slack`], [`telegram`],
//! [`discord`], [`generic`]; what they share (a decoded delivery, native commands, the hook's
//! answer) is here; who a binding lets in and how much guests may do is [`admit`]. The Worker
//! (`worker/src/channels/`) performs the I/O.

pub mod admit;
pub mod binding;
pub mod discord;
pub mod gateway;
pub mod generic;
pub mod members;
pub mod outbound;
pub mod outbox;
pub mod seal;
pub mod slack;
pub mod telegram;
pub mod text;
pub mod turn;
pub mod verify;

pub use binding::{
    ChannelBinding, ChannelDefaults, ChannelOptions, ChannelView, CreateChannelRequest,
    Credentials, ListChannelsResponse, PatchChannelRequest, Platform,
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
    /// A Telegram chat, in a forum topic when `topic` is set.
    Telegram {
        /// `chat.id`.
        chat: i64,
        /// `message_thread_id` of a forum topic.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topic: Option<i64>,
    },
    /// A Discord channel (a thread is a channel too).
    Discord {
        /// Channel id.
        channel: String,
        /// The token of the interaction this answers: the first reply edits its deferred
        /// response. Valid 15 minutes at Discord; it lets the holder answer that one
        /// interaction only, and is forgotten with the message once posted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interaction: Option<String>,
        /// When the interaction arrived (unix seconds): past
        /// [`discord::INTERACTION_TOKEN_USABLE_SECS`] the token is not used, the message goes
        /// to the channel instead. `None` in targets stored before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<i64>,
    },
    /// A generic webhook thread (replies go to the binding's `replyUrl`).
    Generic {
        /// The caller's thread id.
        thread: String,
    },
}

impl ReplyTarget {
    /// The same place without a per-message handle (Discord's interaction token): where later
    /// messages of the thread go.
    pub fn thread_only(&self) -> ReplyTarget {
        match self {
            ReplyTarget::Discord { channel, .. } => ReplyTarget::Discord {
                channel: channel.clone(),
                interaction: None,
                since: None,
            },
            other => other.clone(),
        }
    }
}

/// What a verified hook delivery asks for, on any platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Answer with this JSON body and do nothing else (Slack's `url_verification` challenge,
    /// Discord's `PING`).
    Answer(serde_json::Value),
    /// A person wrote.
    Message(Inbound),
    /// A person gave a native command.
    Command(Command),
    /// A person clicked an approval button.
    Approval(ApprovalClick),
    /// Nothing to do (another event type, a bot's message, an edit).
    Ignored(&'static str),
}

/// A native command (Slack slash command, Telegram `/stop`, Discord application command).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// What is asked.
    pub kind: CommandKind,
    /// Keys that identify this delivery (see [`Inbound::dedupe_keys`]).
    pub dedupe_keys: Vec<String>,
    /// The thread it is about.
    pub thread_key: String,
    /// When no thread has `thread_key` (a Slack slash command knows its channel, not the
    /// thread it was typed under): the command is about the most recently active thread whose
    /// key starts with this.
    pub latest_thread_under: Option<String>,
    /// Where the answer goes.
    pub reply_to: ReplyTarget,
    /// Where the note goes instead of the thread: a Slack slash command's `response_url`.
    pub response_url: Option<String>,
    /// The platform's user id.
    pub user: String,
}

/// The native commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandKind {
    /// Stop the running turn.
    Stop,
    /// Forget the thread's session: the next message starts a new one.
    New,
    /// Say what the session is doing.
    Status,
    /// Deliver this text at the next step boundary of the running turn.
    Steer(String),
}

/// Reads a text command: `/stop`, `/new`, `/status`, `/steer <text>` (a `@botname` suffix on
/// the command is allowed, as Telegram writes it in groups). `None` for anything else.
pub fn parse_command(text: &str) -> Option<CommandKind> {
    let text = text.trim();
    let rest = text.strip_prefix('/')?;
    let (word, argument) = match rest.find(char::is_whitespace) {
        Some(i) => (&rest[..i], rest[i..].trim()),
        None => (rest, ""),
    };
    let name = word.split('@').next().unwrap_or_default();
    match (name.to_ascii_lowercase().as_str(), argument) {
        ("stop", _) => Some(CommandKind::Stop),
        ("new", _) => Some(CommandKind::New),
        ("status", _) => Some(CommandKind::Status),
        ("steer", text) if !text.is_empty() => Some(CommandKind::Steer(bounded_text(text))),
        _ => None,
    }
}

/// An approval button click.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalClick {
    /// Who clicked (the platform's user id).
    pub user: String,
    /// The session, when the button says (Slack's buttons do); otherwise the binding looks
    /// the approval up among the ones it posted.
    pub session: Option<String>,
    /// The approval.
    pub approval_id: String,
    /// `approve`, `approve_session` or `deny`.
    pub decision: String,
    /// Unique per click: dedupes the platform's retries.
    pub dedupe_key: String,
    /// Where a note about the click goes.
    pub reply_to: Option<ReplyTarget>,
    /// Telegram's `callback_query.id`, answered with `answerCallbackQuery`.
    pub callback: Option<String>,
}

/// The decisions an approval button may carry.
pub const DECISIONS: [&str; 3] = ["approve", "approve_session", "deny"];

/// The value of an approval button on Telegram, Discord and generic: `<decision>:<approval>`
/// (at most 52 bytes: Telegram's `callback_data` takes 64).
pub fn button_value(decision: &str, approval_id: &str) -> String {
    format!("{decision}:{approval_id}")
}

/// Reads [`button_value`]: `(decision, approval id)`.
pub fn parse_button_value(value: &str) -> Option<(String, String)> {
    let (decision, approval) = value.split_once(':')?;
    if !DECISIONS.contains(&decision) || approval.is_empty() || approval.contains(':') {
        return None;
    }
    Some((decision.to_string(), approval.to_string()))
}

/// What a hook did, for its answer to the platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookOutcome {
    /// The message is in the session's queue.
    Queued {
        /// The session.
        session: String,
        /// The queue item.
        queued: String,
    },
    /// Stored, and on its way to the session (its delivery did not finish within
    /// [`HOOK_WAIT_MS`]: a session being created, a session slow to answer); the reply follows
    /// as for a queued message.
    Accepted,
    /// Seen before: acknowledged, nothing done.
    Duplicate,
    /// Nothing to do.
    Ignored(String),
    /// Not admitted (a stranger, a guest over its quota): nothing was started or enqueued;
    /// the text is what the person is told (answered inline on Discord, else posted at most
    /// once an hour, `admit::notice_due`).
    Refused(String),
    /// A command or click was handled; `text` says how. Platforms that answer inline
    /// ([`answers_inline`]) show it as the interaction's response, the others get it posted.
    Note {
        /// Whether what was asked happened.
        ok: bool,
        /// What to tell the person.
        text: String,
    },
}

/// Whether a platform shows a command's or click's note as the hook's own answer (Discord's
/// interaction response) rather than as a posted message.
pub fn answers_inline(platform: Platform) -> bool {
    platform == Platform::Discord
}

/// The body a hook answers with.
pub fn hook_answer(platform: Platform, outcome: &HookOutcome) -> serde_json::Value {
    use serde_json::json;
    if platform == Platform::Discord {
        return discord::hook_answer(outcome);
    }
    match outcome {
        HookOutcome::Queued { session, queued } => {
            json!({"ok": true, "session": session, "queued": queued})
        }
        HookOutcome::Accepted => json!({"ok": true, "accepted": true}),
        HookOutcome::Duplicate => json!({"ok": true, "duplicate": true}),
        HookOutcome::Ignored(why) => json!({"ok": true, "ignored": why}),
        HookOutcome::Refused(text) => json!({"ok": true, "refused": text}),
        HookOutcome::Note { ok, text } => json!({"ok": ok, "note": text}),
    }
}

/// A person's message from a platform, verified and decoded (stored as JSON in the binding's
/// inbox until it is in its session's queue).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
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

/// The id of the session a thread's first message creates: derived from the binding, the
/// thread and the message (its first dedupe key), so a delivery tried again after the Worker
/// died mid-creation finds the session the first try made (`/init` answers 409) instead of
/// making a second one. A UUID (version 4 and variant bits set) from SHA-256.
pub fn session_id_for(binding_id: &str, thread_key: &str, message_key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in [binding_id, thread_key, message_key] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Most messages a binding's inbox holds (accepted by a hook, not yet in their sessions'
/// queues); past it a hook answers 503 and the platform retries later.
pub const MAX_INBOX: usize = 1_000;

/// Longest title of a session a chat thread starts (`"<binding>: <first message>"`), in
/// characters: cut there (`crate::text::bounded_title`), the rest of the message is the prompt.
pub const THREAD_TITLE_CHARS: usize = 80;

/// How long a hook waits for its message to reach the session before it answers "accepted"
/// (Slack and Discord want an answer within 3 s).
pub const HOOK_WAIT_MS: u64 = 2_000;
/// When the alarm delivers an accepted message whose hook's own delivery did not finish (the
/// instance died after the answer): this long after the hook.
pub const INBOX_LEASE_MS: u64 = 5_000;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_one_per_message() {
        let id = session_id_for("b1", "C1:1.0", "Ev1");
        assert_eq!(id, session_id_for("b1", "C1:1.0", "Ev1"));
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        for other in [
            session_id_for("b2", "C1:1.0", "Ev1"),
            session_id_for("b1", "C1:1.1", "Ev1"),
            session_id_for("b1", "C1:1.0", "Ev2"),
            session_id_for("b1", "C1:1.0E", "v1"),
        ] {
            assert_ne!(id, other);
        }
    }
}
