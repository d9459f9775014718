//! The `openai-compatible` provider against a local server speaking the real Chat Completions
//! streaming format. Each test scripts its own model name, so tests share one server.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{StopReason, custom_types};
use wuhu_e2e::entries::{assert_contiguous, assistants, customs, describe, tool_result};
use wuhu_e2e::stack::OPENAI_TEST_KEY;
use wuhu_e2e::{Api, Reply, SseEvent, Stack};

const TURN: Duration = Duration::from_secs(60);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

/// A client in a fresh tenant and a openai-compatible session on a fresh model name.
fn openai_session(system_prompt: &str) -> (Api, String, String) {
    stack().provider_session("olivia", "openai-compatible", "gpt-test", system_prompt)
}

#[test]
fn text_stream_reaches_followers_and_the_request_carries_key_context_and_tools() {
    let _guard = stack().guard();
    let (api, id, model) = openai_session("be brief");
    let text = "Hello from the fake OpenAI server, streamed in chunks.";
    stack().openai().script(
        &model,
        [Reply::text(text)
            .with_delay(Duration::from_millis(30))
            .with_usage(42, 13)],
    );
    let mut follow = api.follow(&id, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&id, "followUp", "hi");
    let events = follow.collect_until(TURN, |e| e.event == "idle");
    let streamed: String = events.iter().filter_map(SseEvent::delta).collect();
    assert_eq!(streamed, text);
    assert!(events.iter().filter(|e| e.delta().is_some()).count() >= 2);

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let replies = assistants(&transcript);
    assert_eq!(replies.len(), 1, "{}", describe(&transcript));
    let reply = replies[0];
    assert_eq!(reply.text(), text);
    assert_eq!(
        (reply.provider.as_str(), reply.model.as_str()),
        ("openai-compatible", model.as_str())
    );
    assert_eq!(reply.stop_reason, StopReason::Stop);
    let usage = reply.usage.expect("usage recorded");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.total_tokens),
        (42, 13, 55)
    );

    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {OPENAI_TEST_KEY}").as_str())
    );
    assert_eq!(request.body["stream"], true);
    let messages = request.messages();
    assert_eq!(
        messages.first(),
        Some(&json!({"role": "system", "content": "be brief"}))
    );
    assert_eq!(
        messages.last(),
        Some(&json!({"role": "user", "content": "hi"}))
    );
    let tools = request.tool_names();
    assert!(
        tools.iter().any(|t| t == "list_sessions") && tools.iter().any(|t| t == "read_session"),
        "{tools:?}"
    );
}

#[test]
fn tool_calls_round_trip_through_the_provider() {
    let _guard = stack().guard();
    let (api, id, model) = openai_session("use tools");
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("list_sessions", json!({"limit": 5}))]).with_text("Let me check."),
            Reply::text("You have one session."),
        ],
    );
    api.enqueue(&id, "followUp", "how many sessions do I have?");
    api.wait_idle(&id, TURN);

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let replies = assistants(&transcript);
    assert_eq!(replies.len(), 2, "{text}");
    let calls: Vec<_> = replies[0].tool_calls().cloned().collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(
        (calls[0].name.as_str(), &calls[0].arguments),
        ("list_sessions", &json!({"limit": 5}))
    );
    assert_eq!(replies[0].text(), "Let me check.");
    assert_eq!(replies[0].stop_reason, StopReason::ToolUse);
    let result = transcript
        .iter()
        .find_map(tool_result)
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(result.tool_call_id, calls[0].id);
    assert!(!result.is_error, "{text}");
    assert!(
        result.content.contains(&id),
        "list_sessions lists this session: {text}"
    );
    assert_eq!(replies[1].text(), "You have one session.");

    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 2);
    let messages = requests[1].messages();
    let assistant = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("{messages:?}"));
    assert_eq!(assistant["tool_calls"][0]["id"], calls[0].id.as_str());
    assert_eq!(
        assistant["tool_calls"][0]["function"]["name"],
        "list_sessions"
    );
    let arguments: Value = serde_json::from_str(
        assistant["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(arguments, json!({"limit": 5}));
    let tool = messages.last().unwrap();
    assert_eq!(tool["role"], "tool");
    assert_eq!(tool["tool_call_id"], calls[0].id.as_str());
    assert_eq!(tool["content"], result.content.as_str());
}

#[test]
fn rate_limit_is_a_visible_notice_and_the_retry_succeeds() {
    let _guard = stack().guard();
    let (api, id, model) = openai_session("retry");
    stack()
        .openai()
        .script(&model, [Reply::rate_limited(), Reply::text("recovered")]);
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["status"], 429, "{text}");
    assert_eq!(notices[0]["willRetry"], true, "{text}");
    assert_eq!(notices[0]["attempt"], 1, "{text}");
    assert!(
        notices[0]["message"]
            .as_str()
            .unwrap()
            .contains("Rate limit reached"),
        "{text}"
    );
    let replies: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    assert_eq!(replies, ["recovered"], "{text}");
    assert_eq!(stack().openai().requests_for(&model).len(), 2);
}

#[test]
fn persistent_server_errors_end_the_turn_idle_with_notices() {
    let _guard = stack().guard();
    let (api, id, model) = openai_session("fail");
    stack().openai().script_always(
        &model,
        Reply::error(500, "The server had an error", "server_error", "internal"),
    );
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    let attempts = wuhu_core::session::MAX_LLM_ATTEMPTS as usize;
    assert_eq!(notices.len(), attempts, "{text}");
    for (i, notice) in notices.iter().enumerate() {
        assert_eq!(notice["status"], 500, "{text}");
        assert_eq!(notice["willRetry"], i + 1 < attempts, "{text}");
    }
    assert!(assistants(&transcript).is_empty(), "{text}");
    assert_eq!(stack().openai().requests_for(&model).len(), attempts);
}

#[test]
fn malformed_stream_becomes_a_notice_not_a_hang() {
    let _guard = stack().guard();
    let (api, id, model) = openai_session("malformed");
    stack().openai().script_always(&model, Reply::malformed());
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    assert!(!notices.is_empty(), "{text}");
    assert_eq!(notices.last().unwrap()["willRetry"], false, "{text}");
    assert!(assistants(&transcript).is_empty(), "{text}");
}

#[test]
fn truncated_stream_is_a_notice_and_the_step_is_retried_cleanly() {
    let _guard = stack().guard();
    let (api, id, model) = openai_session("truncated");
    stack()
        .openai()
        .script(&model, [Reply::truncated(), Reply::text("second try")]);
    api.enqueue(&id, "followUp", "hello?");
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::LLM_ERROR);
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["willRetry"], true, "{text}");
    let replies: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    assert_eq!(
        replies,
        ["second try"],
        "the half-streamed reply is discarded: {text}"
    );
}

/// A session keeps its reading of the tenant's settings while the tenant's index holds it, and
/// the index tells it of every change before the change is answered (decision 0021). Whatever
/// the change, the next turn must be priced by the table in effect when it started, its reply
/// must stream to a follower exactly once, and each turn sends one request: none is sent with
/// the old table and dropped.
#[test]
fn a_model_table_changed_between_turns_prices_the_next_turn_and_its_reply_streams_once() {
    let _guard = stack().guard();
    let tenant = wuhu_e2e::util::unique_name("settings");
    let olivia = stack().client("olivia", &tenant);
    let admin = stack().admin_client("root", &tenant);
    let model = wuhu_e2e::util::unique_name("gpt-priced");
    let table = |price: u64| {
        json!({"models": [{
            "id": model, "provider": "openai-compatible",
            "inputPerMtok": price * 1_000_000, "outputPerMtok": price * 2_000_000,
        }]})
        .to_string()
    };
    let text = "The same reply, in several chunks, every time.";
    stack()
        .openai()
        .script_always(&model, Reply::text(text).with_usage(10, 5));
    admin
        .put_doc("config/models.json", table(1))
        .expect_status(200);
    let id = olivia
        .create_session(json!({"provider": "openai-compatible", "model": model}))
        .id;
    // Unchanged, changed, changed again, unchanged, deleted (the built-in table: no price).
    let prices = [Some(1), Some(1), Some(3), Some(7), Some(7), None, Some(2)];
    let mut changes = 0;
    let mut previous = None;
    for (turn, price) in prices.into_iter().enumerate() {
        if price != previous && turn > 0 {
            changes += 1;
            match price {
                Some(price) => admin
                    .put_doc("config/models.json", table(price))
                    .expect_status(200),
                None => admin.delete_doc("config/models.json").expect_status(204),
            };
        }
        previous = price;
        let since = olivia.transcript(&id).last().map_or(0, |e| e.cursor);
        let mut follow = olivia.follow(&id, &format!("sinceCursor={since}&timeoutSeconds=60"));
        olivia.enqueue(&id, "followUp", &format!("turn {turn}"));
        let events = follow.collect_until(TURN, |e| e.event == "idle");
        let streamed: String = events.iter().filter_map(SseEvent::delta).collect();
        assert_eq!(streamed, text, "turn {turn}: the reply streams once");
        let transcript = olivia.transcript(&id);
        let replies = assistants(&transcript);
        assert_eq!(replies.len(), turn + 1, "{}", describe(&transcript));
        let usage = replies[turn].usage.as_ref().expect("usage");
        let cost = usage.cost_usd;
        match price {
            Some(price) => {
                let want = (price * (10 + 2 * 5)) as f64;
                assert!(
                    cost.is_some_and(|c| (c - want).abs() < 1e-6),
                    "turn {turn} at price {price}: cost {cost:?}, want {want}"
                );
            }
            None => assert_eq!(cost, None, "turn {turn}: an unknown model is unpriced"),
        }
    }
    // One request per turn, changed settings or not.
    assert_eq!(
        stack().openai().requests_for(&model).len(),
        prices.len(),
        "requests after {changes} changes"
    );
}
