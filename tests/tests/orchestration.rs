//! Child sessions end to end (issue 12, `docs/orchestration.md`): an orchestrator spawns
//! children in parallel that work in its inherited environment on a real runner and wakes on
//! their `idle` events; the recursion guard at the maximum depth; the per-tenant concurrency
//! gate queueing a fourth child; the stop cascade sparing detached children; the steering
//! tools (`send_to_session`, `wait_sessions`, `stop_session`, js `wuhu.sessions.*`) on a
//! session's own children only.
//!
//! One `wrangler dev` for the file, with `WUHU_MAX_RUNNING_SESSIONS=3`; every test has its own
//! tenant (the gate is per tenant).

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{ChildLifecycle, ChildStatus, Entry, EntryPayload, Message, custom_types};
use wuhu_e2e::entries::{assistant, describe, fake_directive, tool_result};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Reply, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(90);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(|| StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_MAX_RUNNING_SESSIONS".into(), "3".into())],
        ..StackOptions::default()
    })
}

fn client(prefix: &str) -> (Api, String) {
    let tenant = unique_name(prefix);
    (stack().client("ana", &tenant), tenant)
}

/// A message whose fake reply calls `calls` and then says `after`.
fn calls_then(calls: &[(&str, Value)], after: &str) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
        .collect();
    fake_directive(&json!({"toolCalls": calls, "afterTools": after}))
}

/// The `wuhu_child_status_v1` messages of a transcript, as the child statuses they carry.
fn child_messages(entries: &[Entry]) -> Vec<(u64, ChildStatus)> {
    entries
        .iter()
        .filter_map(|e| match &e.payload {
            EntryPayload::Message {
                message:
                    Message::CustomMessage {
                        custom_type,
                        details: Some(details),
                        ..
                    },
            } if custom_type == custom_types::CHILD_STATUS => {
                Some((e.cursor, serde_json::from_value(details.clone()).unwrap()))
            }
            _ => None,
        })
        .collect()
}

fn children(api: &Api, id: &str) -> Vec<ChildStatus> {
    api.session(id).children
}

/// Waits until every child of `parent` recorded there is settled, and `parent` is idle.
#[track_caller]
fn wait_all_settled(api: &Api, parent: &str, count: usize) -> Vec<ChildStatus> {
    wait_for("every child settled", TURN, || {
        let page = api.session(parent);
        let done = page.children.len() == count
            && page.children.iter().all(|c| c.lifecycle.is_settled())
            && page.session.status == wuhu_core::wire::Status::Idle;
        done.then_some(page.children)
    })
}

#[test]
fn an_orchestrator_spawns_three_children_in_parallel_and_wakes_on_their_idle_events() {
    let (api, tenant) = client("orch-three");
    let dir = TempDir::new("wuhu-e2e-orch-three");
    let work = dir.mkdir("work");
    let _runner = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac")
            .workspaces_root(dir.mkdir("workspaces"))
            .env("work", &work),
    );
    let parent = api.create_fake_session().id;
    let attach = api.run_tool(
        &parent,
        "request_environment",
        json!({"spec": "work"}),
        TURN,
    );
    assert!(!attach.is_error, "{}", attach.content);
    let mut follow = api.follow(&parent, "");

    let names = ["a", "b", "c"];
    let spawns: Vec<(&str, Value)> = names
        .iter()
        .map(|name| {
            let task = calls_then(
                &[(
                    "write",
                    json!({"path": format!("{name}.txt"), "content": format!("from {name}")}),
                )],
                &format!("wrote {name}.txt"),
            );
            (
                "spawn_session",
                json!({"task": task, "title": name, "environment": "inherit"}),
            )
        })
        .collect();
    api.enqueue(&parent, "followUp", &calls_then(&spawns, "spawned three"));

    // Followers see each child's lifecycle, up to its idle.
    let mut idle_seen = std::collections::BTreeSet::new();
    let events = follow.collect_until(TURN, |event| {
        if event.event == "child_status" && event.data["child"]["state"] == "idle" {
            idle_seen.insert(event.data["child"]["id"].as_str().unwrap().to_string());
        }
        idle_seen.len() == 3
    });
    let states: Vec<(String, String)> = events
        .iter()
        .filter(|e| e.event == "child_status")
        .map(|e| {
            (
                e.data["child"]["id"].as_str().unwrap().to_string(),
                e.data["child"]["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for id in &idle_seen {
        let seen: Vec<&str> = states
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, s)| s.as_str())
            .collect();
        // Each child's states arrive in lifecycle order (a report may be skipped when a newer
        // one overtook it, never reordered).
        let order = ["spawning", "queued", "created", "running", "idle"];
        let ranks: Vec<usize> = seen
            .iter()
            .map(|s| order.iter().position(|o| o == s).unwrap())
            .collect();
        assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{id}: {seen:?}");
        assert_eq!(seen.first(), Some(&"spawning"), "{id}: {seen:?}");
        assert_eq!(seen.last(), Some(&"idle"), "{id}: {seen:?}");
    }

    let settled = wait_all_settled(&api, &parent, 3);
    // Every child wrote its file in the parent's environment and said so.
    for name in names {
        let child = settled
            .iter()
            .find(|c| c.title.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no child {name}: {settled:?}"));
        assert_eq!(
            child.lifecycle,
            ChildLifecycle::Idle {
                final_text: Some(format!("wrote {name}.txt"))
            }
        );
        assert_eq!(
            std::fs::read_to_string(work.join(format!("{name}.txt"))).unwrap(),
            format!("from {name}")
        );
        let info = api.session(&child.id).session;
        assert_eq!(info.parent_id.as_deref(), Some(parent.as_str()));
        assert_eq!(info.depth, 1);
        assert_eq!(info.owner, "ana");
    }

    // The parent got one system message per idle child, and answered after them: the last
    // child's message woke it (it was idle after "spawned three").
    let entries = api.transcript(&parent);
    let text = describe(&entries);
    let messages = child_messages(&entries);
    let idle: Vec<&ChildStatus> = messages
        .iter()
        .map(|(_, s)| s)
        .filter(|s| matches!(s.lifecycle, ChildLifecycle::Idle { .. }))
        .collect();
    assert_eq!(idle.len(), 3, "{text}");
    let spawned_at = entries
        .iter()
        .position(|e| assistant(e).is_some_and(|m| m.text() == "spawned three"))
        .unwrap_or_else(|| panic!("{text}"));
    let last_message = messages.iter().map(|(c, _)| *c).max().unwrap();
    let replies: String = entries
        .iter()
        .skip(spawned_at + 1)
        .filter_map(assistant)
        .map(|m| m.text())
        .collect::<Vec<_>>()
        .join("\n");
    for name in names {
        assert!(
            replies.contains(&format!("wrote {name}.txt")),
            "the parent reports {name}:\n{text}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| e.cursor > last_message && assistant(e).is_some()),
        "the parent answered the last child's message:\n{text}"
    );

    // The tree is listed.
    let listed = api.list_sessions(&format!("parentId={parent}"));
    let mut listed_ids: Vec<String> = listed.sessions.iter().map(|s| s.id.clone()).collect();
    let mut child_ids: Vec<String> = settled.iter().map(|c| c.id.clone()).collect();
    listed_ids.sort();
    child_ids.sort();
    assert_eq!(listed_ids, child_ids);
    assert!(api.list_sessions("").sessions.len() >= 4);
}

#[test]
fn a_child_at_the_maximum_depth_gets_no_spawn_tools_and_its_spawn_is_refused() {
    let (api, _tenant) = client("orch-depth");
    let fake = stack().openai();
    let root_model = unique_name("depth-root");
    let child_model = unique_name("depth-child");
    let grand_model = unique_name("depth-grand");
    // Each generation spawns the next with its own model, so the fake tells their requests
    // apart; the grandchild (depth 2) tries anyway.
    fake.script(
        &root_model,
        [Reply::tool_calls([(
            "spawn_session",
            json!({"task": "go", "model": child_model, "wait": true}),
        )])],
    );
    fake.script_always(&root_model, Reply::text("root done"));
    fake.script(
        &child_model,
        [Reply::tool_calls([(
            "spawn_session",
            json!({"task": "go deeper", "model": grand_model, "wait": true}),
        )])],
    );
    fake.script_always(&child_model, Reply::text("child done"));
    fake.script(
        &grand_model,
        [Reply::tool_calls([(
            "spawn_session",
            json!({"task": "too deep"}),
        )])],
    );
    fake.script_always(&grand_model, Reply::text("grandchild done"));
    let root = api
        .create_session(json!({"provider": "openai-compatible", "model": root_model}))
        .id;
    api.enqueue(&root, "followUp", "start");
    let root_children = wait_all_settled(&api, &root, 1);
    let child = &root_children[0].id;
    let grandchild = &children(&api, child)[0].id;
    assert_eq!(api.session(grandchild).session.depth, 2);
    assert!(children(&api, grandchild).is_empty());

    let spawn_tools = [
        "spawn_session",
        "send_to_session",
        "wait_sessions",
        "stop_session",
    ];
    for (model, offered) in [
        (&root_model, true),
        (&child_model, true),
        (&grand_model, false),
    ] {
        let requests = fake.requests_for(model);
        assert!(!requests.is_empty(), "{model}");
        for request in requests {
            let tools = request.tool_names();
            for tool in spawn_tools {
                assert_eq!(
                    tools.iter().any(|t| t == tool),
                    offered,
                    "{model} offered {tool}: {tools:?}"
                );
            }
        }
    }
    let entries = api.transcript(grandchild);
    let refused = entries
        .iter()
        .filter_map(tool_result)
        .find(|r| r.tool_name == "spawn_session")
        .unwrap_or_else(|| panic!("{}", describe(&entries)));
    assert!(refused.is_error, "{}", refused.content);
    assert!(refused.content.contains("depth 2"), "{}", refused.content);
    // The wait of each generation returned the next one's final message.
    let waited = api
        .transcript(child)
        .iter()
        .filter_map(tool_result)
        .find(|r| r.tool_name == "spawn_session")
        .cloned()
        .unwrap();
    assert!(
        waited.content.contains("grandchild done"),
        "{}",
        waited.content
    );
}

#[test]
fn the_tenant_gate_queues_the_fourth_child_until_a_slot_frees() {
    let (api, _tenant) = client("orch-gate");
    let parent = api.create_fake_session().id;
    let mut follow = api.follow(&parent, "");
    // Each child streams for a while (8 chunks, 250 ms apart), so the first three hold their
    // slots while the fourth asks.
    let task = fake_directive(
        &json!({"reply": "one two three four five six seven eight", "chunks": 8, "delayMs": 250}),
    );
    let spawns: Vec<(&str, Value)> = (0..4)
        .map(|i| {
            (
                "spawn_session",
                json!({"task": task, "title": format!("c{i}")}),
            )
        })
        .collect();
    api.enqueue(&parent, "followUp", &calls_then(&spawns, "spawned four"));
    let settled = wait_all_settled(&api, &parent, 4);
    assert!(
        settled
            .iter()
            .all(|c| matches!(c.lifecycle, ChildLifecycle::Idle { .. }))
    );

    let entries = api.transcript(&parent);
    let text = describe(&entries);
    let results: Vec<String> = entries
        .iter()
        .filter_map(tool_result)
        .filter(|r| r.tool_name == "spawn_session")
        .map(|r| r.content.clone())
        .collect();
    assert_eq!(results.len(), 4, "{text}");
    let queued: Vec<&String> = results
        .iter()
        .filter(|r| r.contains("waits for a slot: place 1"))
        .collect();
    assert_eq!(queued.len(), 1, "exactly one waits:\n{results:#?}");
    assert!(
        queued[0].contains("limit 3, WUHU_MAX_RUNNING_SESSIONS"),
        "{}",
        queued[0]
    );

    // On the follow stream, the queued child runs only after another child went idle, and
    // never more than three run at once.
    let mut idle = 0;
    let events = follow.collect_until(TURN, |e| {
        if e.event == "child_status" && e.data["child"]["state"] == "idle" {
            idle += 1;
        }
        idle == 4
    });
    let mut running = std::collections::BTreeSet::new();
    let mut queued_id = None;
    let mut idle_before_queued_ran = 0;
    let mut idle_count = 0;
    for e in events.iter().filter(|e| e.event == "child_status") {
        let id = e.data["child"]["id"].as_str().unwrap().to_string();
        match e.data["child"]["state"].as_str().unwrap() {
            "queued" => queued_id = Some(id),
            "running" => {
                running.insert(id.clone());
                assert!(running.len() <= 3, "{running:?}");
                if Some(&id) == queued_id.as_ref() {
                    idle_before_queued_ran = idle_count;
                }
            }
            "idle" => {
                running.remove(&id);
                idle_count += 1;
            }
            _ => {}
        }
    }
    assert!(queued_id.is_some(), "no queued event");
    assert!(
        idle_before_queued_ran >= 1,
        "the queued child ran before any slot freed"
    );
}

#[test]
fn stopping_a_parent_stops_its_running_children_but_not_detached_ones() {
    let (api, _tenant) = client("orch-stop");
    let parent = api.create_fake_session().id;
    // Long enough to be stopped mid-turn: 40 chunks, 1 s apart.
    let task = fake_directive(
        &json!({"reply": "a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n", "chunks": 40, "delayMs": 1000}),
    );
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(
            &[
                ("spawn_session", json!({"task": task, "title": "attached"})),
                (
                    "spawn_session",
                    json!({"task": task, "title": "detached", "detached": true}),
                ),
            ],
            "spawned two",
        ),
    );
    let running = wait_for("both children running", TURN, || {
        let c = children(&api, &parent);
        (c.len() == 2 && c.iter().all(|c| c.lifecycle == ChildLifecycle::Running)).then_some(c)
    });
    api.wait_idle(&parent, TURN);
    let by_title = |t: &str| {
        running
            .iter()
            .find(|c| c.title.as_deref() == Some(t))
            .unwrap()
            .id
            .clone()
    };
    let (attached, detached) = (by_title("attached"), by_title("detached"));

    api.stop(&parent);
    // The stop answered after the cascade: the attached child is stopped already.
    assert_eq!(
        api.session(&attached).session.status,
        wuhu_core::wire::Status::Stopped
    );
    assert_eq!(
        api.session(&detached).session.status,
        wuhu_core::wire::Status::Running
    );
    // The parent hears of it, but a stopped parent stays stopped.
    wait_for("the parent records the stop", TURN, || {
        children(&api, &parent)
            .iter()
            .any(|c| c.id == attached && c.lifecycle == ChildLifecycle::Stopped)
            .then_some(())
    });
    assert_eq!(
        api.session(&parent).session.status,
        wuhu_core::wire::Status::Stopped
    );
    api.stop(&detached);
}

/// The steering tools act on a session's own children only: a follow-up restarts an idle
/// child, `wait_sessions` returns its new final text, `stop_session` stops it mid-turn; js
/// `wuhu.sessions.*` takes the same argument objects; a child never targets its parent or
/// itself, and a parent never a session that is not its child.
#[test]
fn the_steering_tools_drive_a_sessions_own_children_only() {
    let (api, _tenant) = client("orch-steer");
    let parent = api.create_fake_session().id;
    let reply = |text: &str| fake_directive(&json!({"reply": text}));
    let spawned = api.run_tool(
        &parent,
        "spawn_session",
        json!({"task": reply("first answer"), "title": "kid", "wait": true}),
        TURN,
    );
    assert!(
        !spawned.is_error
            && spawned
                .content
                .contains("idle. Final message:\nfirst answer"),
        "{}",
        spawned.content
    );
    let kid = children(&api, &parent)[0].id.clone();

    // A follow-up to the idle child starts a turn; the wait returns its new final text.
    let sent = api.run_tool(
        &parent,
        "send_to_session",
        json!({"id": kid, "content": reply("second answer")}),
        TURN,
    );
    assert_eq!(sent.content, format!("Sent to {kid}."), "{}", sent.content);
    let waited = api.run_tool(
        &parent,
        "wait_sessions",
        json!({"ids": [kid], "timeoutSeconds": 60}),
        TURN,
    );
    assert!(
        !waited.is_error
            && waited
                .content
                .contains("idle. Final message:\nsecond answer"),
        "{}",
        waited.content
    );
    let kid_entries = api.transcript(&kid);
    assert!(
        kid_entries
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == "second answer"),
        "{}",
        describe(&kid_entries)
    );

    // A child never targets its parent or itself (a wait cycle), even prompted by its owner.
    for (tool, arguments) in [
        (
            "send_to_session",
            json!({"id": parent, "content": "hello parent"}),
        ),
        ("wait_sessions", json!({"ids": [kid], "timeoutSeconds": 1})),
        ("stop_session", json!({"id": parent})),
    ] {
        let refused = api.run_tool(&kid, tool, arguments, TURN);
        assert!(
            refused.is_error
                && refused.content.contains("Refused")
                && refused.content.contains("would form a cycle"),
            "{tool}: {}",
            refused.content
        );
    }
    assert_ne!(
        api.session(&parent).session.status,
        wuhu_core::wire::Status::Stopped
    );
    // A parent never targets a session that is not its child.
    let stranger = api.create_fake_session().id;
    let refused = api.run_tool(
        &parent,
        "send_to_session",
        json!({"id": stranger, "content": "hi"}),
        TURN,
    );
    assert!(
        refused.is_error && refused.content.contains("not a child of this session"),
        "{}",
        refused.content
    );
    assert_eq!(
        api.transcript(&stranger).len(),
        1,
        "the stranger got nothing"
    );

    // stop_session stops the child mid-turn.
    let long = fake_directive(
        &json!({"reply": "a b c d e f g h i j k l m n o p q r s t", "chunks": 20, "delayMs": 1000}),
    );
    api.run_tool(
        &parent,
        "send_to_session",
        json!({"id": kid, "content": long, "lane": "steer"}),
        TURN,
    );
    api.wait_status(&kid, wuhu_core::wire::Status::Running, TURN);
    let stopped = api.run_tool(&parent, "stop_session", json!({"id": kid}), TURN);
    assert_eq!(
        stopped.content,
        format!("Stopped {kid}."),
        "{}",
        stopped.content
    );
    assert_eq!(
        api.session(&kid).session.status,
        wuhu_core::wire::Status::Stopped
    );
    wait_for("the parent records the stop", TURN, || {
        children(&api, &parent)
            .iter()
            .any(|c| c.id == kid && c.lifecycle == ChildLifecycle::Stopped)
            .then_some(())
    });

    // js: the same argument objects, answered with JSON.
    let script = format!(
        "const s = await wuhu.sessions.spawn({{task: {task}, title: 'js-kid'}}); JSON.stringify(s)",
        task = serde_json::to_string(&reply("from js")).unwrap()
    );
    let spawned = api.run_tool(&parent, "js", json!({"code": script}), TURN);
    assert!(!spawned.is_error, "{}", spawned.content);
    let status = js_value(&spawned.content);
    let js_kid = status["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", spawned.content))
        .to_string();
    assert_eq!(status["title"], "js-kid", "{status}");
    let waited = api.run_tool(
        &parent,
        "wait_sessions",
        json!({"ids": [js_kid], "timeoutSeconds": 60}),
        TURN,
    );
    assert!(
        waited.content.contains("idle. Final message:\nfrom js"),
        "{}",
        waited.content
    );
    let script = format!(
        "const w = await wuhu.sessions.wait({{ids: ['{js_kid}'], timeoutSeconds: 2}}); const x = await wuhu.sessions.stop({{id: '{js_kid}'}}); JSON.stringify([w[0].state, w[0].finalText, x.stopped])"
    );
    let done = api.run_tool(&parent, "js", json!({"code": script}), TURN);
    assert_eq!(
        js_value(&done.content),
        json!(["idle", "from js", true]),
        "{}",
        done.content
    );
    assert_eq!(
        api.session(&js_kid).session.status,
        wuhu_core::wire::Status::Stopped
    );
}

/// What a `js` script returned (its result is JSON; a string holding JSON is read again).
#[track_caller]
fn js_value(content: &str) -> Value {
    let value: Value =
        serde_json::from_str(content.trim()).unwrap_or_else(|e| panic!("{e}: {content}"));
    match value {
        Value::String(inner) => {
            serde_json::from_str(&inner).unwrap_or_else(|e| panic!("{e}: {content}"))
        }
        other => other,
    }
}

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=Wuhu Test",
            "-c",
            "user.email=test@wuhu.invalid",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `spawn_session {environment: <definition>}`: the definition says how the child gets its
/// working directory. A `worktree` definition gives each child its own worktree and branch
/// (named after the child), the parent none.
#[test]
fn a_definition_given_at_spawn_makes_each_child_its_own_worktree() {
    let (api, tenant) = client("orch-worktree");
    let dir = TempDir::new("wuhu-e2e-orch-worktree");
    let repo = dir.mkdir("repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    dir.write("repo/hello.txt", "hello from main\n");
    git(&repo, &["add", "hello.txt"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    let runner = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac").workspaces_root(dir.mkdir("workspaces")),
    );
    let defined = api.post(
        "/v1/environments",
        &json!({"name": "repo", "kind": "worktree", "runner": "mac", "repoPath": repo, "keepWorktree": true}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let parent = api.create_fake_session().id;

    // `keepWorktree`: the worktrees stay when the children end (checked below).
    let names = ["a", "b"];
    let spawns: Vec<(&str, Value)> = names
        .iter()
        .map(|name| {
            let task = calls_then(
                &[(
                    "bash",
                    json!({"command": format!("echo {name} > {name}.txt && git rev-parse --abbrev-ref HEAD")}),
                )],
                &format!("done {name}"),
            );
            (
                "spawn_session",
                json!({"task": task, "title": name, "environment": "repo"}),
            )
        })
        .collect();
    api.enqueue(&parent, "followUp", &calls_then(&spawns, "spawned two"));
    let settled = wait_all_settled(&api, &parent, 2);
    let parent_entries = api.transcript(&parent);
    assert!(
        api.session(&parent).environments.is_empty(),
        "the parent got no environment:\n{}",
        describe(&parent_entries)
    );
    for name in names {
        let child = settled
            .iter()
            .find(|c| c.title.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no child {name}: {settled:?}"));
        let short: String = child
            .id
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect();
        let branch = format!("wuhu/{short}");
        let root = runner.workspaces_root().join(&child.id);
        // Its own worktree, on its own branch, with its own file only.
        assert_eq!(
            std::fs::read_to_string(root.join(format!("{name}.txt"))).unwrap(),
            format!("{name}\n")
        );
        for other in names.iter().filter(|o| **o != name) {
            assert!(!root.join(format!("{other}.txt")).exists());
        }
        assert!(!repo.join(format!("{name}.txt")).exists());
        let entries = api.transcript(&child.id);
        let text = describe(&entries);
        let notice = entries
            .iter()
            .find_map(|e| match &e.payload {
                EntryPayload::Custom { custom_type, data }
                    if custom_type == custom_types::ENVIRONMENT_ATTACHED =>
                {
                    Some(data.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no attached notice in the child:\n{text}"));
        assert_eq!(notice["branch"], json!(branch), "{notice}");
        assert_eq!(notice["root"], json!(root), "{notice}");
        let ran = entries
            .iter()
            .filter_map(tool_result)
            .map(|r| r.content.clone())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(ran.contains(&branch), "{text}");
        let page = api.session(&child.id);
        assert_eq!(page.environments.len(), 1, "{text}");
        assert_eq!(child.branch, None, "kept, not ended: {child:?}");
    }
    let branches = git(&repo, &["branch", "--list", "wuhu/*"]);
    assert_eq!(branches.lines().count(), 2, "{branches}");

    // A definition that does not exist fails the spawn, visibly, and the child is not made.
    let before = api.session(&parent).children.len();
    let missing = api.run_tool(
        &parent,
        "spawn_session",
        json!({"task": "x", "environment": "no-such-definition"}),
        TURN,
    );
    assert!(missing.is_error, "{}", missing.content);
    assert!(
        missing.content.contains("no-such-definition"),
        "{}",
        missing.content
    );
    let after = api.session(&parent).children;
    assert_eq!(after.len(), before + 1);
    assert!(matches!(
        after.last().unwrap().lifecycle,
        ChildLifecycle::Failed { .. }
    ));
}

/// A git repository with one commit on `main`, under `dir`.
fn repo_with_a_commit(dir: &TempDir) -> std::path::PathBuf {
    let repo = dir.mkdir("repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    dir.write("repo/hello.txt", "hello from main\n");
    git(&repo, &["add", "hello.txt"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    repo
}

/// `wuhu/<first 8 letters or digits of the id>`: the branch a child's worktree is on.
fn branch_of(id: &str) -> String {
    let short: String = id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("wuhu/{short}")
}

/// Construct when ready (seed 002): a spawn queued behind a full gate makes nothing on the
/// runner while it waits; its worktree is made when it gets its slot, before its task runs. A
/// queued spawn stopped before it ever gets a slot makes nothing at all. One lifespan: when the
/// child ends its worktree is removed, its branch kept, and `child_status` says which branch
/// and commit.
#[test]
fn a_spawn_queued_behind_a_full_gate_has_no_worktree_until_it_starts() {
    let (api, tenant) = client("orch-construct");
    let dir = TempDir::new("wuhu-e2e-orch-construct");
    let repo = repo_with_a_commit(&dir);
    let runner = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac").workspaces_root(dir.mkdir("workspaces")),
    );
    let defined = api.post(
        "/v1/environments",
        &json!({"name": "repo", "kind": "worktree", "runner": "mac", "repoPath": repo}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let parent = api.create_fake_session().id;
    // Three children hold the tenant's three slots for 6 s each (24 chunks, 250 ms apart).
    let hold = fake_directive(
        &json!({"reply": "holding a slot for a while", "chunks": 24, "delayMs": 250}),
    );
    let mut spawns: Vec<(&str, Value)> = (0..3)
        .map(|i| {
            (
                "spawn_session",
                json!({"task": hold, "title": format!("hold{i}")}),
            )
        })
        .collect();
    let task = calls_then(
        &[(
            "bash",
            json!({"command": "git rev-parse --abbrev-ref HEAD"}),
        )],
        "late done",
    );
    for title in ["late", "never"] {
        spawns.push((
            "spawn_session",
            json!({"task": task, "title": title, "environment": "repo"}),
        ));
    }
    api.enqueue(&parent, "followUp", &calls_then(&spawns, "spawned five"));
    let queued = |title: &str| {
        wait_for(&format!("{title} queued"), TURN, || {
            children(&api, &parent).into_iter().find(|c| {
                c.title.as_deref() == Some(title)
                    && matches!(c.lifecycle, ChildLifecycle::Queued { .. })
            })
        })
    };
    let late = queued("late");
    let never = queued("never");
    // While they wait: no worktree, no branch, no environment.
    for child in [&late, &never] {
        let root = runner.workspaces_root().join(&child.id);
        assert!(!root.exists(), "{} exists while queued", root.display());
        let branches = git(&repo, &["branch", "--list", &branch_of(&child.id)]);
        assert!(branches.trim().is_empty(), "{branches}");
        assert!(api.session(&child.id).environments.is_empty());
    }
    assert!(
        children(&api, &parent)
            .iter()
            .filter(|c| c.title.as_deref() == Some("late") || c.title.as_deref() == Some("never"))
            .all(|c| matches!(c.lifecycle, ChildLifecycle::Queued { .. })),
        "a queued child started while its worktree was looked for: the check saw nothing"
    );
    // Stopped before it gets a slot: it never makes anything.
    assert_eq!(
        api.post(&format!("/v1/sessions/{}/stop", never.id), &json!({}))
            .status,
        200
    );

    let settled = wait_for("the holders and late settled", TURN, || {
        let page = api.session(&parent);
        let done = page.children.len() == 5
            && page.children.iter().all(|c| c.lifecycle.is_settled())
            && page.children.iter().any(|c| {
                c.title.as_deref() == Some("late")
                    && matches!(c.lifecycle, ChildLifecycle::Idle { .. })
            })
            && page.session.status == wuhu_core::wire::Status::Idle;
        done.then_some(page.children)
    });
    let late_id = settled
        .iter()
        .find(|c| c.title.as_deref() == Some("late"))
        .unwrap()
        .id
        .clone();
    let entries = api.transcript(&late_id);
    let text = describe(&entries);
    // Made when it started: the notice comes before its task, on its own branch.
    let notice = entries
        .iter()
        .find(|e| matches!(&e.payload, EntryPayload::Custom { custom_type, .. } if custom_type == custom_types::ENVIRONMENT_ATTACHED))
        .unwrap_or_else(|| panic!("no attached notice:\n{text}"));
    let task_at = entries
        .iter()
        .find(|e| {
            matches!(
                &e.payload,
                EntryPayload::Message {
                    message: Message::User { .. }
                }
            )
        })
        .unwrap_or_else(|| panic!("no task:\n{text}"))
        .cursor;
    assert!(
        notice.cursor < task_at,
        "the environment was made after the task ran:\n{text}"
    );
    // One lifespan: it ended, so its worktree is gone, its branch (and the commit it was at)
    // kept, and its parent's record says where.
    let late_root = runner.workspaces_root().join(&late_id);
    wait_for("the late child's worktree removed", TURN, || {
        (!late_root.exists()).then_some(())
    });
    let head = git(&repo, &["rev-parse", &branch_of(&late_id)]);
    let record = wait_for("the branch and head in child_status", TURN, || {
        children(&api, &parent)
            .into_iter()
            .find(|c| c.id == late_id && c.head.is_some())
    });
    assert_eq!(record.branch.as_deref(), Some(branch_of(&late_id).as_str()));
    assert_eq!(record.head.as_deref(), Some(head.trim()));
    assert!(api.session(&late_id).environments.is_empty());
    let ran: String = entries
        .iter()
        .filter_map(tool_result)
        .map(|r| r.content.clone())
        .collect();
    assert!(ran.contains(&branch_of(&late_id)), "{text}");
    // The stopped one: nothing on the runner, ever.
    assert!(!runner.workspaces_root().join(&never.id).exists());
    let branches = git(&repo, &["branch", "--list", &branch_of(&never.id)]);
    assert!(branches.trim().is_empty(), "{branches}");
    assert!(api.session(&never.id).environments.is_empty());
}

/// Deleting a session removes its git worktrees on the runner (their branches kept), also when
/// the runner is away at the deletion: the removal waits for it and happens when it connects
/// again (decision 0017's discards).
#[test]
fn deleting_a_session_removes_its_worktree_even_from_a_runner_away_at_the_time() {
    let (api, tenant) = client("orch-delete-worktree");
    let dir = TempDir::new("wuhu-e2e-orch-delete-worktree");
    let repo = repo_with_a_commit(&dir);
    let mut runner = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac").workspaces_root(dir.mkdir("workspaces")),
    );
    let defined = api.post(
        "/v1/environments",
        &json!({"name": "repo", "kind": "worktree", "runner": "mac", "repoPath": repo}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let sessions: Vec<String> = (0..2).map(|_| api.create_fake_session().id).collect();
    for id in &sessions {
        let attached = api.run_tool(id, "request_environment", json!({"spec": "repo"}), TURN);
        assert!(!attached.is_error, "{}", attached.content);
        let wrote = api.run_tool(
            id,
            "bash",
            json!({"command": "echo work > work.txt && git add work.txt && git -c user.name=w -c user.email=w@w.invalid commit -q -m work"}),
            TURN,
        );
        assert!(!wrote.is_error, "{}", wrote.content);
    }
    let delete = |id: &str| {
        api.send(api.request("DELETE", &format!("/v1/sessions/{id}")))
            .status
    };
    let discarded = |runner: &Runner, id: &str| {
        let said = format!("session {id} was deleted: discarded its workspaces");
        wait_for(&said, TURN, || runner.log().contains(&said).then_some(()));
    };
    let kept = |id: &str| {
        let log = git(&repo, &["log", "--format=%s", &branch_of(id)]);
        assert!(log.starts_with("work\n"), "{log}");
    };

    // The runner is there: removed at once, its branch (with its commit) kept.
    let online = &sessions[0];
    assert!(runner.workspaces_root().join(online).exists());
    assert_eq!(delete(online), 204);
    discarded(&runner, online);
    assert!(!runner.workspaces_root().join(online).exists());
    kept(online);

    // The runner is away: nothing can be removed yet; when it connects, it is.
    let away = &sessions[1];
    let root = runner.workspaces_root().join(away);
    runner.kill_hard();
    assert_eq!(delete(away), 204);
    assert!(root.join("work.txt").exists());
    runner.restart();
    discarded(&runner, away);
    assert!(!root.exists(), "{} is still there", root.display());
    kept(away);
    let listed = git(&repo, &["worktree", "list"]);
    assert_eq!(
        listed.lines().count(),
        1,
        "only the repository's own: {listed}"
    );
}

/// A child's usage counts against its parent's budget too: each report carries what the child
/// (and its own children) spent, and the parent's budget counts their sum with its own.
#[test]
fn what_a_child_spends_counts_against_its_parents_budget() {
    let (api, _tenant) = client("orch-budget");
    let parent = api.create_fake_session().id;
    // The child's second request carries a 40,000-character tool result: over 10,000 tokens.
    let task = calls_then(
        &[("js", json!({"code": "'x'.repeat(40000)"}))],
        "spent plenty",
    );
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(
            &[("spawn_session", json!({"task": task, "title": "spender"}))],
            "spawned",
        ),
    );
    wait_all_settled(&api, &parent, 1);
    let child_spent = wait_for("the child's spending reported", TURN, || {
        let children = children(&api, &parent);
        let spent = children[0].spent?;
        (spent.tokens >= 10_000).then_some(spent.tokens)
    });
    let page = api.wait_idle(&parent, TURN);
    let usage = api.get(&format!("/v1/sessions/{parent}/usage")).json();
    let own = usage["inputTokens"].as_u64().unwrap() + usage["outputTokens"].as_u64().unwrap();
    assert!(own < child_spent, "own {own}, child {child_spent}");
    // Under the budget by its own requests, over it with its child's.
    let budget = own + child_spent / 2;
    let patched = api.patch(
        &format!("/v1/sessions/{parent}"),
        &json!({"budget": {"maxTokens": budget}}),
    );
    assert_eq!(patched.status, 200, "{patched}");
    let refused = api.enqueue_raw(&parent, "followUp", "more");
    assert_eq!(refused.status, 402, "{refused}");
    assert_eq!(
        refused.json()["error"]["code"],
        "budget_exceeded",
        "{refused}"
    );
    // Raised past both, the parent goes on.
    let patched = api.patch(
        &format!("/v1/sessions/{parent}"),
        &json!({"budget": {"maxTokens": own + child_spent + 100_000}}),
    );
    assert_eq!(patched.status, 200, "{patched}");
    api.enqueue(&parent, "followUp", "more");
    assert!(page.session.last_cursor > 0);
}

/// A child starts with its parent's global context (issue 35, seed 000), as a session of the
/// parent's owner would: the owner's `users/<sub>/context.md`, read at spawn.
#[test]
fn a_child_starts_with_its_parents_global_context() {
    let (api, _tenant) = client("orch-context");
    let text = "Ana works on the billing service; ask before touching infra/.\n";
    api.put_doc("users/ana/context.md", text).expect_status(200);
    let parent = api.create_fake_session().id;
    api.enqueue(
        &parent,
        "followUp",
        &calls_then(
            &[("spawn_session", json!({"task": "say hi", "title": "ctx"}))],
            "spawned",
        ),
    );
    let settled = wait_all_settled(&api, &parent, 1);
    let child = api.transcript(&settled[0].id);
    let context = wuhu_e2e::entries::custom_message_content(&child, custom_types::GLOBAL_CONTEXT);
    let context = context.unwrap_or_else(|| panic!("no global context: {}", describe(&child)));
    assert!(
        context.contains("wuhu://workspace/users/ana/context.md") && context.contains(text),
        "{context}"
    );
}
