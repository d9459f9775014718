//! Runners and environments through the real Worker and real `wuhu-runner` processes: two
//! runners (one `local`, one `cloud`) lend environments to a session that starts without one;
//! approvals; folder templates with a failing startup script; worktrees whose branch survives
//! detach; a runner SIGKILLed mid-call and restarted; snapshots without secrets; token kinds;
//! garbage frames; resolution errors; the runner listing and environment CRUD.
//!
//! One `wrangler dev` for the file; every test uses its own tenant (the runner hub is one
//! Durable Object per tenant), its own runners and its own temp dirs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::runner::{HEARTBEAT_ACK_FRAME, RunnerKind, ServerMessage, os_display_name};
use wuhu_core::wire::{Entry, EntryPayload, Message, ToolResult, custom_types};
use wuhu_e2e::entries::{customs, describe, tool_result};
use wuhu_e2e::runner::{RawRunner, Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack, wait_for};

const TURN: Duration = Duration::from_secs(60);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// The OS name runners on this machine report.
fn os() -> String {
    os_display_name(std::env::consts::OS)
}

/// One test's world: a tenant, the user `ana` in it, and a temp dir.
struct World {
    tenant: String,
    api: Api,
    dir: TempDir,
}

impl World {
    fn new(prefix: &str) -> World {
        let tenant = unique_name(prefix);
        World {
            api: stack().client("ana", &tenant),
            dir: TempDir::new(&format!("wuhu-e2e-{prefix}")),
            tenant,
        }
    }

    /// A runner config owned by `sub` in this tenant, with its workspaces under the temp dir.
    fn runner(&self, sub: &str, name: &str) -> RunnerConfig {
        RunnerConfig::new(stack(), sub, &self.tenant, name)
            .workspaces_root(self.dir.mkdir(&format!("workspaces-{name}")))
    }

    /// `POST /v1/environments`; panics unless 201.
    #[track_caller]
    fn define(&self, body: Value) -> Value {
        let response = self.api.post("/v1/environments", &body);
        assert_eq!(response.status, 201, "define {body}: {response}");
        response.json()
    }

    /// A fresh session of the fake provider, checked to start without environments.
    #[track_caller]
    fn session(&self) -> String {
        let session = self.api.create_fake_session();
        let page = self.api.session(&session.id);
        assert!(
            page.environments.is_empty(),
            "a new session has no environment: {:?}",
            page.environments
        );
        session.id
    }

    /// Names of the environments `GET /v1/sessions/:id` lists.
    #[track_caller]
    fn attached(&self, session: &str) -> Vec<String> {
        self.api
            .session(session)
            .environments
            .iter()
            .map(|a| a.name().to_string())
            .collect()
    }

    /// `GET /v1/runners` → the runner named `name` (owned by anyone).
    #[track_caller]
    fn listed_runner(&self, name: &str) -> Option<Value> {
        let response = self.api.get("/v1/runners");
        assert_eq!(response.status, 200, "{response}");
        response.json()["runners"]
            .as_array()
            .unwrap_or_else(|| panic!("no runners array: {response}"))
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
    }
}

#[track_caller]
fn run_tool(api: &Api, session: &str, name: &str, arguments: Value) -> ToolResult {
    let turn = ToolTurn::start(api, session, &[(name, arguments)]);
    turn.finish(api, TURN).0.pop().expect("one result")
}

#[track_caller]
fn request(api: &Api, session: &str, arguments: Value) -> ToolResult {
    run_tool(api, session, "request_environment", arguments)
}

#[track_caller]
fn bash(api: &Api, session: &str, command: &str, environment: Option<&str>) -> ToolResult {
    let mut arguments = json!({"command": command});
    if let Some(environment) = environment {
        arguments["environment"] = json!(environment);
    }
    run_tool(api, session, "bash", arguments)
}

#[track_caller]
fn assert_ok(result: &ToolResult) {
    assert!(
        !result.is_error,
        "{} failed: {}\nwrangler log:\n{}",
        result.tool_name,
        result.content,
        stack().log_tail(30)
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

/// The `wuhu_environment_attached_v1` notice for `name`.
#[track_caller]
fn attached_notice(entries: &[Entry], name: &str) -> Value {
    customs(entries, custom_types::ENVIRONMENT_ATTACHED)
        .into_iter()
        .find(|d| d["environment"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no attached notice for {name:?}:\n{}", describe(entries)))
}

/// `(customType, content)` of every `custom_message` entry.
fn custom_messages(entries: &[Entry]) -> Vec<(String, String)> {
    entries
        .iter()
        .filter_map(|e| match &e.payload {
            EntryPayload::Message {
                message:
                    Message::CustomMessage {
                        custom_type,
                        content,
                        ..
                    },
            } => Some((custom_type.clone(), content.clone())),
            _ => None,
        })
        .collect()
}

/// SIGKILLs a PID this test caused to exist when dropped.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a PID; no memory is touched.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
        }
    }
}

/// Runs git in `dir`; panics unless it succeeds. Returns stdout.
#[track_caller]
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
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
        .expect("run git");
    assert!(
        output.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_session_gets_environments_from_a_local_and_a_cloud_runner_and_detaches_one() {
    let _guard = stack().guard();
    let world = World::new("envs");
    let api_dir = world.dir.mkdir("api");
    let agents_md = "# API rules\nRun `make test` before committing. (agents-md-7f3e)\n";
    world.dir.write("api/AGENTS.md", agents_md);
    world.dir.write("api/marker.txt", "marker-of-api-local\n");
    let template = world.dir.mkdir("template-web");
    world
        .dir
        .write("template-web/marker.txt", "marker-of-web-template\n");
    let mac = Runner::start(world.runner("ana", "mac").env("api", &api_dir));
    let cloud = Runner::start(world.runner("ops", "cloud-1").kind(RunnerKind::Cloud));
    world.define(json!({
        "name": "web",
        "kind": "folder-template",
        "templatePath": template,
        "startupScript": "echo started-by-script > started.txt",
    }));
    let session = world.session();
    let api = &world.api;

    // Both in one turn: request_environment is not parallel-safe, so they run in order.
    let turn = ToolTurn::start(
        api,
        &session,
        &[
            (
                "request_environment",
                json!({"spec": "api", "preference": "local"}),
            ),
            (
                "request_environment",
                json!({"spec": "web", "preference": "cloud"}),
            ),
        ],
    );
    let (results, entries) = turn.finish(api, TURN);
    results.iter().for_each(assert_ok);
    let entries = turn.entries_since(&entries);

    let api_text = format!(
        "Environment \"api\" (local, {}, {}) attached on runner \"mac\". AGENTS.md found — loading context.",
        os(),
        api_dir.display()
    );
    let notice = attached_notice(entries, "api");
    assert_eq!(notice["text"], api_text, "{notice}");
    assert_eq!(
        (&notice["kind"], &notice["runner"], &notice["os"]),
        (&json!("local"), &json!("mac"), &json!(os()))
    );
    assert_eq!(notice["root"], json!(api_dir));
    assert!(
        results[0].content.starts_with(&api_text),
        "{}",
        results[0].content
    );

    let web_root = cloud.workspaces_root().join(&session);
    let web_text = format!(
        "Environment \"web\" (folder-template, {}, {}) attached on runner \"cloud-1\".",
        os(),
        web_root.display()
    );
    let notice = attached_notice(entries, "web");
    assert_eq!(notice["text"], web_text, "{notice}");
    assert_eq!(notice["runner"], "cloud-1");

    // AGENTS.md of `api` is a visible context entry; `web` has none.
    let agents: Vec<(String, String)> = custom_messages(entries)
        .into_iter()
        .filter(|(t, _)| t == custom_types::AGENTS_MD)
        .collect();
    assert_eq!(agents.len(), 1, "{}", describe(entries));
    assert!(agents[0].1.contains(agents_md), "{}", agents[0].1);
    assert!(agents[0].1.contains("\"api\""), "{}", agents[0].1);

    let page = api.session(&session);
    let mut attached: Vec<(String, String, String)> = page
        .environments
        .iter()
        .map(|a| {
            (
                a.name().to_string(),
                a.runner.clone(),
                a.environment.root.clone(),
            )
        })
        .collect();
    attached.sort();
    assert_eq!(
        attached,
        vec![
            (
                "api".to_string(),
                "mac".to_string(),
                api_dir.display().to_string()
            ),
            (
                "web".to_string(),
                "cloud-1".to_string(),
                web_root.display().to_string()
            ),
        ]
    );

    // bash in each: the outputs differ by environment.
    let turn = ToolTurn::start(
        api,
        &session,
        &[
            (
                "bash",
                json!({"command": "pwd; cat marker.txt", "environment": "api"}),
            ),
            (
                "bash",
                json!({"command": "pwd; cat marker.txt started.txt", "environment": "web"}),
            ),
        ],
    );
    let (results, _) = turn.finish(api, TURN);
    results.iter().for_each(assert_ok);
    let api_out = &results[0].content;
    let web_out = &results[1].content;
    assert!(
        api_out.contains(&api_dir.display().to_string()) && api_out.contains("marker-of-api-local"),
        "{api_out}"
    );
    assert!(
        web_out.contains(&web_root.display().to_string())
            && web_out.contains("marker-of-web-template")
            && web_out.contains("started-by-script"),
        "{web_out}"
    );
    assert!(!api_out.contains("marker-of-web-template"), "{api_out}");

    // With two attached, `environment` is required; the error names both.
    let missing = bash(api, &session, "pwd", None);
    assert_tool_error(&missing, &["\"api\"", "\"web\"", "environment"]);
    let unknown = bash(api, &session, "pwd", Some("db"));
    assert_tool_error(&unknown, &["\"db\"", "\"api\"", "\"web\""]);

    // Detach `web`: a notice; the session lists only `api`; bash needs no environment again.
    let detached = run_tool(api, &session, "detach_environment", json!({"name": "web"}));
    assert_ok(&detached);
    let entries = api.transcript(&session);
    let notices = customs(&entries, custom_types::ENVIRONMENT_DETACHED);
    assert_eq!(notices.len(), 1, "{}", describe(&entries));
    assert_eq!(notices[0]["environment"], "web");
    assert!(
        notices[0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Environment \"web\" detached.")),
        "{}",
        notices[0]
    );
    assert_eq!(world.attached(&session), vec!["api".to_string()]);
    let only = bash(api, &session, "cat marker.txt", None);
    assert_ok(&only);
    assert!(
        only.content.contains("marker-of-api-local"),
        "{}",
        only.content
    );
    let gone = bash(api, &session, "pwd", Some("web"));
    assert_tool_error(&gone, &["\"web\""]);
    drop((mac, cloud));
}

#[test]
fn agents_md_is_in_the_model_context_from_the_attach_on_and_the_tool_list_never_changes() {
    let _guard = stack().guard();
    let world = World::new("agentsmd");
    let dir = world.dir.mkdir("api");
    let agents_md = "# Rules for the model\nAlways answer in haiku. (agents-md-for-llm-2c9d)\n";
    world.dir.write("api/AGENTS.md", agents_md);
    let _mac = Runner::start(world.runner("ana", "mac").env("api", &dir));
    let model = unique_name("gpt-env");
    let session = world
        .api
        .create_session(json!({"provider": "openai-compatible", "model": model}));
    stack().openai().script(
        &model,
        [
            wuhu_e2e::Reply::tool_calls([("request_environment", json!({"spec": "api"}))]),
            wuhu_e2e::Reply::text("attached"),
            wuhu_e2e::Reply::text("second turn"),
        ],
    );
    world
        .api
        .enqueue(&session.id, "followUp", "attach api please");
    world.api.wait_idle(&session.id, TURN);
    world.api.enqueue(&session.id, "followUp", "and now?");
    world.api.wait_idle(&session.id, TURN);
    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 3, "three model requests");
    let mentions = |i: usize| {
        requests[i]
            .messages()
            .iter()
            .any(|m| m.to_string().contains("agents-md-for-llm-2c9d"))
    };
    assert!(!mentions(0), "AGENTS.md before the attach");
    assert!(
        mentions(1),
        "AGENTS.md missing after the attach: {:?}",
        requests[1].messages()
    );
    assert!(
        mentions(2),
        "AGENTS.md missing a turn later: {:?}",
        requests[2].messages()
    );
    let tools = requests[0].tool_names();
    for name in [
        "request_environment",
        "detach_environment",
        "bash",
        "read",
        "write",
        "edit",
        "ls",
        "find",
        "grep",
    ] {
        assert!(
            tools.iter().any(|t| t == name),
            "{name} not offered: {tools:?}"
        );
    }
    for request in &requests[1..] {
        assert_eq!(
            request.tool_names(),
            tools,
            "the tool list changed after the attach"
        );
    }
}

#[test]
fn an_ask_definition_waits_for_approval_and_a_denial_is_a_tool_error() {
    let _guard = stack().guard();
    let world = World::new("ask");
    let dir = world.dir.mkdir("guarded");
    let _mac = Runner::start(world.runner("ana", "mac"));
    world.define(json!({
        "name": "guarded", "kind": "local", "runner": "mac", "path": dir, "approval": "ask",
    }));
    let session = world.session();
    let api = &world.api;
    let approvals = |session: &str| format!("/v1/sessions/{session}/approvals");

    // Approve.
    let turn = ToolTurn::start(
        api,
        &session,
        &[("request_environment", json!({"spec": "guarded"}))],
    );
    let entries = api.wait_transcript(&session, "an approval request", TURN, |e| {
        !customs(e, custom_types::APPROVAL_REQUESTED).is_empty()
    });
    let request = customs(&entries, custom_types::APPROVAL_REQUESTED)[0].clone();
    let approval_id = request["approvalId"]
        .as_str()
        .unwrap_or_else(|| panic!("no approvalId: {request}"))
        .to_string();
    assert_eq!(
        (&request["environment"], &request["runner"]),
        (&json!("guarded"), &json!("mac")),
        "{request}"
    );
    let call_ids = turn
        .call_ids(&entries)
        .expect("the call is in the transcript");
    assert_eq!(request["toolCallId"], json!(call_ids[0]), "{request}");
    assert!(
        world.attached(&session).is_empty(),
        "nothing attaches before the answer"
    );

    let unknown = api.post(
        &format!(
            "{}/0f3c2a1b-5d1e-4c0a-9f7e-2b8f1d3c4a5e",
            approvals(&session)
        ),
        &json!({"decision": "approve"}),
    );
    unknown.expect_error(404);
    let bad = api.post(
        &format!("{}/{approval_id}", approvals(&session)),
        &json!({"decision": "maybe"}),
    );
    bad.expect_error(400);

    let answer = api.post(
        &format!("{}/{approval_id}", approvals(&session)),
        &json!({"decision": "approve"}),
    );
    assert_eq!(answer.status, 200, "{answer}");
    assert_eq!(
        answer.json(),
        json!({"approvalId": approval_id, "decision": "approve"})
    );
    let (results, entries) = turn.finish(api, TURN);
    assert_ok(&results[0]);
    attached_notice(&entries, "guarded");
    let decisions = customs(&entries, custom_types::APPROVAL_DECIDED);
    assert_eq!(decisions.len(), 1, "{}", describe(&entries));
    assert_eq!(
        (&decisions[0]["decision"], &decisions[0]["by"]),
        (&json!("approve"), &json!("ana"))
    );
    assert_eq!(world.attached(&session), vec!["guarded".to_string()]);

    // Answering twice is a conflict.
    let again = api.post(
        &format!("{}/{approval_id}", approvals(&session)),
        &json!({"decision": "deny"}),
    );
    assert_eq!(again.expect_error(409).code, "already_decided");

    // Deny: the agent sees a tool error; nothing attaches.
    let turn = ToolTurn::start(
        api,
        &session,
        &[(
            "request_environment",
            json!({"spec": "guarded", "name": "guarded-2"}),
        )],
    );
    let entries = api.wait_transcript(&session, "a second approval request", TURN, |e| {
        customs(e, custom_types::APPROVAL_REQUESTED).len() == 2
    });
    let second = customs(&entries, custom_types::APPROVAL_REQUESTED)[1].clone();
    assert_eq!(second["environment"], "guarded-2", "{second}");
    let second_id = second["approvalId"]
        .as_str()
        .expect("approvalId")
        .to_string();
    assert_ne!(second_id, approval_id);
    let answer = api.post(
        &format!("{}/{second_id}", approvals(&session)),
        &json!({"decision": "deny"}),
    );
    assert_eq!(answer.status, 200, "{answer}");
    let (results, _) = turn.finish(api, TURN);
    assert_tool_error(&results[0], &["denied", "guarded-2"]);
    assert_eq!(world.attached(&session), vec!["guarded".to_string()]);
    let again = api.post(
        &format!("{}/{second_id}", approvals(&session)),
        &json!({"decision": "approve"}),
    );
    assert_eq!(again.expect_error(409).code, "already_decided");
}

#[test]
fn a_failing_startup_script_is_a_tool_error_with_its_output() {
    let _guard = stack().guard();
    let world = World::new("script");
    let template = world.dir.mkdir("template");
    world.dir.write("template/README", "template\n");
    let cloud = Runner::start(world.runner("ops", "cloud-1").kind(RunnerKind::Cloud));
    world.define(json!({
        "name": "broken",
        "kind": "folder-template",
        "templatePath": template,
        "startupScript": "echo preparing-4f2\necho failing-on-stderr-9c1 >&2\nfalse\necho never-printed-77",
    }));
    let session = world.session();
    let result = request(&world.api, &session, json!({"spec": "broken"}));
    assert_tool_error(
        &result,
        &[
            "\"broken\"",
            "cloud-1",
            "startup_script_failed",
            "preparing-4f2",
            "failing-on-stderr-9c1",
        ],
    );
    assert!(
        !result.content.contains("never-printed-77"),
        "set -e must stop the script: {}",
        result.content
    );
    assert!(world.attached(&session).is_empty());
    let entries = world.api.transcript(&session);
    assert!(
        customs(&entries, custom_types::ENVIRONMENT_ATTACHED).is_empty(),
        "{}",
        describe(&entries)
    );
    let left: Vec<String> = std::fs::read_dir(cloud.workspaces_root())
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "the failed copy was left behind: {left:?}");
}

#[test]
fn a_worktree_branch_survives_detach() {
    let _guard = stack().guard();
    let world = World::new("worktree");
    let repo = world.dir.mkdir("repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    world.dir.write("repo/hello.txt", "hello from main\n");
    git(&repo, &["add", "hello.txt"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    let mac = Runner::start(world.runner("ana", "mac"));
    world.define(json!({"name": "repo", "kind": "worktree", "runner": "mac", "repoPath": repo}));
    let session = world.session();
    let api = &world.api;

    let attached = request(api, &session, json!({"spec": "repo"}));
    assert_ok(&attached);
    let short: String = session
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let branch = format!("wuhu/{short}");
    let root = mac.workspaces_root().join(&session);
    let entries = api.transcript(&session);
    let notice = attached_notice(&entries, "repo");
    assert_eq!(notice["branch"], json!(branch), "{notice}");
    assert_eq!(notice["root"], json!(root), "{notice}");
    assert!(
        notice["text"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("Branch {branch}."))),
        "{notice}"
    );

    let work = bash(
        api,
        &session,
        "git rev-parse --abbrev-ref HEAD && cat hello.txt && echo wip > wip.txt && git add wip.txt \
         && git -c user.name=Agent -c user.email=agent@wuhu.invalid commit -q -m 'agent work' && echo committed",
        None,
    );
    assert_ok(&work);
    assert!(
        work.content.contains(&branch)
            && work.content.contains("hello from main")
            && work.content.contains("committed"),
        "{}",
        work.content
    );

    let detached = run_tool(api, &session, "detach_environment", json!({"name": "repo"}));
    assert_ok(&detached);
    let entries = api.transcript(&session);
    let notice = customs(&entries, custom_types::ENVIRONMENT_DETACHED)
        .first()
        .map(|v| (*v).clone())
        .unwrap_or_else(|| panic!("no detached notice:\n{}", describe(&entries)));
    assert_eq!(notice["branch"], json!(branch), "{notice}");
    assert!(
        notice["text"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("Branch {branch} was kept."))),
        "{notice}"
    );
    assert!(world.attached(&session).is_empty());
    assert!(
        !root.exists(),
        "the worktree dir {} remains",
        root.display()
    );
    let listed = git(&repo, &["branch", "--list", &branch]);
    assert!(listed.contains(&branch), "branch gone: {listed:?}");
    let log = git(&repo, &["log", "--format=%s", &branch]);
    assert!(log.contains("agent work"), "{log}");
    let worktrees = git(&repo, &["worktree", "list"]);
    assert!(
        !worktrees.contains(&root.display().to_string()),
        "{worktrees}"
    );
}

#[test]
fn a_runner_killed_mid_bash_fails_the_call_quickly_and_serves_again_after_restart() {
    let _guard = stack().guard();
    let world = World::new("kill");
    let dir = world.dir.mkdir("api");
    world.dir.write("api/marker.txt", "still-here-5d1\n");
    let mut mac = Runner::start(world.runner("ana", "mac").env("api", &dir));
    let session = world.session();
    let api = &world.api;
    assert_ok(&request(api, &session, json!({"spec": "api"})));

    // The call writes its PID (then execs sleep): the runner's SIGKILL orphans it, so the test
    // ends it by that PID.
    let pid_file = dir.join("sleep.pid");
    let last = api.session(&session).session.last_cursor;
    let mut follow = api.follow(&session, &format!("sinceCursor={last}&timeoutSeconds=120"));
    let turn = ToolTurn::start(
        api,
        &session,
        &[(
            "bash",
            json!({
                "command": format!("echo $$ > {0}.tmp && mv {0}.tmp {0} && exec sleep 30", pid_file.display()),
                "timeout": 60,
            }),
        )],
    );
    let pid: i32 = wait_for("the bash call to be running", TURN, || {
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .and_then(|p| wuhu_e2e::util::host_pid(p, world.dir.path()))
    });
    let _orphan = KillOnDrop(pid);
    mac.kill_hard();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(30);
    let result = loop {
        let event = follow
            .next_event(deadline)
            .unwrap_or_else(|e| panic!("no tool result after the kill: {e}"))
            .expect("the follow stream ended");
        if let Some(result) = event.entry().as_ref().and_then(tool_result) {
            break result.clone();
        }
    };
    let elapsed = killed.elapsed();
    eprintln!(
        "runners: tool error {elapsed:?} after SIGKILL: {}",
        result.content
    );
    assert_tool_error(&result, &["\"mac\""]);
    assert!(
        elapsed <= Duration::from_secs(5),
        "the call failed {elapsed:?} after the runner died (limit 5 s)"
    );
    let (results, _) = turn.finish(api, TURN);
    assert!(results[0].is_error);
    api.wait_idle(&session, TURN);

    // The session carries on: a plain turn, and a call that says the runner is away.
    let reply = "still talking after the runner died";
    api.enqueue(
        &session,
        "followUp",
        &wuhu_e2e::entries::fake_directive(&json!({"reply": reply})),
    );
    api.wait_transcript(&session, "the plain reply", TURN, |e| {
        e.iter()
            .any(|e| wuhu_e2e::entries::assistant(e).is_some_and(|m| m.text() == reply))
    });
    let away = bash(api, &session, "true", None);
    assert_tool_error(&away, &["\"mac\""]);
    wait_for("mac listed as disconnected", TURN, || {
        world
            .listed_runner("mac")
            .filter(|r| r["connected"] == false)
    });

    // Restarted (same name, nothing re-registered by hand): used again.
    mac.restart();
    wait_for("mac listed as connected", TURN, || {
        world
            .listed_runner("mac")
            .filter(|r| r["connected"] == true)
    });
    let back = bash(api, &session, "cat marker.txt", None);
    assert_ok(&back);
    assert!(back.content.contains("still-here-5d1"), "{}", back.content);
    let entries = api.transcript(&session);
    let notes: Vec<String> = custom_messages(&entries)
        .into_iter()
        .filter(|(t, _)| t == custom_types::RESUME_NOTE)
        .map(|(_, c)| c)
        .collect();
    eprintln!("runners: resume notes after the restart: {notes:?}");
    for note in &notes {
        assert!(note.contains("\"api\""), "{note}");
    }
    assert_eq!(world.attached(&session), vec!["api".to_string()]);
}

#[test]
fn secret_looking_variables_never_reach_the_snapshot() {
    let _guard = stack().guard();
    let world = World::new("snapshot");
    let dir = world.dir.mkdir("snap");
    let venv = world.dir.mkdir("snap/.venv");
    let secrets = [
        ("MY_API_KEY", "sk-live-0f3c2a1b"),
        ("FOO_SECRET", "secret-value-9e8d"),
        ("GITHUB_TOKEN", "ghp-token-value-7a6b"),
        ("DB_PASSWORD", "password-value-5c4d"),
    ];
    let mut config = world
        .runner("ana", "mac")
        .var("NODE_ENV", "test")
        .var("VIRTUAL_ENV", venv.display().to_string())
        .var("WUHU_EXTRA_OK", "extra-visible-3b2a")
        .var("NOT_WHITELISTED", "not-captured-1a0b");
    for (name, value) in secrets {
        config = config.var(name, value);
    }
    let runner_token = config.token.clone();
    let _mac = Runner::start(config);
    world.define(json!({
        "name": "snap", "kind": "local", "runner": "mac", "path": dir,
        // A secret-looking name stays out even when a definition asks for it.
        "extraEnvVars": ["WUHU_EXTRA_OK", "MY_API_KEY"],
    }));
    let session = world.session();
    let api = &world.api;
    assert_ok(&request(api, &session, json!({"spec": "snap"})));

    let entries = api.transcript(&session);
    let notice = attached_notice(&entries, "snap");
    let env = notice["snapshot"]["env"]
        .as_object()
        .unwrap_or_else(|| panic!("no snapshot.env: {notice}"));
    assert_eq!(notice["snapshot"]["cwd"], json!(dir), "{notice}");
    assert_eq!(env.get("NODE_ENV"), Some(&json!("test")), "{notice}");
    assert_eq!(env.get("VIRTUAL_ENV"), Some(&json!(venv)), "{notice}");
    assert_eq!(
        env.get("WUHU_EXTRA_OK"),
        Some(&json!("extra-visible-3b2a")),
        "{notice}"
    );
    assert!(env.contains_key("PATH"), "{notice}");
    for name in [
        "MY_API_KEY",
        "FOO_SECRET",
        "GITHUB_TOKEN",
        "DB_PASSWORD",
        "WUHU_RUNNER_TOKEN",
        "NOT_WHITELISTED",
    ] {
        assert!(!env.contains_key(name), "{name} captured: {notice}");
    }

    let out = bash(api, &session, "env | sort", None);
    assert_ok(&out);
    assert!(
        out.content.contains("NODE_ENV=test")
            && out.content.contains("WUHU_EXTRA_OK=extra-visible-3b2a")
            && out.content.contains("CI=1"),
        "{}",
        out.content
    );
    // Neither the tool's environment nor anything the session stored holds a secret value.
    let stored = api
        .get(&format!("/v1/sessions/{session}?limit=1000"))
        .text();
    for (name, value) in secrets
        .iter()
        .copied()
        .chain([("WUHU_RUNNER_TOKEN", runner_token.as_str())])
    {
        assert!(
            !out.content.contains(value),
            "{name} reached bash: {}",
            out.content
        );
        assert!(!stored.contains(value), "{name} stored in the session");
    }
    assert!(
        !out.content.contains("not-captured-1a0b"),
        "{}",
        out.content
    );
}

#[test]
fn runner_tokens_and_user_tokens_are_not_interchangeable() {
    let _guard = stack().guard();
    let world = World::new("tokens");
    let runner_token = stack().runner_token("ana", &world.tenant);
    let user_token = stack().user_token("ana", &world.tenant);

    // A runner token on the user API.
    let as_runner = stack().client_with_token(Some(runner_token.clone()));
    for (method, path) in [
        ("GET", "/v1/sessions"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/runners"),
        ("GET", "/v1/environments"),
        ("GET", "/v1/workspace/docs"),
    ] {
        let response = as_runner.send(as_runner.request(method, path).json(&json!({})));
        assert_eq!(
            response.expect_error(401).code,
            "unauthorized",
            "{method} {path}"
        );
    }

    // A user token (or none) on the runner endpoint: 401 JSON on the upgrade.
    let connect = stack().url("/v1/runners/connect");
    for token in [Some(user_token.as_str()), None] {
        let mut request = wuhu_e2e::Request::new("GET", &connect)
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
        if let Some(token) = token {
            request = request.bearer(token);
        }
        let response = request.send().expect("GET /v1/runners/connect");
        assert_eq!(response.expect_error(401).code, "unauthorized");
    }
    match RawRunner::connect(&stack().base_url(), &user_token) {
        Err(e) => match *e {
            tungstenite::Error::Http(response) => assert_eq!(response.status().as_u16(), 401),
            other => panic!("expected an HTTP 401 refusal, got {other}"),
        },
        Ok(_) => panic!("a user token opened a runner connection"),
    }

    // The runner binary with a user token stops with exit code 2 and says why.
    let mut refused = Runner::spawn(world.runner("ana", "mac").token(user_token));
    let status = refused
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| {
            panic!(
                "the runner kept going with a user token:\n{}",
                refused.log_tail(20)
            )
        });
    assert_eq!(status.code(), Some(2), "log:\n{}", refused.log_tail(20));
    assert!(
        refused.log().contains("refused"),
        "{}",
        refused.log_tail(20)
    );
    assert!(world.listed_runner("mac").is_none());

    // The right token works.
    let _mac = Runner::start(world.runner("ana", "mac").token(runner_token));
    let listed = world.listed_runner("mac").expect("mac listed");
    assert_eq!(listed["connected"], true, "{listed}");
}

#[test]
fn a_garbage_frame_is_answered_with_an_error_frame_and_the_connection_survives() {
    let _guard = stack().guard();
    let world = World::new("frames");
    let token = stack().runner_token("ana", &world.tenant);
    let mut raw = RawRunner::connect(&stack().base_url(), &token)
        .unwrap_or_else(|e| panic!("connect with a runner token: {e}"));
    let wait = Duration::from_secs(15);
    raw.send_text(&RawRunner::hello("raw-1", RunnerKind::Local));
    match raw.next_message(wait) {
        ServerMessage::Welcome {
            heartbeat_seconds, ..
        } => assert!(heartbeat_seconds > 0),
        other => panic!("expected welcome, got {other:?}"),
    }

    let error_for = |raw: &mut RawRunner, frame: &str| -> Value {
        raw.send_text(frame);
        let text = raw.next_text(wait);
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("answer to {frame:?} is not JSON ({e}): {text}"));
        assert_eq!(value["type"], "error", "answer to {frame:?}: {text}");
        assert!(
            value["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        value
    };
    let malformed = error_for(&mut raw, "not json");
    assert_eq!(malformed["code"], "malformed_frame", "{malformed}");
    raw.heartbeat();
    assert_eq!(raw.next_text(wait), HEARTBEAT_ACK_FRAME);

    let unknown = error_for(&mut raw, r#"{"type":"attach_reslt","id":"q-1"}"#);
    assert_eq!(
        (&unknown["code"], &unknown["id"]),
        (&json!("unknown_type"), &json!("q-1")),
        "{unknown}"
    );
    let invalid = error_for(&mut raw, r#"{"type":"tool_result","id":"q-2"}"#);
    assert_eq!(
        (&invalid["code"], &invalid["id"]),
        (&json!("invalid_message"), &json!("q-2")),
        "{invalid}"
    );
    let array = error_for(&mut raw, "[1,2,3]");
    assert_eq!(array["code"], "malformed_frame", "{array}");
    raw.send_binary(b"\x00\x01binary");
    let text = raw.next_text(wait);
    let binary: Value = serde_json::from_str(&text).expect("binary answer is JSON");
    assert_eq!(
        (&binary["type"], &binary["code"]),
        (&json!("error"), &json!("binary_frame")),
        "{text}"
    );

    // Still the same live connection.
    raw.heartbeat();
    assert_eq!(raw.next_text(wait), HEARTBEAT_ACK_FRAME);
    let listed = world.listed_runner("raw-1").expect("raw-1 listed");
    assert_eq!(listed["connected"], true, "{listed}");
    assert!(stack().healthz_ok());
    raw.close();
    wait_for("raw-1 listed as disconnected", TURN, || {
        world
            .listed_runner("raw-1")
            .filter(|r| r["connected"] == false)
    });
}

#[test]
fn no_runner_or_no_match_is_a_tool_error_naming_what_is_available() {
    let _guard = stack().guard();
    let world = World::new("nomatch");
    let dir = world.dir.mkdir("api");
    let session = world.session();
    let api = &world.api;

    // Nothing at all, and another tenant's runner offering "api" does not count.
    let other = World::new("nomatch-other");
    let _foreign = Runner::start(other.runner("ana", "mac").env("api", &dir));
    let nothing = request(api, &session, json!({"spec": "api"}));
    assert_tool_error(&nothing, &["\"api\"", "none"]);

    // A local runner offering `api` and a definition that needs a cloud runner.
    let _mac = Runner::start(world.runner("ana", "mac").env("api", &dir));
    let template = world.dir.mkdir("template");
    world.define(json!({"name": "web", "kind": "folder-template", "templatePath": template}));
    let unknown = request(api, &session, json!({"spec": "db"}));
    assert_tool_error(&unknown, &["\"db\"", "web", "mac:api", "mac (local"]);
    let wrong_kind = request(api, &session, json!({"spec": "api", "preference": "cloud"}));
    assert_tool_error(&wrong_kind, &["\"api\"", "mac", "cloud", "web"]);
    let no_cloud = request(api, &session, json!({"spec": "web", "preference": "cloud"}));
    assert_tool_error(&no_cloud, &["\"web\"", "cloud runner", "mac:api"]);
    assert!(world.attached(&session).is_empty());

    // Bad arguments are tool errors too.
    let bad = request(api, &session, json!({"spec": "api", "preference": "moon"}));
    assert_tool_error(&bad, &["preference"]);
    let ok = request(api, &session, json!({"spec": "api"}));
    assert_ok(&ok);
    assert!(ok.content.contains("on runner \"mac\""), "{}", ok.content);
}

#[test]
fn runners_are_listed_and_environment_definitions_are_validated() {
    let _guard = stack().guard();
    let world = World::new("crud");
    let api_dir = world.dir.mkdir("api");
    let docs_dir = world.dir.mkdir("docs");
    let _mac = Runner::start(
        world
            .runner("ana", "mac")
            .env("api", &api_dir)
            .env("docs", &docs_dir),
    );
    let mut cloud = Runner::start(world.runner("ops", "cloud-1").kind(RunnerKind::Cloud));

    let mac = world.listed_runner("mac").expect("mac listed");
    assert_eq!(
        (&mac["owner"], &mac["kind"], &mac["os"], &mac["connected"]),
        (&json!("ana"), &json!("local"), &json!(os()), &json!(true)),
        "{mac}"
    );
    assert_eq!(mac["arch"], std::env::consts::ARCH, "{mac}");
    assert!(mac["lastSeen"].as_i64().is_some_and(|t| t > 0), "{mac}");
    assert!(
        mac["capabilities"]
            .as_array()
            .is_some_and(|c| c.contains(&json!("bash"))),
        "{mac}"
    );
    let mut envs: Vec<(String, String)> = mac["environments"]
        .as_array()
        .expect("environments")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or("").to_string(),
                e["path"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    envs.sort();
    assert_eq!(
        envs,
        vec![
            ("api".to_string(), api_dir.display().to_string()),
            ("docs".to_string(), docs_dir.display().to_string()),
        ]
    );
    let listed_cloud = world.listed_runner("cloud-1").expect("cloud-1 listed");
    assert_eq!(
        (&listed_cloud["owner"], &listed_cloud["kind"]),
        (&json!("ops"), &json!("cloud"))
    );
    cloud.kill_hard();
    wait_for("cloud-1 listed as disconnected", TURN, || {
        world
            .listed_runner("cloud-1")
            .filter(|r| r["connected"] == false)
    });

    // Create, read by name and by id, list.
    let api = &world.api;
    let created = world.define(json!({
        "name": "api-def", "kind": "local", "runner": "mac", "path": api_dir,
    }));
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(
        (
            &created["name"],
            &created["kind"],
            &created["approval"],
            &created["templatePath"]
        ),
        (
            &json!("api-def"),
            &json!("local"),
            &json!("auto"),
            &Value::Null
        ),
        "{created}"
    );
    for key in ["api-def", id.as_str()] {
        let got = api.get(&format!("/v1/environments/{key}"));
        assert_eq!(got.status, 200, "{got}");
        assert_eq!(got.json(), created);
    }
    let list = api.get("/v1/environments");
    assert_eq!(list.status, 200, "{list}");
    assert_eq!(list.json()["environments"], json!([created]));

    // Validation: 400 for bad bodies, 409 for a taken name.
    let bad_bodies = [
        json!({"name": "x", "kind": "local", "path": "/tmp"}),
        json!({"name": "x", "kind": "local", "runner": "mac", "path": "relative/dir"}),
        json!({"name": "x y", "kind": "local", "runner": "mac", "path": "/tmp"}),
        json!({"name": "0f3c2a1b-5d1e-4c0a-9f7e-2b8f1d3c4a5e", "kind": "local", "runner": "mac", "path": "/tmp"}),
        json!({"name": "x", "kind": "folder-template", "templatePath": "/tmp", "path": "/tmp"}),
        json!({"name": "x", "kind": "folder-template"}),
        json!({"name": "x", "kind": "worktree", "repoPath": "/tmp"}),
        json!({"name": "x", "kind": "moon"}),
        json!({"name": "x", "kind": "local", "runner": "mac", "path": "/tmp", "colour": "red"}),
        json!({"name": "x", "kind": "local", "runner": "mac", "path": "/tmp", "approval": "sometimes"}),
        json!({"name": "x", "kind": "local", "runner": "mac", "path": "/tmp", "extraEnvVars": ["1BAD"]}),
        json!({"name": "x", "kind": "worktree", "runner": "mac", "repoPath": "/tmp", "baseRef": "-x"}),
    ];
    for body in bad_bodies {
        let response = api.post("/v1/environments", &body);
        response.expect_error(400);
    }
    api.send_raw("POST", "/v1/environments", "{not json")
        .expect_error(400);
    let duplicate = api.post(
        "/v1/environments",
        &json!({"name": "api-def", "kind": "folder-template", "templatePath": "/tmp"}),
    );
    duplicate.expect_error(409);

    // Update: partial, validated, names stay unique.
    let patched = api.patch(
        "/v1/environments/api-def",
        &json!({"approval": "ask", "extraEnvVars": ["JAVA_HOME"]}),
    );
    assert_eq!(patched.status, 200, "{patched}");
    let patched = patched.json();
    assert_eq!(
        (
            &patched["id"],
            &patched["approval"],
            &patched["extraEnvVars"]
        ),
        (&json!(id), &json!("ask"), &json!(["JAVA_HOME"])),
        "{patched}"
    );
    world.define(json!({"name": "other", "kind": "folder-template", "templatePath": "/tmp"}));
    api.patch(&format!("/v1/environments/{id}"), &json!({"name": "other"}))
        .expect_error(409);
    api.patch("/v1/environments/api-def", &json!({"path": "relative"}))
        .expect_error(400);
    api.patch("/v1/environments/api-def", &json!({"runner": null}))
        .expect_error(400);
    api.patch("/v1/environments/nope", &json!({"approval": "auto"}))
        .expect_error(404);
    let renamed = api.patch(
        &format!("/v1/environments/{id}"),
        &json!({"name": "api-v2"}),
    );
    assert_eq!(renamed.status, 200, "{renamed}");
    api.get("/v1/environments/api-def").expect_error(404);

    // Delete.
    let deleted = api.send(api.request("DELETE", "/v1/environments/api-v2"));
    assert_eq!(deleted.status, 204, "{deleted}");
    api.get(&format!("/v1/environments/{id}")).expect_error(404);
    api.send(api.request("DELETE", &format!("/v1/environments/{id}")))
        .expect_error(404);
    api.send(
        api.request("PUT", "/v1/environments/other")
            .json(&json!({})),
    )
    .expect_error(405);
    let names: Vec<Value> = api.get("/v1/environments").json()["environments"]
        .as_array()
        .expect("environments")
        .iter()
        .map(|d| d["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("other")]);

    // Definitions and runners belong to their tenant.
    let stranger = stack().client("ana", &unique_name("crud-other"));
    stranger.get("/v1/environments/other").expect_error(404);
    let theirs = stranger.get("/v1/runners").json();
    assert_eq!(theirs["runners"], json!([]), "{theirs}");
}

#[test]
fn a_stale_snapshot_after_a_reconnect_is_a_notice_and_the_agent_gets_a_resume_note() {
    let _guard = stack().guard();
    let world = World::new("stale");
    let dir = world.dir.mkdir("api");
    let venv = world.dir.mkdir("venv");
    let mut mac = Runner::start(
        world
            .runner("ana", "mac")
            .env("api", &dir)
            .var("VIRTUAL_ENV", venv.display().to_string()),
    );
    let session = world.session();
    let api = &world.api;
    assert_ok(&request(api, &session, json!({"spec": "api"})));
    let notice = attached_notice(&api.transcript(&session), "api");
    assert_eq!(
        notice["snapshot"]["env"]["VIRTUAL_ENV"],
        json!(venv.display().to_string()),
        "the snapshot captured VIRTUAL_ENV: {notice}"
    );
    // Still valid: a call on the same connection says nothing about resuming.
    assert_ok(&bash(api, &session, "true", None));
    assert!(
        custom_messages(&api.transcript(&session))
            .iter()
            .all(|(t, _)| t != custom_types::RESUME_NOTE),
        "no resume note before any reconnect"
    );

    // The runner goes away, the virtualenv is deleted, the runner comes back.
    mac.kill_hard();
    std::fs::remove_dir_all(&venv).expect("remove the virtualenv");
    mac.restart();
    assert_ok(&bash(api, &session, "true", None));

    let entries = api.transcript(&session);
    let stale = customs(&entries, custom_types::ENVIRONMENT_STALE);
    assert_eq!(stale.len(), 1, "one stale notice:\n{}", describe(&entries));
    let text = stale[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("VIRTUAL_ENV") && text.contains(&venv.display().to_string()),
        "{text}"
    );
    let notes: Vec<String> = custom_messages(&entries)
        .into_iter()
        .filter(|(t, _)| t == custom_types::RESUME_NOTE)
        .map(|(_, c)| c)
        .collect();
    assert_eq!(notes.len(), 1, "one resume note: {notes:?}");
    assert!(
        notes[0].contains("stale") && notes[0].contains("\"api\""),
        "{}",
        notes[0]
    );
}

/// Seed 004 in a serverless host: the session's actor is evicted while idle (about 10 s under
/// `wrangler dev`), ten times, and nothing shows: the snapshot's validation is stored with the
/// attachment, so a wake neither validates again nor adds a resume note. Each wake is seen in
/// the Worker's log (`session_loaded`).
#[test]
fn evictions_of_an_idle_session_add_no_resume_note() {
    let _guard = stack().guard();
    let world = World::new("evicted");
    let dir = world.dir.mkdir("api");
    let _mac = Runner::start(world.runner("ana", "mac").env("api", &dir));
    let session = world.session();
    let api = &world.api;
    assert_ok(&request(api, &session, json!({"spec": "api"})));
    assert_ok(&bash(api, &session, "true", None));
    let loads = || {
        stack()
            .log_events()
            .iter()
            .filter(|e| e["event"] == "session_loaded" && e["session"] == session.as_str())
            .count()
    };
    let before = loads();
    let started = Instant::now();
    let mut evictions = 0;
    while evictions < 10 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "only {evictions} evictions in 10 minutes"
        );
        // Idle time for the runtime to evict the actor: not a synchronisation.
        std::thread::sleep(Duration::from_secs(12));
        assert_ok(&bash(api, &session, "true", None));
        evictions = loads() - before;
    }
    let entries = api.transcript(&session);
    assert!(
        custom_messages(&entries)
            .iter()
            .all(|(t, _)| t != custom_types::RESUME_NOTE),
        "a resume note after {evictions} evictions:\n{}",
        describe(&entries)
    );
    assert!(customs(&entries, custom_types::ENVIRONMENT_STALE).is_empty());
}

/// Every path under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read_dir").flatten() {
            let path = entry.path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path);
            }
        }
    }
    out.sort();
    out
}

/// One `ExecStart=`/`Environment=` value split into words as systemd does for what
/// `wuhu_runner::service::systemd_word` writes: double quotes with `\` escapes, `%%` and `$$`.
fn systemd_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        let mut word = String::new();
        if first == '"' {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => word.push(chars.next().expect("an escaped character")),
                    '"' => break,
                    c => word.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                word.push(c);
                chars.next();
            }
        }
        words.push(word.replace("%%", "%").replace("$$", "$"));
    }
    words
}

/// `wuhu-runner service install` on Linux, end to end without a running systemd (none runs
/// here): the unit it writes passes `systemd-analyze verify`, the command line in it starts a
/// runner that connects with the token from the 0600 file (never on the command line or in the
/// unit), installing again changes nothing, `status` tells what is there, and `uninstall`
/// leaves the home directory as it was.
/// A command run as `nobody` when this process is root (CI runs as root, and `service install`
/// refuses a user unit for root), else as it is.
fn as_installing_user(program: &Path) -> Command {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Command::new(program);
    }
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(program);
    command
}

#[test]
fn service_install_writes_a_unit_whose_command_connects_and_uninstall_leaves_nothing() {
    let _guard = stack().guard();
    let world = World::new("service");
    let home = world.dir.mkdir("home");
    std::fs::create_dir_all(home.join(".config")).unwrap();
    world.dir.mkdir("home/project");
    // The service runs the binary that installed it: a copy outside target/, as installed.
    let bin = home.join("bin/wuhu-runner");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(wuhu_e2e::runner::runner_bin(), &bin).expect("copy the runner");
    let token = stack().runner_token("ana", &world.tenant);
    // The home belongs to the installing user.
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let status = Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(&home)
            .status()
            .expect("chown");
        assert!(status.success());
    }
    let before = listing(&home);
    let service = |args: &[&str]| {
        let output = as_installing_user(&bin)
            .arg("service")
            .args(args)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", wuhu_e2e::runner::RUNNER_PATH)
            .env("USER", "ana")
            .env("WUHU_RUNNER_TOKEN", &token)
            .output()
            .expect("run wuhu-runner service");
        (
            output.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    };
    let server = stack().base_url();
    let install = [
        "install",
        "--no-start",
        "--server",
        server.as_str(),
        "--name",
        "svc-1",
        "--env",
        "project=~/project",
    ];
    let (code, out) = service(&install);
    assert_eq!(code, Some(0), "{out}");
    let unit_path = home.join(".config/systemd/user/wuhu-runner.service");
    let token_path = home.join(".wuhu/runner.token");
    assert!(
        out.contains(&format!("wrote {}", unit_path.display())),
        "{out}"
    );
    let unit = std::fs::read_to_string(&unit_path).expect("the unit");
    assert!(
        !unit.contains(&token),
        "the token is never in the unit:\n{unit}"
    );
    assert_eq!(
        std::fs::read_to_string(&token_path).unwrap(),
        format!("{token}\n")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&token_path), 0o600);
    assert_eq!(mode(token_path.parent().unwrap()), 0o700);

    // systemd's own check of the unit, where systemd-analyze is installed (Debian: systemd).
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let runtime = world.dir.mkdir("xdg-runtime");
        let verify = Command::new("systemd-analyze")
            .args(["--user", "verify"])
            .arg(&unit_path)
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .expect("systemd-analyze");
        let complaints = String::from_utf8_lossy(&verify.stderr).into_owned();
        assert!(
            verify.status.success() && complaints.trim().is_empty(),
            "systemd-analyze verify: {complaints}\n{unit}"
        );
    } else {
        eprintln!("wuhu-e2e: systemd-analyze is not installed: the unit is not verified");
    }

    // Run the unit's command as systemd would: its Environment, its working directory (~).
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in\n{unit}"))
            .to_string()
    };
    let argv = systemd_words(&value("ExecStart="));
    assert_eq!(argv[0], bin.canonicalize().unwrap().display().to_string());
    assert_eq!(argv[1], "register");
    assert!(!argv.iter().any(|a| a.contains(&token)), "{argv:?}");
    let environment = systemd_words(&value("Environment="));
    let path = environment[0].strip_prefix("PATH=").expect("PATH=");
    assert!(path.contains("/home/linuxbrew/.linuxbrew/bin") && path.contains("/usr/bin"));
    let log = world.dir.path().join("service-run.log");
    let mut child = as_installing_user(Path::new(&argv[0]))
        .args(&argv[1..])
        .env_clear()
        .env("HOME", &home)
        .env("PATH", path)
        .current_dir(&home)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start the unit's command");
    let connected = wuhu_e2e::wait_until(Duration::from_secs(60), || {
        world
            .listed_runner("svc-1")
            .filter(|r| r["connected"] == true)
    });
    let _ = child.kill();
    let _ = child.wait();
    let listed = connected.unwrap_or_else(|_| {
        panic!(
            "the unit's command did not connect: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert_eq!(listed["environments"][0]["name"], "project", "{listed}");

    // Again: the same files, nothing rewritten.
    let (code, again) = service(&install);
    assert_eq!(code, Some(0), "{again}");
    assert!(
        again.contains(&format!("unchanged {}", unit_path.display()))
            && again.contains(&format!("unchanged {}", token_path.display())),
        "{again}"
    );
    let (code, status) = service(&["status"]);
    assert!(status.contains("installed"), "{status}");
    // 3: installed but not running (no systemd runs here; under systemd, 3 as well: never started).
    assert_eq!(code, Some(3), "{status}");

    let (code, removed) = service(&["uninstall"]);
    assert_eq!(code, Some(0), "{removed}");
    std::fs::remove_file(&log).ok();
    // What the runner made when it ran, not the install: its key (uninstall keeps it on
    // purpose: the hub binds the runner's name to it, decision 0024) and its runtime directory
    // (left by the kill above).
    std::fs::remove_dir_all(home.join(".wuhu/run")).ok();
    std::fs::remove_file(home.join(".wuhu/runner-key")).ok();
    std::fs::remove_dir(home.join(".wuhu")).ok();
    assert_eq!(
        listing(&home),
        before,
        "uninstall leaves the home as it was: {removed}"
    );
    let (code, status) = service(&["status"]);
    assert_eq!(code, Some(4), "{status}");
    let (code, _) = service(&["uninstall"]);
    assert_eq!(code, Some(0), "uninstalling twice is fine");
}

/// The macOS agent as `install --dry-run` shows it, read back by Python's plistlib (an
/// independent reader of Apple's format): the arguments arrive exactly, the token does not.
#[test]
fn the_launchd_agent_is_a_plist_whose_arguments_arrive_exactly() {
    let world = World::new("plist");
    let home = world.dir.mkdir("Users/ana");
    let token = "header.payload.signature";
    let output = Command::new(wuhu_e2e::runner::runner_bin())
        .args([
            "service",
            "install",
            "--dry-run",
            "--platform",
            "macos",
            "--server",
            "https://wuhu.example.com",
            "--name",
            "ana-mac",
            "--env",
            "odd=~/a & <b> \"c\" 'd' $e %f",
        ])
        .env_clear()
        .env("HOME", &home)
        .env("WUHU_RUNNER_TOKEN", token)
        .output()
        .expect("run wuhu-runner");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!text.contains(token), "{text}");
    let plist_text = text
        .split("# ")
        .find(|part| part.contains("<plist"))
        .and_then(|part| part.split_once('\n'))
        .map(|(_, body)| body.trim_end().to_string() + "\n")
        .expect("the plist in the dry run");
    let plist = world.dir.write("agent.plist", &plist_text);
    let read = Command::new("python3")
        .args([
            "-c",
            "import json, plistlib, sys; print(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))",
        ])
        .arg(&plist)
        .output()
        .expect("python3");
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let agent: Value = serde_json::from_slice(&read.stdout).expect("JSON");
    let bin = wuhu_e2e::runner::runner_bin().canonicalize().unwrap();
    assert_eq!(
        agent["ProgramArguments"],
        json!([
            bin.display().to_string(),
            "register",
            "--server",
            "https://wuhu.example.com",
            "--name",
            "ana-mac",
            "--env",
            "odd=~/a & <b> \"c\" 'd' $e %f",
            "--token-file",
            home.join(".wuhu/runner.token").display().to_string(),
        ])
    );
    assert_eq!(agent["Label"], "dev.wuhu.runner");
    assert_eq!(agent["RunAtLoad"], true);
    assert_eq!(agent["KeepAlive"], json!({"SuccessfulExit": false}));
    let log = home
        .join("Library/Logs/wuhu-runner.log")
        .display()
        .to_string();
    assert_eq!(agent["StandardErrorPath"], log);
    assert!(
        agent["EnvironmentVariables"]["PATH"]
            .as_str()
            .is_some_and(|p| p.contains("/opt/homebrew/bin")),
        "{agent}"
    );
}
