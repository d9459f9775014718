//! Live output of running tool calls (issue 36): what a runner sends while a `bash` call runs
//! ([`Progress`], one per call and stream) and what a session keeps of it for followers
//! ([`LiveOutput`]). Both are sans-IO: the host feeds bytes or text and a clock, and sends what
//! they return. Nothing here is persisted: the call's `tool_result` is the source of truth.
//!
//! **Runner** ([`Progress`]): the command's bytes are decoded (whole UTF-8 characters; an
//! invalid byte becomes U+FFFD), masked of the session's known secrets as they stream (a
//! secret split between two reads is still masked, `crate::masking::StreamMasker`), and
//! wait in a buffer of at most [`MAX_PROGRESS_TEXT_BYTES`]. A frame goes at most once per
//! [`PROGRESS_INTERVAL_MS`] per call; what overflowed the buffer meanwhile is dropped from its
//! front and the next frame starts with a [`skipped_marker`]. After
//! [`MAX_PROGRESS_BYTES_PER_CALL`] of text one last frame ends with [`STOPPED_MARKER`] and the
//! call sends no more. So per call: frames of at most [`MAX_PROGRESS_FRAME_TEXT_BYTES`] of
//! text, at most 10 a second, at most [`MAX_PROGRESS_BYTES_PER_CALL`] in all, and the
//! runner's memory for it is the buffer whatever the command prints. Masking happens before
//! anything is dropped, so a cut never leaves part of a secret.
//!
//! **Session** ([`LiveOutput`]): a call's deltas are relayed only while the session waits for
//! that call ([`LiveOutput::start`] … [`LiveOutput::end`]); each is masked again with the
//! tenant's known secrets (stream-safe) and the detector of unknown credentials (per delta:
//! best effort, a credential split between two deltas escapes it; the result is masked
//! whole). The last [`LIVE_TAIL_BYTES`] of each running call's output are kept, at most
//! [`MAX_LIVE_TAIL_BYTES_PER_SESSION`] for all calls together (the oldest calls' tails shrink
//! first), for followers that join mid-command ([`LiveOutput::tails`]).

use std::collections::VecDeque;

use crate::masking::{Masker, StreamMasker, mask_generic};
use crate::wire::StreamEvent;
use crate::wire::runner::OutputStream;

/// Milliseconds between two progress frames of one call, at least.
pub const PROGRESS_INTERVAL_MS: u64 = 100;
/// Bytes of output text one call keeps waiting for its next frame; older text is dropped.
pub const MAX_PROGRESS_TEXT_BYTES: usize = 16 * 1024;
/// Text bytes one call sends in all; then it stops with [`STOPPED_MARKER`].
pub const MAX_PROGRESS_BYTES_PER_CALL: usize = 4 * 1024 * 1024;
/// Largest `text` of one frame: the buffer, a [`skipped_marker`] and [`STOPPED_MARKER`].
pub const MAX_PROGRESS_FRAME_TEXT_BYTES: usize = MAX_PROGRESS_TEXT_BYTES + 128;
/// Bytes of a running call's output a session keeps for followers that join late.
pub const LIVE_TAIL_BYTES: usize = 64 * 1024;
/// Bytes of all running calls' tails a session keeps together.
pub const MAX_LIVE_TAIL_BYTES_PER_SESSION: usize = 2 * LIVE_TAIL_BYTES;
/// Running calls a session relays output of at once; one more forgets the oldest.
pub const MAX_LIVE_CALLS: usize = 64;
/// Largest text a session relays of one frame (a runner sends at most
/// [`MAX_PROGRESS_FRAME_TEXT_BYTES`]); a longer one keeps its end.
pub const MAX_RELAYED_TEXT_BYTES: usize = 2 * MAX_PROGRESS_FRAME_TEXT_BYTES;

/// Frames of one call the runner hub holds while it relays them to the session; past it the
/// oldest is dropped (and counted in a [`skipped_marker`]).
pub const MAX_RELAY_QUEUED_FRAMES: usize = 8;

/// The last frame of a call that spent [`MAX_PROGRESS_BYTES_PER_CALL`] ends with this.
pub const STOPPED_MARKER: &str =
    "\n[live output stopped after 4 MiB; the tool result has the end of the output]\n";

/// What a frame starts with when `bytes` of output were dropped before it.
pub fn skipped_marker(bytes: u64) -> String {
    format!("[… {bytes} bytes of output skipped …]\n")
}

/// One running call's output on its way to progress frames (the runner's side).
#[derive(Debug)]
pub struct Progress {
    /// The session's known secrets, as the output streams (`None`: it has none).
    masker: Option<StreamMasker>,
    /// The end of the last read when it stopped inside a UTF-8 character (at most 3 bytes).
    partial: Vec<u8>,
    /// Masked text not sent yet, at most [`MAX_PROGRESS_TEXT_BYTES`].
    pending: String,
    /// Bytes dropped from `pending` since the last frame.
    skipped: u64,
    /// Text bytes sent so far.
    sent: usize,
    /// The budget is spent: nothing more is kept or sent.
    stopped: bool,
    /// When the last frame went.
    last_frame: Option<u64>,
}

impl Progress {
    /// A call's output, masked of `masker`'s known secrets when it has any.
    pub fn new(masker: Option<Masker>) -> Progress {
        Progress {
            masker: masker
                .filter(|m| !m.is_empty())
                .map(StreamMasker::known_only),
            partial: Vec::new(),
            pending: String::new(),
            skipped: 0,
            sent: 0,
            stopped: false,
            last_frame: None,
        }
    }

    /// Takes what the command wrote.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.stopped || bytes.is_empty() {
            return;
        }
        let text = decode(&mut self.partial, bytes);
        let text = match &mut self.masker {
            Some(masker) => masker.push(&text),
            None => text,
        };
        self.pending.push_str(&text);
        if self.pending.len() > MAX_PROGRESS_TEXT_BYTES {
            let cut =
                ceil_char_boundary(&self.pending, self.pending.len() - MAX_PROGRESS_TEXT_BYTES);
            self.pending.drain(..cut);
            self.skipped += cut as u64;
        }
    }

    /// When the next frame may go, if there is something to send (to arm a timer).
    pub fn due_at(&self) -> Option<u64> {
        if self.stopped || (self.pending.is_empty() && self.skipped == 0) {
            return None;
        }
        Some(self.last_frame.map_or(0, |t| t + PROGRESS_INTERVAL_MS))
    }

    /// The text of the frame to send at `now`, if one is due.
    pub fn poll(&mut self, now: u64) -> Option<String> {
        if self.due_at().is_none_or(|due| now < due) {
            return None;
        }
        let mut text = if self.skipped > 0 {
            skipped_marker(std::mem::take(&mut self.skipped))
        } else {
            String::new()
        };
        text.push_str(&std::mem::take(&mut self.pending));
        if self.sent + text.len() > MAX_PROGRESS_BYTES_PER_CALL {
            let room = MAX_PROGRESS_BYTES_PER_CALL.saturating_sub(self.sent);
            text.truncate(floor_char_boundary(&text, room));
            text.push_str(STOPPED_MARKER);
            self.stopped = true;
            self.masker = None;
            self.partial = Vec::new();
        }
        self.sent += text.len();
        self.last_frame = Some(now);
        Some(text)
    }

    /// Text bytes sent so far.
    pub fn sent(&self) -> usize {
        self.sent
    }
}

/// `bytes` after `partial` as text; an incomplete character at the end waits in `partial`.
fn decode(partial: &mut Vec<u8>, bytes: &[u8]) -> String {
    let mut buf = std::mem::take(partial);
    buf.extend_from_slice(bytes);
    let keep = incomplete_suffix(&buf);
    *partial = buf.split_off(buf.len() - keep);
    match String::from_utf8(buf) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Bytes at the end of `bytes` that begin a UTF-8 character not complete yet.
fn incomplete_suffix(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let needs = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needs > back { back } else { 0 };
    }
    0
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// One call's frames on their way from the runner hub to the session, in order: the first
/// frame makes its handler the call's one forwarder, which sends until the queue is empty
/// (frames that arrive meanwhile join the queue), so a slow session never reorders them and
/// the hub holds at most [`MAX_RELAY_QUEUED_FRAMES`] per call.
#[derive(Debug, Default)]
pub struct RelayQueue {
    frames: VecDeque<(OutputStream, String)>,
    /// Bytes of text dropped since the last frame forwarded.
    skipped: u64,
    /// A forwarder runs.
    busy: bool,
}

impl RelayQueue {
    /// Queues a frame; `true` when the caller is to forward (no forwarder runs).
    pub fn push(&mut self, stream: OutputStream, text: String) -> bool {
        if self.frames.len() >= MAX_RELAY_QUEUED_FRAMES
            && let Some((_, dropped)) = self.frames.pop_front()
        {
            self.skipped += dropped.len() as u64;
        }
        self.frames.push_back((stream, text));
        !std::mem::replace(&mut self.busy, true)
    }

    /// The next frame to forward; `None`: the queue is empty and the forwarder stops.
    pub fn pop(&mut self) -> Option<(OutputStream, String)> {
        let Some((stream, text)) = self.frames.pop_front() else {
            self.busy = false;
            return None;
        };
        if self.skipped > 0 {
            let marker = skipped_marker(std::mem::take(&mut self.skipped));
            return Some((stream, marker + &text));
        }
        Some((stream, text))
    }
}

/// One stream of a running call, as a session relays it.
#[derive(Debug)]
struct LiveStream {
    stream: OutputStream,
    masker: StreamMasker,
    tail: String,
}

#[derive(Debug)]
struct LiveCall {
    call_id: String,
    masker: Masker,
    streams: Vec<LiveStream>,
}

/// The running calls of one session whose output followers see (the session's side).
#[derive(Debug, Default)]
pub struct LiveOutput {
    /// In the order they started.
    calls: VecDeque<LiveCall>,
    /// Bytes of all tails.
    tail_bytes: usize,
}

impl LiveOutput {
    /// The session waits for call `call_id`: its output is relayed, masked with `masker`.
    pub fn start(&mut self, call_id: &str, masker: Masker) {
        self.end(call_id);
        if self.calls.len() >= MAX_LIVE_CALLS
            && let Some(oldest) = self.calls.pop_front()
        {
            self.tail_bytes -= oldest.streams.iter().map(|s| s.tail.len()).sum::<usize>();
        }
        self.calls.push_back(LiveCall {
            call_id: call_id.to_string(),
            masker,
            streams: Vec::new(),
        });
    }

    /// The call ended (its result is in, or the wait gave up): nothing more of it is relayed.
    pub fn end(&mut self, call_id: &str) {
        if let Some(i) = self.calls.iter().position(|c| c.call_id == call_id) {
            let call = self.calls.remove(i).expect("the position is in range");
            self.tail_bytes -= call.streams.iter().map(|s| s.tail.len()).sum::<usize>();
        }
    }

    /// Whether call `call_id` is running.
    pub fn is_running(&self, call_id: &str) -> bool {
        self.calls.iter().any(|c| c.call_id == call_id)
    }

    /// A runner's frame for call `call_id`: the event to broadcast, if the call runs and
    /// something can be shown now.
    pub fn push(&mut self, call_id: &str, stream: OutputStream, text: &str) -> Option<StreamEvent> {
        let call = self.calls.iter_mut().find(|c| c.call_id == call_id)?;
        let text = if text.len() > MAX_RELAYED_TEXT_BYTES {
            let cut = ceil_char_boundary(text, text.len() - MAX_RELAYED_TEXT_BYTES);
            format!("{}{}", skipped_marker(cut as u64), &text[cut..])
        } else {
            text.to_string()
        };
        let index = match call.streams.iter().position(|s| s.stream == stream) {
            Some(i) => i,
            None => {
                call.streams.push(LiveStream {
                    stream,
                    masker: StreamMasker::known_only(call.masker.clone()),
                    tail: String::new(),
                });
                call.streams.len() - 1
            }
        };
        let live = &mut call.streams[index];
        let shown = live.masker.push(&text);
        let shown = mask_generic(&shown).into_owned();
        if shown.is_empty() {
            return None;
        }
        live.tail.push_str(&shown);
        self.tail_bytes += shown.len();
        if live.tail.len() > LIVE_TAIL_BYTES {
            let cut = ceil_char_boundary(&live.tail, live.tail.len() - LIVE_TAIL_BYTES);
            live.tail.drain(..cut);
            self.tail_bytes -= cut;
        }
        self.shrink_tails();
        Some(StreamEvent::ToolOutputDelta {
            call_id: call_id.to_string(),
            stream,
            text: shown,
        })
    }

    /// Keeps all tails within [`MAX_LIVE_TAIL_BYTES_PER_SESSION`], the oldest calls' first.
    fn shrink_tails(&mut self) {
        for call in &mut self.calls {
            for live in &mut call.streams {
                if self.tail_bytes <= MAX_LIVE_TAIL_BYTES_PER_SESSION {
                    return;
                }
                let excess = self.tail_bytes - MAX_LIVE_TAIL_BYTES_PER_SESSION;
                let cut = ceil_char_boundary(&live.tail, excess.min(live.tail.len()));
                live.tail.drain(..cut);
                self.tail_bytes -= cut;
            }
        }
    }

    /// What a follower that joins now is sent first: each running call's tail, one event per
    /// call and stream, in the order the calls started.
    pub fn tails(&self) -> Vec<StreamEvent> {
        self.calls
            .iter()
            .flat_map(|call| {
                call.streams.iter().filter(|s| !s.tail.is_empty()).map(|s| {
                    StreamEvent::ToolOutputDelta {
                        call_id: call.call_id.clone(),
                        stream: s.stream,
                        text: s.tail.clone(),
                    }
                })
            })
            .collect()
    }

    /// Bytes of all tails kept.
    pub fn tail_bytes(&self) -> usize {
        self.tail_bytes
    }
}

#[cfg(test)]
mod tests;
