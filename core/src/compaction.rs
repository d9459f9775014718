//! Context that fits the model's window: token estimates, when to compact, where to cut, the
//! summary request, and the request of a compacted session (decision 0011).
//!
//! The context of a step is, in order: the system prompt and tools, the *pinned* messages (the
//! global context and the AGENTS.md of each attached environment) when they are older than
//! what is sent as it is, the latest compaction's summary, then the *tail*: the entries from the
//! compaction's `first_kept_cursor` on (all held entries when there was no compaction).
//!
//! Tokens are estimated from bytes per dialect ([`bytes_per_token`]) and corrected by the
//! provider's report: the newest assistant message of the tail (after the latest compaction, same
//! model) reported the input tokens of the request before it, so the next request costs that,
//! plus its output, plus the estimate of what came after it.
//!
//! [`plan_step`] compacts when the estimate would pass [`COMPACT_AT_PERCENT`] of the window, or
//! when the tail holds more than [`MAX_TAIL_ENTRIES`] entries (the host keeps at most
//! `HOT_TAIL_KEEP` in memory; compacting first means nothing leaves the context unsummarised).
//! The cut keeps the newest [`KEEP_TAIL_PERCENT`] of the window as it is, and never separates a
//! tool call from its result. It never loses the user messages of the turn being answered (those
//! after the last reply that ended a turn): it falls before them when such a cut fits; otherwise
//! (a turn too long for the kept share) it falls inside the turn and the compaction *carries*
//! them: later requests send them as they are, right after the summary (`kept_cursors`).

pub use crate::anchors::{Anchors, CompactionAnchor, MAX_PINNED, Pinned};
use crate::context::{ContextWindow, render, repair_tool_results};
pub use crate::llm::SUMMARY_SYSTEM_PROMPT;
use crate::llm::models::ModelTable;
use crate::llm::{LlmRequest, ToolSchema};
use crate::wire::{
    AssistantMessage, Compaction, CompactionReason, ContentBlock, Entry, EntryPayload, Header,
    Message, custom_types,
};

/// Compact when the next request's estimated input passes this share of the window.
pub const COMPACT_AT_PERCENT: u64 = 80;
/// The share of the window a compaction keeps as it is (the newest entries).
pub const KEEP_TAIL_PERCENT: u64 = 20;
/// Compact when the tail holds more entries than this (the host's in-memory window holds 1024).
pub const MAX_TAIL_ENTRIES: usize = 768;
/// The share of the window the material of a summary request may fill; older material is left
/// out (with a note) beyond it.
pub const SUMMARY_INPUT_PERCENT: u64 = 60;
/// Output tokens a summary request asks for.
pub const SUMMARY_MAX_OUTPUT_TOKENS: u32 = 4096;
/// Longest summary stored, in bytes (longer ones are cut at a character boundary).
pub const MAX_SUMMARY_BYTES: usize = 32 * 1024;
/// Characters of one tool result, tool call or context message quoted in a summary request.
pub const QUOTED_CHARS: usize = 2000;
/// Most user messages a compaction carries (the turn's first one and its newest others).
pub const MAX_KEPT_MESSAGES: usize = 16;
/// Tokens counted per message for its framing (role, separators).
const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// Bytes per token of a provider's tokenizer on typical English text and code (conservative:
/// Anthropic's tokenizer yields more tokens per byte than OpenAI's `o200k`).
pub fn bytes_per_token(provider: &str) -> f64 {
    match provider {
        "anthropic" => 3.5,
        _ => 4.0,
    }
}

fn tokens_of(bytes: usize, provider: &str) -> u64 {
    (bytes as f64 / bytes_per_token(provider)).ceil() as u64
}

/// Estimated tokens of one message; a tool result's images count as
/// [`crate::images::estimate_tokens`] each (every image it could show: a request may leave some
/// out, so this errs high).
pub fn estimate_message(provider: &str, message: &Message) -> u64 {
    let bytes = match message {
        Message::User { content, .. } | Message::CustomMessage { content, .. } => content.len(),
        Message::ToolResult(result) => {
            let images: u64 = crate::llm::inline_images::image_blobs(result)
                .map(|b| crate::images::estimate_tokens(provider, b.width, b.height))
                .sum();
            return tokens_of(result.content.len() + result.tool_name.len(), provider)
                + images
                + MESSAGE_OVERHEAD_TOKENS;
        }
        Message::Assistant(assistant) => assistant
            .content
            .iter()
            .map(|block| match block {
                ContentBlock::Text { text } => text.len(),
                ContentBlock::ToolCall(call) => {
                    call.name.len() + call.id.len() + call.arguments.to_string().len()
                }
                ContentBlock::Thinking {
                    thinking,
                    signature,
                } => thinking.len() + signature.len() / 4,
                ContentBlock::RedactedThinking { data } => data.len() / 4,
                ContentBlock::Reasoning {
                    summary,
                    encrypted_content,
                    ..
                } => {
                    summary.iter().map(String::len).sum::<usize>()
                        + encrypted_content.as_ref().map_or(0, |c| c.len() / 4)
                }
            })
            .sum(),
    };
    tokens_of(bytes, provider) + MESSAGE_OVERHEAD_TOKENS
}

/// Estimated tokens of the system prompt and the tool definitions.
pub fn estimate_fixed(provider: &str, system_prompt: &str, tools: &[ToolSchema]) -> u64 {
    let tool_bytes: usize = tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.text_len())
        .sum();
    tokens_of(system_prompt.len() + tool_bytes, provider)
}

/// One message of the tail, with what the plan needs to know of it.
#[derive(Clone, Debug)]
struct Item {
    cursor: u64,
    message: Message,
    tokens: u64,
    /// Whether the tail may start here: not a tool result, and no tool call of the messages
    /// before it waits for its result.
    cut: bool,
}

/// The parts of a step's context.
struct Parts {
    /// Pinned messages not in the tail, oldest first.
    pinned: Vec<Message>,
    /// The latest compaction, if any (its entry cursor and the entry).
    compaction: Option<(u64, Compaction)>,
    /// The user messages the latest compaction carries, not in the tail, oldest first.
    kept: Vec<Item>,
    /// The tail's messages.
    items: Vec<Item>,
    /// How many entries (of every kind) the tail spans.
    tail_entries: usize,
    /// Tokens of the system prompt and tools.
    fixed: u64,
}

fn summary_message(compaction: &Compaction) -> Message {
    Message::CustomMessage {
        custom_type: custom_types::COMPACTION_SUMMARY.into(),
        content: format!(
            "Summary of the earlier part of this session (the messages it replaces are not shown):\n\n{}",
            compaction.summary
        ),
        details: None,
    }
}

fn parts(
    header: &Header,
    window: &ContextWindow,
    group_chat_since: Option<u64>,
    tools: &[ToolSchema],
) -> Parts {
    let provider = header.provider.as_str();
    let compaction = window.compaction().and_then(|entry| match &entry.payload {
        EntryPayload::Compaction(c) => Some((entry.cursor, c.clone())),
        _ => None,
    });
    let first_kept = compaction.as_ref().map_or(0, |(_, c)| c.first_kept_cursor);
    let tail: Vec<&Entry> = window
        .entries()
        .filter(|e| e.cursor >= first_kept)
        .collect();
    let tail_start = tail.first().map_or(u64::MAX, |e| e.cursor);
    let pinned: Vec<Message> = window
        .pinned()
        .filter(|e| e.cursor < tail_start)
        .filter_map(|e| match &e.payload {
            EntryPayload::Message { message } => Some(message.clone()),
            _ => None,
        })
        .collect();
    let kept: Vec<Item> = window
        .kept()
        .filter(|e| e.cursor < tail_start)
        .filter_map(|e| match &e.payload {
            EntryPayload::Message { message } => {
                let message = render(e.cursor, message, group_chat_since);
                Some(Item {
                    cursor: e.cursor,
                    tokens: estimate_message(provider, &message),
                    message,
                    cut: false,
                })
            }
            _ => None,
        })
        .collect();
    let mut items: Vec<Item> = Vec::new();
    let mut open_calls: Vec<String> = Vec::new();
    for entry in &tail {
        let EntryPayload::Message { message } = &entry.payload else {
            continue;
        };
        let message = render(entry.cursor, message, group_chat_since);
        let cut = match &message {
            Message::ToolResult(result) => {
                open_calls.retain(|id| *id != result.tool_call_id);
                false
            }
            Message::Assistant(assistant) => {
                open_calls = assistant.tool_calls().map(|c| c.id.clone()).collect();
                true
            }
            _ => open_calls.is_empty(),
        };
        items.push(Item {
            cursor: entry.cursor,
            tokens: estimate_message(provider, &message),
            message,
            cut,
        });
    }
    if compaction.is_none() {
        // Without a summary the context must open with a person's (or the system's) message,
        // never with a reply or an orphaned tool result (decision 0001's window).
        let start = items
            .iter()
            .position(|i| {
                matches!(
                    i.message,
                    Message::User { .. } | Message::CustomMessage { .. }
                )
            })
            .unwrap_or(items.len());
        items.drain(..start);
    } else {
        let start = items
            .iter()
            .position(|i| !matches!(i.message, Message::ToolResult(_)))
            .unwrap_or(items.len());
        items.drain(..start);
    }
    if let Some(first) = items.first_mut() {
        // The tail's first message is where the context resumes: cutting there summarises
        // nothing new.
        first.cut = false;
    }
    Parts {
        pinned,
        compaction,
        kept,
        items,
        tail_entries: tail.len(),
        fixed: estimate_fixed(provider, &header.system_prompt, tools),
    }
}

impl Parts {
    /// The estimate without the provider's report, and the corrected one.
    fn estimate(&self, header: &Header) -> (u64, u64) {
        let provider = header.provider.as_str();
        let prefix: u64 = self
            .pinned
            .iter()
            .map(|m| estimate_message(provider, m))
            .sum::<u64>()
            + self
                .compaction
                .as_ref()
                .map_or(0, |(_, c)| estimate_message(provider, &summary_message(c)))
            + self.kept.iter().map(|i| i.tokens).sum::<u64>();
        let items: u64 = self.items.iter().map(|i| i.tokens).sum();
        let raw = self.fixed + prefix + items;
        let compaction_cursor = self.compaction.as_ref().map_or(0, |(cursor, _)| *cursor);
        let reported = self.items.iter().enumerate().rev().find_map(|(i, item)| {
            let Message::Assistant(assistant) = &item.message else {
                return None;
            };
            let usage = assistant.usage.as_ref()?;
            (item.cursor > compaction_cursor
                && assistant.model == header.model
                && assistant.provider == header.provider
                && usage.input_tokens > 0)
                .then(|| {
                    usage.input_tokens.saturating_add(usage.output_tokens)
                        + self.items[i + 1..].iter().map(|i| i.tokens).sum::<u64>()
                })
        });
        (raw, reported.unwrap_or(raw))
    }

    fn into_request(self, header: &Header, tools: Vec<ToolSchema>) -> LlmRequest {
        let mut messages = self.pinned;
        if let Some((_, compaction)) = &self.compaction {
            messages.push(summary_message(compaction));
        }
        messages.extend(self.kept.into_iter().map(|i| i.message));
        messages.extend(self.items.into_iter().map(|i| i.message));
        repair_tool_results(&mut messages);
        LlmRequest {
            model: header.model.clone(),
            system_prompt: header.system_prompt.clone(),
            messages,
            tools,
            max_output_tokens: None,
            reasoning: None,
            images: Default::default(),
        }
    }
}

/// The request of one step and its estimated input tokens, from `window`.
pub fn build(
    header: &Header,
    window: &ContextWindow,
    group_chat_since: Option<u64>,
    tools: Vec<ToolSchema>,
) -> (LlmRequest, u64) {
    let parts = parts(header, window, group_chat_since, &tools);
    let (_, estimate) = parts.estimate(header);
    (parts.into_request(header, tools), estimate)
}

/// What the host does for a step.
#[derive(Debug, Clone, PartialEq)]
pub enum StepPlan {
    /// Send this request.
    Send {
        /// The request.
        request: LlmRequest,
        /// Its estimated input tokens.
        estimated_tokens: u64,
    },
    /// Compact first (send the job's request, then [`CompactionJob::finish`] and
    /// `Session::handle_compaction`), then plan again.
    Compact(CompactionJob),
}

/// A summary request to make, and what its compaction keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionJob {
    /// The summary request.
    pub request: LlmRequest,
    /// The oldest entry kept as it is.
    pub first_kept_cursor: u64,
    /// The user messages before `first_kept_cursor` carried as they are (see the module doc).
    pub kept_cursors: Vec<u64>,
    /// Estimated input tokens of the context being compacted.
    pub tokens_before: u64,
    /// Why.
    pub reason: CompactionReason,
    /// Instructions of a manual compaction.
    pub instructions: Option<String>,
}

/// Why nothing can be compacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nothing to compact: the context has no earlier message to summarise")]
pub struct NothingToCompact;

/// The request for the next step, or a compaction first when the request would pass
/// [`COMPACT_AT_PERCENT`] of the model's window or the tail would pass [`MAX_TAIL_ENTRIES`].
/// `may_compact`: false once this step compacted (it then sends what it has).
pub fn plan_step(
    header: &Header,
    models: &ModelTable,
    window: &ContextWindow,
    group_chat_since: Option<u64>,
    tools: Vec<ToolSchema>,
    may_compact: bool,
) -> StepPlan {
    let parts = parts(header, window, group_chat_since, &tools);
    let (_, estimate) = parts.estimate(header);
    let context_window = models.context_window(&header.provider, &header.model);
    let over_tokens = estimate > context_window * COMPACT_AT_PERCENT / 100;
    let over_entries = parts.tail_entries > MAX_TAIL_ENTRIES;
    if may_compact
        && (over_tokens || over_entries)
        && let Ok(job) = job_from_parts(header, models, &parts, CompactionReason::Auto, None)
    {
        return StepPlan::Compact(job);
    }
    StepPlan::Send {
        request: parts.into_request(header, tools),
        estimated_tokens: estimate,
    }
}

/// A compaction of the current context (manual, or after the provider refused it as too long).
///
/// # Errors
/// [`NothingToCompact`] when the tail has no place to cut after its first message.
pub fn plan_compaction(
    header: &Header,
    models: &ModelTable,
    window: &ContextWindow,
    group_chat_since: Option<u64>,
    tools: &[ToolSchema],
    reason: CompactionReason,
    instructions: Option<String>,
) -> Result<CompactionJob, NothingToCompact> {
    let parts = parts(header, window, group_chat_since, tools);
    job_from_parts(header, models, &parts, reason, instructions)
}

fn job_from_parts(
    header: &Header,
    models: &ModelTable,
    parts: &Parts,
    reason: CompactionReason,
    instructions: Option<String>,
) -> Result<CompactionJob, NothingToCompact> {
    let (raw, estimate) = parts.estimate(header);
    // Per-message estimates scaled by what the provider reported for the whole.
    let scale = if raw == 0 {
        1.0
    } else {
        estimate as f64 / raw as f64
    };
    let context_window = models.context_window(&header.provider, &header.model);
    let keep_budget = context_window * KEEP_TAIL_PERCENT / 100;
    // Tokens and entries from each item to the end.
    let mut suffix_tokens = vec![0u64; parts.items.len() + 1];
    for (i, item) in parts.items.iter().enumerate().rev() {
        suffix_tokens[i] = suffix_tokens[i + 1] + item.tokens;
    }
    let last_cursor = parts.items.last().map_or(0, |i| i.cursor);
    let cuts: Vec<usize> = (0..parts.items.len())
        .filter(|&i| parts.items[i].cut)
        .collect();
    let turn = Turn::of(parts);
    let fits = |i: usize| {
        ((suffix_tokens[i] + turn.carried_tokens(parts, i)) as f64 * scale) as u64 <= keep_budget
            && (last_cursor - parts.items[i].cursor) as usize <= MAX_TAIL_ENTRIES / 2
    };
    // The earliest cut that fits and keeps the turn's user messages in the tail; else the
    // earliest that fits carrying them; else the newest.
    let cut = cuts
        .iter()
        .copied()
        .find(|&i| !turn.carries(i) && fits(i))
        .or_else(|| cuts.iter().copied().find(|&i| fits(i)))
        .or_else(|| cuts.last().copied())
        .ok_or(NothingToCompact)?;
    let first_kept_cursor = parts.items[cut].cursor;
    let kept_cursors = turn.carried(parts, cut);
    let request = summary_request(
        header,
        parts.compaction.as_ref().map(|(_, c)| c.summary.as_str()),
        &parts.items[..cut],
        instructions.as_deref(),
        context_window,
    );
    Ok(CompactionJob {
        request,
        first_kept_cursor,
        kept_cursors,
        tokens_before: estimate,
        reason,
        instructions,
    })
}

/// The user messages of the turn being answered: those of the tail after the last reply that
/// ended a turn (an assistant message without tool calls), and, while no such reply follows the
/// latest compaction, the ones it carries.
struct Turn {
    /// The latest compaction carries messages of this turn (`Parts::kept`).
    carries_previous: bool,
    /// Indices in `Parts::items` of the turn's user messages.
    users: Vec<usize>,
}

impl Turn {
    fn of(parts: &Parts) -> Turn {
        let start = parts
            .items
            .iter()
            .rposition(
                |i| matches!(&i.message, Message::Assistant(a) if a.tool_calls().next().is_none()),
            )
            .map(|i| i + 1);
        Turn {
            carries_previous: start.is_none() && !parts.kept.is_empty(),
            users: (start.unwrap_or(0)..parts.items.len())
                .filter(|&i| matches!(parts.items[i].message, Message::User { .. }))
                .collect(),
        }
    }

    /// Whether a cut at item `cut` leaves some of the turn's user messages before it.
    fn carries(&self, cut: usize) -> bool {
        self.carries_previous || self.users.first().is_some_and(|&u| u < cut)
    }

    /// The items a cut at `cut` carries: the turn's first user message and its newest others,
    /// at most [`MAX_KEPT_MESSAGES`].
    fn carried_items<'a>(&self, parts: &'a Parts, cut: usize) -> Vec<&'a Item> {
        let mut carried: Vec<&Item> = if self.carries_previous {
            parts.kept.iter().collect()
        } else {
            Vec::new()
        };
        carried.extend(
            self.users
                .iter()
                .filter(|&&u| u < cut)
                .map(|&u| &parts.items[u]),
        );
        if carried.len() > MAX_KEPT_MESSAGES {
            carried.drain(1..carried.len() + 1 - MAX_KEPT_MESSAGES);
        }
        carried
    }

    fn carried_tokens(&self, parts: &Parts, cut: usize) -> u64 {
        self.carried_items(parts, cut)
            .iter()
            .map(|i| i.tokens)
            .sum()
    }

    fn carried(&self, parts: &Parts, cut: usize) -> Vec<u64> {
        self.carried_items(parts, cut)
            .iter()
            .map(|i| i.cursor)
            .collect()
    }
}

/// `text` cut to at most `max` characters, with a note of how much was left out.
fn quote(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((end, _)) => format!(
            "{} […{} more characters]",
            &text[..end],
            text[end..].chars().count()
        ),
    }
}

/// One summarised message as a line of the summary request.
fn transcript_line(message: &Message) -> Option<String> {
    match message {
        Message::User {
            author, content, ..
        } => Some(format!(
            "[user {author}]: {}",
            quote(content, QUOTED_CHARS * 4)
        )),
        Message::CustomMessage {
            custom_type,
            content,
            ..
        } => Some(format!(
            "[context {custom_type}]: {}",
            quote(content, QUOTED_CHARS)
        )),
        Message::ToolResult(result) => Some(format!(
            "[tool result {}{}]: {}",
            result.tool_name,
            if result.is_error { ", error" } else { "" },
            quote(&result.content, QUOTED_CHARS)
        )),
        Message::Assistant(assistant) => {
            let mut parts: Vec<String> = Vec::new();
            let text = assistant.text();
            if !text.is_empty() {
                parts.push(format!("[assistant]: {}", quote(&text, QUOTED_CHARS * 4)));
            }
            for call in assistant.tool_calls() {
                parts.push(format!(
                    "[assistant calls {}]: {}",
                    call.name,
                    quote(&call.arguments.to_string(), QUOTED_CHARS)
                ));
            }
            (!parts.is_empty()).then(|| parts.join("\n"))
        }
    }
}

/// The summary request: the previous summary and the messages before the cut as one text.
/// Beyond [`SUMMARY_INPUT_PERCENT`] of the window the oldest lines are left out.
fn summary_request(
    header: &Header,
    previous: Option<&str>,
    summarised: &[Item],
    instructions: Option<&str>,
    context_window: u64,
) -> LlmRequest {
    let budget_bytes = ((context_window * SUMMARY_INPUT_PERCENT / 100) as f64
        * bytes_per_token(&header.provider)) as usize;
    let fixed = SUMMARY_SYSTEM_PROMPT.len()
        + previous.map_or(0, str::len)
        + instructions.map_or(0, str::len)
        + 256;
    let mut lines: Vec<String> = summarised
        .iter()
        .filter_map(|i| transcript_line(&i.message))
        .collect();
    let mut bytes: usize = fixed + lines.iter().map(|l| l.len() + 1).sum::<usize>();
    let mut omitted = 0usize;
    while bytes > budget_bytes && lines.len() > 1 {
        bytes -= lines[omitted].len() + 1;
        omitted += 1;
        if omitted == lines.len() - 1 {
            break;
        }
    }
    let lines = lines.split_off(omitted);
    let mut text = String::new();
    if let Some(previous) = previous {
        text.push_str("Summary so far:\n\n");
        text.push_str(previous);
        text.push_str("\n\n");
    }
    text.push_str("Messages since then:\n\n");
    if omitted > 0 {
        text.push_str(&format!(
            "[… {omitted} older messages left out: they did not fit …]\n"
        ));
    }
    for line in &lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("\nWrite the new summary: it replaces the summary so far and these messages.");
    if let Some(instructions) = instructions {
        text.push_str("\nInstructions for this summary: ");
        text.push_str(instructions);
    }
    LlmRequest {
        model: header.model.clone(),
        system_prompt: SUMMARY_SYSTEM_PROMPT.into(),
        messages: vec![Message::User {
            author: "wuhu".into(),
            content: text,
            queue_item_id: None,
            lane: None,
            acting_for: None,
        }],
        tools: Vec::new(),
        images: Default::default(),
        max_output_tokens: Some(SUMMARY_MAX_OUTPUT_TOKENS),
        reasoning: None,
    }
}

impl CompactionJob {
    /// The `compaction` entry's payload, from the summary reply. `None` when the reply has no
    /// text (the compaction failed).
    pub fn finish(self, header: &Header, reply: &AssistantMessage) -> Option<Compaction> {
        let text = reply.text();
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        let summary = if text.len() > MAX_SUMMARY_BYTES {
            let end = (0..=MAX_SUMMARY_BYTES)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            format!(
                "{} [summary cut at {MAX_SUMMARY_BYTES} bytes]",
                &text[..end]
            )
        } else {
            text.to_string()
        };
        Some(Compaction {
            summary,
            first_kept_cursor: self.first_kept_cursor,
            kept_cursors: self.kept_cursors,
            tokens_before: self.tokens_before,
            reason: self.reason,
            instructions: self.instructions,
            provider: header.provider.clone(),
            model: header.model.clone(),
            usage: reply.usage,
        })
    }
}

/// Builds the request for one step from `entries` (oldest first, no anchors): see
/// [`build`].
///
/// `group_chat_since` is the cursor of the session's group-chat reminder, if any: user messages
/// after it reach the LLM as `[author]:\n\n<content>`; earlier ones are unchanged. The
/// transcript itself always keeps the raw content and the author.
pub fn build_request(
    header: &Header,
    entries: &[Entry],
    group_chat_since: Option<u64>,
    tools: Vec<ToolSchema>,
) -> LlmRequest {
    let mut window = ContextWindow::default();
    for entry in entries {
        window.push(entry.clone(), 0);
    }
    build(header, &window, group_chat_since, tools).0
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_tests;
