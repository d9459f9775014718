//! What a session's new transcript entries mean for the thread it answers: the reply to post
//! when the turn is over, the approval requests to show, the tool calls for progress.

use crate::wire::{EntryPayload, Message, Status, custom_types};

/// What the entries after the last scanned cursor hold. Stored with the watch (JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scan {
    /// The last assistant text (the reply when the turn is over).
    pub last_text: Option<String>,
    /// Approval requests: `(approval id, text)`.
    pub approvals: Vec<(String, String)>,
    /// Names of the tool calls the model made, in order.
    pub tool_calls: Vec<String>,
    /// Whether the model failed (an LLM error entry) after the last assistant text.
    pub failed: bool,
    /// The newest cursor seen.
    pub through: u64,
    /// How many tool calls the progress message shows (0: none posted yet).
    #[serde(default)]
    pub progress_shown: usize,
}

/// Folds `entries` (oldest first) into `scan`.
pub fn scan(scan: &mut Scan, entries: &[crate::wire::Entry]) {
    for entry in entries {
        scan.through = scan.through.max(entry.cursor);
        match &entry.payload {
            EntryPayload::Message {
                message: Message::Assistant(assistant),
            } => {
                let text = assistant.text();
                if !text.trim().is_empty() {
                    scan.last_text = Some(text);
                    scan.failed = false;
                }
                scan.tool_calls
                    .extend(assistant.tool_calls().map(|c| c.name.clone()));
            }
            EntryPayload::Custom { custom_type, data }
                if custom_type == custom_types::APPROVAL_REQUESTED =>
            {
                if let Some(id) = data["approvalId"].as_str() {
                    // What people read: who asks to do what, where, and what exactly.
                    scan.approvals
                        .push((id.to_string(), crate::approvals::card_text(data)));
                }
            }
            EntryPayload::Custom { custom_type, .. } if custom_type == custom_types::LLM_ERROR => {
                scan.failed = true;
            }
            _ => {}
        }
    }
}

/// Whether the turn the thread waits for is over: the session is not running and nothing is
/// queued (a queued follow-up would start another turn whose answer comes with this one).
pub fn turn_over(status: Status, queued: usize) -> bool {
    status != Status::Running && queued == 0
}

/// The text to post when the turn is over, if any.
pub fn reply(scan: &Scan, status: Status) -> Option<String> {
    if scan.failed {
        return Some("The model could not answer (see the session's transcript).".into());
    }
    match (&scan.last_text, status) {
        (Some(text), _) => Some(text.clone()),
        (None, Status::Stopped) => Some("Stopped.".into()),
        (None, _) => None,
    }
}

/// How long to wait before looking at a watched session again, by how long it has been
/// watched: every second for a minute, every 5 s for ten minutes, then every 30 s (a turn
/// waiting for an approval may take hours).
pub fn poll_interval_ms(watched_for_ms: u64) -> u64 {
    match watched_for_ms {
        0..60_000 => 1_000,
        60_000..600_000 => 5_000,
        _ => 30_000,
    }
}

/// A watch older than this is dropped without a reply (the session is stuck or forgotten).
pub const MAX_WATCH_MS: u64 = 24 * 3600 * 1000;

/// The progress line while a turn runs.
pub fn progress_text(tool_calls: &[String]) -> String {
    match tool_calls {
        [] => "Working…".into(),
        calls => {
            let last = &calls[calls.len() - 1];
            format!("Working… {} tool call(s), latest: {last}", calls.len())
        }
    }
}

/// The progress line once the turn is over.
pub fn progress_done_text(tool_calls: usize) -> String {
    format!("Done: {tool_calls} tool call(s).")
}

/// The answer to a status command.
pub fn status_line(session: &str, status: Status, queued: usize) -> String {
    let state = match status {
        Status::Running => "running a turn",
        Status::Stopped => "stopped",
        Status::Idle => "idle",
    };
    match queued {
        0 => format!("Session {session}: {state}."),
        n => format!("Session {session}: {state}, {n} message(s) queued."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AssistantMessage, ContentBlock, Entry, ToolCall};
    use serde_json::json;

    fn entry(cursor: u64, payload: EntryPayload) -> Entry {
        Entry {
            cursor,
            id: format!("e{cursor}"),
            created_at: 0,
            payload,
        }
    }

    fn assistant(cursor: u64, text: &str, tool: Option<&str>) -> Entry {
        let mut content = vec![ContentBlock::Text { text: text.into() }];
        if let Some(name) = tool {
            content.push(ContentBlock::ToolCall(ToolCall {
                id: "c".into(),
                name: name.into(),
                arguments: json!({}),
            }));
        }
        entry(
            cursor,
            EntryPayload::Message {
                message: Message::Assistant(AssistantMessage {
                    content,
                    ..Default::default()
                }),
            },
        )
    }

    #[test]
    fn a_turn_with_tools_and_an_approval() {
        let mut s = Scan::default();
        scan(
            &mut s,
            &[
                entry(
                    2,
                    EntryPayload::Message {
                        message: Message::User {
                            author: "slack:U1".into(),
                            content: "hi".into(),
                            queue_item_id: None,
                            lane: None,
                            acting_for: None,
                        },
                    },
                ),
                assistant(3, "", Some("bash")),
                entry(
                    4,
                    EntryPayload::Custom {
                        custom_type: custom_types::APPROVAL_REQUESTED.into(),
                        data: json!({"approvalId": "A1", "text": "May it?"}),
                    },
                ),
            ],
        );
        assert_eq!(s.approvals, vec![("A1".to_string(), "May it?".to_string())]);
        assert_eq!(s.last_text, None);
        assert_eq!(
            progress_text(&s.tool_calls),
            "Working… 1 tool call(s), latest: bash"
        );
        assert_eq!(reply(&s, Status::Running), None);
        scan(&mut s, &[assistant(6, "Done: **3** files", None)]);
        assert_eq!(s.through, 6);
        assert_eq!(
            reply(&s, Status::Idle).as_deref(),
            Some("Done: **3** files")
        );
    }

    #[test]
    fn endings() {
        let mut s = Scan::default();
        scan(
            &mut s,
            &[entry(
                5,
                EntryPayload::Custom {
                    custom_type: custom_types::LLM_ERROR.into(),
                    data: json!({}),
                },
            )],
        );
        assert!(
            reply(&s, Status::Idle)
                .unwrap()
                .contains("could not answer")
        );
        let s = Scan::default();
        assert_eq!(reply(&s, Status::Stopped).as_deref(), Some("Stopped."));
        assert_eq!(reply(&s, Status::Idle), None);
        assert!(turn_over(Status::Idle, 0));
        assert!(turn_over(Status::Stopped, 0));
        assert!(!turn_over(Status::Running, 0));
        assert!(!turn_over(Status::Idle, 1));
        assert_eq!(poll_interval_ms(0), 1_000);
        assert_eq!(poll_interval_ms(59_999), 1_000);
        assert_eq!(poll_interval_ms(60_000), 5_000);
        assert_eq!(poll_interval_ms(MAX_WATCH_MS), 30_000);
        assert_eq!(status_line("S", Status::Idle, 0), "Session S: idle.");
        assert_eq!(
            status_line("S", Status::Running, 2),
            "Session S: running a turn, 2 message(s) queued."
        );
        // Watches stored before progress existed still read.
        let old: Scan = serde_json::from_str(
            r#"{"lastText":null,"approvals":[],"toolCalls":[],"failed":false,"through":4}"#,
        )
        .unwrap();
        assert_eq!((old.through, old.progress_shown), (4, 0));
    }
}
