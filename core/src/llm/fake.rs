//! The deterministic `fake` provider: no HTTP, no keys. Used for local development and
//! end-to-end tests, which script it through message text.
//!
//! The reply depends only on the request. It is driven by the last message:
//!
//! * a user or custom message: its `@fake` directive (a line `@fake {json}`), or else the reply
//!   `echo: <content>` (trailing custom messages delivered together count as one content, joined
//!   by a blank line);
//! * a tool result (the step after tool calls): the `afterTools` text of the directive of the
//!   message that started the turn, or else a summary `tool results: <tool>: <content>; …`.
//!
//! Directive fields (all optional, unknown ones ignored):
//!
//! | field | meaning |
//! |---|---|
//! | `reply` | reply text (default `echo: <content>`, or empty when `toolCalls` is given) |
//! | `toolCalls` | `[{name, arguments (default {}), id?}]`; a string `arguments` is sent verbatim as the raw argument text |
//! | `delayMs` | delay between emitted events, capped at [`MAX_DELAY_MS`] |
//! | `chunks` | number of text chunks (default: pieces of about 3 words) |
//! | `error` | `{status?, message?, retryable?, afterChunks?}`: fail the request |
//! | `afterTools` | reply text of the step after the tool results come back |
//! | `recall` | reply with the first `fact:` line about this word in the earlier context, naming where it was (`message`, `summary`, `context`) |
//!
//! A summary request of a compaction (system prompt `super::SUMMARY_SYSTEM_PROMPT`)
//! is answered with every `fact:` line of its material, once each.

use serde::Deserialize;
use serde_json::Value;

use super::{LlmEvent, LlmFailure, LlmRequest};
use crate::wire::{ContentBlock, Message, StopReason, ToolResult, Usage};

/// Provider id.
pub const PROVIDER: &str = "fake";
/// The model name used when none is given (the fake ignores it).
pub const DEFAULT_MODEL: &str = "fake-echo";
/// The largest `delayMs` honoured; larger values are capped.
pub const MAX_DELAY_MS: u64 = 60_000;
/// How many characters of each tool result the default after-tools reply quotes.
const QUOTED_RESULT_CHARS: usize = 200;
/// Words per text chunk when the directive does not say `chunks`.
const WORDS_PER_CHUNK: usize = 3;

/// What the fake provider answers.
///
/// The host emits `events` one by one, sleeping `chunk_delay_ms` between them (0: no sleep),
/// then, if `failure` is set, fails the request with it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FakeReply {
    /// Events to emit, in order.
    pub events: Vec<LlmEvent>,
    /// Milliseconds to wait between events.
    pub chunk_delay_ms: u64,
    /// The failure that ends the request after the events, if any.
    pub failure: Option<LlmFailure>,
}

/// Computes the fake reply to `request`. Never panics.
pub fn respond(request: &LlmRequest) -> FakeReply {
    let messages = &request.messages;
    // Context a tool added after its result (AGENTS.md, a resume note) does not change which
    // step this is: look at the last message that is not a `custom_message`.
    let after_tools = matches!(
        messages
            .iter()
            .rev()
            .find(|m| !matches!(m, Message::CustomMessage { .. })),
        Some(Message::ToolResult(_))
    );
    let plan = match messages.last() {
        _ if request.system_prompt == super::SUMMARY_SYSTEM_PROMPT => summary_step(messages),
        _ if after_tools => after_tools_step(messages),
        Some(Message::User { content, .. }) => first_step(content, messages),
        // Server messages delivered together (children finishing at once) are answered
        // together: the reply covers every trailing custom message, not only the last.
        Some(Message::CustomMessage { .. }) => {
            let trailing: Vec<&str> = messages
                .iter()
                .rev()
                .map_while(|m| match m {
                    Message::CustomMessage { content, .. } => Some(content.as_str()),
                    _ => None,
                })
                .collect();
            let content: Vec<&str> = trailing.into_iter().rev().collect();
            first_step(&content.join("\n\n"), messages)
        }
        Some(Message::ToolResult(_)) => after_tools_step(messages),
        Some(Message::Assistant(_)) | None => Plan::text("echo: ".to_string()),
    };
    // Like a real provider, the input counts the system prompt and the tool definitions.
    let input_chars: usize = messages
        .iter()
        .map(message_chars)
        .chain([request.system_prompt.chars().count()])
        .chain(
            request
                .tools
                .iter()
                .map(|t| t.name.len() + t.description.chars().count() + t.parameters.text_len()),
        )
        .fold(0, usize::saturating_add);
    plan.into_reply(input_chars)
}

/// A `@fake` directive.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Directive {
    reply: Option<String>,
    #[serde(default)]
    tool_calls: Vec<FakeToolCall>,
    delay_ms: Option<u64>,
    chunks: Option<usize>,
    error: Option<FakeError>,
    after_tools: Option<String>,
    recall: Option<String>,
}

#[derive(Debug, Deserialize)]
struct FakeToolCall {
    name: String,
    #[serde(default)]
    arguments: Value,
    id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FakeError {
    status: Option<u16>,
    message: Option<String>,
    retryable: Option<bool>,
    after_chunks: Option<usize>,
}

/// The first `@fake ` line of `content`, parsed; `None` without one.
fn directive(content: &str) -> Option<Result<Directive, serde_json::Error>> {
    content
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("@fake "))
        .map(serde_json::from_str)
}

/// What to emit, before chunking.
#[derive(Debug, Default)]
struct Plan {
    reply: String,
    chunks: Option<usize>,
    delay_ms: u64,
    /// (id, name, argument text)
    tool_calls: Vec<(String, String, String)>,
    /// The failure and how many text chunks precede it.
    error: Option<(LlmFailure, usize)>,
}

impl Plan {
    fn text(reply: String) -> Self {
        Plan {
            reply,
            ..Plan::default()
        }
    }

    fn into_reply(self, input_chars: usize) -> FakeReply {
        let chunks = split_reply(&self.reply, self.chunks);
        let chunk_delay_ms = self.delay_ms.min(MAX_DELAY_MS);
        if let Some((failure, after_chunks)) = self.error {
            return FakeReply {
                events: chunks
                    .into_iter()
                    .take(after_chunks)
                    .map(LlmEvent::TextDelta)
                    .collect(),
                chunk_delay_ms,
                failure: Some(failure),
            };
        }
        let mut events: Vec<LlmEvent> = chunks.into_iter().map(LlmEvent::TextDelta).collect();
        let stop_reason = if self.tool_calls.is_empty() {
            StopReason::Stop
        } else {
            StopReason::ToolUse
        };
        for (index, (id, name, arguments)) in self.tool_calls.into_iter().enumerate() {
            events.push(LlmEvent::ToolCallStart { index, id, name });
            events.push(LlmEvent::ToolCallArgumentsDelta {
                index,
                delta: arguments,
            });
        }
        let input_tokens = (input_chars / 4) as u64;
        let output_tokens = (self.reply.chars().count() / 4) as u64 + 1;
        events.push(LlmEvent::Usage(Usage {
            input_tokens,
            output_tokens,
            total_tokens: input_tokens.saturating_add(output_tokens),
            ..Usage::default()
        }));
        events.push(LlmEvent::Finish(stop_reason));
        FakeReply {
            events,
            chunk_delay_ms,
            failure: None,
        }
    }
}

/// The step answering a user or custom message.
fn first_step(content: &str, messages: &[Message]) -> Plan {
    let message_count = messages.len();
    let directive = match directive(content) {
        None => return Plan::text(format!("echo: {content}")),
        Some(Err(error)) => return Plan::text(format!("fake: invalid @fake directive: {error}")),
        Some(Ok(directive)) => directive,
    };
    let tool_calls: Vec<(String, String, String)> = directive
        .tool_calls
        .into_iter()
        .enumerate()
        .map(|(index, call)| {
            let id = call
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{index}_{message_count}"));
            let arguments = match call.arguments {
                Value::Null => "{}".to_string(),
                Value::String(raw) => raw,
                other => other.to_string(),
            };
            (id, call.name, arguments)
        })
        .collect();
    let reply = directive.reply.unwrap_or_else(|| {
        if let Some(topic) = &directive.recall {
            recall(messages, topic)
        } else if tool_calls.is_empty() {
            format!("echo: {content}")
        } else {
            String::new()
        }
    });
    let error = directive.error.map(|error| {
        let retryable = error.retryable.unwrap_or(
            error
                .status
                .is_none_or(|status| status == 429 || status >= 500),
        );
        let message = error.message.unwrap_or_else(|| match error.status {
            Some(status) => format!("fake provider returned http {status}"),
            None => "fake provider error".to_string(),
        });
        (
            LlmFailure {
                status: error.status,
                message,
                retryable,
                retry_after_ms: None,
            },
            error.after_chunks.unwrap_or(0),
        )
    });
    Plan {
        reply,
        chunks: directive.chunks,
        delay_ms: directive.delay_ms.unwrap_or(0),
        tool_calls,
        error,
    }
}

/// Lines holding `fact:` in `text`, from `fact:` on.
fn facts(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter_map(|line| line.find("fact:").map(|i| line[i..].trim_end()))
}

/// A summary request (`super::SUMMARY_SYSTEM_PROMPT`): the fake keeps every
/// `fact:` line of the material (the previous summary's included), once each.
fn summary_step(messages: &[Message]) -> Plan {
    let mut kept: Vec<&str> = Vec::new();
    for message in messages {
        if let Message::User { content, .. } = message {
            for fact in facts(content) {
                if !kept.contains(&fact) {
                    kept.push(fact);
                }
            }
        }
    }
    Plan::text(format!(
        "Summary written by the fake provider ({} facts).\n{}",
        kept.len(),
        kept.join("\n")
    ))
}

/// The `recall` directive: the first `fact:` line about `topic` in the context before the last
/// message, naming where it was (`summary` when it came from a compaction's summary).
fn recall(messages: &[Message], topic: &str) -> String {
    let earlier = &messages[..messages.len().saturating_sub(1)];
    for message in earlier {
        let (content, source) = match message {
            Message::User { content, .. } => (content, "message"),
            Message::CustomMessage {
                content,
                custom_type,
                ..
            } if custom_type == crate::wire::custom_types::COMPACTION_SUMMARY => {
                (content, "summary")
            }
            Message::CustomMessage { content, .. } => (content, "context"),
            _ => continue,
        };
        if let Some(fact) = facts(content).find(|f| f.contains(topic)) {
            return format!("recalled from the {source}: {fact}");
        }
    }
    format!("recalled nothing about {topic}")
}

/// The step after tool results came back.
fn after_tools_step(messages: &[Message]) -> Plan {
    // The directive is in the message that started the turn: the last user message before the
    // last assistant message (a system-lane message when there is no user message).
    let before = messages
        .iter()
        .rposition(|m| matches!(m, Message::Assistant(_)))
        .map_or(messages, |p| &messages[..p]);
    let directive = before
        .iter()
        .rev()
        .find_map(|message| match message {
            Message::User { content, .. } => Some(content),
            _ => None,
        })
        .or_else(|| {
            before.iter().rev().find_map(|message| match message {
                Message::CustomMessage { content, .. } => Some(content),
                _ => None,
            })
        })
        .and_then(|content| directive(content))
        .and_then(Result::ok)
        .unwrap_or_default();
    let reply = directive.after_tools.unwrap_or_else(|| {
        let start = messages
            .iter()
            .rposition(|message| matches!(message, Message::Assistant(_)))
            .map_or(0, |position| position + 1);
        let results: Vec<String> = messages
            .get(start..)
            .unwrap_or_default()
            .iter()
            .filter_map(|message| match message {
                Message::ToolResult(ToolResult {
                    tool_name, content, ..
                }) => Some(format!(
                    "{tool_name}: {}",
                    content
                        .chars()
                        .take(QUOTED_RESULT_CHARS)
                        .collect::<String>()
                )),
                _ => None,
            })
            .collect();
        format!("tool results: {}", results.join("; "))
    });
    Plan {
        reply,
        chunks: directive.chunks,
        delay_ms: directive.delay_ms.unwrap_or(0),
        ..Plan::default()
    }
}

/// Characters of a message, for the fake token count.
fn message_chars(message: &Message) -> usize {
    match message {
        Message::User { content, .. } | Message::CustomMessage { content, .. } => {
            content.chars().count()
        }
        Message::Assistant(assistant) => assistant
            .content
            .iter()
            .map(|block| match block {
                ContentBlock::Text { text } => text.chars().count(),
                ContentBlock::ToolCall(call) => {
                    let arguments = match &call.arguments {
                        Value::String(raw) => raw.chars().count(),
                        other => other.to_string().chars().count(),
                    };
                    call.name.chars().count().saturating_add(arguments)
                }
                ContentBlock::Thinking { thinking, .. } => thinking.chars().count(),
                ContentBlock::RedactedThinking { data } => data.len(),
                ContentBlock::Reasoning { summary, .. } => {
                    summary.iter().map(|s| s.chars().count()).sum()
                }
            })
            .fold(0, usize::saturating_add),
        Message::ToolResult(result) => result.content.chars().count(),
    }
}

/// Splits `reply` into text chunks whose concatenation is `reply`; none is empty.
fn split_reply(reply: &str, chunks: Option<usize>) -> Vec<String> {
    if reply.is_empty() {
        return Vec::new();
    }
    match chunks {
        Some(count) => split_evenly(reply, count),
        None => split_words(reply, WORDS_PER_CHUNK),
    }
}

/// `count` pieces of (nearly) equal character length; at most one piece per character.
fn split_evenly(text: &str, count: usize) -> Vec<String> {
    let starts: Vec<usize> = text.char_indices().map(|(byte, _)| byte).collect();
    let chars = starts.len();
    let count = count.clamp(1, chars.max(1));
    let mut pieces = Vec::with_capacity(count);
    let mut from = 0;
    for piece in 1..=count {
        // u128: `piece * chars` may overflow usize on 32-bit targets.
        let end_char = (piece as u128 * chars as u128 / count as u128) as usize;
        let to = starts.get(end_char).copied().unwrap_or(text.len());
        pieces.push(text.get(from..to).unwrap_or_default().to_string());
        from = to;
    }
    pieces
}

/// Pieces of `words` words each; whitespace stays with the word before it.
fn split_words(text: &str, words: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut from = 0;
    let mut seen = 0;
    let mut after_space = true;
    for (byte, c) in text.char_indices() {
        let space = c.is_whitespace();
        if !space && after_space {
            if seen == words {
                pieces.push(text.get(from..byte).unwrap_or_default().to_string());
                from = byte;
                seen = 0;
            }
            seen += 1;
        }
        after_space = space;
    }
    pieces.push(text.get(from..).unwrap_or_default().to_string());
    pieces
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::llm::AssistantBuilder;
    use crate::wire::{AssistantMessage, ToolCall};

    fn user(content: &str) -> Message {
        Message::User {
            author: "alice".to_string(),
            content: content.to_string(),
            queue_item_id: None,
            lane: None,
            acting_for: None,
        }
    }

    fn request(messages: Vec<Message>) -> LlmRequest {
        LlmRequest {
            model: DEFAULT_MODEL.to_string(),
            system_prompt: "sys".to_string(),
            messages,
            tools: vec![],
            max_output_tokens: None,
            reasoning: None,
            images: Default::default(),
        }
    }

    fn build(reply: &FakeReply) -> AssistantMessage {
        let mut builder = AssistantBuilder::default();
        for event in reply.events.clone() {
            builder.push(event);
        }
        builder.build(PROVIDER, DEFAULT_MODEL)
    }

    fn texts(reply: &FakeReply) -> Vec<&str> {
        reply
            .events
            .iter()
            .filter_map(|event| match event {
                LlmEvent::TextDelta(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn tool_result(id: &str, name: &str, content: &str) -> Message {
        Message::ToolResult(ToolResult {
            tool_call_id: id.to_string(),
            tool_name: name.to_string(),
            content: content.to_string(),
            is_error: false,
            blobs: Vec::new(),
        })
    }

    #[test]
    fn text_replies() {
        let long = "x".repeat(300);
        let long_result = format!("tool results: bash: {}", "x".repeat(200));
        let cases: Vec<(&str, Vec<Message>, &str)> = vec![
            ("echo", vec![user("hello there")], "echo: hello there"),
            ("no messages", vec![], "echo: "),
            (
                "custom message",
                vec![Message::CustomMessage {
                    custom_type: "wuhu_system_input_v1".to_string(),
                    content: "ping".to_string(),
                    details: None,
                }],
                "echo: ping",
            ),
            (
                "trailing custom messages are answered together",
                vec![
                    user("spawn"),
                    Message::CustomMessage {
                        custom_type: "wuhu_child_status_v1".to_string(),
                        content: "a done".to_string(),
                        details: None,
                    },
                    Message::CustomMessage {
                        custom_type: "wuhu_child_status_v1".to_string(),
                        content: "b done".to_string(),
                        details: None,
                    },
                ],
                "echo: a done\n\nb done",
            ),
            (
                "directive reply",
                vec![user("hi\n@fake {\"reply\":\"hey you\"}")],
                "hey you",
            ),
            (
                "directive without reply echoes",
                vec![user("@fake {\"delayMs\":5}")],
                "echo: @fake {\"delayMs\":5}",
            ),
            (
                "unknown fields ignored",
                vec![user("@fake {\"reply\":\"ok\",\"zzz\":1}")],
                "ok",
            ),
            (
                "invalid directive",
                vec![user("@fake {nope")],
                "fake: invalid @fake directive: key must be a string at line 1 column 2",
            ),
            (
                "wrong directive type",
                vec![user("@fake {\"chunks\":\"two\"}")],
                "fake: invalid @fake directive: invalid type: string \"two\", expected usize at line 1 column 15",
            ),
            (
                "tool results summary",
                vec![
                    user("go"),
                    Message::Assistant(AssistantMessage::default()),
                    tool_result("a", "old", "ignored: before the last assistant message"),
                    Message::Assistant(AssistantMessage::default()),
                    tool_result("b", "bash", &long),
                    tool_result("c", "read", "short"),
                ],
                "", // checked below
            ),
            (
                "tool results summary truncates",
                vec![
                    user("go"),
                    Message::Assistant(AssistantMessage::default()),
                    tool_result("b", "bash", &long),
                ],
                &long_result,
            ),
        ];
        for (name, messages, expected) in cases {
            let reply = respond(&request(messages));
            let message = build(&reply);
            let expected = if expected.is_empty() {
                format!("tool results: bash: {}; read: short", "x".repeat(200))
            } else {
                expected.to_string()
            };
            assert_eq!(message.text(), expected, "{name}");
            assert_eq!(message.stop_reason, StopReason::Stop, "{name}");
            assert_eq!(reply.failure, None, "{name}");
            assert_eq!(
                reply.chunk_delay_ms,
                if name.contains("without reply") { 5 } else { 0 }
            );
            assert!(
                matches!(
                    reply.events.last(),
                    Some(LlmEvent::Finish(StopReason::Stop))
                ),
                "{name}"
            );
        }
    }

    #[test]
    fn echo_events_are_exact() {
        let reply = respond(&request(vec![user("one two three four five")]));
        assert_eq!(
            reply,
            FakeReply {
                events: vec![
                    LlmEvent::TextDelta("echo: one two ".to_string()),
                    LlmEvent::TextDelta("three four five".to_string()),
                    // 23 chars and the 3-char system prompt / 4 = 6; "echo: one two three
                    // four five" is 29 chars: 29/4+1 = 8
                    LlmEvent::Usage(Usage {
                        input_tokens: 6,
                        output_tokens: 8,
                        total_tokens: 14,
                        ..Usage::default()
                    }),
                    LlmEvent::Finish(StopReason::Stop),
                ],
                chunk_delay_ms: 0,
                failure: None,
            }
        );
    }

    #[test]
    fn reply_with_chunks() {
        let cases = [
            (r#"{"reply":"abcdef","chunks":3}"#, vec!["ab", "cd", "ef"]),
            (r#"{"reply":"abcdefg","chunks":2}"#, vec!["abc", "defg"]),
            (r#"{"reply":"héllo","chunks":1}"#, vec!["héllo"]),
            (r#"{"reply":"héllo","chunks":0}"#, vec!["héllo"]),
            (r#"{"reply":"é🦀","chunks":99}"#, vec!["é", "🦀"]),
            (r#"{"reply":"","chunks":4}"#, vec![]),
        ];
        for (directive, expected) in cases {
            let reply = respond(&request(vec![user(&format!("@fake {directive}"))]));
            assert_eq!(texts(&reply), expected, "{directive}");
        }
    }

    #[test]
    fn default_chunking_reassembles() {
        let samples = [
            "",
            "one",
            "  leading and trailing  ",
            "a b c d e f g h i j k",
            "multi\nline\r\n text\twith   gaps 🦀 ünïcödé",
        ];
        for sample in samples {
            let pieces = split_words(sample, WORDS_PER_CHUNK);
            assert_eq!(pieces.concat(), sample);
            assert!(
                pieces
                    .iter()
                    .all(|p| p.split_whitespace().count() <= WORDS_PER_CHUNK)
            );
            let reply = respond(&request(vec![user(sample)]));
            assert_eq!(texts(&reply).concat(), format!("echo: {sample}"));
            assert!(texts(&reply).iter().all(|t| !t.is_empty()));
        }
        assert_eq!(
            split_words("a b c d e f g", 3),
            vec!["a b c ", "d e f ", "g"]
        );
    }

    #[test]
    fn tool_calls_then_after_tools() {
        let directive = r#"@fake {"reply":"checking","delayMs":7,"toolCalls":[{"name":"bash","arguments":{"command":"ls"}},{"name":"read","id":"mine"},{"name":"write","arguments":"{broken"}],"afterTools":"all done"}"#;
        let mut messages = vec![user("earlier"), user(directive)];
        let reply = respond(&request(messages.clone()));
        assert_eq!(reply.chunk_delay_ms, 7);
        assert_eq!(reply.failure, None);
        let message = build(&reply);
        assert_eq!(message.text(), "checking");
        assert_eq!(message.stop_reason, StopReason::ToolUse);
        assert_eq!(
            message.tool_calls().cloned().collect::<Vec<_>>(),
            vec![
                ToolCall {
                    id: "call_0_2".to_string(),
                    name: "bash".to_string(),
                    arguments: json!({"command": "ls"}),
                },
                ToolCall {
                    id: "mine".to_string(),
                    name: "read".to_string(),
                    arguments: json!({})
                },
                ToolCall {
                    id: "call_2_2".to_string(),
                    name: "write".to_string(),
                    arguments: Value::String("{broken".to_string()),
                },
            ]
        );
        assert!(matches!(
            reply.events.last(),
            Some(LlmEvent::Finish(StopReason::ToolUse))
        ));

        messages.push(Message::Assistant(message));
        messages.push(tool_result("call_0_2", "bash", "a.txt"));
        messages.push(tool_result("mine", "read", "content"));
        messages.push(tool_result("call_2_2", "write", "bad arguments"));
        let reply = respond(&request(messages.clone()));
        assert_eq!(reply.chunk_delay_ms, 7);
        let message = build(&reply);
        assert_eq!(message.text(), "all done");
        assert_eq!(message.stop_reason, StopReason::Stop);
        assert_eq!(message.tool_calls().count(), 0);

        // Context added after the tool results (AGENTS.md) keeps this the after-tools step.
        let mut with_context = messages.clone();
        with_context.push(Message::CustomMessage {
            custom_type: "wuhu_agents_md_v1".to_string(),
            content: "# AGENTS.md".to_string(),
            details: None,
        });
        assert_eq!(build(&respond(&request(with_context))).text(), "all done");

        // A message delivered after the tool results (steer) is answered on its own.
        messages.push(user("steer"));
        assert_eq!(build(&respond(&request(messages))).text(), "echo: steer");
    }

    #[test]
    fn tool_calls_without_reply_have_no_text() {
        let reply = respond(&request(vec![user(
            r#"@fake {"toolCalls":[{"name":"bash"}]}"#,
        )]));
        assert!(matches!(
            reply.events.first(),
            Some(LlmEvent::ToolCallStart { index: 0, .. })
        ));
        let message = build(&reply);
        assert_eq!(message.content.len(), 1);
        assert_eq!(message.text(), "");
    }

    /// (directive, status, message, retryable, text chunks before the failure)
    type ErrorCase = (
        &'static str,
        Option<u16>,
        &'static str,
        bool,
        &'static [&'static str],
    );

    #[test]
    fn errors() {
        let cases: [ErrorCase; 7] = [
            (
                r#"{"error":{"status":429}}"#,
                Some(429),
                "fake provider returned http 429",
                true,
                &[],
            ),
            (
                r#"{"error":{"status":503,"message":"down"}}"#,
                Some(503),
                "down",
                true,
                &[],
            ),
            (
                r#"{"error":{"status":400,"message":"bad request"}}"#,
                Some(400),
                "bad request",
                false,
                &[],
            ),
            (r#"{"error":{}}"#, None, "fake provider error", true, &[]),
            (
                r#"{"error":{"status":500,"retryable":false}}"#,
                Some(500),
                "fake provider returned http 500",
                false,
                &[],
            ),
            (
                r#"{"reply":"a b c d e f g","chunks":4,"toolCalls":[{"name":"x"}],"error":{"afterChunks":2,"message":"cut"}}"#,
                None,
                "cut",
                true,
                &["a b", " c "],
            ),
            (
                r#"{"reply":"abc","chunks":3,"error":{"afterChunks":10}}"#,
                None,
                "fake provider error",
                true,
                &["a", "b", "c"],
            ),
        ];
        for (directive, status, message, retryable, chunks) in cases {
            let reply = respond(&request(vec![user(&format!("@fake {directive}"))]));
            assert_eq!(
                reply.failure,
                Some(LlmFailure {
                    status,
                    message: message.to_string(),
                    retryable,
                    retry_after_ms: None
                }),
                "{directive}"
            );
            assert_eq!(
                reply.events,
                chunks
                    .iter()
                    .map(|c| LlmEvent::TextDelta(c.to_string()))
                    .collect::<Vec<_>>(),
                "{directive}"
            );
        }
    }

    #[test]
    fn huge_delay_is_capped() {
        let reply = respond(&request(vec![user(
            r#"@fake {"delayMs":18446744073709551615}"#,
        )]));
        assert_eq!(reply.chunk_delay_ms, MAX_DELAY_MS);
    }
}
