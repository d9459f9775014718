//! One `js` script can never take the isolate down.
//!
//! QuickJS's recursive C code (the parser, the regex compiler, proxies, `toString` of nested
//! arrays...) can recurse deeper than the host's stack long before QuickJS's own stack check
//! notices; V8 then throws "Maximum call stack size exceeded" through the WebAssembly instance
//! and the instance is lost. Each `js` call therefore runs in its own instance of the sandbox
//! module. These tests run a generated corpus of deep nesting (every syntactic form, after every
//! kind of token, in regexes, JSON, template literals, destructuring) and a set of hostile
//! scripts through the real Worker, in one tenant, while a session of another tenant streams
//! reply after reply; every call must end as a tool result (an error or a value), the other
//! session must finish every turn untouched, and the Worker must keep serving afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::{Entry, Status, ToolResult};
use wuhu_e2e::entries::{
    assert_contiguous, assistant, assistants, describe, fake_directive, tool_result, user_content,
};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack, wait_until};

const TURN: Duration = Duration::from_secs(180);
/// How many `js` calls one attacking turn makes (they run one after another).
const CALLS_PER_TURN: usize = 12;
/// The most script bytes in one attacking turn's message.
const MAX_TURN_BYTES: usize = 600 * 1024;

fn stack() -> &'static Stack {
    // The Worker's own limits (wrangler.toml), so the shipped step budget is what is tested.
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

fn client(prefix: &str) -> Api {
    stack().client("mallory", &unique_name(prefix))
}

/// The tool-result prefixes a hostile script may end with: every failure class of the
/// sandbox, including a discarded instance.
const ACCEPTED_ERRORS: &[&str] = &[
    "exception error: ",
    "timeout error: ",
    "stack_overflow error: ",
    "out_of_memory error: ",
    "internal error: the script's sandbox instance failed and was discarded: ",
];

#[track_caller]
fn assert_contained(what: &str, code: &str, result: &ToolResult) {
    let ok = !result.is_error
        || ACCEPTED_ERRORS
            .iter()
            .any(|p| result.content.starts_with(p));
    assert!(
        ok,
        "{what}: want a result or a sandbox error, got is_error={} {:?}\nscript starts {:?}\nwrangler log:\n{}",
        result.is_error,
        clip(&result.content, 400),
        clip(code, 120),
        stack().log_tail(40)
    );
}

fn clip(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

/// A session in another tenant that streams slow replies back to back until `attack` has
/// returned and one more whole turn has run. Returns what `attack` returned, after checking
/// that every turn of the other session ended with exactly its reply and nothing else.
fn while_another_tenant_streams<T>(attack: impl FnOnce() -> T) -> T {
    let victim = stack().client("victor", &unique_name("victim"));
    let session = victim.create_fake_session().id;
    let before = victim.transcript(&session).len();
    let attacking = Arc::new(AtomicBool::new(true));
    let streamer = {
        let victim = victim.clone();
        let session = session.clone();
        let attacking = Arc::clone(&attacking);
        thread::spawn(move || {
            let mut replies = Vec::new();
            let mut turns_after_attack = 0;
            while turns_after_attack < 1 {
                if !attacking.load(Ordering::SeqCst) {
                    turns_after_attack += 1;
                }
                let n = replies.len();
                let reply = format!(
                    "turn {n}: {}",
                    (0..40)
                        .map(|w| format!("w{w}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
                let content = format!(
                    "stream {n}\n{}",
                    fake_directive(&json!({"reply": reply, "chunks": 20, "delayMs": 40}))
                );
                victim.enqueue(&session, "followUp", &content);
                victim.wait_idle(&session, Duration::from_secs(90));
                replies.push((content, reply));
            }
            replies
        })
    };
    // The attack starts once the other session is mid-turn.
    wait_until(Duration::from_secs(30), || {
        (victim.session(&session).session.status == Status::Running).then_some(())
    })
    .expect("the other tenant's session never started streaming");
    let started = Instant::now();
    let result = attack();
    attacking.store(false, Ordering::SeqCst);
    let replies = match streamer.join() {
        Ok(replies) => replies,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    let entries = victim.transcript(&session);
    check_untouched(&entries[before..], &replies, &entries);
    assert_contiguous(&entries);
    eprintln!(
        "attack took {:?}; the other session ran {} turns meanwhile, all complete",
        started.elapsed(),
        replies.len()
    );
    result
}

/// Exactly the user message and the streamed reply of each turn, in order.
#[track_caller]
fn check_untouched(turns: &[Entry], replies: &[(String, String)], all: &[Entry]) {
    let mut expected = Vec::new();
    for (content, reply) in replies {
        expected.push(format!("user {content}"));
        expected.push(format!("assistant {reply}"));
    }
    let actual: Vec<String> = turns
        .iter()
        .map(|e| {
            if let Some(content) = user_content(e) {
                format!("user {content}")
            } else if let Some(message) = assistant(e) {
                format!("assistant {}", message.text())
            } else {
                format!("other entry at cursor {}", e.cursor)
            }
        })
        .collect();
    assert_eq!(
        actual,
        expected,
        "the other tenant's session was disturbed:\n{}",
        describe(all)
    );
}

/// Runs each script as a `js` call, batched into turns of at most `calls_per_turn` calls and
/// [`MAX_TURN_BYTES`] of code, each turn in a fresh session of the attacking tenant (so no
/// turn re-reads megabytes of earlier scripts). Checks each result, and that each session went
/// on to the step after its tool results. Returns the results in script order.
fn run_scripts(api: &Api, scripts: &[(String, String)], calls_per_turn: usize) -> Vec<ToolResult> {
    let mut batches: Vec<&[(String, String)]> = Vec::new();
    let mut start = 0;
    while start < scripts.len() {
        let mut end = start + 1;
        let mut bytes = scripts[start].1.len();
        while end < scripts.len()
            && end - start < calls_per_turn
            && bytes + scripts[end].1.len() <= MAX_TURN_BYTES
        {
            bytes += scripts[end].1.len();
            end += 1;
        }
        batches.push(&scripts[start..end]);
        start = end;
    }
    let mut results = Vec::new();
    for batch in batches {
        let started = Instant::now();
        let batch_results = run_batch(api, batch);
        eprintln!(
            "{} calls from {:?} took {:?}",
            batch.len(),
            batch[0].0,
            started.elapsed()
        );
        for ((what, code), result) in batch.iter().zip(&batch_results) {
            assert_contained(what, code, result);
        }
        results.extend(batch_results);
    }
    results
}

/// One turn of `js` calls in a fresh session: waits for idle through one-entry pages (never
/// the whole transcript, which holds every script twice), then reads the transcript once.
fn run_batch(api: &Api, batch: &[(String, String)]) -> Vec<ToolResult> {
    // A batch holds megabytes of script (twice): on the fake's default window the session would
    // compact mid-turn and summarise away the directive this test drives the fake with.
    let session = api
        .create_session(json!({"model": "fake-window-1000000000"}))
        .id;
    let marker = "after the tool calls";
    let calls: Vec<Value> = batch
        .iter()
        .map(|(_, code)| json!({"name": "js", "arguments": {"code": code}}))
        .collect();
    api.enqueue(
        &session,
        "followUp",
        &fake_directive(&json!({"toolCalls": calls, "afterTools": marker})),
    );
    api.wait_idle(&session, TURN);
    let entries = api.transcript(&session);
    let ids: Vec<String> = entries
        .iter()
        .find_map(|e| assistant(e).filter(|m| m.tool_calls().next().is_some()))
        .map(|m| m.tool_calls().map(|c| c.id.clone()).collect())
        .unwrap_or_default();
    assert_eq!(
        ids.len(),
        batch.len(),
        "tool calls made:\n{}",
        describe(&entries)
    );
    assert_eq!(
        assistants(&entries).last().map(|m| m.text()).as_deref(),
        Some(marker),
        "the session did not go on after its tool results:\n{}",
        describe(&entries)
    );
    ids.iter()
        .map(|id| {
            entries
                .iter()
                .filter_map(tool_result)
                .find(|r| r.tool_call_id == *id)
                .cloned()
                .unwrap_or_else(|| panic!("no result for tool call {id}:\n{}", describe(&entries)))
        })
        .collect()
}

/// The Worker still answers and a brand-new session in a brand-new tenant works.
#[track_caller]
fn assert_worker_serves() {
    assert!(stack().healthz_ok(), "/healthz after the attack");
    let api = client("after");
    let session = api.create_fake_session().id;
    api.enqueue(&session, "followUp", "hello after");
    api.wait_idle(&session, TURN);
    let transcript = api.transcript(&session);
    assert_eq!(
        assistants(&transcript).last().map(|m| m.text()).as_deref(),
        Some("echo: hello after"),
        "{}",
        describe(&transcript)
    );
    // And a `js` call there runs normally.
    let result = api.run_tool(
        &session,
        "js",
        json!({"code": "[1, 2, 3].map((x) => x * 2)"}),
        TURN,
    );
    assert!(!result.is_error, "{}", result.content);
    assert!(result.content.starts_with("[\n  2,"), "{}", result.content);
}

/// Nested syntactic forms, `depth` levels deep, each an expression.
fn nested_forms(depth: usize) -> Vec<(&'static str, String)> {
    let n = depth;
    let open_close = |open: &str, middle: &str, close: &str| {
        format!("{}{middle}{}", open.repeat(n), close.repeat(n))
    };
    vec![
        ("parentheses", open_close("(", "1", ")")),
        ("array literals", open_close("[", "1", "]")),
        (
            "object literals",
            format!("({})", open_close("{a:", "1", "}")),
        ),
        ("calls", open_close("f(", "1", ")")),
        ("member brackets", format!("y{}", "[0]".repeat(n))),
        ("template literals", open_close("`${", "1", "}`")),
        (
            "array destructuring",
            format!(
                "({} = {})",
                open_close("[", "a", "]"),
                open_close("[", "1", "]")
            ),
        ),
        (
            "object destructuring",
            format!("({} = {{}})", open_close("{a:", "a", "}")),
        ),
        ("spread", open_close("[...", "[]", "]")),
        (
            "arrow bodies in parentheses",
            open_close("(() => ", "1", ")"),
        ),
        (
            "regex literal groups",
            format!("/{}/", open_close("(", "a", ")")),
        ),
        (
            "regex literal non-capturing groups",
            format!("/{}/", open_close("(?:", "a", ")")),
        ),
        (
            "regex literal lookaheads",
            format!("/{}/", open_close("(?=", "a", ")")),
        ),
        (
            "regex literal classes in groups",
            format!("/{}/", open_close("([a]", "b", ")")),
        ),
    ]
}

/// Forms without brackets: right-recursive grammar the bracket guard cannot count.
fn unbracketed_forms(depth: usize) -> Vec<(&'static str, String)> {
    let n = depth;
    vec![
        ("logical not", format!("{}1", "!".repeat(n))),
        ("unary minus", format!("{}1", "- ".repeat(n))),
        ("typeof", format!("{}1", "typeof ".repeat(n))),
        ("void", format!("{}1", "void ".repeat(n))),
        ("await", format!("{}1", "await ".repeat(n))),
        ("new", format!("{}f", "new ".repeat(n))),
        ("ternary", format!("{}1", "1 ? 1 : ".repeat(n))),
        ("arrow functions", format!("{}1", "() => ".repeat(n))),
        ("assignment chain", format!("{}1", "a = ".repeat(n))),
        ("exponent chain", format!("{}1", "1 ** ".repeat(n))),
    ]
}

/// Runtime forms: deep structures built from short source.
fn runtime_forms(depth: usize) -> Vec<(&'static str, String)> {
    let n = depth;
    vec![
        (
            "JSON.parse of deep arrays",
            format!("JSON.parse('['.repeat({n}) + ']'.repeat({n}))"),
        ),
        (
            "JSON.parse of deep objects",
            format!("JSON.parse('{{\"a\":'.repeat({n}) + '1' + '}}'.repeat({n}))"),
        ),
        (
            "new RegExp with deep groups",
            format!("new RegExp('('.repeat({n}) + 'a' + ')'.repeat({n})).test('a')"),
        ),
        (
            "new RegExp with deep non-capturing groups",
            format!("new RegExp('(?:'.repeat({n}) + 'a' + ')'.repeat({n})).test('a')"),
        ),
        (
            "JSON.stringify of a deep value",
            format!("let v = 1; for (let i = 0; i < {n}; i++) v = [v]; JSON.stringify(v).length"),
        ),
    ]
}

/// What may come before a form, one for each kind of token; the `/` after `}`, `++` and `--`
/// is a division that a lexical scan easily mistakes for the start of a regex.
const PREFIXES: &[(&str, &str)] = &[
    ("expression start", "x = "),
    ("after }", "x = {} / "),
    ("after ++", "x = i++ / "),
    ("after --", "x = i-- / "),
    ("after )", "x = (1) / "),
    ("after ]", "x = [1][0] / "),
    ("after an identifier", "x = y / "),
    ("after a number", "x = 1 / "),
    ("after a string", "x = 'a' / "),
    ("after a template", "x = `a` / "),
    ("after a regex", "x = /a/ / "),
    ("after this", "x = this / "),
];

/// The prefixes that unbracketed forms are tried after. The prefix only matters to the lexical
/// guard, which counts brackets (and skips what it takes for a regex); forms without brackets
/// reach QuickJS whatever comes before them, so three prefixes are enough for them.
const UNBRACKETED_PREFIXES: &[&str] = &["expression start", "after }", "after ++"];

fn corpus() -> Vec<(String, String)> {
    const DEPTH: usize = 6_000;
    const UNBRACKETED_DEPTH: usize = 20_000;
    let script = |prefix: &str, form: &str| {
        // One line, so the form and the closing `/ 2` stay on the line of the `/`.
        format!("const f = (v) => v; let i = 0, y = [1], a, x; {prefix}{form} / 2")
    };
    let mut scripts = Vec::new();
    let bracketed = nested_forms(DEPTH);
    let unbracketed = unbracketed_forms(UNBRACKETED_DEPTH);
    for (prefix_name, prefix) in PREFIXES {
        for (form_name, form) in &bracketed {
            scripts.push((format!("{form_name}, {prefix_name}"), script(prefix, form)));
        }
        if UNBRACKETED_PREFIXES.contains(prefix_name) {
            for (form_name, form) in &unbracketed {
                scripts.push((format!("{form_name}, {prefix_name}"), script(prefix, form)));
            }
        }
    }
    for (form_name, code) in runtime_forms(30_000) {
        scripts.push((form_name.to_string(), code));
    }
    scripts
}

/// How each script ended, by the first words of its result (for the log).
fn tally(results: &[ToolResult]) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for result in results {
        let class = if !result.is_error {
            "a value".to_string()
        } else if result
            .content
            .contains("its sandbox instance was discarded")
        {
            "host stack overflow (instance discarded)".to_string()
        } else {
            clip(result.content.lines().next().unwrap_or(""), 70)
        };
        *counts.entry(class).or_insert(0) += 1;
    }
    counts
}

#[test]
fn a_deep_nesting_corpus_ends_in_tool_errors_while_another_tenant_streams() {
    let _guard = stack().guard();
    let scripts = corpus();
    let api = client("corpus");
    let results = while_another_tenant_streams(|| run_scripts(&api, &scripts, CALLS_PER_TURN));
    let errors = results.iter().filter(|r| r.is_error).count();
    eprintln!("{} scripts, {errors} tool errors", scripts.len());
    for (class, count) in tally(&results) {
        eprintln!("{count:5}  {class}");
    }
    // The corpus must reach what the instance per call is for: recursion in QuickJS's C code
    // deeper than the host's stack, which the lexical guard does not refuse.
    let overflowed: Vec<&str> = scripts
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.content.contains("its sandbox instance was discarded"))
        .map(|((what, _), _)| what.as_str())
        .collect();
    eprintln!("host stack overflows: {overflowed:?}");
    assert!(
        !overflowed.is_empty(),
        "no script overflowed the host stack: the corpus no longer tests the instance per call"
    );
    assert_worker_serves();
}

#[test]
fn hostile_scripts_end_in_tool_errors_while_another_tenant_streams() {
    let _guard = stack().guard();
    let parens = |n: usize| format!("{}1{}", "(".repeat(n), ")".repeat(n));
    let hostile: Vec<(&str, String, &str)> = vec![
        (
            "deep nesting after }",
            format!("x = {{}} / {} / 2", parens(6000)),
            "stack_overflow error: ",
        ),
        (
            "deep nesting after ++",
            format!("let i = 0; i++ / {} / 2", parens(6000)),
            "stack_overflow error: ",
        ),
        (
            "30,000 nested regex groups (literal)",
            format!("/{}a{}/.test('a')", "(".repeat(30_000), ")".repeat(30_000)),
            "",
        ),
        (
            "30,000 nested regex groups (new RegExp)",
            "new RegExp('('.repeat(30000) + 'a' + ')'.repeat(30000)).test('a')".into(),
            "",
        ),
        (
            "200,000 nested proxies",
            "let p = {}; for (let i = 0; i < 200000; i++) p = new Proxy(p, {}); p.x".into(),
            "",
        ),
        (
            "100,000 nested arrays to String()",
            "let a = []; for (let i = 0; i < 100000; i++) a = [a]; String(a).length".into(),
            "",
        ),
        (
            "a huge array to String()",
            "String(new Array(20000000).fill(12345)).length".into(),
            "",
        ),
        (
            "catastrophic regex backtracking",
            "/^(a+)+$/.test('a'.repeat(40) + 'b')".into(),
            "timeout error: ",
        ),
        (
            "catastrophic regex backtracking in a loop",
            "let n = 0; for (;;) { /^(a|aa)+$/.test('a'.repeat(30) + 'b'); n++ }".into(),
            "timeout error: ",
        ),
        ("endless loop", "for (;;) {}".into(), "timeout error: "),
        (
            "runaway recursion",
            "function down(n) { return down(n + 1) + 1 } down(0)".into(),
            "stack_overflow error: ",
        ),
        (
            "memory bomb",
            "const hog = []; for (;;) hog.push(new Array(1 << 20).fill(hog.length));".into(),
            "out_of_memory error: ",
        ),
    ];
    let scripts: Vec<(String, String)> = hostile
        .iter()
        .map(|(what, code, _)| (what.to_string(), code.clone()))
        .collect();
    let api = client("hostile");
    // One call per turn: a turn's calls run back to back, and CPU-bound calls hold the isolate
    // for their whole length (the step budget bounds each one, not their sum).
    let results = while_another_tenant_streams(|| run_scripts(&api, &scripts, 1));
    for ((what, code, expected), result) in hostile.iter().zip(&results) {
        eprintln!(
            "{what}: is_error={} {:?}",
            result.is_error,
            clip(&result.content, 160)
        );
        if !expected.is_empty() {
            assert!(
                result.is_error && result.content.starts_with(expected),
                "{what}: want {expected:?}, got {:?}\nscript starts {:?}",
                clip(&result.content, 300),
                clip(code, 80)
            );
        }
    }
    assert_worker_serves();
}
