//! Load figures: many followers on one session, many sessions at once, a burst of enqueues on
//! one session, and the runner's idle memory.

use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use serde_json::json;
use wuhu_core::wire::{EntryPayload, Message};
use wuhu_e2e::entries::fake_directive;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{FollowOpen, Stack};

use crate::{Config, Measured, Series, ms};

/// Followers opened on one session (the issue's figure; the server's per-session cap may refuse
/// some: they are counted, not hidden).
const FOLLOWERS: usize = 200;
/// Deltas of the followed reply.
const FOLLOWED_DELTAS: usize = 1000;
/// Sessions taking one turn at once.
const CONCURRENT_SESSIONS: usize = 200;
/// Enqueues sent at once to one session.
const BURST: usize = 100;
const WAIT: Duration = Duration::from_secs(120);

/// 200 followers on one session during a 1,000-delta reply, once over SSE (`follow`) and once
/// over the session socket: how many were admitted, how many received every delta (in order,
/// the reply's text exactly), and each delta's delivery lag (its arrival at a follower minus its
/// earliest arrival at any follower: the fan-out spread).
///
/// The followers are tasks on one tokio runtime with one worker thread ([`follower_runtime`]),
/// and a delta's arrival is stamped when its bytes are read from the connection: an SSE
/// follower keeps each chunk with its arrival time and decodes them after the reply (a frame
/// arrived with the chunk that completes it), a socket follower stamps each message. So the
/// figure is the server's fan-out plus the loopback, not the bench's own decoding: 200 client
/// threads decoding every frame into JSON on the same two cores as `wrangler dev` measured
/// mostly themselves (docs/benchmarks.md, "Where follower lag goes").
pub fn followers(stack: &Stack, _config: &Config) -> Measured {
    let sse = followers_run(stack, Door::Sse);
    let socket = followers_run(stack, Door::Socket);
    for (name, run) in [("sse", &sse), ("socket", &socket)] {
        println!(
            "  followers ({name}): {} admitted, {} got all {FOLLOWED_DELTAS} deltas, refused {:?}; \
             CPU ms {:?}, last delta {:.1} ms after the first",
            run.admitted, run.complete, run.refused, run.cpu_ms, run.burst_ms
        );
    }
    let facts = |run: &FollowersRun| {
        json!({
            "followers_requested": FOLLOWERS,
            "followers_admitted": run.admitted,
            "followers_refused_by_status": run.refused,
            "followers_complete": run.complete,
            "deltas": FOLLOWED_DELTAS,
            "cpu_ms": run.cpu_ms,
            "burst_ms": run.burst_ms,
        })
    };
    Measured {
        series: vec![
            Series::new("delivery_lag", sse.lags.clone()),
            Series::new("socket_delivery_lag", socket.lags.clone()),
        ],
        facts: vec![
            ("followers_requested", json!(FOLLOWERS)),
            ("followers_admitted", json!(sse.admitted)),
            ("followers_refused_by_status", json!(sse.refused)),
            ("followers_complete", json!(sse.complete)),
            ("deltas", json!(FOLLOWED_DELTAS)),
            ("sse", facts(&sse)),
            ("socket", facts(&socket)),
        ],
    }
}

/// How the followers follow.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Door {
    /// `GET /v1/sessions/:id/follow`.
    Sse,
    /// `GET /v1/sessions/:id/socket`, acking as docs/api.md asks.
    Socket,
}

/// One run of [`followers`] through one door.
struct FollowersRun {
    admitted: usize,
    refused: std::collections::BTreeMap<u16, usize>,
    complete: usize,
    lags: Vec<f64>,
    /// CPU time of the bench process (`client`) and of the stack's processes from the enqueue
    /// to the last follower done (10 ms ticks).
    cpu_ms: std::collections::BTreeMap<String, f64>,
    /// The last delta's latest arrival minus the first delta's earliest.
    burst_ms: f64,
}

/// The followers' runtime: one worker thread for all of them (200 OS threads, one per
/// follower, competed with workerd for the two cores).
fn follower_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-followers")
        .enable_all()
        .build()
        .expect("the followers' runtime")
}

fn followers_run(stack: &Stack, door: Door) -> FollowersRun {
    let api = stack.client("bench", &unique_name("bench-followers"));
    let session = api.create_fake_session();
    let token = api.token().expect("a token").to_string();
    let url = match door {
        Door::Sse => stack.url(&format!(
            "/v1/sessions/{}/follow?sinceCursor={}&timeoutSeconds=600",
            session.id, session.last_cursor
        )),
        Door::Socket => format!(
            "{}/v1/sessions/{}/socket?after={}",
            stack.base_url().replacen("http://", "ws://", 1),
            session.id,
            session.last_cursor
        ),
    };
    let runtime = follower_runtime();
    let client = runtime.block_on(async {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a reqwest client")
    });
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    // The deadline's timer belongs to the runtime.
    let _entered = runtime.enter();
    let deadline = tokio::time::Instant::now() + WAIT;
    let tasks: Vec<_> = (0..FOLLOWERS)
        .map(|_| {
            let (client, url, token, ready) =
                (client.clone(), url.clone(), token.clone(), ready_tx.clone());
            runtime.spawn(tokio::time::timeout_at(deadline, async move {
                match door {
                    Door::Sse => sse_follower(&client, &url, &token, ready).await,
                    Door::Socket => socket_follower(&url, &token, ready).await,
                }
            }))
        })
        .collect();
    drop(ready_tx);
    // Every follower is registered (or refused) before the reply starts.
    for _ in 0..FOLLOWERS {
        if ready_rx.recv_timeout(WAIT).is_err() {
            break;
        }
    }
    let processes = stack.pid().map(stack_processes).unwrap_or_default();
    let cpu_before = cpu_by_name(&processes);
    let words: Vec<String> = (0..FOLLOWED_DELTAS).map(|i| format!("d{i}")).collect();
    let reply = words.join(" ");
    api.enqueue(
        &session.id,
        "followUp",
        &fake_directive(&json!({"reply": reply, "chunks": FOLLOWED_DELTAS})),
    );
    let outcomes = runtime.block_on(async {
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(match task.await {
                Ok(Ok(outcome)) => outcome,
                // The deadline passed or the task failed: counted as admitted and incomplete.
                _ => Outcome::Messages(Vec::new()),
            });
        }
        outcomes
    });
    let cpu: std::collections::BTreeMap<String, f64> = cpu_by_name(&processes)
        .into_iter()
        .map(|(name, after)| {
            let used = after - cpu_before.get(&name).copied().unwrap_or(0.0);
            (name, used)
        })
        .collect();
    let mut admitted = Vec::new();
    let mut refused = std::collections::BTreeMap::<u16, usize>::new();
    let mut complete = 0;
    for outcome in outcomes {
        let arrivals = match outcome {
            Outcome::Refused(status) => {
                *refused.entry(status).or_default() += 1;
                continue;
            }
            outcome => outcome.deltas(),
        };
        let text: String = arrivals.iter().map(|(_, delta)| delta.as_str()).collect();
        if arrivals.len() == FOLLOWED_DELTAS && text == reply {
            complete += 1;
        }
        admitted.push(arrivals.into_iter().map(|(t, _)| t).collect::<Vec<_>>());
    }
    let mut lags = Vec::new();
    for k in 0..FOLLOWED_DELTAS {
        let Some(earliest) = admitted.iter().filter_map(|a| a.get(k)).min() else {
            continue;
        };
        lags.extend(
            admitted
                .iter()
                .filter_map(|a| a.get(k))
                .map(|t| ms(*t - *earliest)),
        );
    }
    let first = admitted.iter().filter_map(|a| a.first()).min();
    let last = admitted.iter().filter_map(|a| a.last()).max();
    FollowersRun {
        admitted: admitted.len(),
        refused,
        complete,
        lags,
        cpu_ms: cpu,
        burst_ms: match (first, last) {
            (Some(first), Some(last)) => ms(*last - *first),
            _ => f64::NAN,
        },
    }
}

/// What one follower got: refused with a status (0: no answer), or what it read with the
/// arrival times, decoded only once every follower is done (decoding while others still read
/// would delay their reads on the one runtime thread).
enum Outcome {
    Refused(u16),
    /// SSE chunks.
    Chunks(Vec<(Instant, bytes::Bytes)>),
    /// Socket messages.
    Messages(Vec<(Instant, String)>),
}

impl Outcome {
    /// The deltas read, in order, with their arrival times (a frame arrives with the chunk that
    /// completes it).
    fn deltas(self) -> Vec<(Instant, String)> {
        match self {
            Outcome::Refused(_) => Vec::new(),
            Outcome::Chunks(chunks) => {
                let mut parser = wuhu_e2e::sse::SseParser::new();
                let mut arrivals = Vec::new();
                for (at, chunk) in chunks {
                    if parser.push(&chunk).is_err() {
                        break;
                    }
                    while let Some(item) = parser.next_item() {
                        if let wuhu_e2e::SseItem::Event(event) = item
                            && let Some(delta) = event.delta()
                        {
                            arrivals.push((at, delta.to_string()));
                        }
                    }
                }
                arrivals
            }
            Outcome::Messages(messages) => messages
                .into_iter()
                .filter_map(|(at, text)| {
                    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
                    let delta = value["delta"].as_str().unwrap_or_default();
                    (value["type"] == "assistant_text_delta").then(|| (at, delta.to_string()))
                })
                .collect(),
        }
    }
}

/// An SSE follower: chunks kept with their arrival times until the turn's `idle`, decoded after.
async fn sse_follower(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    ready: mpsc::Sender<()>,
) -> Outcome {
    let response = client
        .get(url)
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .send()
        .await;
    let _ = ready.send(());
    let mut response = match response {
        Ok(r) if r.status() == 200 => r,
        Ok(r) => return Outcome::Refused(r.status().as_u16()),
        Err(_) => return Outcome::Refused(0),
    };
    let mut chunks: Vec<(Instant, bytes::Bytes)> = Vec::new();
    // The end of the turn is its `idle` event; the stream itself stays open.
    let mut tail: Vec<u8> = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let at = Instant::now();
        tail.extend_from_slice(&chunk);
        let idle = contains(&tail, b"\nevent: idle\n") || tail.starts_with(b"event: idle\n");
        let keep = tail.len().min(16);
        tail.drain(..tail.len() - keep);
        chunks.push((at, chunk));
        if idle {
            break;
        }
    }
    Outcome::Chunks(chunks)
}

/// A socket follower: each message's frames stamped as it is read, acked every
/// `ACK_EVERY_FRAMES` frames or `ACK_EVERY_BYTES` bytes (docs/api.md), until the turn's `idle`.
async fn socket_follower(url: &str, token: &str, ready: mpsc::Sender<()>) -> Outcome {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    use wuhu_core::socket::{ACK_EVERY_BYTES, ACK_EVERY_FRAMES, ClientFrame};

    let mut request = url.into_client_request().expect("a socket request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("a header"),
    );
    let connected = tokio_tungstenite::connect_async(request).await;
    let _ = ready.send(());
    let mut ws = match connected {
        Ok((ws, _)) => ws,
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            return Outcome::Refused(response.status().as_u16());
        }
        Err(_) => return Outcome::Refused(0),
    };
    let mut frames: Vec<(Instant, String)> = Vec::new();
    let (mut received, mut acked, mut unacked_bytes) = (0u64, 0u64, 0u64);
    while let Some(Ok(message)) = ws.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let at = Instant::now();
        // A message carries one or more frames; each counts as received.
        let mut idle = false;
        for frame in wuhu_core::socket::frames_of(text.as_str()) {
            received += 1;
            unacked_bytes += frame.len() as u64;
            idle |= frame == r#"{"type":"idle"}"#;
            frames.push((at, frame.to_string()));
        }
        if received - acked >= ACK_EVERY_FRAMES || unacked_bytes >= ACK_EVERY_BYTES {
            let ack = serde_json::to_string(&ClientFrame::Ack { received }).expect("an ack");
            if ws.send(Message::text(ack)).await.is_err() {
                break;
            }
            acked = received;
            unacked_bytes = 0;
        }
        if idle {
            break;
        }
    }
    let _ = ws.close(None).await;
    Outcome::Messages(frames)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The processes of the stack's wrangler (its process group), named by their part: wrangler's
/// Node process, the `workerd` that runs the Worker (it has the inspector) and the `workerd` of
/// wrangler's proxy in front of it (every request and stream passes through both).
fn stack_processes(wrangler: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (comm, rest) = stat.split_once(") ")?;
            let pgrp: u32 = rest.split_whitespace().nth(2)?.parse().ok()?;
            if pgrp != wrangler {
                return None;
            }
            let cmdline =
                std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let name = match comm.rsplit('(').next()? {
                "workerd" if cmdline.contains("--inspector-addr") => "workerd_worker",
                "workerd" => "workerd_proxy",
                "node" | "MainThread" => "node",
                _ => return None,
            };
            Some((pid, name.to_string()))
        })
        .collect()
}

/// CPU milliseconds by name (several processes of one name add up).
fn cpu_by_name(processes: &[(u32, String)]) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (pid, name) in processes {
        *out.entry(name.clone()).or_default() += cpu_ms(*pid).unwrap_or(0.0);
    }
    out.insert("client".into(), cpu_ms(std::process::id()).unwrap_or(0.0));
    out
}

/// User + system CPU time of a process so far, in milliseconds.
fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks * 1000.0 / hz)
}

/// 200 sessions (one tenant), each taking one turn at the same moment: enqueue → idle per
/// session, and every failure counted.
pub fn sessions(stack: &Stack, _config: &Config) -> Measured {
    let api = stack.client("bench", &unique_name("bench-sessions"));
    let ids: Vec<(String, u64)> = (0..CONCURRENT_SESSIONS)
        .map(|_| {
            let s = api.create_fake_session();
            (s.id, s.last_cursor)
        })
        .collect();
    let start = Arc::new(Barrier::new(CONCURRENT_SESSIONS + 1));
    let (tx, rx) = mpsc::channel::<Result<Duration, String>>();
    for (id, since) in ids {
        let (api, start, tx) = (api.clone(), start.clone(), tx.clone());
        std::thread::spawn(move || {
            let query = format!("sinceCursor={since}&timeoutSeconds=600");
            let opened = api.follow_open(&id, &query, None);
            start.wait();
            let result = (|| {
                let mut stream = match opened {
                    Ok(FollowOpen::Stream(stream)) => stream,
                    Ok(FollowOpen::Rejected(r)) => return Err(format!("follow {}", r.status)),
                    Err(e) => return Err(format!("follow: {e}")),
                };
                let started = Instant::now();
                let response = api.enqueue_raw(&id, "followUp", "one turn");
                if !(200..300).contains(&response.status) {
                    return Err(format!("enqueue {}", response.status));
                }
                let deadline = started + WAIT;
                loop {
                    match stream.next_event(deadline) {
                        Ok(Some(event)) if event.event == "idle" => return Ok(started.elapsed()),
                        Ok(Some(_)) => {}
                        Ok(None) => return Err("stream ended".into()),
                        Err(e) => return Err(format!("stream: {e}")),
                    }
                }
            })();
            let _ = tx.send(result);
        });
    }
    drop(tx);
    let started = Instant::now();
    start.wait();
    let mut turns = Vec::new();
    let mut errors = std::collections::BTreeMap::<String, usize>::new();
    for result in rx.iter() {
        match result {
            Ok(d) => turns.push(ms(d)),
            Err(e) => *errors.entry(e).or_default() += 1,
        }
    }
    let wall = started.elapsed();
    println!(
        "  sessions: {} turns done in {:.2} s, errors {errors:?}",
        turns.len(),
        wall.as_secs_f64()
    );
    Measured {
        series: vec![Series::new("turn", turns)],
        facts: vec![
            ("sessions", json!(CONCURRENT_SESSIONS)),
            ("errors", json!(errors)),
            ("wall_ms", json!(ms(wall))),
        ],
    }
}

/// 100 enqueues sent at once to one idle session: each response's latency, and the transcript
/// afterwards holds each message exactly once.
pub fn enqueue_burst(stack: &Stack, _config: &Config) -> Measured {
    let api = stack.client("bench", &unique_name("bench-burst"));
    let session = api.create_fake_session();
    let start = Arc::new(Barrier::new(BURST + 1));
    let (tx, rx) = mpsc::channel::<(usize, u16, Duration)>();
    for i in 0..BURST {
        let (api, id, start, tx) = (api.clone(), session.id.clone(), start.clone(), tx.clone());
        std::thread::spawn(move || {
            start.wait();
            let started = Instant::now();
            let response = api.enqueue_raw(&id, "followUp", &format!("burst {i}"));
            let _ = tx.send((i, response.status, started.elapsed()));
        });
    }
    drop(tx);
    start.wait();
    let mut latencies = Vec::new();
    let mut failed = 0;
    for (_, status, elapsed) in rx.iter() {
        if (200..300).contains(&status) {
            latencies.push(ms(elapsed));
        } else {
            failed += 1;
        }
    }
    // Every accepted message reaches the transcript exactly once (the turns may still run).
    let deadline = Instant::now() + WAIT;
    let counts = loop {
        let mut counts = vec![0usize; BURST];
        for entry in api.transcript(&session.id) {
            if let EntryPayload::Message {
                message: Message::User { content, .. },
            } = entry.payload
                && let Some(i) = content
                    .strip_prefix("burst ")
                    .and_then(|n| n.parse::<usize>().ok())
                && i < BURST
            {
                counts[i] += 1;
            }
        }
        if counts.iter().all(|c| *c >= 1) || Instant::now() > deadline {
            break counts;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let duplicated = counts.iter().filter(|c| **c > 1).count();
    let missing = counts.iter().filter(|c| **c == 0).count();
    println!(
        "  enqueue_burst: {} accepted, {failed} refused, {missing} missing, {duplicated} duplicated",
        latencies.len()
    );
    Measured {
        series: vec![Series::new("enqueue_response", latencies)],
        facts: vec![
            ("burst", json!(BURST)),
            ("refused", json!(failed)),
            ("missing_in_transcript", json!(missing)),
            ("duplicated_in_transcript", json!(duplicated)),
        ],
    }
}

/// Resident memory of a connected, idle `wuhu-runner` (target: ≤ 15 MB), sampled 20 times.
pub fn runner_idle_rss(stack: &Stack, _config: &Config) -> Measured {
    let tenant = unique_name("bench-rss");
    let dir = TempDir::new("wuhu-bench-rss");
    let runner = Runner::start(
        RunnerConfig::new(stack, "bench", &tenant, "bench-rss")
            .env("bench", dir.path())
            .workspaces_root(dir.mkdir("workspaces"))
            .verbose(false),
    );
    let pid = runner.pid().expect("runner pid");
    let mut samples = Vec::new();
    for _ in 0..20 {
        if let Some(kb) = rss_kb(pid) {
            samples.push(kb as f64 / 1024.0);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let max = samples.iter().copied().fold(0.0, f64::max);
    println!(
        "  runner idle RSS: max {max:.1} MB over {} samples",
        samples.len()
    );
    Measured {
        series: vec![],
        facts: vec![(
            "rss_mb",
            json!({"max": max, "samples": samples.len(), "unit": "MB"}),
        )],
    }
}

fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
