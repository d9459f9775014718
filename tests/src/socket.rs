//! A client of a session's WebSocket (`GET /v1/sessions/:id/socket`): blocking tungstenite over
//! a plain TCP stream, every read with a deadline. Frames are `wuhu_core::socket`'s.
//!
//! It acknowledges what it reads as docs/api.md asks of every client: an `ack` with the count of
//! server frames received, sent from [`SessionSocket::read`] once
//! [`wuhu_core::socket::ACK_EVERY_FRAMES`] frames or [`wuhu_core::socket::ACK_EVERY_BYTES`]
//! bytes arrived since the last one ([`SessionSocket::without_acks`] turns that off, for tests
//! of a client that never acks).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::WebSocket;
use tungstenite::client::IntoClientRequest;
use wuhu_core::socket::{ACK_EVERY_BYTES, ACK_EVERY_FRAMES, ClientFrame};

/// How the upgrade authenticates.
#[derive(Clone, Debug)]
pub enum SocketAuth {
    /// `Authorization: Bearer`.
    Bearer(String),
    /// A `Cookie` header, and the `Origin` a browser would send (if any).
    Cookie(String, Option<String>),
    /// Nothing.
    None,
}

/// A close frame's code and reason.
pub type Close = (u16, String);

/// One open session socket.
pub struct SessionSocket {
    ws: WebSocket<TcpStream>,
    /// Server text frames received, and their bytes.
    received: u64,
    received_bytes: u64,
    /// The `received` of the last ack sent.
    acked: u64,
    /// Bytes received since the last ack.
    unacked_bytes: u64,
    /// Acks are sent from `read`.
    acks: bool,
    /// Frames of a message not returned yet (a message carries one or more).
    ready: std::collections::VecDeque<Value>,
    /// Server text messages received.
    messages: u64,
}

/// What a socket read returned.
#[derive(Clone, Debug, PartialEq)]
pub enum SocketRead {
    /// A text frame, parsed.
    Frame(Value),
    /// The server closed the socket (code and reason; `None`: the connection just ended).
    Closed(Option<Close>),
    /// Nothing before the deadline.
    Timeout,
}

impl SessionSocket {
    /// Opens `ws://…/v1/sessions/{id}/socket{query}`.
    ///
    /// # Errors
    /// The HTTP status of a refused upgrade (0 when the connection failed otherwise) and the
    /// body.
    pub fn connect(
        base_url: &str,
        id: &str,
        query: &str,
        auth: &SocketAuth,
    ) -> Result<SessionSocket, (u16, String)> {
        let host_port = base_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let url = format!("ws://{host_port}/v1/sessions/{id}/socket{query}");
        let mut request = url.into_client_request().map_err(|e| (0, e.to_string()))?;
        let headers = request.headers_mut();
        match auth {
            SocketAuth::Bearer(token) => {
                headers.insert(
                    "Authorization",
                    format!("Bearer {token}").parse().expect("header"),
                );
            }
            SocketAuth::Cookie(cookie, origin) => {
                headers.insert("Cookie", cookie.parse().expect("header"));
                if let Some(origin) = origin {
                    headers.insert("Origin", origin.parse().expect("header"));
                }
            }
            SocketAuth::None => {}
        }
        let stream = TcpStream::connect(&host_port).map_err(|e| (0, e.to_string()))?;
        stream.set_nodelay(true).ok();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| (0, e.to_string()))?;
        match tungstenite::client::client(request, stream) {
            Ok((ws, _)) => Ok(SessionSocket {
                ws,
                received: 0,
                received_bytes: 0,
                acked: 0,
                unacked_bytes: 0,
                acks: true,
                ready: Default::default(),
                messages: 0,
            }),
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
                let status = response.status().as_u16();
                let body = response
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                Err((status, body))
            }
            Err(e) => Err((0, e.to_string())),
        }
    }

    /// A client that never acknowledges what it reads (the server holds its events back once
    /// its window is full, and ends it with `lagged` when they overflow its queue).
    pub fn without_acks(mut self) -> SessionSocket {
        self.acks = false;
        self
    }

    /// Server messages received so far (each carries one or more frames).
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Server frames received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Bytes of the server text frames received so far.
    pub fn received_bytes(&self) -> u64 {
        self.received_bytes
    }

    /// Sends `{"type":"ack","received":<frames received>}` now (no reply comes).
    #[track_caller]
    pub fn ack(&mut self) {
        self.send(&ClientFrame::Ack {
            received: self.received,
        });
        self.acked = self.received;
        self.unacked_bytes = 0;
    }

    /// Sends a client frame.
    #[track_caller]
    pub fn send(&mut self, frame: &ClientFrame) {
        let text = serde_json::to_string(frame).expect("frame");
        self.send_text(&text);
    }

    /// Sends a client frame; an error (the server may have closed the socket) is returned, not
    /// a panic.
    pub fn try_send(&mut self, frame: &ClientFrame) -> Result<(), String> {
        let text = serde_json::to_string(frame).expect("frame");
        self.ws
            .send(tungstenite::Message::text(text))
            .map_err(|e| e.to_string())
    }

    /// Sends raw text.
    #[track_caller]
    pub fn send_text(&mut self, text: &str) {
        self.ws
            .send(tungstenite::Message::text(text))
            .unwrap_or_else(|e| panic!("send: {e}"));
    }

    /// Sends a binary frame.
    #[track_caller]
    pub fn send_binary(&mut self, bytes: &[u8]) {
        self.ws
            .send(tungstenite::Message::binary(bytes.to_vec()))
            .unwrap_or_else(|e| panic!("send binary: {e}"));
    }

    /// The next frame, a close or a timeout, by `deadline`. A server message carries one or
    /// more frames (`wuhu_core::socket::frames_of`): each counts as received when its message
    /// arrives, as the server counts it sent.
    pub fn read(&mut self, deadline: Instant) -> SocketRead {
        if let Some(frame) = self.ready.pop_front() {
            return SocketRead::Frame(frame);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return SocketRead::Timeout;
            }
            if self.ws.get_mut().set_read_timeout(Some(left)).is_err() {
                return SocketRead::Closed(None);
            }
            match self.ws.read() {
                Ok(tungstenite::Message::Text(text)) => {
                    self.messages += 1;
                    for frame in wuhu_core::socket::frames_of(text.as_str()) {
                        let value = serde_json::from_str(frame)
                            .unwrap_or_else(|e| panic!("a frame that is not JSON ({e}): {frame}"));
                        self.ready.push_back(value);
                        self.received += 1;
                        self.received_bytes += frame.len() as u64;
                        self.unacked_bytes += frame.len() as u64;
                    }
                    if self.acks
                        && (self.received - self.acked >= ACK_EVERY_FRAMES
                            || self.unacked_bytes >= ACK_EVERY_BYTES)
                    {
                        // Best effort: the server may be closing the socket.
                        let ack = ClientFrame::Ack {
                            received: self.received,
                        };
                        let text = serde_json::to_string(&ack).expect("frame");
                        let _ = self.ws.send(tungstenite::Message::text(text));
                        self.acked = self.received;
                        self.unacked_bytes = 0;
                    }
                    if let Some(frame) = self.ready.pop_front() {
                        return SocketRead::Frame(frame);
                    }
                }
                Ok(tungstenite::Message::Close(close)) => {
                    return SocketRead::Closed(
                        close.map(|c| (u16::from(c.code), c.reason.to_string())),
                    );
                }
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return SocketRead::Timeout;
                }
                Err(_) => return SocketRead::Closed(None),
            }
        }
    }

    /// The next text frame within `timeout`; panics on a close or the deadline.
    #[track_caller]
    pub fn next_frame(&mut self, timeout: Duration) -> Value {
        match self.read(Instant::now() + timeout) {
            SocketRead::Frame(value) => value,
            other => panic!("expected a frame within {timeout:?}, got {other:?}"),
        }
    }

    /// Reads until the reply with `id`, within `timeout`; the events read on the way are
    /// appended to `events`.
    #[track_caller]
    pub fn reply(&mut self, id: &str, timeout: Duration, events: &mut Vec<Value>) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            match self.read(deadline) {
                SocketRead::Frame(frame) if frame["type"] == "reply" => {
                    if frame["id"] == id {
                        return frame;
                    }
                    panic!("a reply to another frame while waiting for {id}: {frame}");
                }
                SocketRead::Frame(frame) => events.push(frame),
                other => panic!("no reply to {id} within {timeout:?}: {other:?}"),
            }
        }
    }

    /// Reads until the server closes the socket within `timeout` (frames on the way are
    /// returned with the close).
    ///
    /// # Errors
    /// The deadline passed with the socket open.
    pub fn wait_closed(
        &mut self,
        timeout: Duration,
    ) -> Result<(Vec<Value>, Option<Close>), String> {
        let deadline = Instant::now() + timeout;
        let mut frames = Vec::new();
        loop {
            match self.read(deadline) {
                SocketRead::Frame(frame) => frames.push(frame),
                SocketRead::Closed(close) => return Ok((frames, close)),
                SocketRead::Timeout => {
                    return Err(format!("still open after {timeout:?}; read {frames:?}"));
                }
            }
        }
    }

    /// Closes the socket (best effort).
    pub fn close(mut self) {
        let _ = self.ws.close(None);
        let _ = self.ws.flush();
    }
}
