//! Deleting a session (`DELETE /v1/sessions/:id`, decision 0017) through the real Worker and a
//! real `wuhu-runner`: deleted at any moment of a turn, nothing of it remains (not in reads,
//! the list, follow, blobs, nor the objects in local R2) and nothing answers 5xx; its running
//! command is killed; who may delete; a deleted child is `disposed` to its parent, and a
//! deleted parent takes its children with it; the forks rule.
//!
//! One `wrangler dev` for the file; every test uses its own tenant.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::{ChildLifecycle, ChildStatus, EntryPayload, Message, custom_types};
use wuhu_e2e::cli::{Wuhu, wuhu_bin};
use wuhu_e2e::entries::fake_directive;
use wuhu_e2e::http::Response;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::{random_hex, unique_name};
use wuhu_e2e::{Api, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(90);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(|| {
        // Built before the stack starts, so a slow build does not eat a test's deadlines.
        wuhu_bin();
        StackOptions {
            fake_delay_ms: Some(0),
            ..StackOptions::default()
        }
    })
}

fn delete(api: &Api, id: &str) -> Response {
    api.send(api.request("DELETE", &format!("/v1/sessions/{id}")))
}

/// Every answer about a deleted session: 404 with a JSON error, never anything else.
#[track_caller]
fn assert_gone(api: &Api, id: &str) {
    for (what, response) in [
        ("read", api.get(&format!("/v1/sessions/{id}"))),
        ("stats", api.get(&format!("/v1/sessions/{id}/stats"))),
        ("usage", api.get(&format!("/v1/sessions/{id}/usage"))),
        (
            "follow",
            api.get(&format!("/v1/sessions/{id}/follow?timeoutSeconds=2")),
        ),
        (
            "prompt",
            api.post(
                &format!("/v1/sessions/{id}/enqueue"),
                &json!({"content": "anyone there?"}),
            ),
        ),
        (
            "fork",
            api.post(&format!("/v1/sessions/{id}/fork"), &json!({"atCursor": 1})),
        ),
        ("delete again", delete(api, id)),
    ] {
        assert_eq!(response.status, 404, "{what} of deleted {id}: {response}");
        assert_eq!(
            response.json()["error"]["code"],
            "not_found",
            "{what}: {response}"
        );
    }
    let listed = api.list_sessions("limit=200");
    assert!(
        listed.sessions.iter().all(|s| s.id != id),
        "{id} is still listed"
    );
}

/// Files of local R2 holding the bodies of live objects: the blob files that local R2's
/// metadata (`_mf_objects`, `_mf_multipart_parts` in `miniflare-R2BucketObject/*.sqlite`)
/// still names. Local R2 drops an object's row at once and deletes its blob file later, in the
/// background; a process killed in between leaves a file that no object names (seen once under
/// load: `_mf_objects` empty, the body on disk). Real R2 has no such files, so a body counts
/// only while an object refers to it. SQLite's own files are never bodies (freed pages may keep
/// old bytes).
fn r2_bodies(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut databases = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in read.flatten() {
            let path = entry.path();
            let text = path.to_string_lossy();
            let in_r2 = text.contains("/r2/");
            if path.is_dir() {
                stack.push(path);
            } else if in_r2 && text.contains("/blobs/") {
                files.push(path);
            } else if in_r2
                && path.extension().is_some_and(|e| e == "sqlite")
                && text.contains("miniflare-R2BucketObject")
                && path.file_name().is_some_and(|n| n != "metadata.sqlite")
            {
                databases.push(path);
            }
        }
    }
    let named = r2_named_blobs(&databases);
    files
        .into_iter()
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| named.contains(n.to_string_lossy().as_ref()))
        })
        .collect()
}

/// The blob ids that local R2's object databases name (read with Python's `sqlite3`, which
/// every machine that runs these tests has: the set-up needs it).
fn r2_named_blobs(databases: &[PathBuf]) -> std::collections::HashSet<String> {
    if databases.is_empty() {
        return Default::default();
    }
    const SCRIPT: &str = r#"
import sqlite3, sys
for path in sys.argv[1:]:
    db = sqlite3.connect("file:" + path + "?mode=ro", uri=True, timeout=30)
    for table in ("_mf_objects", "_mf_multipart_parts"):
        try:
            for (blob,) in db.execute("SELECT blob_id FROM " + table):
                print(blob)
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .args(databases)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "reading local R2's metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The R2 object bodies of the file's stack that contain `needle`.
fn r2_objects_with(needle: &str) -> Vec<PathBuf> {
    r2_objects_in(stack().persist_dir(), needle)
}

/// The R2 object bodies under state dir `dir` that contain `needle`.
fn r2_objects_in(dir: &Path, needle: &str) -> Vec<PathBuf> {
    r2_bodies(dir)
        .into_iter()
        .filter(|p| {
            std::fs::read(p)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .collect()
}

/// Whether a process whose command line contains `needle` runs.
fn process_running(needle: &str) -> bool {
    let Ok(read) = std::fs::read_dir("/proc") else {
        return false;
    };
    read.flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| {
            cmdline
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
        })
    })
}

/// Deleted at every moment of a turn (before it starts, while the reply streams, while its
/// command runs on the runner): the deletion is acknowledged (204), nothing of
/// the session answers but 404, the running command is killed, and none of its objects (archive
/// segments, blobs) is left in R2. The invariant is checked for each moment, not one example.
#[test]
fn nothing_of_a_session_remains_whenever_it_is_deleted() {
    let tenant = unique_name("del-moments");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-deletion");
    let work = dir.mkdir("work");
    let _runner = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac")
            .workspaces_root(dir.mkdir("workspaces"))
            .env("work", &work),
    );
    let survivor = api.create_fake_session().id;
    // Moment k: delete after the k-th event of the second turn's follow stream (0: at once;
    // a large k: after the turn ended).
    for moment in [0usize, 1, 2, 4, 6, 9, 1000] {
        let mark = format!("MARK{}", random_hex(8));
        let id = api.create_fake_session().id;
        let attached = api.run_tool(&id, "request_environment", json!({"spec": "work"}), TURN);
        assert!(!attached.is_error, "{}", attached.content);
        // A long output: a blob in R2; the turn's end flushes the transcript to R2.
        let turn = ToolTurn::start(
            &api,
            &id,
            &[(
                "bash",
                json!({"command": format!("seq -f '{mark}-%08g' 1 40000")}),
            )],
        );
        let (results, _) = turn.finish(&api, TURN);
        let blob = results[0].blobs.first().expect("a blob").uri.clone();
        let blob_id = blob.strip_prefix("wuhu://blob/").unwrap().to_string();
        assert_eq!(api.get(&format!("/v1/blobs/{blob_id}")).status, 200);
        wait_for("the archive and the blob in R2", TURN, || {
            (r2_objects_with(&mark).len() >= 2).then_some(())
        });

        // The second turn: a slowly streamed reply, then a command that runs until killed.
        let sleeper = format!("3600.{}", 1000 + moment);
        let mut follow = api.follow(&id, "");
        let content = fake_directive(&json!({
            "reply": format!("{mark} thinking about it for a while"),
            "chunks": 6,
            "delayMs": 150,
            "toolCalls": [{"name": "bash", "arguments": {"command": format!("sleep {sleeper}")}}],
            "afterTools": "slept",
        }));
        api.enqueue(&id, "followUp", &content);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = 0;
        while seen < moment {
            match follow.next_event(deadline) {
                Ok(Some(_)) => seen += 1,
                _ => break,
            }
        }
        if moment == 1000 {
            // After the turn: only when the command runs can it be seen killed.
            wait_for("the command runs", TURN, || {
                process_running(&sleeper).then_some(())
            });
        }

        let response = delete(&api, &id);
        assert_eq!(response.status, 204, "moment {moment}: {response}");
        // The follower is told, and its stream ends.
        let rest = follow.collect_to_end(Duration::from_secs(10));
        let last = rest.last().map(|e| (e.event.clone(), e.data.clone()));
        assert!(
            last.as_ref()
                .is_some_and(|(event, data)| event == "error"
                    && data["message"] == "the session was deleted"),
            "moment {moment}: the stream ended with {last:?}"
        );
        assert_gone(&api, &id);
        assert_eq!(
            api.get(&format!("/v1/blobs/{blob_id}")).status,
            404,
            "moment {moment}: the blob is still served"
        );
        wait_for("the command killed", Duration::from_secs(30), || {
            (!process_running(&sleeper)).then_some(())
        });
        let left = wait_for_value("no object of the session in R2", || {
            let left = r2_objects_with(&mark);
            left.is_empty().then_some(()).ok_or(left)
        });
        assert!(
            left.is_ok(),
            "moment {moment}: objects left in R2: {left:?}"
        );
    }
    // Another session of the tenant is untouched.
    assert_eq!(api.get(&format!("/v1/sessions/{survivor}")).status, 200);
}

/// Polls `probe` until it is `Ok` or 20 s passed; the last `Err` otherwise.
fn wait_for_value<E>(_what: &str, mut probe: impl FnMut() -> Result<(), E>) -> Result<(), E> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match probe() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Only the owner or an admin deletes; others get what they get for any action they may not
/// do (404 when they cannot read it, 403 when they can), and the session survives.
#[test]
fn only_the_owner_or_an_admin_deletes() {
    let stack = stack();
    let tenant = unique_name("del-who");
    let alice = stack.client("alice", &tenant);
    let bob = stack.client("bob", &tenant);
    let root = stack.admin_client("root", &tenant);
    let mallory = stack.client("alice", &unique_name("other"));

    let id = alice.create_fake_session().id;
    for (who, api) in [("bob", &bob), ("another tenant", &mallory)] {
        let response = delete(api, &id);
        assert_eq!(response.status, 404, "{who}: {response}");
        assert_eq!(response.json()["error"]["code"], "not_found");
    }
    // Bob can read a tenant session, but not delete it.
    alice
        .patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}))
        .expect_status(200);
    let response = delete(&bob, &id);
    assert_eq!(response.status, 403, "{response}");
    assert_eq!(response.json()["error"]["code"], "forbidden");
    assert_eq!(alice.get(&format!("/v1/sessions/{id}")).status, 200);
    assert_eq!(bob.get(&format!("/v1/sessions/{id}")).status, 200);

    // An admin may.
    assert_eq!(delete(&root, &id).status, 204);
    assert_gone(&alice, &id);
    assert_gone(&root, &id);

    // The owner may; an unknown or malformed id is a JSON 404.
    let own = bob.create_fake_session().id;
    assert_eq!(delete(&bob, &own).status, 204);
    assert_gone(&bob, &own);
    for unknown in ["00000000-0000-4000-8000-000000000000", "not-a-session"] {
        let response = delete(&bob, unknown);
        assert_eq!(response.status, 404, "{response}");
        assert_eq!(response.json()["error"]["code"], "not_found");
    }
}

fn child_statuses(entries: &[wuhu_core::wire::Entry]) -> Vec<ChildStatus> {
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
                serde_json::from_value(details.clone()).ok()
            }
            _ => None,
        })
        .collect()
}

fn spawn_child(api: &Api, parent: &str, title: &str) -> String {
    let content = fake_directive(&json!({
        "toolCalls": [{"name": "spawn_session", "arguments": {"task": "say hi", "title": title}}],
        "afterTools": format!("spawned {title}"),
    }));
    api.enqueue(parent, "followUp", &content);
    wait_for("the child idle and the parent idle", TURN, || {
        let page = api.session(parent);
        let child = page
            .children
            .iter()
            .find(|c| c.title.as_deref() == Some(title))?;
        (child.lifecycle.is_settled() && page.session.status == wuhu_core::wire::Status::Idle)
            .then(|| child.id.clone())
    })
}

/// A deleted child is `disposed` to its parent (a `custom_message` on its `system` lane, a
/// `child_status` to its followers, its record); a deleted parent takes its children with it.
#[test]
fn a_deleted_child_is_disposed_to_its_parent_and_a_deleted_parent_takes_its_children() {
    let tenant = unique_name("del-tree");
    let api = stack().client("ana", &tenant);
    let parent = api.create_fake_session().id;
    let first = spawn_child(&api, &parent, "first");
    let mut follow = api.follow(&parent, "");

    assert_eq!(delete(&api, &first).status, 204);
    assert_gone(&api, &first);
    follow.collect_until(TURN, |event| {
        event.event == "child_status"
            && event.data["child"]["id"] == first.as_str()
            && event.data["child"]["state"] == "disposed"
    });
    let entries = api.wait_transcript(&parent, "the disposed message", TURN, |entries| {
        child_statuses(entries)
            .iter()
            .any(|s| s.id == first && s.lifecycle == ChildLifecycle::Disposed)
    });
    assert!(child_statuses(&entries).iter().any(|s| s.id == first
        && s.lifecycle == ChildLifecycle::Disposed
        && s.title.as_deref() == Some("first")));
    let recorded = api.session(&parent).children;
    assert!(
        recorded
            .iter()
            .any(|c| c.id == first && c.lifecycle == ChildLifecycle::Disposed),
        "{recorded:?}"
    );

    // The parent with a child of its own (and a grandchild): all of them go.
    let second = spawn_child(&api, &parent, "second");
    let grandchild = spawn_child(&api, &second, "grandchild");
    assert_eq!(delete(&api, &parent).status, 204);
    for id in [&parent, &second, &grandchild] {
        assert_gone(&api, id);
    }
}

/// A fork reads its history from the forked session, so the forked session's deletion takes
/// its forks with it (decision 0033), whoever made them: bob's fork of alice's shared session
/// (his own private session, which alice cannot even see) never blocks her `DELETE` (no `409`
/// naming a session she cannot see), and bob then finds his fork, and the fork of his fork,
/// gone. A fork's own deletion leaves the forked session whole.
#[test]
fn deleting_a_session_takes_every_fork_of_it_with_it() {
    let tenant = unique_name("del-forks");
    let alice = stack().client("ana", &tenant);
    let bob = stack().client("bo", &tenant);
    let id = alice.create_fake_session().id;
    alice
        .patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}))
        .expect_status(200);
    alice.enqueue(&id, "followUp", "remember the tulips");
    alice.wait_idle(&id, TURN);
    let fork = |api: &Api, of: &str, at: u64| -> String {
        let fork: Value = api
            .post(&format!("/v1/sessions/{of}/fork"), &json!({"atCursor": at}))
            .expect_status(201)
            .json();
        fork["id"].as_str().unwrap().to_string()
    };
    let bobs_fork = fork(&bob, &id, 2);
    let bobs_fork_of_fork = fork(&bob, &bobs_fork, 1);
    let alices_fork = fork(&alice, &id, 2);
    // Bob's forks are his, private: alice cannot see them.
    assert_eq!(alice.get(&format!("/v1/sessions/{bobs_fork}")).status, 404);
    assert!(bob.transcript(&bobs_fork).len() >= 2);

    // A fork's own deletion leaves what it forked whole.
    assert_eq!(delete(&alice, &alices_fork).status, 204);
    assert_gone(&alice, &alices_fork);
    assert_eq!(alice.get(&format!("/v1/sessions/{id}")).status, 200);

    // Alice deletes her session: nothing to refuse, and bob's forks go with it.
    let deleted = delete(&alice, &id);
    assert_eq!(deleted.status, 204, "{deleted}");
    assert_gone(&alice, &id);
    for gone in [&bobs_fork, &bobs_fork_of_fork] {
        assert_gone(&bob, gone);
    }
    let listed: Value = bob.get("/v1/sessions").expect_status(200).json();
    let listed: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    for gone in [&id, &bobs_fork, &bobs_fork_of_fork] {
        assert!(
            !listed.contains(&gone.as_str()),
            "{gone} still listed: {listed:?}"
        );
    }
}

/// `wuhu sessions rm ID`: deletes (exit 0, `--json` `{"deleted","finished":true}`); the exit
/// codes of the refusals: 2 for someone who sees it but may not, 3 for a session that is not
/// there (also the second time).
#[test]
fn the_cli_deletes_with_rm() {
    let stack = stack();
    let tenant = unique_name("del-cli");
    let cli = |sub: &str| {
        Wuhu::new()
            .env("WUHU_SERVER", &stack.base_url())
            .env("WUHU_TOKEN", &stack.user_token(sub, &tenant))
    };
    let api = stack.client("ana", &tenant);
    let id = api.create_fake_session().id;
    api.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}))
        .expect_status(200);

    let refused = cli("bo").run(&["--json", "sessions", "rm", &id]);
    assert_eq!(refused.code(), 2, "{refused:?}");
    assert_eq!(refused.error_json()["error"]["code"], "forbidden");

    let fork: Value = api
        .post(&format!("/v1/sessions/{id}/fork"), &json!({"atCursor": 1}))
        .expect_status(201)
        .json();
    let fork_id = fork["id"].as_str().unwrap();
    let deleted = cli("ana").run(&["--json", "sessions", "rm", fork_id]).ok();
    assert_eq!(
        deleted.json(),
        json!({"deleted": fork_id, "finished": true})
    );
    // A follower of the session (`sessions follow`) ends "not found" (exit 3) when it goes.
    let mut follower = cli("ana").spawn(&["sessions", "follow", &id]);
    let deleted = cli("ana").run(&["sessions", "rm", &id]).ok();
    assert_eq!(deleted.stdout.trim(), format!("deleted {id}"));
    assert_gone(&api, &id);
    let exited = follower.wait_exit(Duration::from_secs(60));
    assert_eq!(exited.code(), Some(3), "{}", follower.stderr());
    let again = cli("ana").run(&["sessions", "rm", &id]);
    assert_eq!(again.code(), 3, "{again:?}");
}

/// SIGKILLed while deletions run (once the k-th of six is answered, for several k), then
/// started again on the same state: every session ends whole or gone, never half. Whole: it and
/// its child read and it is listed, its archive in R2; gone: it and its child answer 404, it is
/// not listed and none of its objects is left in R2. Every deletion that was answered ends gone
/// (a marked session is finished by its alarm, with nobody asking), and no answer was a 5xx.
#[test]
fn deletions_cut_by_a_crash_finish_or_never_started() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_FAULT_DELETION".into(), "fail_objects".into())],
        ..StackOptions::default()
    });
    let tenant = unique_name("del-crash");

    // First, deterministically: a deletion whose objects step fails is acknowledged with 202,
    // hidden at once (404, unlisted, its child deleted) but not finished (its objects are in
    // R2); killed and started again with storage healthy, its alarm finishes it unasked.
    let api = stack.client("ana", &tenant);
    let mark = format!("CRASH{}", random_hex(8));
    let id = api.create_fake_session().id;
    api.enqueue(&id, "followUp", &format!("remember {mark}"));
    api.wait_idle(&id, TURN);
    let child = spawn_child(&api, &id, "child");
    wait_for("the archive in R2", TURN, || {
        (!r2_objects_in(stack.persist_dir(), &mark).is_empty()).then_some(())
    });
    assert_eq!(delete(&api, &id).status, 202);
    assert_eq!(api.get(&format!("/v1/sessions/{id}")).status, 404);
    assert_eq!(api.get(&format!("/v1/sessions/{child}")).status, 404);
    assert!(
        api.list_sessions("limit=200")
            .sessions
            .iter()
            .all(|s| s.id != id)
    );
    assert!(!r2_objects_in(stack.persist_dir(), &mark).is_empty());
    assert_eq!(delete(&api, &id).status, 202, "still not finished");
    stack.set_var("WUHU_FAULT_DELETION", None);
    stack.restart_killed();
    wait_for(
        "the alarm to finish the deletion",
        Duration::from_secs(120),
        || {
            r2_objects_in(stack.persist_dir(), &mark)
                .is_empty()
                .then_some(())
        },
    );
    let api = stack.client("ana", &tenant);
    assert_gone(&api, &id);

    // Then killed at moments the test does not choose.
    let mut outcomes = Vec::new();
    for kill_after in [1usize, 3, 5] {
        let api = stack.client("ana", &tenant);
        let mut sessions = Vec::new();
        for n in 0..6 {
            let mark = format!("CRASH{}", random_hex(8));
            let id = api.create_fake_session().id;
            api.enqueue(&id, "followUp", &format!("remember {mark}"));
            api.wait_idle(&id, TURN);
            let child = spawn_child(&api, &id, &format!("child {n}"));
            wait_for("the archive in R2", TURN, || {
                (!r2_objects_in(stack.persist_dir(), &mark).is_empty()).then_some(())
            });
            sessions.push((id, child, mark));
        }

        let (answered, answers) = std::sync::mpsc::channel();
        let deletions: Vec<_> = sessions
            .iter()
            .map(|(id, _, _)| {
                let request = api.request("DELETE", &format!("/v1/sessions/{id}"));
                let answered = answered.clone();
                std::thread::spawn(move || {
                    let status = request.send().ok().map(|r| r.status);
                    let _ = answered.send(());
                    status
                })
            })
            .collect();
        for _ in 0..kill_after {
            answers
                .recv_timeout(Duration::from_secs(60))
                .expect("a deletion answered");
        }
        stack.restart_killed();
        let statuses: Vec<Option<u16>> = deletions.into_iter().map(|t| t.join().unwrap()).collect();

        let api = stack.client("ana", &tenant);
        for ((id, child, mark), status) in sessions.iter().zip(&statuses) {
            assert!(
                status.is_none_or(|s| s == 204 || s == 202),
                "{id}: answered {status:?}"
            );
            let outcome = wait_for(
                "the session whole or gone",
                Duration::from_secs(120),
                || {
                    let read = api.get(&format!("/v1/sessions/{id}")).status;
                    let child_read = api.get(&format!("/v1/sessions/{child}")).status;
                    let listed = api
                        .list_sessions("limit=200")
                        .sessions
                        .iter()
                        .any(|s| &s.id == id);
                    let objects = !r2_objects_in(stack.persist_dir(), mark).is_empty();
                    match (read, child_read, listed, objects) {
                        (200, 200, true, true) => Some("whole"),
                        (404, 404, false, false) => Some("gone"),
                        _ => None,
                    }
                },
            );
            if status.is_some() {
                assert_eq!(outcome, "gone", "{id} was answered {status:?}");
            }
            // Whatever is left whole is deleted normally after the restart.
            if outcome == "whole" {
                assert_eq!(delete(&api, id).status, 204);
                assert_gone(&api, child);
            }
            outcomes.push((kill_after, *status, outcome));
        }
    }
    eprintln!("(killed after k answers, answer, outcome): {outcomes:?}");
}
