//! Table tests of the outbox, and an exhaustive check of its promise: whatever is lost in
//! flight, and whenever the child's next changes are committed, the parent hears of each of the
//! child's settlings exactly once, in order, ends knowing its final state, and the gate gives
//! the slot back only after the parent heard.

use expect_test::expect;

use super::*;
use crate::orchestration::{Gate, Limits, Slot, accept_report};
use crate::wire::ChildLifecycle;

fn status(lifecycle: ChildLifecycle, cursor: u64) -> ChildStatus {
    ChildStatus {
        id: "c".into(),
        title: None,
        detached: false,
        lifecycle,
        cursor,
        spent: None,
        branch: None,
        head: None,
    }
}

fn idle(cursor: u64) -> ChildStatus {
    status(
        ChildLifecycle::Idle {
            final_text: Some(format!("done at {cursor}")),
        },
        cursor,
    )
}

fn running(cursor: u64) -> ChildStatus {
    status(ChildLifecycle::Running, cursor)
}

fn render(outbox: &Outbox) -> String {
    outbox
        .rows()
        .iter()
        .map(|r| format!("{} (next {}, failed {})", r.id, r.next_at, r.attempts))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_change_writes_its_report_and_a_settling_the_release_after_it() {
    let mut outbox = Outbox::default();
    let pushed = outbox.push(&running(3), 1000);
    assert!(pushed.delete.is_empty());
    let pushed = outbox.push(&idle(5), 2000);
    // The running report carries nothing for the parent's system lane: the idle one supersedes
    // it.
    assert_eq!(pushed.delete, vec!["child-c-running-3".to_string()]);
    expect![[r#"
        child-c-idle-5 (next 2000, failed 0)
        release-c-5 (next 2000, failed 0)"#]]
    .assert_eq(&render(&outbox));
    assert_eq!(
        outbox.rows()[1].event,
        Event::ReleaseSlot { settled_at: 2000 }
    );
    // The same change pushed again (a drain replayed) adds nothing.
    assert_eq!(outbox.push(&idle(5), 3000), Pushed::default());
    // Settlings are kept: each is a message for the parent.
    outbox.push(&running(6), 4000);
    outbox.push(&status(ChildLifecycle::Stopped, 7), 5000);
    // (The newer release supersedes the older: it frees the slot later, after both reports.)
    expect![[r#"
        child-c-idle-5 (next 2000, failed 0)
        child-c-stopped-7 (next 5000, failed 0)
        release-c-7 (next 5000, failed 0)"#]]
    .assert_eq(&render(&outbox));
    // The report's id is the id of the message the parent queues.
    assert_eq!(
        report_id(&idle(5)),
        crate::orchestration::parent_message(&idle(5)).unwrap().id
    );
}

#[test]
fn only_the_head_is_due_and_failures_back_off_to_a_bound() {
    let mut outbox = Outbox::default();
    outbox.push(&idle(5), 0);
    assert_eq!(outbox.due(0).map(|r| r.id.as_str()), Some("child-c-idle-5"));
    let mut now = 0;
    let mut delays = Vec::new();
    for _ in 0..9 {
        let Some(AfterAttempt::Retry { next_at, .. }) =
            outbox.attempted("child-c-idle-5", Attempt::Failed, now)
        else {
            panic!("not retried")
        };
        delays.push((next_at - now) / 1000);
        // Not due before its time; the release behind it never overtakes it.
        assert_eq!(outbox.due(next_at - 1), None);
        assert_eq!(outbox.next_at(), Some(next_at));
        now = next_at;
    }
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(
        outbox.attempted("child-c-idle-5", Attempt::Done, now),
        Some(AfterAttempt::Delete)
    );
    assert_eq!(outbox.due(now).map(|r| r.id.as_str()), Some("release-c-5"));
    // A parent that is gone: nobody to tell; the row goes.
    let mut gone = Outbox::default();
    gone.push(&idle(9), 0);
    assert_eq!(
        gone.attempted("child-c-idle-9", Attempt::Gone, 0),
        Some(AfterAttempt::Delete)
    );
    // A row superseded while it was in flight: nothing to do.
    assert_eq!(gone.attempted("child-c-idle-9", Attempt::Done, 0), None);
    // After a day of failures it is given up.
    let mut old = Outbox::default();
    old.push(&idle(9), 0);
    assert_eq!(
        old.attempted("child-c-idle-9", Attempt::Failed, GIVE_UP_AFTER_MS),
        Some(AfterAttempt::GiveUp)
    );
    assert_eq!(old.rows().len(), 1, "its release stays");
}

#[test]
fn the_outbox_is_bounded_and_keeps_the_newest_release() {
    let mut outbox = Outbox::default();
    for turn in 0..100u64 {
        outbox.push(&running(turn * 2), turn);
        let pushed = outbox.push(&idle(turn * 2 + 1), turn);
        assert!(outbox.rows().len() <= MAX_OUTBOX_ROWS);
        // What is inserted is never deleted in the same push.
        assert!(pushed.insert.iter().all(|r| !pushed.delete.contains(&r.id)));
    }
    let releases = outbox
        .rows()
        .iter()
        .filter(|r| matches!(r.event, Event::ReleaseSlot { .. }))
        .count();
    assert_eq!(outbox.rows().len(), MAX_OUTBOX_ROWS);
    assert_eq!(releases, 1, "the newest release supersedes the others");
    assert!(matches!(
        outbox.rows().last().unwrap().event,
        Event::ReleaseSlot { settled_at: 99 }
    ));
    // The oldest reports went; the newest are kept.
    assert_eq!(outbox.rows()[0].id, "child-c-idle-75");
    // Stored rows read back as they were.
    for row in outbox.rows() {
        let json = serde_json::to_string(row).unwrap();
        assert_eq!(&serde_json::from_str::<Row>(&json).unwrap(), row);
    }
}

/// The parent: its record of the child and the messages it queued (by id), in order.
#[derive(Clone, Debug, Default)]
struct Parent {
    known: Option<ChildStatus>,
    messages: Vec<String>,
}

impl Parent {
    /// `POST /child_event`: the record and the message are committed together.
    fn receive(&mut self, report: &ChildStatus) {
        if !accept_report(self.known.as_ref(), report) {
            return;
        }
        self.known = Some(report.clone());
        // Queued whenever the record took the report: the record is what keeps a repeat out.
        if let Some(message) = crate::orchestration::parent_message(report) {
            self.messages.push(message.id);
        }
    }
}

/// How one attempt ends.
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Lost before it reached the parent (or the gate).
    Lost,
    /// Reached it and was committed there, but the acknowledgement was lost (a crash after
    /// delivery, before the ack).
    Unacknowledged,
    /// Acknowledged.
    Acknowledged,
}

#[derive(Clone, Debug)]
struct World {
    /// Changes committed so far.
    committed: usize,
    outbox: Outbox,
    parent: Parent,
    gate: Gate,
    /// The attempt under way: the row and how it ends.
    in_flight: Option<(Row, Fate)>,
    now: u64,
    failures: u32,
    /// Whether the gate freed the child's slot while the parent did not yet know it settled.
    freed_before_told: bool,
    /// Whether a (late) release freed the slot of a child that runs again.
    freed_while_running: bool,
}

const LIMITS: Limits = Limits {
    max_depth: 2,
    max_children: 4,
    max_running: 1,
};

fn slot() -> Slot {
    Slot {
        child: "c".into(),
        parent: "p".into(),
    }
}

/// Every schedule of commits, sends and their ends, with at most `max_failures` lost or
/// unacknowledged attempts; `visit` sees each finished world.
fn explore(
    changes: &[ChildStatus],
    world: World,
    max_failures: u32,
    visit: &mut impl FnMut(&World),
) {
    let mut moved = false;
    // The child commits its next change (a new turn asks the gate first).
    if world.committed < changes.len() {
        let mut next = world.clone();
        let change = &changes[next.committed];
        next.now += 1000;
        if change.lifecycle == ChildLifecycle::Running {
            next.gate.request(slot(), &LIMITS, next.now).unwrap();
        }
        next.outbox.push(change, next.now);
        next.committed += 1;
        explore(changes, next, max_failures, visit);
        moved = true;
    }
    match &world.in_flight {
        None => {
            if let Some(head) = world.outbox.due(world.now + 60_000).cloned() {
                let fates: &[Fate] = if world.failures < max_failures {
                    &[Fate::Lost, Fate::Unacknowledged, Fate::Acknowledged]
                } else {
                    &[Fate::Acknowledged]
                };
                for &fate in fates {
                    let mut next = world.clone();
                    next.now = next.now.max(head.next_at);
                    // What reaches the other side happens as the attempt is sent.
                    if !matches!(fate, Fate::Lost) {
                        match &head.event {
                            Event::Report { status } => next.parent.receive(status),
                            Event::ReleaseSlot { settled_at } => {
                                let before = next.gate.running().iter().any(|s| s.child == "c");
                                next.gate.release("c", Some(*settled_at), &LIMITS, next.now);
                                let after = next.gate.running().iter().any(|s| s.child == "c");
                                let told = next
                                    .parent
                                    .known
                                    .as_ref()
                                    .is_some_and(|k| k.lifecycle.is_settled());
                                next.freed_before_told |= before && !after && !told;
                                let runs = changes[next.committed - 1].lifecycle
                                    == ChildLifecycle::Running;
                                next.freed_while_running |= before && !after && runs;
                            }
                        }
                    }
                    if !matches!(fate, Fate::Acknowledged) {
                        next.failures += 1;
                    }
                    next.in_flight = Some((head.clone(), fate));
                    explore(changes, next, max_failures, visit);
                }
                moved = true;
            }
        }
        Some((row, fate)) => {
            let mut next = world.clone();
            next.now += 500;
            let attempt = match fate {
                Fate::Acknowledged => Attempt::Done,
                Fate::Lost | Fate::Unacknowledged => Attempt::Failed,
            };
            next.outbox.attempted(&row.id, attempt, next.now);
            next.in_flight = None;
            explore(changes, next, max_failures, visit);
            moved = true;
        }
    }
    if !moved {
        visit(&world);
    }
}

#[test]
fn every_settling_told_once_in_order_and_the_slot_back_under_every_interleaving() {
    let scenarios: Vec<Vec<ChildStatus>> = vec![
        vec![running(2), idle(4)],
        vec![running(2), idle(4), running(5), idle(7)],
        vec![
            running(2),
            status(
                ChildLifecycle::Failed {
                    message: "x".into(),
                },
                3,
            ),
            running(4),
            status(ChildLifecycle::Stopped, 5),
        ],
    ];
    let mut schedules = 0u64;
    for changes in &scenarios {
        let start = World {
            committed: 0,
            outbox: Outbox::default(),
            parent: Parent::default(),
            gate: Gate::default(),
            in_flight: None,
            now: 0,
            failures: 0,
            freed_before_told: false,
            freed_while_running: false,
        };
        let expected: Vec<String> = changes
            .iter()
            .filter_map(|c| crate::orchestration::parent_message(c).map(|m| m.id))
            .collect();
        explore(changes, start, 2, &mut |world| {
            schedules += 1;
            assert!(world.outbox.rows().is_empty(), "{world:#?}");
            // Each settling woke the parent once, in the order they happened.
            assert_eq!(world.parent.messages, expected, "{world:#?}");
            // The parent ends knowing the child's final state.
            assert_eq!(world.parent.known.as_ref(), changes.last(), "{world:#?}");
            // The slot is back, and never before the parent heard the child settled.
            assert!(world.gate.running().is_empty(), "{world:#?}");
            assert!(!world.freed_before_told, "{world:#?}");
            assert!(!world.freed_while_running, "{world:#?}");
        });
    }
    assert!(schedules > 1000, "{schedules} schedules");
    eprintln!("{schedules} schedules");
}
