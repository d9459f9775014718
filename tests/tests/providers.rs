//! The native providers against the local fake speaking their streaming formats: `anthropic`
//! (Messages, `tests/src/fake_anthropic.rs`) and `openai` (Responses,
//! `tests/src/fake_responses.rs`). Each test scripts its own model name on one shared stack.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::{ContentBlock, StopReason, custom_types};
use wuhu_e2e::entries::{assert_contiguous, assistants, customs, describe, tool_result};
use wuhu_e2e::stack::StackOptions;
use wuhu_e2e::stack::{ANTHROPIC_TEST_KEY, OPENAI_TEST_KEY};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Reply, SseEvent, Stack};

const TURN: Duration = Duration::from_secs(60);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

/// A client in a fresh tenant and a anthropic session on a fresh model name.
fn anthropic_session(system_prompt: &str) -> (Api, String, String) {
    anthropic_session_on("claude-test", system_prompt)
}

/// The same on a model named `{prefix}-<random>` (a dated-snapshot-like name of a table row).
fn anthropic_session_on(prefix: &str, system_prompt: &str) -> (Api, String, String) {
    stack().provider_session("ada", "anthropic", prefix, system_prompt)
}

#[test]
fn tool_call_then_text_with_thinking_sent_back_and_cache_usage_recorded() {
    let _guard = stack().guard();
    // A name the model table knows (as a dated snapshot of claude-sonnet-4-5): cost recorded.
    let (api, id, model) = anthropic_session_on("claude-sonnet-4-5", "use tools");
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", json!({"limit": 5}))])
                .with_text("Let me check.")
                .with_thinking("the user asks about sessions", "sig-abc")
                .with_usage(1000, 40)
                .with_cache(600, 300),
            Reply::text("You have one session.").with_delay(Duration::from_millis(20)),
        ],
    );
    let mut follow = api.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&id, "followUp", "how many sessions do I have?");
    let events = follow.collect_until(TURN, |e| e.event == "idle");
    let streamed: String = events.iter().filter_map(SseEvent::delta).collect();
    assert_eq!(streamed, "Let me check.You have one session.");

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let replies = assistants(&transcript);
    assert_eq!(replies.len(), 2, "{text}");
    assert_eq!(
        replies[0].content[0],
        ContentBlock::Thinking {
            thinking: "the user asks about sessions".into(),
            signature: "sig-abc".into()
        },
        "{text}"
    );
    assert_eq!(replies[0].text(), "Let me check.");
    assert_eq!(replies[0].stop_reason, StopReason::ToolUse);
    let calls: Vec<_> = replies[0].tool_calls().cloned().collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(
        (calls[0].name.as_str(), &calls[0].arguments),
        ("list_sessions", &json!({"limit": 5}))
    );
    let usage = replies[0].usage.expect("usage");
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens
        ),
        (1000, 40, 600, 300)
    );
    // 100 uncached × $3 + 40 × $15 + 600 × $0.30 + 300 × $3.75, per million.
    let cost = usage.cost_usd.expect("cost from the model table");
    assert!((cost - 0.002205).abs() < 1e-12, "{cost}");
    // The session's totals: both messages, one model; the text reply (11 in, 7 out) adds
    // 11 × $3 + 7 × $15 per million.
    let totals = api.get(&format!("/v1/sessions/{id}/usage"));
    totals.expect_status(200);
    let totals = totals.json();
    assert_eq!(totals["messages"], 2, "{totals}");
    assert_eq!(totals["inputTokens"], 1011, "{totals}");
    assert_eq!(totals["cacheWriteTokens"], 300, "{totals}");
    assert_eq!(totals["unpricedMessages"], 0, "{totals}");
    let total_cost = totals["costUsd"].as_f64().expect("costUsd");
    assert!((total_cost - 0.002343).abs() < 1e-12, "{totals}");
    assert_eq!(
        totals["byModel"].as_array().map(Vec::len),
        Some(1),
        "{totals}"
    );
    assert_eq!(totals["byModel"][0]["model"], model.as_str(), "{totals}");
    assert_eq!(replies[0].provider, "anthropic");
    let result = transcript
        .iter()
        .find_map(tool_result)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(result.content.contains(&id), "{text}");
    assert_eq!(replies[1].text(), "You have one session.");
    assert_eq!(replies[1].stop_reason, StopReason::Stop);

    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(
        (first.method.as_str(), first.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(first.header("x-api-key"), Some(ANTHROPIC_TEST_KEY));
    assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(first.header("authorization"), None);
    assert_eq!(first.body["stream"], true);
    assert!(first.body["max_tokens"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(
        first.body["system"],
        json!([{"type": "text", "text": "use tools", "cache_control": {"type": "ephemeral"}}])
    );
    let tools = first.body["tools"].as_array().expect("tools");
    assert!(tools.iter().any(|t| t["name"] == "list_sessions"));
    assert!(tools.iter().all(|t| t["input_schema"].is_object()));
    assert_eq!(
        tools.last().unwrap()["cache_control"],
        json!({"type": "ephemeral"})
    );

    // The second request replays the assistant turn block for block, thinking first, and
    // answers the tool_use with a tool_result.
    let messages = requests[1].body["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{messages:?}");
    assert_eq!(
        messages[1]["content"],
        json!([
            {"type": "thinking", "thinking": "the user asks about sessions", "signature": "sig-abc"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": calls[0].id, "name": "list_sessions", "input": {"limit": 5}},
        ])
    );
    let answer = &messages[2]["content"][0];
    assert_eq!(answer["type"], "tool_result");
    assert_eq!(answer["tool_use_id"], calls[0].id.as_str());
    assert_eq!(answer["content"], result.content.as_str());
    assert_eq!(answer["cache_control"], json!({"type": "ephemeral"}));
}

#[test]
fn invalid_request_is_one_visible_notice_and_not_retried() {
    let _guard = stack().guard();
    let (api, id, model) = anthropic_session("fail");
    stack().openai().script_always(
        &model,
        Reply::anthropic_error(
            400,
            "invalid_request_error",
            "messages: text content blocks must be non-empty",
        ),
    );
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["status"], 400, "{text}");
    assert_eq!(notices[0]["willRetry"], false, "{text}");
    assert_eq!(
        notices[0]["message"],
        "provider returned http 400: messages: text content blocks must be non-empty"
    );
    assert!(assistants(&transcript).is_empty(), "{text}");
    assert_eq!(stack().openai().requests_for(&model).len(), 1);
}

#[test]
fn overloaded_529_honours_retry_after_and_in_stream_overload_is_retried() {
    let _guard = stack().guard();
    let (api, id, model) = anthropic_session("retry");
    stack().openai().script(
        &model,
        [
            Reply::anthropic_overloaded().with_header("retry-after", "2"),
            Reply::stream_error(
                "half a repl",
                json!({"type": "overloaded_error", "message": "Overloaded"}),
            ),
        ],
    );
    // The third attempt (the default limit) succeeds.
    stack()
        .openai()
        .script_always(&model, Reply::text("recovered"));
    let started = Instant::now();
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    assert_eq!(notices.len(), 2, "{text}");
    assert_eq!(notices[0]["status"], 529, "{text}");
    assert_eq!(
        notices[0]["message"],
        "provider returned http 529: Overloaded"
    );
    assert_eq!(notices[0]["willRetry"], true, "{text}");
    assert_eq!(
        notices[0]["retryInMs"], 2000,
        "retry-after honoured: {text}"
    );
    assert_eq!(notices[1]["status"], Value::Null, "{text}");
    assert_eq!(
        notices[1]["message"],
        "provider stream error: overloaded_error: Overloaded"
    );
    assert_eq!(notices[1]["willRetry"], true, "{text}");
    let backoff = notices[1]["retryInMs"].as_u64().expect("backoff");
    assert!((1000..=2000).contains(&backoff), "jittered backoff: {text}");
    let replies: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    assert_eq!(replies, ["recovered"], "the cut reply is discarded: {text}");
    assert_eq!(stack().openai().requests_for(&model).len(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(2000 + backoff),
        "waited {:?}",
        started.elapsed()
    );
}

/// A client in a fresh tenant and an `openai` (Responses) session on a fresh model name.
fn responses_session(system_prompt: &str) -> (Api, String, String) {
    let api = stack().client("olga", &unique_name("responses"));
    let model = unique_name("gpt-test");
    let session = api.create_session(
        json!({"provider": "openai", "model": model, "systemPrompt": system_prompt}),
    );
    assert_eq!(
        (session.provider.as_str(), session.model.as_str()),
        ("openai", model.as_str())
    );
    (api, session.id, model)
}

#[test]
fn responses_tool_call_then_text_carrying_the_reasoning_item() {
    let _guard = stack().guard();
    let (api, id, model) = responses_session("use tools");
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", json!({"limit": 3}))])
                .with_text("Let me check.")
                .with_thinking("Looking up sessions.", "enc-abc")
                .with_usage(500, 60)
                .with_cache(400, 0),
            Reply::text("You have one session.").with_delay(Duration::from_millis(20)),
        ],
    );
    let mut follow = api.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&id, "followUp", "how many sessions?");
    let events = follow.collect_until(TURN, |e| e.event == "idle");
    let streamed: String = events.iter().filter_map(SseEvent::delta).collect();
    assert_eq!(streamed, "Let me check.You have one session.");

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let replies = assistants(&transcript);
    assert_eq!(replies.len(), 2, "{text}");
    assert_eq!(
        replies[0].content[0],
        ContentBlock::Reasoning {
            id: replies[0]
                .content
                .iter()
                .find_map(|b| match b {
                    ContentBlock::Reasoning { id, .. } => Some(id.clone()),
                    _ => None,
                })
                .expect("reasoning item"),
            summary: vec!["Looking up sessions.".into()],
            encrypted_content: Some("enc-abc".into()),
        },
        "{text}"
    );
    let calls: Vec<_> = replies[0].tool_calls().cloned().collect();
    assert_eq!(
        (calls[0].name.as_str(), &calls[0].arguments),
        ("list_sessions", &json!({"limit": 3}))
    );
    let usage = replies[0].usage.expect("usage");
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.reasoning_tokens
        ),
        (500, 60, 400, 30)
    );
    assert_eq!(replies[1].text(), "You have one session.");

    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(
        (first.method.as_str(), first.path.as_str()),
        ("POST", "/v1/responses")
    );
    assert_eq!(
        first.header("authorization"),
        Some(format!("Bearer {OPENAI_TEST_KEY}").as_str())
    );
    assert_eq!(first.body["instructions"], "use tools");
    assert_eq!(first.body["store"], false);
    assert_eq!(
        first.body["include"],
        json!(["reasoning.encrypted_content"])
    );
    let tools = first.body["tools"].as_array().expect("tools");
    assert!(
        tools
            .iter()
            .any(|t| t["type"] == "function" && t["name"] == "list_sessions")
    );
    let input = requests[1].body["input"].as_array().expect("input").clone();
    let kinds: Vec<&str> = input
        .iter()
        .map(|item| {
            item["type"]
                .as_str()
                .or(item["role"].as_str())
                .unwrap_or("?")
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "reasoning",
            "message",
            "function_call",
            "function_call_output"
        ],
        "{input:?}"
    );
    assert_eq!(input[1]["encrypted_content"], "enc-abc");
    assert_eq!(input[3]["call_id"], calls[0].id.as_str());
    assert_eq!(input[4]["call_id"], calls[0].id.as_str());
    let result = transcript.iter().find_map(tool_result).expect("result");
    assert_eq!(input[4]["output"], result.content.as_str());
}

#[test]
fn responses_429_honours_retry_after_ms_and_a_400_is_final() {
    let _guard = stack().guard();
    let (api, id, model) = responses_session("retry");
    stack().openai().script(
        &model,
        [
            Reply::rate_limited().with_header("retry-after-ms", "300"),
            Reply::text("recovered"),
            Reply::error(
                400,
                "Invalid 'input': bad",
                "invalid_request_error",
                "invalid_value",
            ),
        ],
    );
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    api.enqueue(&id, "followUp", "again?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    assert_eq!(notices.len(), 2, "{text}");
    assert_eq!(notices[0]["status"], 429, "{text}");
    assert_eq!(notices[0]["retryInMs"], 300, "{text}");
    assert_eq!(notices[0]["willRetry"], true, "{text}");
    assert_eq!(notices[1]["status"], 400, "{text}");
    assert_eq!(notices[1]["willRetry"], false, "{text}");
    assert_eq!(
        notices[1]["message"],
        "provider returned http 400: Invalid 'input': bad"
    );
    let replies: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    assert_eq!(replies, ["recovered"], "{text}");
    assert_eq!(stack().openai().requests_for(&model).len(), 3);
}

#[test]
fn config_documents_list_providers_and_the_model_table_without_keys() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("config"));
    let session = api.create_fake_session();
    let results = api.run_tool_calls(
        &session.id,
        &[
            ("read", json!({"path": "wuhu://config/models.json"})),
            ("read", json!({"path": "wuhu://config/server.json"})),
        ],
        TURN,
    );
    assert!(!results[0].is_error, "{:?}", results[0]);
    let table: Value = serde_json::from_str(&results[0].content).expect("models.json is JSON");
    let sonnet = table["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["id"] == "claude-sonnet-4-5")
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(sonnet["provider"], "anthropic");
    assert_eq!(sonnet["inputPerMtok"], 3.0);
    assert_eq!(sonnet["contextWindow"], 200_000);
    assert_eq!(table["unknownModel"]["price"], Value::Null);
    let settings: Value = serde_json::from_str(&results[1].content).expect("server.json");
    assert_eq!(
        settings["providers"],
        json!(["fake", "openai-compatible", "openai", "anthropic"])
    );
    assert_eq!(
        settings["anthropicBaseUrl"],
        stack().openai().anthropic_base_url()
    );
    assert_eq!(settings["anthropicKeyConfigured"], true);
    for result in &results {
        assert!(
            !result.content.contains(ANTHROPIC_TEST_KEY),
            "{}",
            result.content
        );
        assert!(
            !result.content.contains(OPENAI_TEST_KEY),
            "{}",
            result.content
        );
    }
}

#[test]
fn a_tenant_model_table_written_by_an_admin_prices_its_sessions_requests() {
    let _guard = stack().guard();
    let tenant = unique_name("models");
    let ada = stack().client("ada", &tenant);
    let admin = stack().admin_client("root", &tenant);
    let table = r#"{"models":[{"id":"fake-priced","provider":"fake","inputPerMtok":1000000,"outputPerMtok":2000000},{"id":"gpt-4o","contextWindow":64000}]}"#;
    // Only admins write the tenant's settings; invalid documents are refused with the reason.
    let response = ada.put_doc("config/models.json", table);
    assert_eq!(response.status, 403, "{response}");
    for (path, bad, says) in [
        ("config/models.json", "{", "not a valid model table"),
        (
            "config/models.json",
            r#"{"models":[{"id":"my-llama"}]}"#,
            "a new model needs a provider",
        ),
        ("config/tenant.json", r#"{"logs":1}"#, "unknown field"),
        ("config/notes.md", "hi", "config/ holds only"),
    ] {
        let response = admin.put_doc(path, bad);
        assert_eq!(response.status, 400, "{path} {bad}: {response}");
        let message = response.json()["error"]["message"].to_string();
        assert!(message.contains(says), "{path} {bad}: {message}");
    }
    admin
        .put_doc("config/models.json", table)
        .expect_status(200);
    let id = ada.create_session(json!({"model": "fake-priced"})).id;
    let results = ada.run_tool_calls(
        &id,
        &[
            ("read", json!({"path": "wuhu://config/models.json"})),
            (
                "write",
                json!({"path": "wuhu://workspace/config/models.json", "content": "{\"models\":[]}"}),
            ),
        ],
        TURN,
    );
    // The table in effect shows the tenant's rows over the built-in ones.
    let served: Value = serde_json::from_str(&results[0].content).expect("models.json is JSON");
    let row = |id: &str| {
        served["models"]
            .as_array()
            .and_then(|rows| rows.iter().find(|m| m["id"] == id).cloned())
            .unwrap_or_else(|| panic!("no row {id}: {served}"))
    };
    assert_eq!(row("fake-priced")["tenant"], true, "{served}");
    assert_eq!(
        (
            row("gpt-4o")["contextWindow"].as_u64(),
            row("gpt-4o")["inputPerMtok"].as_f64()
        ),
        (Some(64_000), Some(2.5))
    );
    assert_eq!(row("gpt-4o-mini")["tenant"], Value::Null);
    // A session's own tools cannot change the tenant's settings.
    assert!(results[1].is_error, "{:?}", results[1]);
    assert!(
        results[1].content.contains("only an admin"),
        "{:?}",
        results[1]
    );
    // Every request of the session is priced from the tenant's row.
    let transcript = ada.transcript(&id);
    let requests = assistants(&transcript);
    assert_eq!(requests.len(), 2, "{}", describe(&transcript));
    let mut expected = 0.0;
    for message in &requests {
        let usage = message.usage.as_ref().expect("usage");
        let want = usage.input_tokens as f64 + 2.0 * usage.output_tokens as f64;
        let cost = usage.cost_usd.expect("a priced model");
        assert!((cost - want).abs() < 1e-6, "{cost} != {want}");
        expected += want;
    }
    let usage = ada.get(&format!("/v1/sessions/{id}/usage")).json();
    let total = usage["costUsd"].as_f64().unwrap_or_default();
    assert!((total - expected).abs() < 1e-6, "{usage}");
    assert_eq!(usage["unpricedMessages"], 0, "{usage}");
}

/// A session keeps its reading of the tenant's settings between steps, and the tenant's index
/// tells every session keeping one of a change before the change is answered (decision 0021).
/// So whichever way the settings change (a `PUT`, a `DELETE`; sessions' tools may not write
/// `config/`), every step that starts after the answer, in every session of the tenant and
/// whoever owns it, is priced by the new table, and another tenant's sessions by their own.
#[test]
fn a_settings_change_reaches_every_session_of_the_tenant_before_it_is_answered() {
    let _guard = stack().guard();
    settings_changes_reach_every_session(stack());
}

/// The same with the index holding at most 2 of the 6 sessions (`WUHU_MAX_SETTINGS_HOLDERS`):
/// every hold past the bound lets go of another session, telling it to forget its reading, so
/// sessions keep dropping out and holding again between and during the changes, and still no
/// step is priced by an old table.
#[test]
fn a_settings_change_reaches_every_session_when_holders_are_let_go_to_make_room() {
    static SMALL: OnceLock<Stack> = OnceLock::new();
    let stack = SMALL.get_or_init(|| {
        Stack::start_with(StackOptions {
            vars: vec![("WUHU_MAX_SETTINGS_HOLDERS".into(), "2".into())],
            ..StackOptions::default()
        })
    });
    let _guard = stack.guard();
    settings_changes_reach_every_session(stack);
}

fn settings_changes_reach_every_session(stack: &Stack) {
    let tenant = unique_name("settings-told");
    let admin = stack.admin_client("root", &tenant);
    let members = [stack.client("ada", &tenant), stack.client("bob", &tenant)];
    let model = "fake-priced";
    let table = |price: u64| {
        json!({"models": [{
            "id": model, "provider": "fake",
            "inputPerMtok": price * 1_000_000, "outputPerMtok": price * 2_000_000,
        }]})
        .to_string()
    };
    admin
        .put_doc("config/models.json", table(1))
        .expect_status(200);
    // Another tenant, the same model name, its own price.
    let other_tenant = unique_name("settings-other");
    let other = stack.client("ada", &other_tenant);
    stack
        .admin_client("root", &other_tenant)
        .put_doc("config/models.json", table(11))
        .expect_status(200);
    let other_session = other.create_session(json!({"model": model})).id;
    let mut sessions: Vec<(&Api, String)> = Vec::new();
    for api in members.iter().chain([&admin]) {
        for _ in 0..2 {
            sessions.push((api, api.create_session(json!({"model": model})).id));
        }
    }
    // The cost of the newest reply of session `id` and the price it implies.
    let last_cost = |api: &Api, id: &str| {
        let transcript = api.transcript(id);
        let replies = assistants(&transcript);
        let usage = replies
            .last()
            .and_then(|m| m.usage)
            .unwrap_or_else(|| panic!("no usage: {}", describe(&transcript)));
        let tokens = (usage.input_tokens + 2 * usage.output_tokens) as f64;
        usage.cost_usd.map(|cost| cost / tokens)
    };
    let turn_everywhere = |label: &str, price: Option<u64>| {
        for (api, id) in &sessions {
            api.enqueue(id, "followUp", label);
        }
        for (api, id) in &sessions {
            api.wait_idle(id, TURN);
            let got = last_cost(api, id);
            match price {
                Some(price) => assert!(
                    got.is_some_and(|p| (p - price as f64).abs() < 1e-9),
                    "{label}: session {id} priced {got:?} per token, want {price}"
                ),
                None => assert_eq!(got, None, "{label}: session {id} is unpriced"),
            }
        }
    };
    // Every session takes a turn first, so each keeps a reading.
    // A session asks for its hold at its second reading and keeps its third: a few turns
    // without a change let every session keep a reading before the first change, and again
    // between changes.
    let mut price = Some(1);
    for label in ["first", "second", "third", "fourth"] {
        turn_everywhere(label, price);
    }
    for (label, change) in [
        ("raised", Some(Some(3))),
        ("unchanged after a raise", None),
        ("unchanged again", None),
        ("raised again", Some(Some(5))),
        ("deleted", Some(None)),
        ("unchanged after a delete", None),
        ("unchanged after a delete, again", None),
        ("written anew", Some(Some(2))),
        ("unchanged after a write", None),
        ("unchanged after a write, again", None),
        ("lowered", Some(Some(1))),
    ] {
        if let Some(new) = change {
            match new {
                Some(new) => admin
                    .put_doc("config/models.json", table(new))
                    .expect_status(200),
                None => admin.delete_doc("config/models.json").expect_status(204),
            };
            price = new;
        }
        turn_everywhere(label, price);
    }
    // The other tenant saw none of it.
    other.enqueue(&other_session, "followUp", "mine");
    other.wait_idle(&other_session, TURN);
    let got = last_cost(&other, &other_session);
    assert!(
        got.is_some_and(|p| (p - 11.0).abs() < 1e-9),
        "another tenant: {got:?}"
    );
}

#[test]
fn request_logs_keep_each_provider_exchange_redacted_for_admins_only() {
    let _guard = stack().guard();
    let tenant = unique_name("llm-logs");
    let ada = stack().client("ada", &tenant);
    let admin = stack().admin_client("root", &tenant);
    admin
        .put_doc(
            "config/tenant.json",
            r#"{"llmRequestLogs":true,"llmRequestLogDays":3}"#,
        )
        .expect_status(200);
    let model = unique_name("claude-logged");
    let id = ada
        .create_session(json!({"provider": "anthropic", "model": model}))
        .id;
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", json!({"limit": 1}))]).with_text("Checking."),
            Reply::text("Done."),
        ],
    );
    let pasted = "sk-ant-api03-pastedSecretPastedSecret";
    ada.enqueue(
        &id,
        "followUp",
        &format!("my key is {pasted}, list my sessions"),
    );
    ada.wait_idle(&id, TURN);
    assert_eq!(assistants(&ada.transcript(&id)).len(), 2);

    // Members may not read them.
    assert_eq!(ada.get("/v1/llm-logs").status, 403);
    assert_eq!(
        ada.get(&format!("/v1/llm-logs/{id}/0000000001-0000000000000.json"))
            .status,
        403
    );
    // One record per request, in step order, paged.
    let all = admin.get(&format!("/v1/llm-logs?session={id}")).json();
    let records = all["records"].as_array().cloned().unwrap_or_default();
    assert_eq!(records.len(), 2, "{all}");
    assert_eq!(
        (records[0]["step"].as_u64(), records[1]["step"].as_u64()),
        (Some(1), Some(2))
    );
    assert!(all.get("nextAfter").is_none(), "{all}");
    let first = admin
        .get(&format!("/v1/llm-logs?session={id}&limit=1"))
        .json();
    assert_eq!(first["records"].as_array().map(Vec::len), Some(1));
    let after = first["nextAfter"].as_str().expect("nextAfter").to_string();
    let second = admin
        .get(&format!("/v1/llm-logs?session={id}&limit=1&after={after}"))
        .json();
    assert_eq!(second["records"][0]["name"], records[1]["name"], "{second}");
    assert_eq!(admin.get("/v1/llm-logs").json()["records"], all["records"]);
    // The exchange is there, the credentials are not.
    for record in &records {
        let name = record["name"].as_str().unwrap();
        let response = admin.get(&format!("/v1/llm-logs/{name}"));
        assert_eq!(response.status, 200, "{response}");
        let text = response.text();
        assert!(!text.contains(ANTHROPIC_TEST_KEY), "{text}");
        assert!(!text.contains(pasted), "{text}");
        let log = response.json();
        assert_eq!(log["session"], id.as_str());
        assert_eq!(log["provider"], "anthropic");
        assert_eq!(log["response"]["status"], 200);
        let headers = log["request"]["headers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            headers.contains(&json!(["x-api-key", "[redacted]"])),
            "{headers:?}"
        );
        assert_eq!(log["request"]["body"]["model"], model.as_str());
        // A pasted key is masked before it is queued (docs/security.md, "Secrets"): the
        // provider, and so the log, never gets it.
        assert!(
            log["request"]["body"]["messages"][0]
                .to_string()
                .contains("my key is [secret]"),
            "{log}"
        );
        assert!(!log.to_string().contains(pasted), "{log}");
        assert!(
            log["response"]["body"]
                .as_str()
                .is_some_and(|b| b.contains("message_start")),
            "{log}"
        );
    }
    // Bad names and limits are refused; unknown records are 404; other tenants see nothing.
    for bad in [
        "/v1/llm-logs?limit=0",
        "/v1/llm-logs?limit=1001",
        "/v1/llm-logs?session=a/b",
    ] {
        assert_eq!(admin.get(bad).status, 400, "{bad}");
    }
    assert_eq!(
        admin.get(&format!("/v1/llm-logs/{id}/1-2.json")).status,
        400
    );
    assert_eq!(
        admin
            .get(&format!("/v1/llm-logs/{id}/0000000009-0000000000000.json"))
            .status,
        404
    );
    let other = stack().admin_client("root", &unique_name("llm-logs-off"));
    assert_eq!(
        other.get("/v1/llm-logs").json()["records"],
        json!([]),
        "another tenant"
    );
    assert_eq!(admin.post("/v1/llm-logs", &json!({})).status, 405);
}

#[test]
fn switching_from_anthropic_to_openai_mid_session_converts_the_transcript() {
    let _guard = stack().guard();
    let (api, id, claude) = anthropic_session("use tools");
    stack().openai().script(
        &claude,
        [
            Reply::tool_calls([("list_sessions", json!({"limit": 2}))])
                .with_text("Checking.")
                .with_thinking("private chain of thought", "sig-anthropic"),
            Reply::text("One session."),
        ],
    );
    api.enqueue(&id, "followUp", "how many sessions?");
    api.wait_idle(&id, TURN);
    let path = format!("/v1/sessions/{id}");
    for bad in [
        json!({"provider": "gemini"}),
        json!({"model": ""}),
        json!({"model": 7}),
    ] {
        let response = api.patch(&path, &bad);
        assert_eq!(response.status, 400, "{bad}: {response}");
    }
    let gpt = unique_name("gpt-test");
    let response = api.patch(&path, &json!({"provider": "openai", "model": gpt}));
    response.expect_status(200);
    let info = response.json();
    assert_eq!(
        (info["provider"].as_str(), info["model"].as_str()),
        (Some("openai"), Some(gpt.as_str()))
    );
    stack()
        .openai()
        .script(&gpt, [Reply::text("Still one session.")]);
    api.enqueue(&id, "followUp", "and now?");
    api.wait_idle(&id, TURN);

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::MODEL_CHANGED);
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["from"]["provider"], "anthropic", "{text}");
    assert_eq!(notices[0]["to"]["model"], gpt.as_str(), "{text}");
    assert_eq!(notices[0]["by"], "ada", "{text}");
    let replies = assistants(&transcript);
    let last = replies.last().expect("a reply");
    assert_eq!(
        (last.provider.as_str(), last.model.as_str(), last.text()),
        ("openai", gpt.as_str(), "Still one session.".to_string())
    );
    let call_id = replies[0].tool_calls().next().expect("a call").id.clone();

    // The new provider got the history in its own dialect: the call and its output as items,
    // Anthropic's signed thinking left out.
    let requests = stack().openai().requests_for(&gpt);
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/v1/responses");
    let items = request.body["input"].as_array().expect("input items");
    let of_type = |t: &str| items.iter().filter(|i| i["type"] == t).collect::<Vec<_>>();
    let calls = of_type("function_call");
    assert_eq!(calls.len(), 1, "{items:?}");
    assert_eq!(calls[0]["call_id"], call_id.as_str());
    assert_eq!(calls[0]["name"], "list_sessions");
    let outputs = of_type("function_call_output");
    assert_eq!(outputs.len(), 1, "{items:?}");
    assert_eq!(outputs[0]["call_id"], call_id.as_str());
    assert!(of_type("reasoning").is_empty(), "{items:?}");
    assert!(!request.raw_body.contains("sig-anthropic"));
    assert!(!request.raw_body.contains("private chain of thought"));
    // Usage is kept per model.
    let usage = api.get(&format!("/v1/sessions/{id}/usage")).json();
    assert_eq!(
        usage["byModel"].as_array().map(Vec::len),
        Some(2),
        "{usage}"
    );
}

#[test]
fn the_set_model_tool_and_js_set_model_switch_like_the_patch() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("set-model"));
    let id = api.create_fake_session().id;
    let model_of = |api: &Api| {
        let session = api.session(&id);
        (
            session.session.provider.clone(),
            session.session.model.clone(),
        )
    };
    let bad = api.run_tool(&id, "set_model", json!({"provider": "gemini"}), TURN);
    assert!(
        bad.is_error && bad.content.contains("unknown provider"),
        "{bad:?}"
    );
    let same = api.run_tool(&id, "set_model", json!({"model": "fake-echo"}), TURN);
    assert!(
        !same.is_error && same.content.contains("already uses"),
        "{same:?}"
    );
    assert_eq!(
        model_of(&api),
        ("fake".to_string(), "fake-echo".to_string())
    );

    let set = api.run_tool(&id, "set_model", json!({"model": "fake-two"}), TURN);
    assert!(!set.is_error, "{set:?}");
    assert_eq!(model_of(&api), ("fake".to_string(), "fake-two".to_string()));
    // The step after the tool result already went to the new model.
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    assert_eq!(
        assistants(&transcript).last().unwrap().model,
        "fake-two",
        "{text}"
    );

    let result = api.run_tool(
        &id,
        "js",
        json!({"code": "await wuhu.session.setModel({model: 'fake-three'})"}),
        TURN,
    );
    assert!(!result.is_error, "{result:?}");
    let value: Value = serde_json::from_str(&result.content).expect("a JSON value");
    assert_eq!(
        value,
        json!({"provider": "fake", "model": "fake-three", "switched": true})
    );
    assert_eq!(
        model_of(&api),
        ("fake".to_string(), "fake-three".to_string())
    );
    let listed = api.list_sessions("");
    let info = listed.sessions.iter().find(|s| s.id == id).expect("listed");
    assert_eq!(info.model, "fake-three");

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::MODEL_CHANGED);
    assert_eq!(notices.len(), 2, "{text}");
    assert_eq!(notices[0]["to"]["model"], "fake-two", "{text}");
    assert_eq!(notices[1]["from"]["model"], "fake-two", "{text}");
    assert_eq!(notices[1]["to"]["model"], "fake-three", "{text}");
    assert!(notices.iter().all(|n| n["by"] == "ada"), "{text}");
}

#[test]
fn a_spent_budget_ends_the_turn_with_a_notice_and_enqueue_answers_402_until_raised() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("budget"));
    let id = api.create_fake_session().id;
    let path = format!("/v1/sessions/{id}");
    for bad in [
        json!({"budget": {"maxUsd": -1}}),
        json!({"budget": {"maxTokens": "many"}}),
        json!({"budget": {"maxCoins": 3}}),
    ] {
        let response = api.patch(&path, &bad);
        assert_eq!(response.status, 400, "{bad}: {response}");
    }
    api.patch(&path, &json!({"budget": {"maxTokens": 1}}))
        .expect_status(200);
    // The first request runs (nothing spent yet) and calls a tool; the step after the tool
    // result would pass the budget: the turn ends there.
    api.enqueue(
        &id,
        "followUp",
        r#"@fake {"toolCalls":[{"name":"list_sessions","arguments":{"limit":1}}]}"#,
    );
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    assert_eq!(assistants(&transcript).len(), 1, "{text}");
    assert!(
        transcript.iter().any(|e| tool_result(e).is_some()),
        "{text}"
    );
    let notices = customs(&transcript, custom_types::BUDGET_EXCEEDED);
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["limit"], "tokens");
    let response = api.enqueue_raw(&id, "followUp", "more please");
    assert_eq!(response.status, 402, "{response}");
    assert_eq!(response.json()["error"]["code"], "budget_exceeded");
    let usage = api.get(&format!("/v1/sessions/{id}/usage")).json();
    assert_eq!(usage["budget"]["maxTokens"], 1, "{usage}");
    assert!(usage["spent"]["tokens"].as_u64() > Some(1), "{usage}");
    // Raised (removed): the session continues.
    api.patch(&path, &json!({"budget": {}})).expect_status(200);
    api.enqueue(&id, "followUp", "more please");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    assert_eq!(assistants(&transcript).len(), 2);
    assert_eq!(customs(&transcript, custom_types::BUDGET_SET).len(), 2);
}

#[test]
fn a_budget_set_at_creation_holds_from_the_first_turn() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("budget-create"));
    for bad in [
        json!({"budget": {"maxUsd": -1}}),
        json!({"budget": {"maxTokens": "many"}}),
        json!({"budget": {"maxCoins": 3}}),
    ] {
        let response = api.post("/v1/sessions", &bad);
        assert_eq!(response.status, 400, "{bad}: {response}");
        assert_eq!(response.json()["error"]["code"], "bad_request");
    }
    let id = api.create_session(json!({"budget": {"maxTokens": 1}})).id;
    let usage = api.get(&format!("/v1/sessions/{id}/usage")).json();
    assert_eq!(usage["budget"]["maxTokens"], 1, "{usage}");
    // The first request runs (nothing spent yet); the step after its tool result would pass
    // the budget: the turn ends there, as with a budget set by PATCH.
    api.enqueue(
        &id,
        "followUp",
        r#"@fake {"toolCalls":[{"name":"list_sessions","arguments":{"limit":1}}]}"#,
    );
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    assert_eq!(assistants(&transcript).len(), 1, "{text}");
    let set = customs(&transcript, custom_types::BUDGET_SET);
    assert_eq!(set.len(), 1, "{text}");
    assert_eq!(set[0]["by"], "ada", "{text}");
    assert_eq!(
        customs(&transcript, custom_types::BUDGET_EXCEEDED).len(),
        1,
        "{text}"
    );
    let response = api.enqueue_raw(&id, "followUp", "more please");
    assert_eq!(response.status, 402, "{response}");
}

#[test]
fn tenant_usage_adds_up_sessions_by_session_user_and_model_for_admins_and_owners() {
    let _guard = stack().guard();
    let tenant = unique_name("usage");
    let ada = stack().client("ada", &tenant);
    let bob = stack().client("bob", &tenant);
    let admin = stack().admin_client("root", &tenant);
    let ada_session = ada.create_fake_session().id;
    let bob_session = bob.create_fake_session().id;
    for turn in 0..2 {
        ada.enqueue(&ada_session, "followUp", &format!("turn {turn}"));
        ada.wait_idle(&ada_session, TURN);
    }
    bob.enqueue(&bob_session, "followUp", "hello");
    bob.wait_idle(&bob_session, TURN);
    let session_usage = |api: &Api, id: &str| api.get(&format!("/v1/sessions/{id}/usage")).json();
    let ada_usage = session_usage(&ada, &ada_session);
    let bob_usage = session_usage(&bob, &bob_session);
    assert_eq!(
        (
            ada_usage["messages"].as_u64(),
            bob_usage["messages"].as_u64()
        ),
        (Some(2), Some(1))
    );

    // Sessions report to the index after their replies: wait until it has them all.
    let by_session = wuhu_e2e::util::wait_for("the index to hold every reply", TURN, || {
        let answer = admin.get("/v1/usage?by=session").json();
        (answer["total"]["messages"] == 3).then_some(answer)
    });
    let group = |answer: &Value, key: &str| {
        answer["groups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["key"] == key).cloned())
            .unwrap_or_else(|| panic!("no group {key}: {answer}"))
    };
    // The index agrees with each session's own figures.
    for (id, usage) in [(&ada_session, &ada_usage), (&bob_session, &bob_usage)] {
        let row = group(&by_session, id);
        for field in ["messages", "inputTokens", "outputTokens"] {
            assert_eq!(row[field], usage[field], "{field} of {id}: {by_session}");
        }
    }
    let by_user = admin.get("/v1/usage?by=user").json();
    assert_eq!(group(&by_user, "ada")["messages"], 2, "{by_user}");
    assert_eq!(group(&by_user, "bob")["messages"], 1, "{by_user}");
    let by_model = admin.get("/v1/usage?by=model").json();
    let fake = group(&by_model, "fake-echo");
    assert_eq!(
        (fake["provider"].as_str(), fake["messages"].as_u64()),
        (Some("fake"), Some(3))
    );
    // A member sees the sessions they own only.
    let mine = ada.get("/v1/usage?by=session").json();
    assert_eq!(mine["groups"].as_array().map(Vec::len), Some(1), "{mine}");
    assert_eq!(mine["total"]["messages"], 2, "{mine}");
    // A range without those hours is empty; bad queries are refused.
    let old = admin.get("/v1/usage?from=0&to=3600").json();
    assert_eq!(old["total"]["messages"], 0, "{old}");
    for bad in ["by=tenant", "from=x", "from=10&to=5", "to=-1"] {
        let response = admin.get(&format!("/v1/usage?{bad}"));
        assert_eq!(response.status, 400, "{bad}: {response}");
        assert_eq!(response.json()["error"]["code"], "bad_request");
    }
    assert_eq!(admin.post("/v1/usage", &json!({})).status, 405);
}

#[test]
fn a_spent_tenant_budget_ends_turns_and_enqueue_answers_402_until_an_admin_raises_it() {
    let _guard = stack().guard();
    let tenant = unique_name("tenant-budget");
    let ada = stack().client("ada", &tenant);
    let admin = stack().admin_client("root", &tenant);
    let response = ada.send_raw("PUT", "/v1/budget", r#"{"maxTokens":1}"#);
    assert_eq!(response.status, 403, "{response}");
    for bad in [r#"{"maxUsd":-1}"#, r#"{"maxCoins":3}"#, "nope"] {
        let response = admin.send_raw("PUT", "/v1/budget", bad);
        assert_eq!(response.status, 400, "{bad}: {response}");
    }
    let response = admin.send_raw("PUT", "/v1/budget", r#"{"maxTokens":1}"#);
    assert_eq!(response.status, 200, "{response}");
    assert_eq!(response.json()["budget"]["maxTokens"], 1);
    let first = ada.create_fake_session().id;
    let second = ada.create_fake_session().id;
    let tenant_notices = |id: &str| {
        let transcript = ada.transcript(id);
        let notices: Vec<Value> = customs(&transcript, custom_types::BUDGET_EXCEEDED)
            .into_iter()
            .cloned()
            .collect();
        (transcript, notices)
    };
    // The first request runs (nothing spent yet) and calls a tool; the step after the result
    // finds the tenant's budget spent: the turn ends there.
    ada.enqueue(
        &first,
        "followUp",
        r#"@fake {"toolCalls":[{"name":"list_sessions","arguments":{"limit":1}}]}"#,
    );
    ada.wait_idle(&first, TURN);
    let (transcript, notices) = tenant_notices(&first);
    let text = describe(&transcript);
    assert_eq!(assistants(&transcript).len(), 1, "{text}");
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(
        (notices[0]["scope"].as_str(), notices[0]["limit"].as_str()),
        (Some("tenant"), Some("tokens"))
    );
    let response = ada.enqueue_raw(&first, "followUp", "more please");
    assert_eq!(response.status, 402, "{response}");
    assert_eq!(response.json()["error"]["code"], "budget_exceeded");
    // Another session of the tenant makes no request at all.
    ada.enqueue(&second, "followUp", "hello");
    ada.wait_idle(&second, TURN);
    let (transcript, notices) = tenant_notices(&second);
    assert!(
        assistants(&transcript).is_empty(),
        "{}",
        describe(&transcript)
    );
    assert_eq!(notices.len(), 1);
    assert_eq!(ada.enqueue_raw(&second, "followUp", "again").status, 402);
    // Members read the budget and what was spent: the one request.
    let state = ada.get("/v1/budget").json();
    let usage = ada.get(&format!("/v1/sessions/{first}/usage")).json();
    assert_eq!(
        state["spent"]["tokens"], usage["spent"]["tokens"],
        "{state} {usage}"
    );
    // Raised (removed) by an admin: sessions continue.
    admin.send_raw("PUT", "/v1/budget", "{}").expect_status(200);
    ada.enqueue(&first, "followUp", "more please");
    ada.wait_idle(&first, TURN);
    assert_eq!(assistants(&ada.transcript(&first)).len(), 2);
    assert_eq!(ada.post("/v1/budget", &json!({})).status, 405);
}

/// A first budget on a tenant that had none (decision 0022). Sessions that know the tenant has
/// no budget send their requests without reporting first, and report a quick run of them
/// together; setting a budget tells them (as settings holders) before `PUT /v1/budget` answers.
/// So wherever the answer falls among the turns of several members' sessions, each sends at
/// most the one request it had decided on before it, then its turn ends with the tenant's
/// notice; and the tenant's spent total is every request of every session (no report lost).
#[test]
fn a_first_tenant_budget_stops_running_sessions_within_one_request_wherever_it_falls() {
    let _guard = stack().guard();
    // (turns each session takes before the loops start, loop turns before the budget is put)
    for (warm, before) in [(3, 1), (3, 4), (5, 2), (8, 7)] {
        let tenant = unique_name("first-budget");
        let admin = stack().admin_client("root", &tenant);
        let members: Vec<(Api, String, String)> = ["ada", "bob", "cy"]
            .into_iter()
            .map(|sub| {
                let api = stack().client(sub, &tenant);
                let model = unique_name("gpt-first-budget");
                stack()
                    .openai()
                    .script_always(&model, Reply::text("fine").with_usage(10, 5));
                let id = api
                    .create_session(json!({"provider": "openai-compatible", "model": model}))
                    .id;
                (api, id, model)
            })
            .collect();
        let requests = |model: &str| stack().openai().requests_for(model).len();
        // Warm: each session holds the tenant's settings and knows there is no budget.
        for (api, id, _) in &members {
            for _ in 0..warm {
                api.enqueue(id, "followUp", "hi");
                api.wait_idle(id, TURN);
            }
        }
        let (at_answer, after) = std::thread::scope(|scope| {
            let loops: Vec<_> = members
                .iter()
                .map(|(api, id, _)| {
                    scope.spawn(move || {
                        // Turns back to back until the tenant's budget refuses one.
                        for _ in 0..2_000 {
                            let response = api.enqueue_raw(id, "followUp", "more");
                            if response.status == 402 {
                                assert_eq!(response.json()["error"]["code"], "budget_exceeded");
                                return;
                            }
                            assert!(response.status < 300, "{response}");
                            api.wait_idle(id, TURN);
                        }
                        panic!("the session never met the tenant's budget");
                    })
                })
                .collect();
            wuhu_e2e::util::wait_for("every session to run its loop", TURN, || {
                members
                    .iter()
                    .all(|(_, _, model)| requests(model) >= warm + before)
                    .then_some(())
            });
            let response = admin.send_raw("PUT", "/v1/budget", r#"{"maxTokens":1}"#);
            assert_eq!(response.status, 200, "{response}");
            let at_answer: Vec<usize> = members.iter().map(|(_, _, m)| requests(m)).collect();
            for handle in loops {
                handle.join().expect("a session's loop");
            }
            let after: Vec<usize> = members.iter().map(|(_, _, m)| requests(m)).collect();
            (at_answer, after)
        });
        let mut spent = 0;
        for (((api, id, _), at_answer), after) in members.iter().zip(at_answer).zip(after) {
            assert!(
                after <= at_answer + 1,
                "warm {warm}, before {before}: {id} sent {} requests after the budget was put",
                after - at_answer
            );
            let transcript = api.transcript(id);
            let notices = customs(&transcript, custom_types::BUDGET_EXCEEDED);
            assert_eq!(notices.len(), 1, "{}", describe(&transcript));
            assert_eq!(notices[0]["scope"], "tenant");
            assert_eq!(assistants(&transcript).len(), after);
            let usage = api.get(&format!("/v1/sessions/{id}/usage")).json();
            spent += usage["spent"]["tokens"].as_u64().expect("spent tokens");
        }
        // Every request of every session is counted: the runs reported together were all sent.
        let state = admin.get("/v1/budget").json();
        assert_eq!(state["spent"]["tokens"], spent, "{state}");
    }
}

/// A deleted session's usage stays counted in the tenant's (docs/api.md), the steps whose
/// report was still waiting out its delay when the session was deleted too (decision 0022: the
/// deletion sends it before the session is hidden).
#[test]
fn a_session_deleted_right_after_its_turns_leaves_all_of_its_usage_counted() {
    let _guard = stack().guard();
    let tenant = unique_name("deleted-usage");
    let admin = stack().admin_client("root", &tenant);
    let api = stack().client("ada", &tenant);
    for turns in [1, 3, 6] {
        let model = unique_name("gpt-deleted-usage");
        stack()
            .openai()
            .script_always(&model, Reply::text("noted").with_usage(10, 5));
        let id = api
            .create_session(json!({"provider": "openai-compatible", "model": model}))
            .id;
        for _ in 0..turns {
            api.enqueue(&id, "followUp", "note this");
            api.wait_idle(&id, TURN);
        }
        let response = api.send(api.request("DELETE", &format!("/v1/sessions/{id}")));
        assert_eq!(response.status, 204, "{response}");
        let by_session = admin.get("/v1/usage?by=session").json();
        let row = by_session["groups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["key"] == id.as_str()).cloned())
            .unwrap_or_else(|| panic!("{turns} turns: no usage of {id}: {by_session}"));
        assert_eq!(row["messages"], turns, "{turns} turns: {by_session}");
        assert_eq!(row["inputTokens"], 10 * turns as u64, "{by_session}");
    }
}

/// Input plus output tokens of one assistant message.
fn request_tokens(message: &wuhu_core::wire::AssistantMessage) -> u64 {
    message
        .usage
        .as_ref()
        .map_or(0, |u| u.input_tokens + u.output_tokens)
}

#[test]
fn concurrent_sessions_overshoot_the_tenant_budget_by_at_most_one_request_each() {
    const SESSIONS: usize = 4;
    const TURNS: usize = 12;
    let _guard = stack().guard();
    // Each turn is two requests (a tool call, then the reply after its result), slowed so the
    // sessions' requests overlap.
    let message = r#"@fake {"toolCalls":[{"name":"list_sessions","arguments":{"limit":1}}],"afterTools":"done","delayMs":20,"chunks":3}"#;
    // One request's size, measured in a tenant of its own.
    let probe = stack().client("ada", &unique_name("budget-probe"));
    let probe_id = probe.create_fake_session().id;
    probe.enqueue(&probe_id, "followUp", message);
    probe.wait_idle(&probe_id, TURN);
    let probe_transcript = probe.transcript(&probe_id);
    let first_request = assistants(&probe_transcript)
        .first()
        .map(|m| request_tokens(m))
        .unwrap_or_default();
    assert!(first_request > 0, "{}", describe(&probe_transcript));
    // About three requests per session: far less than the turns queued for them.
    let budget = first_request * 3 * SESSIONS as u64;
    let tenant = unique_name("budget-concurrent");
    let admin = stack().admin_client("root", &tenant);
    admin
        .send_raw("PUT", "/v1/budget", format!(r#"{{"maxTokens":{budget}}}"#))
        .expect_status(200);
    let ada = stack().client("ada", &tenant);
    let ids: Vec<String> = (0..SESSIONS)
        .map(|_| ada.create_fake_session().id)
        .collect();
    // Each session in a thread of its own: a turn, then the next, until enqueue answers 402.
    let refused: Vec<bool> = std::thread::scope(|scope| {
        let threads: Vec<_> = ids
            .iter()
            .map(|id| {
                let ada = ada.clone();
                scope.spawn(move || {
                    for _ in 0..TURNS {
                        let response = ada.enqueue_raw(id, "followUp", message);
                        if response.status == 402 {
                            return true;
                        }
                        assert_eq!(response.status, 200, "{response}");
                        ada.wait_idle(id, TURN);
                    }
                    false
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("session thread"))
            .collect()
    });
    assert!(refused.iter().all(|r| *r), "every session met the budget");
    let mut total = 0;
    let mut allowance = 0;
    for id in &ids {
        let transcript = ada.transcript(id);
        let text = describe(&transcript);
        let requests = assistants(&transcript);
        let notices = customs(&transcript, custom_types::BUDGET_EXCEEDED);
        assert!(!notices.is_empty(), "{text}");
        assert!(notices.iter().all(|n| n["scope"] == "tenant"), "{text}");
        total += requests.iter().map(|m| request_tokens(m)).sum::<u64>();
        // One request of each session may start before the others' are counted.
        allowance += requests
            .iter()
            .map(|m| request_tokens(m))
            .max()
            .unwrap_or(0);
    }
    assert!(
        total <= budget + allowance,
        "spent {total} tokens against a budget of {budget} (+ {allowance}, the largest request of each session)"
    );
    // What the tenant counted is what the sessions recorded.
    let counted = wuhu_e2e::util::wait_for("the index to count every request", TURN, || {
        let state = admin.get("/v1/budget").json();
        (state["spent"]["tokens"].as_u64() == Some(total)).then_some(state)
    });
    assert_eq!(counted["budget"]["maxTokens"], budget);
}
