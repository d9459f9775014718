use super::*;
use crate::wire::{AssistantMessage, Entry};

fn limits(max_depth: u32, max_children: u32, max_running: u32) -> Limits {
    Limits {
        max_depth,
        max_children,
        max_running,
    }
}

#[test]
fn limits_come_from_vars_and_bad_values_keep_the_defaults() {
    let cases: &[(&[(&str, &str)], Limits)] = &[
        (&[], Limits::default()),
        (
            &[
                ("WUHU_MAX_CHILDREN", "3"),
                ("WUHU_MAX_RUNNING_SESSIONS", " 7 "),
                ("WUHU_MAX_SESSION_DEPTH", "1"),
            ],
            limits(1, 3, 7),
        ),
        (
            &[
                ("WUHU_MAX_CHILDREN", "0"),
                ("WUHU_MAX_RUNNING_SESSIONS", "-1"),
                ("WUHU_MAX_SESSION_DEPTH", "two"),
            ],
            Limits::default(),
        ),
    ];
    for (vars, want) in cases {
        let got = Limits::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        });
        assert_eq!(got, *want, "{vars:?}");
    }
    assert_eq!(Limits::default(), limits(2, 4, 32));
}

fn lineage(parent: Option<&str>, depth: u32, ancestors: &[&str]) -> Lineage {
    Lineage {
        parent_id: parent.map(str::to_string),
        depth,
        ancestors: ancestors.iter().map(|a| a.to_string()).collect(),
        detached: false,
        usd_budget_above: false,
    }
}

#[test]
fn recursion_guard_and_cycles_decide_spawns() {
    let l = Limits::default();
    let root = lineage(None, 0, &[]);
    let child = lineage(Some("r"), 1, &["r"]);
    let grandchild = lineage(Some("c"), 2, &["r", "c"]);
    let corrupt = lineage(Some("c"), 1, &["r"]);
    // (parent id, its lineage, new child id, already spawned, limits) -> result
    type Case<'a> = (
        &'a str,
        &'a Lineage,
        &'a str,
        usize,
        Limits,
        Result<Lineage, SpawnRefused>,
    );
    let cases: Vec<Case> = vec![
        ("r", &root, "c", 0, l, Ok(lineage(Some("r"), 1, &["r"]))),
        (
            "c",
            &child,
            "g",
            0,
            l,
            Ok(lineage(Some("c"), 2, &["r", "c"])),
        ),
        // The child at the maximum depth (2 by default) may not spawn.
        (
            "g",
            &grandchild,
            "x",
            0,
            l,
            Err(SpawnRefused::AtMaxDepth { depth: 2, max: 2 }),
        ),
        // With depth 1 allowed, a child may not spawn either.
        (
            "c",
            &child,
            "g",
            0,
            limits(1, 4, 32),
            Err(SpawnRefused::AtMaxDepth { depth: 1, max: 1 }),
        ),
        // A child that would be its own ancestor (a reused id) closes a loop.
        (
            "c",
            &child,
            "r",
            0,
            l,
            Err(SpawnRefused::Cycle { id: "r".into() }),
        ),
        (
            "c",
            &child,
            "c",
            0,
            l,
            Err(SpawnRefused::Cycle { id: "c".into() }),
        ),
        // A lineage that already holds the spawner is corrupt: refuse rather than loop.
        (
            "r",
            &corrupt,
            "x",
            0,
            l,
            Err(SpawnRefused::Cycle { id: "x".into() }),
        ),
        (
            "r",
            &root,
            "c",
            MAX_CHILDREN_PER_SESSION - 1,
            l,
            Ok(lineage(Some("r"), 1, &["r"])),
        ),
        (
            "r",
            &root,
            "c",
            MAX_CHILDREN_PER_SESSION,
            l,
            Err(SpawnRefused::TooManyChildren),
        ),
    ];
    for (parent_id, parent, child_id, spawned, limits, want) in cases {
        let got = child_lineage(parent_id, parent, child_id, spawned, false, &limits);
        assert_eq!(got, want, "{parent_id} {parent:?} spawns {child_id}");
    }
    // The spawn tools are offered exactly where a spawn is allowed.
    for depth in 0..5 {
        let allowed = child_lineage(
            "p",
            &Lineage {
                depth,
                ..Lineage::default()
            },
            "q",
            0,
            false,
            &l,
        )
        .is_ok();
        assert_eq!(may_spawn(depth, &l), allowed, "depth {depth}");
    }
    assert!(
        child_lineage("r", &root, "c", 0, true, &l)
            .unwrap()
            .detached
    );
}

#[test]
fn only_own_children_are_targets_and_ancestors_never() {
    let child = lineage(Some("r"), 1, &["r"]);
    let cases: &[(&str, bool, Result<(), TargetRefused>)] = &[
        ("k", true, Ok(())),
        ("x", false, Err(TargetRefused::NotAChild { id: "x".into() })),
        // Waiting on itself or its parent would deadlock, even if recorded as a child.
        ("c", true, Err(TargetRefused::Cycle { id: "c".into() })),
        ("r", true, Err(TargetRefused::Cycle { id: "r".into() })),
        ("r", false, Err(TargetRefused::Cycle { id: "r".into() })),
    ];
    for (target, is_child, want) in cases {
        assert_eq!(
            check_target("c", &child, target, *is_child),
            *want,
            "{target}"
        );
    }
}

fn entry(cursor: u64, payload: EntryPayload) -> Effect {
    Effect::AppendEntry(Entry {
        cursor,
        id: format!("e{cursor}"),
        created_at: 0,
        payload,
    })
}

fn assistant(text: &str) -> EntryPayload {
    EntryPayload::Message {
        message: Message::Assistant(AssistantMessage {
            content: vec![ContentBlock::Text { text: text.into() }],
            ..Default::default()
        }),
    }
}

fn llm_error(will_retry: bool) -> EntryPayload {
    EntryPayload::Custom {
        custom_type: custom_types::LLM_ERROR.into(),
        data: serde_json::json!({"message": "boom", "willRetry": will_retry}),
    }
}

#[test]
fn drains_become_lifecycle_reports() {
    let idle = |t: Option<&str>| ChildLifecycle::Idle {
        final_text: t.map(str::to_string),
    };
    let cases: Vec<(&str, Vec<Effect>, Option<ChildLifecycle>)> = vec![
        ("nothing", vec![], None),
        ("an entry only", vec![entry(3, assistant("x"))], None),
        (
            "turn starts",
            vec![
                Effect::StatusChanged(Status::Running),
                Effect::Infer { step: 1 },
            ],
            Some(ChildLifecycle::Running),
        ),
        (
            "turn ends with text",
            vec![
                entry(3, assistant("all done")),
                Effect::StatusChanged(Status::Idle),
                Effect::Idle,
            ],
            Some(idle(Some("all done"))),
        ),
        (
            "turn ends without text",
            vec![
                entry(3, assistant("  ")),
                Effect::StatusChanged(Status::Idle),
                Effect::Idle,
            ],
            Some(idle(None)),
        ),
        (
            "the LLM gave up",
            vec![
                entry(3, llm_error(false)),
                Effect::StatusChanged(Status::Idle),
                Effect::Idle,
            ],
            Some(ChildLifecycle::Failed {
                message: "boom".into(),
            }),
        ),
        (
            "an error then an answer in one drain: the last one counts",
            vec![
                entry(3, llm_error(false)),
                entry(4, assistant("recovered")),
                Effect::StatusChanged(Status::Idle),
            ],
            Some(idle(Some("recovered"))),
        ),
        (
            "stopped",
            vec![
                entry(3, assistant("partial")),
                Effect::StatusChanged(Status::Stopped),
            ],
            Some(ChildLifecycle::Stopped),
        ),
        (
            "running then idle in one drain: the last status counts",
            vec![
                Effect::StatusChanged(Status::Running),
                entry(3, assistant("quick")),
                Effect::StatusChanged(Status::Idle),
            ],
            Some(idle(Some("quick"))),
        ),
    ];
    for (name, effects, want) in cases {
        assert_eq!(turn_outcome(&effects), want, "{name}");
    }
    // A final text at the bound is kept whole; one byte over is cut at a char boundary.
    let at_bound = "é".repeat(MAX_FINAL_TEXT_BYTES / 2);
    let over = format!("{at_bound}x");
    let text_of = |t: &str| match turn_outcome(&[
        entry(3, assistant(t)),
        Effect::StatusChanged(Status::Idle),
    ]) {
        Some(ChildLifecycle::Idle {
            final_text: Some(t),
        }) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!(text_of(&at_bound), at_bound);
    let cut = text_of(&over);
    assert!(
        cut.starts_with(&at_bound) && cut.contains("[cut at"),
        "{cut}"
    );
    let over_in_char = format!("x{at_bound}");
    assert!(text_of(&over_in_char).contains("[cut at"));
}

fn status(id: &str, lifecycle: ChildLifecycle, cursor: u64) -> ChildStatus {
    ChildStatus {
        id: id.into(),
        title: Some("t".into()),
        detached: false,
        lifecycle,
        cursor,
        spent: None,
        branch: None,
        head: None,
    }
}

/// Each child's reported spending, and the total (tokens, USD) its parent counts.
type SpentCase = (Vec<Option<crate::wire::Spent>>, (u64, f64));

#[test]
fn a_parent_counts_what_its_children_reported_they_spent() {
    let spent = |tokens, usd| Some(crate::wire::Spent { tokens, usd });
    let cases: Vec<SpentCase> = vec![
        (vec![], (0, 0.0)),
        (vec![None, None], (0, 0.0)),
        (vec![spent(10, 0.5), None, spent(5, 0.25)], (15, 0.75)),
        (vec![spent(u64::MAX, 0.0), spent(1, 0.0)], (u64::MAX, 0.0)),
    ];
    for (reports, (tokens, usd)) in cases {
        let children: Vec<ChildStatus> = reports
            .iter()
            .enumerate()
            .map(|(i, s)| ChildStatus {
                spent: *s,
                ..status(&format!("c{i}"), ChildLifecycle::Running, 1)
            })
            .collect();
        let total = children_spent(&children);
        assert_eq!((total.tokens, total.usd), (tokens, usd), "{reports:?}");
    }
}

#[test]
fn newer_reports_win_whatever_order_they_arrive_in() {
    let reports = [
        status("c", ChildLifecycle::Spawning, 0),
        status(
            "c",
            ChildLifecycle::Queued {
                position: 1,
                reason: "r".into(),
            },
            2,
        ),
        status("c", ChildLifecycle::Created, 2),
        status("c", ChildLifecycle::Running, 3),
        status(
            "c",
            ChildLifecycle::Idle {
                final_text: Some("a".into()),
            },
            5,
        ),
        status("c", ChildLifecycle::Running, 6),
        status("c", ChildLifecycle::Stopped, 8),
        // Deleted: its last report, sent at the cursor it was deleted at (or earlier: the
        // deletion reads no newer one), and final.
        status("c", ChildLifecycle::Disposed, 7),
    ];
    // Every arrival order (of 8 reports: 40320) ends with the newest one recorded, and the
    // recorded one only ever moves forward.
    let mut order: Vec<usize> = (0..reports.len()).collect();
    let mut count = 0;
    permute(&mut order, 0, &mut |order| {
        count += 1;
        // `reports` is in the order things happened: after each arrival the parent knows the
        // latest report that has arrived.
        let mut known: Option<ChildStatus> = None;
        let mut newest_arrived = 0;
        for &i in order {
            newest_arrived = newest_arrived.max(i);
            if accept_report(known.as_ref(), &reports[i]) {
                known = Some(reports[i].clone());
            }
            assert_eq!(known.as_ref(), Some(&reports[newest_arrived]), "{order:?}");
        }
    });
    assert_eq!(count, 40320);
    // A repeat is dropped.
    assert!(!accept_report(Some(&reports[4]), &reports[4]));
}

fn permute(items: &mut Vec<usize>, k: usize, visit: &mut impl FnMut(&[usize])) {
    if k == items.len() {
        visit(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permute(items, k + 1, visit);
        items.swap(k, i);
    }
}

#[test]
fn the_parent_hears_of_idle_failed_stopped_and_disposed_only() {
    let cases: Vec<(ChildLifecycle, Option<&str>)> = vec![
        (ChildLifecycle::Spawning, None),
        (
            ChildLifecycle::Queued {
                position: 2,
                reason: "r".into(),
            },
            None,
        ),
        (ChildLifecycle::Created, None),
        (ChildLifecycle::Running, None),
        (
            ChildLifecycle::Idle {
                final_text: Some("wrote a.txt".into()),
            },
            Some(
                "Child session c (\"t\") finished its turn and is idle. Its final message:\n\nwrote a.txt",
            ),
        ),
        (
            ChildLifecycle::Idle { final_text: None },
            Some("Child session c (\"t\") finished its turn and is idle. It gave no final text."),
        ),
        (
            ChildLifecycle::Failed {
                message: "429".into(),
            },
            Some("Child session c (\"t\") failed: 429"),
        ),
        (
            ChildLifecycle::Stopped,
            Some("Child session c (\"t\") was stopped."),
        ),
        (
            ChildLifecycle::Disposed,
            Some("Child session c (\"t\") was deleted: it is gone with its transcript."),
        ),
    ];
    for (lifecycle, want) in cases {
        let report = status("c", lifecycle.clone(), 9);
        let got = parent_message(&report);
        assert_eq!(
            got.as_ref().map(|m| m.content.as_str()),
            want,
            "{lifecycle:?}"
        );
        if let Some(message) = got {
            assert_eq!(message.id, format!("child-c-{}-9", lifecycle.name()));
            assert_eq!(message.input.custom_type, custom_types::CHILD_STATUS);
            let details: ChildStatus =
                serde_json::from_value(message.input.details.unwrap()).unwrap();
            assert_eq!(details, report);
        }
    }
    // The same report always gets the same id (so a repeat is not queued twice); another
    // turn's report another one.
    let a = parent_message(&status("c", ChildLifecycle::Stopped, 9)).unwrap();
    let b = parent_message(&status("c", ChildLifecycle::Stopped, 9)).unwrap();
    let c = parent_message(&status("c", ChildLifecycle::Stopped, 12)).unwrap();
    assert_eq!(a.id, b.id);
    assert_ne!(a.id, c.id);
}

#[test]
fn child_status_wire_shape() {
    let s = status(
        "c",
        ChildLifecycle::Idle {
            final_text: Some("done".into()),
        },
        4,
    );
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        serde_json::json!({"id": "c", "title": "t", "detached": false, "state": "idle", "finalText": "done", "cursor": 4})
    );
    let q = status(
        "c",
        ChildLifecycle::Queued {
            position: 1,
            reason: "r".into(),
        },
        2,
    );
    let json = serde_json::to_string(&q).unwrap();
    assert_eq!(serde_json::from_str::<ChildStatus>(&json).unwrap(), q);
}

fn slot(child: &str, parent: &str) -> Slot {
    Slot {
        child: child.into(),
        parent: parent.into(),
    }
}

/// Runs a gate script: `+child/parent` requests a slot, `-child` releases one, `-child<S`
/// releases it if it was granted before second `S`, `@S` sets the clock to second `S`, and
/// `~child=holder,…` reconciles with what was found of each child (`running`, `settled`,
/// `gone`, `unknown`). Renders each answer and the slots granted by releases.
fn run_gate(limits: Limits, script: &str) -> String {
    let mut gate = Gate::default();
    let mut out = Vec::new();
    let mut now = 0u64;
    for step in script.split_whitespace() {
        if let Some(at) = step.strip_prefix('@') {
            now = at.parse::<u64>().unwrap() * 1000;
        } else if let Some(spec) = step.strip_prefix('+') {
            let (child, parent) = spec.split_once('/').unwrap();
            let answer = match gate.request(slot(child, parent), &limits, now) {
                Ok(Admission::Granted) => "granted".to_string(),
                Ok(Admission::Queued { position, .. }) => format!("queued {position}"),
                Err(GateFull) => "full".to_string(),
            };
            out.push(format!("{step}: {answer}"));
        } else if let Some(spec) = step.strip_prefix('-') {
            let (child, before) = match spec.split_once('<') {
                Some((child, s)) => (child, Some(s.parse::<u64>().unwrap() * 1000)),
                None => (spec, None),
            };
            let granted: Vec<String> = gate
                .release(child, before, &limits, now)
                .into_iter()
                .map(|s| s.child)
                .collect();
            out.push(format!("{step}: starts [{}]", granted.join(",")));
        } else if let Some(spec) = step.strip_prefix('~') {
            let asked = gate.to_reconcile(now);
            let holders: Vec<(String, Holder)> = spec
                .split(',')
                .map(|pair| {
                    let (child, holder) = pair.split_once('=').unwrap();
                    let holder = match holder {
                        "running" => Holder::Running,
                        "settled" => Holder::Settled,
                        "gone" => Holder::Gone,
                        _ => Holder::Unknown,
                    };
                    (child.to_string(), holder)
                })
                .collect();
            let done = gate.reconcile(&holders, &limits, now);
            let granted: Vec<String> = done.granted.into_iter().map(|s| s.child).collect();
            out.push(format!(
                "{step}: asks [{}] frees [{}] starts [{}]",
                asked.join(","),
                done.freed.join(","),
                granted.join(",")
            ));
        }
        // The invariant: nobody waits who could run, and no limit is exceeded.
        let running = gate.running();
        assert!(running.len() as u32 <= limits.max_running, "{step}");
        for s in running {
            let siblings = running.iter().filter(|r| r.parent == s.parent).count() as u32;
            assert!(siblings <= limits.max_children, "{step}");
        }
        let mut probe = gate.clone();
        assert!(
            probe.admit(&limits, now).is_empty(),
            "{step}: a waiting spawn fits"
        );
        // What a restart reloads is what was saved.
        let saved = serde_json::to_string(&gate).unwrap();
        assert_eq!(serde_json::from_str::<Gate>(&saved).unwrap(), gate);
    }
    out.join("\n")
}

#[test]
fn the_gate_queues_beyond_the_limits_and_grants_in_order() {
    // Per tenant, limit 3: the fourth child waits; a release starts it.
    expect_test::expect![[r#"
        +a/p: granted
        +b/p: granted
        +c/p: granted
        +d/p: queued 1
        +e/q: queued 2
        +d/p: queued 1
        -b: starts [d]
        -a: starts [e]
        -x: starts []
        -c: starts []"#]]
    .assert_eq(&run_gate(
        limits(2, 4, 3),
        "+a/p +b/p +c/p +d/p +e/q +d/p -b -a -x -c",
    ));
    // Per parent, limit 2: p's third child waits while q's children still run; a waiting
    // spawn released (its parent stopped) leaves the line.
    expect_test::expect![[r#"
        +a/p: granted
        +b/p: granted
        +c/p: queued 1
        +x/q: granted
        +d/p: queued 2
        +y/q: granted
        -c: starts []
        -a: starts [d]
        +a/p: queued 1
        -b: starts [a]"#]]
    .assert_eq(&run_gate(
        limits(2, 2, 32),
        "+a/p +b/p +c/p +x/q +d/p +y/q -c -a +a/p -b",
    ));
    // Asking again is harmless: a running child is granted, not counted twice.
    expect_test::expect![[r#"
        +a/p: granted
        +a/p: granted
        +b/p: granted
        +c/p: queued 1"#]]
    .assert_eq(&run_gate(limits(2, 2, 32), "+a/p +a/p +b/p +c/p"));
}

#[test]
fn the_waiting_line_is_bounded() {
    let l = limits(2, 1, 32);
    let mut gate = Gate::default();
    assert_eq!(
        gate.request(slot("run", "p"), &l, 0),
        Ok(Admission::Granted)
    );
    for i in 0..MAX_WAITING {
        let answer = gate.request(slot(&format!("w{i}"), "p"), &l, 0).unwrap();
        assert!(matches!(answer, Admission::Queued { position, .. } if position as usize == i + 1));
    }
    assert_eq!(gate.request(slot("one-more", "p"), &l, 0), Err(GateFull));
    // A waiting spawn asking again is told its place, even with the line full.
    assert!(matches!(
        gate.request(slot("w5", "p"), &l, 0),
        Ok(Admission::Queued { position: 6, .. })
    ));
    let queued = gate.request(slot("w0", "p"), &l, 0).unwrap();
    assert_eq!(
        queued,
        Admission::Queued {
            position: 1,
            reason: "1 children of this session run (limit 1, WUHU_MAX_CHILDREN)".into()
        }
    );
}

#[test]
fn a_late_release_never_frees_a_slot_granted_again() {
    // `a` settles at 10 s; its release (granted before 10 s) is delayed. Given input again at
    // 15 s it asks the gate and is granted again: the late release keeps its slot, so `b`
    // still waits. Its next settling's release (at 30 s) frees it.
    expect_test::expect![[r#"
        +a/p: granted
        +b/p: queued 1
        +a/p: granted
        -a<10: starts []
        -a<30: starts [b]"#]]
    .assert_eq(&run_gate(
        limits(2, 4, 1),
        "@0 +a/p +b/p @15 +a/p @40 -a<10 -a<30",
    ));
}

#[test]
fn reconciliation_frees_what_a_lost_release_kept_and_nothing_else() {
    // Limit 2. `a` and `b` run; `c` waits. At 10 s nobody is asked about (the grace). At 30 s
    // `a` is settled (its release was lost), `b` runs, `c` waits: `a`'s slot goes to `c`.
    expect_test::expect![[r#"
        +a/p: granted
        +b/p: granted
        +c/p: queued 1
        ~a=settled,b=settled: asks [] frees [] starts []
        ~a=settled,b=running,c=running: asks [a,b] frees [a] starts [c]"#]]
    .assert_eq(&run_gate(
        limits(2, 4, 2),
        "@0 +a/p +b/p +c/p @10 ~a=settled,b=settled @30 ~a=settled,b=running,c=running",
    ));
    // A child that could not be asked keeps its slot; a deleted one loses it; a waiting spawn
    // that is gone leaves the line (one that lives is left to ask again).
    expect_test::expect![[r#"
        +a/p: granted
        +b/p: granted
        +c/p: queued 1
        +d/p: queued 2
        ~a=unknown,b=gone,c=gone,d=running: asks [a,b] frees [b,c] starts [d]"#]]
    .assert_eq(&run_gate(
        limits(2, 4, 2),
        "@0 +a/p +b/p +c/p +d/p @25 ~a=unknown,b=gone,c=gone,d=running",
    ));
    // A grant renewed while the pass asked (new input at 29 s) is kept, though the child was
    // found settled before it: it is about to run.
    expect_test::expect![[r#"
        +a/p: granted
        +a/p: granted
        ~a=settled: asks [] frees [] starts []
        ~a=settled: asks [a] frees [a] starts []"#]]
    .assert_eq(&run_gate(
        limits(2, 4, 2),
        "@0 +a/p @29 +a/p @30 ~a=settled @49 ~a=settled",
    ));
}

#[test]
fn gates_saved_before_grant_times_were_kept_still_load() {
    let old = r#"{"running":[{"child":"a","parent":"p"}],"waiting":[]}"#;
    let gate: Gate = serde_json::from_str(old).unwrap();
    // A grant of unknown age is old enough to reconcile.
    assert_eq!(gate.to_reconcile(0), vec!["a".to_string()]);
}

/// One lifespan: a child's own worktree goes when the child ends, unless its definition keeps
/// it; nothing else goes, and nothing while the child may still run.
#[test]
fn a_childs_worktree_is_removed_when_it_ends_unless_kept() {
    use crate::wire::runner::EnvironmentKind::{FolderTemplate, Local, Worktree};
    let idle = ChildLifecycle::Idle {
        final_text: Some(String::from("done")),
    };
    let failed = ChildLifecycle::Failed {
        message: String::from("gave up"),
    };
    let queued = ChildLifecycle::Queued {
        position: 1,
        reason: String::from("limit"),
    };
    // (state, kind, keepWorktree, removed)
    let cases = [
        (&idle, Worktree, false, true),
        (&failed, Worktree, false, true),
        (&ChildLifecycle::Stopped, Worktree, false, true),
        (&idle, Worktree, true, false),
        (&ChildLifecycle::Stopped, Worktree, true, false),
        (&idle, Local, false, false),
        (&idle, FolderTemplate, false, false),
        (&ChildLifecycle::Running, Worktree, false, false),
        (&ChildLifecycle::Created, Worktree, false, false),
        (&queued, Worktree, false, false),
        (&ChildLifecycle::Spawning, Worktree, false, false),
        // A deleted child's worktree goes with its session's others (decision 0017).
        (&ChildLifecycle::Disposed, Worktree, false, true),
    ];
    for (i, (state, kind, keep, removed)) in cases.into_iter().enumerate() {
        assert_eq!(
            removes_worktree_at(state, kind, keep),
            removed,
            "case {i}: {state:?} {kind:?} keep={keep}"
        );
    }
}
