//! Slack: what a delivery to `/hooks/slack/:id` means, and the Web API calls that answer it.
//!
//! One URL takes the Events API (JSON), Interactivity (form with `payload`) and slash commands
//! (form with `command`). Bot messages (ours included) and edits are ignored, so the bot never
//! answers itself. A mention arrives twice when the app subscribes to both `app_mention` and
//! `message.*` (two event ids); the message key (`channel` + `ts`) makes it one.

use serde_json::{Value, json};

use super::outbox::{HttpCall, Outbound};
use super::{ApprovalClick, Delivery, Inbound, ReplyTarget, bounded_text};

/// Decodes a verified delivery from its content type and raw body.
///
/// # Errors
/// A message for a 400 (the body is not what Slack sends).
pub fn parse(content_type: &str, body: &[u8]) -> Result<Delivery, String> {
    if content_type.starts_with("application/x-www-form-urlencoded") {
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        if let Some(payload) = get("payload") {
            let payload: Value =
                serde_json::from_str(payload).map_err(|_| "payload is not JSON".to_string())?;
            return Ok(parse_interaction(&payload));
        }
        return Ok(Delivery::Ignored("slash commands are not supported yet"));
    }
    let value: Value = serde_json::from_slice(body).map_err(|_| "body is not JSON".to_string())?;
    match value["type"].as_str() {
        Some("url_verification") => Ok(Delivery::Answer(json!({
            "challenge": value["challenge"]
                .as_str()
                .ok_or("url_verification without challenge")?,
        }))),
        Some("event_callback") => Ok(parse_event(&value)),
        _ => Ok(Delivery::Ignored("not an event")),
    }
}

fn parse_event(value: &Value) -> Delivery {
    let event = &value["event"];
    let kind = event["type"].as_str().unwrap_or_default();
    if kind != "message" && kind != "app_mention" {
        return Delivery::Ignored("event type not handled");
    }
    if event.get("bot_id").is_some_and(|b| !b.is_null())
        || event.get("subtype").is_some_and(|s| !s.is_null())
    {
        return Delivery::Ignored("bot message or edit");
    }
    let (Some(channel), Some(user), Some(ts)) = (
        event["channel"].as_str(),
        event["user"].as_str(),
        event["ts"].as_str(),
    ) else {
        return Delivery::Ignored("message without channel, user or ts");
    };
    let direct = event["channel_type"].as_str() == Some("im");
    let thread_ts = event["thread_ts"].as_str();
    let (thread_key, reply_thread) = if direct {
        // A direct message conversation is one session; its threads stay in it.
        (format!("slack:{channel}"), thread_ts.map(str::to_string))
    } else {
        let root = thread_ts.unwrap_or(ts);
        (format!("slack:{channel}:{root}"), Some(root.to_string()))
    };
    let mut dedupe_keys = vec![format!("slack:msg:{channel}:{ts}")];
    if let Some(event_id) = value["event_id"].as_str() {
        dedupe_keys.push(format!("slack:event:{event_id}"));
    }
    let text = strip_mentions(event["text"].as_str().unwrap_or_default());
    if text.is_empty() {
        return Delivery::Ignored("empty message");
    }
    Delivery::Message(Inbound {
        dedupe_keys,
        thread_key,
        reply_to: ReplyTarget::Slack {
            channel: channel.to_string(),
            thread_ts: reply_thread,
        },
        user: user.to_string(),
        text: bounded_text(&text),
        may_start: direct || kind == "app_mention",
    })
}

/// Removes user mentions (`<@U123>`) at the start, where people address the bot.
fn strip_mentions(text: &str) -> String {
    let mut rest = text.trim_start();
    while let Some(after) = rest.strip_prefix("<@") {
        match after.find('>') {
            Some(end) => rest = after[end + 1..].trim_start(),
            None => break,
        }
    }
    rest.trim_end().to_string()
}

/// The `value` of an approval button: `<decision>:<session>:<approval>`.
pub fn button_value(decision: &str, session: &str, approval_id: &str) -> String {
    format!("{decision}:{session}:{approval_id}")
}

fn parse_interaction(payload: &Value) -> Delivery {
    if payload["type"].as_str() != Some("block_actions") {
        return Delivery::Ignored("interaction type not handled");
    }
    let Some(user) = payload["user"]["id"].as_str() else {
        return Delivery::Ignored("interaction without user");
    };
    let Some(action) = payload["actions"].as_array().and_then(|a| a.first()) else {
        return Delivery::Ignored("interaction without action");
    };
    let value = action["value"].as_str().unwrap_or_default();
    let mut parts = value.splitn(3, ':');
    let (Some(decision), Some(session), Some(approval_id)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Delivery::Ignored("not a Wuhu button");
    };
    if !matches!(decision, "approve" | "approve_session" | "deny") {
        return Delivery::Ignored("not a Wuhu button");
    }
    let action_ts = action["action_ts"].as_str().unwrap_or_default();
    let reply_to = payload["channel"]["id"]
        .as_str()
        .map(|channel| ReplyTarget::Slack {
            channel: channel.to_string(),
            thread_ts: payload["message"]["thread_ts"]
                .as_str()
                .or(payload["container"]["thread_ts"].as_str())
                .map(str::to_string),
        });
    Delivery::Approval(ApprovalClick {
        user: user.to_string(),
        session: Some(session.to_string()),
        approval_id: approval_id.to_string(),
        decision: decision.to_string(),
        dedupe_key: format!("slack:click:{user}:{approval_id}:{action_ts}"),
        reply_to,
        callback: None,
    })
}

/// The Web API call that delivers `message` (`chat.postMessage`, or `chat.update` for an edit).
pub fn request(api_base_url: &str, bot_token: &str, message: &Outbound) -> HttpCall {
    let (channel, thread_ts) = match message.target() {
        ReplyTarget::Slack { channel, thread_ts } => (channel.clone(), thread_ts.clone()),
        // Not a Slack place: Slack answers channel_not_found and the message is dropped.
        other => (format!("{other:?}"), None),
    };
    let mut body = json!({"channel": channel, "unfurl_links": false});
    if let Some(ts) = thread_ts {
        body["thread_ts"] = json!(ts);
    }
    let mut method = "chat.postMessage";
    match message {
        Outbound::Text { text, edit, .. } => {
            body["text"] = json!(text);
            if let Some(ts) = edit {
                method = "chat.update";
                body["ts"] = json!(ts);
            }
        }
        Outbound::CallbackAnswer { text, .. } => body["text"] = json!(text),
        Outbound::Approval {
            session,
            approval_id,
            text,
            ..
        } => {
            let button = |label: &str, decision: &str, style: Option<&str>| {
                let mut b = json!({
                    "type": "button",
                    "text": {"type": "plain_text", "text": label},
                    "action_id": format!("wuhu_{decision}"),
                    "value": button_value(decision, session, approval_id),
                });
                if let Some(style) = style {
                    b["style"] = json!(style);
                }
                b
            };
            body["text"] = json!(text);
            body["blocks"] = json!([
                {"type": "section", "text": {"type": "mrkdwn", "text": text}},
                {"type": "actions", "elements": [
                    button("Approve", "approve", Some("primary")),
                    button("Approve for this session", "approve_session", None),
                    button("Deny", "deny", Some("danger")),
                ]},
            ]);
        }
    }
    HttpCall {
        method: "POST".into(),
        url: format!("{}/{method}", api_base_url.trim_end_matches('/')),
        headers: vec![
            (
                "content-type".into(),
                "application/json; charset=utf-8".into(),
            ),
            ("authorization".into(), format!("Bearer {bot_token}")),
        ],
        body: body.to_string(),
    }
}

/// The message reference (`ts`) of a successful answer, or the error Slack gave. Slack answers
/// `200 {"ok":false,"error":…}` for most failures; `ratelimited` comes as a 429.
pub fn answer(body: &Value) -> Result<Option<String>, String> {
    if body["ok"].as_bool() == Some(true) {
        Ok(body["ts"].as_str().map(str::to_string))
    } else {
        Err(body["error"]
            .as_str()
            .unwrap_or("unknown_error")
            .to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event: Value) -> Delivery {
        let body = json!({"type": "event_callback", "event_id": "Ev1", "event": event});
        parse("application/json", body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn events() {
        let Delivery::Message(m) = event(
            json!({"type":"app_mention","channel":"C1","user":"U1","text":"<@UBOT> hello","ts":"10.1"}),
        ) else {
            panic!()
        };
        assert_eq!(m.thread_key, "slack:C1:10.1");
        assert_eq!(m.text, "hello");
        assert!(m.may_start);
        assert_eq!(
            m.reply_to,
            ReplyTarget::Slack {
                channel: "C1".into(),
                thread_ts: Some("10.1".into())
            }
        );
        assert_eq!(m.dedupe_keys, vec!["slack:msg:C1:10.1", "slack:event:Ev1"]);
        // A reply in the thread: same key, continues only.
        let Delivery::Message(m) = event(
            json!({"type":"message","channel":"C1","user":"U2","text":"me too","ts":"11.0","thread_ts":"10.1","channel_type":"channel"}),
        ) else {
            panic!()
        };
        assert_eq!(m.thread_key, "slack:C1:10.1");
        assert!(!m.may_start);
        // A DM starts; its key is the conversation.
        let Delivery::Message(m) = event(
            json!({"type":"message","channel":"D9","user":"U1","text":"hi","ts":"12.0","channel_type":"im"}),
        ) else {
            panic!()
        };
        assert_eq!((m.thread_key.as_str(), m.may_start), ("slack:D9", true));
        assert_eq!(
            m.reply_to,
            ReplyTarget::Slack {
                channel: "D9".into(),
                thread_ts: None
            }
        );
        let ignored = [
            // Our own replies come back as message events with a bot_id (and the bot user).
            json!({"type":"message","channel":"C1","user":"UBOT","bot_id":"B1","text":"our reply","ts":"13.0"}),
            json!({"type":"message","subtype":"message_changed","channel":"C1","ts":"13.0"}),
            json!({"type":"reaction_added","user":"U1"}),
            json!({"type":"app_mention","channel":"C1","user":"U1","text":"<@UBOT>","ts":"14.0"}),
            json!({"type":"app_mention","channel":"C1","text":"no user","ts":"14.0"}),
        ];
        for e in ignored {
            assert!(matches!(event(e.clone()), Delivery::Ignored(_)), "{e}");
        }
        // The mention's two deliveries (app_mention, message) share the message key.
        let Delivery::Message(a) =
            event(json!({"type":"app_mention","channel":"C1","user":"U1","text":"x","ts":"15.0"}))
        else {
            panic!()
        };
        let Delivery::Message(b) = event(
            json!({"type":"message","channel":"C1","user":"U1","text":"<@UBOT> x","ts":"15.0"}),
        ) else {
            panic!()
        };
        assert_eq!(a.dedupe_keys[0], b.dedupe_keys[0]);
    }

    #[test]
    fn challenge_and_garbage() {
        let d = parse(
            "application/json",
            br#"{"type":"url_verification","challenge":"abc","token":"t"}"#,
        )
        .unwrap();
        assert_eq!(d, Delivery::Answer(json!({"challenge": "abc"})));
        assert!(parse("application/json", b"{not json").is_err());
        assert!(parse("application/json", br#"{"type":"url_verification"}"#).is_err());
        assert!(matches!(
            parse("application/json", b"{}").unwrap(),
            Delivery::Ignored(_)
        ));
        assert!(parse("application/x-www-form-urlencoded", b"payload=%7Bx").is_err());
    }

    #[test]
    fn button_clicks() {
        let payload = json!({"type":"block_actions","user":{"id":"U2"},"actions":[{"action_id":"wuhu_approve","value":button_value("approve","S1","A1"),"action_ts":"99.1"}]});
        let body = format!(
            "payload={}",
            url::form_urlencoded::byte_serialize(payload.to_string().as_bytes())
                .collect::<String>()
        );
        let Delivery::Approval(click) =
            parse("application/x-www-form-urlencoded", body.as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (
                click.user.as_str(),
                click.session.as_deref().unwrap_or_default(),
                click.approval_id.as_str(),
                click.decision.as_str()
            ),
            ("U2", "S1", "A1", "approve")
        );
        for value in ["bogus:S1:A1", "approve", ""] {
            let payload =
                json!({"type":"block_actions","user":{"id":"U2"},"actions":[{"value":value}]});
            let body = format!(
                "payload={}",
                url::form_urlencoded::byte_serialize(payload.to_string().as_bytes())
                    .collect::<String>()
            );
            assert!(
                matches!(
                    parse("application/x-www-form-urlencoded", body.as_bytes()).unwrap(),
                    Delivery::Ignored(_)
                ),
                "{value}"
            );
        }
    }

    #[test]
    fn web_api_calls() {
        let target = ReplyTarget::Slack {
            channel: "C1".into(),
            thread_ts: Some("10.1".into()),
        };
        let post = request(
            "http://127.0.0.1:1/api/",
            "xoxb-1",
            &Outbound::Text {
                target: target.clone(),
                text: "hi".into(),
                edit: None,
                edit_of: None,
            },
        );
        assert_eq!(post.url, "http://127.0.0.1:1/api/chat.postMessage");
        let body: Value = serde_json::from_str(&post.body).unwrap();
        assert_eq!(
            (
                body["channel"].as_str(),
                body["thread_ts"].as_str(),
                body["text"].as_str()
            ),
            (Some("C1"), Some("10.1"), Some("hi"))
        );
        assert!(
            post.headers
                .contains(&("authorization".into(), "Bearer xoxb-1".into()))
        );
        let update = request(
            "https://slack.com/api",
            "t",
            &Outbound::Text {
                target: target.clone(),
                text: "x".into(),
                edit: Some("11.0".into()),
                edit_of: None,
            },
        );
        assert!(update.url.ends_with("/chat.update"));
        let approval = request(
            "https://slack.com/api",
            "t",
            &Outbound::Approval {
                target,
                session: "S".into(),
                approval_id: "A".into(),
                text: "ok?".into(),
            },
        );
        let body: Value = serde_json::from_str(&approval.body).unwrap();
        assert_eq!(body["blocks"][1]["elements"][2]["value"], "deny:S:A");
        assert_eq!(
            answer(&json!({"ok":true,"ts":"1.2"})),
            Ok(Some("1.2".into()))
        );
        assert_eq!(
            answer(&json!({"ok":false,"error":"channel_not_found"})),
            Err("channel_not_found".into())
        );
    }
}
