//! A fake Discord Gateway: a WebSocket server on an ephemeral loopback port speaking the
//! Gateway's JSON frames (API v10), for the Discord binding's connection.
//!
//! ```text
//! let gateway = FakeGateway::start("bot-token", "80001", 300);   // token, bot user id, heartbeat ms
//! discord.set_gateway(&gateway.url());                           // what GET /gateway/bot names
//! gateway.wait_ready(1, deadline);                               // IDENTIFY checked, READY sent
//! gateway.push_message(json!({...}));                            // a MESSAGE_CREATE dispatch
//! gateway.drop_connection(); gateway.send_reconnect(); gateway.close_with(4004);
//! ```
//!
//! Each connection gets `HELLO` with the test's heartbeat interval; an `IDENTIFY` is checked
//! (token, intents `GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT`: a wrong token is
//! closed with 4004, other intents with 4014) and answered with `READY` (a new session, its
//! `resume_gateway_url` is `ws://<this server>/resume`); a `RESUME` of the known session replays
//! the dispatches after its `seq` (or all of them, [`FakeGateway::replay_all_on_resume`]) and
//! ends with `RESUMED`; heartbeats are answered with `ACK` (unless [`FakeGateway::ack_heartbeats`]
//! turned that off). Every connection is recorded
//! ([`GatewayConnection`]). Dropping the server stops accepting and ends its connections.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tungstenite::protocol::CloseFrame;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

/// The intents a binding must identify with.
pub const INTENTS: u64 = (1 << 9) | (1 << 12) | (1 << 15);

/// One connection the fake accepted.
#[derive(Clone, Debug, Default)]
pub struct GatewayConnection {
    /// The request path and query (`/?v=10&encoding=json`, `/resume?v=10&encoding=json`).
    pub path: String,
    /// Its `IDENTIFY` (`d`), if it sent one.
    pub identify: Option<Value>,
    /// Its `RESUME` (`d`), if it sent one.
    pub resume: Option<Value>,
    /// Heartbeats received.
    pub heartbeats: u32,
    /// Whether `READY` or `RESUMED` was sent.
    pub ready: bool,
    /// Whether it is still open.
    pub open: bool,
    /// How the fake ended it (a close code), if it did.
    pub closed_with: Option<u16>,
}

enum Command {
    Dispatch(&'static str, Value),
    Raw(Value),
    Close(u16),
    Drop,
}

struct State {
    token: String,
    bot_id: String,
    heartbeat_ms: u64,
    connections: Vec<GatewayConnection>,
    /// For the newest open connection.
    commands: VecDeque<Command>,
    session_id: String,
    seq: u64,
    /// The session's dispatches, for a resume's replay.
    history: Vec<(u64, &'static str, Value)>,
    replay_all: bool,
    close_on_identify: Option<u16>,
    /// Heartbeats are not acknowledged (a zombie connection, as the client sees it).
    no_acks: bool,
}

/// A running fake Gateway.
pub struct FakeGateway {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl FakeGateway {
    /// Starts on `127.0.0.1:0` for the bot `token` whose user id is `bot_id`, saying
    /// `heartbeat_ms` in `HELLO`.
    pub fn start(token: &str, bot_id: &str, heartbeat_ms: u64) -> FakeGateway {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake gateway");
        let addr = listener.local_addr().expect("gateway address");
        listener
            .set_nonblocking(true)
            .expect("gateway listener non-blocking");
        let state = Arc::new(Mutex::new(State {
            token: token.into(),
            bot_id: bot_id.into(),
            heartbeat_ms,
            connections: Vec::new(),
            commands: VecDeque::new(),
            session_id: String::new(),
            seq: 0,
            history: Vec::new(),
            replay_all: false,
            close_on_identify: None,
            no_acks: false,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (accept_state, accept_stop) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            while !accept_stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (state, stop) = (accept_state.clone(), accept_stop.clone());
                        std::thread::spawn(move || serve(stream, addr, state, stop));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => return,
                }
            }
        });
        FakeGateway { addr, state, stop }
    }

    /// The URL `GET /gateway/bot` names.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Every connection so far, oldest first.
    pub fn connections(&self) -> Vec<GatewayConnection> {
        self.state.lock().unwrap().connections.clone()
    }

    /// Waits until `n` connections got `READY` or `RESUMED`; returns them all.
    #[track_caller]
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> Vec<GatewayConnection> {
        crate::util::wait_for(&format!("{n} ready gateway connections"), timeout, || {
            let connections = self.connections();
            (connections.iter().filter(|c| c.ready).count() >= n).then_some(connections)
        })
    }

    /// A `MESSAGE_CREATE` with `d` to the newest connection (queued until one is ready).
    pub fn push_message(&self, d: Value) {
        let mut state = self.state.lock().unwrap();
        state
            .commands
            .push_back(Command::Dispatch("MESSAGE_CREATE", d));
    }

    /// Sends `op 7 RECONNECT`.
    pub fn send_reconnect(&self) {
        let mut state = self.state.lock().unwrap();
        state
            .commands
            .push_back(Command::Raw(json!({"op": 7, "d": null})));
    }

    /// Closes the newest connection with `code`.
    pub fn close_with(&self, code: u16) {
        self.state
            .lock()
            .unwrap()
            .commands
            .push_back(Command::Close(code));
    }

    /// Cuts the newest connection without a close frame (the network dropped it).
    pub fn drop_connection(&self) {
        self.state.lock().unwrap().commands.push_back(Command::Drop);
    }

    /// A resume replays every dispatch of the session, not only those after its `seq`.
    pub fn replay_all_on_resume(&self) {
        self.state.lock().unwrap().replay_all = true;
    }

    /// Heartbeats are acknowledged (`true`, the default) or silently taken (`false`).
    pub fn ack_heartbeats(&self, ack: bool) {
        self.state.lock().unwrap().no_acks = !ack;
    }

    /// Later `IDENTIFY`s are answered with `READY` again (undoes [`Self::close_on_identify`]).
    pub fn accept_identify(&self) {
        self.state.lock().unwrap().close_on_identify = None;
    }

    /// Every later `IDENTIFY` is answered by closing with `code`.
    pub fn close_on_identify(&self, code: u16) {
        self.state.lock().unwrap().close_on_identify = Some(code);
    }
}

fn send(ws: &mut WebSocket<TcpStream>, frame: &Value) -> bool {
    ws.send(Message::text(frame.to_string())).is_ok()
}

fn close(ws: &mut WebSocket<TcpStream>, code: u16) {
    let _ = ws.close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: "closed by the fake gateway".into(),
    }));
    let _ = ws.flush();
}

/// Serves one connection until it ends.
// The handshake callback's error type is tungstenite's (an HTTP response), not ours.
#[allow(clippy::result_large_err)]
fn serve(stream: TcpStream, addr: SocketAddr, state: Arc<Mutex<State>>, stop: Arc<AtomicBool>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut path = String::new();
    let Ok(mut ws) = tungstenite::accept_hdr(
        stream,
        |request: &tungstenite::handshake::server::Request, response| {
            path = request.uri().to_string();
            Ok(response)
        },
    ) else {
        return;
    };
    let _ = ws
        .get_mut()
        .set_read_timeout(Some(Duration::from_millis(20)));
    let index = {
        let mut state = state.lock().unwrap();
        state.connections.push(GatewayConnection {
            path,
            open: true,
            ..GatewayConnection::default()
        });
        state.connections.len() - 1
    };
    let heartbeat_ms = state.lock().unwrap().heartbeat_ms;
    send(
        &mut ws,
        &json!({"op": 10, "d": {"heartbeat_interval": heartbeat_ms}}),
    );
    let end = |state: &Arc<Mutex<State>>, code: Option<u16>| {
        let mut state = state.lock().unwrap();
        state.connections[index].open = false;
        state.connections[index].closed_with = code;
    };
    while !stop.load(Ordering::SeqCst) {
        // Commands go to the newest connection once it is ready.
        let command = {
            let mut state = state.lock().unwrap();
            let newest = state.connections.len() - 1 == index && state.connections[index].ready;
            if newest {
                state.commands.pop_front()
            } else {
                None
            }
        };
        match command {
            Some(Command::Dispatch(t, d)) => {
                let frame = {
                    let mut state = state.lock().unwrap();
                    state.seq += 1;
                    let seq = state.seq;
                    state.history.push((seq, t, d.clone()));
                    json!({"op": 0, "t": t, "s": seq, "d": d})
                };
                send(&mut ws, &frame);
                continue;
            }
            Some(Command::Raw(frame)) => {
                send(&mut ws, &frame);
                continue;
            }
            Some(Command::Close(code)) => {
                close(&mut ws, code);
                end(&state, Some(code));
                return;
            }
            Some(Command::Drop) => {
                let _ = ws.get_mut().shutdown(std::net::Shutdown::Both);
                end(&state, None);
                return;
            }
            None => {}
        }
        let text = match ws.read() {
            Ok(Message::Text(text)) => text.to_string(),
            Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed) => break,
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                continue;
            }
            Err(_) => break,
        };
        let Ok(frame) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let d = frame["d"].clone();
        match frame["op"].as_u64() {
            Some(1) => {
                let ack = {
                    let mut state = state.lock().unwrap();
                    state.connections[index].heartbeats += 1;
                    !state.no_acks
                };
                if ack {
                    send(&mut ws, &json!({"op": 11}));
                }
            }
            Some(2) => {
                let (token, close_code) = {
                    let mut state = state.lock().unwrap();
                    state.connections[index].identify = Some(d.clone());
                    (state.token.clone(), state.close_on_identify)
                };
                let code = if d["token"].as_str() != Some(token.as_str()) {
                    Some(4004)
                } else if d["intents"].as_u64() != Some(INTENTS) {
                    Some(4014)
                } else {
                    close_code
                };
                if let Some(code) = code {
                    close(&mut ws, code);
                    end(&state, Some(code));
                    return;
                }
                let ready = {
                    let mut state = state.lock().unwrap();
                    state.session_id = crate::util::random_hex(8);
                    state.history.clear();
                    state.seq = 1;
                    state.connections[index].ready = true;
                    json!({"op": 0, "t": "READY", "s": 1, "d": {
                        "v": 10, "session_id": state.session_id,
                        "resume_gateway_url": format!("ws://{addr}/resume"),
                        "user": {"id": state.bot_id, "username": "wuhu", "bot": true},
                        "guilds": [], "application": {"id": "app1"}}})
                };
                send(&mut ws, &ready);
            }
            Some(6) => {
                let frames = {
                    let mut state = state.lock().unwrap();
                    state.connections[index].resume = Some(d.clone());
                    if d["token"].as_str() != Some(state.token.as_str())
                        || d["session_id"].as_str() != Some(state.session_id.as_str())
                    {
                        None
                    } else {
                        let after = if state.replay_all {
                            0
                        } else {
                            d["seq"].as_u64().unwrap_or(0)
                        };
                        let mut frames: Vec<Value> = state
                            .history
                            .iter()
                            .filter(|(seq, _, _)| *seq > after)
                            .map(|(seq, t, d)| json!({"op": 0, "t": t, "s": seq, "d": d}))
                            .collect();
                        state.seq += 1;
                        frames.push(json!({"op": 0, "t": "RESUMED", "s": state.seq, "d": null}));
                        state.connections[index].ready = true;
                        Some(frames)
                    }
                };
                match frames {
                    Some(frames) => {
                        for frame in frames {
                            send(&mut ws, &frame);
                        }
                    }
                    // Not resumable: `op 9` with `d: false`.
                    None => {
                        send(&mut ws, &json!({"op": 9, "d": false}));
                    }
                }
            }
            _ => {}
        }
    }
    end(&state, None);
}
