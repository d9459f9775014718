//! Server-Sent Events: [`SseParser`] (JSON frames over `wuhu_core::sse`, the one decoder) and a client
//! ([`SseStream`]) that reads a follow stream through the shared `reqwest` client
//! ([`crate::net`]) with read deadlines.
//!
//! The client keeps all decoding state in the struct, so a read that times out loses nothing:
//! call [`SseStream::next_item`] again with a later deadline. Dropping the stream closes the
//! connection; reconnect with [`crate::api::Api::follow_from`] and `Last-Event-ID`.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use serde_json::Value;
use wuhu_core::sse::{self, SseDecoder};

use crate::http::{self, Request, Response};
use crate::net;

/// One parsed SSE frame.
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    /// The `id:` field when the frame had one and it was an integer (our cursors).
    pub id: Option<u64>,
    /// The `event:` field (`message` when absent).
    pub event: String,
    /// `data:` parsed as JSON, or a JSON string holding the raw text when it is not JSON.
    pub data: Value,
    /// `data:` lines joined with `\n`, as received.
    pub raw_data: String,
}

impl SseEvent {
    /// `data.type`, which the Worker mirrors from `event:`.
    pub fn data_type(&self) -> Option<&str> {
        self.data.get("type").and_then(Value::as_str)
    }

    /// The entry of an `entry_appended` event, decoded.
    pub fn entry(&self) -> Option<wuhu_core::wire::Entry> {
        if self.event != "entry_appended" {
            return None;
        }
        serde_json::from_value(self.data.get("entry")?.clone()).ok()
    }

    /// The text of an `assistant_text_delta` event.
    pub fn delta(&self) -> Option<&str> {
        if self.event != "assistant_text_delta" {
            return None;
        }
        self.data.get("delta").and_then(Value::as_str)
    }
}

/// An event or a comment line (`: heartbeat`).
#[derive(Clone, Debug, PartialEq)]
pub enum SseItem {
    /// A dispatched frame.
    Event(SseEvent),
    /// A comment, without the leading colon and one optional space.
    Comment(String),
}

/// Largest SSE line or frame the harness accepts (entries can be a few MiB).
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// Incremental SSE parser: push bytes in any split, pop items. The line and field rules are
/// `wuhu_core::sse`'s (the one decoder); this adds the harness's JSON view of each frame.
#[derive(Debug)]
pub struct SseParser {
    /// Boxed: keeps [`FollowOpen`]'s variants of similar size.
    decoder: Box<SseDecoder>,
    ready: VecDeque<SseItem>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new()
    }
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> SseParser {
        SseParser {
            decoder: Box::new(SseDecoder::new(MAX_FRAME_BYTES)),
            ready: VecDeque::new(),
        }
    }

    /// Feeds bytes.
    ///
    /// # Errors
    /// `InvalidData` for a line or frame over [`MAX_FRAME_BYTES`].
    pub fn push(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut out = Vec::new();
        let result = self.decoder.push(bytes, &mut out);
        self.ready.extend(out.into_iter().map(convert));
        result.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Ends the stream: a last frame without its blank line is dispatched.
    ///
    /// # Errors
    /// As [`SseParser::push`].
    pub fn finish(&mut self) -> io::Result<()> {
        let mut out = Vec::new();
        let result = self.decoder.finish(&mut out);
        self.ready.extend(out.into_iter().map(convert));
        result.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The next complete item.
    pub fn next_item(&mut self) -> Option<SseItem> {
        self.ready.pop_front()
    }
}

fn convert(item: sse::SseItem) -> SseItem {
    match item {
        sse::SseItem::Comment(comment) => SseItem::Comment(comment),
        sse::SseItem::Frame(frame) => {
            let data = serde_json::from_str(&frame.data)
                .unwrap_or_else(|_| Value::String(frame.data.clone()));
            SseItem::Event(SseEvent {
                id: frame.id.and_then(|id| id.trim().parse().ok()),
                event: frame.event.unwrap_or_else(|| "message".to_string()),
                data,
                raw_data: frame.data,
            })
        }
    }
}

/// The outcome of opening a follow stream.
#[derive(Debug)]
pub enum FollowOpen {
    /// `200 text/event-stream`.
    Stream(SseStream),
    /// Anything else, read to the end.
    Rejected(Response),
}

impl FollowOpen {
    /// The stream; panics with the response when it was rejected.
    #[track_caller]
    pub fn expect_stream(self) -> SseStream {
        match self {
            FollowOpen::Stream(stream) => stream,
            FollowOpen::Rejected(response) => panic!("follow stream rejected: {response}"),
        }
    }

    /// The rejection; panics when a stream was opened.
    #[track_caller]
    pub fn expect_rejected(self) -> Response {
        match self {
            FollowOpen::Stream(stream) => {
                panic!("expected a rejection, got a stream ({:?})", stream.headers)
            }
            FollowOpen::Rejected(response) => response,
        }
    }
}

/// A live SSE response being read incrementally.
#[derive(Debug)]
pub struct SseStream {
    response: reqwest::Response,
    parser: SseParser,
    eof: bool,
    last_event_id: Option<u64>,
    /// Response headers.
    pub headers: Vec<(String, String)>,
}

impl SseStream {
    /// Sends `request` (a GET) and reads the response head within `connect_timeout`.
    ///
    /// # Errors
    /// Connection and protocol errors. A non-200 answer is [`FollowOpen::Rejected`], not an error.
    pub fn open(request: &Request, connect_timeout: Duration) -> io::Result<FollowOpen> {
        // The stream lives longer than any request deadline: only the head is timed here.
        let mut request = request.clone();
        request.timeout = Duration::from_secs(24 * 3600);
        let request = request.build()?;
        let response =
            // `execute` arms its timer when called: call it inside the runtime.
            net::block_on_within(connect_timeout, async { net::client().execute(request).await })?
                .map_err(net::io_error)?;
        let status = response.status().as_u16();
        let headers = net::headers_of(response.headers());
        let is_stream = status == 200
            && http::find_header(&headers, "content-type")
                .is_some_and(|t| t.starts_with("text/event-stream"));
        if !is_stream {
            // Read the rest as a plain response.
            let body =
                net::block_on_within(connect_timeout, response.bytes())?.map_err(net::io_error)?;
            return Ok(FollowOpen::Rejected(Response {
                status,
                headers,
                body: body.to_vec(),
            }));
        }
        Ok(FollowOpen::Stream(SseStream {
            response,
            parser: SseParser::new(),
            eof: false,
            last_event_id: None,
            headers,
        }))
    }

    /// The next event or comment. `Ok(None)` when the server ended the stream.
    ///
    /// # Errors
    /// `TimedOut` when nothing complete arrived before `deadline` (the stream stays usable:
    /// a chunk is taken from the body whole or not at all); other I/O errors.
    pub fn next_item(&mut self, deadline: Instant) -> io::Result<Option<SseItem>> {
        loop {
            if let Some(item) = self.parser.next_item() {
                if let SseItem::Event(SseEvent { id: Some(id), .. }) = &item {
                    self.last_event_id = Some(*id);
                }
                return Ok(Some(item));
            }
            if self.eof {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
            }
            match net::block_on_within(left, self.response.chunk())? {
                Ok(Some(bytes)) => self.parser.push(&bytes)?,
                Ok(None) => {
                    self.eof = true;
                    // Complete a final frame that lacked its blank line.
                    self.parser.finish()?;
                }
                Err(error) => return Err(net::io_error(error)),
            }
        }
    }

    /// The next event, skipping comments. `Ok(None)` at the end of the stream.
    ///
    /// # Errors
    /// As [`SseStream::next_item`].
    pub fn next_event(&mut self, deadline: Instant) -> io::Result<Option<SseEvent>> {
        loop {
            match self.next_item(deadline)? {
                Some(SseItem::Event(event)) => return Ok(Some(event)),
                Some(SseItem::Comment(_)) => continue,
                None => return Ok(None),
            }
        }
    }

    /// Reads events until `stop` returns true for one (included in the result).
    /// Panics on timeout or a premature end, listing what was received.
    #[track_caller]
    pub fn collect_until(
        &mut self,
        timeout: Duration,
        mut stop: impl FnMut(&SseEvent) -> bool,
    ) -> Vec<SseEvent> {
        let deadline = Instant::now() + timeout;
        let mut events = Vec::new();
        loop {
            match self.next_event(deadline) {
                Ok(Some(event)) => {
                    let done = stop(&event);
                    events.push(event);
                    if done {
                        return events;
                    }
                }
                Ok(None) => panic!("follow stream ended early; got {}", summarize(&events)),
                Err(err) => panic!("follow stream: {err}; got {}", summarize(&events)),
            }
        }
    }

    /// Reads every event until the server closes the stream. Panics on timeout.
    #[track_caller]
    pub fn collect_to_end(&mut self, timeout: Duration) -> Vec<SseEvent> {
        let deadline = Instant::now() + timeout;
        let mut events = Vec::new();
        loop {
            match self.next_event(deadline) {
                Ok(Some(event)) => events.push(event),
                Ok(None) => return events,
                Err(err) => panic!("follow stream: {err}; got {}", summarize(&events)),
            }
        }
    }

    /// The id of the last event that had one.
    pub fn last_event_id(&self) -> Option<u64> {
        self.last_event_id
    }

    /// Closes the connection at once (as a browser tab that goes away): dropping an unfinished
    /// `reqwest` response closes its connection.
    pub fn close(self) {
        drop(self.response);
    }
}

/// One line per event, for panic messages.
pub fn summarize(events: &[SseEvent]) -> String {
    let mut out = format!("{} events:", events.len());
    for event in events {
        let data: String = event.raw_data.chars().take(160).collect();
        match event.id {
            Some(id) => out.push_str(&format!("\n  [{id}] {} {data}", event.event)),
            None => out.push_str(&format!("\n  {} {data}", event.event)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseItem> {
        let mut parser = SseParser::new();
        let mut items = Vec::new();
        for chunk in chunks {
            parser.push(chunk).unwrap();
            while let Some(item) = parser.next_item() {
                items.push(item);
            }
        }
        items
    }

    #[test]
    fn frames_parse_in_any_split() {
        let wire = b"id: 7\nevent: entry_appended\ndata: {\"type\":\"entry_appended\",\"entry\":{}}\n\n: heartbeat\n\nevent: idle\r\ndata: {\"type\":\"idle\"}\r\n\r\nevent: x\rdata: a\rdata: b\r\r\n";
        let whole = parse_all(&[wire]);
        assert_eq!(whole.len(), 4, "{whole:?}");
        let SseItem::Event(first) = &whole[0] else {
            panic!()
        };
        assert_eq!(
            (first.id, first.event.as_str(), first.data_type()),
            (Some(7), "entry_appended", Some("entry_appended"))
        );
        assert_eq!(whole[1], SseItem::Comment("heartbeat".into()));
        let SseItem::Event(idle) = &whole[2] else {
            panic!()
        };
        assert_eq!((idle.id, idle.event.as_str()), (None, "idle"));
        let SseItem::Event(multi) = &whole[3] else {
            panic!()
        };
        assert_eq!(multi.raw_data, "a\nb");
        assert_eq!(multi.data, Value::String("a\nb".into()));
        for split in 0..wire.len() {
            assert_eq!(
                parse_all(&[&wire[..split], &wire[split..]]),
                whole,
                "split at {split}"
            );
        }
        let bytewise: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(parse_all(&bytewise), whole);
    }

    #[test]
    fn events_without_event_field_default_to_message() {
        let items = parse_all(&[b"data: [DONE]\n\n"]);
        let SseItem::Event(event) = &items[0] else {
            panic!()
        };
        assert_eq!(
            (event.event.as_str(), event.raw_data.as_str(), event.id),
            ("message", "[DONE]", None)
        );
    }

    #[test]
    fn stream_reads_chunked_sse_across_timeouts_and_reports_rejections() {
        use std::io::{Read, Write};
        use std::net::TcpListener;

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            // First connection: a stream whose second frame comes late and split.
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let n = conn.read(&mut head).unwrap();
            // Header names travel lowercase over reqwest.
            assert!(
                String::from_utf8_lossy(&head[..n])
                    .to_ascii_lowercase()
                    .contains("last-event-id: 4")
            );
            let frame1 = b"id: 5\nevent: entry_appended\ndata: {\"type\":\"entry_appended\"}\n\n: heartbeat\n\n";
            let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            out.extend(format!("{:x}\r\n", frame1.len()).as_bytes());
            out.extend(frame1);
            out.extend(b"\r\n");
            conn.write_all(&out).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            conn.write_all(b"16\r\nevent: idle\ndata: {").unwrap();
            std::thread::sleep(Duration::from_millis(50));
            conn.write_all(b"}\n\n\r\n0\r\n\r\n").unwrap();
            // Second connection: a JSON rejection.
            let (mut conn, _) = listener.accept().unwrap();
            let _ = conn.read(&mut head).unwrap();
            let body = b"{\"error\":{\"code\":\"unauthorized\",\"message\":\"no\"}}";
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).unwrap();
            conn.write_all(body).unwrap();
        });
        let request =
            Request::new("GET", format!("http://{addr}/follow")).header("Last-Event-ID", "4");
        let mut stream = SseStream::open(&request, Duration::from_secs(5))
            .unwrap()
            .expect_stream();
        let soon = || Instant::now() + Duration::from_millis(100);
        let first = stream.next_item(soon()).unwrap().unwrap();
        assert!(matches!(
            first,
            SseItem::Event(SseEvent { id: Some(5), .. })
        ));
        assert_eq!(
            stream.next_item(soon()).unwrap(),
            Some(SseItem::Comment("heartbeat".into()))
        );
        let err = stream.next_item(soon()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let idle = stream
            .next_event(Instant::now() + Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(
            (idle.event.as_str(), &idle.data),
            ("idle", &serde_json::json!({}))
        );
        assert_eq!(stream.next_item(soon()).unwrap(), None);
        assert_eq!(stream.last_event_id(), Some(5));

        let rejected = SseStream::open(
            &Request::new("GET", format!("http://{addr}/follow")),
            Duration::from_secs(5),
        )
        .unwrap()
        .expect_rejected();
        assert_eq!(rejected.expect_error(401).code, "unauthorized");
        server.join().unwrap();
    }

    #[test]
    fn blank_lines_alone_dispatch_nothing() {
        assert!(parse_all(&[b"\n\n\r\n"]).is_empty());
    }
}
