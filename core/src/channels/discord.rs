//! Discord: what an interaction posted to `/hooks/discord/:id` means, what the hook answers,
//! and the API calls that deliver replies.
//!
//! Discord sends the hook interactions only: the application command `/wuhu`
//! (`/wuhu text:<message>`, or its subcommands `ask text:…`, `stop`, `new`, `status`,
//! `steer text:…`) and button clicks. Mentions and other messages arrive over the Gateway
//! ([`super::gateway`]). A channel (a thread is a channel) is a session.
//!
//! A message is answered at once with a deferred response (type 5, "thinking…"): the turn's
//! reply edits that original response (`PATCH /webhooks/{app}/{token}/messages/@original`),
//! further pieces are created in the channel (`POST /channels/{id}/messages`). Commands and
//! approval clicks are answered inline (type 4). Pings are never sent: every message has
//! `allowed_mentions: {"parse": []}`.

use serde_json::{Value, json};

use super::admit::Origin;
use super::outbound::{Attempt, HttpCall, Outbound};
use super::{
    ApprovalClick, Command, CommandKind, Delivery, HookOutcome, Inbound, ReplyTarget, bounded_text,
    button_value, parse_button_value,
};

/// The application command's name.
pub const COMMAND: &str = "wuhu";

/// How long Discord takes an interaction's token: 15 minutes.
pub const INTERACTION_TOKEN_SECS: i64 = 15 * 60;
/// How long after its interaction a token is used: a minute short of
/// [`INTERACTION_TOKEN_SECS`], for a request on its way and clocks apart. Later, a reply goes to
/// the channel as a message of its own.
pub const INTERACTION_TOKEN_USABLE_SECS: i64 = INTERACTION_TOKEN_SECS - 60;

/// `PING` is answered with `PONG`.
const PONG: u64 = 1;
/// `CHANNEL_MESSAGE_WITH_SOURCE`.
const MESSAGE: u64 = 4;
/// `DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE`.
const DEFERRED: u64 = 5;
/// The `EPHEMERAL` message flag: only the person who asked sees it.
const EPHEMERAL: u64 = 64;

/// Decodes a verified interaction received at `now_secs` (unix seconds; its token is used
/// until [`INTERACTION_TOKEN_USABLE_SECS`] later).
///
/// # Errors
/// A message for a 400 (not an interaction).
pub fn parse(body: &[u8], now_secs: i64) -> Result<Delivery, String> {
    let interaction: Value =
        serde_json::from_slice(body).map_err(|_| "body is not JSON".to_string())?;
    let kind = interaction["type"]
        .as_u64()
        .ok_or("an interaction has a type")?;
    if kind == 1 {
        return Ok(Delivery::Answer(json!({ "type": PONG })));
    }
    let (Some(id), Some(token), Some(channel)) = (
        interaction["id"].as_str(),
        interaction["token"].as_str(),
        interaction["channel_id"]
            .as_str()
            .or(interaction["channel"]["id"].as_str()),
    ) else {
        return Ok(Delivery::Ignored(
            "interaction without id, token or channel",
        ));
    };
    // In a server the person is `member.user`, in a direct message `user`.
    let Some(user) = interaction["member"]["user"]["id"]
        .as_str()
        .or(interaction["user"]["id"].as_str())
    else {
        return Ok(Delivery::Ignored("interaction without user"));
    };
    let dedupe_key = format!("discord:interaction:{id}");
    let reply_to = ReplyTarget::Discord {
        channel: channel.to_string(),
        interaction: Some(token.to_string()),
        since: Some(now_secs),
    };
    let thread_key = format!("discord:{channel}");
    match kind {
        2 => Ok(parse_command(
            &interaction["data"],
            dedupe_key,
            thread_key,
            reply_to,
            user,
        )),
        3 => {
            let Some((decision, approval_id)) = interaction["data"]["custom_id"]
                .as_str()
                .and_then(parse_button_value)
            else {
                return Ok(Delivery::Ignored("not a Wuhu button"));
            };
            Ok(Delivery::Approval(ApprovalClick {
                user: user.to_string(),
                session: None,
                approval_id,
                decision,
                dedupe_key,
                reply_to: Some(reply_to.thread_only()),
                callback: None,
            }))
        }
        _ => Ok(Delivery::Ignored("interaction type not handled")),
    }
}

/// Where a verified interaction comes from: its guild (what an allowlist names); none in a
/// direct message.
pub fn origin(body: &[u8]) -> Origin {
    let interaction: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    Origin {
        place: interaction["guild_id"].as_str().map(str::to_string),
        ..Origin::default()
    }
}

fn parse_command(
    data: &Value,
    dedupe_key: String,
    thread_key: String,
    reply_to: ReplyTarget,
    user: &str,
) -> Delivery {
    if data["name"].as_str() != Some(COMMAND) {
        return Delivery::Ignored("not the /wuhu command");
    }
    let options = data["options"].as_array().cloned().unwrap_or_default();
    let text_of = |options: &[Value]| {
        options
            .iter()
            .find(|o| o["name"] == "text")
            .and_then(|o| o["value"].as_str())
            .map(|t| bounded_text(t.trim()))
            .unwrap_or_default()
    };
    // A subcommand (option type 1) names what is asked; without one the text is a message.
    let (name, text) = match options.first() {
        Some(sub) if sub["type"] == 1 => (
            sub["name"].as_str().unwrap_or_default().to_string(),
            text_of(sub["options"].as_array().map(Vec::as_slice).unwrap_or(&[])),
        ),
        _ => ("ask".to_string(), text_of(&options)),
    };
    let kind = match (name.as_str(), text.is_empty()) {
        ("ask", false) => {
            return Delivery::Message(Inbound {
                dedupe_keys: vec![dedupe_key],
                thread_key,
                reply_to,
                user: user.to_string(),
                text,
                may_start: true,
            });
        }
        ("stop", _) => CommandKind::Stop,
        ("new", _) => CommandKind::New,
        ("status", _) => CommandKind::Status,
        ("steer", false) => CommandKind::Steer(text),
        _ => return Delivery::Ignored("a /wuhu subcommand without what it needs"),
    };
    Delivery::Command(Command {
        kind,
        dedupe_keys: vec![dedupe_key],
        thread_key,
        reply_to,
        latest_thread_under: None,
        response_url: None,
        user: user.to_string(),
    })
}

/// The interaction response for what the hook did.
pub fn hook_answer(outcome: &HookOutcome) -> Value {
    let message = |content: &str, flags: u64| json!({"type": MESSAGE, "data": {"content": content, "flags": flags, "allowed_mentions": {"parse": []}}});
    match outcome {
        HookOutcome::Queued { .. } | HookOutcome::Accepted => json!({ "type": DEFERRED }),
        HookOutcome::Duplicate => message("Already received.", EPHEMERAL),
        HookOutcome::Ignored(why) => message(&format!("Nothing to do: {why}."), EPHEMERAL),
        // Only the person who asked sees why they are not let in.
        HookOutcome::Refused(text) => message(text, EPHEMERAL),
        HookOutcome::Note { text, .. } => message(text, 0),
    }
}

/// Whether an interaction's token, received at `since`, may still be used at `now_secs`
/// (unknown age: yes; Discord's refusal then sends the message to the channel, see
/// [`without_interaction`]).
pub fn token_usable(since: Option<i64>, now_secs: i64) -> bool {
    since.is_none_or(|since| now_secs.saturating_sub(since) < INTERACTION_TOKEN_USABLE_SECS)
}

/// `message` without its interaction, after Discord refused the interaction's token (expired
/// or unknown): a new message answering the interaction goes to the channel instead. An edit
/// (a progress line) has nothing to fall back to.
pub fn without_interaction(message: &Outbound) -> Option<Outbound> {
    match message {
        Outbound::Text {
            target:
                target @ ReplyTarget::Discord {
                    interaction: Some(_),
                    ..
                },
            text,
            edit: None,
            edit_of: None,
        } => Some(Outbound::text(target.thread_only(), text.clone())),
        _ => None,
    }
}

/// The API call that delivers `message` at `now_secs`: an interaction's answer edits its
/// original response while the token is usable ([`token_usable`]), else it is a channel
/// message.
pub fn request(
    api_base_url: &str,
    application_id: &str,
    bot_token: &str,
    message: &Outbound,
    now_secs: i64,
) -> HttpCall {
    let base = api_base_url.trim_end_matches('/');
    let (channel, interaction) = match message.target() {
        ReplyTarget::Discord {
            channel,
            interaction,
            since,
        } => (
            channel.clone(),
            interaction
                .clone()
                .filter(|_| token_usable(*since, now_secs)),
        ),
        other => (format!("{other:?}"), None),
    };
    let bot = ("authorization".to_string(), format!("Bot {bot_token}"));
    let json_type = ("content-type".to_string(), "application/json".to_string());
    let no_pings = json!({"parse": []});
    match message {
        Outbound::Text { text, edit, .. } => {
            let body = json!({"content": text, "allowed_mentions": no_pings}).to_string();
            match (interaction, edit) {
                // The interaction's own webhook: its token is the authorization.
                (Some(token), _) => HttpCall {
                    method: "PATCH".into(),
                    url: format!("{base}/webhooks/{application_id}/{token}/messages/@original"),
                    headers: vec![json_type],
                    body,
                },
                (None, Some(message_id)) => HttpCall {
                    method: "PATCH".into(),
                    url: format!("{base}/channels/{channel}/messages/{message_id}"),
                    headers: vec![json_type, bot],
                    body,
                },
                (None, None) => HttpCall {
                    method: "POST".into(),
                    url: format!("{base}/channels/{channel}/messages"),
                    headers: vec![json_type, bot],
                    body,
                },
            }
        }
        Outbound::Approval {
            approval_id, text, ..
        } => {
            let button = |label: &str, decision: &str, style: u64| json!({"type": 2, "style": style, "label": label, "custom_id": button_value(decision, approval_id)});
            let body = json!({
                "content": text,
                "allowed_mentions": no_pings,
                "components": [{"type": 1, "components": [
                    button("Approve", "approve", 3),
                    button("Approve for this session", "approve_session", 1),
                    button("Deny", "deny", 4),
                ]}],
            });
            HttpCall {
                method: "POST".into(),
                url: format!("{base}/channels/{channel}/messages"),
                headers: vec![json_type, bot],
                body: body.to_string(),
            }
        }
        Outbound::CallbackAnswer { text, .. } | Outbound::CommandResponse { text, .. } => {
            HttpCall {
                method: "POST".into(),
                url: format!("{base}/channels/{channel}/messages"),
                headers: vec![json_type, bot],
                body: json!({"content": text, "allowed_mentions": no_pings}).to_string(),
            }
        }
    }
}

/// What an API answer means: 2xx is sent (the message `id` is the reference for edits); a 429
/// waits the header's `Retry-After` or the body's `retry_after` (seconds, fractional).
pub fn answer(attempt: Attempt, body: &Value) -> Attempt {
    match attempt {
        Attempt::Sent(_) => Attempt::Sent(body["id"].as_str().map(str::to_string)),
        Attempt::Retry { retry_after_ms } => Attempt::Retry {
            retry_after_ms: retry_after_ms.or_else(|| {
                body["retry_after"]
                    .as_f64()
                    .and_then(|s| super::outbound::retry_after_ms(&s.to_string()))
            }),
        },
        Attempt::Refused(status) => Attempt::Refused(format!(
            "discord {status}: {}",
            body["message"].as_str().unwrap_or("unknown error")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::outbound::classify;

    const NOW: i64 = 1_800_000_000;

    fn interaction(kind: u64, data: Value) -> Delivery {
        let body = json!({"id": "I1", "application_id": "app", "type": kind, "token": "tok",
            "channel_id": "C1", "member": {"user": {"id": "U1"}}, "data": data});
        parse(body.to_string().as_bytes(), NOW).unwrap()
    }

    fn sub(name: &str, text: Option<&str>) -> Value {
        let options: Vec<Value> = text
            .map(|t| vec![json!({"name": "text", "type": 3, "value": t})])
            .unwrap_or_default();
        json!({"name": "wuhu", "type": 1, "options": [{"name": name, "type": 1, "options": options}]})
    }

    #[test]
    fn ping_commands_and_clicks() {
        assert_eq!(
            parse(br#"{"type":1,"id":"x"}"#, NOW).unwrap(),
            Delivery::Answer(json!({"type": 1}))
        );
        let direct = json!({"name": "wuhu", "type": 1, "options": [{"name": "text", "type": 3, "value": " hi "}]});
        for data in [direct, sub("ask", Some("hi"))] {
            let Delivery::Message(m) = interaction(2, data.clone()) else {
                panic!("{data}")
            };
            assert_eq!(
                (
                    m.thread_key.as_str(),
                    m.user.as_str(),
                    m.text.as_str(),
                    m.may_start
                ),
                ("discord:C1", "U1", "hi", true)
            );
            assert_eq!(m.dedupe_keys, vec!["discord:interaction:I1"]);
            assert_eq!(
                m.reply_to,
                ReplyTarget::Discord {
                    channel: "C1".into(),
                    interaction: Some("tok".into()),
                    since: Some(NOW),
                }
            );
        }
        let commands = [
            (sub("stop", None), CommandKind::Stop),
            (sub("new", None), CommandKind::New),
            (sub("status", None), CommandKind::Status),
            (
                sub("steer", Some("left")),
                CommandKind::Steer("left".into()),
            ),
        ];
        for (data, want) in commands {
            let Delivery::Command(c) = interaction(2, data.clone()) else {
                panic!("{data}")
            };
            assert_eq!(c.kind, want);
        }
        for data in [
            sub("steer", None),
            sub("ask", None),
            sub("dance", None),
            json!({"name": "other", "type": 1}),
        ] {
            assert!(
                matches!(interaction(2, data.clone()), Delivery::Ignored(_)),
                "{data}"
            );
        }
        let Delivery::Approval(a) = interaction(
            3,
            json!({"custom_id": button_value("deny", "A1"), "component_type": 2}),
        ) else {
            panic!()
        };
        assert_eq!(
            (a.user.as_str(), a.decision.as_str(), a.approval_id.as_str()),
            ("U1", "deny", "A1")
        );
        assert_eq!(
            a.reply_to,
            Some(ReplyTarget::Discord {
                channel: "C1".into(),
                interaction: None,
                since: None,
            })
        );
        assert!(matches!(
            interaction(3, json!({"custom_id": "other:thing:x"})),
            Delivery::Ignored(_)
        ));
        // A direct message names the person in `user`.
        let dm = json!({"id": "I2", "type": 2, "token": "t", "channel_id": "D1", "user": {"id": "U9"},
            "data": {"name": "wuhu", "options": [{"name": "text", "type": 3, "value": "x"}]}});
        let Delivery::Message(m) = parse(dm.to_string().as_bytes(), NOW).unwrap() else {
            panic!()
        };
        assert_eq!(m.user, "U9");
        assert!(parse(b"{}", NOW).is_err());
    }

    #[test]
    fn answers_to_the_hook() {
        assert_eq!(
            hook_answer(&HookOutcome::Queued {
                session: "S".into(),
                queued: "Q".into()
            }),
            json!({"type": 5})
        );
        let note = hook_answer(&HookOutcome::Note {
            ok: true,
            text: "stopped".into(),
        });
        assert_eq!(note["type"], 4);
        assert_eq!(note["data"]["content"], "stopped");
        assert_eq!(note["data"]["allowed_mentions"], json!({"parse": []}));
        assert_eq!(hook_answer(&HookOutcome::Duplicate)["data"]["flags"], 64);
    }

    #[test]
    fn api_calls() {
        let with_interaction = ReplyTarget::Discord {
            channel: "C1".into(),
            interaction: Some("tok".into()),
            since: Some(NOW),
        };
        let channel = with_interaction.thread_only();
        let cases = [
            (
                Outbound::text(with_interaction.clone(), "a".into()),
                "PATCH",
                "http://127.0.0.1:1/api/webhooks/app/tok/messages/@original",
                false,
            ),
            (
                Outbound::text(channel.clone(), "b".into()),
                "POST",
                "http://127.0.0.1:1/api/channels/C1/messages",
                true,
            ),
            (
                Outbound::Text {
                    target: channel.clone(),
                    text: "c".into(),
                    edit: Some("M9".into()),
                    edit_of: None,
                },
                "PATCH",
                "http://127.0.0.1:1/api/channels/C1/messages/M9",
                true,
            ),
        ];
        for (message, method, url, authorized) in cases {
            let call = request("http://127.0.0.1:1/api/", "app", "bot-token", &message, NOW);
            assert_eq!((call.method.as_str(), call.url.as_str()), (method, url));
            assert_eq!(
                call.headers
                    .contains(&("authorization".into(), "Bot bot-token".into())),
                authorized,
                "{url}"
            );
            let body: Value = serde_json::from_str(&call.body).unwrap();
            assert_eq!(body["allowed_mentions"], json!({"parse": []}));
        }
        let approval = request(
            "https://discord.com/api/v10",
            "app",
            "t",
            &Outbound::Approval {
                target: channel,
                session: "S".into(),
                approval_id: "A".into(),
                text: "ok?".into(),
            },
            NOW,
        );
        let body: Value = serde_json::from_str(&approval.body).unwrap();
        assert_eq!(
            body["components"][0]["components"][0]["custom_id"],
            "approve:A"
        );
        assert!(button_value("approve_session", &"f".repeat(36)).len() <= 100);
    }

    /// An interaction's token is used for its first 14 minutes; later (Discord takes it 15) the
    /// answer is a channel message, and so is an answer Discord refused for its token. Edits
    /// have nothing to fall back to.
    #[test]
    fn expired_interactions_answer_in_the_channel() {
        let answer = |received: Option<i64>| {
            Outbound::text(
                ReplyTarget::Discord {
                    channel: "C1".into(),
                    interaction: Some("tok".into()),
                    since: received,
                },
                "the reply".into(),
            )
        };
        let cases = [
            (Some(NOW), "PATCH webhooks/app/tok/messages/@original"),
            (
                Some(NOW - 13 * 60),
                "PATCH webhooks/app/tok/messages/@original",
            ),
            (
                Some(NOW - INTERACTION_TOKEN_USABLE_SECS + 1),
                "PATCH webhooks/app/tok/messages/@original",
            ),
            (
                Some(NOW - INTERACTION_TOKEN_USABLE_SECS),
                "POST channels/C1/messages",
            ),
            (
                Some(NOW - INTERACTION_TOKEN_SECS),
                "POST channels/C1/messages",
            ),
            (Some(NOW - 86_400), "POST channels/C1/messages"),
            // Stored before the time was kept: tried, and a refusal falls back.
            (None, "PATCH webhooks/app/tok/messages/@original"),
        ];
        for (received, want) in cases {
            let call = request("https://d/api", "app", "bot", &answer(received), NOW);
            let got = format!(
                "{} {}",
                call.method,
                call.url.trim_start_matches("https://d/api/")
            );
            assert_eq!(got, want, "{received:?}");
            // Only the channel route carries the bot token.
            assert_eq!(
                call.headers.iter().any(|(k, _)| k == "authorization"),
                want.starts_with("POST"),
                "{received:?}"
            );
            let body: Value = serde_json::from_str(&call.body).unwrap();
            assert_eq!(body["content"], "the reply");
        }
        let fallback = without_interaction(&answer(Some(NOW))).expect("a channel message");
        let call = request("https://d/api", "app", "bot", &fallback, NOW);
        assert_eq!(
            (call.method.as_str(), call.url.as_str()),
            ("POST", "https://d/api/channels/C1/messages")
        );
        let edit = Outbound::Text {
            target: ReplyTarget::Discord {
                channel: "C1".into(),
                interaction: Some("tok".into()),
                since: Some(NOW),
            },
            text: "Working…".into(),
            edit: Some("M1".into()),
            edit_of: None,
        };
        assert_eq!(without_interaction(&edit), None);
        assert_eq!(
            without_interaction(&Outbound::text(
                answer(None).target().thread_only(),
                "x".into()
            )),
            None
        );
    }

    #[test]
    fn api_answers() {
        let read = |status: u16, header: Option<&str>, body: Value| {
            answer(classify(status, header), &body)
        };
        assert_eq!(
            read(200, None, json!({"id": "M1"})),
            Attempt::Sent(Some("M1".into()))
        );
        assert_eq!(
            read(
                429,
                None,
                json!({"message": "You are being rate limited.", "retry_after": 0.5, "global": false})
            ),
            Attempt::Retry {
                retry_after_ms: Some(500)
            }
        );
        assert_eq!(
            read(429, Some("2"), json!({"retry_after": 0.5})),
            Attempt::Retry {
                retry_after_ms: Some(2000)
            }
        );
        assert!(matches!(
            read(404, None, json!({"message": "Unknown Channel", "code": 10003})),
            Attempt::Refused(why) if why.contains("Unknown Channel")
        ));
    }
}
