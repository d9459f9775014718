//! The follow stream of one session, resumed across dropped connections.
//!
//! The server sends `id:` (the entry's cursor) on every `entry_appended` frame and replays
//! every entry after `Last-Event-ID` exactly once on a new connection (`docs/api.md`). [`Follow`]
//! remembers the cursor of the last entry it yielded and reconnects with it, so what the caller
//! sees is every entry once, in cursor order, whatever happens to the connections underneath.
//! Entries at or below that cursor are dropped, which also covers a server that replays more
//! than asked.

use std::collections::VecDeque;
use std::time::Duration;

use reqwest::Method;
use tokio::time::Instant;
use wuhu_core::sse::{SseDecoder, SseItem};
use wuhu_core::wire::StreamEvent;

use crate::{Client, Error, api_error};

/// The largest SSE line or frame accepted: an entry is at most 1 MiB of content plus JSON
/// escaping; anything larger is a broken stream.
pub const MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// How long a connection may stay silent before it counts as dropped (the server sends a
/// heartbeat every 15 s).
pub const SILENCE_TIMEOUT: Duration = Duration::from_secs(45);

/// Reconnect delays: `initial`, doubled after each failure in a row up to `max`, ±20 % jitter.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// The delay after the first failure.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
    /// Give up after this many failures in a row (`None`: never).
    pub max_failures: Option<u32>,
}

impl Default for Backoff {
    /// 250 ms doubling up to 5 s, giving up after 40 failures in a row (about 3 minutes).
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(250),
            max: Duration::from_secs(5),
            max_failures: Some(40),
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (1 for the first), without jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }
}

/// How to follow.
#[derive(Clone, Debug, Default)]
pub struct FollowOptions {
    /// Yield entries after this cursor (0: the whole transcript).
    pub since_cursor: u64,
    /// End at the first idle point after the backfill (`stopAfterIdle=1`).
    pub stop_after_idle: bool,
    /// End after this long in all, across reconnects (`timeoutSeconds`).
    pub timeout: Option<Duration>,
    /// Reconnect delays.
    pub backoff: Backoff,
}

impl FollowOptions {
    /// Everything from the start, ending when the session is idle.
    pub fn until_idle() -> FollowOptions {
        FollowOptions {
            stop_after_idle: true,
            ..FollowOptions::default()
        }
    }

    /// Everything after `cursor`, live, until the caller stops reading.
    pub fn live_after(cursor: u64) -> FollowOptions {
        FollowOptions {
            since_cursor: cursor,
            ..FollowOptions::default()
        }
    }
}

/// What [`Follow::next`] yields.
// Nearly every value is an `Event`: boxing it would add an allocation per event to save space
// only on the rare reconnect notices.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum FollowEvent {
    /// An event of the stream. `entry_appended` comes once per entry, in cursor order; `lagged`
    /// and `error` are handled here (by reconnecting) and never yielded.
    Event(StreamEvent),
    /// The connection dropped; reconnecting. Yielded once per outage, however many attempts
    /// it takes.
    Disconnected {
        /// Why, for people.
        reason: String,
    },
    /// Connected again after [`FollowEvent::Disconnected`]; nothing was lost.
    Resumed {
        /// Entries after this cursor follow.
        cursor: u64,
    },
}

/// The follow stream of one session; see the module docs. Read it with [`Follow::next`].
#[derive(Debug)]
pub struct Follow {
    client: Client,
    session_id: String,
    options: FollowOptions,
    last_cursor: u64,
    response: Option<reqwest::Response>,
    decoder: SseDecoder,
    pending: VecDeque<FollowEvent>,
    failures: u32,
    in_outage: bool,
    finished: bool,
    deadline: Option<Instant>,
}

impl Follow {
    pub(crate) fn new(client: Client, session_id: String, options: FollowOptions) -> Follow {
        Follow {
            client,
            session_id,
            last_cursor: options.since_cursor,
            deadline: options.timeout.map(|t| Instant::now() + t),
            options,
            response: None,
            decoder: SseDecoder::new(MAX_FRAME_BYTES),
            pending: VecDeque::new(),
            failures: 0,
            in_outage: false,
            finished: false,
        }
    }

    /// The cursor of the last entry yielded (or the starting cursor).
    pub fn last_cursor(&self) -> u64 {
        self.last_cursor
    }

    /// The next event; `None` once the stream ended (`done`).
    ///
    /// # Errors
    /// [`Error::Api`] when the server refuses the stream for good (`401`, `404`, ...), and
    /// [`Error::Follow`] after too many failed reconnects in a row or a frame over
    /// [`MAX_FRAME_BYTES`]. The stream ends after an error.
    pub async fn next(&mut self) -> Option<Result<FollowEvent, Error>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.finished {
                return None;
            }
            let Some(response) = self.response.as_mut() else {
                if let Err(error) = self.connect().await {
                    self.finished = true;
                    return Some(Err(error));
                }
                continue;
            };
            let chunk = tokio::time::timeout(SILENCE_TIMEOUT, response.chunk()).await;
            let mut items = Vec::new();
            let outcome = match chunk {
                Ok(Ok(Some(bytes))) => self.decoder.push(&bytes, &mut items).map(|()| true),
                // A frame cut by the end of the body is discarded, as the standard says.
                Ok(Ok(None)) => Ok(false),
                Ok(Err(error)) => {
                    self.response = None;
                    if let Err(error) = self.failed(format!("connection lost: {error}")).await {
                        return Some(Err(error));
                    }
                    continue;
                }
                Err(_) => {
                    self.response = None;
                    let reason = format!("no data for {} s", SILENCE_TIMEOUT.as_secs());
                    if let Err(error) = self.failed(reason).await {
                        return Some(Err(error));
                    }
                    continue;
                }
            };
            let open = match outcome {
                Ok(open) => open,
                Err(error) => {
                    self.finished = true;
                    self.response = None;
                    return Some(Err(Error::Follow(error.to_string())));
                }
            };
            let mut reconnect_reason = None;
            for item in items {
                // Any frame or comment shows the connection works: the back-off starts over.
                self.failures = 0;
                let SseItem::Frame(frame) = item else {
                    continue;
                };
                // Unknown event types (a newer server) are skipped.
                let Ok(event) = serde_json::from_str::<StreamEvent>(&frame.data) else {
                    continue;
                };
                match event {
                    StreamEvent::EntryAppended { ref entry } => {
                        if entry.cursor <= self.last_cursor {
                            continue;
                        }
                        self.last_cursor = entry.cursor;
                        self.pending.push_back(FollowEvent::Event(event));
                    }
                    StreamEvent::Done => {
                        self.pending.push_back(FollowEvent::Event(event));
                        self.finished = true;
                        break;
                    }
                    StreamEvent::Lagged { cursor } => {
                        // Slow reader: the server closes; a new connection backfills.
                        self.last_cursor = self.last_cursor.max(cursor);
                        reconnect_reason = Some(None);
                        break;
                    }
                    StreamEvent::Error { message } => {
                        reconnect_reason = Some(Some(format!("server error: {message}")));
                        break;
                    }
                    other => self.pending.push_back(FollowEvent::Event(other)),
                }
            }
            if self.finished {
                self.response = None;
                continue;
            }
            match reconnect_reason {
                Some(None) => self.response = None,
                Some(Some(reason)) => {
                    self.response = None;
                    if let Err(error) = self.failed(reason).await {
                        return Some(Err(error));
                    }
                }
                None if !open => {
                    self.response = None;
                    let reason = "the server closed the stream".to_string();
                    if let Err(error) = self.failed(reason).await {
                        return Some(Err(error));
                    }
                }
                None => {}
            }
        }
    }

    /// One connection attempt. A transient failure is recorded (notice, back-off) and is not
    /// an error; an error is final.
    async fn connect(&mut self) -> Result<(), Error> {
        {
            let mut url = self
                .client
                .url(["v1", "sessions", &self.session_id, "follow"]);
            {
                let mut query = url.query_pairs_mut();
                query.append_pair("sinceCursor", &self.last_cursor.to_string());
                if self.options.stop_after_idle {
                    query.append_pair("stopAfterIdle", "1");
                }
                if let Some(deadline) = self.deadline {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.pending
                            .push_back(FollowEvent::Event(StreamEvent::Done));
                        self.finished = true;
                        return Ok(());
                    }
                    // The server counts whole seconds, at least one.
                    let seconds = left.as_secs_f64().ceil().max(1.0) as u64;
                    query.append_pair("timeoutSeconds", &seconds.to_string());
                }
            }
            let mut request = self
                .client
                .request(Method::GET, url)
                .header("accept", "text/event-stream");
            if self.last_cursor > 0 {
                request = request.header("last-event-id", self.last_cursor.to_string());
            }
            let error = match tokio::time::timeout(SILENCE_TIMEOUT, request.send()).await {
                Err(_) => Error::Follow(format!("no answer in {} s", SILENCE_TIMEOUT.as_secs())),
                Ok(Err(error)) => Error::Transport(error),
                Ok(Ok(response)) if response.status().is_success() => {
                    self.decoder = SseDecoder::new(MAX_FRAME_BYTES);
                    self.response = Some(response);
                    if std::mem::take(&mut self.in_outage) {
                        self.pending.push_back(FollowEvent::Resumed {
                            cursor: self.last_cursor,
                        });
                    }
                    return Ok(());
                }
                Ok(Ok(response)) => {
                    let status = response.status().as_u16();
                    let body = response.bytes().await.unwrap_or_default();
                    api_error(status, &body)
                }
            };
            let transient = matches!(error, Error::Follow(_)) || error.is_transient();
            if !transient {
                return Err(error);
            }
            self.failed(error.to_string()).await
        }
    }

    /// Records a failure: says so once per outage, waits the back-off, or gives up.
    async fn failed(&mut self, reason: String) -> Result<(), Error> {
        self.failures += 1;
        if let Some(max) = self.options.backoff.max_failures
            && self.failures > max
        {
            self.finished = true;
            return Err(Error::Follow(format!(
                "gave up after {max} failed reconnects: {reason}"
            )));
        }
        if !self.in_outage {
            self.in_outage = true;
            self.pending.push_back(FollowEvent::Disconnected { reason });
        }
        tokio::time::sleep(jitter(self.options.backoff.delay(self.failures))).await;
        Ok(())
    }
}

/// `delay` ±20 %, so many clients of a restarted server do not reconnect in lockstep.
fn jitter(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // A factor in [0.8, 1.2) from the clock's low bits.
    let factor = 0.8 + f64::from(nanos % 1000) / 2500.0;
    delay.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let backoff = Backoff::default();
        let delays: Vec<u128> = (1..=8).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(backoff.delay(u32::MAX).as_millis(), 5000);
        for _ in 0..100 {
            let d = jitter(Duration::from_millis(1000)).as_millis();
            assert!((800..1200).contains(&d), "{d}");
        }
    }
}
