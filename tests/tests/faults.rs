//! The fault suite (issue 8, run by `scripts/faults` and so by `scripts/test`).
//!
//! Faults: `wrangler dev` SIGKILLed while enqueues commit, while a reply streams, while a runner
//! tool runs, right after a turn ended (its archive flush starts at `idle`) and while an approval
//! waits (one kill hits a session in each of those states at once); a runner SIGKILLed while
//! its tool runs; the LLM stream cut mid-body; R2 object writes failing
//! (`WUHU_FAULT_BLOB_WRITES=fail`, a test-only variable that is unset by default) and then
//! recovering.
//!
//! After each, for every session involved: every acknowledged enqueue appears exactly once,
//! cursors are contiguous, no entry and no tool result is duplicated, and the session accepts
//! the next message and answers it.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{Entry, Status, custom_types};
use wuhu_e2e::entries::{
    assert_contiguous, assistant, customs, describe, fake_directive, position_of_user, tool_result,
    user_content, user_queue_item,
};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Reply, Stack, StackOptions, wait_for};

/// Long enough for a resumed turn and what is queued behind it on a loaded machine.
const SETTLE: Duration = Duration::from_secs(120);
/// The test-only fault variable of `worker/src/session_actor/blob_io.rs` (see docs/api.md).
const BLOB_FAULT_VAR: &str = "WUHU_FAULT_BLOB_WRITES";

/// How many user entries came from queue item `id`, and whether all carry `content`.
fn deliveries(entries: &[Entry], id: &str, content: &str) -> (usize, bool) {
    let delivered: Vec<&Entry> = entries
        .iter()
        .filter(|e| user_queue_item(e) == Some(id))
        .collect();
    let intact = delivered.iter().all(|e| user_content(e) == Some(content));
    (delivered.len(), intact)
}

/// The invariants after a fault, then the next message: `acked` are the (queue item id,
/// content) pairs the API acknowledged for session `id`.
#[track_caller]
fn check_after_fault(api: &Api, id: &str, acked: &[(String, String)], what: &str) {
    api.wait_idle(id, SETTLE);
    let entries = api.transcript(id);
    check_entries(&entries, acked, what);
    // The session accepts the next message and answers it.
    let tag = unique_name("next");
    let next = format!(
        "{tag}\n{}",
        fake_directive(&json!({"reply": format!("answer to {tag}")}))
    );
    api.enqueue(id, "followUp", &next);
    api.wait_idle(id, SETTLE);
    let entries = api.transcript(id);
    check_entries(&entries, acked, what);
    let at = position_of_user(&entries, &next).unwrap_or_else(|| {
        panic!(
            "{what}: the next message is missing:\n{}",
            describe(&entries)
        )
    });
    assert!(
        entries[at + 1..].iter().any(|e| assistant(e).is_some()),
        "{what}: the next message got no answer:\n{}",
        describe(&entries)
    );
}

#[track_caller]
fn check_entries(entries: &[Entry], acked: &[(String, String)], what: &str) {
    assert_contiguous(entries);
    let mut ids = HashSet::new();
    let mut results = HashSet::new();
    let mut items = HashSet::new();
    for entry in entries {
        assert!(
            ids.insert(entry.id.clone()),
            "{what}: entry id {} twice:\n{}",
            entry.id,
            describe(entries)
        );
        if let Some(result) = tool_result(entry) {
            assert!(
                results.insert(result.tool_call_id.clone()),
                "{what}: two results for tool call {}:\n{}",
                result.tool_call_id,
                describe(entries)
            );
        }
        if let Some(item) = user_queue_item(entry) {
            assert!(
                items.insert(item.to_string()),
                "{what}: queue item {item} delivered twice:\n{}",
                describe(entries)
            );
        }
    }
    for (item, content) in acked {
        assert_eq!(
            deliveries(entries, item, content),
            (1, true),
            "{what}: acknowledged item {item} must appear exactly once, intact:\n{}",
            describe(entries)
        );
    }
}

fn user_contents(entries: &[Entry]) -> impl Iterator<Item = &str> {
    entries.iter().filter_map(user_content)
}

/// A runner of `alice` named `mac` offering environment `api` (a temp dir).
fn mac(stack: &Stack, tenant: &str, dir: &TempDir) -> Runner {
    Runner::start(
        RunnerConfig::new(stack, "alice", tenant, "mac")
            .env("api", dir.path().join("api"))
            .workspaces_root(dir.path().join("workspaces")),
    )
}

/// A session of alice's that every member may prompt, with `api` attached.
#[track_caller]
fn shared_session_with_api(alice: &Api) -> String {
    let id = alice.create_fake_session().id;
    let response = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}));
    assert_eq!(response.status, 200, "sharing the session: {response}");
    let (results, entries) = ToolTurn::start(
        alice,
        &id,
        &[(
            "request_environment",
            json!({"spec": "mac:api", "name": "api"}),
        )],
    )
    .finish(alice, SETTLE);
    assert!(
        !results[0].is_error,
        "attach failed: {}\n{}",
        results[0].content,
        describe(&entries)
    );
    id
}

/// A `bash` call that creates `marker`, then sleeps for `seconds`.
fn touch_then_sleep(marker: &Path, seconds: u64) -> (&'static str, Value) {
    (
        "bash",
        json!({"command": format!("touch '{}'; sleep {seconds}", marker.display())}),
    )
}

/// Keeps enqueueing to `id` from two threads until stopped; records what was acknowledged.
struct Writers {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<HashMap<String, String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Writers {
    fn start(api: &Api, id: &str) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let threads = (0..2)
            .map(|w| {
                let (api, id, stop, acked) =
                    (api.clone(), id.to_string(), stop.clone(), acked.clone());
                std::thread::spawn(move || {
                    for n in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let lane = if n % 3 == 0 { "steer" } else { "followUp" };
                        let content = format!(
                            "writer {w} item {n}\n{}",
                            fake_directive(&json!({"reply": format!("w{w}n{n}"), "chunks": 3}))
                        );
                        let sent = api
                            .request("POST", &format!("/v1/sessions/{id}/enqueue?lane={lane}"))
                            .json(&json!({"content": content}))
                            .timeout(Duration::from_secs(30))
                            .send();
                        match sent {
                            Ok(response) if response.status == 200 => {
                                let item = response.json()["id"].as_str().unwrap().to_string();
                                acked.lock().unwrap().insert(item, content);
                            }
                            Ok(response) if response.status == 429 => {}
                            // Killed mid-request: unknown, and never delivered twice (checked
                            // for every item by `check_entries`).
                            _ => return,
                        }
                    }
                })
            })
            .collect();
        Writers {
            stop,
            acked,
            threads,
        }
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn finish(self) -> Vec<(String, String)> {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads {
            thread.join().unwrap();
        }
        let acked = self.acked.lock().unwrap();
        acked.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// One SIGKILL of wrangler hits five sessions, each in another state: enqueues committing,
/// a reply streaming, a runner tool running, a turn just ended (its archive flush starting),
/// an approval waiting. Then a runner is killed mid-tool, and an LLM stream is cut.
#[test]
fn wrangler_runner_and_llm_faults_lose_and_duplicate_nothing() {
    let mut stack = Stack::start();
    let tenant = unique_name("faults");
    let dir = TempDir::new("wuhu-e2e-faults");
    dir.mkdir("api");
    dir.mkdir("workspaces");
    let mut runner = mac(&stack, &tenant, &dir);
    let alice = stack.client("alice", &tenant);
    let bob = stack.client("bob", &tenant);

    // Mid-tool: a runner command that runs past the kill.
    let tool_session = shared_session_with_api(&alice);
    // Markers in the environment's root: its commands' cells may write nowhere else.
    let tool_started = dir.path().join("api/tool-started");
    ToolTurn::start(
        &alice,
        &tool_session,
        &[touch_then_sleep(&tool_started, 30)],
    );
    // An approval waiting: bob's prompt reaches alice's machine.
    let approval_session = shared_session_with_api(&alice);
    let approved_marker = dir.path().join("api/approved");
    let approval_turn = ToolTurn::start(
        &bob,
        &approval_session,
        &[(
            "bash",
            json!({"command": format!("touch '{}'", approved_marker.display())}),
        )],
    );
    let flush_session = alice.create_fake_session().id;
    // Mid-stream: a reply that streams for about 20 s.
    let stream_session = alice.create_fake_session().id;
    let slow = fake_directive(&json!({"reply": "a slow reply", "chunks": 40, "delayMs": 500}));
    let stream_item = alice.enqueue(&stream_session, "followUp", &slow);
    // Enqueues committing.
    let enqueue_session = alice.create_fake_session().id;
    let writers = Writers::start(&alice, &enqueue_session);

    wait_for("the runner command to start", SETTLE, || {
        tool_started.exists().then_some(())
    });
    wait_for("bob's call to wait for alice", SETTLE, || {
        let entries = alice.transcript(&approval_session);
        (!customs(&entries, custom_types::APPROVAL_REQUESTED).is_empty()).then_some(())
    });
    wait_for("the slow reply to stream", SETTLE, || {
        (alice.session(&stream_session).session.status == Status::Running).then_some(())
    });
    // Just ended: a turn of many entries, whose archive flush starts at `idle`; the kill comes
    // as soon as the turn is seen idle.
    let calls: Vec<(&str, Value)> = (0..8)
        .map(|_| ("list_sessions", json!({"limit": 1})))
        .collect();
    ToolTurn::start(&alice, &flush_session, &calls);
    alice.wait_idle(&flush_session, SETTLE);
    let before = writers.acked_count();
    wait_for("enqueues to be acknowledged", SETTLE, || {
        (writers.acked_count() > before).then_some(())
    });

    stack.restart_killed();
    let enqueue_acked = writers.finish();
    // The runner knew the old port.
    runner.kill_hard();
    runner = mac(&stack, &tenant, &dir);
    let alice = stack.client("alice", &tenant);
    let bob = stack.client("bob", &tenant);

    check_after_fault(
        &alice,
        &enqueue_session,
        &enqueue_acked,
        "kill during enqueues",
    );
    check_after_fault(
        &alice,
        &stream_session,
        &[(stream_item, slow)],
        "kill mid-stream",
    );
    check_after_fault(&alice, &flush_session, &[], "kill after a turn (flush)");
    check_after_fault(&alice, &tool_session, &[], "kill mid-tool");
    // The approval still waits; alice approves and bob's call runs once.
    let approval_id = wait_for("the approval to wait again", SETTLE, || {
        let entries = alice.transcript(&approval_session);
        let requested = customs(&entries, custom_types::APPROVAL_REQUESTED);
        let decided = customs(&entries, custom_types::APPROVAL_DECIDED);
        let open = requested
            .iter()
            .find(|r| !decided.iter().any(|d| d["approvalId"] == r["approvalId"]))?;
        open["approvalId"].as_str().map(str::to_string)
    });
    let answer = alice.post(
        &format!("/v1/sessions/{approval_session}/approvals/{approval_id}"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(answer.status, 200, "approving: {answer}");
    let (results, entries) = approval_turn.finish(&bob, SETTLE);
    assert!(
        results.iter().all(|r| !r.is_error) && approved_marker.exists(),
        "the approved call did not run:\n{}",
        describe(&entries)
    );
    check_after_fault(&bob, &approval_session, &[], "kill while an approval waits");

    // A runner killed while its tool runs: the call ends as an error, nothing else breaks.
    let killed_started = dir.path().join("api/runner-killed-started");
    let killed_turn = ToolTurn::start(
        &alice,
        &tool_session,
        &[touch_then_sleep(&killed_started, 60)],
    );
    wait_for("the command to start", SETTLE, || {
        killed_started.exists().then_some(())
    });
    runner.kill_hard();
    let (results, entries) = killed_turn.finish(&alice, SETTLE);
    assert!(
        results[0].is_error,
        "a call whose runner died must end as an error:\n{}",
        describe(&entries)
    );
    check_after_fault(&alice, &tool_session, &[], "runner killed mid-tool");

    // The LLM stream cut mid-body: retried (or failed visibly), never a half message twice.
    let model = unique_name("cut");
    stack.openai().script(
        &model,
        [
            Reply::truncated(),
            Reply::text("after the cut"),
            Reply::text("next answer"),
        ],
    );
    let llm_session = alice
        .create_session(json!({"provider": "openai-compatible", "model": model}))
        .id;
    let item = alice.enqueue(&llm_session, "followUp", "hello");
    alice.wait_idle(&llm_session, SETTLE);
    let entries = alice.transcript(&llm_session);
    check_entries(&entries, &[(item, "hello".into())], "LLM stream cut");
    let texts: Vec<String> = entries
        .iter()
        .filter_map(assistant)
        .map(|m| m.text())
        .filter(|t| !t.is_empty())
        .collect();
    assert!(
        texts.len() <= 1,
        "the cut reply and its retry both reached the transcript: {texts:?}\n{}",
        describe(&entries)
    );
    let next = alice.enqueue(&llm_session, "followUp", "and now?");
    alice.wait_idle(&llm_session, SETTLE);
    let entries = alice.transcript(&llm_session);
    check_entries(
        &entries,
        &[(next, "and now?".into())],
        "after the LLM stream cut",
    );
    assert!(
        entries
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == "next answer"),
        "the message after the cut got no answer:\n{}",
        describe(&entries)
    );
}

/// R2 object writes fail (`WUHU_FAULT_BLOB_WRITES=fail`) while a message too large for a row
/// is delivered: the failure is visible (a `storage_failed` error or a notice, never a silent
/// loss) and nothing is acknowledged without being kept; once R2 works again the message is
/// delivered exactly once and the session goes on.
#[test]
fn failing_object_writes_lose_nothing_and_recover() {
    let mut stack = Stack::start_with(StackOptions {
        vars: vec![(BLOB_FAULT_VAR.to_string(), "fail".to_string())],
        ..StackOptions::default()
    });
    let tenant = unique_name("r2fault");
    let api = stack.client("alice", &tenant);
    let id = api.create_fake_session().id;
    let small = fake_directive(&json!({"reply": "small ok"}));
    let small_item = api.enqueue(&id, "followUp", &small);
    api.wait_idle(&id, SETTLE);

    // Over the inline limit: its entry must go to R2, which fails. Sent to an idle session it
    // is delivered in the drain that queues it, so that drain fails as a whole: 500
    // storage_failed, nothing kept, nothing acknowledged.
    let big = |tag: &str| {
        format!(
            "{tag} {}\n{}",
            "b".repeat(wuhu_core::out_of_line::INLINE_MAX_BYTES + 1024),
            fake_directive(&json!({"reply": format!("{tag} ok")}))
        )
    };
    let refused = big("refused");
    let response = api.enqueue_raw(&id, "followUp", &refused);
    let error = response.expect_error(500);
    assert_eq!(error.code, "storage_failed", "{error:?}");

    // Queued behind a running turn, an item is acknowledged (its row is small enough): its
    // delivery then fails while R2 fails, visibly.
    let slow = fake_directive(&json!({"reply": "slow", "chunks": 6, "delayMs": 500}));
    let slow_item = wait_for("the session to accept a message again", SETTLE, || {
        let response = api.enqueue_raw(&id, "followUp", &slow);
        (response.status == 200).then(|| response.json()["id"].as_str().unwrap().to_string())
    });
    let queued = big("queued");
    let response = api.enqueue_raw(&id, "followUp", &queued);
    assert_eq!(response.status, 200, "queued behind a turn: {response}");
    let queued_item = response.json()["id"].as_str().unwrap().to_string();
    let visible = wait_for("the write failure to be visible", SETTLE, || {
        let page = api.get(&format!("/v1/sessions/{id}?sinceCursor=0&limit=1000"));
        if page.status == 500 {
            return (page.json()["error"]["code"] == "storage_failed").then_some("500");
        }
        let entries: Vec<Entry> =
            serde_json::from_value(page.json()["transcript"].clone()).unwrap_or_default();
        (!customs(&entries, custom_types::STORAGE_ERROR).is_empty()).then_some("notice")
    });
    eprintln!("object write failure visible as: {visible}");

    // R2 recovers.
    stack.set_var(BLOB_FAULT_VAR, None);
    stack.restart_killed();
    let api = stack.client("alice", &tenant);
    let acked = [
        (small_item, small),
        (slow_item, slow),
        (queued_item, queued),
    ];
    check_after_fault(&api, &id, &acked, "object writes failing, then recovering");
    let entries = api.transcript(&id);
    assert!(
        user_contents(&entries).all(|c| c != refused),
        "the refused message was kept:\n{}",
        describe(&entries)
    );
}
