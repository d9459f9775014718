//! Secrets end to end (issue 32, `docs/security.md` "Secrets"): set once through the API,
//! listed without values, used by reference by `bash` in an environment whose definition asks
//! for them, and masked — raw, base64, hex, `env`, split across two `printf`s — in the tool
//! result, the stored transcript and a job's report; a secret goes only where its rules allow
//! (the tenant's to the environments it names, a member cannot set the tenant's), and a
//! user's secret is nobody else's to list or delete.
//!
//! One `wrangler dev` for the file (the shared fake stack); every test has its own tenant and
//! runner.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use wuhu_core::wire::custom_types;
use wuhu_e2e::entries::customs;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::{random_hex, unique_name};
use wuhu_e2e::{Api, Stack, StackOptions};

const TURN: Duration = Duration::from_secs(120);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

#[track_caller]
fn put_secret(api: &Api, name: &str, body: Value) -> wuhu_e2e::Response {
    api.send(
        api.request("PUT", &format!("/v1/secrets/{name}"))
            .json(&body),
    )
}

#[track_caller]
fn define(api: &Api, body: Value) {
    let response = api.post("/v1/environments", &body);
    assert_eq!(response.status, 201, "define {body}: {response}");
}

/// Every encoding of `value` the test's commands print.
fn encodings(value: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    vec![
        value.to_string(),
        b64.encode(format!("{value}\n")),
        b64.encode(value),
        value.bytes().map(|b| format!("{b:02x}")).collect(),
    ]
}

#[test]
fn a_secret_reaches_commands_and_never_the_transcript() {
    let tenant = unique_name("secrets");
    let alice = stack().client("alice", &tenant);
    let value = format!("ghp_{}", random_hex(18));

    // Set: the answer and the list name it, never hold its value.
    let set = put_secret(&alice, "GITHUB_TOKEN", json!({"value": value}));
    assert_eq!(set.status, 200, "{set}");
    assert!(!set.text().contains(&value), "{set}");
    assert_eq!(set.json()["scope"], "user");
    assert_eq!(set.json()["owner"], "alice");
    let listed = alice.get("/v1/secrets");
    assert_eq!(listed.status, 200, "{listed}");
    assert!(!listed.text().contains(&value), "{listed}");
    assert_eq!(
        listed.json()["secrets"][0]["name"],
        "GITHUB_TOKEN",
        "{listed}"
    );

    let dir = TempDir::new("wuhu-e2e-secrets");
    let work = dir.mkdir("work");
    let _runner =
        Runner::start(RunnerConfig::new(stack(), "alice", &tenant, "mac").env("work", &work));
    define(
        &alice,
        json!({"name": "ci", "kind": "local", "runner": "mac", "path": work, "secrets": ["GITHUB_TOKEN"]}),
    );
    let id = alice.create_fake_session().id;
    let attach = alice.run_tool(&id, "request_environment", json!({"spec": "ci"}), TURN);
    assert!(!attach.is_error, "{}", attach.content);

    // The command gets the value (its digest proves it without printing it) and prints it in
    // every way the test knows; only placeholders come back.
    let digest: String = Sha256::digest(value.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let command = r#"printf %s "$GITHUB_TOKEN" | sha256sum
echo "raw $GITHUB_TOKEN"
echo "$GITHUB_TOKEN" | base64
printf %s "$GITHUB_TOKEN" | base64
printf %s "$GITHUB_TOKEN" | od -An -tx1 | tr -d ' \n'; echo
env | grep GITHUB_TOKEN
printf '%s' "${GITHUB_TOKEN:0:11}"; printf '%s\n' "${GITHUB_TOKEN:11}"
printf 'job %s\n' "$GITHUB_TOKEN" > leak.txt"#;
    let out = alice.run_tool(&id, "bash", json!({"command": command}), TURN);
    assert!(!out.is_error, "{}", out.content);
    assert!(
        out.content.contains(&digest),
        "the command did not get the value: {}",
        out.content
    );
    for shown in encodings(&value) {
        assert!(
            !out.content.contains(&shown),
            "{shown:?} leaked: {}",
            out.content
        );
    }
    let placeholders = out.content.matches("[secret:GITHUB_TOKEN]").count();
    assert!(
        placeholders >= 6,
        "{placeholders} placeholders in {}",
        out.content
    );

    // A later call of the session that was not given the secret (a `read` of a file a command
    // wrote it into) is masked too, and so is a job's report.
    let read = alice.run_tool(&id, "read", json!({"path": "leak.txt"}), TURN);
    assert!(!read.is_error, "{}", read.content);
    assert!(!read.content.contains(&value), "{}", read.content);
    assert!(
        read.content.contains("job [secret:GITHUB_TOKEN]"),
        "{}",
        read.content
    );
    let job = alice.run_tool(
        &id,
        "bash",
        json!({"command": "echo \"from a job $GITHUB_TOKEN\"", "background": true}),
        TURN,
    );
    assert!(!job.is_error, "{}", job.content);
    let ended = alice.wait_transcript(&id, "the job's end", TURN, |entries| {
        serde_json::to_string(entries)
            .unwrap()
            .contains("wuhu_job_finished_v1")
    });
    let stored = serde_json::to_string(&ended).unwrap();
    assert!(
        stored.contains("from a job [secret:GITHUB_TOKEN]"),
        "{stored}"
    );

    // A person who pastes it into a message anyway: the queue, the transcript and the model
    // get the placeholder.
    alice.enqueue(
        &id,
        "followUp",
        &format!("here is my token {value}, use it"),
    );
    alice.wait_transcript(&id, "the pasted message", TURN, |entries| {
        serde_json::to_string(entries)
            .unwrap()
            .contains("here is my token [secret:GITHUB_TOKEN], use it")
    });
    alice.wait_idle(&id, TURN);
    let stored = serde_json::to_string(&alice.transcript(&id)).unwrap();

    // Nothing stored or served holds it: the transcript, the session's page, and no file of
    // the Worker's state at all (Durable Objects' SQLite, R2: archive segments, blobs, logs;
    // the tenant's index holds it sealed only).
    for shown in encodings(&value) {
        assert!(!stored.contains(&shown), "{shown:?} is in the transcript");
        let page = alice.get(&format!("/v1/sessions/{id}?sinceCursor=0&limit=1000"));
        assert!(
            !page.text().contains(&shown),
            "{shown:?} is in the session page"
        );
    }
    let needles = encodings(&value);
    let needles: Vec<&[u8]> = needles.iter().map(|n| n.as_bytes()).collect();
    let found = wuhu_e2e::util::files_containing(stack().persist_dir(), &needles);
    assert!(found.is_empty(), "the value is stored in {found:?}");
}

#[test]
fn secrets_go_only_where_their_rules_allow() {
    let tenant = unique_name("secrets-rules");
    let root = stack().admin_client("root", &tenant);
    let alice = stack().client("alice", &tenant);
    let bob = stack().client("bob", &tenant);

    // Bad input is a 400 that says why; a member cannot set the tenant's secrets.
    for (name, body, needle) in [
        ("lower", json!({"value": "x"}), "environment variable name"),
        ("WUHU_X", json!({"value": "x"}), "runner's own"),
        ("EMPTY", json!({"value": ""}), "must not be empty"),
        (
            "HOSTS",
            json!({"value": "x", "hosts": ["https://x"]}),
            "not a host name",
        ),
        (
            "BIG",
            json!({"value": "v".repeat(16 * 1024 + 1)}),
            "at most 16384",
        ),
    ] {
        let refused = put_secret(&alice, name, body);
        assert_eq!(refused.status, 400, "{name}: {refused}");
        assert!(refused.text().contains(needle), "{name}: {refused}");
    }
    let member = put_secret(
        &alice,
        "DEPLOY",
        json!({"value": "d-value-123", "scope": "tenant"}),
    );
    assert_eq!(member.status, 403, "{member}");

    let deploy = format!("deploy-{}", random_hex(12));
    let set = put_secret(
        &root,
        "DEPLOY",
        json!({"value": deploy, "scope": "tenant", "environments": ["ci"]}),
    );
    assert_eq!(set.status, 200, "{set}");
    assert_eq!(
        put_secret(&alice, "MINE", json!({"value": "alice-own-1"})).status,
        200
    );

    // Everyone sees the tenant's names; a user's own secret only its user.
    let names = |api: &Api| -> Vec<String> {
        let list = api.get("/v1/secrets").json();
        list["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{}:{}",
                    s["scope"].as_str().unwrap(),
                    s["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(names(&alice), ["tenant:DEPLOY", "user:MINE"]);
    assert_eq!(names(&bob), ["tenant:DEPLOY"]);
    // Bob deletes only his own: alice's is not his to find.
    assert_eq!(
        bob.send(bob.request("DELETE", "/v1/secrets/MINE")).status,
        404
    );
    assert_eq!(
        bob.send(bob.request("DELETE", "/v1/secrets/DEPLOY?scope=tenant"))
            .status,
        403
    );

    // The tenant's secret reaches `ci`, which it names, and not `other`, which asks for it too.
    let dir = TempDir::new("wuhu-e2e-secrets-rules");
    let work = dir.mkdir("work");
    let _runner =
        Runner::start(RunnerConfig::new(stack(), "alice", &tenant, "mac").env("work", &work));
    for name in ["ci", "other"] {
        define(
            &alice,
            json!({"name": name, "kind": "local", "runner": "mac", "path": work, "secrets": ["DEPLOY"]}),
        );
    }
    define(
        &alice,
        json!({"name": "unset", "kind": "local", "runner": "mac", "path": work, "secrets": ["NOPE"]}),
    );
    let id = alice.create_fake_session().id;
    for name in ["ci", "other", "unset"] {
        let attach = alice.run_tool(&id, "request_environment", json!({"spec": name}), TURN);
        assert!(!attach.is_error, "{name}: {}", attach.content);
    }
    let run = |environment: &str| {
        alice.run_tool(
            &id,
            "bash",
            json!({"environment": environment, "command": "echo \"deploy=${DEPLOY:-none}\""}),
            TURN,
        )
    };
    let ci = run("ci");
    assert!(!ci.is_error, "{}", ci.content);
    assert!(
        ci.content.contains("deploy=[secret:DEPLOY]"),
        "{}",
        ci.content
    );
    let other = run("other");
    assert!(other.is_error, "{}", other.content);
    assert!(
        other
            .content
            .contains("does not name the environment \"other\""),
        "{}",
        other.content
    );
    let unset = run("unset");
    assert!(unset.is_error, "{}", unset.content);
    assert!(
        unset
            .content
            .contains("asks for secret NOPE, which is not set"),
        "{}",
        unset.content
    );

    // Deleted: the next step's reading no longer has it.
    let deleted = root.send(root.request("DELETE", "/v1/secrets/DEPLOY?scope=tenant"));
    assert_eq!(deleted.status, 200, "{deleted}");
    let after = run("ci");
    assert!(after.is_error, "{}", after.content);
    assert!(
        after
            .content
            .contains("asks for secret DEPLOY, which is not set"),
        "{}",
        after.content
    );
}

/// What a `js` call that prints `value` returns: `[secret:NAME]` exactly when the session could
/// open the secret (its masker has the value), so no runner is needed to see a key work. The
/// script joins the value from two halves: written whole, the message asking for the call would
/// be masked before the script ever ran.
#[track_caller]
fn printed(api: &Api, value: &str) -> String {
    let id = api.create_fake_session().id;
    let (head, tail) = value.split_at(value.len() / 2);
    let result = api.run_tool(
        &id,
        "js",
        json!({"code": format!("console.log({head:?} + {tail:?}); 1")}),
        TURN,
    );
    assert!(!result.is_error, "{}", result.content);
    result.content
}

/// Rotating `WUHU_SECRETS_KEY` (docs/deploy.md): with the old key kept as
/// `WUHU_SECRETS_KEY_PREVIOUS`, every secret still opens and each one read is sealed again under
/// the new key, so the old key can go; a secret nobody read before the old key went no longer
/// opens (the failure the procedure avoids).
#[test]
fn rotating_the_key_keeps_every_secret_that_was_read() {
    let mut stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let read = unique_name("rotate-read");
    let unread = unique_name("rotate-unread");
    let (kept, lost) = (
        format!("kept-{}", random_hex(12)),
        format!("lost-{}", random_hex(12)),
    );
    for (tenant, value) in [(&read, &kept), (&unread, &lost)] {
        let api = stack.client("ana", tenant);
        assert_eq!(
            put_secret(&api, "TOKEN", json!({"value": value})).status,
            200
        );
        assert!(printed(&api, value).contains("[secret:TOKEN]"));
    }

    // A new key, the old one kept: both tenants' secrets still open; one tenant's are read.
    let old = stack.set_secrets_key(random_hex(32));
    stack.set_var("WUHU_SECRETS_KEY_PREVIOUS", Some(&old));
    stack.restart();
    let api = stack.client("ana", &read);
    assert!(printed(&api, &kept).contains("[secret:TOKEN]"));
    assert_eq!(api.get("/v1/secrets").status, 200);

    // The old key gone: what was read was sealed again and opens; the other does not.
    stack.set_var("WUHU_SECRETS_KEY_PREVIOUS", None);
    stack.restart();
    let api = stack.client("ana", &read);
    let shown = printed(&api, &kept);
    assert!(
        shown.contains("[secret:TOKEN]") && !shown.contains(&kept),
        "{shown}"
    );
    let api = stack.client("ana", &unread);
    let shown = printed(&api, &lost);
    assert!(
        shown.contains(&lost),
        "an unread secret opened without its key: {shown}"
    );
    // The log line may land after the answer: wait for it.
    let said = wuhu_e2e::wait_until(Duration::from_secs(10), || {
        stack
            .log_tail(400)
            .contains("secret TOKEN is not masked: a secret does not open")
            .then_some(())
    });
    assert!(
        said.is_ok(),
        "the server did not say why:\n{}",
        stack.log_tail(40)
    );
}

/// Authority travels (decision 0031): alice's own secret goes only into turns that act for
/// alice alone. Bob prompting her shared session (with her approval to use her machine) gets
/// the tool error, never the value; alice's own turn in the same session gets it. (A chat
/// guest's turn reaches no runner and no network at all, decision 0035; a child acts for whom
/// its parent's turn acted for, `wuhu_core::secrets::choose`'s table.)
#[test]
fn another_members_turn_never_uses_alices_own_secret() {
    let tenant = unique_name("secrets-member");
    let alice = stack().client("alice", &tenant);
    let bob = stack().client("bob", &tenant);
    let value = format!("alice-{}", random_hex(12));
    assert_eq!(
        put_secret(&alice, "GITHUB_TOKEN", json!({"value": value})).status,
        200
    );
    let dir = TempDir::new("wuhu-e2e-secrets-member");
    let work = dir.mkdir("work");
    let _runner =
        Runner::start(RunnerConfig::new(stack(), "alice", &tenant, "mac").env("work", &work));
    define(
        &alice,
        json!({"name": "ci", "kind": "local", "runner": "mac", "path": work, "secrets": ["GITHUB_TOKEN"]}),
    );
    let id = alice.create_fake_session().id;
    let shared = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}));
    assert_eq!(shared.status, 200, "{shared}");
    let attach = alice.run_tool(&id, "request_environment", json!({"spec": "ci"}), TURN);
    assert!(!attach.is_error, "{}", attach.content);
    let echo = || {
        (
            "bash",
            json!({"command": "echo \"token=${GITHUB_TOKEN:-none}\""}),
        )
    };

    // Bob's turn reaches alice's machine only once she says yes, and still gets no value.
    let turn = ToolTurn::start(&bob, &id, &[echo()]);
    let request = alice
        .wait_transcript(&id, "the approval request", TURN, |entries| {
            !customs(entries, custom_types::APPROVAL_REQUESTED).is_empty()
        })
        .iter()
        .find_map(|e| match wuhu_e2e::entries::custom(e) {
            Some((t, data)) if t == custom_types::APPROVAL_REQUESTED => Some(data.clone()),
            _ => None,
        })
        .unwrap();
    let approval = request["approvalId"].as_str().unwrap();
    let answered = alice.post(
        &format!("/v1/sessions/{id}/approvals/{approval}"),
        &json!({"decision": "approve"}),
    );
    assert_eq!(answered.status, 200, "{answered}");
    let (results, _) = turn.finish(&bob, TURN);
    assert!(results[0].is_error, "{}", results[0].content);
    assert!(
        results[0]
            .content
            .contains("asks for secret GITHUB_TOKEN, which is not set"),
        "{}",
        results[0].content
    );

    // Alice's own turn in the same session gets it.
    let own = alice.run_tool(&id, echo().0, echo().1, TURN);
    assert!(!own.is_error, "{}", own.content);
    assert!(
        own.content.contains("token=[secret:GITHUB_TOKEN]"),
        "{}",
        own.content
    );
    let stored = serde_json::to_string(&alice.transcript(&id)).unwrap();
    assert!(!stored.contains(&value));
}

/// A model that says a tenant's secret, one character per streamed delta (thinking and tool
/// calls around it): followers are shown `[secret:NAME]` and never a piece of the value long
/// enough to read, the stored messages are exactly what was shown, and the request logs in R2
/// hold the placeholder where the provider's stream held the value (split over its events).
#[test]
fn a_secret_the_model_streams_reaches_no_follower_transcript_or_request_log() {
    let tenant = unique_name("secrets-stream");
    let alice = stack().client("alice", &tenant);
    let admin = stack().admin_client("root", &tenant);
    admin
        .put_doc("config/tenant.json", r#"{"llmRequestLogs":true}"#)
        .expect_status(200);
    let value = format!("dk-{}-{}", random_hex(8), random_hex(8));
    let set = put_secret(&alice, "DEPLOY_KEY", json!({"value": value}));
    assert_eq!(set.status, 200, "{set}");
    let placeholder = "[secret:DEPLOY_KEY]";
    // Halves of the value: what a reader could put together.
    let (head, tail) = value.split_at(value.len() / 2);

    let model = unique_name("claude-says-secret");
    let said = format!("Your deploy key is {value}; I will list your sessions.");
    stack().openai().script(
        &model,
        [
            wuhu_e2e::Reply::tool_calls([("list_sessions", json!({"limit": 1}))])
                .with_text(said.clone())
                .with_text_parts(said.len())
                .with_thinking(&format!("they want {value} repeated"), "c2lnbmF0dXJl"),
            wuhu_e2e::Reply::text(format!("All done, {value} stays with you.")).with_text_parts(64),
        ],
    );
    let id = alice
        .create_session(json!({"provider": "anthropic", "model": model}))
        .id;
    let mut follow = alice.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    alice.enqueue(&id, "followUp", "what is my deploy key?");
    let events = follow.collect_until(TURN, |e| {
        e.event == "entry_appended" && e.raw_data.contains("All done")
    });
    alice.wait_idle(&id, TURN);

    // The follow stream: deltas and entries alike.
    let shown: String = events.iter().filter_map(|e| e.delta()).collect();
    assert!(shown.contains(placeholder), "{shown}");
    for event in &events {
        for piece in [value.as_str(), head, tail] {
            assert!(
                !event.raw_data.contains(piece),
                "{piece:?} reached a follower: {}",
                event.raw_data
            );
        }
    }
    // The transcript: each assistant text is what followers were shown, nothing more.
    let transcript = alice.transcript(&id);
    let stored = serde_json::to_string(&transcript).unwrap();
    for piece in [value.as_str(), head, tail] {
        assert!(!stored.contains(piece), "{piece:?} is in the transcript");
    }
    let texts: String = wuhu_e2e::entries::assistants(&transcript)
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            wuhu_core::wire::ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, shown);
    assert_eq!(
        shown,
        format!(
            "Your deploy key is {placeholder}; I will list your sessions.\
             All done, {placeholder} stays with you."
        )
    );
    assert!(
        stored.contains(&format!("they want {placeholder} repeated")),
        "{stored}"
    );

    // The request logs (R2): both requests, the value split over the first one's events.
    let listed = admin.get(&format!("/v1/llm-logs?session={id}")).json();
    let records = listed["records"].as_array().cloned().unwrap_or_default();
    assert_eq!(records.len(), 2, "{listed}");
    let mut placeholders = 0;
    for record in records {
        let name = record["name"].as_str().unwrap();
        let logged = admin.get(&format!("/v1/llm-logs/{name}"));
        assert_eq!(logged.status, 200, "{logged}");
        let text = logged.text();
        for piece in [value.as_str(), head, tail] {
            assert!(!text.contains(piece), "{piece:?} is in {name}: {text}");
        }
        placeholders += text.matches(placeholder).count();
    }
    // The first response's stream, the second request's context (the first reply, and the
    // second's stream).
    assert!(placeholders >= 3, "{placeholders}");
}
