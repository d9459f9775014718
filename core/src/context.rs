//! Which transcript entries the LLM sees, and in what shape.
//!
//! The host keeps a [`ContextWindow`]: the newest entries (see [`crate::archive::HOT_TAIL_KEEP`])
//! plus the older ones the context still needs (the pinned global context and AGENTS.md, the
//! latest `compaction` entry; see [`crate::anchors::Anchors`]). [`crate::compaction`] builds
//! each request from it. Without a compaction the context opens at the first user message of the
//! window, so never with an orphaned tool result. A tool call without a result (possible only
//! after an interruption) gets a synthetic error result, because providers reject a call with no
//! answer.

use std::collections::{BTreeMap, VecDeque};

use crate::anchors::Anchors;
use crate::archive::HOT_TAIL_KEEP;
use crate::wire::{Entry, EntryPayload, Message, ToolResult};

/// Most JSON bytes of entries the context window holds in memory.
pub const WINDOW_MAX_BYTES: usize = 8 * 1024 * 1024;

/// The entries a host keeps in memory for the LLM context: the newest ones, at most
/// [`HOT_TAIL_KEEP`] entries and [`WINDOW_MAX_BYTES`] of entry JSON, oldest evicted first, but
/// never the newest entry (a single larger entry stays alone); and the anchored ones (pinned
/// messages, the latest compaction and the user messages it carries: at most
/// `MAX_PINNED + 1 + MAX_KEPT_MESSAGES`), whatever their age.
#[derive(Debug, Default)]
pub struct ContextWindow {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    anchors: Anchors,
    anchored: BTreeMap<u64, Entry>,
}

impl ContextWindow {
    /// Appends `entry`, whose JSON has `bytes` bytes, and evicts what no longer fits.
    pub fn push(&mut self, entry: Entry, bytes: usize) {
        self.observe(&entry);
        self.entries.push_back((entry, bytes));
        self.bytes += bytes;
        while self.entries.len() > HOT_TAIL_KEEP as usize
            || (self.bytes > WINDOW_MAX_BYTES && self.entries.len() > 1)
        {
            if let Some((_, evicted)) = self.entries.pop_front() {
                self.bytes -= evicted;
            }
        }
    }

    /// Notes an older entry the context needs (read by the cursors of the checkpoint's
    /// anchors when loading), before the newest entries are pushed, oldest first.
    pub fn push_anchor(&mut self, entry: Entry) {
        self.observe(&entry);
        // Every anchor the checkpoint names is needed, including the user messages a
        // compaction carries, which come before the compaction that anchors them.
        self.anchored.insert(entry.cursor, entry);
    }

    fn observe(&mut self, entry: &Entry) {
        for dropped in self.anchors.observe(entry) {
            self.anchored.remove(&dropped);
        }
        let cursors = self.anchors.cursors();
        if cursors.contains(&entry.cursor) {
            self.anchored.insert(entry.cursor, entry.clone());
        }
        if matches!(entry.payload, EntryPayload::Compaction(_)) {
            // The user messages it carries are held among the newest entries (or anchored
            // already): keep them once those are evicted.
            for (held, _) in &self.entries {
                if cursors.contains(&held.cursor) && !self.anchored.contains_key(&held.cursor) {
                    self.anchored.insert(held.cursor, held.clone());
                }
            }
        }
    }

    /// The newest entries held, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().map(|(entry, _)| entry)
    }

    /// The pinned messages held (global context, attached environments' AGENTS.md), oldest
    /// first.
    pub fn pinned(&self) -> impl Iterator<Item = &Entry> {
        let pinned: Vec<u64> = self.anchors.pinned.iter().map(|p| p.cursor).collect();
        self.anchored
            .values()
            .filter(move |e| pinned.contains(&e.cursor))
    }

    /// The latest `compaction` entry, if held.
    pub fn compaction(&self) -> Option<&Entry> {
        self.anchors
            .compaction
            .as_ref()
            .and_then(|c| self.anchored.get(&c.cursor))
    }

    /// The user messages the latest compaction carries, held, oldest first.
    pub fn kept(&self) -> impl Iterator<Item = &Entry> {
        self.anchors
            .compaction
            .iter()
            .flat_map(|c| c.kept.iter())
            .filter_map(|cursor| self.anchored.get(cursor))
    }

    /// How many of the newest entries are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// JSON bytes of the newest entries held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A transcript message as the LLM sees it: in a group chat, user messages name their author.
pub(crate) fn render(cursor: u64, message: &Message, group_chat_since: Option<u64>) -> Message {
    match message {
        Message::User {
            author,
            content,
            queue_item_id,
            lane,
            acting_for,
        } if group_chat_since.is_some_and(|since| cursor > since) => Message::User {
            author: author.clone(),
            content: format!("[{author}]:\n\n{content}"),
            queue_item_id: queue_item_id.clone(),
            lane: *lane,
            acting_for: acting_for.clone(),
        },
        other => other.clone(),
    }
}

/// Gives every tool call a result right after its assistant message and drops results whose
/// call is not in the context.
pub(crate) fn repair_tool_results(messages: &mut Vec<Message>) {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    let mut open_calls: Vec<(String, String)> = Vec::new();
    let close_open = |open: &mut Vec<(String, String)>, out: &mut Vec<Message>| {
        for (id, name) in open.drain(..) {
            out.push(Message::ToolResult(ToolResult {
                tool_call_id: id,
                tool_name: name,
                content: "Tool result missing: the call was interrupted.".into(),
                is_error: true,
                blobs: Vec::new(),
            }));
        }
    };
    // Messages that arrived while tool calls were open (context a tool added, such as an
    // environment's AGENTS.md) wait until the calls are answered: providers need the results
    // right after the calls.
    let mut deferred: Vec<Message> = Vec::new();
    for message in messages.drain(..) {
        match &message {
            Message::ToolResult(result) => {
                if let Some(pos) = open_calls
                    .iter()
                    .position(|(id, _)| *id == result.tool_call_id)
                {
                    open_calls.remove(pos);
                    out.push(message);
                    if open_calls.is_empty() {
                        out.append(&mut deferred);
                    }
                }
            }
            Message::Assistant(assistant) => {
                close_open(&mut open_calls, &mut out);
                out.append(&mut deferred);
                open_calls = assistant
                    .tool_calls()
                    .map(|c| (c.id.clone(), c.name.clone()))
                    .collect();
                out.push(message);
            }
            _ if !open_calls.is_empty() => deferred.push(message),
            _ => out.push(message),
        }
    }
    close_open(&mut open_calls, &mut out);
    out.append(&mut deferred);
    *messages = out;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::EntryPayload;

    /// A message entry at `cursor` (also used by `compaction`'s window tests).
    pub(crate) fn entry(cursor: u64, message: Message) -> Entry {
        Entry {
            cursor,
            id: format!("e{cursor}"),
            created_at: 0,
            payload: EntryPayload::Message { message },
        }
    }
    /// A user message from `ana`.
    pub(crate) fn user(text: &str) -> Message {
        Message::User {
            author: "ana".into(),
            content: text.into(),
            queue_item_id: None,
            lane: None,
            acting_for: None,
        }
    }

    /// The window after pushing entries of the given sizes: (cursors held, bytes held).
    fn window_after(sizes: &[usize]) -> (Vec<u64>, usize) {
        let mut window = ContextWindow::default();
        for (i, &bytes) in sizes.iter().enumerate() {
            window.push(entry(i as u64 + 1, user("x")), bytes);
            assert!(
                window.len() <= HOT_TAIL_KEEP as usize,
                "over the entry bound after {i}"
            );
            assert!(
                window.bytes() <= WINDOW_MAX_BYTES || window.len() == 1,
                "over the byte bound after {i} with {} entries",
                window.len()
            );
            assert_eq!(
                window.entries().last().map(|e| e.cursor),
                Some(i as u64 + 1),
                "the newest entry is always held"
            );
        }
        (window.entries().map(|e| e.cursor).collect(), window.bytes())
    }

    #[test]
    fn the_window_keeps_the_newest_entries_within_both_bounds() {
        let max = WINDOW_MAX_BYTES;
        let keep = HOT_TAIL_KEEP as usize;
        // (sizes pushed, cursors expected, bytes expected)
        let cases: Vec<(Vec<usize>, Vec<u64>, usize)> = vec![
            (vec![], vec![], 0),
            (vec![10, 20, 30], vec![1, 2, 3], 60),
            // Exactly at the byte bound: nothing evicted.
            (vec![max / 2, max / 2], vec![1, 2], max),
            // One byte over: the oldest goes.
            (vec![max / 2, max / 2, 1], vec![2, 3], max / 2 + 1),
            // An entry larger than the bound stays alone, and goes when the next one comes.
            (vec![10, max + 1], vec![2], max + 1),
            (vec![max + 1, 10], vec![2], 10),
            // The entry bound: the oldest beyond it go.
            (vec![1; keep + 5], (6..=keep as u64 + 5).collect(), keep),
        ];
        for (sizes, cursors, bytes) in cases {
            let label = format!(
                "{} sizes starting {:?}",
                sizes.len(),
                &sizes[..sizes.len().min(3)]
            );
            assert_eq!(window_after(&sizes), (cursors, bytes), "{label}");
        }
    }
}
