//! `GET /follow`: SSE with lossless replay.
//!
//! The follower is registered for live events **before** the backfill is read, then backfill
//! entries are streamed, then live entries whose cursor is above the last one sent. Every
//! entry is therefore seen exactly once, whichever side of the registration it was appended on.

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::future::{Either, select};
use futures::{FutureExt, StreamExt};
use worker::{Delay, Headers, Request, Response};
use wuhu_core::wire::{SSE_HEARTBEAT, Status, StreamEvent};

use crate::archive_io;
use crate::http::{ApiError, ApiResult, query, query_u64};
use crate::session_actor::{Actor, now};

/// Seconds between heartbeat comments.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// Longest `timeoutSeconds` accepted.
const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;
/// Live events buffered for one slow follower before it is dropped.
const MAX_BUFFERED: usize = 10_000;

/// Live subscribers of one session.
#[derive(Default)]
pub(crate) struct Followers {
    senders: Vec<mpsc::Sender<StreamEvent>>,
}

impl Followers {
    fn add(&mut self) -> mpsc::Receiver<StreamEvent> {
        let (tx, rx) = mpsc::channel(MAX_BUFFERED);
        self.senders.push(tx);
        rx
    }

    /// Sends to every follower; drops closed or hopelessly slow ones (they reconnect and replay).
    pub(crate) fn send(&mut self, event: &StreamEvent) {
        self.senders
            .retain_mut(|tx| tx.try_send(event.clone()).is_ok());
    }

    pub(crate) fn len(&self) -> usize {
        self.senders.len()
    }
}

struct FollowState {
    actor: Rc<Actor>,
    live: mpsc::Receiver<StreamEvent>,
    /// Backfill entries not sent yet.
    pending: VecDeque<StreamEvent>,
    /// Highest cursor sent (or skipped by the filters).
    sent_cursor: u64,
    /// Backfill reads up to this cursor; live events cover the rest.
    backfill_until: u64,
    since_time: Option<i64>,
    stop_after_idle: bool,
    deadline: Option<u64>,
    finished: bool,
    next_heartbeat: u64,
}

pub(crate) async fn handle(
    actor: Rc<Actor>,
    req: &Request,
    pairs: &[(String, String)],
) -> ApiResult<Response> {
    let last_event_id = req
        .headers()
        .get("last-event-id")
        .ok()
        .flatten()
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request("Last-Event-ID must be a cursor (integer)"))
        })
        .transpose()?;
    let since_cursor = query_u64(pairs, "sinceCursor")?;
    let since = last_event_id.or(since_cursor).unwrap_or(0);
    let since_time = query_u64(pairs, "sinceTime")?.map(|t| t as i64);
    let stop_after_idle = matches!(query(pairs, "stopAfterIdle").as_deref(), Some("1" | "true"));
    let timeout = query_u64(pairs, "timeoutSeconds")?;
    if timeout.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_SECONDS) {
        return Err(ApiError::bad_request(format!(
            "timeoutSeconds must be between 1 and {MAX_TIMEOUT_SECONDS}"
        )));
    }
    let live = actor.followers.borrow_mut().add();
    let backfill_until = actor.with_loaded(|l| l.session.last_cursor()).unwrap_or(0);
    let start = now().0;
    let state = FollowState {
        actor,
        live,
        pending: VecDeque::new(),
        sent_cursor: since,
        backfill_until,
        since_time,
        stop_after_idle,
        deadline: timeout.map(|t| start + t * 1000),
        finished: false,
        next_heartbeat: start + HEARTBEAT.as_millis() as u64,
    };
    let stream = futures::stream::unfold(state, |mut state| async move {
        let chunk = next_chunk(&mut state).await?;
        Some((Ok::<Vec<u8>, worker::Error>(chunk.into_bytes()), state))
    });
    let headers = Headers::new();
    let _ = headers.set("content-type", "text/event-stream");
    let _ = headers.set("cache-control", "no-cache");
    let _ = headers.set("x-accel-buffering", "no");
    Ok(Response::from_stream(stream)?.with_headers(headers))
}

/// The next SSE text to send, or `None` to end the stream.
async fn next_chunk(state: &mut FollowState) -> Option<String> {
    if state.finished {
        return None;
    }
    // 1. Backfill, a page at a time.
    if state.pending.is_empty() && state.sent_cursor < state.backfill_until {
        match archive_io::read_page(
            &state.actor,
            state.sent_cursor,
            wuhu_core::archive::MAX_PAGE,
        )
        .await
        {
            Ok((entries, _)) if !entries.is_empty() => {
                for entry in entries
                    .into_iter()
                    .filter(|e| e.cursor <= state.backfill_until)
                {
                    state
                        .pending
                        .push_back(StreamEvent::EntryAppended { entry });
                }
            }
            Ok(_) => state.backfill_until = state.sent_cursor,
            Err(e) => {
                state.finished = true;
                return Some(format!(
                    "event: error\ndata: {}\n\n",
                    serde_json::json!({"type":"error","message": e.message})
                ));
            }
        }
    }
    let mut out = String::new();
    while let Some(event) = state.pending.pop_front() {
        push_event(state, &event, &mut out);
        if out.len() > 64 * 1024 {
            return Some(out);
        }
    }
    if !out.is_empty() {
        return Some(out);
    }
    if state.sent_cursor < state.backfill_until {
        return Some(String::new());
    }
    // 2. Caught up. Live events buffered meanwhile (while a backfill page was read, or while
    // the previous chunk was written) come first: they may hold the rest of a turn, its
    // entries and then its idle.
    let mut out = String::new();
    while !state.finished
        && let Ok(event) = state.live.try_recv()
    {
        let idle = matches!(event, StreamEvent::Idle);
        push_event(state, &event, &mut out);
        if idle && state.stop_after_idle {
            state.finished = true;
            out.push_str(&StreamEvent::Done.to_sse());
        }
    }
    if !out.is_empty() {
        return Some(out);
    }
    // With stopAfterIdle on a session at rest, end now: nothing is buffered, so every entry
    // appended so far has been sent.
    if state.stop_after_idle {
        let at_rest = state
            .actor
            .with_loaded(|l| l.session.status() != Status::Running)
            .unwrap_or(true);
        if at_rest {
            state.finished = true;
            return Some(format!(
                "{}{}",
                StreamEvent::Idle.to_sse(),
                StreamEvent::Done.to_sse()
            ));
        }
    }
    // 3. Live events, heartbeats and the timeout.
    loop {
        let t = now().0;
        if state.deadline.is_some_and(|d| t >= d) {
            state.finished = true;
            return Some(StreamEvent::Done.to_sse());
        }
        if t >= state.next_heartbeat {
            state.next_heartbeat = t + HEARTBEAT.as_millis() as u64;
            return Some(SSE_HEARTBEAT.to_string());
        }
        let wake = state
            .deadline
            .map_or(state.next_heartbeat, |d| d.min(state.next_heartbeat));
        let timer = Delay::from(Duration::from_millis(wake.saturating_sub(t).max(1)));
        match select(state.live.next(), timer.boxed_local()).await {
            Either::Left((Some(event), _)) => {
                let mut out = String::new();
                let idle = matches!(event, StreamEvent::Idle);
                push_event(state, &event, &mut out);
                // Drain what is already buffered, to send fewer, larger chunks.
                while let Ok(event) = state.live.try_recv() {
                    if state.finished {
                        break;
                    }
                    let idle = matches!(event, StreamEvent::Idle);
                    push_event(state, &event, &mut out);
                    if idle && state.stop_after_idle {
                        state.finished = true;
                        out.push_str(&StreamEvent::Done.to_sse());
                    }
                }
                if idle && state.stop_after_idle && !state.finished {
                    state.finished = true;
                    out.push_str(&StreamEvent::Done.to_sse());
                }
                if out.is_empty() {
                    continue;
                }
                return Some(out);
            }
            // The actor dropped us (too slow) or went away: end; the client reconnects.
            Either::Left((None, _)) => {
                state.finished = true;
                return Some(StreamEvent::Done.to_sse());
            }
            Either::Right(_) => continue,
        }
    }
}

fn push_event(state: &mut FollowState, event: &StreamEvent, out: &mut String) {
    if let StreamEvent::EntryAppended { entry } = event {
        if entry.cursor <= state.sent_cursor {
            return; // Already sent by the backfill.
        }
        state.sent_cursor = entry.cursor;
        if state.since_time.is_some_and(|t| entry.created_at <= t) {
            return;
        }
    }
    out.push_str(&event.to_sse());
}
