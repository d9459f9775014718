//! MCP servers for the client half of issue 33: the official reference server
//! (`@modelcontextprotocol/server-everything` from `package.json`, over streamable HTTP) and the
//! official SDK's example server behind its demo OAuth authorization server, each a process of
//! its own ([`NodeMcpServer`]), and [`BrokenMcpServer`], a local server that speaks the protocol until a
//! tool call and then breaks it the way the test asks (hangs, answers 5 MiB, answers what is not
//! JSON-RPC), or echoes the credential it was sent.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_openai::RecordedRequest;
use crate::fake_server::{self, End, FakeServer, Gate};

/// An MCP server run by node from `node_modules`, listening on ephemeral ports. Dropping it
/// kills it (and a watchdog does if this process dies first).
pub struct NodeMcpServer {
    child: Child,
    watchdog: Option<Child>,
    port: u16,
    auth_port: Option<u16>,
    /// Its endpoint's path.
    path: &'static str,
}

impl NodeMcpServer {
    /// The reference server, `mcp-server-everything streamableHttp`.
    pub fn everything() -> NodeMcpServer {
        let port = crate::stack::free_port();
        NodeMcpServer::start(
            "@modelcontextprotocol/server-everything/dist/index.js",
            &["streamableHttp"],
            &[("PORT", port)],
            &["listening on port"],
            port,
            None,
        )
    }

    /// The reference server over the legacy HTTP+SSE transport, `mcp-server-everything sse`:
    /// its event stream is `/sse`, which names `/message?sessionId=…` for the messages.
    pub fn everything_sse() -> NodeMcpServer {
        let port = crate::stack::free_port();
        let mut server = NodeMcpServer::start(
            "@modelcontextprotocol/server-everything/dist/index.js",
            &["sse"],
            &[("PORT", port)],
            &["Server is running on port"],
            port,
            None,
        );
        server.path = "/sse";
        server
    }

    /// The official SDK's example server with OAuth (`simpleStreamableHttp.js --oauth
    /// --oauth-strict`): its endpoint is `http://localhost:<port>/mcp`, protected by the SDK's
    /// demo authorization server on `http://localhost:<auth port>` (dynamic registration, PKCE,
    /// a sign-in that says yes at once, tokens only for this server's URL).
    pub fn sdk_example_with_oauth() -> NodeMcpServer {
        let port = crate::stack::free_port();
        let auth_port = crate::stack::free_port();
        NodeMcpServer::start(
            "@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js",
            &["--oauth", "--oauth-strict"],
            &[("MCP_PORT", port), ("MCP_AUTH_PORT", auth_port)],
            &[
                "MCP Streamable HTTP Server listening on port",
                "Authorization Server listening on port",
            ],
            port,
            Some(auth_port),
        )
    }

    fn start(
        entry: &str,
        args: &[&str],
        ports: &[(&str, u16)],
        ready: &[&str],
        port: u16,
        auth_port: Option<u16>,
    ) -> NodeMcpServer {
        let entry = crate::stack::repo_root().join("node_modules").join(entry);
        assert!(
            entry.exists(),
            "{} is missing: run `bash -c 'source scripts/lib/setup.sh && ensure_npm_packages'`",
            entry.display()
        );
        let mut command = Command::new("node");
        command
            .arg(&entry)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, port) in ports {
            command.env(name, port.to_string());
        }
        let mut child = command.spawn().expect("start node");
        let watchdog = crate::runner::spawn_watchdog(child.id());
        // It says on stdout or stderr when it listens; everything it says after is drained.
        let (tx, rx) = std::sync::mpsc::channel::<Option<String>>();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().expect("stdout"));
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().expect("stderr"));
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(Some(line));
                }
                let _ = tx.send(None);
            });
        }
        let mut said = Vec::new();
        let mut waiting: Vec<&str> = ready.to_vec();
        let mut closed = 0;
        while !waiting.is_empty() {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Some(line)) => {
                    waiting.retain(|r| !line.contains(r));
                    said.push(line);
                }
                Ok(None) => {
                    closed += 1;
                    assert!(
                        closed < 2,
                        "{} exited:\n{}",
                        entry.display(),
                        said.join("\n")
                    );
                }
                Err(_) => panic!(
                    "{} did not listen within 60 s:\n{}",
                    entry.display(),
                    said.join("\n")
                ),
            }
        }
        NodeMcpServer {
            child,
            watchdog,
            port,
            auth_port,
            path: "/mcp",
        }
    }

    /// Its endpoint.
    pub fn url(&self) -> String {
        let host = if self.auth_port.is_some() {
            "localhost"
        } else {
            "127.0.0.1"
        };
        format!("http://{host}:{}{}", self.port, self.path)
    }

    /// What `WUHU_SANDBOX_EGRESS_ALLOW` must list for the Worker to reach it (and its
    /// authorization server).
    pub fn egress_allow(&self) -> String {
        match self.auth_port {
            Some(auth) => format!("localhost:{},localhost:{auth}", self.port),
            None => format!("127.0.0.1:{}", self.port),
        }
    }
}

impl Drop for NodeMcpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// Bytes of the `big` tool's answer: past the client's 4 MiB bound.
pub const BIG_ANSWER_BYTES: usize = 5 * 1024 * 1024;

/// A server that speaks MCP (streamable HTTP, JSON answers, an `Mcp-Session-Id`) for
/// `initialize`, the `initialized` notification and `tools/list`, and whose tools break:
/// - `hang`: an event stream that never brings the response;
/// - `big`: a JSON answer of [`BIG_ANSWER_BYTES`];
/// - `malformed`: a body that is not JSON;
/// - `whoami`: a text result holding the `Authorization` header it was sent (or `none`).
pub struct BrokenMcpServer {
    server: FakeServer,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl BrokenMcpServer {
    /// Starts on an ephemeral port.
    pub fn start() -> BrokenMcpServer {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let server = FakeServer::start("broken-mcp", move |request| {
            seen.lock().unwrap().push(request.clone());
            answer(&request)
        });
        BrokenMcpServer { server, requests }
    }

    /// Its endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.server.addr())
    }

    /// `127.0.0.1:PORT`, for `WUHU_SANDBOX_EGRESS_ALLOW`.
    pub fn host_port(&self) -> String {
        self.server.addr().to_string()
    }

    /// Every request it received.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.requests.lock().unwrap().clone()
    }
}

fn json_headers() -> Vec<(String, String)> {
    vec![
        ("content-type".into(), "application/json".into()),
        ("mcp-session-id".into(), "broken-session-1".into()),
    ]
}

fn result(id: &Value, result: Value) -> hyper::Response<fake_server::Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "result": result});
    fake_server::full(200, &json_headers(), serde_json::to_vec(&body).unwrap())
}

fn answer(request: &RecordedRequest) -> hyper::Response<fake_server::Body> {
    let id = request.body.get("id").cloned().unwrap_or(Value::Null);
    let tool = |name: &str| json!({"name": name, "description": format!("The {name} tool"), "inputSchema": {"type": "object"}});
    match request.body["method"].as_str().unwrap_or("") {
        "initialize" => result(
            &id,
            json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "broken", "version": "1"}}),
        ),
        "notifications/initialized" => fake_server::full(202, &[], Vec::new()),
        "tools/list" => result(
            &id,
            json!({"tools": [tool("hang"), tool("big"), tool("malformed"), tool("whoami")]}),
        ),
        "tools/call" => match request.body["params"]["name"].as_str().unwrap_or("") {
            // The stream opens and never brings the response (the gate is never opened).
            "hang" => fake_server::streamed_gated(
                200,
                &[("content-type".into(), "text/event-stream".into())],
                vec![": waiting\n\n".into(), "never".into()],
                Duration::ZERO,
                End::Complete,
                Some(Gate::new()),
            ),
            "big" => {
                let text = "x".repeat(BIG_ANSWER_BYTES);
                result(&id, json!({"content": [{"type": "text", "text": text}]}))
            }
            "malformed" => fake_server::full(
                200,
                &json_headers(),
                b"{\"jsonrpc\": \"2.0\", oops".to_vec(),
            ),
            "whoami" => {
                let auth = request
                    .headers
                    .iter()
                    .find(|(k, _)| k == "authorization")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_else(|| "none".into());
                result(
                    &id,
                    json!({"content": [{"type": "text", "text": format!("you sent: {auth}")}]}),
                )
            }
            other => {
                let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": format!("Unknown tool: {other}")}});
                fake_server::full(200, &json_headers(), serde_json::to_vec(&body).unwrap())
            }
        },
        _ => {
            let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}});
            fake_server::full(200, &json_headers(), serde_json::to_vec(&body).unwrap())
        }
    }
}
