//! The plumbing the fake servers share: a listener on an ephemeral loopback port, a thread per
//! connection, keep-alive, and each request decoded into a [`RecordedRequest`] for a handler.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fake_openai::RecordedRequest;
use crate::http::{self, BodyDecoder};

/// A connection idle this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// A running server. Dropping it stops accepting connections.
pub struct FakeServer {
    addr: SocketAddr,
    shutdown: Arc<AtomicBool>,
}

impl FakeServer {
    /// Starts on `127.0.0.1:0`. `handle` answers one request on the stream and returns whether
    /// the connection may serve another.
    pub fn start<F>(name: &str, handle: F) -> FakeServer
    where
        F: Fn(&mut TcpStream, RecordedRequest) -> io::Result<bool> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a fake server");
        let addr = listener.local_addr().expect("fake server address");
        let shutdown = Arc::new(AtomicBool::new(false));
        let accept_shutdown = shutdown.clone();
        let handle = Arc::new(handle);
        let conn_name = format!("{name}-conn");
        thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_shutdown.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let handle = handle.clone();
                    let _ = thread::Builder::new()
                        .name(conn_name.clone())
                        .spawn(move || {
                            let _ = serve_connection(stream, &*handle);
                        });
                }
            })
            .expect("spawn a fake server");
        FakeServer { addr, shutdown }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve_connection<F>(mut stream: TcpStream, handle: &F) -> io::Result<()>
where
    F: Fn(&mut TcpStream, RecordedRequest) -> io::Result<bool>,
{
    stream.set_nodelay(true)?;
    let mut raw = Vec::new();
    loop {
        let deadline = Instant::now() + IDLE_TIMEOUT;
        let Ok(head) = http::read_head(&mut stream, &mut raw, deadline) else {
            return Ok(()); // Closed or idle: done with this connection.
        };
        let mut decoder = BodyDecoder::for_request(&head.headers)?;
        let mut body = Vec::new();
        loop {
            decoder.decode(&mut raw, &mut body)?;
            if decoder.is_done() {
                break;
            }
            if http::read_some(&mut stream, &mut raw, deadline)? == 0 {
                return Ok(());
            }
        }
        let mut parts = head.start_line.split(' ');
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let raw_body = String::from_utf8_lossy(&body).into_owned();
        let request = RecordedRequest {
            method,
            path,
            headers: head.headers.clone(),
            body: serde_json::from_str(&raw_body).unwrap_or(Value::Null),
            raw_body,
        };
        let close = http::find_header(&head.headers, "connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if !handle(&mut stream, request)? || close {
            return Ok(());
        }
    }
}
