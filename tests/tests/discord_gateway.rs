//! Discord mentions, direct messages and plain messages over the Gateway, end to end: the real
//! Worker under `wrangler dev` holds the binding's Gateway connection to a fake Gateway
//! (`wuhu_e2e::fake_gateway`, real v10 JSON frames) named by the fake Discord API's
//! `GET /gateway/bot`; replies go out through the fake's create message.
//!
//! Messages on one connection are handled in order, so a message pushed after another has
//! been answered tells the test the earlier ones were seen: no test sleeps for a fixed time.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{EntryPayload, Message, custom_types};
use wuhu_e2e::fake_chat::{ChatCall, FakeChat, discord_keys};
use wuhu_e2e::fake_gateway::{FakeGateway, INTENTS};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(30);
const BOT_TOKEN: &str = "bot-gateway-token-0123456789";
const BOT_ID: &str = "80001";

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// A tenant with a Discord binding whose API and Gateway are fakes.
struct Bot {
    admin: Api,
    id: String,
    fake: FakeChat,
    gateway: FakeGateway,
}

impl Bot {
    /// The binding is created after `prepare` set the gateway up.
    fn new(prefix: &str, heartbeat_ms: u64, prepare: impl FnOnce(&FakeGateway)) -> Bot {
        let admin = stack().admin_client("root", &unique_name(prefix));
        Bot::with_admin(admin, heartbeat_ms, prepare)
    }

    /// A binding of `admin`'s tenant (on any stack) that admits anyone as a guest (who is let
    /// in has its own test: `strangers_and_unlisted_guilds_start_nothing`).
    fn with_admin(admin: Api, heartbeat_ms: u64, prepare: impl FnOnce(&FakeGateway)) -> Bot {
        Bot::with_fields(admin, heartbeat_ms, prepare, json!({"admit": "anyone"}))
    }

    /// A binding whose create body has `fields` too.
    fn with_fields(
        admin: Api,
        heartbeat_ms: u64,
        prepare: impl FnOnce(&FakeGateway),
        fields: Value,
    ) -> Bot {
        let fake = FakeChat::discord(BOT_TOKEN);
        let gateway = FakeGateway::start(BOT_TOKEN, BOT_ID, heartbeat_ms);
        prepare(&gateway);
        fake.set_gateway(&gateway.url());
        let (_, public_key) = discord_keys();
        let mut body = json!({"platform": "discord", "name": "team", "apiBaseUrl": fake.api_base_url(),
            "credentials": {"applicationId": "app1", "publicKey": public_key, "botToken": BOT_TOKEN}});
        for (field, value) in fields.as_object().unwrap() {
            body[field] = value.clone();
        }
        let response = admin.post("/v1/channels", &body);
        assert_eq!(response.status, 201, "{response}");
        let id = response.json()["id"].as_str().unwrap().to_string();
        Bot {
            admin,
            id,
            fake,
            gateway,
        }
    }

    /// `GET /v1/channels/:id`'s `gateway`.
    fn status(&self) -> Value {
        let response = self.admin.get(&format!("/v1/channels/{}", self.id));
        assert_eq!(response.status, 200, "{response}");
        response.json()["gateway"].clone()
    }

    #[track_caller]
    fn wait_state(&self, state: &str) -> Value {
        wait_for(&format!("gateway state {state}"), TURN, || {
            let status = self.status();
            (status["state"] == state).then_some(status)
        })
    }

    fn sessions(&self) -> Vec<wuhu_core::wire::SessionInfo> {
        self.admin.list_sessions("").sessions
    }

    fn user_messages(&self, session: &str) -> Vec<(String, String)> {
        self.admin
            .transcript(session)
            .into_iter()
            .filter_map(|e| match e.payload {
                EntryPayload::Message {
                    message:
                        Message::User {
                            author, content, ..
                        },
                } => Some((author, content)),
                _ => None,
            })
            .collect()
    }

    /// The texts of the user messages of the binding's one session (asserts there is one).
    fn said_in_the_only_session(&self) -> Vec<String> {
        let sessions = self.sessions();
        assert_eq!(sessions.len(), 1, "{sessions:?}");
        self.user_messages(&sessions[0].id)
            .into_iter()
            .map(|(_, text)| text)
            .collect()
    }
}

/// A `MESSAGE_CREATE`'s `d` in guild `G1`: person `user` (a bot when `bot`) writes `content`
/// in `channel`, mentioning the bot when `mention`.
fn message(id: &str, channel: &str, user: u64, content: &str, mention: bool) -> Value {
    let mentions = if mention {
        json!([{"id": BOT_ID, "username": "wuhu", "bot": true}])
    } else {
        json!([])
    };
    json!({"id": id, "channel_id": channel, "guild_id": "G1", "type": 0, "tts": false,
        "author": {"id": user.to_string(), "username": format!("person{user}"), "discriminator": "0"},
        "content": content, "mentions": mentions, "attachments": [], "embeds": [],
        "timestamp": "2026-11-27T06:00:00.000000+00:00"})
}

fn texts(posts: &[ChatCall]) -> Vec<String> {
    posts.iter().map(|p| p.text().to_string()).collect()
}

/// Two people mention the bot in one channel: one session (owned by the first, open to the
/// tenant), the group reminder once, the second person's message prefixed, replies created in
/// the channel; a plain message there continues it. A bot's message, and a plain message in a
/// channel without a session, start nothing.
#[test]
fn mentions_start_a_session_and_plain_messages_continue_it() {
    let _guard = stack().guard();
    let bot = Bot::new("gw-flow", 300, |_| {});
    let connections = bot.gateway.wait_ready(1, TURN);
    let identify = connections[0].identify.clone().expect("an IDENTIFY");
    assert_eq!(identify["token"], BOT_TOKEN);
    assert_eq!(identify["intents"], INTENTS);
    assert_eq!(connections[0].path, "/?v=10&encoding=json");
    let status = bot.wait_state("connected");
    assert!(status["connectedSince"].as_u64().is_some(), "{status}");

    // Nothing to start: a bot mentioning us, a person not mentioning us in an unbound channel.
    let mut from_a_bot = message("m1", "C1", 70001, &format!("<@{BOT_ID}> hi"), true);
    from_a_bot["author"]["bot"] = json!(true);
    bot.gateway.push_message(from_a_bot);
    bot.gateway.push_message(message(
        "m2",
        "C2",
        90001,
        "chatting among ourselves",
        false,
    ));

    bot.gateway.push_message(message(
        "m3",
        "C1",
        90001,
        &format!("<@{BOT_ID}> hello"),
        true,
    ));
    let posts = bot.fake.wait_for_posts(1, TURN);
    bot.gateway.push_message(message(
        "m4",
        "C1",
        90002,
        &format!("me too <@!{BOT_ID}>"),
        false, // the mention in the text is enough
    ));
    let posts = bot.fake.wait_for_posts(posts.len() + 1, TURN);
    assert_eq!(
        texts(&posts),
        ["echo: hello", "echo: [discord:90002]:\n\nme too"]
    );
    for post in &posts {
        assert_eq!(post.method, "POST channels/C1/messages", "{post:?}");
        assert_eq!(post.token.as_deref(), Some(BOT_TOKEN));
        assert_eq!(post.body["allowed_mentions"], json!({"parse": []}));
    }

    // A bot's message in the bound channel is not taken; a plain message continues.
    let mut bot_in_channel = message("m5", "C1", 70001, "beep", false);
    bot_in_channel["author"]["bot"] = json!(true);
    bot.gateway.push_message(bot_in_channel);
    bot.gateway
        .push_message(message("m6", "C1", 90001, "thanks", false));
    bot.fake.wait_for_posts(posts.len() + 1, TURN);

    let sessions = bot.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].owner, "discord:90001");
    assert_eq!(sessions[0].access, wuhu_core::authority::Access::Tenant);
    assert_eq!(
        bot.user_messages(&sessions[0].id),
        [
            ("discord:90001".to_string(), "hello".to_string()),
            ("discord:90002".into(), "me too".into()),
            ("discord:90001".into(), "thanks".into()),
        ]
    );
    let reminders = bot
        .admin
        .transcript(&sessions[0].id)
        .iter()
        .filter(|e| matches!(&e.payload, EntryPayload::Message { message: Message::CustomMessage { custom_type, .. } } if custom_type == custom_types::GROUP_CHAT_REMINDER))
        .count();
    assert_eq!(reminders, 1);

    // A direct message (no guild) starts a session of its own without a mention.
    let mut direct = message("m7", "D1", 90003, "a private question", false);
    direct.as_object_mut().unwrap().remove("guild_id");
    bot.gateway.push_message(direct);
    let posts = bot
        .fake
        .wait_for_text("the DM's reply", TURN, |t| t == "echo: a private question");
    assert_eq!(posts.last().unwrap().method, "POST channels/D1/messages");
    let sessions = bot.sessions();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert!(sessions.iter().any(|s| s.owner == "discord:90003"));

    // Heartbeats flow (every 300 ms here) and are acknowledged: the connection stays.
    wait_for("two heartbeats", TURN, || {
        let c = bot.gateway.connections();
        (c[0].heartbeats >= 2).then_some(())
    });
    assert_eq!(bot.gateway.connections().len(), 1);
}

/// Under `admit: mapped` (the default) a stranger's direct message starts nothing and is
/// answered with the refusal once (a second one is not); a mapped member's starts a session.
/// Under `admit: allowlist` a listed guild's unmapped people are guests, another guild's and
/// direct messages (no guild) are not.
#[test]
fn strangers_and_unlisted_guilds_start_nothing() {
    let _guard = stack().guard();
    let direct = |id: &str, channel: &str, user: u64, content: &str| {
        let mut m = message(id, channel, user, content, false);
        m.as_object_mut().unwrap().remove("guild_id");
        m
    };
    let mapped = Bot::with_fields(
        stack().admin_client("root", &unique_name("gw-mapped")),
        30_000,
        |_| {},
        json!({}),
    );
    mapped.gateway.wait_ready(1, TURN);
    mapped.wait_state("connected");
    let members = mapped.admin.send(
        mapped
            .admin
            .request("PUT", &format!("/v1/channels/{}/members", mapped.id))
            .body(
                json!({"members": [{"user": "90005", "sub": "gus"}]})
                    .to_string()
                    .into_bytes(),
            ),
    );
    assert_eq!(members.status, 200, "{members}");
    mapped
        .gateway
        .push_message(direct("s1", "D9", 90009, "let me in"));
    mapped
        .gateway
        .push_message(direct("s2", "D9", 90009, "please"));
    mapped.gateway.push_message(message(
        "s3",
        "C1",
        90009,
        &format!("<@{BOT_ID}> hello?"),
        true,
    ));
    // Messages are handled in order: once the member's reply is out, the stranger's were seen.
    mapped
        .gateway
        .push_message(direct("s4", "D5", 90005, "I am gus"));
    let posts = mapped
        .fake
        .wait_for_text("the member's reply", TURN, |t| t == "echo: I am gus");
    let refusals: Vec<&ChatCall> = posts
        .iter()
        .filter(|p| p.text().contains("only answer people an admin"))
        .collect();
    assert_eq!(refusals.len(), 1, "{posts:?}");
    assert_eq!(refusals[0].method, "POST channels/D9/messages");
    let sessions = mapped.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].owner, "gus");

    let listed = Bot::with_fields(
        stack().admin_client("root", &unique_name("gw-allow")),
        30_000,
        |_| {},
        json!({"admit": "allowlist", "allowlist": ["700"]}),
    );
    listed.gateway.wait_ready(1, TURN);
    listed.wait_state("connected");
    let mut other_guild = message("a1", "C2", 90001, &format!("<@{BOT_ID}> from 800"), true);
    other_guild["guild_id"] = json!("800");
    listed.gateway.push_message(other_guild);
    listed
        .gateway
        .push_message(direct("a2", "D1", 90001, "a direct message"));
    let mut our_guild = message("a3", "C1", 90002, &format!("<@{BOT_ID}> from 700"), true);
    our_guild["guild_id"] = json!("700");
    listed.gateway.push_message(our_guild);
    let posts = listed
        .fake
        .wait_for_text("the guest's reply", TURN, |t| t == "echo: from 700");
    let sessions = listed.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0].owner, "discord:90002");
    // Person 90001 was told once, in the channel of their first message.
    let refusals: Vec<&ChatCall> = posts
        .iter()
        .filter(|p| p.text().contains("only answer people an admin"))
        .collect();
    assert_eq!(refusals.len(), 1, "{posts:?}");
    assert_eq!(refusals[0].method, "POST channels/C2/messages");
}

/// A dropped connection resumes the session at `resume_gateway_url`; the replayed
/// `MESSAGE_CREATE` is not enqueued again. `op 7 RECONNECT` resumes the same way.
#[test]
fn a_resumed_gateway_does_not_enqueue_a_replay_twice() {
    let _guard = stack().guard();
    let bot = Bot::new("gw-resume", 30_000, |g| g.replay_all_on_resume());
    bot.gateway.wait_ready(1, TURN);
    bot.gateway.push_message(message(
        "r1",
        "C1",
        90001,
        &format!("<@{BOT_ID}> first"),
        true,
    ));
    bot.fake.wait_for_posts(1, TURN);

    bot.gateway.drop_connection();
    let connections = bot.gateway.wait_ready(2, TURN);
    assert!(
        connections[1]
            .path
            .starts_with("/resume?v=10&encoding=json")
    );
    let resume = connections[1]
        .resume
        .clone()
        .expect("a RESUME, not an IDENTIFY");
    assert_eq!(resume["token"], BOT_TOKEN);
    assert_eq!(resume["seq"], 2, "{resume}"); // READY was 1, the message 2
    assert!(connections[1].identify.is_none());
    // The replay (r1 again) came before this one on the same connection.
    bot.gateway
        .push_message(message("r2", "C1", 90001, "second", false));
    bot.fake.wait_for_posts(2, TURN);

    bot.gateway.send_reconnect();
    let connections = bot.gateway.wait_ready(3, TURN);
    assert!(connections[2].resume.is_some());
    bot.gateway
        .push_message(message("r3", "C1", 90001, "third", false));
    let posts = bot.fake.wait_for_posts(3, TURN);

    assert_eq!(bot.said_in_the_only_session(), ["first", "second", "third"]);
    assert_eq!(posts.len(), 3, "{:?}", texts(&posts));
    assert_eq!(bot.status()["state"], "connected");
}

/// Heartbeats without an `ACK` mean a zombie connection: the binding closes it and resumes on a
/// new one, and says why in its status.
#[test]
fn a_zombie_connection_is_replaced_and_resumed() {
    let _guard = stack().guard();
    let bot = Bot::new("gw-zombie", 200, |_| {});
    bot.gateway.wait_ready(1, TURN);
    bot.gateway.ack_heartbeats(false);
    let connections = bot.gateway.wait_ready(2, TURN);
    bot.gateway.ack_heartbeats(true);
    assert!(connections[0].heartbeats >= 1, "{connections:?}");
    // Closed by the binding, not by the fake.
    assert_eq!(connections[0].closed_with, None, "{connections:?}");
    let resumed = connections
        .iter()
        .filter(|c| c.ready)
        .nth(1)
        .expect("a second ready connection");
    assert!(
        resumed.resume.is_some() && resumed.identify.is_none(),
        "{resumed:?}"
    );
    let status = bot.wait_state("connected");
    assert!(
        status["lastError"]
            .as_str()
            .unwrap_or_default()
            .contains("zombie"),
        "{status}"
    );
    // Messages flow on the new connection.
    bot.gateway.push_message(message(
        "z1",
        "C1",
        90001,
        &format!("<@{BOT_ID}> still there?"),
        true,
    ));
    let posts = bot.fake.wait_for_posts(1, TURN);
    assert_eq!(texts(&posts), ["echo: still there?"]);
}

/// Close code 4004 (authentication failed) forbids reconnecting: the connection stops, the
/// binding shows why, and nothing reconnects; a PATCH of the binding starts it again.
#[test]
fn an_authentication_failure_stops_the_connection_visibly() {
    let _guard = stack().guard();
    let bot = Bot::new("gw-4004", 30_000, |g| g.close_on_identify(4004));
    let status = bot.wait_state("stopped");
    assert!(
        status["lastError"].as_str().unwrap().contains("4004"),
        "{status}"
    );
    let connections = bot.gateway.connections();
    assert_eq!(connections.len(), 1, "{connections:?}");
    assert_eq!(connections[0].closed_with, Some(4004));
    // Still one connection after another look: stopped means stopped.
    assert_eq!(bot.status()["state"], "stopped");
    assert_eq!(bot.gateway.connections().len(), 1);

    bot.gateway.accept_identify();
    let response = bot.admin.patch(
        &format!("/v1/channels/{}", bot.id),
        &json!({"name": "again"}),
    );
    assert_eq!(response.status, 200, "{response}");
    bot.gateway.wait_ready(1, TURN);
    bot.wait_state("connected");
    assert_eq!(bot.gateway.connections().len(), 2);
}

/// A restart of the Worker (SIGKILL) takes the socket with it: the binding's alarm (the
/// watchdog, at most 30 s later) reconnects and resumes the stored session; the replayed message
/// is not taken twice.
#[test]
fn after_a_restart_the_stored_session_is_resumed() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let tenant = unique_name("gw-restart");
    let mut bot = Bot::with_admin(stack.admin_client("root", &tenant), 200, |g| {
        g.replay_all_on_resume()
    });
    bot.gateway.wait_ready(1, TURN);
    bot.gateway.push_message(message(
        "k1",
        "C1",
        90001,
        &format!("<@{BOT_ID}> before"),
        true,
    ));
    bot.fake.wait_for_posts(1, TURN);
    stack.restart_killed();
    bot.admin = stack.admin_client("root", &tenant);
    let connections = bot.gateway.wait_ready(2, gateway_watchdog_deadline());
    let resumed = connections
        .iter()
        .filter(|c| c.ready)
        .nth(1)
        .expect("a second ready connection");
    assert!(resumed.path.starts_with("/resume?"), "{resumed:?}");
    assert!(resumed.identify.is_none(), "{resumed:?}");
    assert_eq!(resumed.resume.as_ref().unwrap()["token"], BOT_TOKEN);
    bot.gateway
        .push_message(message("k2", "C1", 90001, "after", false));
    bot.fake.wait_for_posts(2, TURN);
    assert_eq!(bot.said_in_the_only_session(), ["before", "after"]);
}

/// The watchdog looks every 30 s; a restart may come just after a look.
fn gateway_watchdog_deadline() -> Duration {
    Duration::from_millis(wuhu_core::channels::gateway::WATCHDOG_MS) + TURN
}
