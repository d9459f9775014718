//! Cancellation that cancels: `/stop` ends a command running on a runner (its whole process
//! group) within a second; a stopped `sleep 6; touch marker` never touches its marker; after a
//! wrangler restart mid-command the command is gone, and the restarted session sends `cancel`
//! for the call its dead step left running; runner failures reach the model as distinct,
//! actionable messages.
//!
//! One shared `wrangler dev` for most tests (each with its own tenant, runners and temp dirs);
//! the restart test has a stack of its own.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::runner::{RunnerMessage, ServerMessage, encode_frame};
use wuhu_core::wire::{ToolResult, runner::MAX_TOOL_RESULT_CONTENT_BYTES};
use wuhu_e2e::entries::{describe, tool_result};
use wuhu_e2e::runner::{RawRunner, Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack, StackOptions, wait_for, wait_until};

const TURN: Duration = Duration::from_secs(60);
const FRAME_WAIT: Duration = Duration::from_secs(20);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// Whether `pid` is a live process (a zombie counts as gone: it no longer runs).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// SIGKILLs a PID the test caused to exist, when dropped (cleanup if an assertion fails).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            // SAFETY: kill(2) on a PID; no memory is touched.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
            }
        }
    }
}

/// Reads a PID the command wrote (atomically, by rename) to `path`.
/// The PID `path` holds, as this machine knows it: commands run in cells with PID namespaces
/// of their own; the cell's directory is the file's.
fn read_pid(path: &Path) -> Option<i32> {
    let in_cell = std::fs::read_to_string(path)
        .ok()
        .and_then(|p| p.trim().parse().ok())?;
    wuhu_e2e::util::host_pid(in_cell, path.parent()?)
}

/// Shell that writes `$$` to `path` atomically.
fn write_pid(path: &Path) -> String {
    format!("echo $$ > {0}.tmp && mv {0}.tmp {0}", path.display())
}

/// A tenant with user `ana`, a temp dir, and a session with environment `api` attached from a
/// real runner `mac`.
struct World {
    tenant: String,
    api: Api,
    dir: TempDir,
}

impl World {
    fn new(stack: &Stack, prefix: &str) -> World {
        let tenant = unique_name(prefix);
        World {
            api: stack.client("ana", &tenant),
            dir: TempDir::new(&format!("wuhu-e2e-{prefix}")),
            tenant,
        }
    }

    fn runner(&self, stack: &Stack, name: &str) -> Runner {
        let root = self.dir.mkdir("api");
        Runner::start(
            RunnerConfig::new(stack, "ana", &self.tenant, name)
                .workspaces_root(self.dir.mkdir(&format!("workspaces-{name}")))
                .env("api", root),
        )
    }

    /// A fresh fake-provider session with `api` attached.
    #[track_caller]
    fn session_with_api(&self) -> String {
        let session = self.api.create_fake_session().id;
        let attached = run_tool(
            &self.api,
            &session,
            "request_environment",
            json!({"spec": "api"}),
        );
        assert!(!attached.is_error, "attach failed: {}", attached.content);
        session
    }

    /// A path in the environment's root (where its commands' cells may write).
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("api").join(name)
    }
}

#[track_caller]
fn run_tool(api: &Api, session: &str, name: &str, arguments: Value) -> ToolResult {
    let turn = ToolTurn::start(api, session, &[(name, arguments)]);
    turn.finish(api, TURN).0.pop().expect("one result")
}

/// The result of the turn's only call, once it is in the transcript.
#[track_caller]
fn result_of(api: &Api, session: &str, turn: &ToolTurn) -> ToolResult {
    let entries = api.wait_transcript(session, "the tool result", TURN, |entries| {
        turn.call_ids(entries).is_some_and(|ids| {
            ids.iter().all(|id| {
                entries
                    .iter()
                    .any(|e| tool_result(e).is_some_and(|r| r.tool_call_id == *id))
            })
        })
    });
    let ids = turn.call_ids(&entries).expect("call ids");
    entries
        .iter()
        .filter_map(tool_result)
        .find(|r| r.tool_call_id == ids[0])
        .cloned()
        .unwrap_or_else(|| panic!("no result:\n{}", describe(&entries)))
}

#[test]
fn stop_kills_a_running_command_and_its_whole_process_group_within_a_second() {
    let _guard = stack().guard();
    let world = World::new(stack(), "stop");
    let _mac = world.runner(stack(), "mac");
    let session = world.session_with_api();
    let api = &world.api;

    // The command leaves a background child in its group, then becomes `sleep 600` itself.
    let leader_file = world.path("leader.pid");
    let child_file = world.path("child.pid");
    let command = format!(
        "sleep 600 & echo $! > {0}.tmp && mv {0}.tmp {0}; {1}; exec sleep 600",
        child_file.display(),
        write_pid(&leader_file)
    );
    let turn = ToolTurn::start(api, &session, &[("bash", json!({"command": command}))]);
    let (leader, child) = wait_for("the command to be running", TURN, || {
        Some((read_pid(&leader_file)?, read_pid(&child_file)?))
    });
    let _cleanup = (KillOnDrop(leader), KillOnDrop(child));
    assert!(alive(leader) && alive(child));

    let stopped = Instant::now();
    let response = api.stop(&session);
    assert_eq!(response.stopped_tool_calls, 1, "{response:?}");
    let gone = wait_until(Duration::from_secs(5), || {
        (!alive(leader) && !alive(child)).then(Instant::now)
    });
    let elapsed = gone.map(|t| t.duration_since(stopped));
    eprintln!("cancellation: process group gone {elapsed:?} after /stop was sent");
    let elapsed = elapsed.unwrap_or_else(|_| {
        panic!(
            "the command survived /stop by 5 s (leader alive: {}, child alive: {})",
            alive(leader),
            alive(child)
        )
    });
    assert!(
        elapsed <= Duration::from_secs(1),
        "the command ran {elapsed:?} past /stop (limit 1 s)"
    );
    let result = result_of(api, &session, &turn);
    assert!(
        result.is_error && result.content.contains("stopped"),
        "{}",
        result.content
    );

    // The runner serves the next turn as usual.
    let next = run_tool(api, &session, "bash", json!({"command": "echo after-stop"}));
    assert!(!next.is_error, "{}", next.content);
    assert!(next.content.contains("after-stop"), "{}", next.content);
}

#[test]
fn a_stopped_command_never_finishes_its_work() {
    let _guard = stack().guard();
    let world = World::new(stack(), "marker");
    let _mac = world.runner(stack(), "mac");
    let session = world.session_with_api();
    let api = &world.api;

    let pid_file = world.path("marker.pid");
    let marker = world.path("marker");
    let command = format!(
        "{}; sleep 6; touch {}",
        write_pid(&pid_file),
        marker.display()
    );
    let _turn = ToolTurn::start(api, &session, &[("bash", json!({"command": command}))]);
    let pid = wait_for("the command to be running", TURN, || read_pid(&pid_file));
    let _cleanup = KillOnDrop(pid);
    let started = Instant::now();
    // The scenario: stopped one second into its six.
    std::thread::sleep(Duration::from_secs(1).saturating_sub(started.elapsed()));
    api.stop(&session);
    let stopped = Instant::now();
    // Proving a negative: watch until well past the moment the marker would have appeared.
    let watch_until = stopped + Duration::from_secs(9);
    while Instant::now() < watch_until {
        assert!(
            !marker.exists(),
            "the marker appeared {:?} after /stop: the command kept running",
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(pid), "the command is still running after /stop");
}

/// Serves `attach` of environment `name` at `root` on a raw runner connection.
#[track_caller]
fn answer_attach(raw: &mut RawRunner, root: &Path) {
    raw.answer_attach(root, FRAME_WAIT);
}

/// The next request frame (heartbeat acks skipped).
#[track_caller]
fn next_request(raw: &mut RawRunner) -> ServerMessage {
    raw.next_request(FRAME_WAIT)
}

/// A raw runner `name` offering environment `env` at `root`, welcomed.
#[track_caller]
fn raw_runner(stack: &Stack, tenant: &str, name: &str, env: &str, root: &Path) -> RawRunner {
    RawRunner::welcomed(stack, "ana", tenant, (name, env, root), FRAME_WAIT)
}

/// A session with environment `env` attached from the raw runner (answered by this thread).
#[track_caller]
fn session_on_raw(api: &Api, raw: &mut RawRunner, env: &str, root: &Path) -> String {
    let session = api.create_fake_session().id;
    let turn = ToolTurn::start(
        api,
        &session,
        &[("request_environment", json!({"spec": env}))],
    );
    answer_attach(raw, root);
    let (results, _) = turn.finish(api, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    session
}

#[test]
fn after_a_wrangler_restart_mid_command_the_command_is_gone_and_its_call_is_cancelled() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let world = World::new(&stack, "restart");
    let api = &world.api;

    // A real runner with a command that would touch a marker after 6 s.
    let _mac = world.runner(&stack, "mac");
    let real_session = world.session_with_api();
    let pid_file = world.path("restart.pid");
    let marker = world.path("restart-marker");
    let command = format!(
        "{}; sleep 6; touch {}",
        write_pid(&pid_file),
        marker.display()
    );
    ToolTurn::start(api, &real_session, &[("bash", json!({"command": command}))]);
    let pid = wait_for("the command to be running", TURN, || read_pid(&pid_file));
    let _cleanup = KillOnDrop(pid);
    let started = Instant::now();

    // A raw runner holding a call the hub never sees answered.
    let raw_root = world.dir.mkdir("raw-root");
    let mut raw = raw_runner(&stack, &world.tenant, "raw", "held", &raw_root);
    let raw_session = session_on_raw(api, &mut raw, "held", &raw_root);
    ToolTurn::start(
        api,
        &raw_session,
        &[("bash", json!({"command": "sleep 600"}))],
    );
    let ServerMessage::ToolCall { id: held, .. } = next_request(&mut raw) else {
        panic!("expected the tool call");
    };

    stack.restart_killed();
    let api = stack.client("ana", &world.tenant);

    // The restarted session is woken before the raw runner is back (an alarm may wake it as
    // early): it tries to cancel the call its dead step left running, finds the runner not
    // connected, and tries again; the runner comes back (same name) and gets the cancel,
    // although no one waits for it.
    let woken = Instant::now();
    let page = api.session(&raw_session);
    let mut raw = raw_runner(&stack, &world.tenant, "raw", "held", &raw_root);
    let cancelled = loop {
        match next_request(&mut raw) {
            ServerMessage::Cancel { id } => break id,
            ServerMessage::ToolCall { id, .. } => {
                panic!("the restarted session sent a new call {id} before cancelling {held}")
            }
            _ => continue,
        }
    };
    eprintln!(
        "cancellation: cancel {cancelled} reached the reconnected runner {:?} after the session woke",
        woken.elapsed()
    );
    assert_eq!(cancelled, held, "session page: {page:?}");

    // The real runner lost its connection with the restart and killed what it ran.
    wait_for("the command to be gone after the restart", TURN, || {
        (!alive(pid)).then_some(())
    });
    let watch_until = started + Duration::from_secs(9);
    while Instant::now() < watch_until {
        assert!(!marker.exists(), "the marker appeared after the restart");
        std::thread::sleep(Duration::from_millis(100));
    }
    let entries = api.transcript(&real_session);
    assert!(
        entries
            .iter()
            .filter_map(tool_result)
            .any(|r| r.is_error && r.content.contains("lost")),
        "{}",
        describe(&entries)
    );
}

#[test]
fn runner_failures_reach_the_model_as_distinct_actionable_messages() {
    let _guard = stack().guard();
    let world = World::new(stack(), "failures");
    let api = &world.api;
    let root = world.dir.mkdir("raw-root");
    let mut raw = raw_runner(stack(), &world.tenant, "raw", "api", &root);
    let session = session_on_raw(api, &mut raw, "api", &root);

    // Refused: the runner answers the call with an error frame.
    let turn = ToolTurn::start(api, &session, &[("bash", json!({"command": "true"}))]);
    let ServerMessage::ToolCall { id, .. } = next_request(&mut raw) else {
        panic!("expected a tool call");
    };
    raw.send_text(&encode_frame(&RunnerMessage::Error {
        id: Some(id),
        code: "unknown_tool".into(),
        message: "this runner has no such tool".into(),
    }));
    let refused = turn.finish(api, TURN).0.remove(0);

    // An oversized result is cut to the protocol's bound before it reaches the session.
    let turn = ToolTurn::start(api, &session, &[("bash", json!({"command": "true"}))]);
    let ServerMessage::ToolCall { id, .. } = next_request(&mut raw) else {
        panic!("expected a tool call");
    };
    let sent = 4 * MAX_TOOL_RESULT_CONTENT_BYTES;
    raw.send_text(&encode_frame(&RunnerMessage::ToolResult {
        id,
        content: "y".repeat(sent),
        is_error: false,
        details: Some(json!({"pad": "z".repeat(20_000)})),
        blobs: Vec::new(),
    }));
    let big = turn.finish(api, TURN).0.remove(0);
    assert!(
        big.content.len() <= MAX_TOOL_RESULT_CONTENT_BYTES
            && big
                .content
                .contains(&format!("[The runner sent {sent} bytes")),
        "{} bytes: {}",
        big.content.len(),
        &big.content[big.content.len().saturating_sub(200)..]
    );

    // Timed out: the runner never answers; the hub gives up and cancels the call on it.
    let turn = ToolTurn::start(
        api,
        &session,
        &[("bash", json!({"command": "sleep 600", "timeout": 0.001}))],
    );
    let ServerMessage::ToolCall { id, .. } = next_request(&mut raw) else {
        panic!("expected a tool call");
    };
    match next_request(&mut raw) {
        ServerMessage::Cancel { id: cancelled } => assert_eq!(cancelled, id),
        other => panic!("expected cancel after the timeout, got {other:?}"),
    }
    let timed_out = turn.finish(api, TURN).0.remove(0);

    // Disconnected mid-call: the connection drops while the call waits.
    let turn = ToolTurn::start(api, &session, &[("bash", json!({"command": "sleep 600"}))]);
    let ServerMessage::ToolCall { .. } = next_request(&mut raw) else {
        panic!("expected a tool call");
    };
    raw.close();
    let disconnected = turn.finish(api, TURN).0.remove(0);

    // Not connected: nothing runs.
    let not_connected = run_tool(api, &session, "bash", json!({"command": "true"}));

    let cases = [
        ("refused", &refused, "refused the call (unknown_tool)"),
        (
            "timed out",
            &timed_out,
            "No answer from runner \"raw\" in time",
        ),
        (
            "disconnected",
            &disconnected,
            "was interrupted: runner \"raw\" disconnected while the call was running",
        ),
        (
            "not connected",
            &not_connected,
            "is not connected, so nothing ran",
        ),
    ];
    for (what, result, fragment) in &cases {
        eprintln!("cancellation: {what}: {}", result.content);
        assert!(result.is_error, "{what}: {}", result.content);
        assert!(
            result.content.contains(fragment),
            "{what} lacks {fragment:?}: {}",
            result.content
        );
        for (other, _, other_fragment) in &cases {
            if other != what {
                assert!(
                    !result.content.contains(other_fragment),
                    "{what} reads like {other}: {}",
                    result.content
                );
            }
        }
    }
}
