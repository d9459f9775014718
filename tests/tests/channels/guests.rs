//! Who a binding lets in (decision 0035), end to end on the channel tests' stack: strangers
//! start nothing and are told once; a Slack binding serves its own workspace and app only;
//! guests get no runner (cloud included), no other session, the workspace only under
//! `channels/<binding id>/`, no js egress, and a quota; a mapped member in the same thread keeps
//! a member's rights; a child spawned in a guest's turn is a guest's too.
//!
//! The rights test collects every broken rule before it fails, so one build with several rules
//! removed shows each of them red.

use serde_json::{Value, json};
use wuhu_core::channels::Platform;
use wuhu_core::channels::admit::DEFAULT_REFUSAL;
use wuhu_core::wire::{EntryPayload, Message};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Response, wait_for};

use super::{Auth, PLATFORMS, SLACK_APP, SLACK_TEAM, TURN, World, generous, stack, user_messages};

impl World {
    /// A Telegram update: person `user` writes `text` in their private chat with the bot.
    fn telegram_private(&self, user: u64, text: &str) -> Vec<u8> {
        let seq = self.next();
        let id: i64 = self.user(user).parse().unwrap();
        json!({"update_id": seq, "message": {"message_id": seq,
            "from": {"id": id, "is_bot": false, "first_name": "P"},
            "chat": {"id": id, "type": "private"}, "text": text}})
        .to_string()
        .into_bytes()
    }

    /// A Slack delivery `body` (JSON) re-addressed to workspace `team` and app `app`.
    fn slack_for(body: &[u8], team: &str, app: &str) -> Vec<u8> {
        let mut value: Value = serde_json::from_slice(body).unwrap();
        value["team_id"] = json!(team);
        value["api_app_id"] = json!(app);
        value.to_string().into_bytes()
    }

    /// Posts the refusals (or quota notes) seen so far containing `needle`.
    fn posts_with(&self, needle: &str) -> usize {
        self.fake
            .posts()
            .iter()
            .filter(|p| p.text().contains(needle))
            .count()
    }
}

/// The hook's answer to a refused message: `refused` with what the person is told (Discord:
/// the interaction's ephemeral answer).
#[track_caller]
fn refused(platform: Platform, response: &Response) -> String {
    assert_eq!(response.status, 200, "{response}");
    let body = response.json();
    if platform == Platform::Discord {
        assert_eq!(body["type"], 4, "{body}");
        assert_eq!(body["data"]["flags"], 64, "ephemeral: {body}");
        return body["data"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    }
    body["refused"]
        .as_str()
        .unwrap_or_else(|| panic!("{platform:?}: not refused: {body}"))
        .to_string()
}

/// Under `admit: mapped` (the default) a stranger's message starts and enqueues nothing, on
/// every platform; they are told once an hour (Discord: in the interaction's own ephemeral
/// answer, each time), and a second stranger is told too. A mapped member still starts a
/// session.
#[test]
fn strangers_start_nothing_and_are_told_once() {
    let stack = stack();
    let _guard = stack.guard();
    for platform in PLATFORMS {
        let admin = stack.admin_client("root", &unique_name("chan-stranger"));
        let refusal = "Only mapped people, sorry.";
        let world = World::with_binding(stack, platform, admin, json!({"refusal": refusal}));
        let mut bodies = vec![
            world.message_body(2, 10, "let me in", true),
            world.message_body(2, 11, "please", true),
        ];
        if platform == Platform::Telegram {
            // A private chat always addresses the bot, and always started a session before.
            bodies.push(world.telegram_private(2, "hello?"));
        }
        for body in &bodies {
            let response = world.post(body, Auth::Good);
            assert_eq!(refused(platform, &response), refusal, "{platform:?}");
        }
        // A stranger's plain message in a thread, a command and a click do nothing either.
        let plain = world.post(&world.message_body(2, 10, "hm", false), Auth::Good);
        assert_eq!(plain.status, 200, "{plain}");
        world.command(2, 10, "status");
        world.click(2, 10, "approve:0b8a5c1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b");
        // A second stranger is told too.
        let other = world.post(&world.message_body(3, 12, "me?", true), Auth::Good);
        assert_eq!(refused(platform, &other), refusal);
        // A member starts a session (members are members on every binding).
        world.map_member(4, "dana");
        world.say(4, 13, "I am mapped");
        world
            .fake
            .wait_for_text("the member's reply", TURN, |t| t == "echo: I am mapped");
        let sessions = world.sessions();
        assert_eq!(sessions.len(), 1, "{platform:?}: {sessions:?}");
        assert_eq!(sessions[0].owner, "dana");
        let told = world.posts_with(refusal);
        let want = if platform == Platform::Discord {
            0 // Answered inline, never posted.
        } else {
            2 // Person 2 once (of four refusals), person 3 once.
        };
        assert_eq!(told, want, "{platform:?}: {:?}", world.fake.posts());
    }
}

/// A Slack binding serves the workspace and app it pinned: an event, a slash command and a
/// click for another `team_id` or `api_app_id` (the same app installed elsewhere signs with
/// the same secret) start nothing and tell nobody, whoever sends them, even a mapped member
/// under `admit: anyone`.
#[test]
fn slack_deliveries_for_another_workspace_or_app_are_refused() {
    let stack = stack();
    let _guard = stack.guard();
    let admin = stack.admin_client("root", &unique_name("chan-slack-team"));
    let world = World::with_binding(
        stack,
        Platform::Slack,
        admin,
        json!({"admit": "anyone", "guestQuota": generous()}),
    );
    world.map_member(1, "erin");
    for (team, app) in [("T2", SLACK_APP), (SLACK_TEAM, "A2")] {
        for user in [1, 2] {
            let body = World::slack_for(&world.message_body(user, 20, "hi", true), team, app);
            let response = world.post(&body, Auth::Good);
            assert_eq!(response.status, 200, "{response}");
            let answer = response.json();
            assert!(
                answer["ignored"]
                    .as_str()
                    .is_some_and(|why| why.contains(team) || why.contains(app)),
                "{team} {app}: {answer}"
            );
        }
        // A slash command from there: an empty acknowledgement, nothing else.
        let seq = world.next();
        let slash = format!(
            "command=%2Fwuhu&text=status&team_id={team}&api_app_id={app}&channel_id=C1&user_id=U1&trigger_id={seq}.1&response_url={}",
            super::form_encode(&world.fake.slack_response_url(seq))
        );
        let response = world.post(slash.as_bytes(), Auth::Good);
        assert_eq!((response.status, response.text()), (200, String::new()));
        // A click from there.
        let payload = json!({"type": "block_actions", "user": {"id": "U1"}, "team": {"id": team},
            "api_app_id": app, "actions": [{"action_id": "wuhu_x",
            "value": "approve:s:0b8a5c1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b", "action_ts": "1.1"}]});
        let click = format!("payload={}", super::form_encode(&payload.to_string()));
        let response = world.post(click.as_bytes(), Auth::Good);
        assert!(response.json()["ignored"].is_string(), "{response}");
    }
    // An event that names no workspace at all is refused too.
    let mut nameless: Value =
        serde_json::from_slice(&world.message_body(1, 21, "who am I", true)).unwrap();
    nameless.as_object_mut().unwrap().remove("team_id");
    let response = world.post(nameless.to_string().as_bytes(), Auth::Good);
    assert!(response.json()["ignored"].is_string(), "{response}");
    assert!(world.sessions().is_empty());
    assert!(world.fake.calls().is_empty(), "{:?}", world.fake.calls());
    // The pinned workspace and app: the member's message works.
    world.say(1, 22, "from home");
    world
        .fake
        .wait_for_text("the reply", TURN, |t| t == "echo: from home");
    assert_eq!(world.sessions().len(), 1);
}

/// `admit: allowlist` admits the unmapped users of the listed chats (Telegram), teams (Slack:
/// the person's own, so a Slack Connect guest from elsewhere is a stranger) as guests, and
/// nobody else.
#[test]
fn an_allowlist_admits_only_the_listed_places() {
    let stack = stack();
    let _guard = stack.guard();
    // Telegram: thread 30 is chat -100030.
    let admin = stack.admin_client("root", &unique_name("chan-allow"));
    let telegram = World::with_binding(
        stack,
        Platform::Telegram,
        admin.clone(),
        json!({"admit": "allowlist", "allowlist": ["-100030"]}),
    );
    let listed = telegram.post(&telegram.message_body(2, 30, "listed", true), Auth::Good);
    assert!(listed.json()["refused"].is_null(), "{listed}");
    let elsewhere = telegram.post(&telegram.message_body(2, 31, "elsewhere", true), Auth::Good);
    assert_eq!(refused(Platform::Telegram, &elsewhere), DEFAULT_REFUSAL);
    let private = telegram.post(&telegram.telegram_private(2, "privately"), Auth::Good);
    assert_eq!(refused(Platform::Telegram, &private), DEFAULT_REFUSAL);
    telegram
        .fake
        .wait_for_text("the guest's reply", TURN, |t| t == "echo: listed");
    let sessions = telegram.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].owner, "telegram:1002");
    // Slack: our own workspace's people are guests, a Slack Connect guest from T9 is not.
    let slack = World::with_binding(
        stack,
        Platform::Slack,
        stack.admin_client("root", &unique_name("chan-allow-slack")),
        json!({"admit": "allowlist", "allowlist": [SLACK_TEAM]}),
    );
    let ours = slack.post(&slack.message_body(2, 40, "ours", true), Auth::Good);
    assert!(ours.json()["refused"].is_null(), "{ours}");
    let mut connect: Value =
        serde_json::from_slice(&slack.message_body(3, 41, "from T9", true)).unwrap();
    connect["event"]["user_team"] = json!("T9");
    let theirs = slack.post(connect.to_string().as_bytes(), Auth::Good);
    assert_eq!(refused(Platform::Slack, &theirs), DEFAULT_REFUSAL);
    slack
        .fake
        .wait_for_text("the guest's reply", TURN, |t| t == "echo: ours");
    assert_eq!(slack.sessions().len(), 1);
}

/// A guest's quota: sessions and messages per hour, its own (another guest is not counted
/// against it, nor is a member); past it a short note (posted once an hour) and nothing
/// enqueued.
#[test]
fn a_guest_hits_its_quota() {
    let stack = stack();
    let _guard = stack.guard();
    let admin = stack.admin_client("root", &unique_name("chan-quota"));
    let world = World::with_binding(
        stack,
        Platform::Telegram,
        admin,
        json!({"admit": "anyone", "guestQuota": {"sessionsPerHour": 1, "messagesPerHour": 3}}),
    );
    world.map_member(1, "fay");
    let queued = |response: &Response| {
        assert_eq!(response.status, 200, "{response}");
        assert!(response.json()["refused"].is_null(), "{response}");
    };
    queued(&world.say(2, 50, "one"));
    world
        .fake
        .wait_for_text("reply one", TURN, |t| t == "echo: one");
    // A second session is past the guest's sessions.
    let second = world.say(2, 51, "another thread");
    assert!(
        refused(Platform::Telegram, &second).contains("started 1 conversations"),
        "{second}"
    );
    queued(&world.post(&world.message_body(2, 50, "two", false), Auth::Good));
    queued(&world.post(&world.message_body(2, 50, "three", false), Auth::Good));
    // The fourth message is past its messages.
    let fourth = world.post(&world.message_body(2, 50, "four", false), Auth::Good);
    assert!(
        refused(Platform::Telegram, &fourth).contains("sent me 3 messages"),
        "{fourth}"
    );
    // Another guest and a member are not counted against it.
    queued(&world.post(&world.message_body(3, 50, "five", false), Auth::Good));
    for text in ["six", "seven", "eight", "nine"] {
        queued(&world.post(&world.message_body(1, 50, text, false), Auth::Good));
    }
    let session = world.only_session();
    let said = wait_for("every admitted message", TURN, || {
        let said: Vec<String> = user_messages(&world.admin, &session)
            .into_iter()
            .map(|(_, text)| text)
            .collect();
        (said.len() == 8).then_some(said)
    });
    world.admin.wait_idle(&session, TURN);
    for refused in ["another thread", "four"] {
        assert!(!said.iter().any(|s| s == refused), "{said:?}");
    }
    assert_eq!(world.sessions().len(), 1);
    // Told once for both (once an hour).
    assert_eq!(world.posts_with("this hour"), 1, "{:?}", world.fake.posts());
}

/// What is wrong with tool call `call` of `session`, if anything: it should have failed
/// (`error`) or not, saying `says`.
fn check(api: &Api, session: &str, call: &str, error: bool, says: &str) -> Option<String> {
    match result_of(api, session, call) {
        Some((is_error, content)) if is_error == error && content.contains(says) => None,
        other => Some(format!(
            "{call}: want error={error} saying {says:?}, got {other:?}"
        )),
    }
}

/// One tool result of `session`, by its call id: `(is_error, content)`.
fn result_of(api: &Api, session: &str, call: &str) -> Option<(bool, String)> {
    api.transcript(session)
        .into_iter()
        .find_map(|e| match e.payload {
            EntryPayload::Message {
                message: Message::ToolResult(r),
            } if r.tool_call_id == call => Some((r.is_error, r.content)),
            _ => None,
        })
}

/// A guest's turn, prompted in a Telegram thread of a binding that admits anyone: it cannot
/// read `users/alice/`, the tenant's settings or alice's private session, cannot get the
/// tenant's cloud environment (directly, for a child, or shared), has no js egress, and writes
/// only in its binding's folder; the child it spawns is a guest's too. Alice, mapped, in the
/// same thread afterwards, keeps a member's rights (the cloud environment, her document).
#[test]
fn a_guest_gets_a_guests_share_and_a_member_in_the_thread_keeps_hers() {
    use wuhu_core::wire::runner::RunnerKind;
    use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("chan-rights");
    let admin = stack.admin_client("root", &tenant);
    let alice = stack.client("alice", &tenant);
    let context = "CANARY-alice-context";
    assert!(alice.put_doc("users/alice/context.md", context).status < 300);
    let private = alice.create_fake_session().id;
    alice.enqueue(&private, "followUp", "CANARY-alice-private");
    alice.wait_idle(&private, TURN);
    let dir = TempDir::new("wuhu-e2e-chan-rights");
    let cloud_dir = dir.mkdir("cloud");
    let _cloud = Runner::start(
        RunnerConfig::new(stack, "ops", &tenant, "cloud-box")
            .kind(RunnerKind::Cloud)
            .token(stack.cloud_runner_token("ops", &tenant))
            .env("box", &cloud_dir)
            .workspaces_root(dir.mkdir("workspaces")),
    );
    let defined = admin.post(
        "/v1/environments",
        &json!({"name": "box", "kind": "local", "runner": "cloud-box", "path": cloud_dir}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let world = World::with_binding(
        stack,
        Platform::Telegram,
        admin.clone(),
        json!({"admit": "anyone", "guestQuota": generous()}),
    );
    world.map_member(1, "alice");
    let folder = format!("channels/{}/", world.id);
    let child_task = json!({"toolCalls": [
        {"id": "k1", "name": "request_environment", "arguments": {"spec": "box"}},
        {"id": "k2", "name": "read", "arguments": {"path": "wuhu://workspace/users/alice/context.md"}},
    ], "afterTools": "child done"});
    let calls = json!([
        {"id": "g1", "name": "read", "arguments": {"path": "wuhu://workspace/users/alice/context.md"}},
        {"id": "g2", "name": "read", "arguments": {"path": "wuhu://workspace/"}},
        {"id": "g3", "name": "read", "arguments": {"path": "wuhu://config/models.json"}},
        {"id": "g4", "name": "read_session", "arguments": {"id": private}},
        {"id": "g5", "name": "request_environment", "arguments": {"spec": "box", "preference": "cloud"}},
        {"id": "g6", "name": "js", "arguments": {"code": "try { await fetch('http://127.0.0.1:9/'); 'fetched' } catch (e) { String(e) }"}},
        {"id": "g7", "name": "js", "arguments": {"code": "await wuhu.workspace.read('users/alice/context.md')"}},
        {"id": "g8", "name": "write", "arguments": {"path": "wuhu://workspace/notes/guest.md", "content": "planted"}},
        {"id": "g9", "name": "write", "arguments": {"path": format!("wuhu://workspace/{folder}notes.md"), "content": "guest notes"}},
        {"id": "g10", "name": "spawn_session", "arguments": {"task": "share yours", "environment": "inherit"}},
        {"id": "g11", "name": "spawn_session", "arguments": {"task": "get one", "environment": "box"}},
        {"id": "g12", "name": "spawn_session", "arguments": {"task": format!("@fake {child_task}"), "wait": true}},
        {"id": "g13", "name": "read", "arguments": {"path": format!("wuhu://workspace/{folder}notes.md")}},
    ]);
    world.say(
        2,
        60,
        &format!(
            "@fake {}",
            json!({"toolCalls": calls, "afterTools": "guest done"})
        ),
    );
    world
        .fake
        .wait_for_text("the guest's reply", TURN, |t| t == "guest done");
    let session = world
        .sessions()
        .into_iter()
        .find(|s| s.owner == "telegram:1002" && s.parent_id.is_none())
        .expect("the thread's session")
        .id;
    world.admin.wait_idle(&session, TURN);
    let mut broken: Vec<String> = Vec::new();
    let guest = "chat guest telegram:1002";
    broken.extend(check(&admin, &session, "g1", true, guest));
    broken.extend(check(&admin, &session, "g2", true, &folder));
    broken.extend(check(&admin, &session, "g3", true, "chat guest"));
    broken.extend(check(&admin, &session, "g4", true, ""));
    broken.extend(check(
        &admin,
        &session,
        "g5",
        true,
        "guests may not use environments",
    ));
    broken.extend(check(
        &admin,
        &session,
        "g6",
        false,
        "egress refused: this turn acts for the chat guest",
    ));
    broken.extend(check(&admin, &session, "g7", true, guest));
    broken.extend(check(&admin, &session, "g8", true, guest));
    broken.extend(check(&admin, &session, "g9", false, "Wrote"));
    broken.extend(check(
        &admin,
        &session,
        "g10",
        true,
        "guests may not use environments",
    ));
    broken.extend(check(
        &admin,
        &session,
        "g11",
        true,
        "guests may not use environments",
    ));
    broken.extend(check(&admin, &session, "g12", false, ""));
    broken.extend(check(&admin, &session, "g13", false, "guest notes"));
    // Nothing of alice's reached the guest's transcript, and nothing was attached.
    let shown = serde_json::to_string(&admin.transcript(&session)).unwrap();
    for canary in [context, "CANARY-alice-private"] {
        if shown.contains(canary) {
            broken.push(format!("the guest's turn saw {canary}"));
        }
    }
    if !admin.session(&session).environments.is_empty() {
        broken.push("the guest's session has an environment".into());
    }
    if admin.get_doc("notes/guest.md").status != 404 {
        broken.push("the guest wrote notes/guest.md".into());
    }
    // The child acts for the guest: a guest's share too.
    let child = admin
        .list_sessions("")
        .sessions
        .into_iter()
        .find(|s| s.parent_id.as_deref() == Some(session.as_str()));
    match child {
        Some(child) => {
            admin.wait_idle(&child.id, TURN);
            broken.extend(check(
                &admin,
                &child.id,
                "k1",
                true,
                "guests may not use environments",
            ));
            broken.extend(check(&admin, &child.id, "k2", true, guest));
        }
        None => broken.push("no child was spawned".into()),
    }
    // Alice, mapped, in the same thread: a member's rights (a cloud environment needs no
    // approval; her own document).
    let member_calls = json!([
        {"id": "a1", "name": "request_environment", "arguments": {"spec": "box", "preference": "cloud"}},
        {"id": "a2", "name": "read", "arguments": {"path": "wuhu://workspace/users/alice/context.md"}},
    ]);
    world.post(
        &world.message_body(
            1,
            60,
            &format!(
                "@fake {}",
                json!({"toolCalls": member_calls, "afterTools": "alice done"})
            ),
            false,
        ),
        Auth::Good,
    );
    world
        .fake
        .wait_for_text("alice's reply", TURN, |t| t == "alice done");
    world.admin.wait_idle(&session, TURN);
    broken.extend(check(&admin, &session, "a1", false, "attached"));
    broken.extend(check(&admin, &session, "a2", false, context));
    assert!(broken.is_empty(), "rules broken:\n{}", broken.join("\n"));
}
