//! Slack: what a delivery to `/hooks/slack/:id` means, and the Web API calls that answer it.
//!
//! One URL takes the Events API (JSON), Interactivity (form with `payload`) and slash commands
//! (form with `command`). Bot messages (ours included) and edits are ignored, so the bot never
//! answers itself. A mention arrives twice when the app subscribes to both `app_mention` and
//! `message.*` (two event ids); the message key (`channel` + `ts`) makes it one.
//!
//! The slash command (`/wuhu status|steer <text>|stop|new`) names a channel, not a thread:
//! in a direct message it is about that conversation's session, in a channel about the thread
//! there that was active last (or the thread itself, should Slack ever send `thread_ts`). Its
//! note goes to the command's `response_url`.

use serde_json::{Value, json};

use super::admit::Origin;
use super::outbound::{HttpCall, Outbound};
use super::{
    ApprovalClick, Command, CommandKind, Delivery, Inbound, ReplyTarget, bounded_text,
    parse_command,
};

/// What the slash command answers to anything but a command it knows.
pub const SLASH_USAGE: &str = "Usage: `/wuhu status`, `/wuhu steer &lt;text&gt;`, `/wuhu stop`, `/wuhu new`. In a direct message they act on our conversation; in a channel on the thread here I was last active in. To talk to me, mention me.";

/// Whether a slash command's note is shown to the whole channel (`in_channel`): what changed
/// the session everyone shares (stop, steer, new) when it happened; a status, a refusal or a
/// usage goes to the person only.
pub fn slash_note_in_channel(kind: &CommandKind, ok: bool) -> bool {
    ok && !matches!(kind, CommandKind::Status)
}

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
        if get("command").is_some() {
            return Ok(parse_slash_command(&get));
        }
        return Ok(Delivery::Ignored("a form without payload or command"));
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

/// Where a verified delivery comes from: the workspace, app and Enterprise Grid it is for, and
/// the person's own workspace (what an allowlist names). Events say `team_id`, `api_app_id`,
/// `enterprise_id` and, for a Slack Connect guest, `event.user_team`; interactions `team.id`,
/// `api_app_id`, `enterprise.id` and `user.team_id`; slash commands `team_id`, `api_app_id`,
/// `enterprise_id`. A body that is neither names nothing.
pub fn origin(content_type: &str, body: &[u8]) -> Origin {
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    if content_type.starts_with("application/x-www-form-urlencoded") {
        let pairs: Vec<(String, String)> = url::form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        if let Some(payload) = get("payload") {
            let payload: Value = serde_json::from_str(&payload).unwrap_or(Value::Null);
            let team = text(&payload["team"]["id"]);
            return Origin {
                place: text(&payload["user"]["team_id"]).or_else(|| team.clone()),
                team,
                app: text(&payload["api_app_id"]),
                enterprise: text(&payload["enterprise"]["id"]),
            };
        }
        let team = get("team_id");
        return Origin {
            place: team.clone(),
            team,
            app: get("api_app_id"),
            enterprise: get("enterprise_id"),
        };
    }
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let team = text(&value["team_id"]);
    let event = &value["event"];
    Origin {
        place: text(&event["user_team"])
            .or_else(|| text(&event["team"]))
            .or_else(|| team.clone()),
        team,
        app: text(&value["api_app_id"]),
        enterprise: text(&value["enterprise_id"]),
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

/// A slash command's form: `command`, `text`, `user_id`, `channel_id`, `response_url`,
/// `trigger_id` (unique per invocation: the dedupe key), ….
fn parse_slash_command<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Delivery {
    let usage = || Delivery::Answer(json!({"response_type": "ephemeral", "text": SLASH_USAGE}));
    let (Some(user), Some(channel), Some(trigger)) =
        (get("user_id"), get("channel_id"), get("trigger_id"))
    else {
        return usage();
    };
    let Some(kind) = parse_command(&format!("/{}", get("text").unwrap_or_default().trim())) else {
        return usage();
    };
    let direct = get("channel_name") == Some("directmessage") || channel.starts_with('D');
    let (thread_key, latest_thread_under) = match get("thread_ts") {
        Some(root) if !direct => (format!("slack:{channel}:{root}"), None),
        _ if direct => (format!("slack:{channel}"), None),
        // No thread key is only a channel: the latest thread under it.
        _ => (
            format!("slack:{channel}"),
            Some(format!("slack:{channel}:")),
        ),
    };
    Delivery::Command(Command {
        kind,
        dedupe_keys: vec![format!("slack:slash:{trigger}")],
        thread_key,
        latest_thread_under,
        reply_to: ReplyTarget::Slack {
            channel: channel.to_string(),
            thread_ts: None,
        },
        // Only a URL the server may call; without one the note goes to the channel.
        response_url: get("response_url")
            .and_then(|url| super::binding::check_url("response_url", url).ok()),
        user: user.to_string(),
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

/// The Web API call that delivers `message` (`chat.postMessage`, or `chat.update` for an edit;
/// a slash command's answer goes to its `response_url`, without the bot token).
pub fn request(api_base_url: &str, bot_token: &str, message: &Outbound) -> HttpCall {
    if let Outbound::CommandResponse {
        response_url,
        text,
        in_channel,
        ..
    } = message
    {
        let response_type = if *in_channel {
            "in_channel"
        } else {
            "ephemeral"
        };
        return HttpCall {
            method: "POST".into(),
            url: response_url.clone(),
            headers: vec![(
                "content-type".into(),
                "application/json; charset=utf-8".into(),
            )],
            body: json!({"response_type": response_type, "text": text}).to_string(),
        };
    }
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
        Outbound::CallbackAnswer { text, .. } | Outbound::CommandResponse { text, .. } => {
            body["text"] = json!(text)
        }
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
/// `200 {"ok":false,"error":…}` for most failures; `ratelimited` comes as a 429. A
/// `response_url` answers a plain `ok` (not JSON: `Null` here), which is a success.
pub fn answer(body: &Value) -> Result<Option<String>, String> {
    if body.is_null() {
        return Ok(None);
    }
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

    fn slash(fields: &[(&str, &str)]) -> Delivery {
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        parse(
            "application/x-www-form-urlencoded; charset=utf-8",
            body.as_bytes(),
        )
        .unwrap()
    }

    /// Slack's slash-command form, as Slack posts it.
    fn slash_form<'a>(channel: &'a str, text: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("token", "legacy-verification-token"),
            ("team_id", "T1"),
            ("team_domain", "acme"),
            ("channel_id", channel),
            (
                "channel_name",
                if channel.starts_with('D') {
                    "directmessage"
                } else {
                    "general"
                },
            ),
            ("user_id", "U7"),
            ("user_name", "ann"),
            ("command", "/wuhu"),
            ("text", text),
            ("api_app_id", "A1"),
            ("is_enterprise_install", "false"),
            ("response_url", "https://hooks.slack.com/commands/T1/1/abc"),
            ("trigger_id", "13345224609.738474920.8088930838d88f008e0"),
        ]
    }

    #[test]
    fn slash_commands() {
        let cases = [
            ("status", CommandKind::Status),
            ("stop", CommandKind::Stop),
            (" new ", CommandKind::New),
            ("steer go left", CommandKind::Steer("go left".into())),
            ("STOP", CommandKind::Stop),
        ];
        for (text, want) in cases {
            let Delivery::Command(c) = slash(&slash_form("C1", text)) else {
                panic!("{text}")
            };
            assert_eq!(c.kind, want, "{text}");
            assert_eq!(c.user, "U7");
            assert_eq!(
                c.dedupe_keys,
                vec!["slack:slash:13345224609.738474920.8088930838d88f008e0"]
            );
            // A channel: the thread there that was active last.
            assert_eq!(c.thread_key, "slack:C1");
            assert_eq!(c.latest_thread_under.as_deref(), Some("slack:C1:"));
            assert_eq!(
                c.response_url.as_deref(),
                Some("https://hooks.slack.com/commands/T1/1/abc")
            );
        }
        // A direct message: the conversation's session, as its messages key it.
        let Delivery::Command(c) = slash(&slash_form("D9", "status")) else {
            panic!()
        };
        assert_eq!(
            (c.thread_key.as_str(), c.latest_thread_under),
            ("slack:D9", None)
        );
        // A thread, should Slack say which.
        let mut form = slash_form("C1", "stop");
        form.push(("thread_ts", "10.1"));
        let Delivery::Command(c) = slash(&form) else {
            panic!()
        };
        assert_eq!(
            (c.thread_key.as_str(), c.latest_thread_under),
            ("slack:C1:10.1", None)
        );
        // Anything else is answered with the usage, ephemeral, and does nothing.
        for text in ["", "help", "steer", "hello there", "/stop"] {
            let d = slash(&slash_form("C1", text));
            assert!(
                matches!(&d, Delivery::Answer(a) if a["response_type"] == "ephemeral" && a["text"] == SLASH_USAGE),
                "{text}: {d:?}"
            );
        }
        let mut no_trigger = slash_form("C1", "stop");
        no_trigger.retain(|(k, _)| *k != "trigger_id");
        assert!(matches!(slash(&no_trigger), Delivery::Answer(_)));
        // A response_url the server may not call is not kept (the note goes to the channel).
        for url in ["http://evil.example/x", "file:///etc/passwd", "not a url"] {
            let mut form = slash_form("C1", "stop");
            form.retain(|(k, _)| *k != "response_url");
            form.push(("response_url", url));
            let Delivery::Command(c) = slash(&form) else {
                panic!()
            };
            assert_eq!(c.response_url, None, "{url}");
        }
        assert!(slash_note_in_channel(&CommandKind::Stop, true));
        assert!(!slash_note_in_channel(&CommandKind::Stop, false));
        assert!(!slash_note_in_channel(&CommandKind::Status, true));
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
        // A slash command's answer: to its response_url, never with the bot token.
        let response = request(
            "https://slack.com/api",
            "xoxb-secret",
            &Outbound::CommandResponse {
                target: ReplyTarget::Slack {
                    channel: "C1".into(),
                    thread_ts: None,
                },
                response_url: "https://hooks.slack.com/commands/T1/1/abc".into(),
                text: "stopped".into(),
                in_channel: true,
            },
        );
        assert_eq!(response.url, "https://hooks.slack.com/commands/T1/1/abc");
        assert!(
            !response
                .headers
                .iter()
                .any(|(_, v)| v.contains("xoxb-secret"))
        );
        let body: Value = serde_json::from_str(&response.body).unwrap();
        assert_eq!(
            body,
            json!({"response_type": "in_channel", "text": "stopped"})
        );
        assert_eq!(answer(&Value::Null), Ok(None));
    }
}
