//! The follow stream (`GET /v1/sessions/:id/follow`) as a sans-IO state machine.
//!
//! The host creates a [`Follow`] **in the same synchronous step** in which it registers the
//! follower for live events and reads the session's last cursor and status ([`Registration`]).
//! From then on:
//!
//! * entries with a cursor up to the last cursor at registration (`backfill_until`) come from
//!   backfill pages the host reads when asked ([`Output::ReadPage`] → [`Follow::handle_page`]);
//! * every later event comes live ([`Follow::handle_live`], in broadcast order); live events are
//!   buffered while the backfill is read and sent after it, in arrival order;
//! * entries are deduplicated by cursor, so each one is sent exactly once, in cursor order.
//!
//! The host loop: call [`Follow::poll`] and write each [`Output::Frame`]; on
//! [`Output::ReadPage`] read the page and call [`Follow::handle_page`]; on
//! [`Output::CheckCredential`] ask the token registry and call [`Follow::handle_credential`]; on
//! [`Output::Wait`] wait for a live event or until [`Follow::poll_deadline`]; stop at
//! [`Output::End`]. `now` must never go backwards.
//!
//! **Revocation** (decision 0007): a stream opened with a revocable credential (a JWT with a
//! `jti`: a minted token or a cookie session; [`Follow::recheck_credential`]) asks for the
//! credential to be checked every [`CREDENTIAL_RECHECK_MS`], before anything else it would send.
//! A credential that is no longer live (revoked, logged out, expired), or a check that fails,
//! ends the stream with an `error` event, dropping what was buffered: a revoke reaches an open
//! stream within [`CREDENTIAL_RECHECK_MS`] plus one registry round trip. The client's reconnect
//! is then authenticated afresh (401 if revoked; a failed check's reconnect resumes losslessly).
//!
//! **Status**: once the backfill is sent, the stream sends one `status` event with the status at
//! registration (the status as of the last backfilled entry); live `status` events follow as
//! they happen. So a client that tracks `status` events knows the session's status after every
//! frame from then on, even when it connected after a turn's `status` and `idle` were broadcast.
//!
//! **Invariant** (with `stopAfterIdle`): the stream stops at an idle point, and every entry
//! appended before that point is sent before its `idle`. An idle point is either a live `idle`
//! event (the session broadcasts a turn's entries before its `idle`) or the moment the follower
//! has sent everything it received while the session is at rest (`status` is not `running`;
//! the status is tracked from the registration through live `status` events).
//!
//! **Bound**: live events wait in a per-follower queue of at most [`MAX_BUFFERED_EVENTS`] events
//! and [`MAX_BUFFERED_BYTES`] of their frames. A frame is encoded once and shared by every
//! follower through [`LiveEvent`]; a queue holds one pointer per event. A follower whose queue
//! would grow past either bound gets a `lagged` event carrying the last cursor it was sent and is
//! closed; reconnecting with `Last-Event-ID` resumes losslessly.
//!
//! **Memory** of a session's followers together: every follower receives the same broadcast
//! sequence and sends it from the front, so each queue is a run of that sequence ending at the
//! newest event, and the frames all queues hold are those of the longest one: at most
//! [`MAX_BUFFERED_BYTES`] (or one larger event accepted into an empty queue), shared. What each
//! follower holds on its own is its queue's pointers (at most [`MAX_BUFFERED_EVENTS`]) and the
//! chunk the host is writing. docs/api.md states [`MAX_FOLLOWERS`] × that bound.

use std::collections::VecDeque;
use std::rc::Rc;

use crate::session::Millis;
use crate::wire::{Entry, SSE_HEARTBEAT, Status, StreamEvent};

/// Live followers one session accepts at a time; one more is refused with 429.
pub const MAX_FOLLOWERS: usize = 256;
/// Bytes of encoded live events one follower may have waiting before it is lagged. Frames are
/// shared between followers, so this also bounds the frames all followers hold together (see
/// the module's **Memory**).
pub const MAX_BUFFERED_BYTES: usize = 2 * 1024 * 1024;
/// Live events one follower may have waiting before it is lagged, however small they are: the
/// bound on its own queue (a power of two, so the queue's capacity never passes it). A
/// 1,000-delta reply computed at once (the fake provider without a delay) queues about 1,000.
pub const MAX_BUFFERED_EVENTS: usize = 4096;
/// Milliseconds between heartbeat comments on a quiet stream.
pub const HEARTBEAT_MS: u64 = 15_000;
/// Longest `timeoutSeconds` accepted.
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;
/// Milliseconds between registry checks of an open stream's revocable credential: the bound on
/// how long a revoked token or logged-out cookie session keeps an already open stream.
pub const CREDENTIAL_RECHECK_MS: u64 = 5_000;
/// The `error` message that ends a stream whose credential was revoked.
pub const REVOKED_MESSAGE: &str = "the credential of this stream was revoked (or expired)";

/// The `error` event that ends every stream of a session when it is deleted.
pub const DELETED_MESSAGE: &str = "the session was deleted";

/// The parameters of one follow request, validated.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FollowRequest {
    /// Send entries with a cursor above this.
    pub since_cursor: u64,
    /// Skip entries created at or before this time (unix seconds).
    pub since_time: Option<i64>,
    /// End at the first idle point.
    pub stop_after_idle: bool,
    /// End with `done` after this many seconds.
    pub timeout_seconds: Option<u64>,
}

impl FollowRequest {
    /// Validates the query (`sinceCursor`, `sinceTime`, `stopAfterIdle`, `timeoutSeconds`) and
    /// the `Last-Event-ID` header, which takes precedence over `sinceCursor`.
    ///
    /// # Errors
    /// A message for a 400 answer.
    pub fn parse(
        last_event_id: Option<&str>,
        since_cursor: Option<u64>,
        since_time: Option<u64>,
        stop_after_idle: Option<&str>,
        timeout_seconds: Option<u64>,
    ) -> Result<FollowRequest, String> {
        let last_event_id = last_event_id
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| "Last-Event-ID must be a cursor (integer)".to_string())
            })
            .transpose()?;
        if timeout_seconds.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_SECONDS) {
            return Err(format!(
                "timeoutSeconds must be between 1 and {MAX_TIMEOUT_SECONDS}"
            ));
        }
        let since_time = since_time
            .map(|t| i64::try_from(t).map_err(|_| "sinceTime is too large".to_string()))
            .transpose()?;
        Ok(FollowRequest {
            since_cursor: last_event_id.or(since_cursor).unwrap_or(0),
            since_time,
            stop_after_idle: matches!(stop_after_idle, Some("1" | "true")),
            timeout_seconds,
        })
    }
}

/// What the host read in the same synchronous step as it registered the follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The session's last cursor.
    pub last_cursor: u64,
    /// The session's status.
    pub status: Status,
}

/// A live event, encoded once and shared by every follower that buffers it.
#[derive(Clone, Debug)]
pub struct LiveEvent(Rc<Encoded>);

#[derive(Debug)]
struct Encoded {
    kind: Kind,
    sse: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Entry { cursor: u64, created_at: i64 },
    Status(Status),
    Idle,
    Other,
}

impl LiveEvent {
    /// Encodes `event` once.
    pub fn new(event: &StreamEvent) -> LiveEvent {
        let kind = match event {
            StreamEvent::EntryAppended { entry } => Kind::Entry {
                cursor: entry.cursor,
                created_at: entry.created_at,
            },
            StreamEvent::Status { status } => Kind::Status(*status),
            StreamEvent::Idle => Kind::Idle,
            _ => Kind::Other,
        };
        LiveEvent(Rc::new(Encoded {
            kind,
            sse: event.to_sse(),
        }))
    }

    /// What it costs in a follower's buffer: its frame's bytes (shared with every follower).
    pub fn cost(&self) -> usize {
        self.0.sse.len()
    }
}

/// SSE text to write.
#[derive(Clone, Debug)]
pub enum Frame {
    /// A live event's shared frame.
    Live(LiveEvent),
    /// A frame of this follower only.
    Text(String),
    /// The heartbeat comment.
    Heartbeat,
}

impl Frame {
    /// The text.
    pub fn as_str(&self) -> &str {
        match self {
            Frame::Live(event) => &event.0.sse,
            Frame::Text(text) => text,
            Frame::Heartbeat => SSE_HEARTBEAT,
        }
    }

    /// The event's JSON, exactly the SSE frame's `data:` (a slice of the same text, not a copy):
    /// what a client WebSocket sends (`wuhu_core::socket`). `None` for the heartbeat.
    pub fn data(&self) -> Option<&str> {
        match self {
            Frame::Heartbeat => None,
            frame => Some(sse_data(frame.as_str())),
        }
    }
}

/// The `data:` of one SSE frame written by [`StreamEvent::to_sse`] (one `data` line: the JSON
/// is compact, so it holds no newline).
fn sse_data(sse: &str) -> &str {
    let start = sse.find("data: ").map_or(0, |i| i + "data: ".len());
    sse[start..].trim_end_matches('\n')
}

/// Why a stream ended (what its last frame said): a client WebSocket maps it to a close code
/// (`wuhu_core::socket::close_code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// `done`: `stopAfterIdle` or `timeoutSeconds`.
    Done,
    /// `lagged`: the follower's buffer overflowed.
    Lagged,
    /// `error`: the credential is no longer live.
    Revoked,
    /// `error`: the session was deleted.
    Deleted,
    /// `error`: reading the transcript or checking the credential failed (reconnect to resume).
    Failed,
}

/// What the host does next.
#[derive(Debug)]
#[must_use]
pub enum Output {
    /// Write this frame, then poll again.
    Frame(Frame),
    /// Read up to `limit` entries with cursor `> since` (a contiguous page), then call
    /// [`Follow::handle_page`].
    ReadPage {
        /// Read after this cursor.
        since: u64,
        /// At most this many entries.
        limit: usize,
    },
    /// Ask the token registry whether the stream's credential is still live, then call
    /// [`Follow::handle_credential`].
    CheckCredential,
    /// Nothing to send: wait for a live event or [`Follow::poll_deadline`], then poll again.
    Wait,
    /// The stream is over: close it.
    End,
}

/// One follower's stream.
#[derive(Debug)]
pub struct Follow {
    /// Highest cursor sent, or skipped by `sinceTime`.
    sent_cursor: u64,
    /// Cursors up to this come from backfill pages; later ones live.
    backfill_until: u64,
    since_time: Option<i64>,
    stop_after_idle: bool,
    deadline: Option<Millis>,
    next_heartbeat: Millis,
    /// The session's status as of the last live event received.
    status: Status,
    /// The status at registration, sent once the backfill is sent (see [`Follow::poll`]).
    registered_status: Option<Status>,
    /// The output of calls running at registration (`tool_output_delta`s), sent after the
    /// status and before live events (see [`Follow::with_running_output`]).
    running_output: VecDeque<Frame>,
    /// Entries of the current backfill page not sent yet.
    page: VecDeque<Entry>,
    page_in_flight: bool,
    /// Live events received and not sent yet, and what they cost.
    live: VecDeque<LiveEvent>,
    live_bytes: usize,
    /// The buffer overflowed: `lagged` is sent next and the stream ends.
    lagged: bool,
    /// Frames that end the stream (`idle`/`done`, `lagged`, `error`), sent before [`Output::End`].
    closing: VecDeque<Frame>,
    /// No more live events are wanted.
    closed: bool,
    /// Revocable credentials: when its next registry check is due.
    recheck_at: Option<Millis>,
    /// A credential check was asked for and not answered yet.
    check_in_flight: bool,
    /// Heartbeat comments are sent (SSE); a WebSocket has its own pings.
    heartbeats: bool,
    /// Why the stream ended, once it did.
    end_reason: Option<EndReason>,
}

impl Follow {
    /// A follower registered at `now` with what the host read at registration.
    pub fn new(now: Millis, request: &FollowRequest, registration: Registration) -> Follow {
        Follow {
            sent_cursor: request.since_cursor,
            backfill_until: registration.last_cursor,
            since_time: request.since_time,
            stop_after_idle: request.stop_after_idle,
            deadline: request
                .timeout_seconds
                .map(|t| Millis(now.0.saturating_add(t.saturating_mul(1000)))),
            next_heartbeat: Millis(now.0 + HEARTBEAT_MS),
            status: registration.status,
            registered_status: Some(registration.status),
            running_output: VecDeque::new(),
            page: VecDeque::new(),
            page_in_flight: false,
            live: VecDeque::new(),
            live_bytes: 0,
            lagged: false,
            closing: VecDeque::new(),
            closed: false,
            recheck_at: None,
            check_in_flight: false,
            heartbeats: true,
            end_reason: None,
        }
    }

    /// The tails of the calls running at registration (`crate::tool_output::LiveOutput::tails`,
    /// read in the same synchronous step): sent once the backfill and the status are, before
    /// any live event, so a follower that joins mid-command sees the command's recent output,
    /// then what it prints next, in order. Each is at most
    /// [`crate::tool_output::LIVE_TAIL_BYTES`], and all at most
    /// [`crate::tool_output::MAX_LIVE_TAIL_BYTES_PER_SESSION`].
    pub fn with_running_output(mut self, tails: Vec<StreamEvent>) -> Follow {
        self.running_output = tails
            .iter()
            .map(|event| Frame::Text(event.to_sse()))
            .collect();
        self
    }

    /// No heartbeat comments (a client WebSocket): [`Follow::poll_deadline`] then has no
    /// deadline unless a timeout or a credential check is due, so a host needs no timer.
    pub fn without_heartbeats(mut self) -> Follow {
        self.heartbeats = false;
        self
    }

    /// Why the stream ended ([`Output::End`] was or will be returned), if it did.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.end_reason
    }

    /// The stream was authenticated by a revocable credential: check it every
    /// [`CREDENTIAL_RECHECK_MS`] from `now` (the router checked it just before).
    pub fn recheck_credential(mut self, now: Millis) -> Follow {
        self.recheck_at = Some(Millis(now.0.saturating_add(CREDENTIAL_RECHECK_MS)));
        self
    }

    /// The answer to [`Output::CheckCredential`] at `now`: live, not live, or the check failed.
    /// Anything but live ends the stream with an `error` event.
    pub fn handle_credential(&mut self, now: Millis, live: Result<bool, String>) {
        self.check_in_flight = false;
        if self.closed {
            return;
        }
        match live {
            Ok(true) => self.recheck_at = Some(Millis(now.0.saturating_add(CREDENTIAL_RECHECK_MS))),
            Ok(false) => self.close_with(
                EndReason::Revoked,
                Frame::Text(
                StreamEvent::Error {
                    message: REVOKED_MESSAGE.to_string(),
                }
                .to_sse(),
            )),
            Err(message) => self.close_with(
                EndReason::Failed,
                Frame::Text(
                StreamEvent::Error {
                    message: format!(
                        "could not check this stream's credential ({message}); reconnect to resume"
                    ),
                }
                .to_sse(),
            )),
        }
    }

    /// The session was deleted: the stream ends with an `error` event saying so (a reconnect
    /// gets 404). Nothing queued is sent after it.
    pub fn handle_deleted(&mut self) {
        if self.closed {
            return;
        }
        self.close_with(
            EndReason::Deleted,
            Frame::Text(
                StreamEvent::Error {
                    message: DELETED_MESSAGE.to_string(),
                }
                .to_sse(),
            ),
        );
    }

    /// Whether the host may stop sending live events to this follower and forget it.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The highest cursor sent (or skipped by `sinceTime`): where a reconnect resumes.
    pub fn sent_cursor(&self) -> u64 {
        self.sent_cursor
    }

    /// Bytes of live events waiting.
    pub fn buffered_bytes(&self) -> usize {
        self.live_bytes
    }

    /// Live events waiting.
    pub fn buffered_events(&self) -> usize {
        self.live.len()
    }

    /// A live event, in broadcast order. Buffers it, or lags the follower when its buffer
    /// would grow past [`MAX_BUFFERED_BYTES`] or [`MAX_BUFFERED_EVENTS`] (one event is always
    /// accepted into an empty buffer, so a single large entry does not lag a follower that
    /// keeps up).
    pub fn handle_live(&mut self, event: LiveEvent) {
        if self.closed {
            return;
        }
        if let Kind::Status(status) = event.0.kind {
            self.status = status;
        }
        let cost = event.cost();
        if !self.live.is_empty()
            && (self.live_bytes + cost > MAX_BUFFERED_BYTES
                || self.live.len() >= MAX_BUFFERED_EVENTS)
        {
            self.lag();
            return;
        }
        self.live_bytes += cost;
        self.live.push_back(event);
    }

    /// Ends the stream as a buffer overflow does: a `lagged` event with the last cursor sent,
    /// then [`Output::End`]; nothing queued is sent. Also for a host's own bound (a client
    /// WebSocket that does not acknowledge what it reads, `wuhu_core::socket::AckWindow`).
    pub fn lag(&mut self) {
        if self.closed {
            return;
        }
        self.lagged = true;
        self.closed = true;
        self.end_reason = Some(EndReason::Lagged);
        self.live.clear();
        self.live_bytes = 0;
        self.page.clear();
        self.running_output.clear();
    }

    /// The page asked for by [`Output::ReadPage`]: contiguous entries after the cursor asked
    /// for, or the read's error (sent as an `error` event that ends the stream).
    pub fn handle_page(&mut self, page: Result<Vec<Entry>, String>) {
        self.page_in_flight = false;
        if self.closed {
            return;
        }
        match page {
            Ok(entries) if entries.is_empty() => self.close_with(
                EndReason::Failed,
                Frame::Text(
                    StreamEvent::Error {
                        message: format!(
                            "the transcript ended at cursor {} before cursor {}",
                            self.sent_cursor, self.backfill_until
                        ),
                    }
                    .to_sse(),
                ),
            ),
            Ok(entries) => {
                let until = self.backfill_until;
                self.page
                    .extend(entries.into_iter().filter(|e| e.cursor <= until));
            }
            Err(message) => {
                self.close_with(
                    EndReason::Failed,
                    Frame::Text(StreamEvent::Error { message }.to_sse()),
                );
            }
        }
    }

    /// When to poll again if nothing arrives: the next heartbeat, the timeout or the next
    /// credential check.
    pub fn poll_deadline(&self) -> Option<Millis> {
        if self.closed && self.closing.is_empty() && !self.lagged {
            return None;
        }
        let heartbeat = self.heartbeats.then_some(self.next_heartbeat);
        [heartbeat, self.deadline, self.recheck_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next thing to do.
    pub fn poll(&mut self, now: Millis) -> Output {
        if self.lagged {
            self.lagged = false;
            self.closing.push_back(Frame::Text(
                StreamEvent::Lagged {
                    cursor: self.sent_cursor,
                }
                .to_sse(),
            ));
        }
        if !self.closing.is_empty() || self.closed {
            return match self.closing.pop_front() {
                Some(frame) => Output::Frame(frame),
                None => Output::End,
            };
        }
        if self.deadline.is_some_and(|d| now >= d) {
            self.close_with(EndReason::Done, Frame::Text(StreamEvent::Done.to_sse()));
            return self.poll(now);
        }
        // 0. A revocable credential is re-checked before anything more is sent.
        if self.recheck_at.is_some_and(|at| now >= at) && !self.check_in_flight {
            self.check_in_flight = true;
            return Output::CheckCredential;
        }
        // 1. The backfill, a page at a time.
        while let Some(entry) = self.page.pop_front() {
            if let Some(frame) = self.entry_frame(entry.cursor, entry.created_at, || {
                Frame::Text(StreamEvent::EntryAppended { entry }.to_sse())
            }) {
                return Output::Frame(frame);
            }
        }
        if self.sent_cursor < self.backfill_until {
            if self.page_in_flight {
                return Output::Wait;
            }
            self.page_in_flight = true;
            let left = self.backfill_until - self.sent_cursor;
            return Output::ReadPage {
                since: self.sent_cursor,
                limit: usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(crate::archive::MAX_PAGE),
            };
        }
        // 2. The status at registration, which is the status as of the last backfilled entry:
        //    a client that tracks `status` events knows the session's status from here on,
        //    even when the stream opened after a turn ended (its `status` and `idle` events were
        //    broadcast before this follower registered).
        if let Some(status) = self.registered_status.take() {
            return Output::Frame(Frame::Text(StreamEvent::Status { status }.to_sse()));
        }
        // 2b. The recent output of calls running at registration; their later output is live.
        if let Some(frame) = self.running_output.pop_front() {
            return Output::Frame(frame);
        }
        // 3. Live events, in arrival order.
        while let Some(event) = self.live.pop_front() {
            self.live_bytes -= event.cost();
            match event.0.kind {
                Kind::Entry { cursor, created_at } => {
                    if let Some(frame) =
                        self.entry_frame(cursor, created_at, || Frame::Live(event.clone()))
                    {
                        return Output::Frame(frame);
                    }
                }
                Kind::Idle if self.stop_after_idle => {
                    self.close_with(EndReason::Done, Frame::Text(StreamEvent::Done.to_sse()));
                    return Output::Frame(Frame::Live(event));
                }
                _ => return Output::Frame(Frame::Live(event)),
            }
        }
        // 4. Everything received is sent: at rest, this is an idle point.
        if self.stop_after_idle && self.status != Status::Running {
            self.close_with(EndReason::Done, Frame::Text(StreamEvent::Done.to_sse()));
            return Output::Frame(Frame::Text(StreamEvent::Idle.to_sse()));
        }
        if self.heartbeats && now >= self.next_heartbeat {
            self.next_heartbeat = Millis(now.0 + HEARTBEAT_MS);
            return Output::Frame(Frame::Heartbeat);
        }
        Output::Wait
    }

    /// The frame of an entry, or `None` when it was sent already or `sinceTime` skips it.
    fn entry_frame(
        &mut self,
        cursor: u64,
        created_at: i64,
        frame: impl FnOnce() -> Frame,
    ) -> Option<Frame> {
        if cursor <= self.sent_cursor {
            return None;
        }
        self.sent_cursor = cursor;
        if self.since_time.is_some_and(|t| created_at <= t) {
            return None;
        }
        Some(frame())
    }

    /// Ends the stream after `frame`; live events are no longer wanted.
    fn close_with(&mut self, reason: EndReason, frame: Frame) {
        self.closed = true;
        self.end_reason = Some(reason);
        self.live.clear();
        self.live_bytes = 0;
        self.page.clear();
        self.running_output.clear();
        self.closing.push_back(frame);
    }
}

#[cfg(test)]
mod tests;
