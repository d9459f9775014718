//! MCP servers for the client half of issue 33: the official reference server
//! (`@modelcontextprotocol/server-everything` from `package.json`, over streamable HTTP) as a
//! process of its own, and [`BrokenMcpServer`], a local server that speaks the protocol until a
//! tool call and then breaks it the way the test asks (hangs, answers 5 MiB, answers what is not
//! JSON-RPC), or echoes the credential it was sent.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_openai::RecordedRequest;
use crate::fake_server::{self, End, FakeServer, Gate};

/// The reference server, listening on an ephemeral port. Dropping it kills it (and a watchdog
/// does if this process dies first).
pub struct EverythingServer {
    child: Child,
    watchdog: Option<Child>,
    port: u16,
}

impl EverythingServer {
    /// Starts `mcp-server-everything streamableHttp` and waits until it says it listens.
    pub fn start() -> EverythingServer {
        let root = crate::stack::repo_root();
        let entry = root.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        assert!(
            entry.exists(),
            "{} is missing: run `bash -c 'source scripts/lib/setup.sh && ensure_npm_packages'`",
            entry.display()
        );
        let port = crate::stack::free_port();
        let mut child = Command::new("node")
            .arg(&entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start node");
        let watchdog = crate::runner::spawn_watchdog(child.id());
        // It says so on stderr once it listens; everything it says after is drained.
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let mut ready = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(tx) = &ready {
                    said.push(line.clone());
                    if line.contains("listening on port") {
                        let _ = tx.send(Ok(()));
                        ready = None;
                    }
                }
            }
            if let Some(tx) = ready {
                let _ = tx.send(Err(said.join("\n")));
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => {}
            Ok(Err(said)) => panic!("mcp-server-everything exited:\n{said}"),
            Err(_) => panic!("mcp-server-everything did not listen within 60 s"),
        }
        EverythingServer {
            child,
            watchdog,
            port,
        }
    }

    /// Its endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// `127.0.0.1:PORT`, for `WUHU_SANDBOX_EGRESS_ALLOW`.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for EverythingServer {
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
