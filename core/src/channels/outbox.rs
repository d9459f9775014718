//! Outbound messages and their delivery policy: what is stored (never a credential), how a
//! platform's answer is read, and when a failed delivery is tried again.

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

/// The Web API call that delivers `message` with `credentials` (the bot token goes into the
/// headers or, for Telegram, the URL: never log a call). `now_secs` signs generic replies and
/// tells whether a Discord interaction token is still usable.
pub fn request(
    api_base_url: &str,
    credentials: &super::Credentials,
    message: &Outbound,
    now_secs: i64,
) -> HttpCall {
    use super::Credentials;
    match credentials {
        Credentials::Slack { bot_token, .. } => {
            super::slack::request(api_base_url, bot_token, message)
        }
        Credentials::Telegram { bot_token, .. } => {
            super::telegram::request(api_base_url, bot_token, message)
        }
        Credentials::Discord {
            application_id,
            bot_token,
            ..
        } => super::discord::request(api_base_url, application_id, bot_token, message, now_secs),
        Credentials::Generic { secret, reply_url } => {
            super::generic::request(reply_url, secret, message, now_secs)
        }
    }
}

/// What to post instead of `message` after the platform refused it for good, if anything: a
/// reply to a Discord interaction whose token Discord no longer takes (expired after 15
/// minutes, or unknown) goes to the channel as a message of its own.
pub fn fallback(message: &Outbound) -> Option<Outbound> {
    super::discord::without_interaction(message)
}

/// What an HTTP answer of `platform` means: its status, its `Retry-After` header and its body
/// (`Null` when not JSON). Each platform reports errors its own way (Slack: `200` with
/// `"ok":false`; Telegram: `"ok":false` with `parameters.retry_after`; Discord: a 429 with
/// `retry_after` in the body).
pub fn read_answer(
    platform: super::Platform,
    status: u16,
    retry_after: Option<&str>,
    body: &serde_json::Value,
) -> Attempt {
    use super::Platform;
    let attempt = classify(status, retry_after);
    match platform {
        Platform::Slack => match attempt {
            Attempt::Sent(_) => match super::slack::answer(body) {
                Ok(reference) => Attempt::Sent(reference),
                Err(error) if error == "ratelimited" => Attempt::Retry {
                    retry_after_ms: None,
                },
                Err(error) => Attempt::Refused(format!("slack: {error}")),
            },
            other => other,
        },
        Platform::Telegram => super::telegram::answer(attempt, body),
        Platform::Discord => super::discord::answer(attempt, body),
        Platform::Generic => match attempt {
            Attempt::Sent(_) => Attempt::Sent(body["id"].as_str().map(str::to_string)),
            other => other,
        },
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

/// How many times one message is tried before it is given up (logged, dropped).
pub const MAX_ATTEMPTS: u32 = 8;
/// The longest wait between two tries, also the cap of a platform's `Retry-After`.
pub const MAX_BACKOFF_MS: u64 = 5 * 60 * 1000;
/// Most messages waiting in one binding's outbox; past it new ones are refused (logged).
pub const MAX_PENDING: usize = 1_000;

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

/// When to try again after `attempts` failed tries, or `None` to give up. The platform's
/// `Retry-After` wins over the backoff (1 s, 2 s, 4 s, … up to [`MAX_BACKOFF_MS`]).
pub fn next_try_in_ms(attempts: u32, retry_after_ms: Option<u64>) -> Option<u64> {
    if attempts >= MAX_ATTEMPTS {
        return None;
    }
    let backoff = 1000u64
        .saturating_mul(1u64 << attempts.saturating_sub(1).min(20))
        .min(MAX_BACKOFF_MS);
    Some(retry_after_ms.unwrap_or(backoff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(classify(200, None), Attempt::Sent(None));
        assert_eq!(
            classify(429, Some("3")),
            Attempt::Retry {
                retry_after_ms: Some(3000)
            }
        );
        assert_eq!(
            classify(429, Some("soon")),
            Attempt::Retry {
                retry_after_ms: None
            }
        );
        assert_eq!(
            classify(503, None),
            Attempt::Retry {
                retry_after_ms: None
            }
        );
        assert_eq!(classify(401, None), Attempt::Refused("http 401".into()));
        assert_eq!(retry_after_ms("0.5"), Some(500));
        assert_eq!(retry_after_ms("100000"), Some(MAX_BACKOFF_MS));
        assert_eq!(retry_after_ms("-1"), None);
    }

    #[test]
    fn backoff() {
        let waits: Vec<Option<u64>> = (1..=MAX_ATTEMPTS)
            .map(|a| next_try_in_ms(a, None))
            .collect();
        assert_eq!(waits[0], Some(1000));
        assert_eq!(waits[1], Some(2000));
        assert_eq!(waits[6], Some(64_000));
        assert_eq!(waits[7], None);
        assert!(waits.iter().flatten().all(|w| *w <= MAX_BACKOFF_MS));
        assert_eq!(next_try_in_ms(1, Some(7000)), Some(7000));
        assert_eq!(next_try_in_ms(MAX_ATTEMPTS, Some(7000)), None);
    }

    #[test]
    fn stored_form_has_no_credentials() {
        let message = Outbound::Text {
            target: ReplyTarget::Slack {
                channel: "C1".into(),
                thread_ts: Some("1.0".into()),
            },
            text: "hi".into(),
            edit: None,
            edit_of: None,
        };
        let json = serde_json::to_string(&message).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"text","target":{"platform":"slack","channel":"C1","threadTs":"1.0"},"text":"hi"}"#
        );
        assert_eq!(serde_json::from_str::<Outbound>(&json).unwrap(), message);
    }
}
