//! Telegram: what an update posted to `/hooks/telegram/:id` means, and the Bot API calls that
//! answer it (`sendMessage`, `editMessageText`, `answerCallbackQuery`, HTML `parse_mode`).
//!
//! A chat is a thread; in a forum supergroup each topic (`message_thread_id` of a topic
//! message) is its own. A private chat, a message that starts with a mention (`@bot …`), a
//! `/wuhu …` command or a reply to the bot starts a session; other messages of a group only
//! continue one (with privacy mode on, Telegram only sends those anyway). `/stop`, `/new`,
//! `/status` and `/steer …` are commands. Bots' messages and edits are ignored.

use serde_json::{Value, json};

use super::admit::Origin;
use super::outbound::{Attempt, HttpCall, Outbound};
use super::{
    ApprovalClick, Command, Delivery, Inbound, ReplyTarget, bounded_text, button_value,
    parse_button_value, parse_command,
};

/// Decodes a verified update.
///
/// # Errors
/// A message for a 400 (not an update).
pub fn parse(body: &[u8]) -> Result<Delivery, String> {
    let update: Value = serde_json::from_slice(body).map_err(|_| "body is not JSON".to_string())?;
    let update_id = update["update_id"]
        .as_i64()
        .ok_or("an update has an update_id")?;
    let dedupe_key = format!("telegram:update:{update_id}");
    if let Some(query) = update.get("callback_query") {
        return Ok(parse_click(query, dedupe_key));
    }
    let Some(message) = update.get("message") else {
        return Ok(Delivery::Ignored("update type not handled"));
    };
    if message["from"]["is_bot"].as_bool() == Some(true) {
        return Ok(Delivery::Ignored("a bot's message"));
    }
    let (Some(user), Some(text)) = (message["from"]["id"].as_i64(), message["text"].as_str())
    else {
        return Ok(Delivery::Ignored("not a person's text message"));
    };
    let Some(reply_to) = target(message) else {
        return Ok(Delivery::Ignored("message without chat"));
    };
    let thread_key = thread_key(&reply_to);
    let user = user.to_string();
    let dedupe_keys = vec![dedupe_key];
    if let Some(kind) = parse_command(text) {
        return Ok(Delivery::Command(Command {
            kind,
            dedupe_keys,
            thread_key,
            latest_thread_under: None,
            reply_to,
            response_url: None,
            user,
        }));
    }
    let private = message["chat"]["type"].as_str() == Some("private");
    let reply_to_bot = message["reply_to_message"]["from"]["is_bot"].as_bool() == Some(true);
    let (text, addressed) = addressed_text(message, text);
    if text.is_empty() {
        return Ok(Delivery::Ignored("empty message"));
    }
    if text.starts_with('/') && !addressed {
        // `/start` and other bots' commands.
        return Ok(Delivery::Ignored("not a Wuhu command"));
    }
    Ok(Delivery::Message(Inbound {
        dedupe_keys,
        thread_key,
        reply_to,
        user,
        text: bounded_text(&text),
        may_start: private || addressed || reply_to_bot,
    }))
}

/// Where a verified update comes from: its chat (what an allowlist names), for a message or
/// a button click alike.
pub fn origin(body: &[u8]) -> Origin {
    let update: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let chat = update["message"]["chat"]["id"]
        .as_i64()
        .or(update["callback_query"]["message"]["chat"]["id"].as_i64());
    Origin {
        place: chat.map(|id| id.to_string()),
        ..Origin::default()
    }
}

/// The text without the way it addressed the bot (a leading `@mention` or `/wuhu`), and
/// whether it did.
fn addressed_text(message: &Value, text: &str) -> (String, bool) {
    let trimmed = text.trim();
    let leading_mention = message["entities"].as_array().is_some_and(|entities| {
        entities
            .iter()
            .any(|e| e["type"] == "mention" && e["offset"] == 0)
    });
    let first_word_end = trimmed.find(char::is_whitespace).unwrap_or(trimmed.len());
    let first_word = &trimmed[..first_word_end];
    let is_wuhu_command = first_word
        .strip_prefix("/wuhu")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('@'));
    if (leading_mention && first_word.starts_with('@')) || is_wuhu_command {
        (trimmed[first_word_end..].trim().to_string(), true)
    } else {
        (trimmed.to_string(), false)
    }
}

/// The chat (and topic) a message is in.
fn target(message: &Value) -> Option<ReplyTarget> {
    let chat = message["chat"]["id"].as_i64()?;
    let topic = if message["is_topic_message"].as_bool() == Some(true) {
        message["message_thread_id"].as_i64()
    } else {
        None
    };
    Some(ReplyTarget::Telegram { chat, topic })
}

fn thread_key(target: &ReplyTarget) -> String {
    match target {
        ReplyTarget::Telegram {
            chat,
            topic: Some(topic),
        } => format!("telegram:{chat}:{topic}"),
        ReplyTarget::Telegram { chat, topic: None } => format!("telegram:{chat}"),
        other => format!("telegram:{other:?}"),
    }
}

fn parse_click(query: &Value, dedupe_key: String) -> Delivery {
    let (Some(user), Some(id), Some(data)) = (
        query["from"]["id"].as_i64(),
        query["id"].as_str(),
        query["data"].as_str(),
    ) else {
        return Delivery::Ignored("callback query without user, id or data");
    };
    let Some((decision, approval_id)) = parse_button_value(data) else {
        return Delivery::Ignored("not a Wuhu button");
    };
    Delivery::Approval(ApprovalClick {
        user: user.to_string(),
        session: None,
        approval_id,
        decision,
        dedupe_key,
        reply_to: target(&query["message"]),
        callback: Some(id.to_string()),
    })
}

/// The Bot API call that delivers `message`.
pub fn request(api_base_url: &str, bot_token: &str, message: &Outbound) -> HttpCall {
    let (chat, topic) = match message.target() {
        ReplyTarget::Telegram { chat, topic } => (json!(chat), *topic),
        // Not a Telegram place: Telegram answers "chat not found" and it is dropped.
        other => (json!(format!("{other:?}")), None),
    };
    let mut body = json!({"chat_id": chat});
    let method = match message {
        Outbound::Text { text, edit, .. } => {
            body["text"] = json!(text);
            body["parse_mode"] = json!("HTML");
            body["link_preview_options"] = json!({"is_disabled": true});
            match edit.as_deref().map(str::parse::<i64>) {
                Some(Ok(message_id)) => {
                    body["message_id"] = json!(message_id);
                    "editMessageText"
                }
                _ => "sendMessage",
            }
        }
        Outbound::Approval {
            approval_id, text, ..
        } => {
            body["text"] = json!(text);
            body["parse_mode"] = json!("HTML");
            let button = |label: &str, decision: &str| json!({"text": label, "callback_data": button_value(decision, approval_id)});
            body["reply_markup"] = json!({"inline_keyboard": [[
                button("Approve", "approve"),
                button("Approve for this session", "approve_session"),
                button("Deny", "deny"),
            ]]});
            "sendMessage"
        }
        Outbound::CallbackAnswer {
            callback_id, text, ..
        } => {
            body = json!({"callback_query_id": callback_id, "text": text});
            "answerCallbackQuery"
        }
        // Slack's only; a plain message here.
        Outbound::CommandResponse { text, .. } => {
            body["text"] = json!(text);
            body["parse_mode"] = json!("HTML");
            "sendMessage"
        }
    };
    if let Some(topic) = topic
        && method == "sendMessage"
    {
        body["message_thread_id"] = json!(topic);
    }
    HttpCall {
        method: "POST".into(),
        url: format!(
            "{}/bot{bot_token}/{method}",
            api_base_url.trim_end_matches('/')
        ),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_string(),
    }
}

/// What a Bot API answer means: `{"ok":true,"result":{"message_id":…}}` is sent (the id is
/// the reference for edits); a 429 waits `parameters.retry_after` seconds when no header said;
/// "message is not modified" (an edit to the same text) counts as sent.
pub fn answer(attempt: Attempt, body: &Value) -> Attempt {
    let description = body["description"].as_str().unwrap_or("unknown error");
    match attempt {
        Attempt::Sent(_) if body["ok"] == json!(true) => {
            Attempt::Sent(body["result"]["message_id"].as_i64().map(|m| m.to_string()))
        }
        Attempt::Sent(_) => Attempt::Refused(format!("telegram: {description}")),
        Attempt::Retry { retry_after_ms } => Attempt::Retry {
            retry_after_ms: retry_after_ms.or_else(|| {
                body["parameters"]["retry_after"]
                    .as_u64()
                    .map(|s| (s * 1000).min(super::outbound::MAX_BACKOFF_MS))
            }),
        },
        Attempt::Refused(_) if description.contains("message is not modified") => {
            Attempt::Sent(None)
        }
        Attempt::Refused(status) => Attempt::Refused(format!("telegram {status}: {description}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::CommandKind;
    use crate::channels::outbound::classify;

    fn update(message: Value) -> Delivery {
        parse(
            json!({"update_id": 7, "message": message})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    fn group(text: &str, extra: Value) -> Value {
        let mut m = json!({"message_id": 1, "from": {"id": 42, "is_bot": false, "first_name": "Ann"},
            "chat": {"id": -100, "type": "supergroup"}, "text": text});
        if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
            m.extend(extra.clone());
        }
        m
    }

    #[test]
    fn messages_and_who_may_start() {
        let mention = json!({"entities": [{"type": "mention", "offset": 0, "length": 8}]});
        let topic = json!({"is_topic_message": true, "message_thread_id": 9});
        let reply = json!({"reply_to_message": {"from": {"id": 1, "is_bot": true}}});
        // (message, thread key, text, may start)
        let cases = [
            (
                group("@wuhubot hi there", mention.clone()),
                "telegram:-100",
                "hi there",
                true,
            ),
            (group("/wuhu hi", json!({})), "telegram:-100", "hi", true),
            (
                group("/wuhu@wuhubot hi", json!({})),
                "telegram:-100",
                "hi",
                true,
            ),
            (
                group("just talk", json!({})),
                "telegram:-100",
                "just talk",
                false,
            ),
            (
                group("in a topic", topic),
                "telegram:-100:9",
                "in a topic",
                false,
            ),
            (
                group("answering you", reply),
                "telegram:-100",
                "answering you",
                true,
            ),
            (
                json!({"message_id": 2, "from": {"id": 42}, "chat": {"id": 42, "type": "private"}, "text": "dm"}),
                "telegram:42",
                "dm",
                true,
            ),
        ];
        for (message, key, text, may_start) in cases {
            let Delivery::Message(m) = update(message.clone()) else {
                panic!("{message}")
            };
            assert_eq!(
                (m.thread_key.as_str(), m.text.as_str(), m.may_start),
                (key, text, may_start),
                "{message}"
            );
            assert_eq!(m.user, "42");
            assert_eq!(m.dedupe_keys, vec!["telegram:update:7"]);
        }
        // A reply in a plain group is not a topic: same thread as the group.
        let Delivery::Message(m) = update(group(
            "x",
            json!({"message_thread_id": 5, "is_topic_message": false}),
        )) else {
            panic!()
        };
        assert_eq!(
            m.reply_to,
            ReplyTarget::Telegram {
                chat: -100,
                topic: None
            }
        );
        let ignored = [
            group("from a bot", json!({"from": {"id": 1, "is_bot": true}})),
            json!({"message_id": 1, "from": {"id": 42}, "chat": {"id": 1, "type": "private"}, "photo": []}),
            group("/start", json!({})),
            group("@wuhubot", mention),
        ];
        for message in ignored {
            assert!(
                matches!(update(message.clone()), Delivery::Ignored(_)),
                "{message}"
            );
        }
        assert!(matches!(
            parse(br#"{"update_id":8,"edited_message":{}}"#).unwrap(),
            Delivery::Ignored(_)
        ));
        assert!(parse(br#"{"message":{}}"#).is_err());
        assert!(parse(b"nope").is_err());
    }

    #[test]
    fn commands() {
        let cases = [
            ("/stop", CommandKind::Stop),
            ("/stop@wuhubot", CommandKind::Stop),
            ("/new", CommandKind::New),
            ("/STATUS", CommandKind::Status),
            ("/steer  turn left ", CommandKind::Steer("turn left".into())),
        ];
        for (text, want) in cases {
            let Delivery::Command(c) = update(group(text, json!({}))) else {
                panic!("{text}")
            };
            assert_eq!(c.kind, want, "{text}");
            assert_eq!(c.thread_key, "telegram:-100");
        }
        // `/steer` without text is no command (and no Wuhu message).
        assert!(matches!(
            update(group("/steer", json!({}))),
            Delivery::Ignored(_)
        ));
    }

    #[test]
    fn button_clicks() {
        let click = |data: &str| {
            parse(
                json!({"update_id": 11, "callback_query": {"id": "cb1", "from": {"id": 42},
                    "message": {"message_id": 3, "chat": {"id": -100}, "is_topic_message": true, "message_thread_id": 9},
                    "data": data}})
                .to_string()
                .as_bytes(),
            )
            .unwrap()
        };
        let Delivery::Approval(a) = click(&button_value("approve_session", "A1")) else {
            panic!()
        };
        assert_eq!(
            (a.user.as_str(), a.approval_id.as_str(), a.decision.as_str()),
            ("42", "A1", "approve_session")
        );
        assert_eq!(a.callback.as_deref(), Some("cb1"));
        assert_eq!(a.dedupe_key, "telegram:update:11");
        assert_eq!(
            a.reply_to,
            Some(ReplyTarget::Telegram {
                chat: -100,
                topic: Some(9)
            })
        );
        for data in ["maybe:A1", "approve", "approve:S:A", ""] {
            assert!(matches!(click(data), Delivery::Ignored(_)), "{data}");
        }
        // Telegram's callback_data takes at most 64 bytes.
        let longest = button_value("approve_session", &"f".repeat(36));
        assert!(longest.len() <= 64, "{}", longest.len());
    }

    #[test]
    fn bot_api_calls() {
        let topic = ReplyTarget::Telegram {
            chat: -100,
            topic: Some(9),
        };
        let send = request(
            "http://127.0.0.1:1/",
            "123:ABC",
            &Outbound::text(topic.clone(), "<b>hi</b>".into()),
        );
        assert_eq!(send.url, "http://127.0.0.1:1/bot123:ABC/sendMessage");
        let body: Value = serde_json::from_str(&send.body).unwrap();
        assert_eq!(
            body,
            json!({"chat_id": -100, "message_thread_id": 9, "text": "<b>hi</b>", "parse_mode": "HTML", "link_preview_options": {"is_disabled": true}})
        );
        let edit = request(
            "https://api.telegram.org",
            "t",
            &Outbound::Text {
                target: topic.clone(),
                text: "x".into(),
                edit: Some("55".into()),
                edit_of: None,
            },
        );
        assert!(edit.url.ends_with("/editMessageText"));
        let body: Value = serde_json::from_str(&edit.body).unwrap();
        assert_eq!(
            (body["message_id"].as_i64(), body.get("message_thread_id")),
            (Some(55), None)
        );
        let approval = request(
            "https://api.telegram.org",
            "t",
            &Outbound::Approval {
                target: topic.clone(),
                session: "S".into(),
                approval_id: "A".into(),
                text: "ok?".into(),
            },
        );
        let body: Value = serde_json::from_str(&approval.body).unwrap();
        assert_eq!(
            body["reply_markup"]["inline_keyboard"][0][2]["callback_data"],
            "deny:A"
        );
        let ack = request(
            "https://api.telegram.org",
            "t",
            &Outbound::CallbackAnswer {
                target: topic,
                callback_id: "cb1".into(),
                text: "done".into(),
            },
        );
        assert!(ack.url.ends_with("/answerCallbackQuery"));
        assert_eq!(
            serde_json::from_str::<Value>(&ack.body).unwrap(),
            json!({"callback_query_id": "cb1", "text": "done"})
        );
    }

    #[test]
    fn answers() {
        let read = |status: u16, header: Option<&str>, body: Value| {
            answer(classify(status, header), &body)
        };
        assert_eq!(
            read(200, None, json!({"ok": true, "result": {"message_id": 12}})),
            Attempt::Sent(Some("12".into()))
        );
        assert_eq!(
            read(200, None, json!({"ok": true, "result": true})),
            Attempt::Sent(None)
        );
        assert_eq!(
            read(
                429,
                None,
                json!({"ok": false, "error_code": 429, "parameters": {"retry_after": 3}})
            ),
            Attempt::Retry {
                retry_after_ms: Some(3000)
            }
        );
        assert_eq!(
            read(
                429,
                Some("2"),
                json!({"ok": false, "parameters": {"retry_after": 3}})
            ),
            Attempt::Retry {
                retry_after_ms: Some(2000)
            }
        );
        assert_eq!(
            read(
                400,
                None,
                json!({"ok": false, "description": "Bad Request: message is not modified: …"})
            ),
            Attempt::Sent(None)
        );
        assert!(matches!(
            read(400, None, json!({"ok": false, "description": "Bad Request: chat not found"})),
            Attempt::Refused(why) if why.contains("chat not found")
        ));
    }
}
