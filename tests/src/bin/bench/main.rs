//! `bench [--turns N] [--only NAME[,NAME…]] [--out PATH] [--list] [--needs-stack]`
//!
//! Starts the local stack (the built Worker under `wrangler dev`) when a selected benchmark
//! needs it and runs the benchmarks, printing a summary and writing JSON (default
//! `bench-results/latest.json` at the repo root) with machine info and a timestamp.
//!
//! Benchmarks are entries of [`BENCHMARKS`]: a name, a description and a function to named
//! sample series (plus facts that are not samples: counts, ratios), either from the running
//! stack ([`Run::Stack`]) or in process without it ([`Run::Native`]: `--only` of those alone
//! starts no stack). Add new ones there. `--needs-stack` answers, by its exit status (0: yes,
//! 1: no), whether the selection needs the stack: `scripts/bench` builds the Worker only then. `peer` (in `peer.rs`) measures Cloudflare's `agents` side by side; `load.rs`
//! holds the load figures.

mod cell;
mod context;
mod load;
mod masking;
mod peer;

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use wuhu_core::wire::runner::{HEARTBEAT_ACK_FRAME, RunnerKind};
use wuhu_core::wire::{EntryPayload, Message};
use wuhu_e2e::entries::fake_directive;
use wuhu_e2e::runner::{RawRunner, Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::stack::repo_root;
use wuhu_e2e::util::{rfc3339_utc, unique_name};
use wuhu_e2e::{Api, SseEvent, Stack, StackOptions};

/// A benchmark: a name, what it measures, and the function that runs it.
struct Benchmark {
    name: &'static str,
    description: &'static str,
    run: Run,
}

/// How a benchmark runs.
enum Run {
    /// Against the running stack.
    Stack(fn(&Stack, &Config) -> Measured),
    /// In process, without the stack.
    Native(fn(&Config) -> Measured),
}

/// What a benchmark measured: sample series, and facts that are not samples (counts, ratios,
/// versions), written to the JSON as they are.
struct Measured {
    series: Vec<Series>,
    facts: Vec<(&'static str, Value)>,
}

impl From<Vec<Series>> for Measured {
    fn from(series: Vec<Series>) -> Measured {
        Measured {
            series,
            facts: Vec::new(),
        }
    }
}

/// Every benchmark, in run order.
const BENCHMARKS: &[Benchmark] = &[
    Benchmark {
        name: "first_delta",
        description: "time from sending POST /enqueue to the first assistant_text_delta on an open follow stream \
                      (fake provider, WUHU_FAKE_DELAY_MS=0); the next turn starts after idle",
        run: Run::Stack(|stack, config| first_delta(stack, config).into()),
    },
    Benchmark {
        name: "http_baseline",
        description: "round trip of GET /healthz (Worker only, no auth) and of GET /v1/sessions/:id?limit=1 \
                      (auth + session actor), each on a fresh connection: the floor under first_delta",
        run: Run::Stack(|stack, config| http_baseline(stack, config).into()),
    },
    Benchmark {
        name: "js_round_trip",
        description: "added latency per tool call: per round, (enqueue→idle of a turn with 41 calls − of a turn \
                      with 1 call) / 40, the calls of one kind in one session (fake provider); kinds: js `1+1`, \
                      js building ~100 KB of JSON then parsing, transforming and stringifying it, and the \
                      `read` tool on wuhu://config/server.json as the floor of any tool call; \
                      js_1plus1_minus_read pairs the 1+1 and read samples of each round",
        run: Run::Stack(|stack, config| js_round_trip(stack, config).into()),
    },
    Benchmark {
        name: "js_work_budget",
        description: "what one step of the js work budget costs, per loop body: on a second stack with \
                      WUHU_SANDBOX_MAX_STEPS=100, (enqueue→idle of a turn whose one js call loops until the \
                      budget stops it − of a turn with one js `1+1`) / 100; at_default_budget is that × 1000 \
                      (the Worker's default budget), the CPU one call may take before the budget ends it. \
                      Each series is one loop body; samples = min(--turns, 5)",
        run: Run::Stack(|stack, config| js_work_budget(stack, config).into()),
    },
    Benchmark {
        name: "runner_round_trip",
        description: "tool round trip session → runner hub → wuhu-runner → `true` → back: one turn of sequential \
                      `bash {\"command\":\"true\"}` calls on a local runner's environment (a real wuhu-runner \
                      process, same machine), measured as the gaps between consecutive tool_result entries \
                      arriving on an open follow stream (the first from the assistant entry); bare_bash_spawn is \
                      `bash -c true` spawned and waited for locally; overhead pairs the two per sample \
                      (target: overhead p50 ≤ 3 ms). Arrivals can coalesce on the stream (a gap near 0 next \
                      to a long one), so the mean is the robust figure; ws_heartbeat_rtt is a runner \
                      heartbeat → heartbeat_ack round trip on a raw connection, the floor of any frame \
                      exchange with a runner",
        run: Run::Stack(|stack, config| runner_round_trip(stack, config).into()),
    },
    Benchmark {
        name: "cell_spawn",
        description: "what a cell adds to a bash call (decision 0023): `bash -c true` spawned and waited for \
                      as without cells, alternating with the same through `wuhu-runner cell-exec` (release \
                      binary) with network open, none and an allow list; added_* pair each cell sample with \
                      the bare one before it (target: added p50 ≤ 5 ms)",
        run: Run::Native(cell::cell_spawn),
    },
    Benchmark {
        name: "peer",
        description: "side by side with Cloudflare `agents` (AIChatAgent + the AI SDK's OpenAI-compatible provider, \
                      pinned in tests/bench-peer/, installed by scripts/bench outside the workspace), both served \
                      by the same wrangler and streaming the same 20-chunk reply from the stack's zero-delay fake \
                      Chat Completions server: first text delta, full turn and turns/s over --turns sequential \
                      turns after --warmup, 3 runs alternating; medians of the runs' figures and agents/wuhu \
                      ratios; cold start is spawn → first answer of each wrangler",
        run: Run::Stack(peer::peer),
    },
    Benchmark {
        name: "followers",
        description: "200 followers on one session, then one 1,000-delta reply (fake provider), twice: over \
                      SSE (follow streams; delivery_lag) and over the session socket (acking; \
                      socket_delivery_lag): followers admitted and refused (the per-session cap), followers \
                      that got every delta in order, each delta's delivery lag (arrival minus its earliest \
                      arrival at any follower, stamped when read from the connection by one client thread), \
                      and the CPU each process spent (client, wrangler's node and proxy workerd, the Worker's \
                      workerd)",
        run: Run::Stack(load::followers),
    },
    Benchmark {
        name: "sessions",
        description: "200 sessions of one tenant each take one turn at the same moment (fake provider): \
                      enqueue → idle per session, errors counted",
        run: Run::Stack(load::sessions),
    },
    Benchmark {
        name: "enqueue_burst",
        description: "100 enqueues sent at once to one session: response latency, refusals, and each message \
                      found exactly once in the transcript afterwards",
        run: Run::Stack(load::enqueue_burst),
    },
    Benchmark {
        name: "context_build",
        description: "the request of one step of a 10,000-entry session (a coding session: tool calls with \
                      ~1.5 KB results), built in process by release code as a session actor does before each \
                      LLM request (compaction::plan_step over the in-memory window); compacted_step after a \
                      compaction (the usual step), uncompacted_step deciding to compact; window_load_1024 \
                      builds the window from 1,024 entries (an actor's load, without I/O). Target: < 5 ms",
        run: Run::Native(context::context_build),
    },
    Benchmark {
        name: "runner_idle_rss",
        description: "resident memory of a connected, idle wuhu-runner (VmRSS, 20 samples 100 ms apart; target ≤ 15 MB)",
        run: Run::Stack(load::runner_idle_rss),
    },
    Benchmark {
        name: "masking",
        description: "masking secrets (wuhu_core::masking), in process, native release code, no stack: \
                      µs per KiB of output (not ms) for Masker::mask over ~64 KiB each of compiler output, an \
                      env dump and a wrapped base64 blob (all_N: the three together) with N = 0, 10, 100 known \
                      secrets of 40 characters (100: ~1,000+ patterns), and StreamMasker fed 64-byte deltas \
                      (stream_N); --turns samples each after --warmup. Target: ≤ 50 µs per KiB at 100",
        run: Run::Native(masking::masking),
    },
];

/// Options shared by every benchmark.
struct Config {
    turns: usize,
    warmup: usize,
    /// How long the stack took from spawning wrangler to its first answer.
    stack_start: Duration,
}

/// A named series of samples in milliseconds. The first series is the headline: its stats are
/// the benchmark's top-level `p50`, `p95`, ... in the JSON; the others are nested by name.
struct Series {
    name: &'static str,
    samples_ms: Vec<f64>,
}

impl Series {
    fn new(name: &'static str, samples_ms: Vec<f64>) -> Series {
        Series { name, samples_ms }
    }
}

fn main() {
    let mut config = Config {
        turns: 200,
        warmup: 10,
        stack_start: Duration::ZERO,
    };
    let mut only: Option<String> = None;
    let mut needs_stack_query = false;
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
            "--needs-stack" => needs_stack_query = true,
            "--list" => {
                if needs_stack_query {
                    std::process::exit(1);
                }
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
        .filter(|b| {
            only.as_deref()
                .is_none_or(|names| names.split(',').any(|name| name.trim() == b.name))
        })
        .collect();
    let unknown: Vec<&str> = only
        .as_deref()
        .map(|names| {
            names
                .split(',')
                .map(str::trim)
                .filter(|name| !BENCHMARKS.iter().any(|b| b.name == *name))
                .collect()
        })
        .unwrap_or_default();
    if !unknown.is_empty() {
        usage(&format!("no benchmark named {unknown:?} (see --list)"));
    }
    if selected.is_empty() {
        usage(&format!(
            "no benchmark named {:?} (see --list)",
            only.unwrap_or_default()
        ));
    }

    let needs_stack = selected.iter().any(|b| matches!(b.run, Run::Stack(_)));
    if needs_stack_query {
        std::process::exit(if needs_stack { 0 } else { 1 });
    }
    let stack = needs_stack.then(|| {
        eprintln!("bench: starting wrangler dev…");
        let starting = Instant::now();
        let stack = Stack::start_with(StackOptions {
            fake_delay_ms: Some(0),
            ..StackOptions::default()
        });
        config.stack_start = starting.elapsed();
        stack
    });
    let mut results = serde_json::Map::new();
    for bench in selected {
        eprintln!(
            "bench: {} ({} turns after {} warm-up)…",
            bench.name, config.turns, config.warmup
        );
        println!("{}", bench.name);
        let Measured { series, facts } = match bench.run {
            Run::Stack(run) => run(stack.as_ref().expect("the stack is started"), &config),
            Run::Native(run) => run(&config),
        };
        let mut entry = serde_json::Map::new();
        entry.insert("description".into(), json!(bench.description));
        entry.insert("unit".into(), json!("ms"));
        // A fact named `unit` says the samples are in another unit.
        for (name, value) in facts {
            entry.insert(name.into(), value);
        }
        let unit = entry["unit"].as_str().unwrap_or("ms").to_string();
        for (i, s) in series.iter().enumerate() {
            let stats = Stats::of(&s.samples_ms);
            print_stats(s.name, &stats, &unit);
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
        "wrangler_devtools": !wuhu_e2e::stack::devtools_off(),
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
    eprintln!(
        "usage: bench [--turns N] [--warmup N] [--only NAME[,NAME…]] [--out PATH] [--list] [--needs-stack]"
    );
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

/// The `js_round_trip` script: builds ~100 KB of JSON, parses it, transforms it, stringifies
/// the result.
const JSON_100KB_SCRIPT: &str = r#"
const rows = [];
for (let i = 0; i < 800; i++) {
  rows.push({ id: i, name: "item-" + i, tags: ["alpha", "beta", "gamma"], price: i * 1.25,
              stock: { berlin: i % 7, paris: i % 11 }, note: "lorem ipsum dolor sit amet" });
}
const text = JSON.stringify({ rows });
const data = JSON.parse(text);
const out = data.rows
  .filter((r) => r.stock.berlin > 2)
  .map((r) => ({ id: r.id, label: r.name.toUpperCase(), total: r.price * (r.stock.berlin + r.stock.paris) }));
const result = JSON.stringify(out);
({ inBytes: text.length, outBytes: result.length, rows: out.length })
"#;

/// Events of a follow stream from `since_cursor` on, each stamped on arrival by a reader thread
/// (so sending requests and reading the stream never wait for each other).
fn follow_stamped(api: &Api, id: &str, since_cursor: u64) -> mpsc::Receiver<(Instant, SseEvent)> {
    let mut follow = api.follow(
        id,
        &format!("sinceCursor={since_cursor}&timeoutSeconds=86400"),
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
    rx
}

/// Extra tool calls in the long turn of each `js_round_trip` pair.
const EXTRA_CALLS: usize = 40;

/// Runs one turn: from sending `POST /enqueue` to `idle` on the follow stream. Checks that
/// `calls` tool results arrived and none failed.
fn timed_turn(
    stack: &Stack,
    api: &Api,
    session: &str,
    rx: &mpsc::Receiver<(Instant, SseEvent)>,
    content: &str,
    calls: usize,
    what: &str,
) -> Duration {
    let turn_timeout = Duration::from_secs(60);
    let started = Instant::now();
    api.enqueue(session, "followUp", content);
    let mut results = 0;
    loop {
        let (at, event) = rx.recv_timeout(turn_timeout).unwrap_or_else(|_| {
            panic!(
                "{what}: no idle within {turn_timeout:?}; wrangler log:\n{}",
                stack.log_tail(40)
            )
        });
        if at < started {
            continue; // Left over from the previous turn.
        }
        match event.event.as_str() {
            "done" => panic!("{what}: the follow stream ended"),
            "idle" => {
                assert_eq!(results, calls, "{what}: tool results");
                return at - started;
            }
            _ => {}
        }
        if let Some(entry) = event.entry()
            && let EntryPayload::Message {
                message: Message::ToolResult(result),
            } = entry.payload
        {
            assert!(
                !result.is_error,
                "{what}: the tool failed: {}",
                result.content
            );
            results += 1;
        }
    }
}

/// The marginal cost of a tool call: per round and kind, a turn with one call and a turn with
/// `1 + EXTRA_CALLS` calls of the same kind in one session; the sample is the difference of
/// their enqueue → idle times over `EXTRA_CALLS`.
///
/// Why not the gap between the tool-call entry and the tool-result entry on the stream: the
/// actor runs inference (fake), the tool and the next step in one chain of microtasks with no
/// I/O in between, so workerd flushes those entries to the follower together and the gap is
/// always ~0 (measured: p50 0.00 ms even for the 100 KB script). Calls of one step run one after
/// another (`js` is not parallel-safe), so the long turn is the short one plus `EXTRA_CALLS`
/// sequential round trips: tool-call dispatch, the run, the result entry's persistence and
/// broadcast.
fn js_round_trip(stack: &Stack, config: &Config) -> Vec<Series> {
    let api = stack.client("bench", &unique_name("bench"));
    let kinds: [(&'static str, &str, Value); 3] = [
        ("js_1plus1", "js", json!({"code": "1+1"})),
        ("js_json_100kb", "js", json!({"code": JSON_100KB_SCRIPT})),
        (
            "read_config",
            "read",
            json!({"path": "wuhu://config/server.json"}),
        ),
    ];
    let turn = |tool: &str, arguments: &Value, n: usize| {
        let calls: Vec<Value> = (0..n)
            .map(|_| json!({"name": tool, "arguments": arguments}))
            .collect();
        fake_directive(&json!({"toolCalls": calls, "afterTools": "ok"}))
    };
    struct Kind {
        name: &'static str,
        session: String,
        rx: mpsc::Receiver<(Instant, SseEvent)>,
        one: String,
        many: String,
        samples_ms: Vec<f64>,
    }
    let mut kinds: Vec<Kind> = kinds
        .iter()
        .map(|(name, tool, arguments)| {
            let session = api.create_fake_session();
            Kind {
                name,
                rx: follow_stamped(&api, &session.id, session.last_cursor),
                session: session.id,
                one: turn(tool, arguments, 1),
                many: turn(tool, arguments, 1 + EXTRA_CALLS),
                samples_ms: Vec::with_capacity(config.turns),
            }
        })
        .collect();
    for round in 0..config.warmup + config.turns {
        for kind in &mut kinds {
            let what = format!("{} round {round}", kind.name);
            let one = timed_turn(stack, &api, &kind.session, &kind.rx, &kind.one, 1, &what);
            let many = timed_turn(
                stack,
                &api,
                &kind.session,
                &kind.rx,
                &kind.many,
                1 + EXTRA_CALLS,
                &what,
            );
            if round >= config.warmup {
                kind.samples_ms
                    .push((ms(many) - ms(one)) / EXTRA_CALLS as f64);
            }
        }
    }
    // Per round, what QuickJS adds over a tool that does no work.
    let over_read: Vec<f64> = kinds[0]
        .samples_ms
        .iter()
        .zip(&kinds[2].samples_ms)
        .map(|(js, read)| js - read)
        .collect();
    let mut series: Vec<Series> = kinds
        .into_iter()
        .map(|kind| Series {
            name: kind.name,
            samples_ms: kind.samples_ms,
        })
        .collect();
    series.push(Series {
        name: "js_1plus1_minus_read",
        samples_ms: over_read,
    });
    series
}

/// The work budget of the `js_work_budget` stack: small enough that the dearest body measured
/// ends on its budget before the 5 s clock limit, which `wrangler dev` enforces (its clock moves).
const BENCH_BUDGET_STEPS: u64 = 100;

/// The Worker's default work budget (`WUHU_SANDBOX_MAX_STEPS` in wrangler.toml).
const DEFAULT_BUDGET_STEPS: f64 = 1000.0;

/// Loop bodies that never end, each stopped by the work budget: the cheap and the dear kinds
/// of step (a step is one interrupt check, about 10 000 jumps or calls, or 64 KiB allocated).
const WORK_BODIES: &[(&str, &str)] = &[
    ("empty_loop", "for (;;) {}"),
    (
        "arithmetic",
        "let x = 0; for (let i = 0; ; i++) x = (x * 31 + i) | 0",
    ),
    (
        "push_objects",
        "const a = []; for (let i = 0; ; i++) { a.push({ i, s: 'v' + i }); if (a.length > 1000) a.length = 0 }",
    ),
    (
        "json_round_trip",
        "const o = { a: 1, b: [1, 2, 3], c: 'text', d: { e: null } }; for (;;) JSON.parse(JSON.stringify(o))",
    ),
    (
        "regex_backtracking",
        "const s = 'a'.repeat(24) + 'b'; for (;;) /^(a+)+$/.test(s)",
    ),
    ("string_repeat_1mib", "for (;;) 'x'.repeat(1 << 20).length"),
    (
        "sort_10k_with_comparator",
        "const a = Array.from({ length: 10000 }, (_, i) => (i * 7919) % 10007); for (;;) a.slice().sort((x, y) => x - y)",
    ),
    (
        "index_of_1kib",
        "const s = 'a'.repeat(1024); for (;;) s.indexOf('b')",
    ),
    (
        "index_of_1mib_long_needle",
        "const s = 'a'.repeat(1 << 20); const n = 'a'.repeat(64) + 'b'; for (;;) s.indexOf(n)",
    ),
    (
        "reverse_1m_array",
        "const a = new Array(1 << 20).fill(0); for (;;) a.reverse()",
    ),
    (
        "typed_fill_16mib",
        "const u = new Uint8Array(1 << 24); for (;;) u.fill(1)",
    ),
];

/// Per loop body of [`WORK_BODIES`], the cost of one step of the work budget.
fn js_work_budget(_: &Stack, config: &Config) -> Vec<Series> {
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![(
            "WUHU_SANDBOX_MAX_STEPS".into(),
            BENCH_BUDGET_STEPS.to_string(),
        )],
        ..StackOptions::default()
    });
    let api = stack.client("bench", &unique_name("bench-budget"));
    let session = api.create_fake_session();
    let rx = follow_stamped(&api, &session.id, session.last_cursor);
    let turn = |code: &str| {
        fake_directive(&json!({
            "toolCalls": [{"name": "js", "arguments": {"code": code}}],
            "afterTools": "ok",
        }))
    };
    let samples = config.turns.clamp(1, 5);
    let floor = turn("1+1");
    let mut series = Vec::new();
    let mut worst_per_step = 0.0f64;
    for (name, code) in WORK_BODIES {
        let body = turn(code);
        let mut per_step = Vec::with_capacity(samples);
        // One warm-up turn each: the first run of a body compiles what it uses.
        for sample in 0..=samples {
            let what = format!("js_work_budget {name} sample {sample}");
            let (base, _) = timed_turn_result(&stack, &api, &session.id, &rx, &floor, &what);
            let (spent, result) = timed_turn_result(&stack, &api, &session.id, &rx, &body, &what);
            if result.contains("time limit") {
                // Fewer steps ran than the budget: the sample is a lower bound.
                eprintln!(
                    "bench: {what}: the 5 s clock ended it before {BENCH_BUDGET_STEPS} steps; \
                     its per-step figure is a lower bound"
                );
            } else {
                assert!(
                    result.contains(&format!("execution budget of {BENCH_BUDGET_STEPS} steps")),
                    "{what}: want the work budget to end it, got {result:?}"
                );
            }
            if sample > 0 {
                per_step.push((ms(spent) - ms(base)) / BENCH_BUDGET_STEPS as f64);
            }
        }
        let stats = Stats::of(&per_step);
        worst_per_step = worst_per_step.max(stats.p50);
        series.push(Series {
            name,
            samples_ms: per_step,
        });
    }
    series.insert(
        0,
        Series {
            name: "at_default_budget",
            samples_ms: vec![worst_per_step * DEFAULT_BUDGET_STEPS],
        },
    );
    series
}

/// One turn with one tool call: enqueue → `idle` on the follow stream, and the call's result.
fn timed_turn_result(
    stack: &Stack,
    api: &Api,
    session: &str,
    rx: &mpsc::Receiver<(Instant, SseEvent)>,
    content: &str,
    what: &str,
) -> (Duration, String) {
    let turn_timeout = Duration::from_secs(60);
    let started = Instant::now();
    api.enqueue(session, "followUp", content);
    let mut result = None;
    loop {
        let (at, event) = rx.recv_timeout(turn_timeout).unwrap_or_else(|_| {
            panic!(
                "{what}: no idle within {turn_timeout:?}; wrangler log:\n{}",
                stack.log_tail(40)
            )
        });
        if at < started {
            continue; // Left over from the previous turn.
        }
        match event.event.as_str() {
            "done" => panic!("{what}: the follow stream ended"),
            "idle" => {
                let result = result.unwrap_or_else(|| panic!("{what}: no tool result"));
                return (at - started, result);
            }
            _ => {}
        }
        if let Some(entry) = event.entry()
            && let EntryPayload::Message {
                message: Message::ToolResult(tool_result),
            } = entry.payload
        {
            result = Some(tool_result.content);
        }
    }
}

/// Sequential `bash true` calls on a real runner, one turn; the same on a runner that answers
/// at once (session + hub cost); bare local `bash -c true` spawns; heartbeat round trips.
fn runner_round_trip(stack: &Stack, config: &Config) -> Vec<Series> {
    let tenant = unique_name("bench-runner");
    let dir = TempDir::new("wuhu-bench-runner");
    let _runner = Runner::start(
        RunnerConfig::new(stack, "bench", &tenant, "bench-runner")
            .env("bench", dir.path())
            .workspaces_root(dir.mkdir("workspaces"))
            .verbose(false),
    );
    let api = stack.client("bench", &tenant);
    let calls = config.warmup + config.turns;
    let round_trips = sequential_bash_gaps(stack, &api, "bench", calls).split_off(config.warmup);

    // The same flow against a runner that does no work.
    let token = stack.runner_token("bench", &tenant);
    let wait = Duration::from_secs(30);
    let mut instant = RawRunner::connect(&stack.base_url(), &token)
        .unwrap_or_else(|e| panic!("raw runner connection: {e}"));
    instant.send_text(&RawRunner::hello_offering(
        "bench-instant",
        RunnerKind::Local,
        &[("instant", &dir.path().display().to_string())],
    ));
    instant.next_text(wait);
    let served = instant.serve_instantly(&dir.path().display().to_string());
    let instant_trips =
        sequential_bash_gaps(stack, &api, "instant", calls).split_off(config.warmup);

    let mut bare = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        let status = std::process::Command::new("bash")
            .args(["-c", "true"])
            .status()
            .expect("spawn bash");
        let elapsed = started.elapsed();
        assert!(status.success());
        if i >= config.warmup {
            bare.push(ms(elapsed));
        }
    }

    // The floor of any frame exchange with a runner: heartbeat → heartbeat_ack over the same
    // path, answered by the hub's auto-response.
    let mut raw = RawRunner::connect(&stack.base_url(), &token)
        .unwrap_or_else(|e| panic!("raw runner connection: {e}"));
    raw.send_text(&RawRunner::hello("bench-raw", RunnerKind::Local));
    raw.next_text(wait);
    let mut heartbeat_rtt = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        raw.heartbeat();
        let ack = raw.next_text(wait);
        let elapsed = started.elapsed();
        assert_eq!(ack, HEARTBEAT_ACK_FRAME);
        if i >= config.warmup {
            heartbeat_rtt.push(ms(elapsed));
        }
    }
    raw.close();
    drop(served); // Detached: it ends with the process (or the hub closing the connection).

    let overhead: Vec<f64> = round_trips.iter().zip(&bare).map(|(r, b)| r - b).collect();
    let p50 = |s: &[f64]| Stats::of(s).p50;
    let mean = |s: &[f64]| Stats::of(s).mean;
    eprintln!(
        "bench: runner_round_trip p50 {:.2} ms (mean {:.2}) − bare bash p50 {:.2} ms (mean {:.2}) = overhead {:.2} ms (paired p50 {:.2} ms; target ≤ 3 ms: {}); \
         with an instant runner p50 {:.2} ms (mean {:.2}); heartbeat rtt p50 {:.3} ms",
        p50(&round_trips),
        mean(&round_trips),
        p50(&bare),
        mean(&bare),
        p50(&round_trips) - p50(&bare),
        p50(&overhead),
        if p50(&overhead) <= 3.0 {
            "met"
        } else {
            "missed"
        },
        p50(&instant_trips),
        mean(&instant_trips),
        p50(&heartbeat_rtt),
    );
    vec![
        Series {
            name: "runner_round_trip",
            samples_ms: round_trips,
        },
        Series {
            name: "bare_bash_spawn",
            samples_ms: bare,
        },
        Series {
            name: "overhead",
            samples_ms: overhead,
        },
        Series {
            name: "instant_runner_round_trip",
            samples_ms: instant_trips,
        },
        Series {
            name: "ws_heartbeat_rtt",
            samples_ms: heartbeat_rtt,
        },
    ]
}

/// Attaches `spec` to a fresh session, then runs one turn of `calls` sequential
/// `bash {"command":"true"}` calls; returns the gaps between consecutive tool_result arrivals
/// on a follow stream (the first measured from the assistant entry holding the calls).
fn sequential_bash_gaps(stack: &Stack, api: &Api, spec: &str, calls: usize) -> Vec<f64> {
    let session = api.create_fake_session();
    let turn_timeout = Duration::from_secs(60);
    let attach = ToolTurn::start(
        api,
        &session.id,
        &[("request_environment", json!({"spec": spec}))],
    );
    let (results, _) = attach.finish(api, turn_timeout);
    assert!(
        !results[0].is_error,
        "attaching {spec} failed: {}",
        results[0].content
    );
    api.wait_idle(&session.id, turn_timeout);

    let last = api.session(&session.id).session.last_cursor;
    let rx = follow_stamped(api, &session.id, last);
    let bash_true: Vec<(&str, Value)> = (0..calls)
        .map(|_| ("bash", json!({"command": "true"})))
        .collect();
    ToolTurn::start(api, &session.id, &bash_true);
    let mut called: Option<Instant> = None;
    let mut arrivals: Vec<Instant> = Vec::with_capacity(calls);
    let wait = Duration::from_secs(30);
    loop {
        let (at, event) = rx.recv_timeout(wait).unwrap_or_else(|_| {
            panic!(
                "{spec}: nothing for {wait:?} after {} results; wrangler log:\n{}",
                arrivals.len(),
                stack.log_tail(40)
            )
        });
        match event.event.as_str() {
            "idle" if called.is_some() => break,
            "done" => panic!("{spec}: the follow stream ended"),
            _ => {}
        }
        let Some(entry) = event.entry() else { continue };
        let EntryPayload::Message { message } = entry.payload else {
            continue;
        };
        match message {
            Message::Assistant(m) if called.is_none() && m.tool_calls().count() == calls => {
                called = Some(at);
            }
            Message::ToolResult(r) if called.is_some() => {
                assert!(!r.is_error, "{spec}: bash true failed: {}", r.content);
                arrivals.push(at);
            }
            _ => {}
        }
    }
    let mut previous = called.expect("the assistant entry with the calls");
    assert_eq!(arrivals.len(), calls, "{spec}: one tool_result per call");
    arrivals
        .into_iter()
        .map(|at| {
            let gap = ms(at - previous);
            previous = at;
            gap
        })
        .collect()
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
        let pick = |p: f64| nearest_rank(&sorted, p);
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

/// The nearest-rank `p`th percentile of `sorted` (ascending); NaN when empty.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The nearest-rank `p`th percentile of unsorted `samples`.
fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    nearest_rank(&sorted, p)
}

fn print_stats(name: &str, s: &Stats, unit: &str) {
    println!(
        "  {name:<18} n={:<4} p50={:>7.2} {unit}  p95={:>7.2} {unit}  p99={:>7.2} {unit}  mean={:>7.2} {unit}  min={:>7.2} {unit}  max={:>7.2} {unit}",
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
