//! The request of a step built from a plain list of entries ([`super::build_request`]): where
//! the window starts, repaired tool calls, group-chat authors.

use super::*;
use crate::context::tests::{entry, user};
use crate::wire::{AssistantMessage, ContentBlock, StopReason, ToolCall, ToolResult};

fn call(id: &str) -> Message {
    Message::Assistant(AssistantMessage {
        content: vec![ContentBlock::ToolCall(ToolCall {
            id: id.into(),
            name: "list_sessions".into(),
            arguments: serde_json::json!({}),
        })],
        stop_reason: StopReason::ToolUse,
        ..Default::default()
    })
}
fn result(id: &str) -> Message {
    Message::ToolResult(ToolResult {
        tool_call_id: id.into(),
        tool_name: "list_sessions".into(),
        content: "ok".into(),
        is_error: false,
        blobs: Vec::new(),
    })
}
fn shape(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| match m {
            Message::User { content, .. } => format!("user:{content}"),
            Message::Assistant(a) => format!(
                "assistant:{}",
                a.tool_calls()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join("+")
            ),
            Message::ToolResult(r) => format!(
                "result:{}{}",
                r.tool_call_id,
                if r.is_error { "!" } else { "" }
            ),
            Message::CustomMessage { content, .. } => format!("custom:{content}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn window_starts_at_a_user_message_and_repairs_calls() {
    let header = Header {
        system_prompt: "s".into(),
        provider: "fake".into(),
        model: "m".into(),
        reasoning: None,
    };
    let cases: Vec<(Vec<Message>, &str)> = vec![
        (
            vec![user("a"), call("1"), result("1")],
            "user:a assistant:1 result:1",
        ),
        (vec![result("0"), call("1"), user("a")], "user:a"),
        (
            vec![user("a"), call("1"), user("b")],
            "user:a assistant:1 result:1! user:b",
        ),
        (vec![user("a"), call("1")], "user:a assistant:1 result:1!"),
        (
            vec![user("a"), call("1"), user("ctx"), result("1"), user("b")],
            "user:a assistant:1 result:1 user:ctx user:b",
        ),
        (vec![user("a"), result("9")], "user:a"),
    ];
    for (messages, want) in cases {
        let entries: Vec<Entry> = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| entry(i as u64 + 1, m))
            .collect();
        let request = build_request(&header, &entries, None, vec![]);
        assert_eq!(shape(&request.messages), want);
    }
}

#[test]
fn group_chat_prefixes_only_after_the_reminder() {
    let header = Header {
        system_prompt: "s".into(),
        provider: "fake".into(),
        model: "m".into(),
        reasoning: None,
    };
    let by = |author: &str, text: &str| Message::User {
        author: author.into(),
        content: text.into(),
        queue_item_id: None,
        lane: None,
        acting_for: None,
    };
    let reminder = Message::CustomMessage {
        custom_type: crate::wire::custom_types::GROUP_CHAT_REMINDER.into(),
        content: "group".into(),
        details: None,
    };
    let entries: Vec<Entry> = [by("alice", "a"), reminder, by("bob", "b"), by("alice", "c")]
        .into_iter()
        .enumerate()
        .map(|(i, m)| entry(i as u64 + 1, m))
        .collect();
    let plain = build_request(&header, &entries, None, vec![]);
    assert_eq!(shape(&plain.messages), "user:a custom:group user:b user:c");
    let group = build_request(&header, &entries, Some(2), vec![]);
    assert_eq!(
        shape(&group.messages),
        "user:a custom:group user:[bob]:\n\nb user:[alice]:\n\nc"
    );
}
