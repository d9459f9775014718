//! A provider's streamed reply with the tenant's known secrets masked (issue 32): what
//! followers see of it while it streams and the message the session stores.
//!
//! The host feeds every [`LlmEvent`] of a reply to [`MaskedReply::push`], shows followers the
//! text it returns, shows what [`MaskedReply::finish`] returns when the stream has ended, and
//! stores [`MaskedReply::build`]. Each text or thinking block streams through its own
//! [`StreamMasker::known_only`]: a delta is held back only as far as a known secret (or one of
//! its encodings) could still be completed by the next one, at most [`Masker::longest`]` - 1`
//! bytes, and not at all when the tenant has no secrets. A block's held text is let out before
//! the next block starts, so the stored text of every block is, byte for byte, the
//! concatenation of what followers were shown of it, and equals [`Masker::mask_known`] of what
//! the provider sent. Tool-call arguments (not streamed to followers) and reasoning summaries
//! are masked whole once the reply is complete; opaque provider data (signatures, redacted
//! thinking, encrypted reasoning) is left as sent.
//!
//! Only known values are masked here, not the detector of unknown credentials: what the model
//! reads of the outside world was masked first (tool results, people's messages), so a
//! credential-shaped word in its reply is most likely one it made up (a generated password, a test fixture, a file it writes), which
//! the detector would garble; and the detector's hold-back (whole words, key blocks) would
//! delay the stream by words where this delays it by at most one secret's length.

use super::{AssistantBuilder, LlmEvent};
use crate::masking::{Masker, StreamMasker};
use crate::wire::{AssistantMessage, ContentBlock};

/// The kind of content block whose deltas are streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// One reply being streamed: the builder of the stored message, fed masked events.
#[derive(Debug)]
pub struct MaskedReply {
    masker: Masker,
    builder: AssistantBuilder,
    /// The block whose deltas are streaming, and what of it is held back.
    open: Option<(Block, StreamMasker)>,
}

impl MaskedReply {
    /// A reply masked of `masker`'s known secrets.
    pub fn new(masker: Masker) -> MaskedReply {
        MaskedReply {
            masker,
            builder: AssistantBuilder::default(),
            open: None,
        }
    }

    /// Applies one event of the provider's stream; returns the assistant text to show
    /// followers now (empty: nothing yet).
    pub fn push(&mut self, event: LlmEvent) -> String {
        match event {
            LlmEvent::TextDelta(delta) => self.delta(Block::Text, &delta),
            LlmEvent::ThinkingDelta(delta) => {
                self.delta(Block::Thinking, &delta);
                String::new()
            }
            // A signature belongs to the thinking block streaming, if one is.
            LlmEvent::ThinkingSignature(_)
                if matches!(self.open, Some((Block::Thinking, _)) | None) =>
            {
                self.builder.push(event);
                String::new()
            }
            // Neither starts a content block: the one streaming goes on after them.
            LlmEvent::ToolCallArgumentsDelta { .. } | LlmEvent::Usage(_) | LlmEvent::Finish(_) => {
                self.builder.push(event);
                String::new()
            }
            LlmEvent::Reasoning {
                id,
                summary,
                encrypted_content,
            } => {
                let shown = self.finish();
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
            // Each starts a new content block: the one streaming ends first.
            LlmEvent::ToolCallStart { .. }
            | LlmEvent::ThinkingStart
            | LlmEvent::ThinkingSignature(_)
            | LlmEvent::RedactedThinking(_) => {
                let shown = self.finish();
                self.builder.push(event);
                shown
            }
        }
    }

    /// Lets out what the block streaming holds back (the stream ended, or another block
    /// starts); returns the text to show followers.
    pub fn finish(&mut self) -> String {
        let Some((block, mut stream)) = self.open.take() else {
            return String::new();
        };
        let rest = stream.finish();
        self.emit(block, rest)
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

    /// One delta of a `block`: masked, held back as far as it must be.
    fn delta(&mut self, block: Block, delta: &str) -> String {
        let mut shown = String::new();
        if self.open.as_ref().is_some_and(|(open, _)| *open != block) {
            shown = self.finish();
        }
        let (_, stream) = self
            .open
            .get_or_insert_with(|| (block, StreamMasker::known_only(self.masker.clone())));
        let out = stream.push(delta);
        shown.push_str(&self.emit(block, out));
        shown
    }

    /// Feeds masked `text` of `block` to the builder; returns what followers see of it.
    fn emit(&mut self, block: Block, text: String) -> String {
        if text.is_empty() {
            return text;
        }
        match block {
            Block::Text => {
                self.builder.push(LlmEvent::TextDelta(text.clone()));
                text
            }
            Block::Thinking => {
                self.builder.push(LlmEvent::ThinkingDelta(text));
                String::new()
            }
        }
    }
}

#[cfg(test)]
mod tests;
