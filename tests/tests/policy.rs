//! The policy engine end to end (issue 32, decision 0038, `docs/security.md` "Policy"), with
//! real runners: a tenant's `deny` refuses a command hidden in a compound line and names its
//! rule, a user's `allow` cannot undo it, an `ask` waits for the right person with the exact
//! command or the diff, and a user's own rules cover their own machine. Tried as the others of
//! a tenant would: another member cannot write the tenant's or alice's policy, nor answer her
//! asks; an agent cannot relax the policy it runs under; a child session meets the same rules.
//!
//! Users: `root` (an admin), `alice` and `bob` in one tenant. alice's runner `mac` offers `api`
//! (a temp dir). One `wrangler dev` for the file (the shared fake stack); every test has its
//! own tenant and runner.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{Entry, custom_types};
use wuhu_e2e::entries::{customs, describe, fake_directive};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::{random_hex, unique_name, wait_for};
use wuhu_e2e::{Api, Stack};

const TURN: Duration = Duration::from_secs(120);
const TENANT_POLICY: &str = "config/policy.json";

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

struct World {
    root: Api,
    alice: Api,
    bob: Api,
    dir: TempDir,
    _mac: Runner,
}

impl World {
    fn new(prefix: &str) -> World {
        let tenant = unique_name(prefix);
        let dir = TempDir::new(&format!("wuhu-e2e-{prefix}"));
        let api = dir.mkdir("api");
        let mac = Runner::start(
            RunnerConfig::new(stack(), "alice", &tenant, "mac")
                .env("api", &api)
                .workspaces_root(dir.mkdir("workspaces")),
        );
        World {
            root: stack().admin_client("root", &tenant),
            alice: stack().client("alice", &tenant),
            bob: stack().client("bob", &tenant),
            dir,
            _mac: mac,
        }
    }

    /// A path in `api` on alice's machine (nothing there yet).
    fn path(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join("api")
            .join(format!("{name}-{}", random_hex(4)))
    }

    /// A session alice owns, shares with the tenant and attaches `api` to by her own prompt.
    fn alice_session(&self) -> String {
        let session = self.alice.create_fake_session().id;
        let shared = self.alice.patch(
            &format!("/v1/sessions/{session}"),
            &json!({"access": "tenant"}),
        );
        assert_eq!(shared.status, 200, "{shared}");
        let attach = self.alice.run_tool(
            &session,
            "request_environment",
            json!({"spec": "mac:api", "name": "api"}),
            TURN,
        );
        assert!(!attach.is_error, "{}", attach.content);
        session
    }
}

#[track_caller]
fn set_policy(api: &Api, path: &str, rules: Value) -> wuhu_e2e::Response {
    api.put_doc(path, json!({ "rules": rules }).to_string())
}

fn bash(command: String) -> (&'static str, Value) {
    ("bash", json!({ "command": command }))
}

/// A fake-provider message whose reply makes `calls`.
fn calls(calls: &[(&str, Value)]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
        .collect();
    fake_directive(&json!({"toolCalls": calls, "afterTools": format!("done {}", random_hex(4))}))
}

fn decisions(entries: &[Entry]) -> Vec<Value> {
    customs(entries, custom_types::POLICY_DECISION)
        .into_iter()
        .cloned()
        .collect()
}

fn requests(entries: &[Entry]) -> Vec<Value> {
    customs(entries, custom_types::APPROVAL_REQUESTED)
        .into_iter()
        .cloned()
        .collect()
}

#[track_caller]
fn wait_requests(api: &Api, session: &str, count: usize) -> Vec<Value> {
    let entries = api.wait_transcript(session, &format!("{count} request(s)"), TURN, |e| {
        requests(e).len() >= count
    });
    requests(&entries)
}

#[track_caller]
fn answer(api: &Api, session: &str, request: &Value, decision: &str) -> wuhu_e2e::Response {
    let id = request["approvalId"].as_str().expect("approvalId");
    api.post(
        &format!("/v1/sessions/{session}/approvals/{id}"),
        &json!({ "decision": decision }),
    )
}

#[test]
fn a_tenant_deny_refuses_a_command_hidden_in_a_compound_line_and_names_its_rule() {
    let w = World::new("policy-deny");
    let rules = json!([
        {"id": "no-rm", "match": {"command": "rm *"}, "decision": "deny", "reason": "agents delete nothing"},
        {"id": "ls", "match": {"command": "ls*"}, "decision": "allow"},
        {"id": "no-curl", "match": {"command": "curl *"}, "decision": "deny"},
    ]);
    // Only an admin writes the tenant's policy, and a wrong rule is refused by its number.
    set_policy(&w.alice, TENANT_POLICY, rules.clone()).expect_error(403);
    let bad = set_policy(
        &w.root,
        TENANT_POLICY,
        json!([{"decision": "allow"}, {"match": {"cmd": "x"}, "decision": "deny"}]),
    );
    assert!(
        bad.expect_error(400)
            .message
            .contains("unknown field `cmd`")
    );
    let set = set_policy(&w.root, TENANT_POLICY, rules);
    assert!(set.status == 200 || set.status == 201, "{set}");
    // alice's own allow cannot undo the tenant's deny.
    let own = set_policy(
        &w.alice,
        "users/alice/policy.json",
        json!([{"match": {"command": "curl *"}, "decision": "allow"}]),
    );
    assert!(own.status == 200 || own.status == 201, "{own}");

    let session = w.alice_session();
    let victim = w.path("victim");
    std::fs::create_dir_all(&victim).unwrap();
    let line = format!("ls && rm -rf '{}'", victim.display());
    let refused = w
        .alice
        .run_tool(&session, "bash", json!({"command": line}), TURN);
    assert!(refused.is_error, "{}", refused.content);
    for needle in [
        "tenant rule \"no-rm\"",
        "agents delete nothing",
        "did not run",
    ] {
        assert!(
            refused.content.contains(needle),
            "{needle:?}: {}",
            refused.content
        );
    }
    assert!(victim.exists(), "the refused command ran");
    let entries = w.alice.transcript(&session);
    let decided = decisions(&entries);
    assert_eq!(decided.len(), 1, "{}", describe(&entries));
    assert_eq!(decided[0]["decision"], "deny");
    assert_eq!(decided[0]["rule"]["id"], "no-rm");
    assert_eq!(decided[0]["rule"]["source"], "tenant");
    assert_eq!(
        decided[0]["subject"],
        format!("rm -rf {}", victim.display())
    );

    // An allowed line runs and says which rule allowed it; a line no rule names runs quietly.
    let listed = w
        .alice
        .run_tool(&session, "bash", json!({"command": "ls -a"}), TURN);
    assert!(!listed.is_error, "{}", listed.content);
    let quiet = w
        .alice
        .run_tool(&session, "bash", json!({"command": "echo hi"}), TURN);
    assert!(!quiet.is_error, "{}", quiet.content);
    let decided = decisions(&w.alice.transcript(&session));
    assert_eq!(decided.len(), 2, "{decided:?}");
    assert_eq!(decided[1]["decision"], "allow");
    assert_eq!(decided[1]["rule"]["id"], "ls");

    let curl = w
        .alice
        .run_tool(&session, "bash", json!({"command": "curl --version"}), TURN);
    assert!(curl.is_error, "{}", curl.content);
    assert!(
        curl.content.contains("tenant rule \"no-curl\""),
        "{}",
        curl.content
    );
    // Counted in the session's usage.
    let usage = w.alice.get(&format!("/v1/sessions/{session}/usage"));
    assert_eq!(usage.status, 200, "{usage}");
    assert_eq!(
        usage.json()["policy"],
        json!({"allowed": 1, "asked": 0, "denied": 2}),
        "{usage}"
    );

    // The agent cannot write itself a friendlier policy, not even its owner's own.
    for path in ["users/alice/policy.json", "config/policy.json"] {
        let write = w.alice.run_tool(
            &session,
            "write",
            json!({"path": format!("wuhu://workspace/{path}"), "content": "{\"rules\":[]}"}),
            TURN,
        );
        assert!(write.is_error, "{path}: {}", write.content);
    }

    // The dry run answers the same, with the simple commands it read.
    let check = w
        .bob
        .get("/v1/policy/check?tool=bash&runnerOwner=alice&command=ls%20%26%26%20rm%20-rf%20%2F");
    assert_eq!(check.status, 200, "{check}");
    let check = check.json();
    assert_eq!(check["decision"], "deny", "{check}");
    assert_eq!(check["verdict"]["rule"]["id"], "no-rm", "{check}");
    assert_eq!(check["commands"], json!(["ls", "rm -rf /"]), "{check}");
    let curl = w
        .bob
        .get("/v1/policy/check?tool=bash&runnerOwner=alice&command=curl%20x")
        .json();
    assert_eq!(curl["verdict"]["rule"]["id"], "no-curl", "{curl}");
    w.bob.get("/v1/policy/check?command=ls").expect_error(400);
    w.bob
        .get("/v1/policy/check?tool=bash&runnerOwner=%2E%2E%2Fx")
        .expect_error(400);
}

#[test]
fn an_ask_waits_for_the_sessions_owner_with_the_diff_and_a_child_meets_the_same_rules() {
    let w = World::new("policy-ask");
    let set = set_policy(
        &w.root,
        TENANT_POLICY,
        json!([
            {"id": "infra", "match": {"tool": "edit", "path": "infra/*"}, "decision": "ask", "reason": "infra changes are reviewed"},
            {"id": "push", "match": {"command": "touch *push*"}, "decision": "ask", "reason": "pushes are reviewed"},
        ]),
    );
    assert!(set.status == 200 || set.status == 201, "{set}");
    let session = w.alice_session();
    let infra = w.dir.path().join("api").join("infra");
    std::fs::create_dir_all(&infra).unwrap();
    std::fs::write(infra.join("main.tf"), "a = 1\n").unwrap();

    // alice's own edit under infra/ waits for her, showing the change.
    let edit = (
        "edit",
        json!({"path": "./infra/main.tf", "oldText": "a = 1", "newText": "a = 2"}),
    );
    let turn = ToolTurn::start(&w.alice, &session, &[edit]);
    let request = wait_requests(&w.alice, &session, 1).remove(0);
    assert_eq!(
        request["approver"],
        json!({"kind": "sessionOwner", "sub": "alice"}),
        "{request}"
    );
    assert_eq!(request["policy"]["rule"]["id"], "infra", "{request}");
    let diff = request["diff"].as_str().unwrap_or_default();
    assert!(
        diff.contains("-a = 1") && diff.contains("+a = 2"),
        "{request}"
    );
    let text = request["text"].as_str().unwrap_or_default();
    assert!(text.contains("infra changes are reviewed"), "{text}");
    // bob, who may prompt the session, may not answer for alice.
    for decision in ["approve", "deny"] {
        answer(&w.bob, &session, &request, decision).expect_error(403);
    }
    assert_eq!(answer(&w.alice, &session, &request, "deny").status, 200);
    let (results, entries) = turn.finish(&w.alice, TURN);
    assert!(results[0].is_error, "{}", results[0].content);
    assert_eq!(
        std::fs::read_to_string(infra.join("main.tf")).unwrap(),
        "a = 1\n",
        "the denied edit changed the file"
    );
    let decided = decisions(&entries);
    assert_eq!(decided.last().unwrap()["outcome"], "refused", "{decided:?}");

    // bob's prompt matches "push": one question to alice covers both the rule and her machine.
    let pushed = w.path("push");
    let turn = ToolTurn::start(
        &w.bob,
        &session,
        &[bash(format!("touch '{}'", pushed.display()))],
    );
    let request = wait_requests(&w.alice, &session, 2).remove(1);
    assert_eq!(request["policy"]["rule"]["id"], "push", "{request}");
    assert_eq!(request["requestedBy"], json!(["bob"]), "{request}");
    assert_eq!(
        request["command"],
        format!("touch '{}'", pushed.display()),
        "{request}"
    );
    assert!(!pushed.exists(), "ran before anyone answered");
    // "For this session": the rule stops asking alice about bob's calls in this session.
    assert!(request["sessionApproval"].is_object(), "{request}");
    assert_eq!(
        answer(&w.alice, &session, &request, "approve_session").status,
        200
    );
    let (results, entries) = turn.finish(&w.bob, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    assert!(pushed.exists());
    assert_eq!(requests(&entries).len(), 2, "{}", describe(&entries));
    // bob's next push is not asked by the rule; it still reaches alice's machine on bob's
    // prompt, which the rule's answer did not open: that alone asks her.
    let again = w.path("push-again");
    let turn = ToolTurn::start(
        &w.bob,
        &session,
        &[bash(format!("touch '{}'", again.display()))],
    );
    let request = wait_requests(&w.alice, &session, 3).remove(2);
    assert!(request.get("policy").is_none(), "{request}");
    assert_eq!(
        request["approver"],
        json!({"kind": "runnerOwner", "sub": "alice"}),
        "{request}"
    );
    assert_eq!(answer(&w.alice, &session, &request, "approve").status, 200);
    let (results, entries) = turn.finish(&w.bob, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    let decided = decisions(&entries);
    assert_eq!(
        decided.last().unwrap()["outcome"],
        "approved for this session",
        "{decided:?}"
    );

    // A child session alice spawns on her environment meets the same rule.
    let child_pushed = w.path("child-push");
    let task = calls(&[bash(format!("touch '{}'", child_pushed.display()))]);
    w.alice.enqueue(
        &session,
        "followUp",
        &calls(&[(
            "spawn_session",
            json!({"environment": "inherit", "task": task}),
        )]),
    );
    let child = wait_for("the child", TURN, || {
        w.alice
            .session(&session)
            .children
            .first()
            .map(|c| c.id.clone())
    });
    let request = wait_requests(&w.alice, &child, 1).remove(0);
    assert_eq!(request["policy"]["rule"]["id"], "push", "{request}");
    assert!(!child_pushed.exists(), "the child's command ran unasked");
    assert_eq!(answer(&w.alice, &child, &request, "approve").status, 200);
    wait_for("the child's approved command", TURN, || {
        child_pushed.exists().then_some(())
    });
}

#[test]
fn a_users_own_rules_cover_their_machine_and_only_they_write_them() {
    let w = World::new("policy-user");
    let rule = json!([{"match": {"command": "cat *"}, "decision": "ask", "reason": "alice reads her files first"}]);
    // bob cannot write alice's policy; alice can, and a wrong one is refused.
    set_policy(&w.bob, "users/alice/policy.json", rule.clone()).expect_error(403);
    set_policy(
        &w.alice,
        "users/alice/policy.json",
        json!([{"decision": "sometimes"}]),
    )
    .expect_error(400);
    let set = set_policy(&w.alice, "users/alice/policy.json", rule);
    assert!(set.status == 200 || set.status == 201, "{set}");
    let session = w.alice_session();
    std::fs::write(w.dir.path().join("api").join("notes.txt"), "hello\n").unwrap();

    // bob's `cat` on alice's machine waits for alice, by her own rule; "approve for this
    // session" answers it and covers bob's next one.
    let turn = ToolTurn::start(&w.bob, &session, &[bash("cat notes.txt".into())]);
    let request = wait_requests(&w.alice, &session, 1).remove(0);
    assert_eq!(
        request["approver"],
        json!({"kind": "runnerOwner", "sub": "alice"}),
        "{request}"
    );
    assert_eq!(request["policy"]["rule"]["source"], "user", "{request}");
    assert_eq!(request["policy"]["rule"]["user"], "alice", "{request}");
    answer(&w.bob, &session, &request, "approve").expect_error(403);
    assert_eq!(
        answer(&w.alice, &session, &request, "approve_session").status,
        200
    );
    let (results, _) = turn.finish(&w.bob, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    assert!(
        results[0].content.contains("hello"),
        "{}",
        results[0].content
    );
    let again = w
        .bob
        .run_tool(&session, "bash", json!({"command": "cat notes.txt"}), TURN);
    assert!(!again.is_error, "{}", again.content);
    let entries = w.alice.transcript(&session);
    assert_eq!(requests(&entries).len(), 1, "{}", describe(&entries));
    let decided = decisions(&entries);
    assert_eq!(
        decided.last().unwrap()["outcome"],
        "approved for this session",
        "{decided:?}"
    );
}

/// Cost rules see an estimate from the definition's `costPerHourUsd`: an hour of an attached
/// environment, a background job's `timeout`. The CLI's dry run answers the same.
#[test]
fn cost_rules_see_the_definitions_hourly_price() {
    let w = World::new("policy-cost");
    let set = set_policy(
        &w.root,
        TENANT_POLICY,
        json!([
            {"id": "pricey", "match": {"tool": "request_environment", "costUsdOver": 1}, "decision": "deny", "reason": "ask ops for big machines"},
            {"id": "long-job", "match": {"tool": "bash", "costUsdOver": 1}, "decision": "deny"},
        ]),
    );
    assert!(set.status == 200 || set.status == 201, "{set}");
    let api = w.dir.path().join("api");
    for (name, cost) in [("big", 2.5), ("small", 0.5)] {
        let defined = w.alice.post(
            "/v1/environments",
            &json!({"name": name, "kind": "local", "runner": "mac", "path": api, "costPerHourUsd": cost}),
        );
        assert_eq!(defined.status, 201, "{defined}");
        assert_eq!(defined.json()["costPerHourUsd"], json!(cost), "{defined}");
    }
    let wrong = w.alice.post(
        "/v1/environments",
        &json!({"name": "neg", "kind": "local", "runner": "mac", "path": api, "costPerHourUsd": -1}),
    );
    assert!(wrong.expect_error(400).message.contains("costPerHourUsd"));

    let session = w.alice.create_fake_session().id;
    let big = w.alice.run_tool(
        &session,
        "request_environment",
        json!({"spec": "big"}),
        TURN,
    );
    assert!(big.is_error, "{}", big.content);
    assert!(
        big.content.contains("tenant rule \"pricey\""),
        "{}",
        big.content
    );
    assert!(
        big.content.contains("ask ops for big machines"),
        "{}",
        big.content
    );
    let small = w.alice.run_tool(
        &session,
        "request_environment",
        json!({"spec": "small"}),
        TURN,
    );
    assert!(!small.is_error, "{}", small.content);
    // 3 hours of a $0.50 machine is over $1; the same command in the foreground has no estimate.
    let job = w.alice.run_tool(
        &session,
        "bash",
        json!({"command": "sleep 1", "background": true, "timeout": 10800}),
        TURN,
    );
    assert!(job.is_error, "{}", job.content);
    assert!(
        job.content.contains("tenant rule \"long-job\""),
        "{}",
        job.content
    );
    let now = w
        .alice
        .run_tool(&session, "bash", json!({"command": "echo now"}), TURN);
    assert!(!now.is_error, "{}", now.content);

    let cli = wuhu_e2e::cli::Wuhu::new()
        .env("WUHU_SERVER", &stack().base_url())
        .env("WUHU_TOKEN", w.alice.token().expect("a token"));
    let ran = cli
        .run(&[
            "policy",
            "check",
            "--tool",
            "request_environment",
            "--cost-usd",
            "2.5",
        ])
        .ok();
    assert!(
        ran.stdout.contains("deny by tenant rule \"pricey\""),
        "{ran:?}"
    );
    let ran = cli
        .run(&[
            "--json",
            "policy",
            "check",
            "--command",
            "ls; sudo rm -rf /",
        ])
        .ok();
    assert_eq!(
        ran.json()["commands"],
        json!(["ls", "sudo rm -rf /"]),
        "{ran:?}"
    );
    assert_eq!(ran.json()["decision"], "allow", "{ran:?}");
}

/// "always" answers a policy's ask about the approver's own machine: the call runs, and a rule
/// first in their own policy allows that exact command there from now on; anything else still
/// asks. It is not offered for a pattern, and nobody else may give it.
#[test]
fn always_adds_a_rule_to_the_approvers_own_policy() {
    let w = World::new("policy-always");
    let set = set_policy(
        &w.root,
        TENANT_POLICY,
        json!([{"id": "push", "match": {"command": "touch *push*"}, "decision": "ask"}]),
    );
    assert!(set.status == 200 || set.status == 201, "{set}");
    let session = w.alice_session();
    let pushed = w.path("push");
    let command = format!("touch '{}'", pushed.display());

    let turn = ToolTurn::start(&w.alice, &session, &[bash(command.clone())]);
    let request = wait_requests(&w.alice, &session, 1).remove(0);
    assert_eq!(
        request["always"]["match"],
        json!({"tool": "bash", "command": format!("touch {}", pushed.display())}),
        "{request}"
    );
    answer(&w.bob, &session, &request, "always").expect_error(403);
    assert_eq!(answer(&w.alice, &session, &request, "always").status, 200);
    let (results, _) = turn.finish(&w.alice, TURN);
    assert!(!results[0].is_error, "{}", results[0].content);
    assert!(pushed.exists());
    let stored = w.alice.get_doc("users/alice/policy.json");
    assert_eq!(stored.status, 200, "{stored}");
    assert!(stored.text().contains("alice answered"), "{stored}");

    // The same command runs at once, by her rule; another one asks again.
    std::fs::remove_file(&pushed).unwrap();
    let again = w
        .alice
        .run_tool(&session, "bash", json!({"command": command}), TURN);
    assert!(!again.is_error, "{}", again.content);
    assert!(pushed.exists());
    let decided = decisions(&w.alice.transcript(&session));
    assert_eq!(decided.last().unwrap()["decision"], "allow", "{decided:?}");
    assert_eq!(
        decided.last().unwrap()["rule"]["user"],
        "alice",
        "{decided:?}"
    );
    let other = w.path("push-other");
    let turn = ToolTurn::start(
        &w.alice,
        &session,
        &[bash(format!(
            "touch '{}' '{}*'",
            other.display(),
            other.display()
        ))],
    );
    let request = wait_requests(&w.alice, &session, 2).remove(1);
    // What matched holds a `*`: "always" would allow more than was asked.
    assert_eq!(request["always"], Value::Null, "{request}");
    answer(&w.alice, &session, &request, "always").expect_error(400);
    assert_eq!(answer(&w.alice, &session, &request, "deny").status, 200);
    let (results, _) = turn.finish(&w.alice, TURN);
    assert!(results[0].is_error, "{}", results[0].content);
}
