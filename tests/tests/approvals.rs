//! Approvals through the real Worker and real `wuhu-runner` processes: work that reaches
//! alice's machine on bob's prompt waits for alice; only she (or an admin) can answer;
//! `approve_session` stops the asking in that session; a cloud environment follows its
//! definition; approvals are bounded, survive a SIGKILLed Worker, and expire into tool errors.
//!
//! Users: `alice` and `bob` (and `carol`) in one tenant, `mallory` in another. alice's runner
//! `mac` is `local` and offers the environment `api` (a temp dir). One `wrangler dev` serves
//! the tests that do not restart or need a short timeout; those start their own.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::approvals::MAX_PENDING_PER_SESSION;
use wuhu_core::wire::runner::RunnerKind;
use wuhu_core::wire::{Entry, Status, ToolResult, custom_types};
use wuhu_e2e::entries::{customs, describe, fake_directive};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::{random_hex, unique_name};
use wuhu_e2e::{Api, Stack, StackOptions};

const TURN: Duration = Duration::from_secs(60);

fn shared_stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        Stack::start_with(StackOptions {
            fake_delay_ms: Some(0),
            ..StackOptions::default()
        })
    })
}

/// One test's world: a tenant with alice, bob and carol, mallory elsewhere, alice's runner
/// `mac` offering `api`.
struct World {
    tenant: String,
    alice: Api,
    bob: Api,
    carol: Api,
    mallory: Api,
    dir: TempDir,
    mac: Runner,
}

impl World {
    fn new(stack: &Stack, prefix: &str) -> World {
        let tenant = unique_name(prefix);
        let dir = TempDir::new(&format!("wuhu-e2e-{prefix}"));
        let api = dir.mkdir("api");
        let mac = Runner::start(mac_config(stack, &tenant, &dir, &api));
        World {
            alice: stack.client("alice", &tenant),
            bob: stack.client("bob", &tenant),
            carol: stack.client("carol", &tenant),
            mallory: stack.client("mallory", &unique_name("elsewhere")),
            tenant,
            dir,
            mac,
        }
    }

    /// The environment dir `api` on alice's machine.
    fn api_dir(&self) -> PathBuf {
        self.dir.path().join("api")
    }

    /// A session alice creates, lets the tenant prompt, and attaches `api` to by her own
    /// prompt (which asks nobody).
    #[track_caller]
    fn alice_session(&self) -> String {
        let session = self.alice.create_fake_session().id;
        share(&self.alice, &session);
        let (results, entries) = run(&self.alice, &session, &[request_api()]);
        assert_ok(&results[0], &entries);
        assert_eq!(
            requests(&entries).len(),
            0,
            "alice's own attach asked:\n{}",
            describe(&entries)
        );
        session
    }
}

fn mac_config(stack: &Stack, tenant: &str, dir: &TempDir, api: &Path) -> RunnerConfig {
    RunnerConfig::new(stack, "alice", tenant, "mac")
        .env("api", api)
        .workspaces_root(dir.mkdir("workspaces"))
}

/// Lets every member of the tenant prompt the session (`PATCH {"access":"tenant"}`).
#[track_caller]
fn share(owner: &Api, session: &str) {
    let response = owner.patch(
        &format!("/v1/sessions/{session}"),
        &json!({"access": "tenant"}),
    );
    assert_eq!(response.status, 200, "sharing the session: {response}");
}

fn request_api() -> (&'static str, Value) {
    (
        "request_environment",
        json!({"spec": "mac:api", "name": "api"}),
    )
}

/// A `bash` call that creates `marker` (an absolute path) on the runner.
fn touch(marker: &Path) -> (&'static str, Value) {
    (
        "bash",
        json!({"command": format!("touch '{}'", marker.display())}),
    )
}

fn marker(world: &World, name: &str) -> PathBuf {
    world.api_dir().join(format!("{name}-{}", random_hex(4)))
}

#[track_caller]
fn run(api: &Api, session: &str, calls: &[(&str, Value)]) -> (Vec<ToolResult>, Vec<Entry>) {
    ToolTurn::start(api, session, calls).finish(api, TURN)
}

fn requests(entries: &[Entry]) -> Vec<Value> {
    customs(entries, custom_types::APPROVAL_REQUESTED)
        .into_iter()
        .cloned()
        .collect()
}

fn decisions(entries: &[Entry]) -> Vec<Value> {
    customs(entries, custom_types::APPROVAL_DECIDED)
        .into_iter()
        .cloned()
        .collect()
}

/// Waits until `count` approval requests are in the transcript; returns them.
#[track_caller]
fn wait_requests(api: &Api, session: &str, count: usize) -> Vec<Value> {
    let entries = api.wait_transcript(
        session,
        &format!("{count} approval request(s)"),
        TURN,
        |e| requests(e).len() >= count,
    );
    requests(&entries)
}

fn approval_path(session: &str, request: &Value) -> String {
    let id = request["approvalId"]
        .as_str()
        .unwrap_or_else(|| panic!("no approvalId: {request}"));
    format!("/v1/sessions/{session}/approvals/{id}")
}

#[track_caller]
fn answer(api: &Api, session: &str, request: &Value, decision: &str) -> wuhu_e2e::Response {
    api.post(
        &approval_path(session, request),
        &json!({"decision": decision}),
    )
}

#[track_caller]
fn assert_ok(result: &ToolResult, entries: &[Entry]) {
    assert!(
        !result.is_error,
        "{} failed: {}\n{}",
        result.tool_name,
        result.content,
        describe(entries)
    );
}

#[track_caller]
fn assert_tool_error(result: &ToolResult, fragments: &[&str]) {
    assert!(
        result.is_error,
        "{} should have failed: {}",
        result.tool_name, result.content
    );
    for fragment in fragments {
        assert!(
            result.content.contains(fragment),
            "{} error lacks {fragment:?}: {}",
            result.tool_name,
            result.content
        );
    }
}

#[test]
fn bobs_prompt_that_reaches_alices_machine_waits_for_alice_alone() {
    let stack = shared_stack();
    let _guard = stack.guard();
    let world = World::new(stack, "approve");
    let session = world.alice_session();

    // alice's own bash runs at once.
    let own = marker(&world, "alice");
    let (results, entries) = run(&world.alice, &session, &[touch(&own)]);
    assert_ok(&results[0], &entries);
    assert!(own.exists(), "alice's own command did not run");
    assert_eq!(requests(&entries).len(), 0, "{}", describe(&entries));

    // bob's bash waits for alice.
    let bobs = marker(&world, "bob");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&bobs)]);
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    assert!(!bobs.exists(), "bob's command ran before anyone approved");
    assert_eq!(
        request["approver"],
        json!({"kind": "runnerOwner", "sub": "alice"}),
        "{request}"
    );
    assert_eq!(request["runnerOwner"], "alice", "{request}");
    assert_eq!(request["runner"], "mac", "{request}");
    assert_eq!(request["tool"], "bash", "{request}");
    assert_eq!(request["requestedBy"], json!(["bob"]), "{request}");
    let text = request["text"].as_str().unwrap_or_default();
    for needle in [
        "from alice (the runner's owner)",
        "bob's message",
        "owned by alice",
        "approve_session",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    let entries = world.alice.transcript(&session);
    let call_ids = turn
        .call_ids(&entries)
        .expect("the call is in the transcript");
    assert_eq!(request["toolCallId"], json!(call_ids[0]), "{request}");

    // Nobody but alice can answer: bob and carol get 403, mallory does not see the session.
    for (who, api) in [("bob", &world.bob), ("carol", &world.carol)] {
        for decision in ["approve", "approve_session", "deny"] {
            let refused = answer(api, &session, &request, decision);
            assert_eq!(
                refused.expect_error(403).code,
                "forbidden",
                "{who} {decision}"
            );
        }
    }
    answer(&world.mallory, &session, &request, "approve").expect_error(404);
    let bad = answer(&world.alice, &session, &request, "maybe");
    bad.expect_error(400);
    let unknown = world.alice.post(
        &format!("/v1/sessions/{session}/approvals/0f3c2a1b-5d1e-4c0a-9f7e-2b8f1d3c4a5e"),
        &json!({"decision": "approve"}),
    );
    unknown.expect_error(404);
    assert!(!bobs.exists(), "bob's command ran after refused answers");
    assert!(decisions(&world.alice.transcript(&session)).is_empty());

    // alice approves: the command runs.
    let approved = answer(&world.alice, &session, &request, "approve");
    assert_eq!(approved.status, 200, "{approved}");
    assert_eq!(
        approved.json(),
        json!({"approvalId": request["approvalId"], "decision": "approve"})
    );
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_ok(&results[0], &entries);
    assert!(bobs.exists(), "bob's approved command did not run");
    let decided = decisions(&entries);
    assert_eq!(decided.len(), 1, "{}", describe(&entries));
    assert_eq!(
        (&decided[0]["decision"], &decided[0]["by"]),
        (&json!("approve"), &json!("alice"))
    );
    let again = answer(&world.alice, &session, &request, "deny");
    assert_eq!(again.expect_error(409).code, "already_decided");

    // "approve" was for that call only: bob's next one asks again, and a denial is a tool
    // error the agent sees.
    let denied = marker(&world, "denied");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&denied)]);
    let request = wait_requests(&world.alice, &session, 2).remove(1);
    assert_eq!(answer(&world.alice, &session, &request, "deny").status, 200);
    let (results, _) = turn.finish(&world.bob, TURN);
    assert_tool_error(&results[0], &["alice denied", "bash", "did not run"]);
    assert!(!denied.exists(), "a denied command ran");

    // Attaching alice's environment on bob's prompt waits for her too, and an admin may
    // answer for her.
    let turn = ToolTurn::start(
        &world.bob,
        &session,
        &[(
            "request_environment",
            json!({"spec": "mac:api", "name": "api-2"}),
        )],
    );
    let request = wait_requests(&world.alice, &session, 3).remove(2);
    assert_eq!(request["environment"], "api-2", "{request}");
    let admin = stack.admin_client("root", &world.tenant);
    assert_eq!(answer(&admin, &session, &request, "approve").status, 200);
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_ok(&results[0], &entries);
    drop(world);
}

#[test]
fn bobs_steer_into_alices_own_turn_makes_what_follows_wait_for_alice() {
    let stack = shared_stack();
    let _guard = stack.guard();
    let world = World::new(stack, "steer");
    let session = world.alice_session();

    // alice's own turn runs a slow command; bob steers while it runs.
    let turn = ToolTurn::start(
        &world.alice,
        &session,
        &[("bash", json!({"command": "sleep 3"}))],
    );
    world
        .alice
        .wait_transcript(&session, "alice's slow call", TURN, |e| {
            turn.call_ids(e).is_some()
        });
    let steered = marker(&world, "steered");
    let directive = json!({"toolCalls": [{"name": touch(&steered).0, "arguments": touch(&steered).1}], "afterTools": "steered calls done"});
    world
        .bob
        .enqueue(&session, "steer", &fake_directive(&directive));

    // The steer joins alice's turn at its next step: the call it asks for waits for alice.
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    assert_eq!(request["requestedBy"], json!(["alice", "bob"]), "{request}");
    assert!(!steered.exists(), "bob's steered command ran unasked");
    assert_eq!(
        answer(&world.bob, &session, &request, "approve").status,
        403
    );
    assert_eq!(
        answer(&world.alice, &session, &request, "approve").status,
        200
    );
    world
        .alice
        .wait_transcript(&session, "the reply after the steered call", TURN, |e| {
            e.iter()
                .filter_map(wuhu_e2e::entries::assistant)
                .any(|m| m.text() == "steered calls done")
        });
    assert!(steered.exists(), "the approved steered command did not run");
}

#[test]
fn approve_session_stops_the_asking_in_that_session_only() {
    let stack = shared_stack();
    let _guard = stack.guard();
    let world = World::new(stack, "session");
    let session = world.alice_session();

    let first = marker(&world, "first");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&first)]);
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    assert_eq!(
        answer(&world.alice, &session, &request, "approve_session").status,
        200
    );
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_ok(&results[0], &entries);
    assert!(first.exists());

    // Later calls on bob's prompt run unasked, in this session.
    for i in 0..3 {
        let later = marker(&world, &format!("later{i}"));
        let (results, entries) = run(&world.bob, &session, &[touch(&later)]);
        assert_ok(&results[0], &entries);
        assert!(later.exists());
        assert_eq!(
            requests(&entries).len(),
            1,
            "asked again:\n{}",
            describe(&entries)
        );
    }

    // Another session of alice's still asks.
    let other = world.alice_session();
    let elsewhere = marker(&world, "elsewhere");
    let turn = ToolTurn::start(&world.bob, &other, &[touch(&elsewhere)]);
    let request = wait_requests(&world.alice, &other, 1).remove(0);
    assert!(!elsewhere.exists());
    assert_eq!(
        answer(&world.alice, &other, &request, "approve").status,
        200
    );
    turn.finish(&world.bob, TURN);
    assert!(elsewhere.exists());
}

#[test]
fn pending_approvals_are_bounded_and_approve_session_answers_them_all() {
    let stack = shared_stack();
    let _guard = stack.guard();
    let world = World::new(stack, "bound");
    let session = world.alice_session();
    world.dir.write("api/seen.txt", "x\n");

    // One batch of parallel calls: all but the last one over the bound wait.
    let calls: Vec<(&str, Value)> = (0..=MAX_PENDING_PER_SESSION)
        .map(|_| ("ls", json!({"path": "."})))
        .collect();
    let turn = ToolTurn::start(&world.bob, &session, &calls);
    let waiting = wait_requests(&world.alice, &session, MAX_PENDING_PER_SESSION);
    assert_eq!(waiting.len(), MAX_PENDING_PER_SESSION);
    // One answer for the session approves every pending call of alice's runner.
    assert_eq!(
        answer(&world.alice, &session, &waiting[3], "approve_session").status,
        200
    );
    let (results, entries) = turn.finish(&world.bob, TURN);
    let refused: Vec<&ToolResult> = results.iter().filter(|r| r.is_error).collect();
    assert_eq!(refused.len(), 1, "{}", describe(&entries));
    assert_tool_error(
        refused[0],
        &["Too many approvals", &MAX_PENDING_PER_SESSION.to_string()],
    );
    for result in results.iter().filter(|r| !r.is_error) {
        assert!(result.content.contains("seen.txt"), "{}", result.content);
    }
    assert_eq!(requests(&entries).len(), MAX_PENDING_PER_SESSION);
    assert_eq!(decisions(&entries).len(), MAX_PENDING_PER_SESSION);
    for answered in &waiting {
        let again = answer(&world.alice, &session, answered, "deny");
        assert_eq!(again.expect_error(409).code, "already_decided");
    }
}

#[test]
fn a_cloud_environment_follows_its_definition_and_the_session_owner_answers() {
    let stack = shared_stack();
    let _guard = stack.guard();
    let world = World::new(stack, "cloud");
    let guarded = world.dir.mkdir("guarded");
    let _cloud = Runner::start(
        RunnerConfig::new(stack, "ops", &world.tenant, "cloud-1")
            .kind(RunnerKind::Cloud)
            .token(stack.cloud_runner_token("ops", &world.tenant))
            .env("guarded", &guarded)
            .workspaces_root(world.dir.mkdir("workspaces-cloud")),
    );
    let defined = world.alice.post(
        "/v1/environments",
        &json!({"name": "guarded", "kind": "local", "runner": "cloud-1", "path": guarded, "approval": "ask"}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let session = world.alice.create_fake_session().id;
    share(&world.alice, &session);
    // alice prompts first, so she owns the session (the first prompter owns it).
    world.alice.enqueue(&session, "followUp", "hello");
    world.alice.wait_idle(&session, Duration::from_secs(60));

    let turn = ToolTurn::start(
        &world.bob,
        &session,
        &[("request_environment", json!({"spec": "guarded"}))],
    );
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    assert_eq!(
        request["approver"],
        json!({"kind": "sessionOwner", "sub": "alice"}),
        "{request}"
    );
    assert_eq!(
        (&request["runnerOwner"], &request["runnerKind"]),
        (&json!("ops"), &json!("cloud"))
    );
    // The session's owner answers, not the prompter, and not the cloud runner's owner.
    let ops = stack.client("ops", &world.tenant);
    for api in [&world.bob, &ops] {
        assert_eq!(
            answer(api, &session, &request, "approve")
                .expect_error(403)
                .code,
            "forbidden"
        );
    }
    // approve_session is for runner owners.
    answer(&world.alice, &session, &request, "approve_session").expect_error(400);
    assert_eq!(
        answer(&world.alice, &session, &request, "approve").status,
        200
    );
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_ok(&results[0], &entries);

    // Work in the cloud environment on bob's prompt asks nobody.
    let cloud_marker = guarded.join(format!("cloud-{}", random_hex(4)));
    let (results, entries) = run(&world.bob, &session, &[touch(&cloud_marker)]);
    assert_ok(&results[0], &entries);
    assert!(cloud_marker.exists());
    assert_eq!(requests(&entries).len(), 1, "{}", describe(&entries));
}

#[test]
fn stop_withdraws_a_waiting_approval() {
    let stack = shared_stack();
    let _guard = stack.guard();
    let world = World::new(stack, "stop");
    let session = world.alice_session();
    let stopped = marker(&world, "stopped");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&stopped)]);
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    let stop = world.alice.stop(&session);
    assert_eq!(stop.stopped_tool_calls, 1);
    assert_eq!(
        answer(&world.alice, &session, &request, "approve")
            .expect_error(409)
            .code,
        "withdrawn"
    );
    let entries = world.alice.transcript(&session);
    let call = turn.call_ids(&entries).expect("call")[0].clone();
    let result = entries
        .iter()
        .filter_map(wuhu_e2e::entries::tool_result)
        .find(|r| r.tool_call_id == call)
        .unwrap_or_else(|| panic!("no result:\n{}", describe(&entries)));
    assert_tool_error(result, &["stopped"]);
    assert!(!stopped.exists());
    let decided = decisions(&entries);
    assert_eq!(decided.len(), 1, "{}", describe(&entries));
    assert_eq!(decided[0]["decision"], "withdrawn");
    assert_eq!(
        world.alice.session(&session).session.status,
        Status::Stopped
    );
}

#[test]
fn an_approval_survives_a_killed_worker_and_can_be_answered_after_the_restart() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let mut world = World::new(&stack, "restart");
    let session = world.alice_session();
    let restarted = marker(&world, "restarted");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&restarted)]);
    let before = wait_requests(&world.alice, &session, 1).remove(0);

    stack.restart_killed();
    // The runner knew the old port: start it again against the new one.
    world.mac.kill_hard();
    world.mac = Runner::start(mac_config(
        &stack,
        &world.tenant,
        &world.dir,
        &world.api_dir(),
    ));
    let alice = stack.client("alice", &world.tenant);
    let bob = stack.client("bob", &world.tenant);

    // Still waiting for alice, and still hers alone to answer.
    assert_eq!(
        answer(&bob, &session, &before, "approve")
            .expect_error(403)
            .code,
        "forbidden"
    );
    assert!(!restarted.exists());
    assert_eq!(
        answer(&alice, &session, &before, "approve").status,
        200,
        "after the restart"
    );
    let (results, entries) = turn.finish(&alice, TURN);
    assert_ok(&results[0], &entries);
    assert!(
        restarted.exists(),
        "the approved call did not run after the restart"
    );
    // The resumed call waited for the same approval: no second request, one decision.
    assert_eq!(requests(&entries), vec![before], "{}", describe(&entries));
    assert_eq!(decisions(&entries).len(), 1, "{}", describe(&entries));
}

#[test]
fn an_unanswered_approval_expires_into_a_tool_error() {
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_APPROVAL_TIMEOUT_SECONDS".into(), "3".into())],
        ..StackOptions::default()
    });
    let world = World::new(&stack, "expire");
    let session = world.alice_session();
    let late = marker(&world, "late");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&late)]);
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    assert!(
        request["text"]
            .as_str()
            .unwrap_or_default()
            .contains("3 seconds"),
        "{request}"
    );
    // Nobody answers: the alarm ends the wait and the agent sees why.
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_tool_error(
        &results[0],
        &["expired", "alice", "3 seconds", "did not run"],
    );
    assert!(!late.exists());
    let decided = decisions(&entries);
    assert_eq!(decided.len(), 1, "{}", describe(&entries));
    assert_eq!(decided[0]["decision"], "expired");
    assert_eq!(
        answer(&world.alice, &session, &request, "approve")
            .expect_error(409)
            .code,
        "expired"
    );
    world.bob.wait_idle(&session, TURN);
}

/// `approve_session` covers the people the approved request acted for, and no one else, for
/// `WUHU_APPROVE_SESSION_SECONDS` (issue 29, N7): alice approves bob's prompt for the session;
/// bob's later prompts run unasked, carol's prompt (a later participant of the same shared
/// session) asks again, and once the grant ends bob's ask again too.
#[test]
fn approve_session_covers_only_whom_it_was_given_for_and_expires() {
    const GRANT_SECS: u64 = 4;
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![(
            "WUHU_APPROVE_SESSION_SECONDS".into(),
            GRANT_SECS.to_string(),
        )],
        ..StackOptions::default()
    });
    let _guard = stack.guard();
    let world = World::new(&stack, "grant");
    let session = world.alice_session();

    let first = marker(&world, "first");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&first)]);
    let request = wait_requests(&world.alice, &session, 1).remove(0);
    assert_eq!(request["requestedBy"], json!(["bob"]), "{request}");
    assert_eq!(
        request["sessionApproval"],
        json!({"covers": ["bob"], "seconds": GRANT_SECS}),
        "{request}"
    );
    let text = request["text"].as_str().unwrap_or_default();
    assert!(text.contains("for bob, for 4 seconds"), "{text}");
    // The server starts the grant between these two instants: "inside" is measured from the
    // first, "ended" from the second (a loaded machine may take a while to answer).
    let granted_at = std::time::Instant::now();
    assert_eq!(
        answer(&world.alice, &session, &request, "approve_session").status,
        200
    );
    let answered_at = std::time::Instant::now();
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_ok(&results[0], &entries);
    assert!(first.exists());

    // Bob's next prompt is covered (while the grant lasts: the test is well inside it).
    let again = marker(&world, "again");
    let (results, entries) = run(&world.bob, &session, &[touch(&again)]);
    assert_ok(&results[0], &entries);
    assert!(again.exists());
    assert_eq!(requests(&entries).len(), 1, "{}", describe(&entries));
    assert!(
        granted_at.elapsed() < Duration::from_secs(GRANT_SECS),
        "the covered prompt ran after the grant ended: the test machine is too slow for it"
    );

    // Carol, a later participant, is not covered: alice is asked again, for carol.
    let carols = marker(&world, "carol");
    let turn = ToolTurn::start(&world.carol, &session, &[touch(&carols)]);
    let request = wait_requests(&world.alice, &session, 2).remove(1);
    assert_eq!(request["requestedBy"], json!(["carol"]), "{request}");
    assert!(!carols.exists());
    assert_eq!(answer(&world.alice, &session, &request, "deny").status, 200);
    let (results, _) = turn.finish(&world.carol, TURN);
    assert_tool_error(&results[0], &["denied"]);
    assert!(!carols.exists());

    // Once the grant has ended, bob's prompt asks again.
    while answered_at.elapsed() <= Duration::from_secs(GRANT_SECS) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let late = marker(&world, "late");
    let turn = ToolTurn::start(&world.bob, &session, &[touch(&late)]);
    let request = wait_requests(&world.alice, &session, 3).remove(2);
    assert_eq!(request["requestedBy"], json!(["bob"]), "{request}");
    assert!(!late.exists());
    assert_eq!(
        answer(&world.alice, &session, &request, "approve").status,
        200
    );
    let (results, entries) = turn.finish(&world.bob, TURN);
    assert_ok(&results[0], &entries);
    assert!(late.exists());
}
