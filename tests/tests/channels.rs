//! Chat channels end to end: the real Worker, a fake Slack Web API on a local port, hook
//! requests signed in the test with Slack's real algorithm.
//!
//! One `wrangler dev` serves every test; each test has its own tenant, binding and fake Slack.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{EntryPayload, Message, Status, custom_types};
use wuhu_e2e::fake_chat::{FakeSlack, slack_signature};
use wuhu_e2e::util::{random_hex, unique_name, unix_now};
use wuhu_e2e::{Api, Request, Response, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(30);

fn stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        Stack::start_with(StackOptions {
            fake_delay_ms: Some(0),
            ..StackOptions::default()
        })
    })
}

/// A tenant with an admin and a Slack binding whose API is a local fake.
struct SlackWorld {
    tenant: String,
    admin: Api,
    id: String,
    signing_secret: String,
    slack: FakeSlack,
}

const BOT_TOKEN: &str = "xoxb-test-token-0123456789";

impl SlackWorld {
    fn new(prefix: &str) -> SlackWorld {
        let stack = stack();
        let tenant = unique_name(prefix);
        let admin = stack.admin_client("root", &tenant);
        let slack = FakeSlack::start(BOT_TOKEN);
        let signing_secret = random_hex(16);
        let response = admin.post(
            "/v1/channels",
            &json!({
                "platform": "slack",
                "name": "team",
                "credentials": {"signingSecret": signing_secret, "botToken": BOT_TOKEN},
                "apiBaseUrl": slack.api_base_url(),
            }),
        );
        assert_eq!(response.status, 201, "{response}");
        let id = response.json()["id"].as_str().unwrap().to_string();
        SlackWorld {
            tenant,
            admin,
            id,
            signing_secret,
            slack,
        }
    }

    /// POSTs `body` to the hook, signed at `timestamp` with `secret`.
    fn send_signed(
        &self,
        body: &[u8],
        secret: &str,
        timestamp: i64,
        extra: &[(&str, &str)],
    ) -> Response {
        let mut request = Request::new("POST", stack().url(&format!("/hooks/slack/{}", self.id)))
            .header("Content-Type", "application/json")
            .header("X-Slack-Request-Timestamp", timestamp.to_string())
            .header(
                "X-Slack-Signature",
                slack_signature(secret, timestamp, body),
            )
            .body(body.to_vec());
        for (name, value) in extra {
            request = request.header(name, *value);
        }
        request.send().expect("hook request")
    }

    fn send(&self, body: &Value) -> Response {
        self.send_signed(
            body.to_string().as_bytes(),
            &self.signing_secret,
            unix_now(),
            &[],
        )
    }

    fn tenant(&self) -> String {
        self.tenant.clone()
    }

    fn sessions(&self) -> Vec<wuhu_core::wire::SessionInfo> {
        self.admin.list_sessions("").sessions
    }
}

fn event(event_id: &str, event: Value) -> Value {
    json!({"type": "event_callback", "team_id": "T1", "event_id": event_id, "event": event})
}

fn mention(user: &str, channel: &str, ts: &str, text: &str) -> Value {
    json!({"type": "app_mention", "user": user, "channel": channel, "ts": ts, "text": format!("<@UBOT> {text}")})
}

fn thread_reply(user: &str, channel: &str, ts: &str, thread_ts: &str, text: &str) -> Value {
    json!({"type": "message", "channel_type": "channel", "user": user, "channel": channel, "ts": ts, "thread_ts": thread_ts, "text": text})
}

fn user_messages(api: &Api, session: &str) -> Vec<(String, String)> {
    api.transcript(session)
        .into_iter()
        .filter_map(|e| match e.payload {
            EntryPayload::Message {
                message: Message::User {
                    author, content, ..
                },
            } => Some((author, content)),
            _ => None,
        })
        .collect()
}

#[test]
fn bindings_are_for_admins_and_never_show_credentials() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("chan-admin");
    let admin = stack.admin_client("root", &tenant);
    let member = stack.client("alice", &tenant);
    let secret = format!("signing-{}", random_hex(16));
    let token = format!("xoxb-{}", random_hex(16));
    let body = json!({"platform": "slack", "name": "ops", "credentials": {"signingSecret": secret, "botToken": token}});
    assert_eq!(member.post("/v1/channels", &body).status, 403);
    assert_eq!(member.get("/v1/channels").status, 403);
    let created = admin.post("/v1/channels", &body);
    assert_eq!(created.status, 201, "{created}");
    let view = created.json();
    let id = view["id"].as_str().unwrap().to_string();
    assert_eq!(view["platform"], "slack");
    assert_eq!(view["apiBaseUrl"], "https://slack.com/api");
    assert_eq!(view["webhookUrl"], stack.url(&format!("/hooks/slack/{id}")));
    assert!(
        view["setup"].to_string().contains("Interactivity"),
        "{view}"
    );
    let list = admin.get("/v1/channels");
    assert_eq!(list.status, 200);
    let one = admin.get(&format!("/v1/channels/{id}"));
    assert_eq!(one.status, 200);
    for text in [created.text(), list.text(), one.text()] {
        assert!(
            !text.contains(&secret) && !text.contains(&token),
            "a read shows a credential: {text}"
        );
    }
    assert_eq!(list.json()["channels"].as_array().unwrap().len(), 1);
    // Credentials on disk are sealed: neither secret appears in the state dir in clear.
    let found = grep_dir(stack.persist_dir(), &[secret.as_bytes(), token.as_bytes()]);
    assert!(found.is_empty(), "credentials stored in clear in {found:?}");
    // Bad input is a 400 that names the field.
    let bad = admin.post(
        "/v1/channels",
        &json!({"platform": "slack", "name": "x", "credentials": {"botToken": "x"}}),
    );
    assert_eq!(bad.expect_error(400).code, "bad_request");
    assert_eq!(admin.send_raw("POST", "/v1/channels", "{nope").status, 400);
    // Patch, then another tenant's admin cannot see or touch it.
    let patched = admin.patch(
        &format!("/v1/channels/{id}"),
        &json!({"name": "ops2", "options": {"busyLane": "steer", "progress": true}}),
    );
    assert_eq!(patched.status, 200, "{patched}");
    assert_eq!(patched.json()["name"], "ops2");
    assert_eq!(patched.json()["options"]["busyLane"], "steer");
    let other = stack.admin_client("root", &unique_name("chan-other"));
    assert_eq!(other.get(&format!("/v1/channels/{id}")).status, 404);
    assert_eq!(
        other
            .send(other.request("DELETE", &format!("/v1/channels/{id}")))
            .status,
        404
    );
    // Delete: gone from reads, and its hook refuses everything.
    assert_eq!(
        admin
            .send(admin.request("DELETE", &format!("/v1/channels/{id}")))
            .status,
        204
    );
    assert_eq!(admin.get(&format!("/v1/channels/{id}")).status, 404);
    let body = json!({"type": "url_verification", "challenge": "c"}).to_string();
    let ts = unix_now();
    let hook = Request::new("POST", stack.url(&format!("/hooks/slack/{id}")))
        .header("X-Slack-Request-Timestamp", ts.to_string())
        .header(
            "X-Slack-Signature",
            slack_signature(&secret, ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .unwrap();
    assert_eq!(hook.status, 401, "{hook}");
}

/// Files under `dir` that contain any of `needles`.
fn grep_dir(dir: &std::path::Path, needles: &[&[u8]]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && needles
                    .iter()
                    .any(|n| bytes.windows(n.len()).any(|w| w == *n))
            {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn a_slack_thread_with_two_people_is_one_group_session() {
    let stack = stack();
    let _guard = stack.guard();
    let world = SlackWorld::new("chan-thread");
    // Slack's URL check.
    let challenge = world.send(&json!({"type": "url_verification", "challenge": "3eZbrw1aB"}));
    assert_eq!(challenge.status, 200, "{challenge}");
    assert_eq!(challenge.json()["challenge"], "3eZbrw1aB");
    // A plain message in an unbound thread starts nothing.
    let plain = world.send(&event(
        "Ev0",
        thread_reply("U9", "C1", "5.0", "4.0", "not for the bot"),
    ));
    assert_eq!(plain.status, 200, "{plain}");
    // alice (U1) mentions the bot; bob (U2) answers in the thread.
    let first = world.send(&event("Ev1", mention("U1", "C1", "10.0001", "hello")));
    assert_eq!(first.status, 200, "{first}");
    let session = first.json()["session"]
        .as_str()
        .expect("a session")
        .to_string();
    let posts = world.slack.wait_for_posts(1, TURN);
    let second = world.send(&event(
        "Ev2",
        thread_reply("U2", "C1", "11.0001", "10.0001", "me too"),
    ));
    assert_eq!(
        second.json()["session"].as_str(),
        Some(session.as_str()),
        "{second}"
    );
    let posts = world.slack.wait_for_posts(posts.len() + 1, TURN);
    // One session, open to the tenant, owned by the first author.
    let sessions = world.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].owner, "slack:U1");
    assert_eq!(sessions[0].access, wuhu_core::authority::Access::Tenant);
    assert_eq!(
        user_messages(&world.admin, &session),
        vec![
            ("slack:U1".into(), "hello".into()),
            ("slack:U2".into(), "me too".into())
        ]
    );
    let transcript = world.admin.transcript(&session);
    let reminders = transcript
        .iter()
        .filter(|e| matches!(&e.payload, EntryPayload::Message { message: Message::CustomMessage { custom_type, .. } } if custom_type == custom_types::GROUP_CHAT_REMINDER))
        .count();
    assert_eq!(reminders, 1);
    // Replies went to the thread, with the bot token; the second shows bob's prefix (the fake
    // model echoes what it was sent).
    for post in &posts {
        assert_eq!(post.method, "chat.postMessage");
        assert_eq!(post.token.as_deref(), Some(BOT_TOKEN));
        assert_eq!(post.body["channel"], "C1");
        assert_eq!(post.body["thread_ts"], "10.0001");
    }
    assert_eq!(posts[0].body["text"], "echo: hello");
    assert_eq!(posts[1].body["text"], "echo: [slack:U2]:\n\nme too");
    // A mention in a new thread is a new session.
    let other = world.send(&event("Ev3", mention("U2", "C1", "20.0001", "new topic")));
    assert_ne!(other.json()["session"].as_str(), Some(session.as_str()));
    world.slack.wait_for_posts(3, TURN);
    assert_eq!(world.sessions().len(), 2);
}

#[test]
fn bad_signatures_are_refused_and_replays_are_enqueued_once() {
    let stack = stack();
    let _guard = stack.guard();
    let world = SlackWorld::new("chan-verify");
    let body = event("Ev1", mention("U1", "C1", "30.0001", "once")).to_string();
    let now = unix_now();
    // Well outside the 300 s window: the requests are sent a moment after `now` was read (the
    // window's exact edges are core's table test).
    let cases: Vec<(&str, Response)> = vec![
        (
            "another secret",
            world.send_signed(body.as_bytes(), "not-the-secret", now, &[]),
        ),
        (
            "stale timestamp",
            world.send_signed(body.as_bytes(), &world.signing_secret, now - 400, &[]),
        ),
        (
            "future timestamp",
            world.send_signed(body.as_bytes(), &world.signing_secret, now + 400, &[]),
        ),
        (
            "missing signature",
            Request::new("POST", stack.url(&format!("/hooks/slack/{}", world.id)))
                .header("X-Slack-Request-Timestamp", now.to_string())
                .body(body.clone())
                .send()
                .unwrap(),
        ),
        (
            "unknown binding",
            Request::new("POST", stack.url(&format!("/hooks/slack/{}", uuid_like())))
                .header("X-Slack-Request-Timestamp", now.to_string())
                .header(
                    "X-Slack-Signature",
                    slack_signature(&world.signing_secret, now, body.as_bytes()),
                )
                .body(body.clone())
                .send()
                .unwrap(),
        ),
        (
            "wrong platform",
            Request::new("POST", stack.url(&format!("/hooks/telegram/{}", world.id)))
                .header("X-Telegram-Bot-Api-Secret-Token", "x")
                .body(body.clone())
                .send()
                .unwrap(),
        ),
    ];
    for (what, response) in &cases {
        assert_eq!(response.status, 401, "{what}: {response}");
        assert_eq!(response.json()["error"]["code"], "unauthorized", "{what}");
    }
    assert!(
        world.sessions().is_empty(),
        "a refused hook created a session"
    );
    // The same event delivered four times (Slack's retries carry X-Slack-Retry-Num), plus its
    // twin `message` event: one user message, one reply.
    let twin = event(
        "Ev1b",
        json!({"type": "message", "channel_type": "channel", "user": "U1", "channel": "C1", "ts": "30.0001", "text": "<@UBOT> once"}),
    );
    for (i, body) in [
        body.clone(),
        body.clone(),
        body.clone(),
        twin.to_string(),
        body.clone(),
    ]
    .iter()
    .enumerate()
    {
        let retry = i.to_string();
        let extra: Vec<(&str, &str)> = if i > 0 {
            vec![
                ("X-Slack-Retry-Num", &retry),
                ("X-Slack-Retry-Reason", "http_timeout"),
            ]
        } else {
            vec![]
        };
        let response =
            world.send_signed(body.as_bytes(), &world.signing_secret, unix_now(), &extra);
        assert_eq!(response.status, 200, "delivery {i}: {response}");
    }
    world.slack.wait_for_posts(1, TURN);
    let sessions = world.sessions();
    assert_eq!(sessions.len(), 1);
    let session = &sessions[0].id;
    world.admin.wait_idle(session, TURN);
    assert_eq!(user_messages(&world.admin, session).len(), 1);
    // Give a wrong second reply time to show up: the session is idle and was watched once.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(world.slack.posts().len(), 1, "{:?}", world.slack.posts());
}

fn uuid_like() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[test]
fn a_rate_limited_reply_is_posted_once_after_retry_after() {
    let stack = stack();
    let _guard = stack.guard();
    let world = SlackWorld::new("chan-429");
    world
        .slack
        .fail_next(vec![FakeSlack::rate_limited(1), FakeSlack::rate_limited(1)]);
    let response = world.send(&event(
        "Ev1",
        mention("U1", "C7", "40.0001", "are you there"),
    ));
    assert_eq!(response.status, 200, "{response}");
    let posts = world.slack.wait_for_posts(1, TURN);
    let calls = world.slack.calls();
    assert_eq!(calls.len(), 3, "two 429s, then the post: {calls:?}");
    assert_eq!(posts[0].body["text"], "echo: are you there");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(world.slack.posts().len(), 1);
    let session = &world.sessions()[0].id;
    assert_eq!(
        world.admin.wait_idle(session, TURN).session.status,
        Status::Idle
    );
}

/// POSTs an Interactivity click of `user` on `button_value`, signed like Slack does.
fn click(world: &SlackWorld, user: &str, value: &str) -> Response {
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user},
        "actions": [{"action_id": "wuhu_x", "value": value, "action_ts": format!("{}.{}", unix_now(), random_hex(3))}],
    });
    let body = format!("payload={}", form_encode(&payload.to_string()));
    let ts = unix_now();
    Request::new("POST", stack().url(&format!("/hooks/slack/{}", world.id)))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("X-Slack-Request-Timestamp", ts.to_string())
        .header(
            "X-Slack-Signature",
            slack_signature(&world.signing_secret, ts, body.as_bytes()),
        )
        .body(body)
        .send()
        .expect("click")
}

fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn approval_buttons_count_only_from_the_approver() {
    use wuhu_core::wire::runner::RunnerKind;
    use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
    let stack = stack();
    let _guard = stack.guard();
    let world = SlackWorld::new("chan-approve");
    let dir = TempDir::new("wuhu-e2e-chan-approve");
    let guarded = dir.mkdir("guarded");
    let tenant_name = world.tenant();
    let _cloud = Runner::start(
        RunnerConfig::new(stack, "ops", &tenant_name, "cloud-1")
            .kind(RunnerKind::Cloud)
            .token(stack.cloud_runner_token("ops", &tenant_name))
            .env("guarded", &guarded)
            .workspaces_root(dir.mkdir("workspaces")),
    );
    let defined = world.admin.post(
        "/v1/environments",
        &json!({"name": "guarded", "kind": "local", "runner": "cloud-1", "path": guarded, "approval": "ask"}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    // U1 starts the thread (and owns the session) with a turn that attaches `guarded`.
    let directive = json!({"toolCalls": [{"name": "request_environment", "arguments": {"spec": "guarded"}}], "afterTools": "attached it"});
    let start = world.send(&event(
        "Ev1",
        mention("U1", "C3", "50.0001", &format!("@fake {directive}")),
    ));
    assert_eq!(start.status, 200, "{start}");
    let session = start.json()["session"].as_str().unwrap().to_string();
    let posts = world.slack.wait_for_posts(1, TURN);
    let request = &posts[0].body;
    assert_eq!(request["thread_ts"], "50.0001");
    let buttons = request["blocks"][1]["elements"]
        .as_array()
        .expect("buttons")
        .clone();
    let value = |decision: &str| {
        buttons
            .iter()
            .find(|b| {
                b["value"]
                    .as_str()
                    .is_some_and(|v| v.starts_with(&format!("{decision}:")))
            })
            .and_then(|b| b["value"].as_str())
            .unwrap_or_else(|| panic!("no {decision} button in {request}"))
            .to_string()
    };
    // U2 (in the thread, not the session's owner) clicks Approve: refused, still waiting.
    let refused = click(&world, "U2", &value("approve"));
    assert_eq!(refused.status, 200, "{refused}");
    assert_eq!(refused.json()["ok"], false, "{refused}");
    let notes = world.slack.wait_for_posts(2, TURN);
    assert!(
        notes[1].body["text"]
            .as_str()
            .unwrap()
            .contains("slack:U2 could not answer"),
        "{:?}",
        notes[1].body
    );
    assert_eq!(
        world.admin.session(&session).session.status,
        Status::Running
    );
    // U1 approves: the turn goes on and its answer arrives in the thread.
    let accepted = click(&world, "U1", &value("approve"));
    assert_eq!(accepted.json()["ok"], true, "{accepted}");
    let posts = wait_for("the reply after the approval", TURN, || {
        let posts = world.slack.posts();
        posts
            .iter()
            .any(|p| p.body["text"] == "attached it")
            .then_some(posts)
    });
    assert!(posts.iter().any(|p| {
        p.body["text"]
            .as_str()
            .is_some_and(|t| t.contains("slack:U1 answered: approve"))
    }));
    assert_eq!(
        world.admin.wait_idle(&session, TURN).session.status,
        Status::Idle
    );
}
