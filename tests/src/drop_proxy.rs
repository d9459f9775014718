//! A TCP proxy in front of the stack that can cut every connection through it at once: a real
//! dropped connection (the client sees its stream end mid-response), unlike a browser's offline
//! mode, which leaves open streams alone.
//!
//! Clients connect to [`DropProxy::url`]; each connection is forwarded to the upstream address.
//! Connecting to the control port ([`DropProxy::control_addr`]) shuts down every forwarded
//! connection open at that moment (so a test in another process, such as a browser script, can
//! trigger it); [`DropProxy::drop_all`] does the same from this process. New connections are
//! forwarded as before. Threads end with the test process.
//!
//! [`DropProxy::start_without_websockets`] is a proxy that cannot carry WebSockets, as some
//! corporate proxies cannot: it answers every upgrade request with `502` itself (a client's
//! WebSocket never opens and the Worker never sees it) and forwards everything else.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Open connections by number: the client's side and the upstream side.
type Open = Arc<Mutex<HashMap<u64, (TcpStream, TcpStream)>>>;

/// See the module docs.
pub struct DropProxy {
    addr: SocketAddr,
    control_addr: SocketAddr,
    open: Open,
}

impl DropProxy {
    /// Starts forwarding 127.0.0.1:<ephemeral> to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> DropProxy {
        DropProxy::start_with(upstream, false)
    }

    /// A proxy that refuses WebSocket upgrades (see the module docs).
    pub fn start_without_websockets(upstream: &str) -> DropProxy {
        DropProxy::start_with(upstream, true)
    }

    fn start_with(upstream: &str, refuse_websockets: bool) -> DropProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let control = TcpListener::bind("127.0.0.1:0").expect("bind the proxy's control port");
        let addr = listener.local_addr().expect("proxy address");
        let control_addr = control.local_addr().expect("control address");
        let open: Open = Arc::default();
        let upstream = upstream.to_string();
        {
            let open = open.clone();
            std::thread::spawn(move || {
                for (id, client) in (0u64..).zip(listener.incoming().flatten()) {
                    if refuse_websockets {
                        // Looking at the request waits for it: on a thread of its own, so a
                        // silent connection (a browser's preconnect) holds up no other.
                        let (open, upstream) = (open.clone(), upstream.clone());
                        std::thread::spawn(move || {
                            if is_websocket_upgrade(&client) {
                                let mut client = client;
                                let _ = client.write_all(
                                    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                                );
                                let _ = client.shutdown(Shutdown::Both);
                            } else {
                                forward(client, &upstream, &open, id);
                            }
                        });
                    } else {
                        forward(client, &upstream, &open, id);
                    }
                }
            });
        }
        {
            let open = open.clone();
            std::thread::spawn(move || {
                for request in control.incoming().flatten() {
                    cut(&open);
                    drop(request);
                }
            });
        }
        DropProxy {
            addr,
            control_addr,
            open,
        }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connecting here drops every open connection.
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// Drops every open connection now.
    pub fn drop_all(&self) {
        cut(&self.open);
    }
}

/// Connects to `upstream` and copies both ways, remembering the connection (to cut it).
fn forward(client: TcpStream, upstream: &str, open: &Open, id: u64) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
        open.lock().expect("proxy lock").insert(id, (c, s));
    }
    pipe(&client, &server, Some((open.clone(), id)));
    pipe(&server, &client, None);
}

/// Whether the connection's first request asks for a WebSocket: its head is peeked (left unread
/// for the upstream), waiting at most 5 s for it to be whole. A browser opens a new connection
/// for every WebSocket (Chromium never reuses a keep-alive one), so the first request is the
/// one to look at.
fn is_websocket_upgrade(client: &TcpStream) -> bool {
    let mut head = [0u8; 16 * 1024];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let _ = client.set_read_timeout(Some(std::time::Duration::from_millis(100)));
    let n = loop {
        // Blocks until bytes arrive (at most the read timeout); `Ok(0)` is a closed connection.
        let n = match client.peek(&mut head) {
            Ok(0) => break 0,
            Ok(n) => n,
            Err(_) => 0,
        };
        let whole = head[..n].windows(4).any(|w| w == b"\r\n\r\n");
        if whole || n == head.len() || std::time::Instant::now() > deadline {
            break n;
        }
        // Part of the head is here: peek again shortly (peek returns at once while bytes wait).
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let _ = client.set_read_timeout(None);
    String::from_utf8_lossy(&head[..n])
        .to_ascii_lowercase()
        .contains("upgrade: websocket")
}

fn cut(open: &Open) {
    for (_, (client, server)) in open.lock().expect("proxy lock").drain() {
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    }
}

/// Copies `from` to `to` on a thread until either side ends, then shuts both down and
/// (for one of the two directions) forgets the connection.
fn pipe(from: &TcpStream, to: &TcpStream, forget: Option<(Open, u64)>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
        if let Some((open, id)) = forget {
            open.lock().expect("proxy lock").remove(&id);
        }
    });
}
