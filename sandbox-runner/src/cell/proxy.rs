//! The runner's proxy for cells whose network is an allow list: the only way out of such a
//! cell. One listener per call (a Unix socket in the runner's private runtime directory, which
//! the cell's relay connects to; on macOS a loopback port the Seatbelt profile alone allows),
//! speaking HTTP (`CONNECT host:port`, and plain requests in absolute form) and SOCKS5
//! (`CONNECT` by name or address, no authentication), as the `HTTP(S)_PROXY` and `ALL_PROXY`
//! variables of the cell announce.
//!
//! Every connection asks [`AllowList::check_host`] first; a listed name is resolved here and each
//! address it resolves to must pass [`AllowList::check_address`], and the proxy connects to an
//! address it checked (never resolving again), so DNS rebinding cannot reach a private address.
//! A refused connection gets `403` (HTTP) or reply `0x02` (SOCKS5) with the reason, and its line
//! (`wuhu: blocked connect to evil.example:443 (not in allow list)`) is kept for the call's
//! result.
//!
//! Bounds: [`MAX_HEAD_BYTES`] of request head, [`MAX_CONNECTIONS`] at once per call,
//! [`CONNECT_TIMEOUT`] to reach a host, [`MAX_BLOCKED_LINES`] lines kept (all are counted).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use wuhu_core::cell::network::{AllowList, HostDecision, Refusal, blocked_line};

/// Longest request head (HTTP) or handshake (SOCKS5) read before a decision.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Connections one call's proxy serves at once; more wait.
pub const MAX_CONNECTIONS: usize = 64;
/// How long reaching a host (resolution and connect) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Blocked lines kept per call (the count goes on).
pub const MAX_BLOCKED_LINES: usize = 20;

/// The runner's proxy: where per-call listeners go.
#[derive(Debug)]
pub struct Proxy {
    dir: PathBuf,
    next: AtomicU64,
}

#[derive(Default)]
struct Blocked {
    lines: Vec<String>,
    count: u64,
}

/// One call's proxy; its listener closes when this is dropped.
pub struct CallProxy {
    socket: PathBuf,
    port: u16,
    blocked: Arc<Mutex<Blocked>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CallProxy {
    fn drop(&mut self) {
        self.task.abort();
        if !self.socket.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Proxy {
    /// A proxy whose Unix sockets go in `dir` (created private to this user).
    ///
    /// # Errors
    /// When `dir` cannot be made.
    pub fn new(dir: PathBuf) -> Result<Arc<Proxy>, String> {
        crate::private_dir::create(&dir).map_err(|e| format!("proxy dir: {e}"))?;
        Ok(Arc::new(Proxy {
            dir,
            next: AtomicU64::new(0),
        }))
    }

    /// Opens a listener for one call with `allow`.
    ///
    /// # Errors
    /// A bad allow list, or a listener that cannot be opened.
    pub fn open_call(&self, allow: &[String]) -> Result<CallProxy, String> {
        let allow = Arc::new(AllowList::parse(allow)?);
        let blocked = Arc::new(Mutex::new(Blocked::default()));
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let serve = {
            let (allow, blocked) = (allow.clone(), blocked.clone());
            move |stream: Box<dyn Client>| {
                let (allow, blocked, limit) = (allow.clone(), blocked.clone(), limit.clone());
                tokio::spawn(async move {
                    let Ok(_permit) = limit.acquire_owned().await else {
                        return;
                    };
                    serve(stream, &allow, &blocked).await;
                });
            }
        };
        if cfg!(target_os = "linux") {
            let socket = self.dir.join(format!("{}-{n}.sock", std::process::id()));
            let _ = std::fs::remove_file(&socket);
            let listener = std::os::unix::net::UnixListener::bind(&socket)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::UnixListener::from_std)
                .map_err(|e| format!("proxy socket {}: {e}", socket.display()))?;
            let task = tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    serve(Box::new(stream));
                }
            });
            Ok(CallProxy {
                socket,
                port: 0,
                blocked,
                task,
            })
        } else {
            let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|e| format!("proxy port: {e}"))?;
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
            let task = tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    serve(Box::new(stream));
                }
            });
            Ok(CallProxy {
                socket: PathBuf::new(),
                port,
                blocked,
                task,
            })
        }
    }
}

impl CallProxy {
    /// The Unix socket (Linux).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The loopback port (macOS).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The blocked lines so far, and how many connections were refused in all.
    pub fn blocked(&self) -> (Vec<String>, u64) {
        let blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        (blocked.lines.clone(), blocked.count)
    }
}

trait Client: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Client for T {}

fn record(blocked: &Mutex<Blocked>, line: String) {
    let mut blocked = blocked.lock().unwrap_or_else(|p| p.into_inner());
    blocked.count += 1;
    if blocked.lines.len() < MAX_BLOCKED_LINES && !blocked.lines.contains(&line) {
        blocked.lines.push(line);
    }
}

async fn serve(mut client: Box<dyn Client>, allow: &AllowList, blocked: &Mutex<Blocked>) {
    let mut first = [0u8; 1];
    if client.read_exact(&mut first).await.is_err() {
        return;
    }
    if first[0] == 5 {
        socks5(client, allow, blocked).await;
    } else {
        http(client, first[0], allow, blocked).await;
    }
}

/// Reaches `host:port` as the allow list permits.
async fn reach(
    allow: &AllowList,
    blocked: &Mutex<Blocked>,
    host: &str,
    port: u16,
) -> Result<TcpStream, String> {
    let refuse = |refusal: Refusal| {
        let line = blocked_line(host, port, &refusal);
        record(blocked, line.clone());
        line
    };
    let addresses: Vec<SocketAddr> = match allow.check_host(host, port) {
        HostDecision::Refuse(refusal) => return Err(refuse(refusal)),
        HostDecision::Connect(ip) => vec![SocketAddr::new(ip, port)],
        HostDecision::Resolve => {
            let resolved =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port))).await;
            let addresses: Vec<SocketAddr> = match resolved {
                Ok(Ok(addresses)) => addresses.collect(),
                _ => Vec::new(),
            };
            if addresses.is_empty() {
                return Err(refuse(Refusal::Unresolved));
            }
            // Every address must pass: a name that resolves to a private address is refused
            // even when it also resolves to a public one.
            for address in &addresses {
                if let Err(refusal) = allow.check_address(address.ip(), port) {
                    return Err(refuse(refusal));
                }
            }
            addresses
        }
    };
    let mut last = String::from("no address");
    for address in addresses {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = String::from("timed out"),
        }
    }
    Err(format!("wuhu: cannot connect to {host}:{port}: {last}"))
}

async fn splice(client: Box<dyn Client>, upstream: TcpStream) {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = upstream.into_split();
    let to_up = async {
        let _ = tokio::io::copy(&mut client_read, &mut up_write).await;
        let _ = up_write.shutdown().await;
    };
    let to_client = async {
        let _ = tokio::io::copy(&mut up_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    // Done when the host is done: a client that half-closed still gets the whole answer, and
    // one that keeps its side open does not hold the connection after the host closed.
    tokio::pin!(to_client);
    tokio::select! {
        () = &mut to_client => {}
        () = to_up => to_client.await,
    }
}

async fn http(mut client: Box<dyn Client>, first: u8, allow: &AllowList, blocked: &Mutex<Blocked>) {
    let mut head = vec![first];
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if head.len() > MAX_HEAD_BYTES {
            let _ = client
                .write_all(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n",
                )
                .await;
            return;
        }
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let parsed = request.parse(&head[..end]);
    let (Ok(httparse::Status::Complete(_)), Some(method), Some(target)) =
        (parsed, request.method, request.path)
    else {
        let _ = client
            .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
            .await;
        return;
    };
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let (host, port, origin_form) = if connect {
        match split_host_port(target, 443) {
            Some((host, port)) => (host, port, None),
            None => return bad_request(client).await,
        }
    } else {
        match url::Url::parse(target) {
            Ok(url) if url.scheme() == "http" && url.host_str().is_some() => {
                let host = url.host_str().unwrap_or_default().to_string();
                let mut path = url.path().to_string();
                if let Some(query) = url.query() {
                    path.push('?');
                    path.push_str(query);
                }
                (host, url.port().unwrap_or(80), Some(path))
            }
            _ => return bad_request(client).await,
        }
    };
    let upstream = match reach(allow, blocked, &host, port).await {
        Ok(upstream) => upstream,
        Err(line) => {
            let body = format!("{line}\n");
            let answer = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
            return;
        }
    };
    let mut upstream = upstream;
    match origin_form {
        None => {
            if client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            // Bytes the client sent after the head (rare before the 200) go on.
            if end < head.len() && upstream.write_all(&head[end..]).await.is_err() {
                return;
            }
        }
        Some(path) => {
            // The request line in origin form; headers and body as they came.
            let version = if request.version == Some(0) {
                "1.0"
            } else {
                "1.1"
            };
            let line_end = head.windows(2).position(|w| w == b"\r\n").unwrap_or(0);
            let mut rewritten = format!("{method} {path} HTTP/{version}").into_bytes();
            rewritten.extend_from_slice(&head[line_end..]);
            if upstream.write_all(&rewritten).await.is_err() {
                return;
            }
        }
    }
    splice(client, upstream).await;
}

async fn bad_request(mut client: Box<dyn Client>) {
    let _ = client
        .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        .await;
}

/// `host:port`, `[v6]:port`, or a bare host with `default` port.
fn split_host_port(target: &str, default: u16) -> Option<(String, u16)> {
    if let Some(rest) = target.strip_prefix('[') {
        let (host, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => default,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match target.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((target.to_string(), default)),
    }
}

/// SOCKS5 (RFC 1928): no authentication, `CONNECT` only.
async fn socks5(mut client: Box<dyn Client>, allow: &AllowList, blocked: &Mutex<Blocked>) {
    let reply = |code: u8| [5u8, code, 0, 1, 0, 0, 0, 0, 0, 0];
    let mut n = [0u8; 1];
    if client.read_exact(&mut n).await.is_err() {
        return;
    }
    let mut methods = vec![0u8; usize::from(n[0])];
    if client.read_exact(&mut methods).await.is_err() {
        return;
    }
    if !methods.contains(&0) {
        let _ = client.write_all(&[5, 0xff]).await;
        return;
    }
    if client.write_all(&[5, 0]).await.is_err() {
        return;
    }
    let mut request = [0u8; 4];
    if client.read_exact(&mut request).await.is_err() || request[0] != 5 {
        return;
    }
    if request[1] != 1 {
        // Only CONNECT.
        let _ = client.write_all(&reply(7)).await;
        return;
    }
    let host = match request[3] {
        1 => {
            let mut a = [0u8; 4];
            if client.read_exact(&mut a).await.is_err() {
                return;
            }
            std::net::Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            if client.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut name = vec![0u8; usize::from(len[0])];
            if client.read_exact(&mut name).await.is_err() {
                return;
            }
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let mut a = [0u8; 16];
            if client.read_exact(&mut a).await.is_err() {
                return;
            }
            std::net::Ipv6Addr::from(a).to_string()
        }
        _ => {
            let _ = client.write_all(&reply(8)).await;
            return;
        }
    };
    let mut port = [0u8; 2];
    if client.read_exact(&mut port).await.is_err() {
        return;
    }
    let port = u16::from_be_bytes(port);
    match reach(allow, blocked, &host, port).await {
        Ok(upstream) => {
            if client.write_all(&reply(0)).await.is_ok() {
                splice(client, upstream).await;
            }
        }
        Err(_) => {
            // 2: connection not allowed by ruleset.
            let _ = client.write_all(&reply(2)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_of_connect_targets() {
        assert_eq!(
            split_host_port("github.com:443", 443),
            Some((String::from("github.com"), 443))
        );
        assert_eq!(
            split_host_port("[::1]:8080", 443),
            Some((String::from("::1"), 8080))
        );
        assert_eq!(
            split_host_port("example.com", 443),
            Some((String::from("example.com"), 443))
        );
        assert_eq!(split_host_port("example.com:x", 443), None);
        assert_eq!(split_host_port("[::1", 443), None);
    }

    /// Through a real listener: a listed loopback server is reached over CONNECT and plain
    /// HTTP; an unlisted name and a listed name resolving to loopback are refused and counted.
    #[tokio::test]
    async fn the_proxy_allows_what_is_listed_and_counts_what_it_refuses() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = server.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let first = String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let body = format!("saw {first}");
                    let _ = s
                        .write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).as_bytes())
                        .await;
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::new(dir.path().join("proxy")).unwrap();
        let call = proxy
            .open_call(&[format!("127.0.0.1:{port}"), String::from("localhost")])
            .unwrap();
        let exchange = |request: String| {
            let socket = call.socket().to_path_buf();
            let port = call.port();
            async move {
                let mut out = Vec::new();
                if cfg!(target_os = "linux") {
                    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
                    s.write_all(request.as_bytes()).await.unwrap();
                    s.read_to_end(&mut out).await.unwrap();
                } else {
                    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                    s.write_all(request.as_bytes()).await.unwrap();
                    s.read_to_end(&mut out).await.unwrap();
                }
                String::from_utf8_lossy(&out).into_owned()
            }
        };
        let plain = exchange(format!(
            "GET http://127.0.0.1:{port}/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        ))
        .await;
        assert!(plain.ends_with("saw GET /x?y=1 HTTP/1.1"), "{plain}");
        let tunnel = exchange(format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET /t HTTP/1.1\r\n\r\n"
        ))
        .await;
        assert!(
            tunnel.starts_with("HTTP/1.1 200 Connection Established\r\n\r\n"),
            "{tunnel}"
        );
        assert!(tunnel.ends_with("saw GET /t HTTP/1.1"), "{tunnel}");
        let refused = exchange(String::from("CONNECT evil.example:443 HTTP/1.1\r\n\r\n")).await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(
            refused.ends_with("wuhu: blocked connect to evil.example:443 (not in allow list)\n"),
            "{refused}"
        );
        // `localhost` is listed, but the address it resolves to is listed for `port` only.
        let rebound = exchange(format!("CONNECT localhost:{} HTTP/1.1\r\n\r\n", port ^ 1)).await;
        assert!(
            rebound.contains("a private address not in allow list"),
            "{rebound}"
        );
        let other_port = exchange(String::from("CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")).await;
        assert!(
            other_port.contains("an IP address not in allow list"),
            "{other_port}"
        );
        let (lines, count) = call.blocked();
        assert_eq!(count, 3, "{lines:?}");
        assert_eq!(lines.len(), 3);
    }
}
