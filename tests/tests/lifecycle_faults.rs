//! A child's end survives a crash at any point of it (issue 35, decision 0041,
//! `docs/orchestration.md`): the server (`wrangler dev`) is SIGKILLed while three children stand
//! at the same point of their end, and started again on the same state:
//!
//! - before the commit of their settling (the turn runs again after the restart);
//! - after the commit, before anything was delivered (the outbox delivers it);
//! - after the parent committed the report, before the child took the acknowledgement (it is
//!   delivered again, and the parent takes it once);
//! - after the parent was told, before the gate slot was released.
//!
//! Each time: the parent's `wait_sessions`, running across the restart, returns with the three
//! children idle; the parent got exactly one `wuhu_child_status_v1` message per child; and the
//! tenant's gate (`WUHU_MAX_RUNNING_SESSIONS=3`) has all its slots back within the bound (three
//! new children run).
//!
//! The points are reached through `WUHU_FAULT_LIFECYCLE` (test-only; unset in any deployment):
//! a child's actor that reaches the named point logs a `fault_point` line and stops there, as if
//! its isolate were lost; the test kills the server when the three lines are in its log.
//!
//! Also: a release that is lost for good (`WUHU_FAULT_LIFECYCLE=lose_release`) is made good by
//! the gate's reconciliation, so a spawn waiting behind it runs within the bound.
//!
//! Each test starts its own `wrangler dev` (it restarts it, or needs a variable of its own).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::orchestration::LOST_RELEASE_BOUND_MS;
use wuhu_core::wire::{ChildLifecycle, ChildStatus, Entry, EntryPayload, Message, custom_types};
use wuhu_e2e::entries::{assistant, describe, fake_directive, tool_result};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(120);
const FAULT_VAR: &str = "WUHU_FAULT_LIFECYCLE";

/// The bound on a slot's return, with room for the spawns and turns that show it.
fn slots_back_within() -> Duration {
    Duration::from_millis(LOST_RELEASE_BOUND_MS) + Duration::from_secs(30)
}

/// A message whose fake reply calls `calls` and then says `after`.
fn calls_then(calls: &[(&str, Value)], after: &str) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
        .collect();
    fake_directive(&json!({"toolCalls": calls, "afterTools": after}))
}

/// `spawn_session` calls for children answering `"<prefix> <i> done"` at once.
fn spawns(prefix: &str, n: usize) -> Vec<(&'static str, Value)> {
    (0..n)
        .map(|i| {
            let task = fake_directive(&json!({"reply": format!("{prefix} {i} done")}));
            (
                "spawn_session",
                json!({"task": task, "title": format!("{prefix}{i}")}),
            )
        })
        .collect()
}

/// The `wuhu_child_status_v1` messages of a transcript, by child id: the states it was told.
fn child_messages(entries: &[Entry]) -> BTreeMap<String, Vec<String>> {
    let mut by_child: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in entries {
        if let EntryPayload::Message {
            message:
                Message::CustomMessage {
                    custom_type,
                    details: Some(details),
                    ..
                },
        } = &entry.payload
            && custom_type == custom_types::CHILD_STATUS
        {
            let status: ChildStatus = serde_json::from_value(details.clone()).unwrap();
            by_child
                .entry(status.id)
                .or_default()
                .push(status.lifecycle.name().to_string());
        }
    }
    by_child
}

fn fault_lines(stack: &Stack, point: &str) -> usize {
    stack
        .log_events()
        .iter()
        .filter(|e| e["event"] == "fault_point" && e["point"] == point)
        .count()
}

/// The children `parent` recorded whose title starts with `prefix`.
fn children_titled(api: &Api, parent: &str, prefix: &str) -> Vec<ChildStatus> {
    api.session(parent)
        .children
        .into_iter()
        .filter(|c| c.title.as_deref().is_some_and(|t| t.starts_with(prefix)))
        .collect()
}

/// Three children end; the server is killed while all three stand at `point`; after the
/// restart nothing of their ends is lost or doubled, and the gate's slots are back.
fn three_children_survive_a_crash_at(point: &str) {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![
            ("WUHU_MAX_RUNNING_SESSIONS".into(), "3".into()),
            (FAULT_VAR.into(), point.into()),
        ],
        ..StackOptions::default()
    });
    let tenant = unique_name(&format!("life-{}", point.replace('_', "-")));
    let api = stack.client("ana", &tenant);
    let parent = api.create_fake_session().id;
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(&spawns("old", 3), "spawned three"),
    );
    let ids: Vec<String> = wait_for("three children recorded", TURN, || {
        let kids = children_titled(&api, &parent, "old");
        (kids.len() == 3).then(|| kids.into_iter().map(|c| c.id).collect())
    });
    api.wait_transcript(&parent, "the spawn turn's end", TURN, |e| {
        e.iter()
            .any(|e| assistant(e).is_some_and(|m| m.text() == "spawned three"))
    });
    // The parent waits for them: the wait runs across the restart (it may be over before it,
    // when the reports arrived before the crash point).
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(
            &[("wait_sessions", json!({"ids": ids, "timeoutSeconds": 600}))],
            "waited",
        ),
    );
    wait_for(&format!("three children at {point}"), TURN, || {
        (fault_lines(&stack, point) >= 3).then_some(())
    });

    stack.set_var(FAULT_VAR, None);
    stack.restart_killed();
    let api = stack.client("ana", &tenant);

    // `wait_sessions` returns, with the three idle.
    let entries = api.wait_transcript(&parent, "the wait's end", TURN, |e| {
        e.iter()
            .any(|e| assistant(e).is_some_and(|m| m.text() == "waited"))
    });
    let text = describe(&entries);
    let waited = entries
        .iter()
        .filter_map(tool_result)
        .find(|r| r.tool_name == "wait_sessions")
        .unwrap_or_else(|| panic!("no wait_sessions result:\n{text}"));
    assert!(!waited.is_error, "{}", waited.content);
    for i in 0..3 {
        assert!(
            waited
                .content
                .contains(&format!("idle. Final message:\nold {i} done")),
            "{}",
            waited.content
        );
    }
    api.wait_idle(&parent, TURN);

    // The gate has its three slots back: three new children run (they would wait for a slot a
    // lost release kept until the gate's reconciliation freed it, within the bound).
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(&spawns("new", 3), "spawned three more"),
    );
    wait_for("the three new children idle", slots_back_within(), || {
        let kids = children_titled(&api, &parent, "new");
        (kids.len() == 3
            && kids
                .iter()
                .all(|c| matches!(c.lifecycle, ChildLifecycle::Idle { .. })))
        .then_some(())
    });
    api.wait_idle(&parent, TURN);

    // Each child's end woke the parent exactly once.
    let entries = api.transcript(&parent);
    let text = describe(&entries);
    let told = child_messages(&entries);
    for id in &ids {
        assert_eq!(
            told.get(id).map(Vec::as_slice),
            Some(&["idle".to_string()][..]),
            "child {id} at {point}: {told:?}\n{text}"
        );
    }
    assert_eq!(told.len(), 6, "{told:?}\n{text}");
    assert!(
        told.values().all(|states| states.len() == 1),
        "{told:?}\n{text}"
    );
}

#[test]
fn a_crash_before_the_commit_loses_no_childs_end() {
    three_children_survive_a_crash_at("before_commit");
}

#[test]
fn a_crash_after_the_commit_before_delivery_loses_no_childs_end() {
    three_children_survive_a_crash_at("after_commit");
}

#[test]
fn a_crash_after_delivery_before_the_ack_wakes_the_parent_once() {
    three_children_survive_a_crash_at("after_delivery");
}

#[test]
fn a_crash_before_the_gate_release_keeps_no_slot() {
    three_children_survive_a_crash_at("before_release");
}

#[test]
fn a_release_lost_for_good_is_reconciled_within_the_bound() {
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![
            ("WUHU_MAX_RUNNING_SESSIONS".into(), "1".into()),
            (FAULT_VAR.into(), "lose_release".into()),
        ],
        ..StackOptions::default()
    });
    let tenant = unique_name("life-lost-release");
    let api = stack.client("ana", &tenant);
    let parent = api.create_fake_session().id;
    // The first child runs and ends; its release never reaches the gate.
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(&spawns("a", 1), "spawned a"),
    );
    let first = wait_for("the first child idle", TURN, || {
        let kids = children_titled(&api, &parent, "a");
        kids.into_iter()
            .find(|c| matches!(c.lifecycle, ChildLifecycle::Idle { .. }))
    });
    api.wait_idle(&parent, TURN);
    // The second waits for the slot the first still holds at the gate ...
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(&spawns("b", 1), "spawned b"),
    );
    let entries = api.wait_transcript(&parent, "the second spawn", TURN, |e| {
        e.iter()
            .any(|e| assistant(e).is_some_and(|m| m.text() == "spawned b"))
    });
    let spawned = entries
        .iter()
        .filter_map(tool_result)
        .rfind(|r| r.tool_name == "spawn_session")
        .unwrap()
        .content
        .clone();
    assert!(
        spawned.contains("waits for a slot: place 1"),
        "{spawned}\n{}",
        describe(&entries)
    );
    // ... and runs once the gate's reconciliation found the first settled and freed it.
    wait_for("the second child idle", slots_back_within(), || {
        children_titled(&api, &parent, "b")
            .into_iter()
            .find(|c| matches!(c.lifecycle, ChildLifecycle::Idle { .. }))
    });
    let reconciled = stack
        .log_events()
        .into_iter()
        .find(|e| e["event"] == "gate_reconciled")
        .unwrap_or_else(|| panic!("no gate_reconciled line:\n{}", stack.log_tail(80)));
    assert_eq!(reconciled["freed"], json!([first.id]), "{reconciled}");
}
