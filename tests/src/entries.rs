//! Helpers to read transcripts in assertions.

use std::collections::HashSet;

use serde_json::Value;
use wuhu_core::wire::{AssistantMessage, Entry, EntryPayload, Message, ToolResult};

/// A fake-provider directive line: `@fake {json}`.
pub fn fake_directive(directive: &Value) -> String {
    format!("@fake {directive}")
}

/// The content of a user message.
pub fn user_content(entry: &Entry) -> Option<&str> {
    match &entry.payload {
        EntryPayload::Message {
            message: Message::User { content, .. },
        } => Some(content),
        _ => None,
    }
}

/// The queue item id of a user message.
pub fn user_queue_item(entry: &Entry) -> Option<&str> {
    match &entry.payload {
        EntryPayload::Message {
            message: Message::User { queue_item_id, .. },
        } => queue_item_id.as_deref(),
        _ => None,
    }
}

/// An assistant message.
pub fn assistant(entry: &Entry) -> Option<&AssistantMessage> {
    match &entry.payload {
        EntryPayload::Message {
            message: Message::Assistant(message),
        } => Some(message),
        _ => None,
    }
}

/// A tool result.
pub fn tool_result(entry: &Entry) -> Option<&ToolResult> {
    match &entry.payload {
        EntryPayload::Message {
            message: Message::ToolResult(result),
        } => Some(result),
        _ => None,
    }
}

/// A custom notice: type and data.
pub fn custom(entry: &Entry) -> Option<(&str, &Value)> {
    match &entry.payload {
        EntryPayload::Custom { custom_type, data } => Some((custom_type, data)),
        _ => None,
    }
}

/// Position of the first user message with this content.
pub fn position_of_user(entries: &[Entry], content: &str) -> Option<usize> {
    entries
        .iter()
        .position(|e| user_content(e) == Some(content))
}

/// Assistant messages, in order.
pub fn assistants(entries: &[Entry]) -> Vec<&AssistantMessage> {
    entries.iter().filter_map(assistant).collect()
}

/// Custom notices of one type, in order.
pub fn customs<'a>(entries: &'a [Entry], custom_type: &str) -> Vec<&'a Value> {
    entries
        .iter()
        .filter_map(custom)
        .filter(|(t, _)| *t == custom_type)
        .map(|(_, d)| d)
        .collect()
}

/// The content of the first `custom_message` of `custom_type` (the global context, an
/// environment's AGENTS.md, ...).
pub fn custom_message_content<'a>(entries: &'a [Entry], custom_type: &str) -> Option<&'a str> {
    entries.iter().find_map(|e| match &e.payload {
        EntryPayload::Message {
            message:
                Message::CustomMessage {
                    custom_type: t,
                    content,
                    ..
                },
        } if t == custom_type => Some(content.as_str()),
        _ => None,
    })
}

/// Panics unless cursors are exactly `1..=n` and entry ids are unique.
#[track_caller]
pub fn assert_contiguous(entries: &[Entry]) {
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(
            entry.cursor,
            i as u64 + 1,
            "cursor gap or duplicate at index {i}; transcript:\n{}",
            describe(entries)
        );
    }
    let mut ids = HashSet::new();
    for entry in entries {
        assert!(
            ids.insert(entry.id.as_str()),
            "duplicate entry id {} at cursor {}",
            entry.id,
            entry.cursor
        );
    }
}

/// One line per entry, for failure messages.
pub fn describe(entries: &[Entry]) -> String {
    let mut out = String::new();
    for entry in entries {
        let what = match &entry.payload {
            EntryPayload::Header(header) => {
                format!("header provider={} model={}", header.provider, header.model)
            }
            EntryPayload::Compaction(c) => format!(
                "compaction {} keeping from {}: {:?}",
                c.reason.as_str(),
                c.first_kept_cursor,
                c.summary.chars().take(80).collect::<String>()
            ),
            EntryPayload::Message { message } => match message {
                Message::User {
                    author,
                    content,
                    lane,
                    ..
                } => format!("user[{author}, {lane:?}] {}", clip(content)),
                Message::Assistant(message) => format!(
                    "assistant {:?} text={} calls={:?}",
                    message.stop_reason,
                    clip(&message.text()),
                    message
                        .tool_calls()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                ),
                Message::ToolResult(result) => {
                    format!(
                        "tool_result {} error={} {}",
                        result.tool_name,
                        result.is_error,
                        clip(&result.content)
                    )
                }
                Message::CustomMessage {
                    custom_type,
                    content,
                    ..
                } => format!("custom_message {custom_type} {}", clip(content)),
            },
            EntryPayload::Custom { custom_type, data } => {
                format!("custom {custom_type} {}", clip(&data.to_string()))
            }
        };
        out.push_str(&format!("  [{}] {what}\n", entry.cursor));
    }
    out
}

fn clip(text: &str) -> String {
    let short: String = text.chars().take(100).collect();
    if short.len() < text.len() {
        format!("{short:?}…")
    } else {
        format!("{short:?}")
    }
}

/// The results of every call of `tool` among `entries`, in order.
pub fn results_of(entries: &[Entry], tool: &str) -> Vec<ToolResult> {
    entries
        .iter()
        .filter_map(tool_result)
        .filter(|r| r.tool_name == tool)
        .cloned()
        .collect()
}
