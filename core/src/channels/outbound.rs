//! What the outbox holds and hands out, shared with the platforms' modules: the message to
//! post ([`Outbound`]), the HTTP call that posts it ([`HttpCall`]) and how an answer reads
//! ([`Attempt`]). The outbox's policy (when to try again, what to store) is in `outbox`.

use serde::{Deserialize, Serialize};

use super::ReplyTarget;

/// A message to post. Stored in the binding's outbox as JSON; the host adds the credentials
/// when it builds the request ([`request`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Outbound {
    /// Text (one chunk of a reply, or a progress line).
    Text {
        /// Where.
        target: ReplyTarget,
        /// The text, in the platform's dialect, within its limit.
        text: String,
        /// The platform's reference of a message to edit instead of posting a new one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edit: Option<String>,
        /// The outbox key of an earlier message to edit: the host fills `edit` with that
        /// message's reference when it posts (a progress line posted once, then edited).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edit_of: Option<String>,
    },
    /// An approval request with buttons.
    #[serde(rename_all = "camelCase")]
    Approval {
        /// Where.
        target: ReplyTarget,
        /// The session asking.
        session: String,
        /// The approval.
        approval_id: String,
        /// What is asked.
        text: String,
    },
    /// An answer to a Slack slash command through its `response_url` (which authorizes it:
    /// Slack takes up to 5 answers within 30 minutes).
    #[serde(rename_all = "camelCase")]
    CommandResponse {
        /// The channel of the command (where other platforms would post it).
        target: ReplyTarget,
        /// The command's `response_url`.
        response_url: String,
        /// The answer, in the platform's dialect.
        text: String,
        /// Shown to the whole channel (`in_channel`) rather than to the person only
        /// (`ephemeral`).
        in_channel: bool,
    },
    /// Telegram's `answerCallbackQuery`: the small notice the clicker sees.
    #[serde(rename_all = "camelCase")]
    CallbackAnswer {
        /// The chat of the click.
        target: ReplyTarget,
        /// `callback_query.id`.
        callback_id: String,
        /// The notice.
        text: String,
    },
}

impl Outbound {
    /// Where it goes.
    pub fn target(&self) -> &ReplyTarget {
        match self {
            Outbound::Text { target, .. }
            | Outbound::Approval { target, .. }
            | Outbound::CommandResponse { target, .. }
            | Outbound::CallbackAnswer { target, .. } => target,
        }
    }

    /// A new text message (not an edit).
    pub fn text(target: ReplyTarget, text: String) -> Outbound {
        Outbound::Text {
            target,
            text,
            edit: None,
            edit_of: None,
        }
    }
}

/// An HTTP request for the host to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCall {
    /// Method.
    pub method: String,
    /// Absolute URL.
    pub url: String,
    /// Headers (may hold the bot token: never log or store them).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: String,
}

/// The longest wait between two tries, also the cap of a platform's `Retry-After`.
pub const MAX_BACKOFF_MS: u64 = 5 * 60 * 1000;

/// What a delivery attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Posted; the platform's reference of the message, if it gave one.
    Sent(Option<String>),
    /// Try again later; `retry_after_ms` is the platform's wish when it said one.
    Retry {
        /// From a `Retry-After` header.
        retry_after_ms: Option<u64>,
    },
    /// The platform refused it for good (bad token, unknown channel).
    Refused(String),
}

/// Reads an HTTP answer: 2xx is sent (the platform's body decides further), 429 and 5xx and
/// network failures retry, other 4xx are refused.
pub fn classify(status: u16, retry_after: Option<&str>) -> Attempt {
    match status {
        200..=299 => Attempt::Sent(None),
        429 | 500..=599 => Attempt::Retry {
            retry_after_ms: retry_after.and_then(retry_after_ms),
        },
        _ => Attempt::Refused(format!("http {status}")),
    }
}

/// `Retry-After` in seconds (the form chat platforms send), as milliseconds, capped at
/// [`MAX_BACKOFF_MS`].
pub fn retry_after_ms(header: &str) -> Option<u64> {
    let secs: f64 = header.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(((secs * 1000.0) as u64).min(MAX_BACKOFF_MS))
}
