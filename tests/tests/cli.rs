//! The `wuhu` binary against the real Worker: profiles and resolution order, every command's
//! `--json` shape, exit codes with the server's error code, a follow whose connection is cut
//! mid-turn (nothing lost, nothing twice, said once), and `wuhu chat` in a terminal (streamed
//! reply, a steer into a running turn, Ctrl-C stops the turn and a second one exits).

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{
    DocList, Entry, EntryPayload, GetSessionResponse, Lane, ListEnvironmentsResponse,
    ListRunnersResponse, ListSessionsResponse, Message, SessionInfo, Status, StreamEvent,
};
use wuhu_e2e::cli::{Relay, Tmux, Wuhu, wuhu_bin};
use wuhu_e2e::delay_proxy::DelayProxy;
use wuhu_e2e::entries::{assert_contiguous, assistant, describe, fake_directive, user_content};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, wait_for};

const TURN: Duration = Duration::from_secs(60);
/// A turn cut by a server kill: resumed when the follow's reconnect loads the session, else by
/// its watchdog alarm (30 s after the turn started) and the retried step.
const RESTART: Duration = Duration::from_secs(150);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(|| {
        // Built before the stack starts, so a slow build does not eat a test's deadlines.
        wuhu_bin();
        wuhu_e2e::StackOptions::default()
    })
}

/// A user whose `WUHU_SERVER`/`WUHU_TOKEN` point at the shared stack.
fn user(sub: &str, tenant: &str) -> Wuhu {
    Wuhu::new()
        .env("WUHU_SERVER", &stack().base_url())
        .env("WUHU_TOKEN", &stack().user_token(sub, tenant))
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port in url")
}

#[test]
fn login_saves_a_private_profile_and_flags_beat_env_beat_profile() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-login");
    let token = stack.user_token("ana", &tenant);
    let wuhu = Wuhu::new();

    // Nothing configured: the command needs a token (exit 2), says how to log in.
    let ran = wuhu.run(&["whoami"]);
    assert_eq!(ran.code(), 2, "{ran:?}");
    assert!(ran.stderr.contains("wuhu login"), "{ran:?}");

    // A bad token is refused by the server and nothing is saved.
    let bad = stack.bad_signature_token("ana", &tenant);
    let ran = wuhu.run(&["login", "--server", &stack.base_url(), "--token", &bad]);
    assert_eq!(ran.code(), 2, "{ran:?}");
    assert!(ran.stderr.contains("unauthorized"), "{ran:?}");
    assert!(!wuhu.config_path().exists());

    // The token pasted on stdin.
    wuhu.run_with_stdin(
        &["login", "--server", &stack.base_url()],
        &format!("{token}\n"),
    )
    .ok();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(wuhu.config_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let who = wuhu.run(&["whoami", "--json"]).ok().json();
    assert_eq!(who["sub"], "ana");
    assert_eq!(who["tenant"], tenant.as_str());
    assert_eq!(who["serverSource"], "profile");
    assert_eq!(who["tokenSource"], "profile");
    assert_eq!(who["accepted"], true);

    // Env beats the profile, the flag beats env.
    let other = stack.user_token("bob", &tenant);
    let as_env = Wuhu::new()
        .env("HOME", "/nonexistent")
        .env("WUHU_CONFIG", wuhu.config_path().to_str().unwrap())
        .env("WUHU_TOKEN", &other);
    let who = as_env.run(&["whoami", "--json"]).ok().json();
    assert_eq!(
        (who["sub"].as_str(), who["tokenSource"].as_str()),
        (Some("bob"), Some("env"))
    );
    let who = as_env
        .run(&["whoami", "--json", "--token", &token])
        .ok()
        .json();
    assert_eq!(
        (who["sub"].as_str(), who["tokenSource"].as_str()),
        (Some("ana"), Some("flag"))
    );
    // A wrong server from env beats the profile's good one: unreachable is exit 4.
    let unreachable = format!("http://127.0.0.1:{}", wuhu_e2e::stack::free_port());
    let ran = as_env.env("WUHU_SERVER", &unreachable).run(&["whoami"]);
    assert_eq!(ran.code(), 4, "{ran:?}");

    // A second profile, then `--profile` picks it; logout removes only its token.
    wuhu.run(&[
        "login",
        "--profile",
        "second",
        "--server",
        &stack.base_url(),
        "--token",
        &other,
    ])
    .ok();
    let who = wuhu.run(&["whoami", "--json"]).ok().json();
    assert_eq!(
        (who["sub"].as_str(), who["profile"].as_str()),
        (Some("bob"), Some("second"))
    );
    let who = wuhu
        .run(&["whoami", "--json", "--profile", "default"])
        .ok()
        .json();
    assert_eq!(who["sub"], "ana");
    wuhu.run(&["logout"]).ok();
    assert_eq!(wuhu.run(&["whoami"]).code(), 2);
    wuhu.run(&["whoami", "--profile", "default"]).ok();
}

#[test]
fn token_mint_signs_what_the_server_and_the_node_script_agree_on() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-mint");
    let args = [
        "--sub", "op", "--tenant", &tenant, "--days", "2", "--role", "admin",
    ];
    let mut mint = vec!["token", "mint", "--json"];
    mint.extend(args);
    let minted = Wuhu::new()
        .env("WUHU_JWT_SECRET", stack.secret())
        .run(&mint)
        .ok()
        .json();
    let token = minted["token"].as_str().expect("token").to_string();
    let who = Wuhu::new()
        .env("WUHU_SERVER", &stack.base_url())
        .env("WUHU_TOKEN", &token)
        .run(&["whoami", "--json"])
        .ok()
        .json();
    assert_eq!(
        (who["sub"].as_str(), who["role"].as_str()),
        (Some("op"), Some("admin"))
    );

    // The Node script's claims for the same arguments are the same (exp within a second).
    let node = std::process::Command::new("node")
        .arg(wuhu_e2e::stack::repo_root().join("scripts/lib/mint-token.mjs"))
        .args(["--secret", stack.secret()])
        .args(args)
        .output()
        .expect("run node");
    assert!(node.status.success(), "{node:?}");
    let node_token = String::from_utf8_lossy(&node.stdout).trim().to_string();
    let claims = |token: &str| -> Value {
        let payload = token.split('.').nth(1).expect("payload");
        let bytes = base64_url_decode(payload);
        serde_json::from_slice(&bytes).expect("claims json")
    };
    let (mut ours, mut theirs) = (claims(&token), claims(&node_token));
    let (exp_a, exp_b) = (
        ours["exp"].as_i64().unwrap(),
        theirs["exp"].as_i64().unwrap(),
    );
    assert!((exp_a - exp_b).abs() <= 2, "{exp_a} vs {exp_b}");
    ours["exp"] = json!(0);
    theirs["exp"] = json!(0);
    assert_eq!(ours, theirs);

    // A runner token is refused on user routes (exit 2), a bad role is a usage error (exit 1).
    let runner = Wuhu::new()
        .env("WUHU_JWT_SECRET", stack.secret())
        .run(&[
            "token",
            "mint",
            "--sub",
            "r",
            "--tenant",
            &tenant,
            "--runner-kind",
            "cloud",
        ])
        .ok();
    let ran = Wuhu::new()
        .env("WUHU_SERVER", &stack.base_url())
        .env("WUHU_TOKEN", runner.stdout.trim())
        .run(&["sessions", "list"]);
    assert_eq!(ran.code(), 2, "{ran:?}");
    let ran = Wuhu::new().env("WUHU_JWT_SECRET", stack.secret()).run(&[
        "token", "mint", "--sub", "r", "--tenant", &tenant, "--role", "root",
    ]);
    assert_eq!(ran.code(), 1, "{ran:?}");
}

#[test]
fn login_mints_a_revocable_token_and_revoke_locks_the_profile_out() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-mint-login");
    let operator = stack.user_token("ana", &tenant);
    let wuhu = Wuhu::new();

    // The operator token is used once to mint; the minted token is what the profile keeps.
    let login = wuhu
        .run(&[
            "login",
            "--json",
            "--server",
            &stack.base_url(),
            "--token",
            &operator,
            "--mint",
            "laptop",
            "--ttl-days",
            "3",
        ])
        .ok()
        .json();
    let jti = login["minted"]["jti"]
        .as_str()
        .expect("minted jti")
        .to_string();
    assert_eq!(login["minted"]["name"], "laptop");
    let saved = std::fs::read_to_string(wuhu.config_path()).unwrap();
    assert!(
        !saved.contains(&operator),
        "the operator token is not saved"
    );
    let who = wuhu.run(&["whoami", "--json"]).ok().json();
    assert_eq!(
        (who["sub"].as_str(), who["accepted"].as_bool()),
        (Some("ana"), Some(true))
    );

    // Listed with its name, then revoked: the profile's token is refused at once (exit 2).
    let listed = wuhu.run(&["token", "list", "--json"]).ok().json();
    let names: Vec<(&str, &str)> = listed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["jti"].as_str().unwrap(), t["name"].as_str().unwrap()))
        .collect();
    assert_eq!(names, vec![(jti.as_str(), "laptop")]);
    wuhu.run(&["token", "revoke", &jti]).ok();
    let ran = wuhu.run(&["sessions", "list"]);
    assert_eq!(ran.code(), 2, "{ran:?}");
    // Revoking again is a 404: exit 3, with the operator's token (the profile's is dead).
    let ran = wuhu.run(&["token", "revoke", &jti, "--token", &operator]);
    assert_eq!(ran.code(), 3, "{ran:?}");

    // Sign out everywhere: a new login and a token minted from it both end; without a
    // terminal the command wants --yes and ends nothing.
    let login = wuhu
        .run(&[
            "login",
            "--json",
            "--server",
            &stack.base_url(),
            "--token",
            &operator,
            "--mint",
            "desk",
        ])
        .ok()
        .json();
    let desk = login["minted"]["jti"].as_str().unwrap().to_string();
    let current =
        wuhu.run(&["token", "list", "--json"]).ok().json()["tokens"][0]["current"].clone();
    assert_eq!(current, true, "the profile's own token is marked current");
    let ran = wuhu.run(&["token", "revoke-all"]);
    assert_eq!(ran.code(), 1, "{ran:?}");
    assert!(ran.stderr.contains("--yes"), "{ran:?}");
    assert_eq!(
        wuhu.run(&["sessions", "list"]).code(),
        0,
        "nothing was ended"
    );
    let ended = wuhu
        .run(&["token", "revoke-all", "--yes", "--json"])
        .ok()
        .json();
    assert_eq!(
        (ended["sub"].as_str(), ended["revoked"].as_u64()),
        (Some("ana"), Some(1)),
        "{ended}"
    );
    let ran = wuhu.run(&["sessions", "list"]);
    assert_eq!(ran.code(), 2, "{desk} ended: {ran:?}");
}

fn base64_url_decode(text: &str) -> Vec<u8> {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = 0u32;
    let mut n_bits = 0;
    let mut out = Vec::new();
    for c in text.bytes() {
        let v = alphabet.iter().position(|&a| a == c).expect("base64url") as u32;
        bits = (bits << 6) | v;
        n_bits += 6;
        if n_bits >= 8 {
            n_bits -= 8;
            out.push((bits >> n_bits) as u8);
            bits &= (1 << n_bits) - 1;
        }
    }
    out
}

/// Parses NDJSON follow output into stream events (plus the client's own notices).
fn follow_events(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn entries_of(events: &[Value]) -> Vec<Entry> {
    events
        .iter()
        .filter(|e| e["type"] == "entry_appended")
        .map(
            |e| match serde_json::from_value::<StreamEvent>(e.clone()).expect("a stream event") {
                StreamEvent::EntryAppended { entry } => entry,
                _ => unreachable!(),
            },
        )
        .collect()
}

#[test]
fn sessions_commands_print_the_wire_types_and_follow_to_idle() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-sessions");
    let wuhu = user("carla", &tenant);

    let created: SessionInfo = serde_json::from_value(
        wuhu.run(&["sessions", "new", "--title", "first", "--json"])
            .ok()
            .json(),
    )
    .expect("sessions new --json is a SessionInfo");
    assert_eq!(created.title.as_deref(), Some("first"));
    let id = created.id.as_str();
    // Human output is the id alone (for `$(wuhu sessions new)`).
    let plain = wuhu.run(&["sessions", "new"]).ok();
    assert_eq!(plain.stdout.trim().len(), 36, "{plain:?}");

    let sent = wuhu
        .run(&["sessions", "send", id, "hello cli", "--json"])
        .ok()
        .json();
    let item = sent["id"].as_str().expect("queue item id").to_string();
    let followed = wuhu
        .run(&["sessions", "follow", id, "--until-idle", "--json"])
        .ok();
    let events = follow_events(
        &followed
            .stdout
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>(),
    );
    let names: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["idle", "done"], "{names:?}");
    let entries = entries_of(&events);
    assert_contiguous(&entries);
    assert_eq!(entries.first().map(|e| e.cursor), Some(1));
    assert!(
        entries.iter().any(|e| user_content(e) == Some("hello cli")),
        "{}",
        describe(&entries)
    );
    assert!(
        entries
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == "echo: hello cli"),
        "{}",
        describe(&entries)
    );

    // `send --wait` follows just this turn and prints it as text.
    let waited = wuhu
        .run(&["sessions", "send", id, "second message", "--wait"])
        .ok();
    assert!(waited.stdout.contains("echo: second message"), "{waited:?}");
    assert!(!waited.stdout.contains("echo: hello cli"), "{waited:?}");

    let shown: GetSessionResponse =
        serde_json::from_value(wuhu.run(&["sessions", "show", id, "--json"]).ok().json())
            .expect("sessions show --json is a GetSessionResponse");
    assert_eq!(shown.session.status, Status::Idle);
    assert_contiguous(&shown.transcript);
    let text = wuhu.run(&["sessions", "show", id]).ok().stdout;
    assert!(
        text.contains("first") && text.contains("echo: hello cli"),
        "{text}"
    );

    let listed: ListSessionsResponse =
        serde_json::from_value(wuhu.run(&["sessions", "list", "--json"]).ok().json())
            .expect("sessions list --json is a ListSessionsResponse");
    assert_eq!(listed.sessions.len(), 2);
    assert!(listed.sessions.iter().any(|s| s.id == id));

    let renamed = wuhu
        .run(&["sessions", "rename", id, "renamed", "--json"])
        .ok()
        .json();
    assert_eq!(renamed["title"], "renamed");
    let stopped = wuhu.run(&["sessions", "stop", id, "--json"]).ok().json();
    assert_eq!(stopped["status"], "stopped");

    // A delivered item cannot be cancelled: the server's 409 code, exit 4.
    let ran = wuhu.run(&["sessions", "cancel", id, &item, "--json"]);
    assert_eq!(ran.code(), 4, "{ran:?}");
    assert_eq!(ran.error_json()["error"]["code"], "already_delivered");
    assert_eq!(ran.error_json()["error"]["status"], 409);

    // Docs, environments and runners print their wire types too.
    let doc = "---\ntitle: Notes\n---\nbody text\n";
    let put = wuhu.run_with_stdin(&["docs", "put", "notes/a.md", "--json"], doc);
    assert_eq!(put.code(), 0, "{put:?}");
    assert_eq!(put.json()["path"], "notes/a.md");
    let got = wuhu.run(&["docs", "get", "notes/a.md"]).ok();
    assert_eq!(got.stdout, doc);
    let listed: DocList =
        serde_json::from_value(wuhu.run(&["docs", "ls", "notes/", "--json"]).ok().json())
            .expect("docs ls --json has docs");
    assert_eq!(listed.docs.len(), 1);
    wuhu.run(&["docs", "rm", "notes/a.md"]).ok();
    assert_eq!(wuhu.run(&["docs", "get", "notes/a.md"]).code(), 3);

    wuhu.run(&[
        "envs",
        "add",
        "tmpl",
        "--kind",
        "folder-template",
        "--template-path",
        "/srv/t",
        "--approval",
        "ask",
    ])
    .ok();
    let edited = wuhu
        .run(&["envs", "edit", "tmpl", "--startup-script", "true", "--json"])
        .ok()
        .json();
    assert_eq!(edited["startupScript"], "true");
    assert_eq!(edited["approval"], "ask");
    // A list flag replaces its list; `--unset` empties it (both at once is a usage error).
    let edited = wuhu
        .run(&[
            "envs",
            "edit",
            "tmpl",
            "--secret",
            "GITHUB_TOKEN",
            "--secret",
            "NPM_TOKEN",
            "--read-only-path",
            "/opt/tools",
            "--json",
        ])
        .ok()
        .json();
    assert_eq!(edited["secrets"], json!(["GITHUB_TOKEN", "NPM_TOKEN"]));
    assert_eq!(edited["readOnlyPaths"], json!(["/opt/tools"]));
    let both = wuhu.run(&[
        "envs", "edit", "tmpl", "--secret", "A_B", "--unset", "secrets",
    ]);
    assert_eq!(both.code(), 1, "a usage error: {both:?}");
    assert!(both.stderr.contains("--secret alone replaces"), "{both:?}");
    let edited = wuhu
        .run(&[
            "envs",
            "edit",
            "tmpl",
            "--unset",
            "secrets",
            "--unset",
            "read-only-paths",
            "--json",
        ])
        .ok()
        .json();
    assert_eq!(
        edited["secrets"].as_array().map_or(0, Vec::len),
        0,
        "{edited}"
    );
    assert_eq!(
        edited["readOnlyPaths"].as_array().map_or(0, Vec::len),
        0,
        "{edited}"
    );
    assert_eq!(edited["startupScript"], "true");
    let envs: ListEnvironmentsResponse =
        serde_json::from_value(wuhu.run(&["envs", "list", "--json"]).ok().json())
            .expect("envs list --json");
    assert_eq!(envs.environments.len(), 1);
    wuhu.run(&["envs", "rm", "tmpl"]).ok();
    assert_eq!(wuhu.run(&["envs", "rm", "tmpl"]).code(), 3);
    let _: ListRunnersResponse =
        serde_json::from_value(wuhu.run(&["runners", "list", "--json"]).ok().json())
            .expect("runners list --json");
    let approvals = wuhu.run(&["approvals", "list", id, "--json"]).ok().json();
    assert_eq!(approvals["approvals"], json!([]));
}

/// A message whose answer is lost on its way back (the server queued it, the client's connection
/// closed without a reply) is sent again with the same idempotency key and queued once: for 0,
/// 1 and 2 lost answers, `sessions send` prints the first item's id and the transcript holds
/// the message exactly once. Three lost answers use up the attempts: the command fails, and the
/// message, queued by the first, is still there once.
#[test]
fn a_send_whose_answers_are_lost_is_queued_once() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-lost");
    for lost in 0..=3 {
        let proxy = DelayProxy::losing_answers(&stack.base_url(), "/enqueue", lost);
        let direct = user("dora", &tenant);
        let id = direct
            .run(&["sessions", "new"])
            .ok()
            .stdout
            .trim()
            .to_string();
        let through_proxy = Wuhu::new()
            .env("WUHU_SERVER", &proxy.url())
            .env("WUHU_TOKEN", &stack.user_token("dora", &tenant));
        let text = format!("sent with {lost} answers lost");
        let ran = through_proxy.run(&["sessions", "send", &id, &text, "--json"]);
        assert_eq!(proxy.lost(), lost, "{ran:?}");
        if lost < 3 {
            let item = ran.ok().json()["id"].as_str().expect("item id").to_string();
            assert!(!item.is_empty());
        } else {
            assert_ne!(ran.code(), 0, "three lost answers: {ran:?}");
        }
        direct
            .run(&["sessions", "follow", &id, "--until-idle", "--json"])
            .ok();
        let shown: GetSessionResponse =
            serde_json::from_value(direct.run(&["sessions", "show", &id, "--json"]).ok().json())
                .expect("sessions show --json");
        let copies = shown
            .transcript
            .iter()
            .filter(|e| user_content(e) == Some(text.as_str()))
            .count();
        assert_eq!(copies, 1, "{lost} lost: {}", describe(&shown.transcript));
    }
}

#[test]
fn errors_exit_with_their_class_and_carry_the_server_code() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-errors");
    let wuhu = user("dan", &tenant);
    let missing = "00000000-0000-4000-8000-000000000000";

    let cases: &[(&[&str], i32, &str)] = &[
        (&["sessions", "show", missing, "--json"], 3, "not_found"),
        (
            &["sessions", "send", missing, "hi", "--json"],
            3,
            "not_found",
        ),
        (&["sessions", "follow", missing, "--json"], 3, "not_found"),
        (
            &["approvals", "approve", missing, "a1", "--json"],
            3,
            "not_found",
        ),
        (
            &["envs", "add", "x", "--kind", "local", "--json"],
            1,
            "bad_request",
        ),
    ];
    for (args, code, server_code) in cases {
        let ran = wuhu.run(args);
        assert_eq!(ran.code(), *code, "{args:?}: {ran:?}");
        assert_eq!(
            ran.error_json()["error"]["code"],
            *server_code,
            "{args:?}: {ran:?}"
        );
    }
    // A title the server refuses: 400 is a usage error, the message is the server's.
    let id = wuhu
        .run(&["sessions", "new"])
        .ok()
        .stdout
        .trim()
        .to_string();
    let ran = wuhu.run(&["sessions", "rename", &id, "   "]);
    assert_eq!(ran.code(), 1, "{ran:?}");
    assert!(
        ran.stderr.contains("bad_request") && ran.stderr.contains("title"),
        "{ran:?}"
    );
    // Another tenant's session does not exist for this user.
    let other = user("dan", &unique_name("cli-errors-other"));
    assert_eq!(other.run(&["sessions", "show", &id]).code(), 3);
    // Expired token: auth, with the server's code.
    let expired = Wuhu::new()
        .env("WUHU_SERVER", &stack.base_url())
        .env("WUHU_TOKEN", &stack.expired_token("dan", &tenant));
    let ran = expired.run(&["sessions", "list", "--json"]);
    assert_eq!(ran.code(), 2, "{ran:?}");
    assert_eq!(ran.error_json()["error"]["code"], "unauthorized");
    // Usage errors never reach the server.
    assert_eq!(wuhu.run(&["sessions", "frobnicate"]).code(), 1);
    assert_eq!(
        wuhu.run(&["sessions", "send", &id, "x", "--lane", "sideways"])
            .code(),
        1
    );
    assert_eq!(wuhu.run(&["--help"]).code(), 0);
}

/// A follow whose connection is cut twice mid-turn: the CLI reconnects with `Last-Event-ID`,
/// says so once per cut, and prints every entry exactly once, in order, up to the idle.
#[test]
fn a_follow_cut_mid_turn_resumes_without_loss_or_duplicates() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-cut");
    let relay = Relay::start(port_of(&stack.base_url()));
    let wuhu = user("eve", &tenant).env("WUHU_SERVER", &relay.url());
    let api = stack.client("eve", &tenant);
    let session = api.create_fake_session();
    // A turn of three steps (two tool calls, then a reply) streamed slowly enough to cut twice.
    let content = fake_directive(&json!({
        "toolCalls": [{"name": "list_sessions"}, {"name": "list_sessions", "arguments": {"limit": 1}}],
        "afterTools": "all done after the cuts",
        "chunks": 12,
        "delayMs": 150,
    }));
    // Enqueued first: a follow `--until-idle` of a session at rest ends at once.
    api.enqueue(&session.id, "followUp", &content);
    let mut follow = wuhu.spawn(&["sessions", "follow", &session.id, "--until-idle", "--json"]);
    follow.wait_line("the first delta", TURN, |l| {
        l.contains("assistant_text_delta")
    });
    assert!(relay.cut() > 0, "the follow went through the relay");
    follow.wait_line("the reconnect", TURN, |l| l.contains("\"resumed\""));
    follow.wait_line("a tool result", TURN, |l| l.contains("tool_result"));
    assert!(relay.cut() > 0);
    let status = follow.wait_exit(TURN);
    assert!(status.success(), "{status:?} {}", follow.stderr());

    let events = follow_events(&follow.lines());
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let n = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!((n("disconnected"), n("resumed")), (2, 2), "{kinds:?}");
    assert_eq!(kinds[kinds.len() - 2..], ["idle", "done"], "{kinds:?}");
    let printed = entries_of(&events);
    let unique: HashSet<u64> = printed.iter().map(|e| e.cursor).collect();
    assert_eq!(
        unique.len(),
        printed.len(),
        "an entry printed twice: {}",
        describe(&printed)
    );
    assert_eq!(
        printed,
        api.transcript(&session.id),
        "printed != transcript"
    );
    assert!(
        printed
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == "all done after the cuts"),
        "{}",
        describe(&printed)
    );
}

/// `follow` across a server restart: `wrangler dev` is SIGKILLed while the turn streams and
/// started again on the same state (on another port, behind the same relay). The CLI keeps
/// reconnecting through the outage, says so once (one `disconnected`, one `resumed`, however
/// many attempts failed), and prints every entry exactly once, in order, up to the idle.
#[test]
fn a_follow_across_a_server_restart_resumes_without_loss_and_says_so_once() {
    wuhu_bin();
    let mut stack = Stack::start();
    let tenant = unique_name("cli-restart");
    let relay = Relay::start(port_of(&stack.base_url()));
    let wuhu = Wuhu::new()
        .env("WUHU_SERVER", &relay.url())
        .env("WUHU_TOKEN", &stack.user_token("gus", &tenant));
    let api = stack.client("gus", &tenant);
    let session = api.create_fake_session();
    // A tool call, then a reply streamed slowly enough to be cut by the kill.
    let reply = "the reply that outlived the server";
    let content = fake_directive(&json!({
        "toolCalls": [{"name": "list_sessions"}],
        "afterTools": reply,
        "chunks": 20,
        "delayMs": 400,
    }));
    api.enqueue(&session.id, "followUp", &content);
    let mut follow = wuhu.spawn(&["sessions", "follow", &session.id, "--until-idle", "--json"]);
    wait_for("the reply streaming after the tool result", TURN, || {
        let lines = follow.lines();
        let tool_result = lines.iter().position(|l| l.contains("tool_result"))?;
        lines[tool_result..]
            .iter()
            .any(|l| l.contains("assistant_text_delta"))
            .then_some(())
    });
    stack.restart_killed();
    follow.wait_line("the outage noticed", TURN, |l| {
        l.contains("\"disconnected\"")
    });
    relay.retarget(port_of(&stack.base_url()));
    let status = follow.wait_exit(RESTART);
    assert!(status.success(), "{status:?} {}", follow.stderr());

    let events = follow_events(&follow.lines());
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let n = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!((n("disconnected"), n("resumed")), (1, 1), "{kinds:?}");
    assert_eq!(kinds[kinds.len() - 2..], ["idle", "done"], "{kinds:?}");
    let printed = entries_of(&events);
    let unique: HashSet<u64> = printed.iter().map(|e| e.cursor).collect();
    assert_eq!(
        unique.len(),
        printed.len(),
        "an entry printed twice: {}",
        describe(&printed)
    );
    let api = stack.client("gus", &tenant);
    assert_eq!(
        printed,
        api.transcript(&session.id),
        "printed != transcript"
    );
    assert!(
        printed
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == reply),
        "{}",
        describe(&printed)
    );
}

/// `wuhu chat --json` with stdin piped: one JSON object per line (the session, what was sent,
/// the stream as `follow --json` prints it), no colour, and it exits once the turn that took
/// its message has ended.
#[test]
fn chat_json_prints_one_object_per_line_and_exits_once_answered() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-chat-json");
    let wuhu = user("hal", &tenant);
    let ran = wuhu.run_with_stdin(&["chat", "--title", "scripted", "--json"], "hello json\n");
    assert_eq!(ran.code(), 0, "{ran:?}");
    assert!(!ran.stdout.contains('\x1b'), "{ran:?}");
    let lines: Vec<Value> = ran
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    assert_eq!(lines[0]["type"], "session", "{lines:#?}");
    assert_eq!(lines[0]["session"]["title"], "scripted");
    let sent = lines
        .iter()
        .find(|l| l["type"] == "sent")
        .unwrap_or_else(|| panic!("no sent record: {lines:#?}"));
    assert_eq!(sent["lane"], "followUp");
    let entries = entries_of(&lines);
    assert_contiguous(&entries);
    let user_entry = entries
        .iter()
        .find(|e| user_content(e) == Some("hello json"))
        .unwrap_or_else(|| panic!("no user entry: {}", describe(&entries)));
    assert!(
        matches!(&user_entry.payload, EntryPayload::Message { message: Message::User { queue_item_id: Some(id), .. } } if *id == sent["id"]),
        "{}",
        describe(&entries)
    );
    // It waited for the answer before exiting.
    assert!(
        entries
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == "echo: hello json"),
        "{}",
        describe(&entries)
    );
}

/// A piped chat exits once its message is answered whenever its follow stream connects: before
/// the turn, during it, or only after it ended (the stream's `status` after the backfill says
/// the session is at rest; before it did, such a chat waited forever for a `status` event that
/// had been broadcast before it connected). The follow requests are held back by a proxy.
#[test]
fn a_piped_chat_exits_once_answered_however_late_its_follow_stream_connects() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-chat-late");
    for delay_ms in [0, 50, 250, 1000, 2500] {
        let proxy = DelayProxy::start(
            &stack.base_url(),
            "/follow",
            Duration::from_millis(delay_ms),
        );
        let wuhu = Wuhu::new()
            .env("WUHU_SERVER", &proxy.url())
            .env("WUHU_TOKEN", &stack.user_token("lea", &tenant));
        let text = format!("late by {delay_ms} ms");
        let ran = wuhu.run_with_stdin(&["chat", "--json"], &format!("{text}\n"));
        assert_eq!(ran.code(), 0, "{delay_ms} ms: {ran:?}");
        let lines: Vec<Value> = ran
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
            .collect();
        let entries = entries_of(&lines);
        assert_contiguous(&entries);
        assert!(
            entries
                .iter()
                .filter_map(assistant)
                .any(|m| m.text() == format!("echo: {text}")),
            "{delay_ms} ms: {}",
            describe(&entries)
        );
    }
}

/// Colour only on a terminal and without `NO_COLOR`: the same `sessions show` has escape codes
/// in tmux, none there with `NO_COLOR=1`, and none when piped.
#[test]
fn colour_only_on_a_terminal_without_no_color() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-colour");
    let wuhu = user("ivy", &tenant);
    let id = wuhu
        .run(&["sessions", "new", "--title", "colours"])
        .ok()
        .stdout
        .trim()
        .to_string();
    wuhu.run(&["sessions", "send", &id, "paint me", "--wait"])
        .ok();
    let piped = wuhu.run(&["sessions", "show", &id]).ok();
    assert!(piped.stdout.contains("echo: paint me"), "{piped:?}");
    assert!(!piped.stdout.contains('\x1b'), "{piped:?}");
    let bin = wuhu_bin().display().to_string();
    let token = stack.user_token("ivy", &tenant);
    let base = stack.base_url();
    let home = wuhu.home().to_str().unwrap().to_string();
    for (no_color, coloured) in [(None, true), (Some("1"), false), (Some(""), true)] {
        let mut env = vec![
            ("WUHU_SERVER", base.as_str()),
            ("WUHU_TOKEN", token.as_str()),
            ("HOME", home.as_str()),
        ];
        if let Some(value) = no_color {
            env.push(("NO_COLOR", value));
        }
        // `cat` keeps the pane open after the command, to be read.
        let tmux = Tmux::start(
            &format!("{bin} sessions show {id}; echo END-OF-SHOW; cat"),
            &env,
        );
        tmux.wait_screen("the transcript", TURN, |s| s.contains("END-OF-SHOW"));
        let screen = tmux.capture_with_escapes();
        assert!(screen.contains("paint me"), "{screen}");
        assert_eq!(
            screen.contains("\x1b["),
            coloured,
            "NO_COLOR={no_color:?}:\n{screen:?}"
        );
    }
}

/// `wuhu chat` in a terminal: a streamed reply, a line typed during a turn steers it, one
/// typed with the `+ ` prefix queues a follow-up, Ctrl-C once stops the running turn, twice
/// exits.
#[test]
fn chat_streams_steers_and_stops_in_a_terminal() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-chat");
    let api = stack.client("fay", &tenant);
    let session = api.create_fake_session();
    let bin = wuhu_bin().display().to_string();
    let token = stack.user_token("fay", &tenant);
    let home = Wuhu::new();
    let tmux = Tmux::start(
        &format!("{bin} chat {}", session.id),
        &[
            ("WUHU_SERVER", &stack.base_url()),
            ("WUHU_TOKEN", &token),
            ("HOME", home.home().to_str().unwrap()),
            ("NO_COLOR", "1"),
        ],
    );
    tmux.wait_screen("the chat banner", TURN, |s| s.contains("Type a message"));

    // A slow reply: the line typed while it streams steers the turn. The typed directive is
    // echoed too, so "shown" means "on screen once more than typed".
    let slow = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen";
    tmux.type_line(&fake_directive(
        &json!({"reply": slow, "chunks": 14, "delayMs": 250}),
    ));
    tmux.wait_screen("the reply streaming", TURN, |s| {
        s.matches("one two").count() >= 2
    });
    tmux.type_line("please steer");
    // "+ " queues a follow-up instead: it runs after the steered turn ends.
    tmux.type_line("+ later please");
    tmux.wait_screen("the steer acknowledged", TURN, |s| s.contains("steering"));
    tmux.wait_screen("the follow-up acknowledged", TURN, |s| {
        s.contains("queued as a follow-up")
    });
    let screen = tmux.wait_screen("the steered reply", TURN, |s| {
        s.contains("echo: please steer")
    });
    // The streamed line was broken by the typed steer: the finished reply is shown whole.
    assert!(
        screen.matches(slow).count() >= 2,
        "the first reply whole:\n{screen}"
    );
    tmux.wait_screen("the follow-up's reply", TURN, |s| {
        s.contains("echo: later please")
    });
    api.wait_idle(&session.id, TURN);
    let entries = api.transcript(&session.id);
    let follow_up = entries
        .iter()
        .find(|e| user_content(e) == Some("later please"))
        .unwrap_or_else(|| panic!("no follow-up in {}", describe(&entries)));
    assert!(
        matches!(
            &follow_up.payload,
            EntryPayload::Message {
                message: Message::User {
                    lane: Some(Lane::FollowUp),
                    ..
                }
            }
        ),
        "{}",
        describe(&entries)
    );
    let steer = entries
        .iter()
        .find(|e| user_content(e) == Some("please steer"))
        .unwrap_or_else(|| panic!("no steer in {}", describe(&entries)));
    assert!(
        matches!(
            &steer.payload,
            EntryPayload::Message {
                message: Message::User {
                    lane: Some(Lane::Steer),
                    ..
                }
            }
        ),
        "{}",
        describe(&entries)
    );
    // The steered reply appears once.
    let screen = tmux.capture();
    assert_eq!(screen.matches("echo: please steer").count(), 1, "{screen}");

    // Ctrl-C once stops a running turn; twice exits.
    let second = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi";
    tmux.type_line(&fake_directive(
        &json!({"reply": second, "chunks": 14, "delayMs": 400}),
    ));
    tmux.wait_screen("the second reply streaming", TURN, |s| {
        s.matches("alpha beta").count() >= 2
    });
    tmux.send("C-c", false);
    tmux.wait_screen("the stop", TURN, |s| s.contains("stopping the turn"));
    assert!(!tmux.exited(), "one Ctrl-C does not exit");
    // The second one within three seconds of the first.
    tmux.send("C-c", false);
    wait_for("chat to exit after a second Ctrl-C", TURN, || {
        tmux.exited().then_some(())
    });
    api.wait_status(&session.id, Status::Stopped, TURN);
}

/// An approval addressed to the person chatting is asked inline: bob's command on alice's
/// runner waits until alice answers `y` in her `wuhu chat`, then runs.
#[test]
fn chat_asks_the_runner_owner_inline_and_y_approves() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-approve");
    let alice = stack.client("alice", &tenant);
    let bob = stack.client("bob", &tenant);
    let dir = TempDir::new("wuhu-e2e-cli-approve");
    let api_dir = dir.mkdir("api");
    let _mac = Runner::start(
        RunnerConfig::new(stack, "alice", &tenant, "mac")
            .env("api", &api_dir)
            .workspaces_root(dir.mkdir("workspaces")),
    );
    let session = alice.create_fake_session().id;
    let shared = alice.patch(
        &format!("/v1/sessions/{session}"),
        &json!({"access": "tenant"}),
    );
    assert_eq!(shared.status, 200, "{shared}");
    // alice attaches her own environment: nobody is asked.
    let (results, entries) = ToolTurn::start(
        &alice,
        &session,
        &[(
            "request_environment",
            json!({"spec": "mac:api", "name": "api"}),
        )],
    )
    .finish(&alice, TURN);
    assert!(!results[0].is_error, "{}", describe(&entries));

    let bin = wuhu_bin().display().to_string();
    let home = Wuhu::new();
    let tmux = Tmux::start(
        &format!("{bin} chat {session}"),
        &[
            ("WUHU_SERVER", &stack.base_url()),
            ("WUHU_TOKEN", &stack.user_token("alice", &tenant)),
            ("HOME", home.home().to_str().unwrap()),
            ("NO_COLOR", "1"),
        ],
    );
    tmux.wait_screen("the chat banner", TURN, |s| s.contains("Type a message"));

    let marker = api_dir.join("approved-by-alice");
    let turn = ToolTurn::start(
        &bob,
        &session,
        &[(
            "bash",
            json!({"command": format!("touch '{}'", marker.display())}),
        )],
    );
    let screen = tmux.wait_screen("the inline question", TURN, |s| s.contains("? [y/n]"));
    assert!(screen.contains("bob:"), "bob's prompt is shown:\n{screen}");
    assert!(!marker.exists(), "ran before the approval");
    tmux.type_line("y");
    let (results, entries) = turn.finish(&bob, TURN);
    assert!(!results[0].is_error, "{}", describe(&entries));
    assert!(marker.exists(), "the approved command did not run");
    tmux.wait_screen("the decision", TURN, |s| s.contains("approve by alice"));
    tmux.type_line("/quit");
    wait_for("chat to exit on /quit", TURN, || {
        tmux.exited().then_some(())
    });
}

/// `wuhu approvals list/approve/deny` against real pending approvals: bob's commands on
/// alice's runner wait for alice; `approve` lets the first run, `deny` refuses the second, and
/// every `--json` answer parses with the id and decision.
#[test]
fn approvals_approve_and_deny_answer_a_held_call() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-approvals");
    let alice_api = stack.client("alice", &tenant);
    let bob = stack.client("bob", &tenant);
    let alice = user("alice", &tenant);
    let dir = TempDir::new("wuhu-e2e-cli-approvals");
    let api_dir = dir.mkdir("api");
    let _mac = Runner::start(
        RunnerConfig::new(stack, "alice", &tenant, "mac")
            .env("api", &api_dir)
            .workspaces_root(dir.mkdir("workspaces")),
    );
    let session = alice_api.create_fake_session().id;
    let shared = alice_api.patch(
        &format!("/v1/sessions/{session}"),
        &json!({"access": "tenant"}),
    );
    assert_eq!(shared.status, 200, "{shared}");
    let (results, entries) = ToolTurn::start(
        &alice_api,
        &session,
        &[(
            "request_environment",
            json!({"spec": "mac:api", "name": "api"}),
        )],
    )
    .finish(&alice_api, TURN);
    assert!(!results[0].is_error, "{}", describe(&entries));

    for (verb, decision, runs) in [("approve", "approve", true), ("deny", "deny", false)] {
        let marker = api_dir.join(format!("{verb}d-by-alice"));
        let turn = ToolTurn::start(
            &bob,
            &session,
            &[(
                "bash",
                json!({"command": format!("touch '{}'", marker.display())}),
            )],
        );
        let pending = wait_for("the approval waiting", TURN, || {
            let listed = alice
                .run(&["approvals", "list", &session, "--json"])
                .ok()
                .json();
            let approvals = listed["approvals"].as_array().cloned().unwrap_or_default();
            (!approvals.is_empty()).then_some(approvals)
        });
        assert_eq!(pending.len(), 1, "{pending:#?}");
        assert_eq!(pending[0]["approver"]["sub"], "alice", "{pending:#?}");
        let id = pending[0]["approvalId"]
            .as_str()
            .expect("approvalId")
            .to_string();
        assert!(!marker.exists(), "ran before the answer");
        let answer = alice
            .run(&["approvals", verb, &session, &id, "--json"])
            .ok()
            .json();
        assert_eq!(answer["approvalId"], id.as_str(), "{answer}");
        assert_eq!(answer["decision"], decision, "{answer}");
        let (results, entries) = turn.finish(&bob, TURN);
        assert_eq!(results[0].is_error, !runs, "{}", describe(&entries));
        assert_eq!(marker.exists(), runs, "{verb}: {}", describe(&entries));
        let left = alice
            .run(&["approvals", "list", &session, "--json"])
            .ok()
            .json();
        assert_eq!(left["approvals"], json!([]), "{verb}");
    }
}

/// `wuhu chat` across a server restart: the stream resumes by itself, says so once
/// (`disconnected`, then `resumed`), nothing is shown twice, and the chat still sees the turn
/// that took its message end.
#[test]
fn a_chat_across_a_server_restart_resumes_without_loss_and_says_so_once() {
    wuhu_bin();
    let mut stack = Stack::start();
    let tenant = unique_name("cli-chat-restart");
    let relay = Relay::start(port_of(&stack.base_url()));
    let wuhu = Wuhu::new()
        .env("WUHU_SERVER", &relay.url())
        .env("WUHU_TOKEN", &stack.user_token("gil", &tenant));
    let api = stack.client("gil", &tenant);
    let session = api.create_fake_session();
    let reply = "the chat reply that outlived the server";
    let content = fake_directive(&json!({
        "toolCalls": [{"name": "list_sessions"}],
        "afterTools": reply,
        "chunks": 20,
        "delayMs": 400,
    }));
    let mut chat = wuhu.spawn_with_stdin(&["chat", &session.id, "--json"], &format!("{content}\n"));
    wait_for("the reply streaming after the tool result", TURN, || {
        let lines = chat.lines();
        let tool_result = lines.iter().position(|l| l.contains("tool_result"))?;
        lines[tool_result..]
            .iter()
            .any(|l| l.contains("assistant_text_delta"))
            .then_some(())
    });
    stack.restart_killed();
    chat.wait_line("the outage noticed", TURN, |l| {
        l.contains("\"disconnected\"")
    });
    relay.retarget(port_of(&stack.base_url()));
    let status = chat.wait_exit(RESTART);
    assert!(status.success(), "{status:?} {}", chat.stderr());

    let events = follow_events(&chat.lines());
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let n = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!((n("disconnected"), n("resumed")), (1, 1), "{kinds:?}");
    let printed = entries_of(&events);
    let unique: HashSet<u64> = printed.iter().map(|e| e.cursor).collect();
    assert_eq!(
        unique.len(),
        printed.len(),
        "an entry printed twice: {}",
        describe(&printed)
    );
    assert_contiguous(&printed);
    assert!(
        printed
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == reply),
        "{}",
        describe(&printed)
    );
}

/// `sessions fork|compact|usage`, `usage` and `budget`, each with `--json` (the wire types) and
/// in words; a member setting the budget is refused with the server's code.
#[test]
fn fork_compact_usage_and_budget_speak_json_and_words() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("cli-parity");
    let wuhu = user("dora", &tenant);
    let api = stack.client("dora", &tenant);
    let id = api.create_fake_session().id;
    for turn in ["fact: the hint is green", "turn 1", "turn 2", "turn 3"] {
        api.enqueue(&id, "followUp", turn);
        api.wait_idle(&id, TURN);
    }

    let usage = wuhu.run(&["--json", "sessions", "usage", &id]).ok().json();
    assert!(usage["messages"].as_u64().unwrap_or(0) >= 4, "{usage}");
    assert_eq!(usage["byModel"][0]["provider"], "fake", "{usage}");
    assert_eq!(usage["mcp"]["calls"], 0, "{usage}");
    let words = wuhu.run(&["sessions", "usage", &id]).ok();
    assert!(
        words.stdout.contains("fake-echo") && words.stdout.contains("policy: 0 allowed"),
        "{words:?}"
    );

    let fork: SessionInfo = serde_json::from_value(
        wuhu.run(&["--json", "sessions", "fork", &id, "--at", "3"])
            .ok()
            .json(),
    )
    .expect("sessions fork --json is a SessionInfo");
    assert_eq!(fork.forked_from.as_ref().map(|f| f.cursor), Some(3));
    // Without --at, the whole history; in words, the new id alone.
    let whole = wuhu
        .run(&["sessions", "fork", &id, "--title", "all of it"])
        .ok();
    let whole_id = whole.stdout.trim().to_string();
    assert_eq!(whole_id.len(), 36, "{whole:?}");
    assert_eq!(
        api.session(&whole_id).session.title.as_deref(),
        Some("all of it")
    );
    let past = wuhu.run(&["sessions", "fork", &id, "--at", "9999"]);
    assert_eq!(past.code(), 1, "{past:?}");

    let compacted = wuhu
        .run(&[
            "--json",
            "sessions",
            "compact",
            &id,
            "--instructions",
            "keep the hint",
        ])
        .ok()
        .json();
    assert_eq!(compacted["compaction"]["reason"], "manual", "{compacted}");
    assert!(
        compacted["compaction"]["summary"]
            .as_str()
            .unwrap_or_default()
            .contains("the hint is green"),
        "{compacted}"
    );

    let tenant_usage = wuhu
        .run(&["--json", "usage", "--by", "session"])
        .ok()
        .json();
    assert_eq!(tenant_usage["by"], "session", "{tenant_usage}");
    // By UTC day: today's row holds this session's replies.
    let by_day = wuhu.run(&["--json", "usage", "--by", "day"]).ok().json();
    assert_eq!(by_day["by"], "day", "{by_day}");
    let today = {
        let day = wuhu_core::civil_time::CivilTime::from_unix(wuhu_e2e::util::unix_now());
        format!("{:04}-{:02}-{:02}", day.year, day.month, day.day)
    };
    assert!(
        by_day["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["key"] == today.as_str())),
        "{by_day}"
    );
    let budget = wuhu.run(&["--json", "budget"]).ok().json();
    assert_eq!(budget["budget"], Value::Null, "{budget}");
    let refused = wuhu.run(&["budget", "--max-usd", "5"]);
    assert_eq!(refused.code(), 2, "{refused:?}");
    let admin = Wuhu::new()
        .env("WUHU_SERVER", &stack.base_url())
        .env("WUHU_TOKEN", &stack.admin_token("root", &tenant));
    let set = admin
        .run(&["--json", "budget", "--max-usd", "5"])
        .ok()
        .json();
    assert_eq!(set["budget"]["maxUsd"], 5.0, "{set}");
    let words = admin.run(&["budget"]).ok();
    assert!(
        words.stdout.contains("budget: no token limit, $5.0000"),
        "{words:?}"
    );
    let cleared = admin.run(&["--json", "budget", "--clear"]).ok().json();
    assert_eq!(cleared["budget"], Value::Null, "{cleared}");
}

#[test]
fn channels_are_added_listed_mapped_and_removed_by_admins_only() {
    let stack = stack();
    let tenant = unique_name("cli-channels");
    let admin = Wuhu::new()
        .env("WUHU_SERVER", &stack.base_url())
        .env("WUHU_TOKEN", &stack.admin_token("root", &tenant));
    let secret = format!("generic-{}", wuhu_e2e::util::random_hex(12));
    let binding = json!({"platform": "generic", "name": "from the cli",
        "credentials": {"secret": secret, "replyUrl": "http://127.0.0.1:9/reply"}});
    // The credentials go on stdin, never on the command line.
    let added = admin
        .run_with_stdin(&["--json", "channels", "add"], &binding.to_string())
        .ok()
        .json();
    let id = added["id"].as_str().expect("id").to_string();
    assert!(!added.to_string().contains(&secret), "{added}");
    let words = admin.run(&["channels", "show", &id]).ok();
    assert!(
        words.stdout.contains("from the cli") && words.stdout.contains("webhook: "),
        "{words:?}"
    );
    assert!(!words.stdout.contains(&secret), "{words:?}");
    let listed = admin.run(&["--json", "channels", "list"]).ok().json();
    assert_eq!(listed["channels"][0]["id"], id.as_str(), "{listed}");

    let mapped = admin
        .run(&[
            "--json",
            "channels",
            "members",
            &id,
            "--map",
            "u-1=alice",
            "--map",
            "u-2=bob",
        ])
        .ok()
        .json();
    assert_eq!(
        mapped["members"],
        json!([{"user": "u-1", "sub": "alice"}, {"user": "u-2", "sub": "bob"}])
    );
    let words = admin.run(&["channels", "members", &id]).ok();
    assert!(
        words.stdout.contains("u-2") && words.stdout.contains("bob"),
        "{words:?}"
    );
    // A usage error (exit 1), before any request.
    let bad = admin.run(&["channels", "members", &id, "--map", "no-equals"]);
    assert_eq!(bad.code(), 1, "{bad:?}");

    // A member may not see or change bindings: the server's 403 (exit 2), nothing changed.
    let member = user("alice", &tenant);
    let refused = member.run(&["channels", "list"]);
    assert_eq!(refused.code(), 2, "{refused:?}");
    assert!(refused.stderr.contains("403"), "{refused:?}");
    let refused = member.run(&["channels", "rm", &id]);
    assert_eq!(refused.code(), 2, "{refused:?}");

    let cleared = admin
        .run(&["--json", "channels", "members", &id, "--clear"])
        .ok()
        .json();
    assert_eq!(cleared["members"], json!([]));
    admin.run(&["channels", "rm", &id]).ok();
    let listed = admin.run(&["--json", "channels", "list"]).ok().json();
    assert_eq!(listed["channels"], json!([]), "{listed}");
}
