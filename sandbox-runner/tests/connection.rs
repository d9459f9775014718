//! The real `wuhu-runner` binary against a tiny WebSocket server playing the runner hub.
// tungstenite's handshake callback type fixes the large `Err` variant.
#![allow(clippy::result_large_err)]

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use wuhu_core::wire::runner::{
    AttachOutcome, EnvironmentSource, EnvironmentSpec, HEARTBEAT_ACK_FRAME, HEARTBEAT_FRAME,
    RUNNER_CONNECT_PATH, RUNNER_PROTOCOL_VERSION, RunnerKind, RunnerMessage, ServerMessage, codes,
    decode_frame, encode_frame,
};

const TOKEN: &str = "good-runner-token";

/// The runner process with its stderr collected line by line.
struct Runner {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Runner {
    fn spawn(home: &Path, args: &[&str]) -> Runner {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wuhu-runner"))
            .args(args)
            .env("HOME", home)
            .env_remove("WUHU_RUNNER_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start wuhu-runner");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().unwrap().push(line);
            }
        });
        Runner { child, lines }
    }

    async fn wait_for_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return line.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no stderr line containing {needle:?}; got {:?}",
                self.lines.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "runner did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Runner {
    /// SIGTERM first so the runner cleans up its temp dir, then SIGKILL.
    fn drop(&mut self) {
        // SAFETY: signals our own child process.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One accepted runner connection.
struct Peer {
    ws: WebSocketStream<TcpStream>,
    heartbeats: usize,
}

impl Peer {
    /// Accepts one connection; checks the path and the bearer token like the hub would.
    async fn accept(listener: &TcpListener) -> Peer {
        let (stream, _) = tokio::time::timeout(Duration::from_secs(15), listener.accept())
            .await
            .expect("runner connects")
            .unwrap();
        let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
            let auth = request
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok());
            if request.uri().path() != RUNNER_CONNECT_PATH {
                let mut e = ErrorResponse::new(Some(String::from("not found")));
                *e.status_mut() = StatusCode::NOT_FOUND;
                return Err(e);
            }
            if auth != Some(&format!("Bearer {TOKEN}")) {
                let mut e = ErrorResponse::new(Some(String::from(
                    r#"{"error":{"code":"unauthorized","message":"not a runner token"}}"#,
                )));
                *e.status_mut() = StatusCode::UNAUTHORIZED;
                return Err(e);
            }
            Ok(response)
        };
        let ws = tokio_tungstenite::accept_hdr_async(stream, check)
            .await
            .expect("handshake");
        Peer { ws, heartbeats: 0 }
    }

    async fn send(&mut self, message: &ServerMessage) {
        self.send_text(&encode_frame(message)).await;
    }

    async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.unwrap();
    }

    /// The next non-heartbeat message; heartbeats are checked byte-exact and acknowledged.
    async fn recv(&mut self) -> RunnerMessage {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let frame = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .expect("a frame from the runner")
                .expect("connection open")
                .expect("frame ok");
            let Message::Text(text) = frame else {
                continue;
            };
            let message = decode_frame::<RunnerMessage>(&text).expect("valid runner frame");
            if matches!(message, RunnerMessage::Heartbeat {}) {
                assert_eq!(text.as_str(), HEARTBEAT_FRAME);
                self.heartbeats += 1;
                self.send_text(HEARTBEAT_ACK_FRAME).await;
                continue;
            }
            return message;
        }
    }
}

fn welcome() -> ServerMessage {
    ServerMessage::Welcome {
        runner_id: String::from("r-1"),
        heartbeat_seconds: 1,
        kind: None,
        notice: None,
        sandbox: None,
        // A server older than progress frames: the runner sends none (the frames these tests
        // read are answers only).
        tool_progress: false,
    }
}

#[tokio::test]
async fn serves_tools_survives_garbage_and_reconnects() {
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().canonicalize().unwrap();
    let project = home_path.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("AGENTS.md"), "be brief\n").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Server, token and name from the config file; the --name flag wins.
    std::fs::create_dir_all(home_path.join(".wuhu")).unwrap();
    std::fs::write(
        home_path.join(".wuhu/runner.yml"),
        format!(
            "server: http://127.0.0.1:{port}\ntoken: {TOKEN}\nname: from-file\nkind: cloud\nenvironments:\n  fromfile: /srv/x\n"
        ),
    )
    .unwrap();
    // It holds the token: private, or the runner refuses to start.
    std::fs::set_permissions(
        home_path.join(".wuhu/runner.yml"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let env_flag = format!("project={}", project.display());
    let runner = Runner::spawn(
        &home_path,
        &["register", "--name", "from-flag", "--env", &env_flag],
    );

    let mut peer = Peer::accept(&listener).await;
    let RunnerMessage::Hello {
        version,
        name,
        kind,
        capabilities,
        environments,
        ..
    } = peer.recv().await
    else {
        panic!("hello first");
    };
    assert_eq!(version, RUNNER_PROTOCOL_VERSION);
    assert_eq!(name, "from-flag");
    assert_eq!(kind, RunnerKind::Cloud);
    assert!(capabilities.iter().any(|c| c == "bash"));
    let env_names: Vec<&str> = environments.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(env_names, ["fromfile", "project"]);
    peer.send(&welcome()).await;
    let line = runner.wait_for_line("connected to").await;
    assert!(line.ends_with(&format!(
        "connected to http://127.0.0.1:{port} as from-flag"
    )));

    // attach → attach_result with snapshot and AGENTS.md.
    peer.send(&ServerMessage::Attach {
        id: String::from("a1"),
        session_id: String::from("s-1"),
        spec: EnvironmentSpec {
            name: String::from("project"),
            source: EnvironmentSource::Local {
                path: project.to_string_lossy().into_owned(),
            },
            extra_env_vars: vec![],
            cell: Default::default(),
        },
    })
    .await;
    let RunnerMessage::AttachResult {
        id,
        outcome: AttachOutcome::Ok { environment },
    } = peer.recv().await
    else {
        panic!("attach ok");
    };
    assert_eq!(id, "a1");
    assert_eq!(environment.agents_md.as_deref(), Some("be brief\n"));
    let context = environment.context();

    // tool_call bash echo hi → tool_result.
    let call = |id: &str, command: &str| ServerMessage::ToolCall {
        id: id.to_string(),
        session_id: String::from("s-1"),
        environment: context.clone(),
        tool: String::from("bash"),
        arguments: json!({ "command": command }),
        timeout_ms: None,
        upload: None,
        secret_env: Default::default(),
    };
    peer.send(&call("t1", "echo hi")).await;
    assert_eq!(
        peer.recv().await,
        RunnerMessage::ToolResult {
            id: String::from("t1"),
            content: String::from("hi\n"),
            is_error: false,
            details: Some(
                json!({"exitCode": 0, "signal": null, "timedOut": false, "cancelled": false, "truncated": false, "totalLines": 1, "fullOutputPath": null})
            ),
            blobs: Vec::new(),
        }
    );

    // A context pointing outside what the runner offers (its --env directories and
    // workspaces root) is refused unrun, whether by its root or its cwd.
    let outside = home_path.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let marker = outside.join("ran");
    let mut by_root = context.clone();
    by_root.root = outside.to_string_lossy().into_owned();
    by_root.snapshot.cwd = by_root.root.clone();
    let mut by_cwd = context.clone();
    by_cwd.snapshot.cwd = outside.to_string_lossy().into_owned();
    for (id, environment) in [("t-root", by_root), ("t-cwd", by_cwd)] {
        peer.send(&ServerMessage::ToolCall {
            id: id.to_string(),
            session_id: String::from("s-1"),
            environment,
            tool: String::from("bash"),
            arguments: json!({ "command": format!("touch {}", marker.display()) }),
            timeout_ms: None,
            upload: None,
            secret_env: Default::default(),
        })
        .await;
        let RunnerMessage::Error {
            id: got,
            code,
            message,
        } = peer.recv().await
        else {
            panic!("{id}: an error answer");
        };
        assert_eq!(
            (got.as_deref(), code.as_str()),
            (Some(id), codes::PATH_NOT_ALLOWED),
            "{message}"
        );
        assert!(message.contains("--allow-any-path"), "{message}");
    }
    assert!(!marker.exists(), "a refused call ran");

    // Garbage → error frame; the connection stays usable.
    peer.send_text("this is not json").await;
    let RunnerMessage::Error { id, code, .. } = peer.recv().await else {
        panic!("error frame");
    };
    assert_eq!((id, code.as_str()), (None, codes::MALFORMED_FRAME));
    peer.send_text(r#"{"type":"tool_call","id":"t-bad"}"#).await;
    let RunnerMessage::Error { id, code, .. } = peer.recv().await else {
        panic!("error frame");
    };
    assert_eq!(
        (id.as_deref(), code.as_str()),
        (Some("t-bad"), codes::INVALID_MESSAGE)
    );
    peer.ws.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    let RunnerMessage::Error { code, .. } = peer.recv().await else {
        panic!("error frame");
    };
    assert_eq!(code, codes::BINARY_FRAME);

    // Cancel kills a running call; results can come back out of order.
    peer.send(&call("t2", "sleep 30")).await;
    peer.send(&call("t3", "echo quick")).await;
    let RunnerMessage::ToolResult { id, content, .. } = peer.recv().await else {
        panic!("tool result");
    };
    assert_eq!((id.as_str(), content.as_str()), ("t3", "quick\n"));
    let started = Instant::now();
    peer.send(&ServerMessage::Cancel {
        id: String::from("t2"),
    })
    .await;
    let RunnerMessage::ToolResult {
        id,
        is_error,
        details,
        ..
    } = peer.recv().await
    else {
        panic!("tool result");
    };
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!((id.as_str(), is_error), ("t2", true));
    assert_eq!(details.unwrap()["cancelled"], true);

    // Heartbeats arrive (every second here) and are answered; validate reports nothing stale
    // for a fresh snapshot.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    peer.send(&ServerMessage::Validate {
        id: String::from("v1"),
        session_id: String::from("s-1"),
        environment: context.clone(),
    })
    .await;
    assert_eq!(
        peer.recv().await,
        RunnerMessage::ValidateResult {
            id: String::from("v1"),
            stale: vec![]
        }
    );
    assert!(peer.heartbeats >= 1, "heartbeats: {}", peer.heartbeats);

    // The server drops: the runner says so and comes back by itself.
    drop(peer);
    let line = runner.wait_for_line("reconnecting in").await;
    assert!(line.contains("reconnecting in 0."), "{line}");
    let mut peer = Peer::accept(&listener).await;
    assert!(matches!(peer.recv().await, RunnerMessage::Hello { .. }));
    peer.send(&welcome()).await;
    peer.send(&call("t4", "echo again")).await;
    let RunnerMessage::ToolResult { id, content, .. } = peer.recv().await else {
        panic!("tool result");
    };
    assert_eq!((id.as_str(), content.as_str()), ("t4", "again\n"));
}

#[tokio::test]
async fn a_rejected_token_exits_with_code_2() {
    let home = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let mut runner = Runner::spawn(
        home.path(),
        &[
            "register",
            "--server",
            &server,
            "--token",
            "user-token",
            "--name",
            "r",
        ],
    );
    let accept = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let reject = |_: &Request, _: Response| -> Result<Response, ErrorResponse> {
            let mut e = ErrorResponse::new(Some(String::from(
                r#"{"error":{"code":"unauthorized","message":"not a runner token"}}"#,
            )));
            *e.status_mut() = StatusCode::UNAUTHORIZED;
            Err(e)
        };
        let _ = tokio_tungstenite::accept_hdr_async(stream, reject).await;
    });
    assert_eq!(runner.wait_exit().await, 2);
    let line = runner
        .wait_for_line("refused: HTTP 401: not a runner token")
        .await;
    assert_eq!(line, "wuhu-runner: refused: HTTP 401: not a runner token");
    accept.await.unwrap();
}

#[tokio::test]
async fn a_permanent_refusal_exits_with_code_2() {
    let home = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("ws://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let mut runner = Runner::spawn(
        home.path(),
        &[
            "register", "--server", &server, "--token", TOKEN, "--name", "r",
        ],
    );
    let mut peer = Peer::accept(&listener).await;
    assert!(matches!(peer.recv().await, RunnerMessage::Hello { .. }));
    peer.send(&ServerMessage::Refused {
        code: String::from(codes::UNSUPPORTED_VERSION),
        message: String::from("this server speaks runner protocol 2"),
    })
    .await;
    assert_eq!(runner.wait_exit().await, 2);
    runner
        .wait_for_line("refused: this server speaks runner protocol 2")
        .await;
}

#[test]
fn help_is_complete_and_bad_settings_exit_1() {
    let help = Command::new(env!("CARGO_BIN_EXE_wuhu-runner"))
        .args(["register", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "--server",
        "--token",
        "--name",
        "--env <NAME=PATH>",
        "--workspaces-root",
        "--kind",
        "--config",
        "Examples:",
        "runner.yml",
        "WUHU_RUNNER_TOKEN",
    ] {
        assert!(text.contains(needle), "help lacks {needle}:\n{text}");
    }
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wuhu-runner"))
        .args(["register", "--server", "http://127.0.0.1:9", "--name", "r"])
        .env("HOME", home.path())
        .env_remove("WUHU_RUNNER_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing token"));
}
