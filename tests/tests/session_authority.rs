//! Who may do what to a session inside a tenant (docs/security.md): owners, access, group chat,
//! the workspace's `users/<sub>/`, and what a session's tools see. Users alice, bob (members),
//! root (admin) in one tenant, and mallory in another. One `wrangler dev` for the file; every
//! test uses its own tenants.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{EntryPayload, Message, custom_types};
use wuhu_e2e::entries::{customs, describe};
use wuhu_e2e::fake_openai::Reply;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack};

const TURN: Duration = Duration::from_secs(60);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

/// The people of one test: alice, bob and carol (members) and root (admin) in one tenant,
/// mallory in another.
struct People {
    alice: Api,
    bob: Api,
    carol: Api,
    root: Api,
    mallory: Api,
}

fn people(prefix: &str) -> People {
    let stack = stack();
    let tenant = unique_name(prefix);
    People {
        alice: stack.client("alice", &tenant),
        bob: stack.client("bob", &tenant),
        carol: stack.client("carol", &tenant),
        root: stack.admin_client("root", &tenant),
        mallory: stack.client("alice", &unique_name("other")),
    }
}

/// Each action a person can try on a session, as (name, method, path, body).
fn actions(id: &str) -> Vec<(&'static str, &'static str, String, Option<Value>)> {
    vec![
        ("read", "GET", format!("/v1/sessions/{id}"), None),
        ("stats", "GET", format!("/v1/sessions/{id}/stats"), None),
        (
            "follow",
            "GET",
            format!("/v1/sessions/{id}/follow?stopAfterIdle=1&timeoutSeconds=5"),
            None,
        ),
        (
            "prompt",
            "POST",
            format!("/v1/sessions/{id}/enqueue?lane=followUp"),
            Some(json!({"content": "hello"})),
        ),
        (
            "rename",
            "PATCH",
            format!("/v1/sessions/{id}"),
            Some(json!({"title": "renamed"})),
        ),
        (
            "stop",
            "POST",
            format!("/v1/sessions/{id}/stop"),
            Some(json!({})),
        ),
        (
            "approve",
            "POST",
            format!("/v1/sessions/{id}/approvals/00000000-0000-4000-8000-000000000000"),
            Some(json!({"decision": "approve"})),
        ),
    ]
}

fn call(api: &Api, method: &str, path: &str, body: &Option<Value>) -> wuhu_e2e::http::Response {
    let mut request = api.request(method, path).timeout(Duration::from_secs(20));
    if let Some(body) = body {
        request = request.json(body);
    }
    api.send(request)
}

fn listed(api: &Api, id: &str) -> bool {
    api.list_sessions("limit=200")
        .sessions
        .iter()
        .any(|s| s.id == id)
}

/// The whole table: every person × every action × both access modes. A private session is
/// invisible (404, with the same message as a session that does not exist) to everyone but its
/// owner, creator and admins; in a tenant session members may read and prompt, not manage.
#[test]
fn who_may_do_what_to_a_session() {
    let _guard = stack().guard();
    let p = people("authz");
    // carol creates it for the tenant, alice prompts first: alice owns it, carol keeps her
    // rights as creator.
    let session = p.carol.create_fake_session();
    let opened = p.carol.patch(
        &format!("/v1/sessions/{}", session.id),
        &json!({"access": "tenant"}),
    );
    assert_eq!(opened.status, 200, "{opened}");
    assert_eq!(
        p.carol.session(&session.id).session.owner,
        "carol",
        "the creator owns it until someone prompts"
    );
    p.alice.enqueue(&session.id, "followUp", "mine now");
    let info = p.alice.wait_idle(&session.id, TURN).session;
    assert_eq!(info.owner, "alice", "the first prompter owns the session");
    assert_eq!(info.created_by, "carol");

    let missing = p
        .alice
        .get("/v1/sessions/00000000-0000-4000-8000-00000000dead");
    let not_found_message = missing.expect_error(404).message;

    // (person, access) → statuses for read, stats, follow, prompt, rename, stop, approve.
    // "approve" on an unknown approval id is 404 for everyone; only the message differs.
    let allowed = [200, 200, 200, 200, 200, 200, 404];
    let hidden = [404; 7];
    let member_in_group = [200, 200, 200, 200, 403, 403, 404];
    for access in ["private", "tenant"] {
        let patched = p.alice.patch(
            &format!("/v1/sessions/{}", session.id),
            &json!({"access": access}),
        );
        assert_eq!(patched.status, 200, "{patched}");
        let group = access == "tenant";
        let table: [(&str, &Api, [u16; 7]); 5] = [
            ("alice (owner)", &p.alice, allowed),
            ("carol (creator)", &p.carol, allowed),
            ("root (admin)", &p.root, allowed),
            (
                "bob (member)",
                &p.bob,
                if group { member_in_group } else { hidden },
            ),
            ("mallory (other tenant)", &p.mallory, hidden),
        ];
        for (who, api, want) in table {
            for ((action, method, path, body), want) in actions(&session.id).into_iter().zip(want) {
                let response = call(api, method, &path, &body);
                assert_eq!(
                    response.status, want,
                    "{who} {action} on a {access} session: {response}"
                );
                if want >= 400 {
                    let error = response.expect_error(want);
                    if want == 404 && action != "approve" {
                        assert_eq!(
                            error.message, not_found_message,
                            "{who} {action}: existence leaked"
                        );
                    }
                    if want == 403 {
                        assert_eq!(error.code, "forbidden");
                    }
                }
            }
            let expect_listed = want[0] == 200;
            assert_eq!(
                listed(api, &session.id),
                expect_listed,
                "{who} lists a {access} session"
            );
        }
        // Let the prompts of this round finish (or be stopped) before the next round.
        wuhu_e2e::wait_for("the session to settle", TURN, || {
            let page = p.alice.session(&session.id);
            (page.session.status != wuhu_core::wire::Status::Running && page.queue.is_empty())
                .then_some(())
        });
    }
    // Only the owner, the creator or an admin changes access; bob cannot make it private.
    for (who, api, want) in [
        ("bob", &p.bob, 403),
        ("root", &p.root, 200),
        ("carol", &p.carol, 200),
    ] {
        let response = api.patch(
            &format!("/v1/sessions/{}", session.id),
            &json!({"access": "tenant"}),
        );
        assert_eq!(response.status, want, "{who} changes access: {response}");
    }
    let bad = p.alice.patch(
        &format!("/v1/sessions/{}", session.id),
        &json!({"access": "public"}),
    );
    bad.expect_error(400);
    let empty = p
        .alice
        .patch(&format!("/v1/sessions/{}", session.id), &json!({}));
    empty.expect_error(400);
}

/// In a group session bob may cancel what he queued, never what alice queued.
#[test]
fn members_cancel_only_their_own_queued_items() {
    let _guard = stack().guard();
    let p = people("cancel");
    let session = p.alice.create_fake_session();
    p.alice.patch(
        &format!("/v1/sessions/{}", session.id),
        &json!({"access": "tenant"}),
    );
    // A slow first turn keeps the followUps queued.
    let slow = wuhu_e2e::entries::fake_directive(
        &json!({"reply": "a slow reply in chunks", "delayMs": 400, "chunks": 5}),
    );
    p.alice.enqueue(&session.id, "followUp", &slow);
    let alices = p.alice.enqueue(&session.id, "followUp", "alice waits");
    let bobs = p.bob.enqueue(&session.id, "followUp", "bob waits");
    let response = p.bob.cancel(&session.id, &alices);
    assert_eq!(response.status, 403, "{response}");
    let response = p.bob.cancel(&session.id, &bobs);
    assert_eq!(response.status, 200, "{response}");
    let page = p.alice.wait_idle(&session.id, TURN);
    let entries = p.alice.transcript(&session.id);
    let text = describe(&entries);
    assert!(text.contains("alice waits"), "{text}");
    assert!(!text.contains("bob waits"), "{text}");
    assert_eq!(page.session.owner, "alice");
}

fn user_messages(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Seed 001: the first time someone other than the owner prompts, one reminder is appended;
/// user messages after it reach the LLM as `[name]:\n\n…`, earlier ones unchanged; the
/// transcript keeps raw content and authors.
#[test]
fn group_chat_escalation_reaches_the_llm() {
    let stack = stack();
    let _guard = stack.guard();
    let p = people("group");
    let model = unique_name("group-model");
    stack.openai().script_always(&model, Reply::text("noted"));
    let session = p
        .alice
        .create_session(json!({"provider": "openai-compatible", "model": model}));
    p.alice.patch(
        &format!("/v1/sessions/{}", session.id),
        &json!({"access": "tenant"}),
    );
    for (api, text) in [
        (&p.alice, "one"),
        (&p.alice, "two"),
        (&p.bob, "three"),
        (&p.alice, "four"),
        (&p.carol, "five"),
    ] {
        api.enqueue(&session.id, "followUp", text);
        p.alice.wait_idle(&session.id, TURN);
    }
    let entries = p.alice.transcript(&session.id);
    let text = describe(&entries);
    // Exactly one reminder, right before bob's first message.
    let reminders: Vec<usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(&e.payload, EntryPayload::Message { message: Message::CustomMessage { custom_type, .. } } if custom_type == custom_types::GROUP_CHAT_REMINDER))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(reminders.len(), 1, "{text}");
    let next = &entries[reminders[0] + 1];
    assert!(
        matches!(&next.payload, EntryPayload::Message { message: Message::User { author, content, .. } } if author == "bob" && content == "three"),
        "the transcript keeps bob's raw message after the reminder:\n{text}"
    );
    if let EntryPayload::Message {
        message: Message::CustomMessage {
            content, details, ..
        },
    } = &entries[reminders[0]].payload
    {
        assert!(
            content.contains("alice") && content.contains("bob"),
            "{content}"
        );
        assert_eq!(details.as_ref().unwrap()["owner"], "alice");
    }
    // What the LLM saw on the last request.
    let requests = stack.openai().requests_for(&model);
    assert_eq!(requests.len(), 5);
    let seen = user_messages(&requests[4].messages());
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert_eq!(seen[0], "one");
    assert_eq!(seen[1], "two");
    assert!(
        seen[2].contains("group chat"),
        "the reminder is a user message: {seen:?}"
    );
    assert_eq!(seen[3], "[bob]:\n\nthree");
    assert_eq!(seen[4], "[alice]:\n\nfour");
    assert_eq!(seen[5], "[carol]:\n\nfive");
    // Before bob joined, nothing was prefixed.
    assert_eq!(user_messages(&requests[1].messages()), ["one", "two"]);
    assert_eq!(p.alice.session(&session.id).session.owner, "alice");
    assert!(
        customs(&entries, custom_types::GROUP_CHAT_REMINDER).is_empty(),
        "the reminder is a message, not a notice"
    );
}

/// The fake provider sees rendered messages like any provider: its echo shows the prefix.
#[test]
fn the_fake_provider_echoes_the_author_prefix() {
    let _guard = stack().guard();
    let p = people("fakegroup");
    let session = p.alice.create_fake_session();
    p.alice.patch(
        &format!("/v1/sessions/{}", session.id),
        &json!({"access": "tenant"}),
    );
    p.alice.enqueue(&session.id, "followUp", "first");
    p.alice.wait_idle(&session.id, TURN);
    p.bob.enqueue(&session.id, "followUp", "bob here");
    p.alice.wait_idle(&session.id, TURN);
    let entries = p.alice.transcript(&session.id);
    let last = wuhu_e2e::entries::assistants(&entries)
        .last()
        .map(|m| m.text())
        .unwrap_or_default();
    assert!(
        last.contains("[bob]:"),
        "echo: {last:?}\n{}",
        describe(&entries)
    );
}

/// `users/<sub>/…` is writable only by `<sub>` and admins: through the API, the `write` tool
/// and js. Everything else stays tenant-wide.
#[test]
fn users_documents_belong_to_their_user() {
    let _guard = stack().guard();
    let p = people("docs");
    let path = "users/alice/context.md";
    for (who, api, want) in [
        ("bob", &p.bob, 403),
        ("alice", &p.alice, 200),
        ("root", &p.root, 200),
        ("bob on his own", &p.bob, 200),
    ] {
        let target = if who == "bob on his own" {
            "users/bob/context.md"
        } else {
            path
        };
        let response = api.put_doc(target, format!("# by {who}\n"));
        assert_eq!(response.status, want, "{who} PUT {target}: {response}");
    }
    let response = p.bob.delete_doc(path);
    assert_eq!(response.status, 403, "{response}");
    let response = p.bob.put_doc("notes/shared.md", "tenant-wide\n");
    assert_eq!(response.status, 200, "{response}");
    // Bob's agent cannot do it for him either.
    let session = p.bob.create_fake_session();
    let result = p.bob.run_tool(
        &session.id,
        "write",
        json!({"path": format!("wuhu://workspace/{path}"), "content": "# injected\n"}),
        TURN,
    );
    assert!(
        result.is_error && result.content.contains("only its owner"),
        "{result:?}"
    );
    let result = p.bob.run_tool(
        &session.id,
        "js",
        json!({"code": format!("await wuhu.workspace.write({path:?}, 'x'); 'wrote'")}),
        TURN,
    );
    assert!(
        !result.content.contains("wrote") && result.content.contains("only its owner"),
        "{result:?}"
    );
    let doc = p.alice.get_doc(path).json();
    assert_eq!(
        doc["content"], "# by root\n",
        "the last allowed write wins: {doc}"
    );
    // In alice's own session her agent may write her documents; in her group session a turn
    // that bob prompted may not (he could plant text in her context otherwise).
    let own = p.alice.create_fake_session();
    let result = p.alice.run_tool(
        &own.id,
        "write",
        json!({"path": "wuhu://workspace/users/alice/notes.md", "content": "mine\n"}),
        TURN,
    );
    assert!(!result.is_error, "{result:?}");
    p.alice.patch(
        &format!("/v1/sessions/{}", own.id),
        &json!({"access": "tenant"}),
    );
    let result = p.bob.run_tool(
        &own.id,
        "write",
        json!({"path": "wuhu://workspace/users/alice/notes.md", "content": "bob was here\n"}),
        TURN,
    );
    assert!(
        result.is_error && result.content.contains("only its owner"),
        "{result:?}"
    );
    assert_eq!(
        p.alice.get_doc("users/alice/notes.md").json()["content"],
        "mine\n"
    );
    // Bob's new session does not get alice's context; alice's does.
    let alices = p.alice.create_fake_session();
    let entries = p.alice.transcript(&alices.id);
    let json = serde_json::to_string(&entries).unwrap();
    assert!(json.contains("# by root"), "{}", describe(&entries));
}

/// A session's tools (list_sessions, read_session, js `wuhu.sessions`) see what its owner
/// could see through the API: nothing of another member's private session.
#[test]
fn session_tools_see_what_the_owner_sees() {
    let _guard = stack().guard();
    let p = people("tools");
    let secret = p
        .alice
        .create_session(json!({"title": "alice private plans"}));
    let bobs = p.bob.create_fake_session();
    let listing = p.bob.run_tool(&bobs.id, "list_sessions", json!({}), TURN);
    assert!(!listing.content.contains(&secret.id), "{}", listing.content);
    assert!(listing.content.contains(&bobs.id), "{}", listing.content);
    let read = p
        .bob
        .run_tool(&bobs.id, "read_session", json!({"id": secret.id}), TURN);
    assert!(
        read.is_error && read.content.contains("No session"),
        "{read:?}"
    );
    let js = p.bob.run_tool(
        &bobs.id,
        "js",
        json!({"code": format!("const l = await wuhu.sessions.list(); let r; try {{ await wuhu.sessions.get({:?}); r = 'read'; }} catch (e) {{ r = 'refused'; }} JSON.stringify([l.sessions.map(s => s.id), r])", secret.id)}),
        TURN,
    );
    assert!(
        !js.content.contains(&secret.id) && js.content.contains("refused"),
        "{js:?}"
    );
    // Once alice opens it to the tenant, bob's tools see it.
    p.alice.patch(
        &format!("/v1/sessions/{}", secret.id),
        &json!({"access": "tenant"}),
    );
    let listing = p.bob.run_tool(&bobs.id, "list_sessions", json!({}), TURN);
    assert!(listing.content.contains(&secret.id), "{}", listing.content);
    let read = p
        .bob
        .run_tool(&bobs.id, "read_session", json!({"id": secret.id}), TURN);
    assert!(!read.is_error, "{read:?}");
}

/// The session list pages past many sessions bob may not see without losing any he may.
#[test]
fn the_list_pages_over_hidden_sessions() {
    let _guard = stack().guard();
    let p = people("paging");
    let mut visible = Vec::new();
    for i in 0..12 {
        let hidden = p.alice.create_fake_session();
        let _ = hidden;
        if i % 3 == 0 {
            let shared = p.alice.create_fake_session();
            p.alice.patch(
                &format!("/v1/sessions/{}", shared.id),
                &json!({"access": "tenant"}),
            );
            visible.push(shared.id);
        }
    }
    let mut seen = Vec::new();
    let mut query = "limit=2".to_string();
    loop {
        let page = p.bob.list_sessions(&query);
        seen.extend(page.sessions.iter().map(|s| s.id.clone()));
        match page.next_before {
            Some(before) => query = format!("limit=2&before={before}"),
            None => break,
        }
    }
    visible.reverse();
    assert_eq!(
        seen, visible,
        "bob sees exactly the tenant sessions, newest first"
    );
    assert_eq!(
        p.root.list_sessions("limit=200").sessions.len(),
        16,
        "admins see everything"
    );
}
