//! Bounded runner connections: frames over 8 KiB before `welcome` and over 1 MiB after close the
//! socket at once (never parsed), exactly at each bound they are served; anything but `hello`
//! before welcome is refused; runner sockets per owner are bounded; and the hub keeps serving
//! every other runner throughout.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::runner::{
    HEARTBEAT_ACK_FRAME, MAX_FRAME_BYTES, MAX_FRAME_BYTES_BEFORE_WELCOME, RunnerKind, ServerMessage,
};
use wuhu_e2e::runner::RawRunner;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, StackOptions};

const WAIT: Duration = Duration::from_secs(15);
/// "At once": the close arrives this soon after the frame was sent.
const PROMPT: Duration = Duration::from_secs(3);

fn stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        Stack::start_with(StackOptions {
            fake_delay_ms: Some(0),
            ..StackOptions::default()
        })
    })
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
