//! Generic webhooks: any system that can sign a POST with a shared secret.
//!
//! In: `POST /hooks/generic/:id` with `X-Wuhu-Timestamp: <unix seconds>` and
//! `X-Wuhu-Signature: sha256=<hex HMAC-SHA256(secret, "{timestamp}.{body}")>` (checked by
//! [`super::verify::generic`]), body `{"thread","user","text"}` plus, optionally, `"id"` (the
//! sender's idempotency key: a retry with the same id is enqueued once) or, instead of
//! `"text"`, `"approval": {"id","decision"}` to answer an approval request. A text that is a
//! command (`/stop`, `/new`, `/status`, `/steer …`) is one.
//!
//! Out: `POST <replyUrl>` signed the same way with the same secret, body
//! `{"thread","kind":"text","text"}` (markdown), `{"thread","kind":"text","text","replaces"}`
//! to edit an earlier message (`replaces` is the `id` the receiver answered that message with,
//! a progress line), or `{"thread","kind":"approval","approval":{"id","text","decisions"}}`.

use serde::Deserialize;
use serde_json::{Value, json};

use super::outbound::{HttpCall, Outbound};
use super::verify::hmac_hex;
use super::{
    ApprovalClick, Command, DECISIONS, Delivery, Inbound, ReplyTarget, bounded_text, parse_command,
};

/// Longest `thread`, in bytes.
pub const MAX_THREAD_BYTES: usize = 200;
/// Longest `id`, in bytes.
pub const MAX_ID_BYTES: usize = 200;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    thread: String,
    user: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    approval: Option<ApprovalAnswer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalAnswer {
    id: String,
    decision: String,
}

/// Decodes a verified delivery. `signature` is the request's `X-Wuhu-Signature`: an exact
/// replay (same timestamp and body) carries the same one and is deduplicated by it.
///
/// # Errors
/// A message for a 400.
pub fn parse(body: &[u8], signature: &str) -> Result<Delivery, String> {
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| format!("body must be {{\"thread\",\"user\",\"text\"}}: {e}"))?;
    if body.thread.is_empty()
        || body.thread.len() > MAX_THREAD_BYTES
        || body.thread.chars().any(char::is_control)
    {
        return Err(format!(
            "thread must be 1 to {MAX_THREAD_BYTES} bytes without control characters"
        ));
    }
    // The user becomes the identity `generic:<user>`: the same characters as a token's `sub`.
    if !crate::authority::valid_name(&body.user) {
        return Err("user must be 1 to 64 of A-Z a-z 0-9 _ . @ + -".into());
    }
    if body
        .id
        .as_deref()
        .is_some_and(|id| id.is_empty() || id.len() > MAX_ID_BYTES)
    {
        return Err(format!("id must be 1 to {MAX_ID_BYTES} bytes"));
    }
    // With an `id` the sender names its messages: the same id is the same message (a retry,
    // re-signed or not), and two messages with the same text in the same second are two.
    // Without one, the signature is the message: an exact replay is caught, and two identical
    // bodies signed in the same second are one.
    let dedupe_keys = match &body.id {
        Some(id) => vec![format!("generic:id:{id}")],
        None => vec![format!("generic:sig:{}", signature.trim())],
    };
    let reply_to = ReplyTarget::Generic {
        thread: body.thread.clone(),
    };
    let thread_key = format!("generic:{}", body.thread);
    match (body.text, body.approval) {
        (Some(_), Some(_)) | (None, None) => Err("give either text or approval".into()),
        (None, Some(answer)) => {
            if !DECISIONS.contains(&answer.decision.as_str()) {
                return Err(format!("approval.decision must be one of {DECISIONS:?}"));
            }
            Ok(Delivery::Approval(ApprovalClick {
                user: body.user,
                session: None,
                approval_id: answer.id,
                decision: answer.decision,
                dedupe_key: dedupe_keys.last().cloned().unwrap_or_default(),
                reply_to: Some(reply_to),
                callback: None,
            }))
        }
        (Some(text), None) => {
            let text = text.trim();
            if text.is_empty() {
                return Err("text must not be empty".into());
            }
            if let Some(kind) = parse_command(text) {
                return Ok(Delivery::Command(Command {
                    kind,
                    dedupe_keys,
                    thread_key,
                    reply_to,
                    latest_thread_under: None,
                    response_url: None,
                    user: body.user,
                }));
            }
            Ok(Delivery::Message(Inbound {
                dedupe_keys,
                thread_key,
                reply_to,
                user: body.user,
                text: bounded_text(text),
                // Every generic thread is addressed to Wuhu.
                may_start: true,
            }))
        }
    }
}

/// The signature headers of a body sent at `now_secs`: `(X-Wuhu-Timestamp, X-Wuhu-Signature)`.
pub fn sign(secret: &str, body: &[u8], now_secs: i64) -> (String, String) {
    let timestamp = now_secs.to_string();
    let signature = hmac_hex(secret.as_bytes(), &[timestamp.as_bytes(), b".", body]);
    (timestamp, format!("sha256={signature}"))
}

/// The signed POST to `reply_url` that delivers `message`.
pub fn request(reply_url: &str, secret: &str, message: &Outbound, now_secs: i64) -> HttpCall {
    let thread = match message.target() {
        ReplyTarget::Generic { thread } => thread.clone(),
        other => format!("{other:?}"),
    };
    let body: Value = match message {
        Outbound::Text { text, edit, .. } => {
            let mut body = json!({"thread": thread, "kind": "text", "text": text});
            if let Some(reference) = edit {
                body["replaces"] = json!(reference);
            }
            body
        }
        Outbound::Approval {
            approval_id, text, ..
        } => json!({
            "thread": thread,
            "kind": "approval",
            "approval": {"id": approval_id, "text": text, "decisions": DECISIONS},
        }),
        Outbound::CallbackAnswer { text, .. } | Outbound::CommandResponse { text, .. } => {
            json!({"thread": thread, "kind": "text", "text": text})
        }
    };
    let body = body.to_string();
    let (timestamp, signature) = sign(secret, body.as_bytes(), now_secs);
    HttpCall {
        method: "POST".into(),
        url: reply_url.to_string(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-wuhu-timestamp".into(), timestamp),
            ("x-wuhu-signature".into(), signature),
        ],
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::CommandKind;
    use crate::channels::verify;

    #[test]
    fn deliveries() {
        let Delivery::Message(m) = parse(
            br#"{"thread":"t-1","user":"ann","text":" hi ","id":"m1"}"#,
            "sha256=ab",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            (m.thread_key.as_str(), m.user.as_str(), m.text.as_str()),
            ("generic:t-1", "ann", "hi")
        );
        assert_eq!(m.dedupe_keys, vec!["generic:id:m1"]);
        // The same text twice: one message without ids (the same signature: a replay), two
        // with two ids, one with one id however it is signed.
        let keys = |body: &[u8], signature: &str| match parse(body, signature).unwrap() {
            Delivery::Message(m) => m.dedupe_keys,
            other => panic!("{other:?}"),
        };
        let plain = br#"{"thread":"t","user":"ann","text":"yes"}"#;
        assert_eq!(keys(plain, "sha256=aa"), keys(plain, "sha256=aa"));
        let first = br#"{"thread":"t","user":"ann","text":"yes","id":"1"}"#;
        let second = br#"{"thread":"t","user":"ann","text":"yes","id":"2"}"#;
        assert_ne!(keys(first, "sha256=aa"), keys(second, "sha256=bb"));
        assert_eq!(keys(first, "sha256=aa"), keys(first, "sha256=cc"));
        assert!(m.may_start);
        let Delivery::Command(c) = parse(
            br#"{"thread":"t","user":"ann","text":"/steer go left"}"#,
            "s",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.kind, CommandKind::Steer("go left".into()));
        let Delivery::Approval(a) = parse(
            br#"{"thread":"t","user":"ann","approval":{"id":"A1","decision":"deny"}}"#,
            "s",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            (a.approval_id.as_str(), a.decision.as_str()),
            ("A1", "deny")
        );
        assert_eq!(a.session, None);
        let bad: [&[u8]; 9] = [
            b"{",
            br#"{"thread":"t","user":"ann"}"#,
            br#"{"thread":"","user":"ann","text":"x"}"#,
            br#"{"thread":"t","user":"a:b","text":"x"}"#,
            br#"{"thread":"t","user":"ann","text":"   "}"#,
            br#"{"thread":"t","user":"ann","text":"x","extra":1}"#,
            br#"{"thread":"t","user":"ann","text":"x","approval":{"id":"A","decision":"deny"}}"#,
            br#"{"thread":"t","user":"ann","approval":{"id":"A","decision":"maybe"}}"#,
            br#"{"thread":"t\u0000","user":"ann","text":"x"}"#,
        ];
        for body in bad {
            assert!(
                parse(body, "s").is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// A reply verifies with the same rule as a hook: the receiver can use the documented
    /// check as it is.
    #[test]
    fn replies_are_signed_like_hooks() {
        let secret = "0123456789abcdef-secret";
        let target = ReplyTarget::Generic { thread: "t".into() };
        let now = 1_700_000_000;
        for message in [
            Outbound::text(target.clone(), "hi".into()),
            Outbound::Approval {
                target: target.clone(),
                session: "S".into(),
                approval_id: "A".into(),
                text: "ok?".into(),
            },
        ] {
            let call = request("https://r.example/hook", secret, &message, now);
            let header = |name: &str| {
                call.headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(call.url, "https://r.example/hook");
            assert_eq!(
                verify::generic(
                    secret,
                    header("x-wuhu-timestamp"),
                    header("x-wuhu-signature"),
                    call.body.as_bytes(),
                    now
                ),
                Ok(())
            );
            let body: Value = serde_json::from_str(&call.body).unwrap();
            assert_eq!(body["thread"], "t");
        }
        let edit = request(
            "https://r.example/hook",
            secret,
            &Outbound::Text {
                target,
                text: "x".into(),
                edit: Some("m7".into()),
                edit_of: None,
            },
            now,
        );
        let body: Value = serde_json::from_str(&edit.body).unwrap();
        assert_eq!(body["replaces"], "m7");
    }
}
