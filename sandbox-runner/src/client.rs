//! The connection loop: dial the hub, `hello`, serve requests, heartbeat, reconnect.
//!
//! One status line per state change goes to the [`StatusSink`]: `connected to URL as NAME`,
//! `reconnecting in 4s (reason)`, `refused: <message>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use wuhu_core::wire::runner::{
    AttachOutcome, DEFAULT_HEARTBEAT_SECONDS, DetachOutcome, DiscardOutcome, HELLO_NONCE_HEADER,
    HelloKey, MAX_FRAME_BYTES, MAX_FRAME_BYTES_BEFORE_WELCOME, RUNNER_PROTOCOL_VERSION, RunnerKind,
    RunnerMessage, SandboxMode, ServerMessage, capabilities, codes, decode_frame, encode_frame,
    jobs, mcp, os_display_name,
};

use crate::backoff::Backoff;
use crate::config::{RunnerConfig, connect_url};
use crate::environment::EnvironmentHost;
use crate::executor::{ToolCall, execute};
use crate::jobs::Jobs;
use crate::snapshot::validate_snapshot;
use crate::tools::{CancelHandle, CancelSignal};

/// Receives one-line status messages.
pub type StatusSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How long to wait for the TCP/TLS/WebSocket handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to wait for `welcome` after `hello`.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(20);
/// A connection that lasted this long after `welcome` resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Why the runner stopped for good.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Fatal {
    /// The server rejected the token (HTTP 401/403 on the upgrade).
    #[error("refused: {0}")]
    Unauthorized(String),
    /// The server refused the `hello` with a permanent code.
    #[error("refused: {message}")]
    Refused {
        /// The refusal code.
        code: String,
        /// The server's reason.
        message: String,
    },
    /// The settings cannot work (bad URL).
    #[error("{0}")]
    Config(String),
}

impl Fatal {
    /// The process exit code for this: 2 for refusals, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Fatal::Unauthorized(_) | Fatal::Refused { .. } => 2,
            Fatal::Config(_) => 1,
        }
    }
}

/// Options of the connection loop besides the config.
#[derive(Clone)]
pub struct ClientOptions {
    /// Where status lines go.
    pub status: StatusSink,
    /// Also report each request.
    pub verbose: bool,
    /// Seed for backoff jitter.
    pub jitter_seed: u64,
    /// The runner's key: every `hello` signs the hub's nonce with it (decision 0024).
    pub key: Option<Arc<crate::key::RunnerKey>>,
}

/// Runs until a fatal refusal: connects, serves, and reconnects with backoff forever.
pub async fn run(config: RunnerConfig, host: EnvironmentHost, options: ClientOptions) -> Fatal {
    // The process-wide rustls provider; a second install (tests) is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = match connect_url(&config.server) {
        Ok(url) => url,
        Err(e) => return Fatal::Config(e.to_string()),
    };
    let jobs = Arc::new(Jobs::new(
        host.dirs.log_dir.clone(),
        host.dirs.temp_root.clone(),
    ));
    let host = Arc::new(host);
    let mut backoff = Backoff::new(options.jitter_seed);
    loop {
        let ended = serve_once(&url, &config, &host, &jobs, &options).await;
        let reason = match ended {
            Ended::Fatal(fatal) => {
                (options.status)(&fatal.to_string());
                return fatal;
            }
            Ended::Retry {
                reason,
                stable: true,
            } => {
                backoff.reset();
                reason
            }
            Ended::Retry { reason, .. } => reason,
        };
        let delay = backoff.next_delay();
        (options.status)(&format!(
            "reconnecting in {} ({reason})",
            format_delay(delay)
        ));
        tokio::time::sleep(delay).await;
    }
}

/// `0.4s` below a second, else whole seconds (`4s`).
pub fn format_delay(delay: Duration) -> String {
    if delay < Duration::from_secs(1) {
        format!("{:.1}s", delay.as_secs_f64())
    } else {
        format!("{}s", delay.as_secs_f64().round() as u64)
    }
}

/// The `hello` this runner sends (`key` proves its key for the connection).
pub fn hello(config: &RunnerConfig, key: Option<HelloKey>) -> RunnerMessage {
    let mut caps: Vec<String> = capabilities::TOOLS.iter().map(|c| c.to_string()).collect();
    caps.extend(
        [
            capabilities::ENV_LOCAL,
            capabilities::ENV_FOLDER_TEMPLATE,
            capabilities::ENV_WORKTREE,
            capabilities::BACKGROUND_JOBS,
            capabilities::MCP_STDIO,
            match config.sandbox {
                SandboxMode::On => capabilities::SANDBOX_ON,
                SandboxMode::Off => capabilities::SANDBOX_OFF,
            },
        ]
        .map(String::from),
    );
    RunnerMessage::Hello {
        version: RUNNER_PROTOCOL_VERSION,
        name: config.name.clone(),
        kind: config.kind,
        os: os_display_name(std::env::consts::OS),
        arch: std::env::consts::ARCH.to_string(),
        capabilities: caps,
        environments: config.environments.clone(),
        runner_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        replace: config.replace,
        key,
    }
}

enum Ended {
    Fatal(Fatal),
    Retry { reason: String, stable: bool },
}

fn retry(reason: impl Into<String>) -> Ended {
    Ended::Retry {
        reason: reason.into(),
        stable: false,
    }
}

type Calls = Arc<Mutex<HashMap<String, CancelHandle>>>;

async fn serve_once(
    url: &str,
    config: &RunnerConfig,
    host: &Arc<EnvironmentHost>,
    jobs: &Arc<Jobs>,
    options: &ClientOptions,
) -> Ended {
    let mut request = match url.into_client_request() {
        Ok(r) => r,
        Err(e) => return Ended::Fatal(Fatal::Config(format!("bad server URL {url}: {e}"))),
    };
    let Ok(auth) = HeaderValue::from_str(&format!("Bearer {}", config.token)) else {
        return Ended::Fatal(Fatal::Config(String::from(
            "the token contains characters not allowed in a header",
        )));
    };
    request.headers_mut().insert("authorization", auth);
    if let Ok(agent) = HeaderValue::from_str(concat!("wuhu-runner/", env!("CARGO_PKG_VERSION"))) {
        request.headers_mut().insert("user-agent", agent);
    }
    let ws_config = WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES));
    let nonce;
    let connected = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(request, Some(ws_config), true),
    )
    .await;
    let mut ws = match connected {
        Err(_) => return retry("connection timed out"),
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status();
            let message = http_error_message(status.as_u16(), response.body().as_deref());
            return if status.as_u16() == 401 || status.as_u16() == 403 {
                Ended::Fatal(Fatal::Unauthorized(message))
            } else {
                retry(message)
            };
        }
        Ok(Err(e)) => return retry(e.to_string()),
        Ok(Ok((ws, response))) => {
            nonce = response
                .headers()
                .get(HELLO_NONCE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            ws
        }
    };

    // Handshake: hello → welcome | refused. The server closes a connection whose first frame
    // is over its pre-welcome limit, so an oversized hello is a configuration error here.
    // A hub older than keys sends no nonce: then the hello carries none.
    let key = match (&options.key, &nonce) {
        (Some(key), Some(nonce)) => Some(key.hello_key(nonce, &config.name)),
        _ => None,
    };
    let hello_frame = encode_frame(&hello(config, key));
    if hello_frame.len() > MAX_FRAME_BYTES_BEFORE_WELCOME {
        return Ended::Fatal(Fatal::Config(format!(
            "the hello frame is {} bytes, over the server's {MAX_FRAME_BYTES_BEFORE_WELCOME} byte limit: offer fewer or shorter --env entries",
            hello_frame.len()
        )));
    }
    if let Err(e) = ws.send(Message::text(hello_frame)).await {
        return retry(format!("sending hello failed: {e}"));
    }
    let welcome_deadline = Instant::now() + WELCOME_TIMEOUT;
    let welcome = loop {
        let next = tokio::time::timeout_at(welcome_deadline, ws.next()).await;
        let frame = match next {
            Err(_) => return retry("no welcome from the server"),
            Ok(None) => return retry("connection closed before welcome"),
            Ok(Some(Err(e))) => return retry(e.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        let Message::Text(text) = frame else {
            if let Message::Close(close) = frame {
                return retry(close_reason(close.as_ref()));
            }
            continue;
        };
        match decode_frame::<ServerMessage>(&text) {
            Ok(ServerMessage::Welcome {
                heartbeat_seconds,
                kind,
                notice,
                tool_progress,
                ..
            }) => break (heartbeat_seconds, kind, notice, tool_progress),
            Ok(ServerMessage::Refused { code, message }) => {
                return if codes::refusal_is_permanent(&code) {
                    Ended::Fatal(Fatal::Refused { code, message })
                } else {
                    (options.status)(&format!("refused: {message}"));
                    retry(format!("refused: {code}"))
                };
            }
            Ok(other) => {
                let _ = ws
                    .send(Message::text(encode_frame(&RunnerMessage::Error {
                        id: None,
                        code: String::from(codes::INVALID_MESSAGE),
                        message: format!("expected welcome, got {}", type_name(&other)),
                    })))
                    .await;
            }
            Err(e) => {
                let _ = ws
                    .send(Message::text(encode_frame(&protocol_error_frame(&e))))
                    .await;
            }
        }
    };
    let (heartbeat_seconds, registered_kind, notice, tool_progress) = welcome;
    // Progress frames queued on this connection (`None`: the server relays none).
    let progress = tool_progress.then(crate::progress::Queued::default);
    let heartbeat = Duration::from_secs(u64::from(match heartbeat_seconds {
        0 => DEFAULT_HEARTBEAT_SECONDS,
        s => s.min(300),
    }));
    (options.status)(&format!(
        "connected to {} as {}",
        config.server, config.name
    ));
    if let Some(kind) = registered_kind
        && kind != config.kind
    {
        (options.status)(&format!(
            "warning: the server registered this runner as {}, not {}",
            kind.as_str(),
            config.kind.as_str()
        ));
    }
    if let Some(notice) = notice {
        (options.status)(&format!("server notice: {notice}"));
    }
    // Default networks depend on the kind the server registered.
    host.cells
        .set_cloud_runner(registered_kind.unwrap_or(config.kind) == RunnerKind::Cloud);
    let welcomed_at = Instant::now();

    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<RunnerMessage>();
    let calls: Calls = Arc::new(Mutex::new(HashMap::new()));
    // Jobs that ended while no connection was up are reported now.
    jobs.connected(out_tx.clone());
    let mut ticker = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = Instant::now();
    let mut server_acks = false;
    let reason = loop {
        tokio::select! {
            incoming = ws.next() => {
                let frame = match incoming {
                    None => break String::from("connection lost"),
                    Some(Err(e)) => break e.to_string(),
                    Some(Ok(frame)) => frame,
                };
                last_heard = Instant::now();
                match frame {
                    Message::Text(text) => {
                        match decode_frame::<ServerMessage>(&text) {
                            Ok(ServerMessage::HeartbeatAck {}) => server_acks = true,
                            Ok(ServerMessage::Refused { code, message }) => {
                                if codes::refusal_is_permanent(&code) {
                                    cancel_all(&calls);
                                    jobs.disconnected();
                                    return Ended::Fatal(Fatal::Refused { code, message });
                                }
                                break format!("refused: {message}");
                            }
                            Ok(message) => dispatch(message, &config.server, host, jobs, (&calls, progress.as_ref()), &out_tx, options),
                            Err(e) => {
                                let _ = out_tx.send(protocol_error_frame(&e));
                            }
                        }
                    }
                    Message::Binary(_) => {
                        let _ = out_tx.send(RunnerMessage::Error {
                            id: None,
                            code: String::from(codes::BINARY_FRAME),
                            message: String::from("binary frames are not part of the protocol; send JSON text frames"),
                        });
                    }
                    Message::Close(close) => break close_reason(close.as_ref()),
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                }
            }
            Some(message) = out_rx.recv() => {
                let sent = ws.send(Message::text(encode_frame(&message))).await;
                if let Some(queued) = &progress {
                    queued.written(&message);
                }
                if let Err(e) = sent {
                    break format!("send failed: {e}");
                }
            }
            _ = ticker.tick() => {
                if server_acks && last_heard.elapsed() > heartbeat * 3 {
                    break format!("no answer from the server for {}s", last_heard.elapsed().as_secs());
                }
                if let Err(e) = ws.send(Message::text(encode_frame(&RunnerMessage::Heartbeat {}))).await {
                    break format!("heartbeat failed: {e}");
                }
            }
        }
    };
    // Results can no longer be delivered: stop every call still running. Background jobs run
    // on; their ends wait for the next connection.
    jobs.disconnected();
    cancel_all(&calls);
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
    Ended::Retry {
        reason,
        stable: welcomed_at.elapsed() >= STABLE_AFTER,
    }
}

fn dispatch(
    message: ServerMessage,
    server: &str,
    host: &Arc<EnvironmentHost>,
    jobs: &Arc<Jobs>,
    (calls, progress): (&Calls, Option<&crate::progress::Queued>),
    out: &mpsc::UnboundedSender<RunnerMessage>,
    options: &ClientOptions,
) {
    let verbose = |line: String| {
        if options.verbose {
            (options.status)(&line);
        }
    };
    match message {
        ServerMessage::Welcome { .. } | ServerMessage::HeartbeatAck {} => {}
        ServerMessage::Refused { .. } => {}
        ServerMessage::Error { id, code, message } => {
            (options.status)(&format!(
                "server error{}: {code}: {message}",
                id.map(|id| format!(" for {id}")).unwrap_or_default()
            ));
        }
        ServerMessage::Attach {
            id,
            session_id,
            spec,
        } => {
            verbose(format!(
                "attach {} ({}) for session {session_id}",
                spec.name,
                spec.source.kind().as_str()
            ));
            let host = host.clone();
            let out = out.clone();
            tokio::spawn(async move {
                let outcome = match host.attach(&session_id, &spec).await {
                    Ok(environment) => AttachOutcome::Ok { environment },
                    Err(error) => AttachOutcome::Error(error),
                };
                let _ = out.send(RunnerMessage::AttachResult { id, outcome });
            });
        }
        ServerMessage::Detach {
            id,
            session_id,
            environment,
        } => {
            verbose(format!(
                "detach {} for session {session_id}",
                environment.name
            ));
            let host = host.clone();
            let out = out.clone();
            tokio::spawn(async move {
                // Its MCP servers go first: they may hold files of the directory.
                host.mcp.stop(&session_id, &environment.name).await;
                let outcome = match host.detach(&environment).await {
                    Ok(done) => DetachOutcome::Ok {
                        removed: done.removed,
                        branch: done.branch,
                        head: done.head,
                    },
                    Err(error) => DetachOutcome::Error(error),
                };
                let _ = out.send(RunnerMessage::DetachResult { id, outcome });
            });
        }
        ServerMessage::Validate {
            id, environment, ..
        } => {
            let stale = validate_snapshot(&environment.snapshot);
            let _ = out.send(RunnerMessage::ValidateResult { id, stale });
        }
        ServerMessage::ToolCall {
            id,
            session_id,
            environment,
            tool,
            arguments,
            timeout_ms,
            upload,
            secret_env,
        } => {
            // The context comes from the server: its root and cwd must be places this runner
            // offers (the attach policy), or the call is refused unrun.
            // Job tools read no environment (the job's session is their authority).
            let job_tool = tool == jobs::STATUS_TOOL || tool == jobs::KILL_TOOL;
            if !job_tool && let Err(error) = host.check_call_context(&environment) {
                (options.status)(&format!("refused {tool} call {id}: {}", error.message));
                let _ = out.send(RunnerMessage::Error {
                    id: Some(id),
                    code: error.code,
                    message: error.message,
                });
                return;
            }
            let (handle, signal) = CancelSignal::new();
            {
                let mut calls = calls.lock().unwrap_or_else(|p| p.into_inner());
                if calls.contains_key(&id) {
                    let _ = out.send(RunnerMessage::Error {
                        id: Some(id),
                        code: String::from(codes::INVALID_MESSAGE),
                        message: String::from("a tool call with this id is already running"),
                    });
                    return;
                }
                calls.insert(id.clone(), handle);
            }
            verbose(format!(
                "{tool} in {} for session {session_id}",
                environment.name
            ));
            let host = host.clone();
            let jobs = jobs.clone();
            let out = out.clone();
            let calls = calls.clone();
            let server = server.to_string();
            let masker = host.session_secrets.learn(&session_id, &secret_env);
            // Live output of a `bash` call, masked with the session's secrets like its answer.
            let progress = progress
                .filter(|_| tool == capabilities::BASH)
                .map(|queued| {
                    crate::progress::ProgressSink::new(
                        &id,
                        masker.clone(),
                        out.clone(),
                        queued.clone(),
                    )
                });
            tokio::spawn(async move {
                let cells = (host.cells.mode() == SandboxMode::On).then_some(&host.cells);
                let mut output = if tool == mcp::TOOL {
                    let place = crate::mcp_servers::Place {
                        dirs: &host.dirs,
                        cells,
                        session_id: &session_id,
                        environment: &environment,
                    };
                    host.mcp.call(&place, arguments, &secret_env, signal).await
                } else {
                    execute(
                        &host.dirs,
                        ToolCall {
                            id: &id,
                            environment: &environment,
                            tool: &tool,
                            arguments,
                            deadline: timeout_ms.map(Duration::from_millis),
                            session_id: &session_id,
                            jobs: Some(&jobs),
                            cells: (host.cells.mode() == SandboxMode::On).then_some(&host.cells),
                            secret_env: &secret_env,
                            progress,
                        },
                        signal,
                    )
                    .await
                };
                drop(secret_env);
                // Before anything leaves: the answer, and what is uploaded straight to storage.
                if let Some(masker) = &masker {
                    output.content = masker.mask_known(&output.content).into_owned();
                    if let Some(details) = &mut output.details {
                        wuhu_core::secrets::mask_known_json(masker, details);
                    }
                }
                let mut blobs =
                    crate::blob_upload::attach_image(&server, upload.as_ref(), &mut output).await;
                if blobs.is_empty()
                    && let Some(slot) = &upload
                {
                    blobs = crate::blob_upload::offload_output(&server, slot, &mut output).await;
                }
                calls.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                let _ = out.send(RunnerMessage::ToolResult {
                    id,
                    content: output.content,
                    is_error: output.is_error,
                    details: output.details,
                    blobs,
                });
            });
        }
        ServerMessage::DiscardWorkspaces { id, session_id } => {
            let host = host.clone();
            let out = out.clone();
            let status = options.status.clone();
            tokio::spawn(async move {
                host.session_secrets.forget(&session_id);
                host.mcp.stop_session(&session_id).await;
                let outcome = match host.discard(&session_id).await {
                    Ok((objects, local)) => {
                        status(&format!(
                            "session {session_id} was deleted: discarded its workspaces ({objects} stored objects, {local} local copies and worktrees, branches kept)"
                        ));
                        DiscardOutcome::Ok { objects, local }
                    }
                    Err(error) => {
                        status(&format!(
                            "session {session_id} was deleted, but discarding its workspaces failed (the server asks again later): {}",
                            error.message
                        ));
                        DiscardOutcome::Error(error)
                    }
                };
                let _ = out.send(RunnerMessage::DiscardResult {
                    id,
                    session_id,
                    outcome,
                });
            });
        }
        ServerMessage::Cancel { id } => {
            verbose(format!("cancel {id}"));
            if let Some(handle) = calls.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
                handle.cancel();
            }
        }
    }
}

fn cancel_all(calls: &Calls) {
    for (_, handle) in calls.lock().unwrap_or_else(|p| p.into_inner()).drain() {
        handle.cancel();
    }
}

fn protocol_error_frame(e: &wuhu_core::wire::runner::ProtocolError) -> RunnerMessage {
    RunnerMessage::Error {
        id: e.id().map(str::to_string),
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

fn type_name(message: &ServerMessage) -> String {
    serde_json::to_value(message)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_default()
}

fn close_reason(close: Option<&tungstenite::protocol::CloseFrame>) -> String {
    match close {
        Some(frame) if !frame.reason.is_empty() => {
            format!("server closed the connection: {}", frame.reason)
        }
        Some(frame) => format!(
            "server closed the connection (code {})",
            u16::from(frame.code)
        ),
        None => String::from("server closed the connection"),
    }
}

/// The message for an HTTP error on the upgrade: the API's `{error: {message}}`, else the body
/// text, else the status.
pub fn http_error_message(status: u16, body: Option<&[u8]>) -> String {
    let text = body
        .map(|b| String::from_utf8_lossy(b).trim().to_string())
        .unwrap_or_default();
    let from_json = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        });
    match (from_json, text.is_empty()) {
        (Some(message), _) => format!("HTTP {status}: {message}"),
        (None, false) if text.len() <= 300 => format!("HTTP {status}: {text}"),
        _ => format!("HTTP {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_and_http_messages() {
        assert_eq!(format_delay(Duration::from_millis(430)), "0.4s");
        assert_eq!(format_delay(Duration::from_millis(3600)), "4s");
        assert_eq!(
            http_error_message(
                401,
                Some(br#"{"error":{"code":"unauthorized","message":"not a runner token"}}"#)
            ),
            "HTTP 401: not a runner token"
        );
        assert_eq!(http_error_message(401, Some(b"nope")), "HTTP 401: nope");
        assert_eq!(http_error_message(503, None), "HTTP 503");
    }
}
