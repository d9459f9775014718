//! Live tool output (issue 36, `docs/api.md` "tool_output_delta"): a `bash` call's output
//! reaches the session's followers while the command runs, in order, masked of the secrets it
//! was given, bounded however much it prints; a follower that joins mid-command gets the
//! running call's recent output first. Nothing of it is stored: the result is the source of
//! truth.
//!
//! Real runner, real `wrangler dev`; the commands wait on files the test creates once it saw
//! what it waits for (no sleeps for synchronisation).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::tool_output::{MAX_PROGRESS_BYTES_PER_CALL, MAX_PROGRESS_FRAME_TEXT_BYTES};
use wuhu_core::wire::runner::{OutputStream, RunnerMessage, ServerMessage, encode_frame};
use wuhu_e2e::entries::{assistant, fake_directive, tool_result};
use wuhu_e2e::runner::{RawRunner, Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::socket::{SessionSocket, SocketAuth};
use wuhu_e2e::sse::summarize;
use wuhu_e2e::util::{random_hex, unique_name};
use wuhu_e2e::{Api, SseEvent, SseStream, Stack};

const TURN: Duration = Duration::from_secs(120);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// A session of `api`'s with environment `ci` (on a runner of its own over `work`) attached;
/// the definition gives its commands `secrets`.
fn session_with_environment(
    api: &Api,
    tenant: &str,
    work: &std::path::Path,
    secrets: &[&str],
) -> (String, Runner) {
    let runner =
        Runner::start(RunnerConfig::new(stack(), "alice", tenant, "mac").env("work", work));
    let defined = api.post(
        "/v1/environments",
        &json!({"name": "ci", "kind": "local", "runner": "mac", "path": work, "secrets": secrets}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let id = api.create_fake_session().id;
    let attach = api.run_tool(&id, "request_environment", json!({"spec": "ci"}), TURN);
    assert!(!attach.is_error, "{}", attach.content);
    (id, runner)
}

/// Has the fake model call `bash` with `command` (answered by `marker` after the result).
fn start_bash(api: &Api, id: &str, command: &str, marker: &str) {
    let content = fake_directive(&json!({
        "toolCalls": [{"name": "bash", "arguments": {"command": command}}],
        "afterTools": marker,
    }));
    api.enqueue(id, "followUp", &content);
}

/// The `tool_output_delta` text of `event`, if it is one.
fn output(event: &SseEvent) -> Option<&str> {
    (event.event == "tool_output_delta").then(|| event.data["text"].as_str().unwrap_or_default())
}

fn is_result(event: &SseEvent) -> bool {
    event.entry().is_some_and(|e| tool_result(&e).is_some())
}

/// Reads `stream` until the output shown so far contains `needle`; returns the output and the
/// events read.
#[track_caller]
fn read_output_until(stream: &mut SseStream, needle: &str, shown: &mut String) -> Vec<SseEvent> {
    stream.collect_until(TURN, |event| {
        assert!(
            !is_result(event),
            "the call's result came before {needle:?} was shown live: {shown:?}"
        );
        if let Some(text) = output(event) {
            shown.push_str(text);
        }
        shown.contains(needle)
    })
}

#[test]
fn output_reaches_followers_while_the_command_runs_in_order_masked_with_the_tail_for_late_joiners()
{
    let tenant = unique_name("live");
    let alice = stack().client("alice", &tenant);
    let value = format!("ghp_{}", random_hex(18));
    let set = alice.send(
        alice
            .request("PUT", "/v1/secrets/LIVE_TOKEN")
            .json(&json!({"value": value})),
    );
    assert_eq!(set.status, 200, "{set}");
    let dir = TempDir::new("wuhu-e2e-live");
    let work = dir.mkdir("work");
    let (id, _runner) = session_with_environment(&alice, &tenant, &work, &["LIVE_TOKEN"]);
    let since = alice.session(&id).session.last_cursor;
    let query = format!("sinceCursor={since}&timeoutSeconds=120");
    let mut early = alice.follow(&id, &query);

    // The command prints, waits for `go`, prints, waits for `end`.
    let command = r#"echo "first line $LIVE_TOKEN"; printf 'second line\n'
while [ ! -e go ]; do sleep 0.02; done
echo "after go"
while [ ! -e end ]; do sleep 0.02; done
echo "last line""#;
    let marker = format!("live done {}", random_hex(4));
    start_bash(&alice, &id, command, &marker);

    // Seen live, before the command could end (it waits for `go`), masked.
    let mut early_shown = String::new();
    let before = read_output_until(&mut early, "second line\n", &mut early_shown);
    let call_id = before
        .iter()
        .rev()
        .find_map(|e| e.entry().and_then(|e| assistant(&e).cloned()))
        .and_then(|m| m.tool_calls().next().map(|c| c.id.clone()))
        .expect("the bash call's entry came before its output");
    assert!(
        before
            .iter()
            .filter_map(|e| output(e).map(|_| &e.data["callId"]))
            .all(|c| c == &Value::String(call_id.clone())),
        "{}",
        summarize(&before)
    );
    assert_eq!(
        early_shown,
        "first line [secret:LIVE_TOKEN]\nsecond line\n",
        "{}",
        summarize(&before)
    );

    // A follower that joins now gets the tail first (after the backfill and the status).
    let mut late = alice.follow(&id, &query);
    let mut late_shown = String::new();
    let joined = read_output_until(&mut late, "second line\n", &mut late_shown);
    assert_eq!(late_shown, early_shown, "{}", summarize(&joined));
    assert_eq!(
        joined.iter().filter(|e| output(e).is_some()).count(),
        1,
        "the tail is one event: {}",
        summarize(&joined)
    );
    let status_at = joined.iter().position(|e| e.event == "status");
    let tail_at = joined.iter().position(|e| output(e).is_some());
    assert!(status_at < tail_at, "{}", summarize(&joined));

    // So does a session socket, and it sees what comes next live too.
    let auth = match alice.token() {
        Some(token) => SocketAuth::Bearer(token.to_string()),
        None => SocketAuth::None,
    };
    let mut socket =
        SessionSocket::connect(&stack().base_url(), &id, &format!("?after={since}"), &auth)
            .unwrap_or_else(|e| panic!("the socket upgrade was refused: {e:?}"));
    let mut socket_shown = String::new();
    let socket_output = |socket: &mut SessionSocket, shown: &mut String, needle: &str| {
        while !shown.contains(needle) {
            let frame = socket.next_frame(TURN);
            if frame["type"] == "tool_output_delta" {
                assert_eq!(frame["callId"], call_id.as_str(), "{frame}");
                shown.push_str(frame["text"].as_str().unwrap_or_default());
            }
        }
    };
    socket_output(&mut socket, &mut socket_shown, "second line\n");
    assert_eq!(socket_shown, early_shown);

    // All see what it prints next, live, in order.
    std::fs::write(work.join("go"), "").unwrap();
    read_output_until(&mut early, "after go\n", &mut early_shown);
    read_output_until(&mut late, "after go\n", &mut late_shown);
    socket_output(&mut socket, &mut socket_shown, "after go\n");
    assert!(
        socket_shown.ends_with("second line\nafter go\n"),
        "{socket_shown:?}"
    );
    socket.close();
    assert!(
        early_shown.ends_with("second line\nafter go\n"),
        "{early_shown:?}"
    );
    assert!(
        late_shown.ends_with("second line\nafter go\n"),
        "{late_shown:?}"
    );
    std::fs::write(work.join("end"), "").unwrap();

    // The result is the source of truth; nothing of the deltas was stored.
    for stream in [&mut early, &mut late] {
        let rest = stream.collect_until(TURN, is_result);
        let shown: String = rest.iter().filter_map(output).collect();
        assert!(!shown.contains(&value), "{}", summarize(&rest));
    }
    let entries = alice.wait_transcript(&id, "the step after the result", TURN, |entries| {
        entries
            .iter()
            .any(|e| assistant(e).is_some_and(|m| m.text() == marker))
    });
    let stored = serde_json::to_string(&entries).unwrap();
    assert!(!stored.contains(&value));
    assert!(!stored.contains("tool_output_delta"));
    let result = entries
        .iter()
        .filter_map(tool_result)
        .next_back()
        .expect("a result");
    let text = serde_json::to_string(result).unwrap();
    assert!(text.contains("last line"), "{text}");
    assert!(early_shown.len() <= text.len() + 64, "{early_shown:?}");
}

/// The peak resident memory of `runner`'s process (Linux), in kB.
fn peak_kb(runner: &Runner) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", runner.pid()?)).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A command printing 50 MB: its followers get a bounded stream (counted), the runner's
/// memory stays flat, and the result still comes.
#[test]
fn a_flood_of_output_keeps_the_stream_bounded() {
    let tenant = unique_name("flood");
    let alice = stack().client("alice", &tenant);
    let dir = TempDir::new("wuhu-e2e-flood");
    let work = dir.mkdir("work");
    let (id, runner) = session_with_environment(&alice, &tenant, &work, &[]);
    let since = alice.session(&id).session.last_cursor;
    let peak_before = peak_kb(&runner);
    let mut follower = alice.follow(&id, &format!("sinceCursor={since}&timeoutSeconds=300"));
    let marker = format!("flood done {}", random_hex(4));
    let started = Instant::now();
    start_bash(
        &alice,
        &id,
        "head -c 50000000 /dev/zero | tr '\\0' 'x'; echo; echo flood over",
        &marker,
    );
    let events = follower.collect_until(Duration::from_secs(300), is_result);
    let result = events
        .iter()
        .find_map(|e| e.entry().and_then(|e| tool_result(&e).cloned()))
        .expect("a result");
    assert!(
        !result.is_error,
        "{}",
        serde_json::to_string(&result).unwrap()
    );
    let frames: Vec<&str> = events.iter().filter_map(output).collect();
    let bytes: usize = frames.iter().map(|f| f.len()).sum();
    eprintln!(
        "50 MB command: {} deltas, {bytes} bytes to the follower, result after {:?}",
        frames.len(),
        started.elapsed()
    );
    assert!(!frames.is_empty(), "{}", summarize(&events));
    assert!(
        bytes <= MAX_PROGRESS_BYTES_PER_CALL + 4096,
        "{bytes} bytes of live output"
    );
    assert!(
        frames
            .iter()
            .all(|f| f.len() <= 2 * MAX_PROGRESS_FRAME_TEXT_BYTES),
        "a delta over the bound"
    );
    // The runner's peak memory grew by little more than its fixed buffers (the command's
    // output kept for the result, the progress buffer), not by what the command printed.
    if let (Some(before), Some(after)) = (peak_before, peak_kb(&runner)) {
        eprintln!("runner peak RSS: {before} kB before the flood, {after} kB after");
        assert!(
            after < before + 16 * 1024,
            "the runner's peak grew from {before} kB to {after} kB"
        );
    }
    alice.wait_transcript(&id, "the step after the result", TURN, |entries| {
        entries
            .iter()
            .any(|e| assistant(e).is_some_and(|m| m.text() == marker))
    });
}

/// A raw runner of `sub`'s named `name` offering environment `env` at `root`, welcomed by a
/// hub that relays progress frames.
#[track_caller]
fn raw_runner(tenant: &str, sub: &str, name: &str, env: &str, root: &std::path::Path) -> RawRunner {
    RawRunner::welcomed(stack(), sub, tenant, (name, env, root), TURN)
}

fn progress(id: &str, text: &str) -> String {
    encode_frame(&RunnerMessage::ToolProgress {
        id: id.to_string(),
        stream: OutputStream::Combined,
        text: text.to_string(),
    })
}

/// Only the runner a call went to feeds its live output, and only while the call waits: another
/// member's runner that knows the call's id, and the right runner after its answer, are not
/// relayed.
#[test]
fn only_the_runner_a_call_went_to_feeds_its_output_while_it_waits() {
    let tenant = unique_name("live-auth");
    let alice = stack().client("alice", &tenant);
    let dir = TempDir::new("wuhu-e2e-live-auth");
    let root = dir.mkdir("held");
    let mut raw = raw_runner(&tenant, "alice", "raw", "held", &root);
    let mut stranger = raw_runner(&tenant, "bob", "bobs", "other", &dir.mkdir("other"));
    let session = alice.create_fake_session().id;
    let attach = ToolTurn::start(
        &alice,
        &session,
        &[("request_environment", json!({"spec": "held"}))],
    );
    raw.answer_attach(&root, TURN);
    let (results, _) = attach.finish(&alice, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    let since = alice.session(&session).session.last_cursor;
    let mut follower = alice.follow(&session, &format!("sinceCursor={since}&timeoutSeconds=120"));

    let turn = ToolTurn::start(&alice, &session, &[("bash", json!({"command": "make"}))]);
    let ServerMessage::ToolCall { id, .. } = raw.next_request(TURN) else {
        panic!("expected the tool call");
    };
    stranger.send_text(&progress(&id, "forged by another member's runner\n"));
    raw.send_text(&progress(&id, "real output\n"));
    let mut shown = String::new();
    read_output_until(&mut follower, "real output\n", &mut shown);
    raw.send_text(&encode_frame(&RunnerMessage::ToolResult {
        id: id.clone(),
        content: String::from("real output\n"),
        is_error: false,
        details: None,
        blobs: Vec::new(),
    }));
    // After the answer nothing of the call is relayed.
    raw.send_text(&progress(&id, "after the answer\n"));
    stranger.send_text(&progress(&id, "forged again\n"));
    let (results, _) = turn.finish(&alice, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    let rest = follower.collect_until(TURN, |e| {
        e.entry()
            .is_some_and(|e| assistant(&e).is_some_and(|m| m.tool_calls().next().is_none()))
    });
    shown.extend(rest.iter().filter_map(output));
    assert_eq!(shown, "real output\n", "{}", summarize(&rest));
}
