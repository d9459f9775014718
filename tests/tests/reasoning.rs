//! Reasoning controls and live tool-call arguments (issue 36, `docs/api.md` "Reasoning"): the
//! fake Anthropic and Responses servers receive the documented parameters (Anthropic
//! `thinking: {type, budget_tokens}` with `max_tokens` above the budget; Responses
//! `reasoning: {effort, summary: "auto"}`), set at creation, by `PATCH` and for one turn by
//! enqueue; they stream thinking (an Anthropic thinking block, a Responses reasoning summary)
//! and tool-call arguments, which a real follower (SSE, socket) sees as `thinking_delta` and
//! `tool_call_delta`, never stored; a setting a model cannot take is a `400` before any
//! request reaches the fake. One shared stack; each test its own tenant and model names.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::{ContentBlock, custom_types};
use wuhu_e2e::entries::{assistants, customs, describe};
use wuhu_e2e::socket::{SessionSocket, SocketAuth, SocketRead};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Reply, SseEvent, Stack};

const TURN: Duration = Duration::from_secs(60);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

/// `POST /v1/sessions/:id/enqueue?lane=followUp` with `body`.
#[track_caller]
fn enqueue(api: &Api, id: &str, body: Value) -> wuhu_e2e::http::Response {
    api.post(&format!("/v1/sessions/{id}/enqueue?lane=followUp"), &body)
}

/// The reasoning-related fields of a provider request body.
fn reasoning_fields(body: &Value) -> Value {
    let keys = [
        "max_tokens",
        "thinking",
        "reasoning",
        "reasoning_effort",
        "temperature",
        "top_k",
        "tool_choice",
    ];
    Value::Object(
        keys.iter()
            .filter_map(|k| body.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect(),
    )
}

/// The text of the `thinking_delta`s, and per call id its name and the `tool_call_delta`
/// arguments, in the order they arrived.
fn live(events: &[Value]) -> (String, Vec<(String, String, String)>) {
    let mut thinking = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for event in events {
        match event["type"].as_str() {
            Some("thinking_delta") => thinking.push_str(event["delta"].as_str().unwrap()),
            Some("tool_call_delta") => {
                let id = event["callId"].as_str().unwrap().to_string();
                let delta = event["argumentsDelta"].as_str().unwrap();
                match calls.iter_mut().find(|c| c.0 == id) {
                    Some(call) => call.2.push_str(delta),
                    None => calls.push((
                        id,
                        event["name"].as_str().unwrap().to_string(),
                        delta.to_string(),
                    )),
                }
            }
            _ => {}
        }
    }
    (thinking, calls)
}

fn data(events: &[SseEvent]) -> Vec<Value> {
    events.iter().map(|e| e.data.clone()).collect()
}

/// An Anthropic session created with an effort: its requests carry thinking with the effort's
/// budget and `max_tokens` above it (no temperature, no tool choice); the thinking and the
/// call's arguments stream to an SSE follower as they are written; one message's setting
/// holds for its turn only; `PATCH {reasoning: null}` ends it, told in the transcript.
#[test]
fn anthropic_thinking_streams_and_each_setting_reaches_the_provider() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("think"));
    // A dated-snapshot-like name of claude-sonnet-4-5 (64,000 output tokens).
    let model = unique_name("claude-sonnet-4-5");
    let session = api.create_session(json!({
        "provider": "anthropic", "model": model, "reasoning": {"effort": "medium"},
    }));
    assert_eq!(
        serde_json::to_value(session.reasoning).unwrap(),
        json!({"effort": "medium"})
    );
    let id = session.id;
    let args = json!({"limit": 5, "note": "x".repeat(300)});
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", args.clone())])
                .with_text("Let me check.")
                .with_thinking("the user asks about sessions", "sig-abc"),
            Reply::text("One."),
            Reply::text("Low."),
            Reply::text("Medium again."),
            Reply::text("Default."),
        ],
    );
    let mut follow = api.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&id, "followUp", "how many sessions do I have?");
    let events = follow.collect_until(TURN, |e| e.event == "idle");
    let (thinking, calls) = live(&data(&events));
    assert_eq!(thinking, "the user asks about sessions");
    let transcript = api.transcript(&id);
    let replies = assistants(&transcript);
    let call = replies[0].tool_calls().next().expect("a call").clone();
    assert_eq!(
        calls,
        [(call.id.clone(), "list_sessions".into(), args.to_string())],
        "{}",
        describe(&transcript)
    );
    assert_eq!(call.arguments, args);
    // Deltas are live only: the transcript has none of them.
    let stored = serde_json::to_string(&transcript).unwrap();
    assert!(!stored.contains("thinking_delta") && !stored.contains("tool_call_delta"));
    assert!(matches!(
        &replies[0].content[0],
        ContentBlock::Thinking { thinking, signature } if thinking == "the user asks about sessions" && signature == "sig-abc"
    ));

    let medium =
        json!({"max_tokens": 20480, "thinking": {"type": "enabled", "budget_tokens": 12288}});
    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(reasoning_fields(&request.body), medium);
    }
    // The thinking block went back unchanged with the tool result.
    let sent = requests[1].messages();
    assert_eq!(
        sent[1]["content"][0],
        json!({"type": "thinking", "thinking": "the user asks about sessions", "signature": "sig-abc"})
    );

    // One turn with its own budget, then the session's again.
    let low = turn(
        &api,
        &id,
        json!({"content": "quick", "reasoning": {"effort": "low", "budgetTokens": 2048}}),
    );
    low.expect_status(200);
    drop(low);
    turn(&api, &id, json!({"content": "and again"}));
    // The session's setting removed: the provider's default.
    let patched = api.patch(&format!("/v1/sessions/{id}"), &json!({"reasoning": null}));
    patched.expect_status(200);
    assert!(
        patched.json().get("reasoning").is_none(),
        "{}",
        patched.json()
    );
    turn(&api, &id, json!({"content": "plain"}));
    let requests = stack().openai().requests_for(&model);
    let fields: Vec<Value> = requests[2..]
        .iter()
        .map(|r| reasoning_fields(&r.body))
        .collect();
    assert_eq!(
        fields,
        [
            json!({"max_tokens": 10240, "thinking": {"type": "enabled", "budget_tokens": 2048}}),
            medium,
            json!({"max_tokens": 8192}),
        ]
    );
    let transcript = api.transcript(&id);
    let changes = customs(&transcript, custom_types::REASONING_CHANGED);
    assert_eq!(changes.len(), 1, "{}", describe(&transcript));
    assert_eq!(changes[0]["from"], json!({"effort": "medium"}));
    assert_eq!(changes[0]["to"], Value::Null);
    assert_eq!(changes[0]["by"], "ada");
}

/// Enqueues `body` and follows the turn it starts to its end; the enqueue's answer.
#[track_caller]
fn turn(api: &Api, id: &str, body: Value) -> wuhu_e2e::http::Response {
    let since = api.session(id).session.last_cursor;
    let mut follow = api.follow(id, &format!("sinceCursor={since}&timeoutSeconds=60"));
    let response = enqueue(api, id, body);
    response.expect_status(200);
    follow.collect_until(TURN, |e| e.event == "idle");
    response
}

/// A Responses session given an effort by `PATCH`: its requests carry `reasoning: {effort,
/// summary: "auto"}`, and a socket follower sees the reasoning summary as thinking and the
/// call's arguments as they stream; the stored message holds the summary once, in its
/// reasoning item. A message sent on the socket carries its turn's own effort.
#[test]
fn responses_effort_and_summary_stream_to_a_socket() {
    let _guard = stack().guard();
    let (api, id, model) = stack().provider_session("ada", "openai", "gpt-5-mini", "be brief");
    let patched = api.patch(
        &format!("/v1/sessions/{id}"),
        &json!({"reasoning": {"effort": "high"}}),
    );
    patched.expect_status(200);
    assert_eq!(patched.json()["reasoning"], json!({"effort": "high"}));
    let args = json!({"limit": 2});
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", args.clone())])
                .with_text("Checking.")
                .with_thinking("**Plan** list the sessions", "enc-1"),
            Reply::text("Done."),
            Reply::text("Low."),
        ],
    );
    let auth = SocketAuth::Bearer(api.token().unwrap().to_string());
    let mut socket = SessionSocket::connect(&stack().base_url(), &id, "", &auth)
        .unwrap_or_else(|e| panic!("socket refused: {e:?}"));
    // Registered once the status after the backfill arrives.
    while socket.next_frame(Duration::from_secs(20))["type"] != "status" {}
    api.enqueue(&id, "followUp", "list them");
    let frames = read_until_idle(&mut socket);
    let (thinking, calls) = live(&frames);
    assert_eq!(thinking, "**Plan** list the sessions");
    let transcript = api.transcript(&id);
    let replies = assistants(&transcript);
    let call = replies[0].tool_calls().next().expect("a call").clone();
    assert_eq!(
        calls,
        [(call.id.clone(), "list_sessions".into(), args.to_string())]
    );
    let stored = serde_json::to_string(&replies[0]).unwrap();
    assert_eq!(stored.matches("**Plan**").count(), 1, "{stored}");

    // A socket message with its own effort, for its turn.
    socket.send(&wuhu_core::socket::ClientFrame::Enqueue {
        id: "m1".into(),
        lane: None,
        body: serde_json::from_value(json!({"content": "quickly", "reasoning": {"effort": "low"}}))
            .unwrap(),
    });
    read_until_idle(&mut socket);
    let fields: Vec<Value> = stack()
        .openai()
        .requests_for(&model)
        .iter()
        .map(|r| reasoning_fields(&r.body))
        .collect();
    let high = json!({"reasoning": {"effort": "high", "summary": "auto"}});
    assert_eq!(
        fields,
        [
            high.clone(),
            high,
            json!({"reasoning": {"effort": "low", "summary": "auto"}})
        ]
    );
}

/// Frames up to the next live `idle`.
fn read_until_idle(socket: &mut SessionSocket) -> Vec<Value> {
    let deadline = Instant::now() + TURN;
    let mut frames = Vec::new();
    loop {
        match socket.read(deadline) {
            SocketRead::Frame(frame) => {
                let idle = frame["type"] == "idle";
                frames.push(frame);
                if idle {
                    return frames;
                }
            }
            other => panic!("{other:?} before idle; read {frames:?}"),
        }
    }
}

/// Every way a setting reaches a session, with a setting its model cannot take or a bad value:
/// a JSON `400` naming the problem, nothing created, patched or queued, and no request at the
/// fake. Only those who may prompt the session may change its setting.
#[test]
fn unsupported_settings_are_refused_before_any_request() {
    let _guard = stack().guard();
    let tenant = unique_name("refuse");
    let api = stack().client("ada", &tenant);
    let plain = unique_name("gpt-4o");
    let unknown = unique_name("my-llama");
    let claude = unique_name("claude-opus-4-1");
    let gpt5 = unique_name("gpt-5");
    let cases = [
        (
            json!({"provider": "openai-compatible", "model": plain, "reasoning": {"effort": "low"}}),
            "invalid_reasoning",
            "takes no reasoning setting",
        ),
        (
            json!({"provider": "openai-compatible", "model": unknown, "reasoning": {"effort": "low"}}),
            "invalid_reasoning",
            "is not in the model table",
        ),
        (
            json!({"provider": "anthropic", "model": claude, "reasoning": {"effort": "low", "budgetTokens": 1023}}),
            "invalid_reasoning",
            "budgetTokens must be 1024 to 30976",
        ),
        (
            json!({"provider": "openai", "model": gpt5, "reasoning": {"effort": "low", "budgetTokens": 2048}}),
            "invalid_reasoning",
            "take an effort only",
        ),
        (
            json!({"provider": "fake", "reasoning": {"effort": "low"}}),
            "invalid_reasoning",
            "the fake provider takes no reasoning setting",
        ),
        (
            json!({"provider": "anthropic", "model": claude, "reasoning": {"effort": "extreme"}}),
            "bad_request",
            "unknown variant `extreme`",
        ),
    ];
    let before = api.get("/v1/sessions?limit=200").json()["sessions"]
        .as_array()
        .map_or(0, Vec::len);
    for (body, code, message) in &cases {
        let response = api.post("/v1/sessions", body);
        response.expect_status(400);
        let error = response.json();
        assert_eq!(error["error"]["code"], *code, "{body}: {error}");
        let text = error["error"]["message"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{body}: {text}");
    }
    let after = api.get("/v1/sessions?limit=200").json()["sessions"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(before, after, "nothing was created");

    // A session on a model without reasoning: refused by enqueue and PATCH, nothing queued.
    let session = api.create_session(json!({"provider": "openai-compatible", "model": plain}));
    let id = session.id;
    let refused = enqueue(
        &api,
        &id,
        json!({"content": "hi", "reasoning": {"effort": "high"}}),
    );
    refused.expect_status(400);
    assert_eq!(refused.json()["error"]["code"], "invalid_reasoning");
    let patch = api.patch(
        &format!("/v1/sessions/{id}"),
        &json!({"reasoning": {"effort": "high"}}),
    );
    patch.expect_status(400);
    assert_eq!(patch.json()["error"]["code"], "invalid_reasoning");
    let page = api.session(&id);
    assert!(page.queue.is_empty(), "{:?}", page.queue);
    assert_eq!(page.session.reasoning, None);

    // A session with a setting: a switch to a model that cannot take it needs `null` too.
    let thinking = api.create_session(json!({
        "provider": "anthropic", "model": claude, "reasoning": {"effort": "high"},
    }));
    let path = format!("/v1/sessions/{}", thinking.id);
    let switch = api.patch(
        &path,
        &json!({"provider": "openai-compatible", "model": plain}),
    );
    switch.expect_status(400);
    assert_eq!(switch.json()["error"]["code"], "invalid_reasoning");
    let switch = api.patch(
        &path,
        &json!({"provider": "openai-compatible", "model": plain, "reasoning": null}),
    );
    switch.expect_status(200);
    assert_eq!(switch.json()["model"], plain.as_str());

    // Another member of the tenant cannot change a private session's setting.
    let bob = stack().client("bob", &tenant);
    let stranger = bob.patch(
        &format!("/v1/sessions/{id}"),
        &json!({"reasoning": {"effort": "low"}}),
    );
    assert!(
        matches!(stranger.status, 403 | 404),
        "{}: {}",
        stranger.status,
        stranger.json()
    );

    for model in [&plain, &unknown, &claude, &gpt5] {
        assert_eq!(stack().openai().requests_for(model).len(), 0, "{model}");
    }
}

/// An API client of `ada` in `tenant`.
fn api_of(tenant: &str) -> Api {
    stack().client("ada", tenant)
}

/// The CLI: `sessions create|new`, `sessions model` and `sessions send` carry the setting
/// (`--json` prints the wire types, a refusal the server's code), and `sessions follow` prints
/// the thinking.
#[test]
fn cli_sets_reasoning_and_follow_prints_thinking() {
    use wuhu_e2e::cli::{Wuhu, wuhu_bin};
    wuhu_bin();
    let _guard = stack().guard();
    let tenant = unique_name("cli-think");
    let wuhu = Wuhu::new()
        .env("WUHU_SERVER", &stack().base_url())
        .env("WUHU_TOKEN", &stack().user_token("ada", &tenant));
    let model = unique_name("claude-haiku-4-5");
    let created = wuhu
        .run(&[
            "sessions",
            "create",
            "--provider",
            "anthropic",
            "--model",
            &model,
            "--reasoning-effort",
            "low",
            "--thinking-budget",
            "2048",
            "--json",
        ])
        .ok()
        .json();
    assert_eq!(
        created["reasoning"],
        json!({"effort": "low", "budgetTokens": 2048})
    );
    let id = created["id"].as_str().unwrap().to_string();
    let switched = wuhu
        .run(&[
            "sessions",
            "model",
            &id,
            "--reasoning-effort",
            "high",
            "--json",
        ])
        .ok()
        .json();
    assert_eq!(switched["reasoning"], json!({"effort": "high"}));
    let plain = wuhu.run(&["sessions", "model", &id, "--no-reasoning"]).ok();
    assert_eq!(
        plain.stdout.trim(),
        format!("anthropic/{model} · default reasoning")
    );
    let refused = wuhu.run(&[
        "sessions",
        "model",
        &id,
        "--reasoning-effort",
        "high",
        "--thinking-budget",
        "100",
        "--json",
    ]);
    assert_eq!(refused.code(), 1, "{refused:?}");
    assert_eq!(refused.error_json()["error"]["code"], "invalid_reasoning");

    stack().openai().script(
        &model,
        [Reply::text("Sure.").with_thinking("a short think", "sig-cli")],
    );
    // A follower that is registered before the turn starts sees its thinking as it streams.
    let follower = wuhu.spawn(&["sessions", "follow", &id, "--timeout", "60"]);
    wuhu_e2e::util::wait_for("the follower", TURN, || {
        let stats = api_of(&tenant)
            .get(&format!("/v1/sessions/{id}/stats"))
            .json();
        (stats["followers"].as_u64() >= Some(1)).then_some(())
    });
    wuhu.run(&[
        "sessions",
        "send",
        &id,
        "think a bit",
        "--reasoning-effort",
        "medium",
        "--json",
    ])
    .ok();
    follower.wait_line("the reply", TURN, |l| l == "Sure.");
    let lines = follower.lines();
    let at = lines.iter().position(|l| l == "Sure.").unwrap();
    assert_eq!(lines[at - 1], "a short think", "{lines:#?}");
    drop(follower);
    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 1);
    assert_eq!(
        reasoning_fields(&requests[0].body),
        json!({"max_tokens": 20480, "thinking": {"type": "enabled", "budget_tokens": 12288}})
    );
}

/// Chat Completions: a model the table marks gets `reasoning_effort`, and its streamed
/// `tool_calls` deltas reach an SSE follower as `tool_call_delta`s of the call the entry holds.
#[test]
fn chat_completions_effort_and_argument_deltas() {
    let _guard = stack().guard();
    let (api, id, model) =
        stack().provider_session("ada", "openai-compatible", "gpt-5-nano", "be brief");
    api.patch(
        &format!("/v1/sessions/{id}"),
        &json!({"reasoning": {"effort": "low"}}),
    )
    .expect_status(200);
    let args = json!({"limit": 3, "note": "ä".repeat(50)});
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", args.clone())]),
            Reply::text("Done."),
        ],
    );
    let mut follow = api.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&id, "followUp", "list");
    let events = follow.collect_until(TURN, |e| e.event == "idle");
    let (_, calls) = live(&data(&events));
    let transcript = api.transcript(&id);
    let call = assistants(&transcript)[0]
        .tool_calls()
        .next()
        .expect("a call")
        .clone();
    assert_eq!(
        calls,
        [(call.id.clone(), "list_sessions".into(), args.to_string())]
    );
    for request in stack().openai().requests_for(&model) {
        assert_eq!(
            reasoning_fields(&request.body),
            json!({"reasoning_effort": "low"})
        );
    }
}

/// The session's own `set_model` switching to a model that takes no reasoning setting removes
/// the setting, told in the transcript: the next request carries none.
#[test]
fn set_model_to_a_model_without_reasoning_removes_the_setting() {
    let _guard = stack().guard();
    let (api, id, model) =
        stack().provider_session("ada", "anthropic", "claude-sonnet-4-5", "use tools");
    api.patch(
        &format!("/v1/sessions/{id}"),
        &json!({"reasoning": {"effort": "low"}}),
    )
    .expect_status(200);
    let plain = unique_name("gpt-4o");
    stack().openai().script(
        &model,
        [Reply::tool_calls([(
            "set_model",
            json!({"provider": "openai-compatible", "model": plain}),
        )])],
    );
    stack().openai().script(&plain, [Reply::text("Switched.")]);
    let mut follow = api.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&id, "followUp", "switch to a plain model");
    follow.collect_until(TURN, |e| e.event == "idle");
    let transcript = api.transcript(&id);
    let changes = customs(&transcript, custom_types::REASONING_CHANGED);
    assert_eq!(changes.len(), 2, "{}", describe(&transcript));
    assert_eq!(changes[1]["to"], Value::Null);
    assert!(
        changes[1]["text"]
            .as_str()
            .unwrap()
            .contains("takes no such setting, so the switch removed it"),
        "{}",
        changes[1]
    );
    assert_eq!(api.session(&id).session.reasoning, None);
    assert_eq!(
        reasoning_fields(&stack().openai().requests_for(&model)[0].body),
        json!({"max_tokens": 12288, "thinking": {"type": "enabled", "budget_tokens": 4096}})
    );
    let after = stack().openai().requests_for(&plain);
    assert_eq!(after.len(), 1);
    assert_eq!(reasoning_fields(&after[0].body), json!({}));
}
