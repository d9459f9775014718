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

/// Followers opened on one session (the figure; the server's per-session cap may refuse
/// some: they are counted, not hidden).
const FOLLOWERS: usize = 200;
/// Deltas of the followed reply.
const FOLLOWED_DELTAS: usize = 1000;
/// Sessions taking one turn at once.
const CONCURRENT_SESSIONS: usize = 200;
/// Enqueues sent at once to one session.
const BURST: usize = 100;
const WAIT: Duration = Duration::from_secs(120);

/// 200 followers on one session during a 1,000-delta reply: how many were admitted, how many
/// deltas each received, and each delta's delivery lag (its arrival at a follower minus its
/// earliest arrival at any follower: the fan-out spread).
pub fn followers(stack: &Stack, _config: &Config) -> Measured {
    let api = stack.client("bench", &unique_name("bench-followers"));
    let session = api.create_fake_session();
    let query = format!("sinceCursor={}&timeoutSeconds=600", session.last_cursor);
    let ready = Arc::new(Barrier::new(FOLLOWERS + 1));
    let (tx, rx) = mpsc::channel::<Result<Vec<Instant>, u16>>();
    for _ in 0..FOLLOWERS {
        let (api, id, query, ready, tx) = (
            api.clone(),
            session.id.clone(),
            query.clone(),
            ready.clone(),
            tx.clone(),
        );
        std::thread::spawn(move || {
            let opened = api.follow_open(&id, &query, None);
            ready.wait();
            let mut stream = match opened {
                Ok(FollowOpen::Stream(stream)) => stream,
                Ok(FollowOpen::Rejected(response)) => {
                    let _ = tx.send(Err(response.status));
                    return;
                }
                Err(_) => {
                    let _ = tx.send(Err(0));
                    return;
                }
            };
            let mut arrivals = Vec::with_capacity(FOLLOWED_DELTAS);
            let deadline = Instant::now() + WAIT;
            while let Ok(Some(event)) = stream.next_event(deadline) {
                match event.event.as_str() {
                    "assistant_text_delta" => arrivals.push(Instant::now()),
                    "idle" => break,
                    _ => {}
                }
            }
            let _ = tx.send(Ok(arrivals));
        });
    }
    drop(tx);
    ready.wait();
    let words: Vec<String> = (0..FOLLOWED_DELTAS).map(|i| format!("d{i}")).collect();
    api.enqueue(
        &session.id,
        "followUp",
        &fake_directive(&json!({"reply": words.join(" "), "chunks": FOLLOWED_DELTAS})),
    );
    let mut admitted = Vec::new();
    let mut refused = std::collections::BTreeMap::<u16, usize>::new();
    for result in rx.iter() {
        match result {
            Ok(arrivals) => admitted.push(arrivals),
            Err(status) => *refused.entry(status).or_default() += 1,
        }
    }
    let complete = admitted
        .iter()
        .filter(|a| a.len() == FOLLOWED_DELTAS)
        .count();
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
    println!(
        "  followers: {} admitted, {complete} got all {FOLLOWED_DELTAS} deltas, refused {refused:?}",
        admitted.len()
    );
    Measured {
        series: vec![Series::new("delivery_lag", lags)],
        facts: vec![
            ("followers_requested", json!(FOLLOWERS)),
            ("followers_admitted", json!(admitted.len())),
            ("followers_refused_by_status", json!(refused)),
            ("followers_complete", json!(complete)),
            ("deltas", json!(FOLLOWED_DELTAS)),
        ],
    }
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
