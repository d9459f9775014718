//! `peer`: Wuhu's `openai-compatible` path against Cloudflare's `agents` (`AIChatAgent` with the
//! AI SDK's OpenAI-compatible provider), side by side in one run: the same wrangler, the same
//! local zero-delay Chat Completions server streaming the same 20-chunk reply to both.
//!
//! The peer lives in `tests/bench-peer/` (pinned versions); `scripts/bench` installs it into a
//! scratch directory outside the workspace and passes it as `WUHU_BENCH_PEER_DIR`.
//!
//! Each run alternates Wuhu and the peer (`PEER_RUNS` runs each); a turn is one user message:
//! - Wuhu: `POST /enqueue` with one follow stream open (the README's pattern), timed to the
//!   first `assistant_text_delta` and to `idle`.
//! - Wuhu over its session socket (`wuhu_socket`): an `enqueue` frame and the events on the same
//!   WebSocket (`GET /v1/sessions/:id/socket`), timed the same way; its enqueue response is the
//!   `reply` frame.
//! - The peer: a `cf_agent_use_chat_request` on the agent's WebSocket (what `useAgentChat`
//!   sends: the whole history plus the new message), timed to the first `text-delta` chunk and
//!   to the response marked `done`.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::protocol::WebSocket;
use wuhu_core::socket::ClientFrame;
use wuhu_core::wire::EnqueueRequest;
use wuhu_e2e::fake_openai::Reply;
use wuhu_e2e::socket::{SessionSocket, SocketAuth, SocketRead};
use wuhu_e2e::stack::{free_port, repo_root};
use wuhu_e2e::util::{make_temp_dir, unique_name};
use wuhu_e2e::{SseEvent, Stack};

use crate::{Config, Measured, Series, ms};

/// Runs of each system, alternating.
const PEER_RUNS: usize = 3;
/// Text chunks of the provider's reply (as in the measurement).
const REPLY_CHUNKS: usize = 20;
/// How long one turn may take before the bench gives up.
const TURN_TIMEOUT: Duration = Duration::from_secs(30);

/// The reply both systems stream: `REPLY_CHUNKS` content deltas.
fn reply_text() -> String {
    (0..REPLY_CHUNKS).map(|i| format!("w{i:02} ")).collect()
}

pub fn peer(stack: &Stack, config: &Config) -> Measured {
    let dir = std::env::var_os("WUHU_BENCH_PEER_DIR").map(PathBuf::from).unwrap_or_else(|| {
        panic!("peer: WUHU_BENCH_PEER_DIR is not set; run `scripts/bench --only peer` (it installs the peer)")
    });
    let model = unique_name("bench-peer");
    stack.openai().script_always(
        &model,
        Reply::text(reply_text()).with_text_parts(REPLY_CHUNKS),
    );
    let (server, peer_cold_start) = PeerServer::start(&dir, &stack.openai().base_url(), &model);

    let mut runs: Vec<[TurnSeries; 3]> = Vec::new();
    for run in 0..PEER_RUNS {
        eprintln!("bench: peer run {}/{PEER_RUNS}: wuhu…", run + 1);
        let wuhu = wuhu_run(stack, &model, config);
        eprintln!("bench: peer run {}/{PEER_RUNS}: agents…", run + 1);
        let agents = agents_run(stack, &model, &server, config);
        eprintln!(
            "bench: peer run {}/{PEER_RUNS}: wuhu over its socket…",
            run + 1
        );
        let socket = wuhu_socket_run(stack, &model, config);
        runs.push([wuhu, agents, socket]);
    }

    let mut series = Vec::new();
    let mut facts = Vec::new();
    let pick = |i: usize, f: fn(&TurnSeries) -> &Vec<f64>| -> Vec<f64> {
        runs.iter().flat_map(|r| f(&r[i]).iter().copied()).collect()
    };
    series.push(Series::new("wuhu_first_delta", pick(0, |t| &t.first_delta)));
    series.push(Series::new(
        "agents_first_delta",
        pick(1, |t| &t.first_delta),
    ));
    series.push(Series::new("wuhu_to_provider", pick(0, |t| &t.to_provider)));
    series.push(Series::new(
        "agents_to_provider",
        pick(1, |t| &t.to_provider),
    ));
    series.push(Series::new("wuhu_turn", pick(0, |t| &t.turn)));
    series.push(Series::new("agents_turn", pick(1, |t| &t.turn)));
    series.push(Series::new(
        "wuhu_enqueue_response",
        pick(0, |t| &t.response),
    ));
    series.push(Series::new(
        "wuhu_socket_first_delta",
        pick(2, |t| &t.first_delta),
    ));
    series.push(Series::new(
        "wuhu_socket_to_provider",
        pick(2, |t| &t.to_provider),
    ));
    series.push(Series::new("wuhu_socket_turn", pick(2, |t| &t.turn)));
    series.push(Series::new(
        "wuhu_socket_enqueue_response",
        pick(2, |t| &t.response),
    ));
    // Medians over the runs of each run's figure, as the targets are stated.
    let median_of_runs = |i: usize, f: &dyn Fn(&TurnSeries) -> f64| -> f64 {
        median(runs.iter().map(|r| f(&r[i])).collect())
    };
    let p = |samples: &Vec<f64>, q: f64| crate::percentile(samples, q);
    let mut table = serde_json::Map::new();
    for (i, name) in [(0, "wuhu"), (1, "agents"), (2, "wuhu_socket")] {
        table.insert(
            name.into(),
            json!({
                "first_delta_p50": round(median_of_runs(i, &|t| p(&t.first_delta, 50.0))),
                "first_delta_p99": round(median_of_runs(i, &|t| p(&t.first_delta, 99.0))),
                // The first delta split where the provider has the request: the system's work
                // before the provider call, then the stream's way back to the client.
                "to_provider_p50": round(median_of_runs(i, &|t| p(&t.to_provider, 50.0))),
                "provider_to_first_delta_p50": round(median_of_runs(i, &|t| {
                    let gaps: Vec<f64> = t.first_delta.iter().zip(&t.to_provider).map(|(f, p)| f - p).collect();
                    p(&gaps, 50.0)
                })),
                "turn_p50": round(median_of_runs(i, &|t| p(&t.turn, 50.0))),
                "turns_per_s": round(median_of_runs(i, &|t| t.turns_per_s)),
            }),
        );
    }
    table.get_mut("wuhu").expect("row")["cold_start_ms"] = json!(round(ms(config.stack_start)));
    table.get_mut("agents").expect("row")["cold_start_ms"] = json!(round(ms(peer_cold_start)));
    table.get_mut("wuhu_socket").expect("row")["cold_start_ms"] =
        json!(round(ms(config.stack_start)));
    let ratios_to = |row: &str| {
        let ratio = |key: &str| {
            round(
                table["agents"][key].as_f64().unwrap_or(f64::NAN)
                    / table[row][key].as_f64().unwrap_or(f64::NAN),
            )
        };
        json!({
            "first_delta_p50": ratio("first_delta_p50"),
            "first_delta_p99": ratio("first_delta_p99"),
            "turn_p50": ratio("turn_p50"),
            "turns_per_s": round(1.0 / ratio("turns_per_s")),
        })
    };
    let ratios = ratios_to("wuhu");
    let socket_ratios = ratios_to("wuhu_socket");
    // The enqueue's answer: the HTTP response, or the socket's reply frame.
    for (i, name) in [(0, "wuhu"), (2, "wuhu_socket")] {
        table.get_mut(name).expect("row")["enqueue_response_p50"] =
            json!(round(median_of_runs(i, &|t| p(&t.response, 50.0))));
    }
    println!(
        "  medians of {PEER_RUNS} runs: {}",
        Value::Object(table.clone())
    );
    println!("  agents / wuhu (above 1: Wuhu is faster): {ratios}");
    println!("  agents / wuhu over its socket (above 1: Wuhu is faster): {socket_ratios}");
    facts.push(("medians", Value::Object(table)));
    facts.push(("agents_over_wuhu", ratios));
    facts.push(("agents_over_wuhu_socket", socket_ratios));
    facts.push(("runs", json!(PEER_RUNS)));
    facts.push(("reply_chunks", json!(REPLY_CHUNKS)));
    facts.push(("peer_versions", peer_versions(&dir)));
    drop(server);
    Measured { series, facts }
}

/// One run of one system.
struct TurnSeries {
    first_delta: Vec<f64>,
    /// Request sent → the provider has the whole request (what the system does before it).
    to_provider: Vec<f64>,
    turn: Vec<f64>,
    response: Vec<f64>,
    turns_per_s: f64,
}

fn wuhu_run(stack: &Stack, model: &str, config: &Config) -> TurnSeries {
    let api = stack.client("bench", &unique_name("bench-peer"));
    let session = api.create_session(json!({"provider": "openai-compatible", "model": model}));
    let rx = crate::follow_stamped(&api, &session.id, session.last_cursor);
    let mut out = TurnSeries {
        first_delta: vec![],
        to_provider: vec![],
        turn: vec![],
        response: vec![],
        turns_per_s: 0.0,
    };
    let mut measured_from = None;
    for turn in 0..config.warmup + config.turns {
        if turn == config.warmup {
            measured_from = Some(Instant::now());
        }
        let started = Instant::now();
        api.enqueue(&session.id, "followUp", &format!("bench turn {turn}"));
        let responded = started.elapsed();
        let (first, idle) = until_idle(&rx, started, turn);
        if turn >= config.warmup {
            out.to_provider.push(ms(provider_at(stack, model, started)));
            out.first_delta.push(ms(first));
            out.turn.push(ms(idle));
            out.response.push(ms(responded));
        }
    }
    out.turns_per_s =
        config.turns as f64 / measured_from.expect("turns ran").elapsed().as_secs_f64();
    out
}

/// [`wuhu_run`] over the session socket: each turn is an `enqueue` frame, its `reply` (the
/// enqueue response) and the events on the same socket. The client acks what it reads from its
/// read loop, as docs/api.md asks of every client (`wuhu_e2e::socket`), so the server's ack
/// window never holds its events back.
fn wuhu_socket_run(stack: &Stack, model: &str, config: &Config) -> TurnSeries {
    let api = stack.client("bench", &unique_name("bench-peer-socket"));
    let session = api.create_session(json!({"provider": "openai-compatible", "model": model}));
    let auth = SocketAuth::Bearer(api.token().expect("a token").to_string());
    let query = format!("?after={}", session.last_cursor);
    let mut socket = SessionSocket::connect(&stack.base_url(), &session.id, &query, &auth)
        .unwrap_or_else(|e| panic!("the session socket: {e:?}"));
    // Registered once the status after the (empty) backfill arrived.
    loop {
        match socket.read(Instant::now() + TURN_TIMEOUT) {
            SocketRead::Frame(frame) if frame["type"] == "status" => break,
            SocketRead::Frame(_) => {}
            other => panic!("wuhu socket: {other:?} before its status"),
        }
    }
    let mut out = TurnSeries {
        first_delta: vec![],
        to_provider: vec![],
        turn: vec![],
        response: vec![],
        turns_per_s: 0.0,
    };
    let mut measured_from = None;
    for turn in 0..config.warmup + config.turns {
        if turn == config.warmup {
            measured_from = Some(Instant::now());
        }
        let id = format!("t{turn}");
        let started = Instant::now();
        socket.send(&ClientFrame::Enqueue {
            id: id.clone(),
            lane: None,
            body: EnqueueRequest {
                content: format!("bench turn {turn}"),
                key: None,
                reasoning: None,
            },
        });
        let (mut responded, mut first, mut idle) = (None, None, None);
        let deadline = started + TURN_TIMEOUT;
        let idle = loop {
            if let (Some(_), Some(idle)) = (responded, idle) {
                break idle;
            }
            let frame = match socket.read(deadline) {
                SocketRead::Frame(frame) => frame,
                other => panic!("wuhu socket turn {turn}: {other:?}"),
            };
            let at = started.elapsed();
            match frame["type"].as_str() {
                Some("reply") => {
                    assert_eq!(frame["id"], id.as_str(), "wuhu socket turn {turn}: {frame}");
                    assert_eq!(frame["status"], 200, "wuhu socket turn {turn}: {frame}");
                    responded = Some(at);
                }
                Some("assistant_text_delta") if first.is_none() => first = Some(at),
                Some("idle") => idle = Some(at),
                _ => {}
            }
        };
        if turn >= config.warmup {
            let first =
                first.unwrap_or_else(|| panic!("wuhu socket turn {turn}: idle before any delta"));
            out.to_provider.push(ms(provider_at(stack, model, started)));
            out.first_delta.push(ms(first));
            out.turn.push(ms(idle));
            out.response.push(ms(responded.expect("a reply")));
        }
    }
    out.turns_per_s =
        config.turns as f64 / measured_from.expect("turns ran").elapsed().as_secs_f64();
    socket.close();
    out
}

/// Waits for `idle` of the turn started at `started`: (first delta, idle), both from `started`.
fn until_idle(
    rx: &mpsc::Receiver<(Instant, SseEvent)>,
    started: Instant,
    turn: usize,
) -> (Duration, Duration) {
    let mut first = None;
    loop {
        let (at, event) = rx
            .recv_timeout(TURN_TIMEOUT)
            .unwrap_or_else(|_| panic!("wuhu turn {turn}: no idle within {TURN_TIMEOUT:?}"));
        if at < started {
            continue;
        }
        match event.event.as_str() {
            "assistant_text_delta" if first.is_none() => first = Some(at - started),
            "idle" => {
                let first =
                    first.unwrap_or_else(|| panic!("wuhu turn {turn}: idle before any delta"));
                return (first, at - started);
            }
            "done" => panic!("wuhu turn {turn}: the follow stream ended"),
            _ => {}
        }
    }
}

/// Time from `started` to the arrival of the newest provider request for `model`.
fn provider_at(stack: &Stack, model: &str, started: Instant) -> Duration {
    let at = stack
        .openai()
        .last_request_at(model)
        .expect("the provider saw the turn's request");
    at.checked_duration_since(started)
        .expect("the provider request of this turn arrived after it started")
}

fn agents_run(stack: &Stack, model: &str, server: &PeerServer, config: &Config) -> TurnSeries {
    let mut chat = server.chat(&unique_name("bench"));
    let mut out = TurnSeries {
        first_delta: vec![],
        to_provider: vec![],
        turn: vec![],
        response: vec![],
        turns_per_s: 0.0,
    };
    let mut measured_from = None;
    for turn in 0..config.warmup + config.turns {
        if turn == config.warmup {
            measured_from = Some(Instant::now());
        }
        let (first, done) = chat.turn(&format!("bench turn {turn}"));
        if turn >= config.warmup {
            out.to_provider
                .push(ms(provider_at(stack, model, chat.started)));
            out.first_delta.push(ms(first));
            out.turn.push(ms(done));
        }
    }
    out.turns_per_s =
        config.turns as f64 / measured_from.expect("turns ran").elapsed().as_secs_f64();
    out
}

/// The peer under its own `wrangler dev` (the repository's wrangler), killed by process group on
/// drop.
struct PeerServer {
    child: Child,
    port: u16,
    state: PathBuf,
}

impl PeerServer {
    /// Starts the peer; returns it and the time from spawn to its first answer.
    fn start(dir: &std::path::Path, openai_base_url: &str, model: &str) -> (PeerServer, Duration) {
        let wrangler = std::env::var_os("WRANGLER_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("node_modules/.bin/wrangler"));
        let state = make_temp_dir("wuhu-bench-peer");
        let port = free_port();
        let inspector = free_port();
        let log = std::fs::File::create(state.join("wrangler.log")).expect("peer log");
        let started = Instant::now();
        let mut command = Command::new(&wrangler);
        // The same stack as Wuhu's: without wrangler's DevTools proxy (see `without_devtools`).
        let child = wuhu_e2e::stack::without_devtools(&mut command)
            .current_dir(dir)
            .args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string()])
            .args(["--inspector-port", &inspector.to_string()])
            .arg("--persist-to")
            .arg(state.join("state"))
            .arg("--show-interactive-dev-session=false")
            .arg("--var")
            .arg(format!("OPENAI_BASE_URL:{openai_base_url}"))
            .arg("--var")
            .arg(format!("BENCH_MODEL:{model}"))
            .env("WRANGLER_SEND_METRICS", "false")
            .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", wrangler.display()));
        let mut server = PeerServer { child, port, state };
        let deadline = started + Duration::from_secs(120);
        loop {
            if let Ok(response) = wuhu_e2e::Request::new("GET", server.url("/healthz")).send()
                && response.status == 200
            {
                return (server, started.elapsed());
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "the peer's wrangler exited ({status}); log:\n{}",
                    server.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the peer did not start; log:\n{}",
                server.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.state.join("wrangler.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A chat with the agent instance `name` over its WebSocket (`/agents/chat-agent/NAME`).
    fn chat(&self, name: &str) -> PeerChat {
        use tungstenite::client::IntoClientRequest;
        let host = format!("127.0.0.1:{}", self.port);
        let request = format!("ws://{host}/agents/chat-agent/{name}")
            .into_client_request()
            .expect("peer ws request");
        let stream = TcpStream::connect(&host).expect("connect to the peer");
        stream.set_nodelay(true).ok();
        stream.set_read_timeout(Some(TURN_TIMEOUT)).ok();
        let (ws, _) = tungstenite::client::client(request, stream)
            .unwrap_or_else(|e| panic!("peer WebSocket handshake: {e}"));
        PeerChat {
            ws,
            history: Vec::new(),
            turns: 0,
            started: Instant::now(),
        }
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's process group; no memory is touched.
        unsafe { libc::kill(-pgid, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

struct PeerChat {
    ws: WebSocket<TcpStream>,
    /// UI messages so far, sent in full with each request as `useAgentChat` does.
    history: Vec<Value>,
    turns: usize,
    /// When the latest turn's request was sent.
    started: Instant,
}

impl PeerChat {
    /// One user message: (first text delta, response done), both from sending the request.
    fn turn(&mut self, text: &str) -> (Duration, Duration) {
        self.turns += 1;
        let request_id = format!("req-{}", self.turns);
        self.history.push(json!({
            "id": format!("u-{}", self.turns),
            "role": "user",
            "parts": [{"type": "text", "text": text}],
        }));
        let body = json!({"messages": self.history, "trigger": "submit-message"}).to_string();
        let frame = json!({
            "id": request_id,
            "init": {"method": "POST", "body": body},
            "type": "cf_agent_use_chat_request",
        });
        let started = Instant::now();
        self.started = started;
        self.ws
            .send(tungstenite::Message::text(frame.to_string()))
            .expect("send to the peer");
        let mut first = None;
        let mut reply = String::new();
        loop {
            let message = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("peer turn {}: {e}", self.turns));
            let tungstenite::Message::Text(text) = message else {
                continue;
            };
            let Ok(data) = serde_json::from_str::<Value>(text.as_str()) else {
                continue;
            };
            if data["type"] != "cf_agent_use_chat_response" || data["id"] != request_id.as_str() {
                continue;
            }
            assert!(
                data["error"] != json!(true),
                "peer turn {}: {data}",
                self.turns
            );
            if let Some(chunk) = data["body"].as_str().filter(|b| !b.trim().is_empty())
                && let Ok(chunk) = serde_json::from_str::<Value>(chunk)
                && chunk["type"] == "text-delta"
            {
                first.get_or_insert_with(|| started.elapsed());
                reply.push_str(chunk["delta"].as_str().unwrap_or_default());
            }
            if data["done"] == json!(true) {
                let done = started.elapsed();
                let first = first.unwrap_or_else(|| {
                    panic!("peer turn {}: done without a text delta", self.turns)
                });
                assert_eq!(
                    reply,
                    reply_text(),
                    "peer turn {}: the streamed reply",
                    self.turns
                );
                self.history.push(json!({
                    "id": format!("a-{}", self.turns),
                    "role": "assistant",
                    "parts": [{"type": "text", "text": reply}],
                }));
                return (first, done);
            }
        }
    }
}

fn peer_versions(dir: &std::path::Path) -> Value {
    let version = |package: &str| -> Value {
        std::fs::read_to_string(dir.join("node_modules").join(package).join("package.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .map(|v| v["version"].clone())
            .unwrap_or(Value::Null)
    };
    json!({
        "agents": version("agents"),
        "@cloudflare/ai-chat": version("@cloudflare/ai-chat"),
        "ai": version("ai"),
        "@ai-sdk/openai-compatible": version("@ai-sdk/openai-compatible"),
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return f64::NAN;
    }
    values[values.len() / 2]
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
