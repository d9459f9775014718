//! Chat channels end to end: the real Worker, a fake platform API per binding on a local port
//! (Slack Web API, Telegram Bot API, Discord API, a generic reply receiver), hook requests
//! signed in the test with each platform's real algorithm (Discord's Ed25519 keys generated
//! here).
//!
//! One `wrangler dev` serves every test but the restart one; each test has its own tenant,
//! bindings and fakes. Most tests are tables over the four platforms: one [`World`] speaks
//! each platform's wire format, so a rule is checked the same way everywhere.

#[path = "channels/guests.rs"]
mod guests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use serde_json::{Value, json};
use wuhu_core::channels::Platform;
use wuhu_core::wire::{EntryPayload, Message, Status, custom_types};
use wuhu_e2e::fake_chat::{
    ChatCall, FakeChat, SLACK_RESPONSE_URL, discord_keys, discord_signature, generic_signature,
    slack_signature,
};
use wuhu_e2e::util::{random_hex, unique_name, unix_now};
use wuhu_e2e::{Api, Request, Response, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(30);
const PLATFORMS: [Platform; 4] = [
    Platform::Slack,
    Platform::Telegram,
    Platform::Discord,
    Platform::Generic,
];

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// How a hook request is signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    Good,
    WrongSecret,
    /// Signed 400 s ago (outside the 300 s window).
    Stale,
    Missing,
}

/// A tenant with an admin and one binding whose API is a local fake, and the platform's wire
/// format for what people do (write, click).
struct World {
    platform: Platform,
    /// The Worker's origin (a stack of its own in the restart test).
    base: String,
    admin: Api,
    id: String,
    /// Slack signing secret, Telegram secret token, generic secret (Discord signs with a key).
    secret: String,
    discord_key: Option<SigningKey>,
    fake: FakeChat,
    seq: AtomicU64,
    /// People mapped to a Wuhu `sub` through `/v1/channels/:id/members` (by `n`).
    members: std::sync::Mutex<Vec<(u64, String)>>,
}

const BOT_TOKEN: &str = "bot-test-token-0123456789";
/// The Slack workspace and app the test bindings serve.
const SLACK_TEAM: &str = "T1";
const SLACK_APP: &str = "A1";

/// A guest quota no test but the quota's own reaches.
fn generous() -> Value {
    json!({"sessionsPerHour": 1000, "messagesPerHour": 10000,
        "allGuestsSessionsPerHour": 1000, "allGuestsMessagesPerHour": 10000})
}

impl World {
    fn new(platform: Platform, prefix: &str) -> World {
        let tenant = unique_name(prefix);
        World::in_tenant(platform, stack().admin_client("root", &tenant), json!({}))
    }

    /// A binding of `platform` for `admin`'s tenant with `options`.
    fn in_tenant(platform: Platform, admin: Api, options: Value) -> World {
        World::on_stack(stack(), platform, admin, options)
    }

    /// A binding on `stack` that admits anyone as a guest with a quota these tests never
    /// reach (the rules about who is let in have their own tests: `guests`).
    fn on_stack(stack: &Stack, platform: Platform, admin: Api, options: Value) -> World {
        World::with_binding(
            stack,
            platform,
            admin,
            json!({"options": options, "admit": "anyone", "guestQuota": generous()}),
        )
    }

    /// A binding on `stack` whose create body has `fields` (Slack's pin `T1`/`A1` unless
    /// given).
    fn with_binding(stack: &Stack, platform: Platform, admin: Api, fields: Value) -> World {
        let secret = random_hex(16);
        let (fake, credentials, discord_key) = match platform {
            Platform::Slack => (
                FakeChat::slack(BOT_TOKEN),
                json!({"signingSecret": secret, "botToken": BOT_TOKEN}),
                None,
            ),
            Platform::Telegram => (
                FakeChat::telegram(BOT_TOKEN),
                json!({"botToken": BOT_TOKEN, "secretToken": secret}),
                None,
            ),
            Platform::Discord => {
                let (key, public) = discord_keys();
                (
                    FakeChat::discord(BOT_TOKEN),
                    json!({"applicationId": "app1", "publicKey": public, "botToken": BOT_TOKEN}),
                    Some(key),
                )
            }
            Platform::Generic => {
                let fake = FakeChat::generic(&secret);
                let credentials = json!({"secret": secret, "replyUrl": fake.reply_url()});
                (fake, credentials, None)
            }
        };
        let mut body = json!({
            "platform": platform.as_str(),
            "name": "team",
            "credentials": credentials,
        });
        if platform != Platform::Generic {
            body["apiBaseUrl"] = json!(fake.api_base_url());
        }
        if platform == Platform::Slack {
            body["teamId"] = json!(SLACK_TEAM);
            body["apiAppId"] = json!(SLACK_APP);
        }
        for (field, value) in fields.as_object().unwrap() {
            body[field] = value.clone();
        }
        let response = admin.post("/v1/channels", &body);
        assert_eq!(response.status, 201, "{response}");
        let id = response.json()["id"].as_str().unwrap().to_string();
        World {
            platform,
            base: stack.base_url(),
            admin,
            id,
            secret,
            discord_key,
            fake,
            seq: AtomicU64::new(1),
            members: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// POSTs `body` to the hook, signed as `auth` says.
    fn post(&self, body: &[u8], auth: Auth) -> Response {
        self.post_at(self.platform, &self.id, body, auth)
    }

    /// POSTs `body` signed as this binding's platform signs, to `/hooks/<platform>/<id>`.
    fn post_at(&self, platform: Platform, id: &str, body: &[u8], auth: Auth) -> Response {
        let now = unix_now();
        let ts = if auth == Auth::Stale { now - 400 } else { now };
        let secret = if auth == Auth::WrongSecret {
            "not-the-secret-at-all"
        } else {
            self.secret.as_str()
        };
        let url = format!("{}/hooks/{}/{id}", self.base, platform.as_str());
        let mut request = Request::new("POST", url).body(body.to_vec());
        let headers: Vec<(&str, String)> = match self.platform {
            Platform::Slack => vec![
                ("X-Slack-Request-Timestamp", ts.to_string()),
                ("X-Slack-Signature", slack_signature(secret, ts, body)),
                (
                    "Content-Type",
                    // Events are JSON; interactions and slash commands are forms.
                    if body.starts_with(b"{") {
                        "application/json"
                    } else {
                        "application/x-www-form-urlencoded"
                    }
                    .into(),
                ),
            ],
            Platform::Telegram => vec![("X-Telegram-Bot-Api-Secret-Token", secret.to_string())],
            Platform::Discord => {
                let key = match auth {
                    Auth::WrongSecret => discord_keys().0,
                    _ => self.discord_key.clone().unwrap(),
                };
                vec![
                    ("X-Signature-Timestamp", ts.to_string()),
                    ("X-Signature-Ed25519", discord_signature(&key, ts, body)),
                ]
            }
            Platform::Generic => vec![
                ("X-Wuhu-Timestamp", ts.to_string()),
                ("X-Wuhu-Signature", generic_signature(secret, ts, body)),
            ],
        };
        for (name, value) in headers {
            let signature_header = !matches!(name, "Content-Type");
            if auth == Auth::Missing && signature_header {
                continue;
            }
            request = request.header(name, value);
        }
        request.send().expect("hook request")
    }

    /// A person's id on the platform (`n` tells people apart).
    fn user(&self, n: u64) -> String {
        match self.platform {
            Platform::Slack => format!("U{n}"),
            Platform::Telegram => format!("{}", 1000 + n),
            Platform::Discord => format!("{}", 90_000 + n),
            Platform::Generic => format!("person{n}"),
        }
    }

    /// The Wuhu identity of person `n`: their mapped `sub`, else `<platform>:<id>`.
    fn identity(&self, n: u64) -> String {
        let members = self.members.lock().unwrap();
        match members.iter().find(|(m, _)| *m == n) {
            Some((_, sub)) => sub.clone(),
            None => format!("{}:{}", self.platform.as_str(), self.user(n)),
        }
    }

    /// Maps person `n` to `sub` (the binding's whole member list is replaced).
    fn map_member(&self, n: u64, sub: &str) {
        let mut members = self.members.lock().unwrap();
        members.retain(|(m, _)| *m != n);
        members.push((n, sub.to_string()));
        let list: Vec<Value> = members
            .iter()
            .map(|(m, sub)| json!({"user": self.user(*m), "sub": sub}))
            .collect();
        let path = format!("/v1/channels/{}/members", self.id);
        let response = self.admin.send(
            self.admin
                .request("PUT", &path)
                .body(json!({ "members": list }).to_string().into_bytes()),
        );
        assert_eq!(response.status, 200, "{response}");
        assert_eq!(
            response.json()["members"].as_array().unwrap().len(),
            members.len()
        );
    }

    /// What person `n` sends in thread `thread`: addressed to the bot (a mention, the
    /// command) when `addressed`, else a plain message in the thread.
    fn message_body(&self, user: u64, thread: u64, text: &str, addressed: bool) -> Vec<u8> {
        let seq = self.next();
        let user = self.user(user);
        let body = match self.platform {
            Platform::Slack => {
                let root = format!("{thread}.0001");
                let event = if addressed {
                    json!({"type": "app_mention", "user": user, "channel": "C1", "ts": root, "text": format!("<@UBOT> {text}")})
                } else {
                    json!({"type": "message", "channel_type": "channel", "user": user, "channel": "C1",
                        "ts": format!("{thread}.{seq:04}9"), "thread_ts": root, "text": text})
                };
                json!({"type": "event_callback", "team_id": SLACK_TEAM, "api_app_id": SLACK_APP, "event_id": format!("Ev{seq}"), "event": event})
            }
            Platform::Telegram => {
                let (text, entities) = if addressed {
                    (
                        format!("@wuhubot {text}"),
                        json!([{"type": "mention", "offset": 0, "length": 8}]),
                    )
                } else {
                    (text.to_string(), json!([]))
                };
                json!({"update_id": seq, "message": {"message_id": seq,
                    "from": {"id": user.parse::<i64>().unwrap(), "is_bot": false, "first_name": "P"},
                    "chat": {"id": -100_000 - thread as i64, "type": "supergroup"},
                    "text": text, "entities": entities}})
            }
            // Discord sends only the application command: every message is addressed.
            Platform::Discord => {
                json!({"id": format!("I{seq}"), "application_id": "app1", "type": 2,
                "token": format!("tok-{seq}"), "channel_id": format!("C{thread}"),
                "member": {"user": {"id": user}},
                "data": {"name": "wuhu", "type": 1, "options": [{"name": "text", "type": 3, "value": text}]}})
            }
            // A sender that names its messages (`id`): two with the same text in one second
            // are two.
            Platform::Generic => {
                json!({"thread": format!("t{thread}"), "user": user, "text": text, "id": format!("m{seq}")})
            }
        };
        body.to_string().into_bytes()
    }

    /// Person `n`'s message addressed to the bot in thread `thread`, which may be a thread's
    /// first (on Slack a mention inside the thread, not its root).
    fn mention_in_thread(&self, user: u64, thread: u64, text: &str) -> Vec<u8> {
        if self.platform != Platform::Slack {
            return self.message_body(user, thread, text, true);
        }
        let seq = self.next();
        json!({"type": "event_callback", "team_id": SLACK_TEAM, "api_app_id": SLACK_APP, "event_id": format!("Ev{seq}"),
            "event": {"type": "app_mention", "user": self.user(user), "channel": "C1",
                "ts": format!("{thread}.{seq:04}7"), "thread_ts": format!("{thread}.0001"),
                "text": format!("<@UBOT> {text}")}})
        .to_string()
        .into_bytes()
    }

    fn say(&self, user: u64, thread: u64, text: &str) -> Response {
        let response = self.post(&self.message_body(user, thread, text, true), Auth::Good);
        assert_eq!(response.status, 200, "{response}");
        response
    }

    /// A command (`stop`, `new`, `status`, `steer <text>`) in the platform's native form (on
    /// Slack the slash command `/wuhu <command>` in channel `C1`, which acts on its latest
    /// thread).
    fn command(&self, user: u64, thread: u64, command: &str) -> Response {
        let (name, text) = command.split_once(' ').unwrap_or((command, ""));
        let body = match self.platform {
            Platform::Slack => {
                let seq = self.next();
                let fields = [
                    ("token", "legacy-verification-token".to_string()),
                    ("team_id", SLACK_TEAM.into()),
                    ("team_domain", "acme".into()),
                    ("channel_id", "C1".into()),
                    ("channel_name", "general".into()),
                    ("user_id", self.user(user)),
                    ("user_name", format!("person{user}")),
                    ("command", "/wuhu".into()),
                    ("text", command.to_string()),
                    ("api_app_id", SLACK_APP.into()),
                    ("is_enterprise_install", "false".into()),
                    ("response_url", self.fake.slack_response_url(seq)),
                    ("trigger_id", format!("{seq}.738474920.8088930838d88f008e0")),
                ];
                fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", form_encode(v)))
                    .collect::<Vec<_>>()
                    .join("&")
                    .into_bytes()
            }
            Platform::Discord => {
                let seq = self.next();
                let options: Vec<Value> = if text.is_empty() {
                    vec![]
                } else {
                    vec![json!({"name": "text", "type": 3, "value": text})]
                };
                json!({"id": format!("I{seq}"), "application_id": "app1", "type": 2,
                    "token": format!("tok-{seq}"), "channel_id": format!("C{thread}"),
                    "member": {"user": {"id": self.user(user)}},
                    "data": {"name": "wuhu", "type": 1, "options": [{"name": name, "type": 1, "options": options}]}})
                .to_string()
                .into_bytes()
            }
            _ => self.message_body(user, thread, &format!("/{command}"), false),
        };
        let response = self.post(&body, Auth::Good);
        assert_eq!(response.status, 200, "{response}");
        response
    }

    /// The text of a command's or click's note: the hook's answer on Discord, else the
    /// posted message.
    fn note_text(&self, response: &Response, posts_before: usize) -> String {
        if self.platform == Platform::Discord {
            return response.json()["data"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        // A turn's reply may come first (a steer's turn can end before its note is queued):
        // the fake model's replies start with "echo:", notes never do.
        wait_for("the note", TURN, || {
            self.fake
                .posts()
                .into_iter()
                .skip(posts_before)
                .find(|p| p.method != "answerCallbackQuery" && !p.text().starts_with("echo:"))
                .map(|p| p.text().to_string())
        })
    }

    /// Person `n` clicks `value` (a button's value as the platform sent it).
    fn click(&self, user: u64, thread: u64, value: &str) -> Response {
        let seq = self.next();
        let user = self.user(user);
        let body = match self.platform {
            Platform::Slack => {
                let payload = json!({"type": "block_actions", "user": {"id": user},
                    "team": {"id": SLACK_TEAM}, "api_app_id": SLACK_APP,
                    "actions": [{"action_id": "wuhu_x", "value": value, "action_ts": format!("{seq}.1")}]});
                format!("payload={}", form_encode(&payload.to_string()))
            }
            Platform::Telegram => json!({"update_id": seq, "callback_query": {"id": format!("cb{seq}"),
                "from": {"id": user.parse::<i64>().unwrap()},
                "message": {"message_id": 1, "chat": {"id": -100_000 - thread as i64}}, "data": value}})
            .to_string(),
            Platform::Discord => json!({"id": format!("I{seq}"), "application_id": "app1", "type": 3,
                "token": format!("tok-{seq}"), "channel_id": format!("C{thread}"),
                "member": {"user": {"id": user}}, "data": {"custom_id": value, "component_type": 2}})
            .to_string(),
            Platform::Generic => {
                let (decision, id) = value.split_once(':').unwrap();
                json!({"thread": format!("t{thread}"), "user": user, "approval": {"id": id, "decision": decision}}).to_string()
            }
        };
        let response = self.post(body.as_bytes(), Auth::Good);
        assert_eq!(response.status, 200, "{response}");
        response
    }

    /// The button values of an approval request post, if it is one.
    fn buttons(&self, post: &ChatCall) -> Option<Vec<String>> {
        let values = |list: &Value, field: &str| -> Option<Vec<String>> {
            let values: Vec<String> = list
                .as_array()?
                .iter()
                .filter_map(|b| b[field].as_str().map(str::to_string))
                .collect();
            (!values.is_empty()).then_some(values)
        };
        match self.platform {
            Platform::Slack => values(&post.body["blocks"][1]["elements"], "value"),
            Platform::Telegram => values(
                &post.body["reply_markup"]["inline_keyboard"][0],
                "callback_data",
            ),
            Platform::Discord => values(&post.body["components"][0]["components"], "custom_id"),
            Platform::Generic => post.body["approval"]["id"].as_str().map(|id| {
                ["approve", "approve_session", "deny"]
                    .iter()
                    .map(|d| format!("{d}:{id}"))
                    .collect()
            }),
        }
    }

    fn sessions(&self) -> Vec<wuhu_core::wire::SessionInfo> {
        self.admin.list_sessions("").sessions
    }

    fn only_session(&self) -> String {
        let sessions = self.sessions();
        assert_eq!(sessions.len(), 1, "{:?}: {sessions:?}", self.platform);
        sessions[0].id.clone()
    }
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
    let body = json!({"platform": "slack", "name": "ops", "teamId": SLACK_TEAM, "apiAppId": SLACK_APP,
        "credentials": {"signingSecret": secret, "botToken": token}});
    assert_eq!(member.post("/v1/channels", &body).status, 403);
    assert_eq!(member.get("/v1/channels").status, 403);
    let members_path = format!("/v1/channels/{}/members", uuid_like());
    assert_eq!(member.get(&members_path).status, 403);
    let created = admin.post("/v1/channels", &body);
    assert_eq!(created.status, 201, "{created}");
    let view = created.json();
    let id = view["id"].as_str().unwrap().to_string();
    assert_eq!(view["platform"], "slack");
    // Who it lets in shows: mapped members only by default, the pinned workspace and app.
    assert_eq!(view["admit"], "mapped");
    assert_eq!(
        (&view["teamId"], &view["apiAppId"]),
        (&json!("T1"), &json!("A1"))
    );
    assert_eq!(view["guestQuota"]["sessionsPerHour"], 3, "{view}");
    assert!(view["refusal"].as_str().is_some_and(|r| !r.is_empty()));
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
    let found = wuhu_e2e::util::files_containing(
        stack.persist_dir(),
        &[secret.as_bytes(), token.as_bytes()],
    );
    assert!(found.is_empty(), "credentials stored in clear in {found:?}");
    // Bad input is a 400 that names the field.
    let bad = admin.post(
        "/v1/channels",
        &json!({"platform": "slack", "name": "x", "credentials": {"botToken": "x"}}),
    );
    assert_eq!(bad.expect_error(400).code, "bad_request");
    for (bad, why) in [
        (json!({}), "teamId"),
        (
            json!({"teamId": "T1", "apiAppId": "A1", "admit": "allowlist"}),
            "allowlist",
        ),
        (
            json!({"teamId": "T1", "apiAppId": "A1", "admit": "allowlist", "allowlist": ["C1"]}),
            "Slack team id",
        ),
    ] {
        // The same body without its pin, then these fields.
        let mut body = body.clone();
        body.as_object_mut().unwrap().remove("teamId");
        body.as_object_mut().unwrap().remove("apiAppId");
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let response = admin.post("/v1/channels", &body);
        assert_eq!(response.status, 400, "{response}");
        assert!(response.text().contains(why), "{response}");
    }
    assert_eq!(admin.send_raw("POST", "/v1/channels", "{nope").status, 400);
    // Patch, then another tenant's admin cannot see or touch it.
    let patched = admin.patch(
        &format!("/v1/channels/{id}"),
        &json!({"name": "ops2", "options": {"busyLane": "steer", "progress": true},
            "admit": "allowlist", "allowlist": ["T1", "T2"], "refusal": "Members only."}),
    );
    assert_eq!(patched.status, 200, "{patched}");
    assert_eq!(patched.json()["name"], "ops2");
    assert_eq!(patched.json()["admit"], "allowlist");
    assert_eq!(patched.json()["allowlist"], json!(["T1", "T2"]));
    assert_eq!(
        admin.get(&format!("/v1/channels/{id}")).json()["refusal"],
        "Members only."
    );
    assert_eq!(patched.json()["options"]["busyLane"], "steer");
    // Members: checked, bounded, replaced whole, cleared; another tenant cannot see them.
    let members = format!("/v1/channels/{id}/members");
    let put = |body: Value| {
        admin.send(
            admin
                .request("PUT", &members)
                .body(body.to_string().into_bytes()),
        )
    };
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"user": format!("U{i}"), "sub": format!("p{i}")}))
        .collect();
    for (bad, why) in [
        (
            json!({"members": [{"user": "U1", "sub": "slack:U2"}]}),
            "sub",
        ),
        (
            json!({"members": [{"user": "u-1", "sub": "alice"}]}),
            "user id",
        ),
        (json!({"members": many}), "at most 1000"),
    ] {
        let response = put(bad);
        assert_eq!(response.status, 400, "{response}");
        assert!(response.text().contains(why), "{response}");
    }
    assert_eq!(member.get(&members).status, 403);
    let stored =
        put(json!({"members": [{"user": "U2", "sub": "bob"}, {"user": "U1", "sub": "alice"}]}));
    assert_eq!(stored.status, 200, "{stored}");
    assert_eq!(
        admin.get(&members).json()["members"],
        json!([{"user": "U1", "sub": "alice"}, {"user": "U2", "sub": "bob"}])
    );
    let other = stack.admin_client("root", &unique_name("chan-other"));
    assert_eq!(other.get(&members).status, 404);
    let cleared = admin.send(admin.request("DELETE", &members));
    assert_eq!(cleared.status, 200, "{cleared}");
    assert_eq!(admin.get(&members).json()["members"], json!([]));
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

/// Two people in one thread: one session owned by the first, open to the tenant, the group
/// reminder once, the second person's message prefixed, replies posted where they belong; a
/// new thread is a new session. On every platform.
#[test]
fn a_thread_with_two_people_is_one_group_session() {
    let stack = stack();
    let _guard = stack.guard();
    for platform in PLATFORMS {
        let world = World::new(platform, "chan-thread");
        if platform == Platform::Slack {
            let challenge = world.post(
                json!({"type": "url_verification", "challenge": "3eZbrw1aB"})
                    .to_string()
                    .as_bytes(),
                Auth::Good,
            );
            assert_eq!(challenge.json()["challenge"], "3eZbrw1aB", "{challenge}");
        }
        if platform == Platform::Discord {
            let ping = world.post(
                br#"{"type":1,"id":"p","application_id":"app1"}"#,
                Auth::Good,
            );
            assert_eq!(ping.json(), json!({"type": 1}), "{ping}");
        }
        if matches!(platform, Platform::Slack | Platform::Telegram) {
            // A plain message in a thread nobody addressed the bot in starts nothing.
            let plain = world.post(
                &world.message_body(9, 4, "not for the bot", false),
                Auth::Good,
            );
            assert_eq!(plain.status, 200, "{plain}");
            assert!(world.sessions().is_empty(), "{platform:?}");
        }
        let first = world.say(1, 10, "hello");
        if platform == Platform::Discord {
            // Deferred: "thinking…" until the reply edits it.
            assert_eq!(first.json(), json!({"type": 5}), "{first}");
        }
        let session = world.only_session();
        let posts = world.fake.wait_for_posts(1, TURN);
        let second = world.post(&world.message_body(2, 10, "me too", false), Auth::Good);
        assert_eq!(second.status, 200, "{second}");
        let posts = world.fake.wait_for_posts(posts.len() + 1, TURN);
        let sessions = world.sessions();
        assert_eq!(sessions.len(), 1, "{platform:?}: {sessions:?}");
        assert_eq!(sessions[0].owner, world.identity(1));
        assert_eq!(sessions[0].access, wuhu_core::authority::Access::Tenant);
        assert_eq!(
            user_messages(&world.admin, &session),
            vec![
                (world.identity(1), "hello".into()),
                (world.identity(2), "me too".into())
            ],
            "{platform:?}"
        );
        let reminders = world
            .admin
            .transcript(&session)
            .iter()
            .filter(|e| matches!(&e.payload, EntryPayload::Message { message: Message::CustomMessage { custom_type, .. } } if custom_type == custom_types::GROUP_CHAT_REMINDER))
            .count();
        assert_eq!(reminders, 1, "{platform:?}");
        // The fake model echoes what it was sent: the second reply shows the prefix.
        let texts: Vec<&str> = posts.iter().map(ChatCall::text).collect();
        assert_eq!(
            texts,
            vec![
                "echo: hello".to_string(),
                format!("echo: [{}]:\n\nme too", world.identity(2))
            ],
            "{platform:?}"
        );
        for post in &posts {
            let place = match platform {
                Platform::Slack => format!("{} {}", post.body["channel"], post.body["thread_ts"]),
                Platform::Telegram => post.body["chat_id"].to_string(),
                Platform::Discord => post.method.clone(),
                Platform::Generic => post.body["thread"].to_string(),
            };
            let want = match platform {
                Platform::Slack => "\"C1\" \"10.0001\"".to_string(),
                Platform::Telegram => "-100010".to_string(),
                Platform::Discord => "PATCH webhooks/app1/tok-".to_string(),
                Platform::Generic => "\"t10\"".to_string(),
            };
            assert!(place.starts_with(&want), "{platform:?}: {place} {post:?}");
            if platform == Platform::Telegram {
                assert_eq!(post.body["parse_mode"], "HTML");
            }
            if platform != Platform::Generic {
                assert_eq!(
                    post.token.as_deref(),
                    match platform {
                        Platform::Discord => None, // the interaction token authorizes
                        _ => Some(BOT_TOKEN),
                    },
                    "{platform:?}"
                );
            } else {
                assert_eq!(post.token.as_deref(), Some("signed"));
            }
        }
        // Another thread: another session.
        world.say(2, 20, "new topic");
        world.fake.wait_for_posts(3, TURN);
        assert_eq!(world.sessions().len(), 2, "{platform:?}");
    }
}

/// Bad or missing signatures, stale timestamps, unknown bindings and the wrong platform are
/// 401 and enqueue nothing; a delivery replayed or retried is enqueued and answered once.
#[test]
fn bad_signatures_are_refused_and_replays_are_enqueued_once() {
    let stack = stack();
    let _guard = stack.guard();
    for platform in PLATFORMS {
        let world = World::new(platform, "chan-verify");
        let body = world.message_body(1, 30, "once", true);
        let mut refused: Vec<(&str, Response)> = vec![
            ("another secret", world.post(&body, Auth::WrongSecret)),
            ("missing signature", world.post(&body, Auth::Missing)),
        ];
        if platform != Platform::Telegram {
            // Telegram's secret token has no timestamp.
            refused.push(("stale timestamp", world.post(&body, Auth::Stale)));
        }
        refused.push((
            "unknown binding",
            world.post_at(platform, &uuid_like(), &body, Auth::Good),
        ));
        let other = if platform == Platform::Slack {
            Platform::Generic
        } else {
            Platform::Slack
        };
        refused.push((
            "wrong platform",
            world.post_at(other, &world.id, &body, Auth::Good),
        ));
        for (what, response) in &refused {
            assert_eq!(response.status, 401, "{platform:?} {what}: {response}");
            assert_eq!(
                response.json()["error"]["code"],
                "unauthorized",
                "{platform:?} {what}"
            );
        }
        assert!(
            world.sessions().is_empty(),
            "{platform:?}: a refused hook created a session"
        );
        // The same delivery four times (Slack marks its retries; a generic sender re-signs
        // with a new timestamp but the same id), plus Slack's twin `message` event.
        // An exact replay carries the same signature: signed once here.
        let signed_once = world.signature_headers(&body);
        let mut deliveries: Vec<Delivery> = (0..4)
            .map(|i| {
                let mut headers = match platform {
                    // Slack signs each retry anew and marks it.
                    Platform::Slack => world.signature_headers(&body),
                    _ => signed_once.clone(),
                };
                if platform == Platform::Slack && i > 0 {
                    headers.push(("X-Slack-Retry-Num", i.to_string()));
                    headers.push(("X-Slack-Retry-Reason", "http_timeout".to_string()));
                }
                (body.clone(), headers)
            })
            .collect();
        match platform {
            Platform::Slack => {
                let twin = json!({"type": "event_callback", "team_id": SLACK_TEAM, "api_app_id": SLACK_APP, "event_id": "EvTwin", "event": {"type": "message",
                    "channel_type": "channel", "user": "U1", "channel": "C1", "ts": "30.0001", "text": "<@UBOT> once"}})
                .to_string()
                .into_bytes();
                let headers = world.signature_headers(&twin);
                deliveries.push((twin, headers));
            }
            Platform::Generic => {
                let with_id =
                    json!({"thread": "t31", "user": "person1", "text": "twice?", "id": "m-1"})
                        .to_string()
                        .into_bytes();
                let headers = world.signature_headers(&with_id);
                deliveries.push((with_id.clone(), headers));
                // Signed again a second later: another signature, the same id.
                std::thread::sleep(Duration::from_millis(1100));
                let headers = world.signature_headers(&with_id);
                deliveries.push((with_id, headers));
            }
            _ => {}
        }
        for (i, (body, headers)) in deliveries.iter().enumerate() {
            let mut request = Request::new(
                "POST",
                format!("{}/hooks/{}/{}", world.base, platform.as_str(), world.id),
            );
            for (name, value) in headers {
                request = request.header(name, value.clone());
            }
            let response = request.body(body.clone()).send().unwrap();
            assert_eq!(
                response.status, 200,
                "{platform:?} delivery {i}: {response}"
            );
        }
        let expected_sessions = if platform == Platform::Generic { 2 } else { 1 };
        world.fake.wait_for_posts(expected_sessions, TURN);
        let sessions = world.sessions();
        assert_eq!(sessions.len(), expected_sessions, "{platform:?}");
        for session in &sessions {
            world.admin.wait_idle(&session.id, TURN);
            assert_eq!(
                user_messages(&world.admin, &session.id).len(),
                1,
                "{platform:?}"
            );
        }
        // Give a wrong second reply time to show up: the sessions are idle and were watched
        // once.
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            world.fake.posts().len(),
            expected_sessions,
            "{platform:?}: {:?}",
            world.fake.posts()
        );
    }
}

impl World {
    /// The signature headers of `body` signed now.
    fn signature_headers(&self, body: &[u8]) -> Vec<(&'static str, String)> {
        let ts = unix_now();
        match self.platform {
            Platform::Slack => vec![
                ("X-Slack-Request-Timestamp", ts.to_string()),
                ("X-Slack-Signature", slack_signature(&self.secret, ts, body)),
                ("Content-Type", "application/json".into()),
            ],
            Platform::Telegram => vec![("X-Telegram-Bot-Api-Secret-Token", self.secret.clone())],
            Platform::Discord => vec![
                ("X-Signature-Timestamp", ts.to_string()),
                (
                    "X-Signature-Ed25519",
                    discord_signature(self.discord_key.as_ref().unwrap(), ts, body),
                ),
            ],
            Platform::Generic => vec![
                ("X-Wuhu-Timestamp", ts.to_string()),
                (
                    "X-Wuhu-Signature",
                    generic_signature(&self.secret, ts, body),
                ),
            ],
        }
    }
}

/// A hook body and the headers it is sent with.
type Delivery = (Vec<u8>, Vec<(&'static str, String)>);

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

/// A platform answering 429 + Retry-After twice: the reply is posted once, after the waits.
#[test]
fn a_rate_limited_reply_is_posted_once_after_retry_after() {
    let stack = stack();
    let _guard = stack.guard();
    for platform in PLATFORMS {
        let world = World::new(platform, "chan-429");
        world
            .fake
            .fail_next(vec![FakeChat::rate_limited(1), FakeChat::rate_limited(1)]);
        world.say(1, 40, "are you there");
        let posts = world.fake.wait_for_posts(1, TURN);
        let calls = world.fake.calls();
        assert_eq!(
            calls.len(),
            3,
            "{platform:?}: two 429s, then the post: {calls:?}"
        );
        assert_eq!(posts[0].text(), "echo: are you there");
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(world.fake.posts().len(), 1, "{platform:?}");
        let session = world.only_session();
        assert_eq!(
            world.admin.wait_idle(&session, TURN).session.status,
            Status::Idle
        );
    }
}

/// The platform took the post but its answer was lost (the connection closed instead): the
/// reply is in the thread once. Slack: the retry finds the first post by its `metadata`
/// (`conversations.replies`) and posts nothing; Discord: the retry carries the same `nonce`
/// with `enforce_nonce`, and Discord returns the message it has (here the reply goes to the
/// channel: the interaction's token is refused). Telegram has no way to tell: the reply shows
/// twice (docs/channels.md, "Delivery"); this test holds it to that known limit.
#[test]
fn a_post_whose_answer_was_lost_is_in_the_thread_once() {
    let stack = stack();
    let _guard = stack.guard();
    for platform in [Platform::Slack, Platform::Discord, Platform::Telegram] {
        let world = World::new(platform, "chan-lost");
        if platform == Platform::Discord {
            world.fake.expire_interactions();
        }
        world.fake.drop_answers(1);
        world.say(1, 41, "did you get it");
        let posts = world
            .fake
            .wait_for_text("the reply", TURN, |t| t == "echo: did you get it");
        let session = world.only_session();
        world.admin.wait_idle(&session, TURN);
        let calls = world.fake.calls();
        // The retry happens: a second try of the reply, or (Slack) the lookup before it.
        let tries = |calls: &[ChatCall]| {
            calls
                .iter()
                .filter(|c| {
                    c.text() == "echo: did you get it" || c.method == "conversations.replies"
                })
                .count()
        };
        let calls = if tries(&calls) < 2 {
            wait_for("the retry after the lost answer", TURN, || {
                let calls = world.fake.calls();
                (tries(&calls) >= 2).then_some(calls)
            })
        } else {
            calls
        };
        assert!(calls[0..].iter().any(|c| c.answer_dropped), "{calls:?}");
        std::thread::sleep(Duration::from_millis(1500));
        let posts_now = world.fake.posts();
        let replies: Vec<&ChatCall> = posts_now
            .iter()
            .filter(|p| p.text() == "echo: did you get it")
            .collect();
        let want = if platform == Platform::Telegram { 2 } else { 1 };
        assert_eq!(replies.len(), want, "{platform:?}: {posts:?} {calls:?}");
        if platform == Platform::Slack {
            let calls = world.fake.calls();
            let methods: Vec<&str> = calls.iter().map(|c| c.method.as_str()).collect();
            assert_eq!(
                methods,
                vec!["chat.postMessage", "conversations.replies"],
                "the lookup found it: nothing posted again"
            );
        }
    }
}

/// A message the platform refuses for good is given up visibly: a
/// `wuhu_channel_undelivered_v1` notice in the session's transcript (and a log line).
#[test]
fn a_reply_given_up_leaves_a_notice_in_the_session() {
    use wuhu_e2e::fake_http::HttpReply;
    let stack = stack();
    let _guard = stack.guard();
    let world = World::new(Platform::Slack, "chan-giveup");
    world.fake.fail_next(vec![HttpReply::json(
        &json!({"ok": false, "error": "channel_not_found"}),
    )]);
    world.say(1, 42, "into the void");
    let session = world.only_session();
    let notice = wait_for("the notice", TURN, || {
        world
            .admin
            .transcript(&session)
            .into_iter()
            .find_map(|e| match e.payload {
                EntryPayload::Custom { custom_type, data }
                    if custom_type == "wuhu_channel_undelivered_v1" =>
                {
                    Some(data)
                }
                _ => None,
            })
    });
    assert_eq!(notice["channel"], world.id.as_str(), "{notice}");
    assert!(
        notice["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("channel_not_found"),
        "{notice}"
    );
    assert!(
        notice["key"]
            .as_str()
            .unwrap_or_default()
            .starts_with("reply:"),
        "{notice}"
    );
    assert!(world.fake.posts().is_empty());
}

/// An approval request becomes buttons; a click from someone in the thread who may not answer
/// is refused (and said so), the owner's click lets the turn go on. On every platform, one
/// runner and environment for all of them.
#[test]
fn approval_buttons_count_only_from_the_approver() {
    use wuhu_core::wire::runner::RunnerKind;
    use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("chan-approve");
    let admin = stack.admin_client("root", &tenant);
    let dir = TempDir::new("wuhu-e2e-chan-approve");
    let guarded = dir.mkdir("guarded");
    let _cloud = Runner::start(
        RunnerConfig::new(stack, "ops", &tenant, "cloud-1")
            .kind(RunnerKind::Cloud)
            .token(stack.cloud_runner_token("ops", &tenant))
            .env("guarded", &guarded)
            .workspaces_root(dir.mkdir("workspaces")),
    );
    let defined = admin.post(
        "/v1/environments",
        &json!({"name": "guarded", "kind": "local", "runner": "cloud-1", "path": guarded, "approval": "ask"}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let directive = json!({"toolCalls": [{"name": "request_environment", "arguments": {"spec": "guarded"}}], "afterTools": "attached it"});
    for platform in PLATFORMS {
        let world = World::in_tenant(platform, admin.clone(), json!({}));
        // Person 1 is mapped to a Wuhu person: their message, their session and their click
        // are that person's. Person 2 is not mapped and stays `<platform>:<id>`.
        world.map_member(1, &format!("pat-{}", platform.as_str()));
        // Person 1 starts the thread (and owns the session) with a turn that attaches
        // `guarded`, which asks.
        world.say(1, 50, &format!("@fake {directive}"));
        let posts = world.fake.wait_for_posts(1, TURN);
        let session = world
            .sessions()
            .into_iter()
            .find(|s| s.owner == world.identity(1))
            .expect("the thread's session")
            .id;
        assert_eq!(world.identity(1), format!("pat-{}", platform.as_str()));
        assert_eq!(
            user_messages(&world.admin, &session)[0].0,
            world.identity(1),
            "{platform:?}: the mapped person authors their message"
        );
        let buttons = world
            .buttons(&posts[0])
            .unwrap_or_else(|| panic!("{platform:?}: no buttons in {:?}", posts[0]));
        // The card speaks to people (who asks to do what, where), not with the model's API
        // instructions.
        // (Telegram's is HTML: its quotes are entities.)
        let card = posts[0].text().replace("&quot;", "\"");
        assert!(
            card.contains(&format!(
                "{} asks to attach environment \"guarded\" on ",
                world.identity(1)
            )) && !card.contains("Answer with POST"),
            "{platform:?}: {card}"
        );
        let value = |decision: &str| {
            buttons
                .iter()
                .find(|v| v.starts_with(&format!("{decision}:")))
                .unwrap_or_else(|| panic!("no {decision} button in {buttons:?}"))
                .clone()
        };
        // Person 2 (in the thread, not the owner) clicks Approve: refused, still waiting.
        let before = world.fake.posts().len();
        let refused = world.click(2, 50, &value("approve"));
        if platform != Platform::Discord {
            assert_eq!(refused.json()["ok"], false, "{platform:?}: {refused}");
        }
        let note = world.note_text(&refused, before);
        assert!(
            note.contains(&format!("{} could not answer", world.identity(2))),
            "{platform:?}: {note}"
        );
        if platform == Platform::Telegram {
            let acks: Vec<ChatCall> = wait_for("answerCallbackQuery", TURN, || {
                let acks: Vec<ChatCall> = world
                    .fake
                    .posts()
                    .into_iter()
                    .filter(|p| p.method == "answerCallbackQuery")
                    .collect();
                (!acks.is_empty()).then_some(acks)
            });
            assert!(acks[0].text().contains("could not answer"), "{acks:?}");
        }
        assert_eq!(
            world.admin.session(&session).session.status,
            Status::Running,
            "{platform:?}"
        );
        // The owner approves: the turn goes on and its answer arrives.
        let before = world.fake.posts().len();
        let accepted = world.click(1, 50, &value("approve"));
        let note = world.note_text(&accepted, before);
        assert!(
            note.contains(&format!("{} answered: approve", world.identity(1))),
            "{platform:?}: {note}"
        );
        world
            .fake
            .wait_for_text("the reply after the approval", TURN, |t| t == "attached it");
        assert_eq!(
            world.admin.wait_idle(&session, TURN).session.status,
            Status::Idle,
            "{platform:?}"
        );
    }
}

/// Native commands (Slack `/wuhu status`, Telegram `/status`, Discord `/wuhu status`, generic
/// `/status` text): status, steer, stop and new, each answered with a note, acting as the
/// person (mapped to a Wuhu `sub` here). Slack's slash command is acknowledged at once with an
/// empty body and answered through its `response_url`.
#[test]
fn native_commands_status_steer_stop_and_new() {
    let stack = stack();
    let _guard = stack.guard();
    for platform in PLATFORMS {
        let world = World::new(platform, "chan-cmd");
        world.map_member(1, &format!("sam-{}", platform.as_str()));
        let note_from = |person: u64, command: &str| {
            let before = world.fake.posts().len();
            let started = std::time::Instant::now();
            let response = world.command(person, 60, command);
            if platform == Platform::Slack {
                assert!(
                    started.elapsed() < Duration::from_secs(3),
                    "Slack's 3 s: {:?}",
                    started.elapsed()
                );
                assert!(response.body.is_empty(), "{response}");
                let answer = wait_for("the response_url answer", TURN, || {
                    world
                        .fake
                        .posts()
                        .into_iter()
                        .skip(before)
                        .find(|p| p.method == SLACK_RESPONSE_URL)
                });
                assert_eq!(
                    answer.token, None,
                    "the bot token never goes to a response_url"
                );
                let shared = ["steer", "stop", "new"]
                    .iter()
                    .any(|c| command.starts_with(c))
                    && !answer.text().contains("No session")
                    && !answer.text().contains("could not");
                assert_eq!(
                    answer.body["response_type"],
                    if shared { "in_channel" } else { "ephemeral" },
                    "{command}: {answer:?}"
                );
            }
            world.note_text(&response, before)
        };
        let note = |command: &str| note_from(1, command);
        assert!(note("status").contains("No session"), "{platform:?}");
        // The same command again at once (the same text within the second): answered again.
        assert!(note("status").contains("No session"), "{platform:?}");
        world.say(1, 60, "hello");
        world
            .fake
            .wait_for_text("the first reply", TURN, |t| t == "echo: hello");
        let session = world.only_session();
        world.admin.wait_idle(&session, TURN);
        let status = note("status");
        assert_eq!(status, format!("Session {session}: idle."), "{platform:?}");
        let steered = note("steer go left");
        assert!(steered.contains("steered"), "{platform:?}: {steered}");
        let posts = world
            .fake
            .wait_for_text("the steered turn's reply", TURN, |t| t.ends_with("go left"));
        if platform == Platform::Slack {
            // Steered from the channel, answered in the thread.
            let reply = posts
                .iter()
                .find(|p| p.text().ends_with("go left"))
                .unwrap();
            assert_eq!(reply.body["thread_ts"], "60.0001", "{reply:?}");
        }
        // Someone else in the thread may steer (a prompt) but not stop: only the session's
        // managers may (docs/security.md).
        let refused = note_from(2, "stop");
        assert!(
            refused.starts_with(&format!("{} could not stop", world.identity(2))),
            "{platform:?}: {refused}"
        );
        let stopped = note("stop");
        assert_eq!(
            stopped,
            format!("{} stopped the turn.", world.identity(1)),
            "{platform:?}"
        );
        assert!(note("new").contains("new session"), "{platform:?}");
        // Addressed again in the same thread (on Slack a mention inside it): a new session.
        let again = world.post(&world.mention_in_thread(1, 60, "again"), Auth::Good);
        assert_eq!(again.status, 200, "{again}");
        world
            .fake
            .wait_for_text("the new session's reply", TURN, |t| t == "echo: again");
        assert_eq!(world.sessions().len(), 2, "{platform:?}");
    }
}

/// Two people's first messages in a new thread arriving at the same moment make one session
/// holding both, however the hooks interleave: many tries, on every platform.
#[test]
fn first_messages_arriving_together_make_one_session() {
    const TRIES: u64 = 8;
    let stack = stack();
    let _guard = stack.guard();
    for platform in PLATFORMS {
        let world = World::new(platform, "chan-race");
        for thread in 100..100 + TRIES {
            let bodies = [
                world.mention_in_thread(1, thread, "one"),
                world.mention_in_thread(2, thread, "two"),
            ];
            let barrier = std::sync::Barrier::new(bodies.len());
            std::thread::scope(|scope| {
                let posting: Vec<_> = bodies
                    .iter()
                    .map(|body| {
                        scope.spawn(|| {
                            barrier.wait();
                            world.post(body, Auth::Good)
                        })
                    })
                    .collect();
                for post in posting {
                    let response = post.join().expect("a hook request");
                    assert_eq!(response.status, 200, "{platform:?}: {response}");
                }
            });
        }
        let sessions = world.sessions();
        assert_eq!(
            sessions.len(),
            TRIES as usize,
            "{platform:?}: one session per thread: {sessions:?}"
        );
        for session in &sessions {
            world.admin.wait_idle(&session.id, TURN);
            let mut texts: Vec<String> = user_messages(&world.admin, &session.id)
                .into_iter()
                .map(|(_, content)| content)
                .collect();
            texts.sort();
            assert_eq!(texts, vec!["one", "two"], "{platform:?} {}", session.id);
        }
    }
}

/// Discord takes an interaction's token for 15 minutes: an answer it refuses for its token (a
/// turn that took longer) is posted in the channel instead, once.
#[test]
fn a_discord_answer_after_its_token_expired_goes_to_the_channel() {
    let stack = stack();
    let _guard = stack.guard();
    let world = World::new(Platform::Discord, "chan-expired");
    world.fake.expire_interactions();
    let deferred = world.say(1, 90, "late answer");
    assert_eq!(deferred.json(), json!({"type": 5}), "{deferred}");
    let posts = world
        .fake
        .wait_for_text("the reply", TURN, |t| t == "echo: late answer");
    let session = world.only_session();
    world.admin.wait_idle(&session, TURN);
    std::thread::sleep(Duration::from_millis(1500));
    let calls: Vec<String> = world
        .fake
        .calls()
        .iter()
        .map(|c| c.method.clone())
        .collect();
    assert_eq!(
        calls,
        vec![
            "PATCH webhooks/app1/tok-1/messages/@original",
            "POST channels/C90/messages"
        ],
        "{posts:?}"
    );
    assert_eq!(world.fake.posts()[0].token.as_deref(), Some(BOT_TOKEN));
}

/// With `progress` on, a turn with tool calls shows one progress message, edited when the
/// turn ends (on Discord the deferred response, which the reply replaces); the reply follows.
#[test]
fn progress_is_one_message_edited_while_the_turn_runs() {
    let stack = stack();
    let _guard = stack.guard();
    let directive = json!({"toolCalls": [{"name": "no_such_tool_a"}, {"name": "no_such_tool_b"}],
        "afterTools": "finished", "delayMs": 300});
    for platform in PLATFORMS {
        let tenant = unique_name("chan-progress");
        let world = World::in_tenant(
            platform,
            stack.admin_client("root", &tenant),
            json!({"progress": true}),
        );
        world.say(1, 70, &format!("@fake {directive}"));
        let posts = world
            .fake
            .wait_for_text("the reply", TURN, |t| t == "finished");
        let session = world.only_session();
        world.admin.wait_idle(&session, TURN);
        std::thread::sleep(Duration::from_millis(1500));
        let posts_now = world.fake.posts();
        assert_eq!(posts_now.len(), posts.len(), "{platform:?}: {posts_now:?}");
        let texts: Vec<&str> = posts.iter().map(ChatCall::text).collect();
        let working = "Working… 2 tool call(s), latest: no_such_tool_b";
        if platform == Platform::Discord {
            assert_eq!(texts, vec![working, "finished"], "{posts:?}");
            assert!(
                posts
                    .iter()
                    .all(|p| p.method.starts_with("PATCH webhooks/app1/tok-")),
                "{posts:?}"
            );
            continue;
        }
        assert_eq!(
            texts,
            vec![working, "Done: 2 tool call(s).", "finished"],
            "{platform:?}: {posts:?}"
        );
        let flags: Vec<bool> = posts.iter().map(ChatCall::is_edit).collect();
        assert_eq!(flags, vec![false, true, false], "{platform:?}: {posts:?}");
        // The edit names the progress message.
        let edited = match platform {
            Platform::Slack => posts[1].body["ts"].as_str().map(str::to_string),
            Platform::Telegram => Some(posts[1].body["message_id"].to_string()),
            _ => posts[1].body["replaces"].as_str().map(str::to_string),
        };
        assert_eq!(edited, posts[0].ts, "{platform:?}: {posts:?}");
    }
}

/// Wrangler killed after the turn ended and before its reply could be posted (the platform
/// answered 429 with a long Retry-After): after the restart the reply is posted, once. Own
/// stack: it is killed.
#[test]
fn a_reply_pending_at_a_crash_is_posted_once_after_restart() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let tenant = unique_name("chan-crash");
    let admin = stack.admin_client("root", &tenant);
    let worlds: Vec<World> = PLATFORMS
        .iter()
        .map(|platform| World::on_stack(&stack, *platform, admin.clone(), json!({})))
        .collect();
    for world in &worlds {
        world.fake.fail_next(vec![FakeChat::rate_limited(4)]);
        world.say(1, 80, "survive this");
    }
    for world in &worlds {
        wait_for("the refused first try", TURN, || {
            (!world.fake.calls().is_empty()).then_some(())
        });
    }
    stack.restart_killed();
    for world in &worlds {
        let posts = world
            .fake
            .wait_for_text("the reply after the restart", TURN, |t| {
                t == "echo: survive this"
            });
        assert_eq!(posts.len(), 1, "{:?}: {posts:?}", world.platform);
    }
    std::thread::sleep(Duration::from_millis(1500));
    for world in &worlds {
        assert_eq!(world.fake.posts().len(), 1, "{:?}", world.platform);
        assert_eq!(world.fake.calls().len(), 2, "{:?}", world.platform);
    }
}

/// Wrangler killed right after hooks answered 200 (first messages of new threads, so sessions
/// are created), at several moments: every acknowledged message reaches its session and its
/// reply is posted after the restart, once (Telegram: at most twice, its documented limit
/// should the kill fall inside the post). Own stack: it is killed.
#[test]
fn messages_acknowledged_before_a_crash_are_answered_after_restart() {
    // Hooks answer before their message reaches the session (as a slow session creation
    // would make them): the kill falls into the delivery after the answer.
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_CHANNEL_HOOK_WAIT_MS".into(), "0".into())],
        ..StackOptions::default()
    });
    let tenant = unique_name("chan-ack-crash");
    let admin = stack.admin_client("root", &tenant);
    let mut worlds: Vec<World> = PLATFORMS
        .iter()
        .map(|platform| World::on_stack(&stack, *platform, admin.clone(), json!({})))
        .collect();
    // The kill's distance from the last 200 (the point under test, not a synchronisation).
    let kill_after_ms = [0u64, 40, 250];
    for (round, delay) in kill_after_ms.iter().enumerate() {
        for world in &worlds {
            let response = world.say(1, 300 + round as u64, &format!("round {round}"));
            assert_eq!(response.status, 200, "{:?}: {response}", world.platform);
            // Answered before the delivery (Discord's answer is the deferred one either way).
            let accepted = match world.platform {
                Platform::Discord => json!({"type": 5}),
                _ => json!({"ok": true, "accepted": true}),
            };
            assert_eq!(response.json(), accepted, "{:?}", world.platform);
        }
        std::thread::sleep(Duration::from_millis(*delay));
        stack.restart_killed();
        // A restarted wrangler listens on another port.
        for world in &mut worlds {
            world.base = stack.base_url();
            world.admin = stack.admin_client("root", &tenant);
        }
        for world in &worlds {
            let reply = format!("echo: round {round}");
            world
                .fake
                .wait_for_text("the reply after the restart", TURN, |t| t == reply);
        }
    }
    // One tenant for all platforms: a session per platform and round, each message once.
    let admin = &worlds[0].admin;
    let sessions = worlds[0].sessions();
    assert_eq!(sessions.len(), PLATFORMS.len() * kill_after_ms.len());
    for session in &sessions {
        admin.wait_idle(&session.id, TURN);
        let texts: Vec<String> = user_messages(admin, &session.id)
            .into_iter()
            .map(|(_, content)| content)
            .collect();
        // Nothing acknowledged is lost, nothing queued twice: a kill after the session took the
        // message and before the binding removed its inbox row sends it again, and the session
        // knows it by its item key.
        assert_eq!(
            texts.len(),
            1,
            "{:?}: enqueued exactly once: {texts:?}",
            session.title
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    for world in &worlds {
        for round in 0..kill_after_ms.len() {
            let reply = format!("echo: round {round}");
            let n = world
                .fake
                .posts()
                .iter()
                .filter(|p| p.text() == reply)
                .count();
            let most = if world.platform == Platform::Telegram {
                2
            } else {
                1
            };
            assert!(
                (1..=most).contains(&n),
                "{:?} round {round}: posted {n} times",
                world.platform
            );
        }
    }
}

/// A thread's session starts with the global context of whom its first message acts for
/// (issue 35): a mapped member's own `users/<sub>/context.md`, a guest's the binding's
/// `channels/<id>/context.md`.
#[test]
fn a_threads_session_starts_with_its_authors_global_context() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("chan-context");
    let world = World::in_tenant(
        Platform::Generic,
        stack.admin_client("root", &tenant),
        json!({}),
    );
    let admin = &world.admin;
    let tenant_text = "Guests of this channel: answer about the public API only.\n";
    admin
        .put_doc(&format!("channels/{}/context.md", world.id), tenant_text)
        .expect_status(200);
    world.map_member(2, "ana");
    let ana_text = "Ana is on call this week.\n";
    let ana = stack.client("ana", &tenant);
    ana.put_doc("users/ana/context.md", ana_text)
        .expect_status(200);

    let context_of = |session: &str| {
        let transcript = world.admin.transcript(session);
        wuhu_e2e::entries::custom_message_content(&transcript, custom_types::GLOBAL_CONTEXT)
            .unwrap_or_default()
            .to_string()
    };
    world.say(1, 30, "hello from a guest");
    world.fake.wait_for_posts(1, TURN);
    let guest_session = world.only_session();
    assert!(
        context_of(&guest_session).contains(tenant_text),
        "guest thread"
    );

    world.say(2, 40, "hello from ana");
    world.fake.wait_for_posts(2, TURN);
    let sessions = world.sessions();
    let ana_session = sessions
        .iter()
        .find(|s| s.id != guest_session)
        .expect("ana's thread");
    assert_eq!(ana_session.owner, "ana");
    let context = context_of(&ana_session.id);
    assert!(
        context.contains(ana_text) && !context.contains(tenant_text),
        "{context}"
    );
}
