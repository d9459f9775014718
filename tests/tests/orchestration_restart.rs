//! The concurrency gate survives a restart of the server (issue 12, `docs/orchestration.md`):
//! with `WUHU_MAX_RUNNING_SESSIONS=1`, a child that holds the tenant's only slot still holds
//! it after `wrangler dev` is SIGKILLed and started again on the same state, so a spawn after
//! the restart waits in line (a gate that forgot its slots would let it run at once).
//!
//! The per-parent gate (`WUHU_MAX_CHILDREN=2`): a parent spawning one child more than the limit
//! sees that one wait (told so, with its place), across a restart too; a spawn after the
//! restart waits behind it; each starts only when a running child finished, first in line
//! first, and never more than two run.
//!
//! Each test starts its own `wrangler dev` (it restarts it).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use wuhu_core::wire::{ChildLifecycle, Status};
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

/// The follow events `child_status` as (child id, state), in order.
fn child_states(events: &[wuhu_e2e::SseEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.event == "child_status")
        .map(|e| {
            (
                e.data["child"]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                e.data["child"]["state"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn the_per_parent_gate_queues_the_child_beyond_the_limit_in_order_across_a_restart() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_MAX_CHILDREN".into(), "2".into())],
        ..StackOptions::default()
    });
    let tenant = unique_name("orch-parent-gate");
    let api = stack.client("ana", &tenant);
    let parent = api.create_fake_session().id;
    // Two holders stream long enough to hold their slots across the restart (a restarted
    // child streams its reply again from the start): 20 s and 40 s. The third is short.
    let holder = |chunks: u32| {
        fake_directive(&json!({
            "reply": (0..chunks).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" "),
            "chunks": chunks,
            "delayMs": 2500
        }))
    };
    let short = |text: &str| fake_directive(&json!({"reply": text}));
    let spawn = |task: String, title: &str| json!({"name": "spawn_session", "arguments": {"task": task, "title": title}});
    // The holders first (calls of one step run concurrently, so which of them would wait is
    // not fixed), then the one beyond the limit.
    api.enqueue(
        &parent,
        "followUp",
        &fake_directive(&json!({
            "toolCalls": [spawn(holder(8), "h0"), spawn(holder(16), "h1")],
            "afterTools": "spawned two",
        })),
    );
    api.wait_transcript(&parent, "the two holders' spawns", TURN, |_| {
        spawn_results(&api, &parent).len() == 2
    });
    api.enqueue(
        &parent,
        "followUp",
        &fake_directive(&json!({
            "toolCalls": [spawn(short("third done"), "third")],
            "afterTools": "spawned the third",
        })),
    );
    api.wait_transcript(&parent, "the third spawn", TURN, |_| {
        spawn_results(&api, &parent).len() == 3
    });
    let results = spawn_results(&api, &parent);
    let text = describe(&api.transcript(&parent));
    // The two within the limit run; the third is told it waits, first in line, and why.
    assert!(
        results[..2].iter().all(|r| !r.contains("waits for a slot")),
        "{results:#?}"
    );
    assert!(
        results[2].contains("waits for a slot: place 1 in line")
            && results[2].contains("2 children of this session run (limit 2, WUHU_MAX_CHILDREN)"),
        "{results:#?}\n{text}"
    );
    api.wait_idle(&parent, TURN);
    let by_title = |children: &[wuhu_core::wire::ChildStatus], title: &str| {
        children
            .iter()
            .find(|c| c.title.as_deref() == Some(title))
            .unwrap_or_else(|| panic!("no child {title}: {children:?}"))
            .clone()
    };
    let children = api.session(&parent).children;
    let (h0, h1, third) = (
        by_title(&children, "h0").id,
        by_title(&children, "h1").id,
        by_title(&children, "third"),
    );
    assert!(
        matches!(third.lifecycle, ChildLifecycle::Queued { position: 1, .. }),
        "{third:?}"
    );
    for holder in [&h0, &h1] {
        assert_eq!(api.session(holder).session.status, Status::Running);
    }
    assert_eq!(api.session(&third.id).session.status, Status::Idle);

    stack.restart_killed();
    let api = stack.client("ana", &tenant);
    let mut follow = api.follow(&parent, "");
    // Whoever holds a slot when the stream opened (the holders; not the third, which waits).
    let mut holding: BTreeSet<String> = api
        .session(&parent)
        .children
        .iter()
        .filter(|c| {
            matches!(
                c.lifecycle,
                ChildLifecycle::Created | ChildLifecycle::Running
            )
        })
        .map(|c| c.id.clone())
        .collect();
    assert_eq!(
        holding,
        BTreeSet::from([h0.clone(), h1.clone()]),
        "the holders still hold their slots after the restart"
    );

    // A spawn after the restart waits behind the third: the line survived too.
    api.enqueue(
        &parent,
        "followUp",
        &fake_directive(&json!({
            "toolCalls": [spawn(short("fourth done"), "fourth")],
            "afterTools": "spawned the fourth",
        })),
    );
    api.wait_transcript(&parent, "the fourth spawn", TURN, |_| {
        spawn_results(&api, &parent).len() == 4
    });
    let fourth_result = spawn_results(&api, &parent).remove(3);
    assert!(
        fourth_result.contains("waits for a slot: place 2 in line")
            && fourth_result.contains("limit 2, WUHU_MAX_CHILDREN"),
        "{fourth_result}\n{}",
        describe(&api.transcript(&parent))
    );
    let fourth = by_title(&api.session(&parent).children, "fourth").id;

    // Every child finishes; on the parent's follow stream the waiting ones start in order,
    // each after a running child went idle, and never more than two hold a slot.
    let mut idle = BTreeSet::new();
    let events = follow.collect_until(Duration::from_secs(240), |e| {
        if e.event == "child_status" && e.data["child"]["state"] == "idle" {
            idle.insert(
                e.data["child"]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        idle.len() == 4
    });
    let states = child_states(&events);
    let mut started = Vec::new();
    let mut idle_count = 0;
    let mut idle_when_started = Vec::new();
    for (id, state) in &states {
        if state == "spawning" || state == "queued" {
            continue;
        }
        // A child's first state past the line is its start (a short child's `created` and
        // `running` reports may be overtaken by its `idle`).
        if !started.contains(id) && ![&h0, &h1].contains(&id) {
            started.push(id.clone());
            idle_when_started.push(idle_count);
            holding.insert(id.clone());
            assert!(holding.len() <= 2, "{holding:?} hold slots: {states:?}");
        }
        if matches!(state.as_str(), "idle" | "failed" | "stopped") && holding.remove(id) {
            idle_count += 1;
        }
    }
    assert_eq!(
        started,
        [third.id.clone(), fourth.clone()],
        "first in line first: {states:?}"
    );
    assert!(
        idle_when_started[0] >= 1 && idle_when_started[1] >= 2,
        "each started after a running child finished: {states:?}"
    );
    for (title, want) in [("third", "third done"), ("fourth", "fourth done")] {
        let child = by_title(&api.session(&parent).children, title);
        assert_eq!(
            child.lifecycle,
            ChildLifecycle::Idle {
                final_text: Some(want.into())
            },
            "{title}"
        );
    }
}
