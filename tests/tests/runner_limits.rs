//! Bounded runner connections: frames over 8 KiB before `welcome` and over 1 MiB after close the
//! socket at once (never parsed), exactly at each bound they are served; anything but `hello`
//! before welcome is refused; runner sockets per owner are bounded; and the hub keeps serving
//! every other runner throughout. Stored runner names are bounded per owner (64) and per tenant
//! (1,024), a freed name makes room, and environment definitions are bounded per owner (100)
//! and per tenant (500). The 30-day expiry of names is `wuhu_core::hub`'s table test (a test
//! cannot wait 30 days, and the Worker has no clock to turn).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::hub::{
    MAX_DEFINITIONS_PER_OWNER, MAX_DEFINITIONS_PER_TENANT, MAX_RUNNER_ROWS_PER_OWNER,
    MAX_RUNNER_ROWS_PER_TENANT,
};
use wuhu_core::wire::runner::{
    HEARTBEAT_ACK_FRAME, MAX_FRAME_BYTES, MAX_FRAME_BYTES_BEFORE_WELCOME, RunnerKind, ServerMessage,
};
use wuhu_e2e::Stack;
use wuhu_e2e::runner::{RawRunner, Runner, RunnerConfig};
use wuhu_e2e::util::unique_name;

const WAIT: Duration = Duration::from_secs(15);

/// Held by the tests that time a close ("at once") and by those that register hundreds of
/// names or definitions, so the load of the second never delays the first.
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timing() -> std::sync::MutexGuard<'static, ()> {
    TIMING.lock().unwrap_or_else(|p| p.into_inner())
}
/// "At once": the close arrives this soon after the frame was sent.
const PROMPT: Duration = Duration::from_secs(3);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

fn connect(tenant: &str, sub: &str) -> RawRunner {
    let token = stack().runner_token(sub, tenant);
    RawRunner::connect(&stack().base_url(), &token)
        .unwrap_or_else(|e| panic!("connect a raw runner: {e}"))
}

/// `frame` (a JSON object) padded with an unknown field to exactly `len` bytes.
fn padded(frame: &str, len: usize) -> String {
    let mut value: Value = serde_json::from_str(frame).expect("a JSON object");
    value["pad"] = json!("");
    let shell = serde_json::to_string(&value).expect("encode").len();
    assert!(shell <= len, "{shell} > {len}");
    value["pad"] = json!("x".repeat(len - shell));
    let text = serde_json::to_string(&value).expect("encode");
    assert_eq!(text.len(), len);
    text
}

fn welcomed(raw: &mut RawRunner) {
    match raw.next_message(WAIT) {
        ServerMessage::Welcome { .. } => {}
        other => panic!("expected welcome, got {other:?}"),
    }
}

/// Sends `frame` and asserts that the server closes the connection promptly.
#[track_caller]
fn assert_closes(raw: &mut RawRunner, frame: &str, what: &str) {
    let sent = Instant::now();
    // The server may close while a big frame is still being written.
    let _ = raw.try_send_text(frame);
    let closed = raw
        .wait_closed(WAIT)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let elapsed = sent.elapsed();
    eprintln!("runner_limits: {what}: closed {closed:?} {elapsed:?} after the send");
    assert!(elapsed <= PROMPT, "{what}: closed only after {elapsed:?}");
    if let Some((code, reason)) = closed {
        assert!(
            code == 1009 || code == 1008 || code == 1000,
            "{what}: close code {code} ({reason})"
        );
    }
}

#[test]
fn oversized_frames_close_the_socket_at_once_and_frames_at_the_bound_are_served() {
    let _guard = stack().guard();
    let _timing = timing();
    let tenant = unique_name("frames");
    // A welcomed bystander, which must be served throughout.
    let mut bystander = connect(&tenant, "bea");
    bystander.send_text(&RawRunner::hello("bystander", RunnerKind::Local));
    welcomed(&mut bystander);

    let hello = RawRunner::hello("big", RunnerKind::Local);
    for len in [
        15 * 1024 * 1024,
        9 * 1024,
        MAX_FRAME_BYTES_BEFORE_WELCOME + 1,
    ] {
        let mut raw = connect(&tenant, "ana");
        assert_closes(
            &mut raw,
            &padded(&hello, len),
            &format!("a {len} byte hello"),
        );
    }
    // Anything but hello (or heartbeat) before welcome is refused.
    let mut raw = connect(&tenant, "ana");
    raw.send_text(r#"{"type":"tool_result","id":"t","content":"","isError":false}"#);
    let refused: Value = serde_json::from_str(&raw.next_text(WAIT)).expect("JSON");
    assert_eq!(
        (&refused["type"], &refused["code"]),
        (&json!("refused"), &json!("hello_required")),
        "{refused}"
    );
    raw.wait_closed(WAIT).expect("closed after the refusal");

    // Exactly at the bound, a hello is welcomed; after welcome the bound is 1 MiB.
    let mut raw = connect(&tenant, "ana");
    raw.send_text(&padded(&hello, MAX_FRAME_BYTES_BEFORE_WELCOME));
    welcomed(&mut raw);
    let heartbeat = r#"{"type":"heartbeat"}"#;
    raw.send_text(&padded(heartbeat, MAX_FRAME_BYTES));
    assert_eq!(raw.next_text(WAIT), HEARTBEAT_ACK_FRAME);
    assert_closes(
        &mut raw,
        &padded(heartbeat, MAX_FRAME_BYTES + 1),
        "a frame one byte over 1 MiB after welcome",
    );
    let mut raw = connect(&tenant, "ana");
    raw.send_text(&hello);
    welcomed(&mut raw);
    assert_closes(
        &mut raw,
        &padded(heartbeat, 2 * 1024 * 1024),
        "a 2 MiB frame after welcome",
    );

    // The bystander was never disturbed, and a new runner is welcomed as usual.
    bystander.send_text(&padded(heartbeat, 100));
    assert_eq!(bystander.next_text(WAIT), HEARTBEAT_ACK_FRAME);
    let mut late = connect(&tenant, "ana");
    late.send_text(&RawRunner::hello("late", RunnerKind::Local));
    welcomed(&mut late);
    let listed = stack().client("bea", &tenant).get("/v1/runners");
    assert_eq!(listed.status, 200, "{listed}");
    let runners = listed.json()["runners"].clone();
    let connected = |name: &str| {
        runners
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["name"] == name && r["connected"] == true)
    };
    assert!(connected("bystander") && connected("late"), "{runners}");
    assert!(stack().healthz_ok());
}

#[test]
fn runner_sockets_per_owner_are_bounded() {
    let _guard = stack().guard();
    let tenant = unique_name("sockets");
    const PER_OWNER: usize = 32;
    let token = stack().runner_token("ana", &tenant);
    let mut open: Vec<RawRunner> = (0..PER_OWNER)
        .map(|i| {
            RawRunner::connect(&stack().base_url(), &token)
                .unwrap_or_else(|e| panic!("socket {i} of {PER_OWNER}: {e}"))
        })
        .collect();
    match RawRunner::connect(&stack().base_url(), &token) {
        Err(e) => match *e {
            tungstenite::Error::Http(ref response) => {
                assert_eq!(response.status().as_u16(), 429, "{e}")
            }
            other => panic!("expected HTTP 429, got {other}"),
        },
        Ok(_) => panic!("socket {} of one owner was accepted", PER_OWNER + 1),
    }
    // Another owner in the same tenant is not affected.
    let mut other = connect(&tenant, "bea");
    other.send_text(&RawRunner::hello("bea-1", RunnerKind::Local));
    welcomed(&mut other);
    // A closed socket frees its place.
    open.pop().expect("one").close();
    let again = wuhu_e2e::wait_for("a place after a close", WAIT, || {
        RawRunner::connect(&stack().base_url(), &token).ok()
    });
    drop(again);
}

/// Connects as `sub` (retrying while the owner's socket cap is full of closing sockets), says
/// hello as `name`, and returns the answer and the connection.
fn say_hello(tenant: &str, sub: &str, name: &str) -> (ServerMessage, RawRunner) {
    let token = stack().runner_token(sub, tenant);
    let mut raw = wuhu_e2e::wait_for("a runner socket", WAIT, || {
        RawRunner::connect(&stack().base_url(), &token).ok()
    });
    raw.send_text(&RawRunner::hello(name, RunnerKind::Local));
    (raw.next_message(WAIT), raw)
}

/// Registers `sub`'s runner `name` (welcome, then close): one stored name.
#[track_caller]
fn register(tenant: &str, sub: &str, name: &str) {
    let (answer, raw) = say_hello(tenant, sub, name);
    assert!(
        matches!(answer, ServerMessage::Welcome { .. }),
        "{sub}/{name}: {answer:?}"
    );
    raw.close();
}

/// Says hello as `name` and asserts a `too_many_runners` refusal mentioning `cap`, in the frame
/// and the close.
#[track_caller]
fn assert_refused_for_names(tenant: &str, sub: &str, name: &str, cap: &str) {
    let (answer, mut raw) = say_hello(tenant, sub, name);
    match &answer {
        ServerMessage::Refused { code, message } => {
            assert_eq!(code, "too_many_runners", "{answer:?}");
            assert!(
                message.contains(cap) && message.contains("DELETE /v1/runners/"),
                "{message}"
            );
        }
        other => panic!("{sub}/{name} past the cap was not refused: {other:?}"),
    }
    let (code, reason) = raw
        .next_close(WAIT)
        .expect("the hub closes the refused connection");
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.starts_with("too_many_runners: "), "{reason}");
}

fn delete(api: &wuhu_e2e::Api, path: &str) -> wuhu_e2e::http::Response {
    api.send(api.request("DELETE", path))
}

fn listed_names(tenant: &str) -> Vec<(String, String)> {
    let listed = stack().client("lister", tenant).get("/v1/runners");
    assert_eq!(listed.status, 200, "{listed}");
    listed.json()["runners"]
        .as_array()
        .expect("runners")
        .iter()
        .map(|r| {
            (
                r["owner"].as_str().unwrap_or_default().to_string(),
                r["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn runner_names_are_capped_per_owner_and_a_freed_name_makes_room() {
    let _guard = stack().guard();
    let _timing = timing();
    let tenant = unique_name("names");
    let started = Instant::now();
    for i in 0..MAX_RUNNER_ROWS_PER_OWNER {
        register(&tenant, "ana", &format!("n{i}"));
    }
    eprintln!(
        "runner_limits: {MAX_RUNNER_ROWS_PER_OWNER} names in {:?}",
        started.elapsed()
    );
    assert_eq!(listed_names(&tenant).len(), MAX_RUNNER_ROWS_PER_OWNER);
    // One more name: refused, in the frame and the close reason.
    assert_refused_for_names(&tenant, "ana", "one-more", "64 runner names");
    // A name she holds is always welcomed (no new row); another owner is not limited by hers.
    register(&tenant, "ana", "n7");
    register(&tenant, "bea", "bea-1");
    // The runner binary stops (exit 2) and prints why.
    let mut binary = Runner::spawn(RunnerConfig::new(stack(), "ana", &tenant, "binary"));
    let status = binary
        .wait_exit(WAIT)
        .unwrap_or_else(|| panic!("the runner kept trying:\n{}", binary.log_tail(20)));
    assert_eq!(status.code(), Some(2), "{}", binary.log_tail(20));
    assert!(
        binary.log().contains("64 runner names"),
        "{}",
        binary.log_tail(20)
    );
    let names = listed_names(&tenant);
    assert_eq!(names.len(), MAX_RUNNER_ROWS_PER_OWNER + 1, "{names:?}");
    assert!(!names.iter().any(|(_, n)| n == "one-more" || n == "binary"));
    // Freeing one of her names makes room for exactly one new one.
    let ana = stack().client("ana", &tenant);
    let freed = delete(&ana, "/v1/runners/ana/n0");
    assert_eq!(freed.status, 204, "{freed}");
    register(&tenant, "ana", "one-more");
    assert_refused_for_names(&tenant, "ana", "two-more", "64 runner names");
}

#[test]
fn runner_names_are_capped_per_tenant() {
    let _guard = stack().guard();
    let _timing = timing();
    let tenant = unique_name("tenant-names");
    let owners = MAX_RUNNER_ROWS_PER_TENANT / MAX_RUNNER_ROWS_PER_OWNER;
    assert_eq!(
        owners * MAX_RUNNER_ROWS_PER_OWNER,
        MAX_RUNNER_ROWS_PER_TENANT
    );
    let started = Instant::now();
    // Four threads, each registering the names of its owners in turn.
    std::thread::scope(|scope| {
        for t in 0..4 {
            let tenant = &tenant;
            scope.spawn(move || {
                for o in (t..owners).step_by(4) {
                    for i in 0..MAX_RUNNER_ROWS_PER_OWNER {
                        register(tenant, &format!("u{o}"), &format!("u{o}-{i}"));
                    }
                }
            });
        }
    });
    eprintln!(
        "runner_limits: {MAX_RUNNER_ROWS_PER_TENANT} names in {:?}",
        started.elapsed()
    );
    assert_eq!(listed_names(&tenant).len(), MAX_RUNNER_ROWS_PER_TENANT);
    // A new owner's first name: refused for the tenant's cap; a held name is still welcomed.
    assert_refused_for_names(&tenant, "newcomer", "first", "1024 runner names");
    register(&tenant, "u3", "u3-5");
    // An admin frees one name of someone else's; the newcomer gets it.
    let admin = stack().admin_client("root", &tenant);
    let freed = delete(&admin, "/v1/runners/u3/u3-5");
    assert_eq!(freed.status, 204, "{freed}");
    register(&tenant, "newcomer", "first");
    assert_refused_for_names(&tenant, "newcomer", "second", "1024 runner names");
}

#[test]
fn environment_definitions_are_capped_per_owner_and_tenant() {
    let _guard = stack().guard();
    let _timing = timing();
    let tenant = unique_name("defs");
    let define = |sub: &str, name: &str| {
        stack().client(sub, &tenant).post(
            "/v1/environments",
            &json!({"name": name, "kind": "folder-template", "templatePath": "/srv/templates/py"}),
        )
    };
    let owners = MAX_DEFINITIONS_PER_TENANT / MAX_DEFINITIONS_PER_OWNER;
    assert_eq!(
        owners * MAX_DEFINITIONS_PER_OWNER,
        MAX_DEFINITIONS_PER_TENANT
    );
    let started = Instant::now();
    std::thread::scope(|scope| {
        for o in 0..owners {
            let define = &define;
            scope.spawn(move || {
                for i in 0..MAX_DEFINITIONS_PER_OWNER {
                    let created = define(&format!("u{o}"), &format!("u{o}-{i}"));
                    assert_eq!(created.status, 201, "{created}");
                }
            });
        }
    });
    eprintln!(
        "runner_limits: {MAX_DEFINITIONS_PER_TENANT} definitions in {:?}",
        started.elapsed()
    );
    let refused = |response: &wuhu_e2e::http::Response, cap: &str| {
        assert_eq!(response.status, 409, "{response}");
        let error = &response.json()["error"];
        assert_eq!(error["code"], "too_many_environments", "{response}");
        assert!(
            error["message"].as_str().unwrap_or_default().contains(cap),
            "{response}"
        );
    };
    // Owner u0 is at 100: refused for the owner's cap; a newcomer for the tenant's.
    refused(&define("u0", "extra"), "100 environment definitions");
    refused(&define("newcomer", "extra"), "500 environment definitions");
    let listed = stack().client("u1", &tenant).get("/v1/environments");
    assert_eq!(listed.status, 200, "{listed}");
    assert_eq!(
        listed.json()["environments"].as_array().map(Vec::len),
        Some(MAX_DEFINITIONS_PER_TENANT)
    );
    // A PATCH adds nothing and is not refused.
    let u0 = stack().client("u0", &tenant);
    let renamed = u0.patch("/v1/environments/u0-1", &json!({"name": "u0-renamed"}));
    assert_eq!(renamed.status, 200, "{renamed}");
    // Deleting one makes room for one.
    let deleted = delete(&u0, "/v1/environments/u0-0");
    assert_eq!(deleted.status, 204, "{deleted}");
    let created = define("u0", "extra");
    assert_eq!(created.status, 201, "{created}");
    refused(&define("u0", "extra-2"), "100 environment definitions");
}

/// Issue 30: a runner socket that breaks the frame bound before `hello` is closed within a
/// second of the frame's arrival, however the frame is sent: whole, or as a message of many
/// fragments (the runtime hands the hub whole messages only, so a message over the bound must
/// not sit in it unseen).
#[test]
fn a_frame_over_the_bound_before_hello_is_closed_within_a_second_whole_or_in_fragments() {
    let _guard = stack().guard();
    let _timing = timing();
    let tenant = unique_name("fragments");
    let hello = RawRunner::hello("big", RunnerKind::Local);
    let big = padded(&hello, 15 * 1024 * 1024);
    for (what, chunk, pause) in [
        ("whole", usize::MAX, Duration::ZERO),
        ("in 64 KiB fragments", 64 * 1024, Duration::ZERO),
        (
            "in 1 MiB fragments, 100 ms apart",
            1024 * 1024,
            Duration::from_millis(100),
        ),
    ] {
        let mut raw = connect(&tenant, "ana");
        let started = Instant::now();
        let sent = raw.try_send_fragmented(&big, chunk, pause);
        let written = started.elapsed();
        let closed = raw.wait_closed(WAIT);
        let after_write = started.elapsed().saturating_sub(written);
        eprintln!(
            "runner_limits: 15 MiB {what}: written {written:?} ({sent:?}), closed {closed:?} {after_write:?} after the write ended"
        );
        let closed = closed.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            after_write <= Duration::from_secs(1),
            "{what}: closed {after_write:?} after the last byte was written"
        );
        if let Some((code, _)) = closed {
            assert!(code == 1009 || code == 1008, "{what}: close code {code}");
        }
    }
}
