//! Outbound messages and their delivery policy: what is stored (never a credential), how a
//! platform's answer is read, and when a failed delivery is tried again.

pub use super::outbound::{Attempt, HttpCall, MAX_BACKOFF_MS, Outbound, classify, retry_after_ms};

/// The Web API call that delivers `message` with `credentials` (the bot token goes into the
/// headers or, for Telegram, the URL: never log a call). `now_secs` signs generic replies and
/// tells whether a Discord interaction token is still usable. `key` is the message's outbox
/// key: the call carries its [`nonce`] where the platform can recognise a repeat (see
/// [`with_nonce`]).
pub fn request(
    api_base_url: &str,
    credentials: &super::Credentials,
    message: &Outbound,
    now_secs: i64,
    key: &str,
) -> HttpCall {
    let call = platform_request(api_base_url, credentials, message, now_secs);
    with_nonce(credentials.platform(), call, &nonce(key))
}

/// The outbox key as a platform-side idempotency key: 24 hex characters of its SHA-256
/// (Discord takes a `nonce` of at most 25 characters). Per binding, keys are unique.
pub fn nonce(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(key.as_bytes());
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// The Slack `metadata.event_type` that marks a message posted by Wuhu's outbox; its
/// `event_payload.key` is the message's [`nonce`].
pub const SLACK_METADATA_TYPE: &str = "wuhu_outbox";

/// Adds the platform's idempotency mechanism to a call that creates a message:
///
/// - Discord create message: `nonce` + `enforce_nonce: true` (Discord returns the message
///   already created with that nonce by the same author in the past few minutes instead of
///   creating another).
/// - Slack `chat.postMessage`: `metadata` `{"event_type":"wuhu_outbox","event_payload":{"key":…}}`,
///   which [`lookup`] searches for before a message whose first try has an unknown outcome is
///   tried again.
/// - Generic: the header `Idempotency-Key: <nonce>` (the receiver dedupes on it).
/// - Telegram has no such mechanism (see `docs/channels.md`); edits (`chat.update`, Discord
///   `PATCH`, `editMessageText`) are idempotent as they are.
pub fn with_nonce(platform: super::Platform, mut call: HttpCall, nonce: &str) -> HttpCall {
    use super::Platform;
    let add = |call: &mut HttpCall, fields: &[(&str, serde_json::Value)]| {
        if let Ok(serde_json::Value::Object(mut body)) =
            serde_json::from_str::<serde_json::Value>(&call.body)
        {
            for (name, value) in fields {
                body.insert((*name).to_string(), value.clone());
            }
            call.body = serde_json::Value::Object(body).to_string();
        }
    };
    match platform {
        Platform::Discord if call.method == "POST" && call.url.ends_with("/messages") => add(
            &mut call,
            &[
                ("nonce", serde_json::json!(nonce)),
                ("enforce_nonce", serde_json::json!(true)),
            ],
        ),
        Platform::Slack if call.url.ends_with("/chat.postMessage") => add(
            &mut call,
            &[(
                "metadata",
                serde_json::json!({"event_type": SLACK_METADATA_TYPE, "event_payload": {"key": nonce}}),
            )],
        ),
        Platform::Generic => call
            .headers
            .push(("idempotency-key".to_string(), nonce.to_string())),
        _ => {}
    }
    call
}

/// Whether a delivery's outcome is known from what came back: no answer at all (the
/// connection failed or dropped, the Worker died mid-call) or a 5xx may hide a message that
/// was posted; anything else says for sure whether it was.
pub fn outcome_known(status: Option<u16>) -> bool {
    matches!(status, Some(s) if !(500..=599).contains(&s))
}

/// Before a message whose earlier try has an unknown outcome is tried again: the call that
/// finds whether it was posted after all, where the platform can tell (Slack: the thread's
/// replies, or the channel's history since `since_secs`, with their metadata). `None`: no
/// lookup is needed (Discord's nonce, edits, generic's key) or none is possible (Telegram).
pub fn lookup(
    api_base_url: &str,
    credentials: &super::Credentials,
    message: &Outbound,
    since_secs: i64,
) -> Option<HttpCall> {
    let super::Credentials::Slack { bot_token, .. } = credentials else {
        return None;
    };
    let creates = match message {
        Outbound::Text { edit, edit_of, .. } => edit.is_none() && edit_of.is_none(),
        Outbound::Approval { .. } => true,
        _ => false,
    };
    let super::ReplyTarget::Slack { channel, thread_ts } = message.target() else {
        return None;
    };
    if !creates {
        return None;
    }
    let base = api_base_url.trim_end_matches('/');
    let query = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect::<Vec<_>>()
            .join("&")
    };
    let since = since_secs.saturating_sub(60).max(0).to_string();
    let url = match thread_ts {
        Some(ts) => format!(
            "{base}/conversations.replies?{}",
            query(&[
                ("channel", channel),
                ("ts", ts),
                ("oldest", &since),
                ("include_all_metadata", "true"),
                ("limit", "1000"),
            ])
        ),
        None => format!(
            "{base}/conversations.history?{}",
            query(&[
                ("channel", channel),
                ("oldest", &since),
                ("include_all_metadata", "true"),
                ("limit", "1000"),
            ])
        ),
    };
    Some(HttpCall {
        method: "GET".into(),
        url,
        headers: vec![("authorization".into(), format!("Bearer {bot_token}"))],
        body: String::new(),
    })
}

/// What a [`lookup`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The message is there (posted by the earlier try); its reference.
    Posted(Option<String>),
    /// It is not: post it.
    Absent,
    /// The lookup failed: look again later (without posting).
    Unknown,
}

/// Reads a [`lookup`]'s answer: a message whose metadata carries `nonce`.
pub fn read_lookup(status: u16, body: &serde_json::Value, nonce: &str) -> Found {
    if !(200..=299).contains(&status) || body["ok"] != serde_json::json!(true) {
        return Found::Unknown;
    }
    let Some(messages) = body["messages"].as_array() else {
        return Found::Unknown;
    };
    messages
        .iter()
        .find(|m| {
            m["metadata"]["event_type"] == SLACK_METADATA_TYPE
                && m["metadata"]["event_payload"]["key"] == nonce
        })
        .map_or(Found::Absent, |m| {
            Found::Posted(m["ts"].as_str().map(str::to_string))
        })
}

fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn platform_request(
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

/// How many times one message is tried before it is given up (logged, and a notice goes into
/// the session's transcript). With [`MAX_BACKOFF_MS`] and the jitter of [`next_try_in_ms`] the
/// tries span about 20 to 40 minutes (longer when the platform's `Retry-After` says so).
pub const MAX_ATTEMPTS: u32 = 16;
/// Most messages waiting in one binding's outbox. Past it a scan does not take a finished turn
/// (the thread waits and is looked at again: back-pressure), and a note that must go now is
/// given up (logged, a notice in the session).
pub const MAX_PENDING: usize = 1_000;

/// When to try again after `attempts` failed tries, or `None` to give up. The platform's
/// `Retry-After` wins (waited as it is, capped at [`MAX_BACKOFF_MS`]); else the backoff 1 s,
/// 2 s, 4 s, … up to [`MAX_BACKOFF_MS`], of which a random half (`jitter` in `0.0..1.0`) is
/// taken off, so the outboxes of many bindings do not try again in step.
pub fn next_try_in_ms(attempts: u32, retry_after_ms: Option<u64>, jitter: f64) -> Option<u64> {
    if attempts >= MAX_ATTEMPTS {
        return None;
    }
    let backoff = 1000u64
        .saturating_mul(1u64 << attempts.saturating_sub(1).min(20))
        .min(MAX_BACKOFF_MS);
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let jittered = backoff / 2 + ((backoff / 2) as f64 * jitter) as u64;
    Some(retry_after_ms.map_or(jittered, |r| r.min(MAX_BACKOFF_MS)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::ReplyTarget;

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
        // (attempts, Retry-After, jitter) → wait.
        let cases: &[(u32, Option<u64>, f64, Option<u64>)] = &[
            (1, None, 0.0, Some(500)),
            (1, None, 0.999_999, Some(999)),
            (2, None, 1.0, Some(2000)),
            (7, None, 0.5, Some(48_000)),
            (12, None, 0.0, Some(MAX_BACKOFF_MS / 2)),
            (12, None, 1.0, Some(MAX_BACKOFF_MS)),
            (1, Some(7000), 0.0, Some(7000)),
            (1, Some(10 * MAX_BACKOFF_MS), 0.0, Some(MAX_BACKOFF_MS)),
            (3, None, f64::NAN, Some(2000)),
            (MAX_ATTEMPTS - 1, None, 0.3, Some(195_000)),
            (MAX_ATTEMPTS, None, 0.3, None),
            (MAX_ATTEMPTS, Some(7000), 0.3, None),
        ];
        for (attempts, retry_after, jitter, want) in cases {
            assert_eq!(
                next_try_in_ms(*attempts, *retry_after, *jitter),
                *want,
                "{attempts} {retry_after:?} {jitter}"
            );
        }
        // The horizon: every wait within its bound; the sum is what docs/channels.md says.
        let (mut least, mut most) = (0u64, 0u64);
        for attempts in 1..MAX_ATTEMPTS {
            least += next_try_in_ms(attempts, None, 0.0).unwrap();
            most += next_try_in_ms(attempts, None, 1.0).unwrap();
        }
        assert!((19 * 60_000..21 * 60_000).contains(&least), "{least}");
        assert!((38 * 60_000..40 * 60_000).contains(&most), "{most}");
    }

    #[test]
    fn idempotency_keys_on_the_wire() {
        use crate::channels::{Credentials, Platform};
        let n = nonce("reply:s1:12:0");
        assert_eq!(n.len(), 24);
        assert_eq!(n, nonce("reply:s1:12:0"));
        assert_ne!(n, nonce("reply:s1:12:1"));
        let discord = Credentials::Discord {
            application_id: "app".into(),
            public_key: "00".into(),
            bot_token: "bot".into(),
        };
        let slack = Credentials::Slack {
            signing_secret: "s".into(),
            bot_token: "xoxb".into(),
        };
        let in_channel = |platform: Platform| match platform {
            Platform::Slack => ReplyTarget::Slack {
                channel: "C1".into(),
                thread_ts: Some("1.5".into()),
            },
            _ => ReplyTarget::Discord {
                channel: "C1".into(),
                interaction: None,
                since: Some(0),
            },
        };
        let body = |call: &HttpCall| serde_json::from_str::<serde_json::Value>(&call.body).unwrap();
        // Discord: a new message carries nonce + enforce_nonce; an edit does not.
        let post = request(
            "http://d",
            &discord,
            &Outbound::text(in_channel(Platform::Discord), "hi".into()),
            0,
            "k",
        );
        assert_eq!(body(&post)["nonce"], nonce("k"));
        assert_eq!(body(&post)["enforce_nonce"], true);
        let edit = Outbound::Text {
            target: in_channel(Platform::Discord),
            text: "hi".into(),
            edit: Some("9".into()),
            edit_of: None,
        };
        assert!(
            body(&request("http://d", &discord, &edit, 0, "k"))
                .get("nonce")
                .is_none()
        );
        // Slack: chat.postMessage carries the metadata, and the lookup finds it.
        let message = Outbound::text(in_channel(Platform::Slack), "hi".into());
        let post = request("http://s/api", &slack, &message, 0, "k");
        assert_eq!(
            body(&post)["metadata"],
            serde_json::json!({"event_type": "wuhu_outbox", "event_payload": {"key": nonce("k")}})
        );
        let look = lookup("http://s/api", &slack, &message, 1000).unwrap();
        assert_eq!(look.method, "GET");
        assert_eq!(
            look.url,
            "http://s/api/conversations.replies?channel=C1&ts=1.5&oldest=940&include_all_metadata=true&limit=1000"
        );
        assert!(
            look.headers
                .contains(&("authorization".into(), "Bearer xoxb".into()))
        );
        let answer =
            |messages: serde_json::Value| serde_json::json!({"ok": true, "messages": messages});
        let ours = serde_json::json!({"ts": "1.7", "metadata": {"event_type": "wuhu_outbox", "event_payload": {"key": nonce("k")}}});
        let other = serde_json::json!({"ts": "1.6", "metadata": {"event_type": "wuhu_outbox", "event_payload": {"key": nonce("j")}}});
        let cases = [
            (
                200,
                answer(serde_json::json!([other.clone(), ours])),
                Found::Posted(Some("1.7".into())),
            ),
            (
                200,
                answer(serde_json::json!([other, {"ts": "1.8", "text": "hi"}])),
                Found::Absent,
            ),
            (
                200,
                serde_json::json!({"ok": false, "error": "ratelimited"}),
                Found::Unknown,
            ),
            (429, serde_json::Value::Null, Found::Unknown),
            (200, serde_json::json!({"ok": true}), Found::Unknown),
        ];
        for (status, answer, want) in cases {
            assert_eq!(read_lookup(status, &answer, &nonce("k")), want, "{answer}");
        }
        let no_thread = Outbound::text(
            ReplyTarget::Slack {
                channel: "D 1".into(),
                thread_ts: None,
            },
            "hi".into(),
        );
        assert!(
            lookup("http://s/api", &slack, &no_thread, 100)
                .unwrap()
                .url
                .starts_with("http://s/api/conversations.history?channel=D%201&oldest=40&")
        );
        // Edits and other platforms need no lookup.
        let slack_edit = Outbound::Text {
            target: in_channel(Platform::Slack),
            text: "hi".into(),
            edit: Some("1.7".into()),
            edit_of: None,
        };
        assert_eq!(lookup("http://s/api", &slack, &slack_edit, 0), None);
        assert_eq!(lookup("http://d", &discord, &edit, 0), None);
        // Unknown outcomes: no answer or a 5xx.
        let known: Vec<bool> = [None, Some(200), Some(429), Some(400), Some(500), Some(503)]
            .into_iter()
            .map(outcome_known)
            .collect();
        assert_eq!(known, vec![false, true, true, true, false, false]);
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
