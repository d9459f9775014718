//! Every auth failure is a JSON 401, other tenants' sessions do not exist, and bad input is a
//! JSON 4xx that never takes the Worker down.

use std::time::Duration;

use serde_json::json;
use wuhu_e2e::entries::assistants;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Request, Response, Stack};

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

/// Every user route, as (method, path, body).
fn user_routes(id: &str) -> Vec<(&'static str, String, Option<serde_json::Value>)> {
    vec![
        ("GET", "/v1/sessions".into(), None),
        ("POST", "/v1/sessions".into(), Some(json!({}))),
        ("GET", format!("/v1/sessions/{id}"), None),
        (
            "PATCH",
            format!("/v1/sessions/{id}"),
            Some(json!({"title": "t"})),
        ),
        (
            "POST",
            format!("/v1/sessions/{id}/enqueue?lane=followUp"),
            Some(json!({"content": "hi"})),
        ),
        (
            "POST",
            format!("/v1/sessions/{id}/cancel"),
            Some(json!({"id": "x"})),
        ),
        ("POST", format!("/v1/sessions/{id}/stop"), None),
        (
            "GET",
            format!("/v1/sessions/{id}/follow?stopAfterIdle=1"),
            None,
        ),
    ]
}

fn call(
    stack: &Stack,
    method: &str,
    path: &str,
    body: &Option<serde_json::Value>,
    authorization: Option<&str>,
) -> Response {
    let mut request = Request::new(method, stack.url(path));
    if let Some(value) = authorization {
        request = request.header("Authorization", value);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    request
        .timeout(Duration::from_secs(20))
        .send()
        .unwrap_or_else(|err| panic!("{method} {path}: {err}"))
}

#[test]
fn every_auth_failure_is_a_json_401() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("auth");
    let owner = stack.client("alice", &tenant);
    let session = owner.create_fake_session();
    let bad: Vec<(&str, Option<String>)> = vec![
        ("missing header", None),
        ("not bearer", Some("Basic YWxpY2U6c2VjcmV0".into())),
        ("empty bearer", Some("Bearer ".into())),
        ("garbage token", Some("Bearer not.a.jwt".into())),
        (
            "expired",
            Some(format!("Bearer {}", stack.expired_token("alice", &tenant))),
        ),
        (
            "bad signature",
            Some(format!(
                "Bearer {}",
                stack.bad_signature_token("alice", &tenant)
            )),
        ),
        (
            "alg none",
            Some(format!("Bearer {}", stack.alg_none_token("alice", &tenant))),
        ),
        (
            "runner token",
            Some(format!("Bearer {}", stack.runner_token("alice", &tenant))),
        ),
        (
            "no tenant claim",
            Some(format!(
                "Bearer {}",
                wuhu_e2e::jwt::hs256(
                    stack.secret().as_bytes(),
                    &json!({"sub": "alice", "exp": wuhu_e2e::util::unix_now() + 600})
                )
            )),
        ),
        (
            "no exp claim",
            Some(format!(
                "Bearer {}",
                wuhu_e2e::jwt::hs256(
                    stack.secret().as_bytes(),
                    &json!({"sub": "alice", "tenant": tenant})
                )
            )),
        ),
    ];
    // Claims the authority rules refuse (core/src/authority.rs), correctly signed.
    let now = wuhu_e2e::util::unix_now();
    let signed =
        |claims: serde_json::Value| Some(format!("Bearer {}", stack.token_with_claims(&claims)));
    let bad: Vec<(&str, Option<String>)> = bad
        .into_iter()
        .chain([
            ("nbf in the future", signed(json!({"sub": "alice", "tenant": tenant, "exp": now + 600, "nbf": now + 300}))),
            ("lifetime over 90 days", signed(json!({"sub": "alice", "tenant": tenant, "exp": now + 91 * 86_400}))),
            ("unknown role", signed(json!({"sub": "alice", "tenant": tenant, "exp": now + 600, "role": "root"}))),
            ("runnerKind on a user token", signed(json!({"sub": "alice", "tenant": tenant, "exp": now + 600, "runnerKind": "cloud"}))),
            ("sub with a slash", signed(json!({"sub": "al/ice", "tenant": tenant, "exp": now + 600}))),
            ("sub with CR LF", signed(json!({"sub": "al\r\nice", "tenant": tenant, "exp": now + 600}))),
            ("sub of 129 bytes", signed(json!({"sub": "a".repeat(129), "tenant": tenant, "exp": now + 600}))),
            ("empty sub", signed(json!({"sub": "", "tenant": tenant, "exp": now + 600}))),
        ])
        .collect();
    for (case, authorization) in &bad {
        for (method, path, body) in user_routes(&session.id) {
            let response = call(stack, method, &path, &body, authorization.as_deref());
            let error = std::panic::catch_unwind(|| response.expect_error(401))
                .unwrap_or_else(|_| panic!("{case}: {method} {path} answered {response}"));
            assert!(
                !error.message.to_lowercase().contains(stack.secret()),
                "{case}: message leaks the secret"
            );
        }
    }
    // Nothing was created or enqueued by the refused calls.
    assert_eq!(owner.list_sessions("").sessions.len(), 1);
    assert_eq!(owner.transcript(&session.id).len(), 1);
    assert!(stack.healthz_ok(), "healthz needs no token");
}

#[test]
fn another_tenants_session_is_not_found() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("owner");
    let owner = stack.client("alice", &tenant);
    let session = owner.create_fake_session();
    let strangers = [
        stack.client("mallory", &unique_name("other")),
        stack.client("alice", &unique_name("other")),
    ];
    for stranger in &strangers {
        for (method, path, body) in user_routes(&session.id).into_iter().skip(2) {
            let response = call(
                stack,
                method,
                &path,
                &body,
                Some(&format!("Bearer {}", stranger.token().unwrap())),
            );
            std::panic::catch_unwind(|| response.expect_error(404))
                .unwrap_or_else(|_| panic!("stranger {method} {path} answered {response}"));
        }
        assert!(stranger.list_sessions("").sessions.is_empty());
    }
    // The owner's session is untouched.
    let page = owner.session_page(&session.id, "");
    assert_eq!(page.transcript.len(), 1);
    assert_eq!(page.session.title, None);
}

#[test]
fn bad_input_is_a_json_4xx_and_the_worker_survives() {
    let stack = stack();
    let _guard = stack.guard();
    let api = stack.client("alice", &unique_name("input"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let enqueue = format!("/v1/sessions/{id}/enqueue?lane=followUp");
    let cancel = format!("/v1/sessions/{id}/cancel");
    let patch = format!("/v1/sessions/{id}");
    let big_content = "x".repeat(1024 * 1024 + 10);
    let big_body = json!({"content": big_content}).to_string();

    let cases: Vec<(&str, &str, String, Vec<u8>, u16)> = vec![
        (
            "malformed json: create",
            "POST",
            "/v1/sessions".into(),
            b"{\"title\": ".to_vec(),
            400,
        ),
        (
            "malformed json: enqueue",
            "POST",
            enqueue.clone(),
            b"{content: hi}".to_vec(),
            400,
        ),
        (
            "malformed json: cancel",
            "POST",
            cancel.clone(),
            b"[1, 2".to_vec(),
            400,
        ),
        (
            "malformed json: patch",
            "PATCH",
            patch.clone(),
            b"\"title\"".to_vec(),
            400,
        ),
        (
            "not utf-8",
            "POST",
            enqueue.clone(),
            vec![0xff, 0xfe, 0x7b],
            400,
        ),
        (
            "unknown field: create",
            "POST",
            "/v1/sessions".into(),
            br#"{"title":"t","color":"red"}"#.to_vec(),
            400,
        ),
        (
            "unknown field: enqueue",
            "POST",
            enqueue.clone(),
            br#"{"content":"hi","priority":1}"#.to_vec(),
            400,
        ),
        (
            "unknown field: cancel",
            "POST",
            cancel.clone(),
            br#"{"id":"x","force":true}"#.to_vec(),
            400,
        ),
        (
            "unknown field: patch",
            "PATCH",
            patch.clone(),
            br#"{"title":"t","pinned":true}"#.to_vec(),
            400,
        ),
        (
            "wrong type",
            "POST",
            enqueue.clone(),
            br#"{"content":5}"#.to_vec(),
            400,
        ),
        (
            "missing content",
            "POST",
            enqueue.clone(),
            b"{}".to_vec(),
            400,
        ),
        (
            "unknown lane",
            "POST",
            format!("/v1/sessions/{id}/enqueue?lane=sideways"),
            br#"{"content":"hi"}"#.to_vec(),
            400,
        ),
        (
            "internal lane",
            "POST",
            format!("/v1/sessions/{id}/enqueue?lane=system"),
            br#"{"content":"hi"}"#.to_vec(),
            400,
        ),
        (
            "unknown provider",
            "POST",
            "/v1/sessions".into(),
            br#"{"provider":"telepathy"}"#.to_vec(),
            400,
        ),
        (
            "body over 1 MiB: enqueue",
            "POST",
            enqueue.clone(),
            big_body.clone().into_bytes(),
            413,
        ),
        (
            "body over 1 MiB: create",
            "POST",
            "/v1/sessions".into(),
            json!({"title": "t", "systemPrompt": big_content})
                .to_string()
                .into_bytes(),
            413,
        ),
        (
            "unknown session: get",
            "GET",
            "/v1/sessions/00000000-0000-4000-8000-000000000000".into(),
            Vec::new(),
            404,
        ),
        (
            "unknown session: enqueue",
            "POST",
            "/v1/sessions/00000000-0000-4000-8000-000000000000/enqueue?lane=followUp".into(),
            br#"{"content":"hi"}"#.to_vec(),
            404,
        ),
        (
            "unknown session: follow",
            "GET",
            "/v1/sessions/00000000-0000-4000-8000-000000000000/follow".into(),
            Vec::new(),
            404,
        ),
        (
            "unknown session: stop",
            "POST",
            "/v1/sessions/00000000-0000-4000-8000-000000000000/stop".into(),
            Vec::new(),
            404,
        ),
        (
            "unknown session: patch",
            "PATCH",
            "/v1/sessions/00000000-0000-4000-8000-000000000000".into(),
            br#"{"title":"t"}"#.to_vec(),
            404,
        ),
        (
            "not a session id",
            "GET",
            "/v1/sessions/..%2F..%2Fetc".into(),
            Vec::new(),
            404,
        ),
        (
            "unknown route",
            "GET",
            "/v1/nothing-here".into(),
            Vec::new(),
            404,
        ),
        (
            "bad limit",
            "GET",
            format!("/v1/sessions/{id}?limit=abc"),
            Vec::new(),
            400,
        ),
    ];
    let mut failures = Vec::new();
    for (case, method, path, body, status) in &cases {
        let mut request = api.request(method, path);
        if !body.is_empty() || *method != "GET" {
            request = request
                .header("Content-Type", "application/json")
                .body(body.clone());
        }
        match request.send() {
            Ok(response) => {
                if std::panic::catch_unwind(|| response.expect_error(*status)).is_err() {
                    failures.push(format!("{case}: {method} {path} → {response}"));
                }
            }
            Err(err) => failures.push(format!("{case}: {method} {path} → transport error {err}")),
        }
        assert!(stack.healthz_ok(), "the worker is down after {case}");
    }
    assert!(
        failures.is_empty(),
        "wrong answers:\n{}",
        failures.join("\n")
    );

    // Nothing above reached the transcript, and the session still works.
    assert_eq!(api.transcript(id).len(), 1);
    api.enqueue(id, "followUp", "still alive?");
    api.wait_idle(id, Duration::from_secs(60));
    let transcript = api.transcript(id);
    assert_eq!(
        assistants(&transcript).last().unwrap().text(),
        "echo: still alive?"
    );
    let fresh: Api = stack.client("alice", &unique_name("input"));
    fresh.create_fake_session();
}

/// A missing, empty or short `WUHU_JWT_SECRET` makes every `/v1` route answer 500
/// `server_misconfigured` naming the variable, even with a token signed by that weak secret.
#[test]
fn a_weak_secret_fails_every_route() {
    for secret in ["", "abc", &"k".repeat(31)] {
        let stack = wuhu_e2e::stack::Stack::start_with(wuhu_e2e::stack::StackOptions {
            secret: Some(secret.to_string()),
            ..Default::default()
        });
        let _guard = stack.guard();
        let forged = stack.user_token("alice", "acme");
        let no_token: Option<&str> = None;
        for (method, path, body) in user_routes("00000000-0000-4000-8000-000000000000") {
            for authorization in [no_token, Some(format!("Bearer {forged}").as_str())] {
                let response = call(&stack, method, &path, &body, authorization);
                let error =
                    std::panic::catch_unwind(|| response.expect_error(500)).unwrap_or_else(|_| {
                        panic!(
                            "secret of {} bytes: {method} {path} answered {response}",
                            secret.len()
                        )
                    });
                assert_eq!(error.code, "server_misconfigured", "{method} {path}");
                assert!(
                    error.message.contains("WUHU_JWT_SECRET"),
                    "{}",
                    error.message
                );
            }
        }
        assert!(stack.healthz_ok(), "healthz needs no secret");
    }
}

/// Titles other people read in their lists, and document paths, cannot say one thing and show
/// another (issue 29: L3, L9; `wuhu_core::text`): a title loses its bidi controls, zero-width
/// and control characters wherever it enters (creation, `PATCH`, a fork, `spawn_session`), one
/// with nothing visible left is refused (or none, at creation), and a workspace path with one
/// is refused naming the character.
#[test]
fn titles_lose_invisible_characters_and_paths_refuse_them() {
    let _guard = stack().guard();
    let tenant = unique_name("hygiene");
    let api = stack().client("ada", &tenant);
    let title_of = |id: &str| -> serde_json::Value {
        api.get(&format!("/v1/sessions/{id}")).json()["session"]["title"].clone()
    };

    // Creation: "evil<RLO>txt.exe" would show as "evilexe.txt".
    let id = api
        .create_session(json!({"title": "evil\u{202E}txt.exe\u{200B}\n"}))
        .id;
    assert_eq!(title_of(&id), "eviltxt.exe");
    let none = api
        .create_session(json!({"title": "\u{200B}\u{2067}\u{FEFF}"}))
        .id;
    assert_eq!(title_of(&none), serde_json::Value::Null);

    // PATCH: cleaned, or refused when nothing visible is left.
    let path = format!("/v1/sessions/{id}");
    api.patch(
        &path,
        &json!({"title": "  plan\u{2066} A\u{2069}\n\tnow  "}),
    )
    .expect_status(200);
    assert_eq!(title_of(&id), "plan A now");
    let refused = api.patch(&path, &json!({"title": "\u{202E}\u{200D}"}));
    assert_eq!(refused.status, 400, "{refused}");
    assert_eq!(title_of(&id), "plan A now");
    let long = format!("{}{}", "\u{200B}".repeat(50), "t".repeat(200));
    api.patch(&path, &json!({"title": long})).expect_status(200);
    assert_eq!(title_of(&id), "t".repeat(200).as_str());
    let refused = api.patch(&path, &json!({"title": "t".repeat(201)}));
    assert_eq!(refused.status, 400, "{refused}");

    // A fork, and a child spawned with a title.
    api.enqueue(
        &id,
        "followUp",
        &wuhu_e2e::entries::fake_directive(&json!({"toolCalls": [{"name": "spawn_session", "arguments": {"task": "hi", "title": "child\u{202E}cod.exe"}}]})),
    );
    api.wait_idle(&id, Duration::from_secs(90));
    let session = api.get(&path).json();
    let children = session["children"].as_array().cloned().unwrap_or_default();
    assert_eq!(children.len(), 1, "{session}");
    assert_eq!(children[0]["title"], "childcod.exe", "{session}");
    let child = children[0]["id"].as_str().unwrap().to_string();
    assert_eq!(title_of(&child), "childcod.exe");
    let fork = api
        .post(
            &format!("/v1/sessions/{id}/fork"),
            &json!({"atCursor": 1, "title": "fork\u{200B}ed\u{202E}"}),
        )
        .expect_status(201)
        .json();
    assert_eq!(fork["title"], "forked", "{fork}");

    // The list shows what was stored.
    let listed = api.get("/v1/sessions").json();
    let titles: Vec<&str> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["title"].as_str())
        .collect();
    assert!(
        titles
            .iter()
            .all(|t| !t.chars().any(wuhu_core::text::is_hidden)),
        "{titles:?}"
    );

    // Workspace paths: a bidi control or a zero-width space is refused, naming it.
    for (encoded, code) in [
        ("notes/evil%E2%80%AEdm.exe", "U+202E"),
        ("users/%E2%80%8Bada/context.md", "U+200B"),
    ] {
        let refused = api.put_doc(encoded, "text");
        assert_eq!(refused.status, 400, "{encoded}: {refused}");
        let message = refused.json()["error"]["message"].to_string();
        assert!(message.contains(code), "{message}");
        assert_eq!(api.get_doc(encoded).status, 400, "{encoded}");
    }
    api.put_doc("notes/caf%C3%A9.md", "text").expect_status(200);
}
