//! `bench [--turns N] [--only NAME] [--out PATH] [--list]`
//!
//! Starts the local stack (the built Worker under `wrangler dev`) and runs benchmarks against
//! it, printing a summary and writing JSON (default `bench-results/latest.json` at the repo
//! root) with machine info and a timestamp.
//!
//! Benchmarks are entries of [`BENCHMARKS`]: a name, a description and a function from the
//! running stack to named sample series. Add new ones (runner tool round trip, js tool) there.

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use wuhu_e2e::stack::repo_root;
use wuhu_e2e::util::{rfc3339_utc, unique_name};
use wuhu_e2e::{SseEvent, Stack, StackOptions};

/// A benchmark: a name, what it measures, and the function that runs it.
struct Benchmark {
    name: &'static str,
    description: &'static str,
    run: fn(&Stack, &Config) -> Vec<Series>,
}

/// Every benchmark, in run order.
const BENCHMARKS: &[Benchmark] = &[
    Benchmark {
        name: "first_delta",
        description: "time from sending POST /enqueue to the first assistant_text_delta on an open follow stream \
                      (fake provider, WUHU_FAKE_DELAY_MS=0); the next turn starts after idle",
        run: first_delta,
    },
    Benchmark {
        name: "http_baseline",
        description: "round trip of GET /healthz (Worker only, no auth) and of GET /v1/sessions/:id?limit=1 \
                      (auth + session actor), each on a fresh connection: the floor under first_delta",
        run: http_baseline,
    },
];

/// Options shared by every benchmark.
struct Config {
    turns: usize,
    warmup: usize,
}

/// A named series of samples in milliseconds. The first series is the headline: its stats are
/// the benchmark's top-level `p50`, `p95`, ... in the JSON; the others are nested by name.
struct Series {
    name: &'static str,
    samples_ms: Vec<f64>,
}

fn main() {
    let mut config = Config {
        turns: 200,
        warmup: 10,
    };
    let mut only: Option<String> = None;
    let mut out = repo_root().join("bench-results/latest.json");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--turns" => {
                config.turns = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage("--turns needs a number"))
            }
            "--warmup" => {
                config.warmup = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage("--warmup needs a number"))
            }
            "--only" => only = Some(args.next().unwrap_or_else(|| usage("--only needs a name"))),
            "--out" => {
                out = args
                    .next()
                    .map(Into::into)
                    .unwrap_or_else(|| usage("--out needs a path"))
            }
            "--list" => {
                for bench in BENCHMARKS {
                    println!("{:<16} {}", bench.name, bench.description);
                }
                return;
            }
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    if config.turns == 0 {
        usage("--turns must be at least 1");
    }
    let selected: Vec<&Benchmark> = BENCHMARKS
        .iter()
        .filter(|b| only.as_deref().is_none_or(|name| name == b.name))
        .collect();
    if selected.is_empty() {
        usage(&format!(
            "no benchmark named {:?} (see --list)",
            only.unwrap_or_default()
        ));
    }

    eprintln!("bench: starting wrangler dev…");
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let mut results = serde_json::Map::new();
    for bench in selected {
        eprintln!(
            "bench: {} ({} turns after {} warm-up)…",
            bench.name, config.turns, config.warmup
        );
        let series = (bench.run)(&stack, &config);
        let mut entry = serde_json::Map::new();
        entry.insert("description".into(), json!(bench.description));
        entry.insert("unit".into(), json!("ms"));
        println!("{}", bench.name);
        for (i, s) in series.iter().enumerate() {
            let stats = Stats::of(&s.samples_ms);
            print_stats(s.name, &stats);
            if i == 0 {
                for (k, v) in stats.to_json().as_object().unwrap() {
                    entry.insert(k.clone(), v.clone());
                }
            } else {
                entry.insert(s.name.into(), stats.to_json());
            }
        }
        results.insert(bench.name.into(), Value::Object(entry));
    }
    let report = json!({
        "timestamp": rfc3339_utc(SystemTime::now()),
        "machine": machine_info(),
        "git": command_output("git", &["rev-parse", "--short", "HEAD"]),
        "wrangler": wrangler_version(),
        "config": {"turns": config.turns, "warmup": config.warmup},
        "benchmarks": results,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n")
        .unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
    eprintln!("bench: wrote {}", out.display());
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("bench: {problem}");
    }
    eprintln!("usage: bench [--turns N] [--warmup N] [--only NAME] [--out PATH] [--list]");
    std::process::exit(2);
}

/// Enqueue → first delta, over one follow stream read by a thread that timestamps each event
/// on arrival (so the enqueue response and the stream never wait for each other).
fn first_delta(stack: &Stack, config: &Config) -> Vec<Series> {
    let api = stack.client("bench", &unique_name("bench"));
    let session = api.create_fake_session();
    let mut follow = api.follow(
        &session.id,
        &format!("sinceCursor={}&timeoutSeconds=86400", session.last_cursor),
    );
    let (tx, rx) = mpsc::channel::<(Instant, SseEvent)>();
    std::thread::spawn(move || {
        let far = Instant::now() + Duration::from_secs(86_400);
        while let Ok(Some(event)) = follow.next_event(far) {
            if tx.send((Instant::now(), event)).is_err() {
                break;
            }
        }
    });
    let turn_timeout = Duration::from_secs(30);
    let mut to_delta = Vec::with_capacity(config.turns);
    let mut to_response = Vec::with_capacity(config.turns);
    let mut to_idle = Vec::with_capacity(config.turns);
    for turn in 0..config.warmup + config.turns {
        let started = Instant::now();
        api.enqueue(&session.id, "followUp", &format!("bench turn {turn}"));
        let responded = started.elapsed();
        let mut first: Option<Duration> = None;
        loop {
            let (at, event) = rx.recv_timeout(turn_timeout).unwrap_or_else(|_| {
                panic!(
                    "turn {turn}: no idle within {turn_timeout:?}; wrangler log:\n{}",
                    stack.log_tail(40)
                )
            });
            if at < started {
                continue; // Left over from the previous turn.
            }
            match event.event.as_str() {
                "assistant_text_delta" if first.is_none() => first = Some(at - started),
                "idle" => {
                    let first = first.unwrap_or_else(|| {
                        panic!("turn {turn}: idle before any assistant_text_delta")
                    });
                    if turn >= config.warmup {
                        to_delta.push(ms(first));
                        to_response.push(ms(responded));
                        to_idle.push(ms(at - started));
                    }
                    break;
                }
                "done" => panic!("turn {turn}: the follow stream ended"),
                _ => {}
            }
        }
    }
    vec![
        Series {
            name: "first_delta",
            samples_ms: to_delta,
        },
        Series {
            name: "enqueue_response",
            samples_ms: to_response,
        },
        Series {
            name: "turn_to_idle",
            samples_ms: to_idle,
        },
    ]
}

/// Plain request round trips, to tell wrangler/workerd overhead from session work.
fn http_baseline(stack: &Stack, config: &Config) -> Vec<Series> {
    let api = stack.client("bench", &unique_name("bench"));
    let session = api.create_fake_session();
    let path = format!("/v1/sessions/{}?limit=1", session.id);
    let mut healthz = Vec::with_capacity(config.turns);
    let mut get_session = Vec::with_capacity(config.turns);
    for i in 0..config.warmup + config.turns {
        let started = Instant::now();
        let response = wuhu_e2e::Request::new("GET", stack.url("/healthz"))
            .send()
            .expect("GET /healthz");
        let health = started.elapsed();
        assert_eq!(response.status, 200);
        let started = Instant::now();
        api.get(&path).expect_status(200);
        let get = started.elapsed();
        if i >= config.warmup {
            healthz.push(ms(health));
            get_session.push(ms(get));
        }
    }
    vec![
        Series {
            name: "healthz",
            samples_ms: healthz,
        },
        Series {
            name: "get_session",
            samples_ms: get_session,
        },
    ]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Stats {
    n: usize,
    p50: f64,
    p95: f64,
    p99: f64,
    mean: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(samples: &[f64]) -> Stats {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        // Nearest-rank percentiles.
        let pick = |p: f64| -> f64 {
            if sorted.is_empty() {
                return f64::NAN;
            }
            let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
            sorted[rank.min(sorted.len()) - 1]
        };
        Stats {
            n: sorted.len(),
            p50: pick(50.0),
            p95: pick(95.0),
            p99: pick(99.0),
            mean: sorted.iter().sum::<f64>() / sorted.len().max(1) as f64,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
        }
    }

    fn to_json(&self) -> Value {
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({"n": self.n, "p50": r(self.p50), "p95": r(self.p95), "p99": r(self.p99), "mean": r(self.mean), "min": r(self.min), "max": r(self.max)})
    }
}

fn print_stats(name: &str, s: &Stats) {
    println!(
        "  {name:<18} n={:<4} p50={:>7.2} ms  p95={:>7.2} ms  p99={:>7.2} ms  mean={:>7.2} ms  min={:>7.2} ms  max={:>7.2} ms",
        s.n, s.p50, s.p95, s.p99, s.mean, s.min, s.max
    );
}

fn machine_info() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_total_kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok());
    json!({
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string()),
        "hostname": std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu_model,
        "mem_total_mb": mem_total_kb.map(|kb| kb / 1024),
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.trim().to_string()),
        "node": command_output("node", &["--version"]),
    })
}

fn wrangler_version() -> Option<String> {
    let text =
        std::fs::read_to_string(repo_root().join("node_modules/wrangler/package.json")).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    value["version"].as_str().map(str::to_string)
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new(program)
        .args(args)
        .current_dir(repo_root())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}
