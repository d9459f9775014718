//! The concurrency gate survives a restart of the server (issue 12, `docs/orchestration.md`):
//! with `WUHU_MAX_RUNNING_SESSIONS=1`, a child that holds the tenant's only slot still holds
//! it after `wrangler dev` is SIGKILLed and started again on the same state, so a spawn after
//! the restart waits in line (a gate that forgot its slots would let it run at once).

use std::time::Duration;

use serde_json::json;
use wuhu_core::wire::Status;
use wuhu_e2e::entries::{describe, fake_directive, tool_result};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, StackOptions};

const TURN: Duration = Duration::from_secs(120);

/// A message whose fake reply calls `spawn_session` with `task` and then says `after`.
fn spawn_then(task: &str, title: &str, after: &str) -> String {
    fake_directive(&json!({
        "toolCalls": [{"name": "spawn_session", "arguments": {"task": task, "title": title}}],
        "afterTools": after,
    }))
}

/// The results of the parent's `spawn_session` calls, in order.
fn spawn_results(api: &wuhu_e2e::Api, parent: &str) -> Vec<String> {
    api.transcript(parent)
        .iter()
        .filter_map(tool_result)
        .filter(|r| r.tool_name == "spawn_session")
        .map(|r| r.content.clone())
        .collect()
}

#[test]
fn a_slot_held_before_a_restart_is_still_held_after_it() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_MAX_RUNNING_SESSIONS".into(), "1".into())],
        ..StackOptions::default()
    });
    let tenant = unique_name("orch-gate-restart");
    let api = stack.client("ana", &tenant);
    let parent = api.create_fake_session().id;
    // The first child streams for a long time: it holds the slot across the restart.
    let long = fake_directive(&json!({
        "reply": "one two three four five six seven eight nine ten eleven twelve",
        "chunks": 12,
        "delayMs": 5000
    }));
    api.enqueue(
        &parent,
        "followUp",
        &spawn_then(&long, "holder", "spawned the holder"),
    );
    api.wait_transcript(&parent, "the holder's spawn", TURN, |_| {
        spawn_results(&api, &parent).len() == 1
    });
    let first = spawn_results(&api, &parent).remove(0);
    assert!(!first.contains("waits for a slot"), "{first}");
    api.wait_idle(&parent, TURN);
    let holder = api.session(&parent).children[0].id.clone();
    assert_eq!(api.session(&holder).session.status, Status::Running);

    stack.restart_killed();
    let api = stack.client("ana", &tenant);

    // After the restart the slot is still taken: the next spawn waits in line.
    let short = fake_directive(&json!({"reply": "short"}));
    api.enqueue(
        &parent,
        "followUp",
        &spawn_then(&short, "second", "spawned the second"),
    );
    api.wait_transcript(&parent, "the second spawn", TURN, |_| {
        spawn_results(&api, &parent).len() == 2
    });
    let second = spawn_results(&api, &parent).remove(1);
    assert!(
        second.contains("waits for a slot: place 1")
            && second.contains("limit 1, WUHU_MAX_RUNNING_SESSIONS"),
        "{second}\n{}",
        describe(&api.transcript(&parent))
    );
    // Stopping the parent stops the holder (the cascade) before it answers.
    api.stop(&parent);
    assert_eq!(api.session(&holder).session.status, Status::Stopped);
}
