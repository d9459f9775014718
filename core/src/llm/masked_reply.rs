//! A provider's streamed reply with the tenant's known secrets masked (issue 32): what
//! followers see of it while it streams and the message the session stores.
//!
//! The host feeds every [`LlmEvent`] of a reply to [`MaskedReply::push`], sends followers the
//! events it returns (`assistant_text_delta`, `thinking_delta`, `tool_call_delta`), sends what
//! [`MaskedReply::finish`] returns when the stream has ended, and stores
//! [`MaskedReply::build`]. Each text or thinking block streams through its own
//! [`StreamMasker::known_only`]: a delta is held back only as far as a known secret (or one of
//! its encodings) could still be completed by the next one, at most [`Masker::longest`]` - 1`
//! bytes, and not at all when the tenant has no secrets. A block's held text is let out before
//! the next block starts, so the stored text of every block is, byte for byte, the
//! concatenation of what followers were shown of it, and equals [`Masker::mask_known`] of what
//! the provider sent. An OpenAI reasoning summary streams the same way, shown as thinking but
//! not stored from its deltas: the reasoning item that ends it holds the summary, masked whole.
//! Tool-call arguments stream to followers per call, each through its own masker, at most
//! [`MAX_STREAMED_ARGUMENT_BYTES`] per call; the stored arguments are masked whole (as JSON)
//! once the reply is complete. Opaque provider data (signatures, redacted thinking, encrypted
//! reasoning) is left as sent.
//!
//! Only known values are masked here, not the detector of unknown credentials: what the model
//! reads of the outside world was masked first (tool results, people's messages), so a
//! credential-shaped word in its reply is most likely one it made up (a generated password, a test fixture, a file it writes), which
//! the detector would garble; and the detector's hold-back (whole words, key blocks) would
//! delay the stream by words where this delays it by at most one secret's length.

use super::{AssistantBuilder, LlmEvent};
use crate::masking::{Masker, StreamMasker};
use crate::wire::{AssistantMessage, ContentBlock, StreamEvent};

/// Most bytes of one tool call's arguments streamed to followers (`tool_call_delta`): enough
/// to show what a call is about ("writing src/main.rs…") and a good part of what it writes; the
/// assistant entry holds all of them.
pub const MAX_STREAMED_ARGUMENT_BYTES: usize = 64 * 1024;

/// The kind of content block whose deltas are streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    /// An OpenAI reasoning summary: shown as thinking, stored by its reasoning item.
    Summary,
}

/// A tool call whose arguments stream to followers.
#[derive(Debug)]
struct CallStream {
    /// Provider index of the call.
    index: usize,
    id: String,
    name: String,
    stream: StreamMasker,
    /// Bytes shown so far (at most [`MAX_STREAMED_ARGUMENT_BYTES`]).
    shown: usize,
}

/// One reply being streamed: the builder of the stored message, fed masked events.
#[derive(Debug)]
pub struct MaskedReply {
    masker: Masker,
    builder: AssistantBuilder,
    /// The block whose deltas are streaming, and what of it is held back.
    open: Option<(Block, StreamMasker)>,
    /// The reply's tool calls, in the order they started.
    calls: Vec<CallStream>,
}

impl MaskedReply {
    /// A reply masked of `masker`'s known secrets.
    pub fn new(masker: Masker) -> MaskedReply {
        MaskedReply {
            masker,
            builder: AssistantBuilder::default(),
            open: None,
            calls: Vec::new(),
        }
    }

    /// Applies one event of the provider's stream; returns what to show followers now (empty:
    /// nothing yet).
    pub fn push(&mut self, event: LlmEvent) -> Vec<StreamEvent> {
        match event {
            LlmEvent::TextDelta(delta) => self.delta(Block::Text, &delta),
            LlmEvent::ThinkingDelta(delta) => self.delta(Block::Thinking, &delta),
            LlmEvent::ReasoningSummaryDelta(delta) => self.delta(Block::Summary, &delta),
            // A signature belongs to the thinking block streaming, if one is.
            LlmEvent::ThinkingSignature(_)
                if matches!(self.open, Some((Block::Thinking, _)) | None) =>
            {
                self.builder.push(event);
                Vec::new()
            }
            // Arguments do not start a content block: the one streaming goes on after them.
            LlmEvent::ToolCallArgumentsDelta { index, delta } => {
                let shown = self.argument_delta(index, &delta);
                self.builder
                    .push(LlmEvent::ToolCallArgumentsDelta { index, delta });
                shown
            }
            LlmEvent::Usage(_) | LlmEvent::Finish(_) => {
                self.builder.push(event);
                Vec::new()
            }
            LlmEvent::Reasoning {
                id,
                summary,
                encrypted_content,
            } => {
                let shown = self.end_block();
                let summary = summary
                    .iter()
                    .map(|part| self.masker.mask_known(part).into_owned())
                    .collect();
                self.builder.push(LlmEvent::Reasoning {
                    id,
                    summary,
                    encrypted_content,
                });
                shown
            }
            LlmEvent::ToolCallStart { index, id, name } => {
                let shown = self.end_block();
                self.calls.push(CallStream {
                    index,
                    id: id.clone(),
                    name: name.clone(),
                    stream: StreamMasker::known_only(self.masker.clone()),
                    shown: 0,
                });
                self.builder
                    .push(LlmEvent::ToolCallStart { index, id, name });
                shown
            }
            // Each starts a new content block: the one streaming ends first.
            LlmEvent::ThinkingStart
            | LlmEvent::ThinkingSignature(_)
            | LlmEvent::RedactedThinking(_) => {
                let shown = self.end_block();
                self.builder.push(event);
                shown
            }
        }
    }

    /// The stream ended: lets out what the block streaming and every call hold back; returns
    /// what to show followers.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let mut shown = self.end_block();
        for call in &mut self.calls {
            let rest = call.stream.finish();
            shown.extend(call.show(rest));
        }
        shown
    }

    /// The message to store: every block as followers were shown it, tool-call arguments
    /// masked.
    pub fn build(mut self, provider: &str, model: &str) -> AssistantMessage {
        self.finish();
        let mut message = self.builder.build(provider, model);
        for block in &mut message.content {
            if let ContentBlock::ToolCall(call) = block {
                crate::secrets::mask_known_json(&self.masker, &mut call.arguments);
            }
        }
        message
    }

    /// Lets out what the block streaming holds back (another block starts, or the stream
    /// ended).
    fn end_block(&mut self) -> Vec<StreamEvent> {
        let Some((block, mut stream)) = self.open.take() else {
            return Vec::new();
        };
        let rest = stream.finish();
        self.emit(block, rest)
    }

    /// One delta of a `block`: masked, held back as far as it must be.
    fn delta(&mut self, block: Block, delta: &str) -> Vec<StreamEvent> {
        let mut shown = Vec::new();
        if self.open.as_ref().is_some_and(|(open, _)| *open != block) {
            shown = self.end_block();
        }
        let (_, stream) = self
            .open
            .get_or_insert_with(|| (block, StreamMasker::known_only(self.masker.clone())));
        let out = stream.push(delta);
        shown.extend(self.emit(block, out));
        shown
    }

    /// More argument text of the call at `index`: masked, held back as far as it must be,
    /// within the call's bound.
    fn argument_delta(&mut self, index: usize, delta: &str) -> Vec<StreamEvent> {
        let Some(call) = self.calls.iter_mut().rev().find(|c| c.index == index) else {
            return Vec::new();
        };
        if call.shown >= MAX_STREAMED_ARGUMENT_BYTES {
            return Vec::new();
        }
        let out = call.stream.push(delta);
        call.show(out).into_iter().collect()
    }

    /// Feeds masked `text` of `block` to the builder; returns what followers see of it.
    fn emit(&mut self, block: Block, text: String) -> Vec<StreamEvent> {
        if text.is_empty() {
            return Vec::new();
        }
        match block {
            Block::Text => {
                self.builder.push(LlmEvent::TextDelta(text.clone()));
                vec![StreamEvent::AssistantTextDelta { delta: text }]
            }
            Block::Thinking => {
                self.builder.push(LlmEvent::ThinkingDelta(text.clone()));
                vec![StreamEvent::ThinkingDelta { delta: text }]
            }
            Block::Summary => vec![StreamEvent::ThinkingDelta { delta: text }],
        }
    }
}

impl CallStream {
    /// A `tool_call_delta` of masked `text`, cut to what is left of the call's bound (at a
    /// character boundary); `None` when nothing is left to show.
    fn show(&mut self, mut text: String) -> Option<StreamEvent> {
        let room = MAX_STREAMED_ARGUMENT_BYTES.saturating_sub(self.shown);
        if text.len() > room {
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        if text.is_empty() {
            return None;
        }
        self.shown += text.len();
        Some(StreamEvent::ToolCallDelta {
            call_id: self.id.clone(),
            name: self.name.clone(),
            arguments_delta: text,
        })
    }
}

#[cfg(test)]
mod tests;
