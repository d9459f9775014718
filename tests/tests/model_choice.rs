//! Which provider and model a session may use, through the real Worker (issue 29: N6, N8;
//! `wuhu_core::llm::choice`):
//!
//! * budgets see every model: while a USD limit applies (the session's, the tenant's, a
//!   parent's), a model without a price is refused (`400 unpriced_model`) when a session is
//!   created, patched, switched by `set_model` or spawned with it, and a session already on one
//!   spends nothing once a limit is set (its turn ends before the request);
//! * `fake` is for development: a Worker started without `WUHU_ENABLE_FAKE_PROVIDER=1` refuses
//!   it (and a session naming no provider, without a tenant default), and honours the tenant's
//!   `defaultProvider` / `defaultModel`.
//!
//! Users: `ada` (member) and `root` (admin) of a fresh tenant per test. The OpenAI-compatible
//! provider is the stack's fake OpenAI server, scripted by model name.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::custom_types;
use wuhu_e2e::entries::{assistants, customs, describe, tool_result};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Reply, Stack, StackOptions};

const TURN: Duration = Duration::from_secs(90);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// The `400` of a refused choice: its code, and a message that says what to do.
#[track_caller]
fn assert_refused(response: &wuhu_e2e::Response, code: &str, says: &[&str]) {
    assert_eq!(response.status, 400, "{response}");
    let error = &response.json()["error"];
    assert_eq!(error["code"], code, "{response}");
    let message = error["message"].as_str().unwrap_or_default();
    for fragment in says {
        assert!(message.contains(fragment), "{fragment:?} not in {message}");
    }
}

/// The results of the tool calls in `entries`, as (is_error, content).
fn results(entries: &[wuhu_core::wire::Entry]) -> Vec<(bool, String)> {
    entries
        .iter()
        .filter_map(tool_result)
        .map(|r| (r.is_error, r.content.clone()))
        .collect()
}

#[test]
fn a_usd_budget_refuses_unpriced_models_wherever_one_is_chosen() {
    let _guard = stack().guard();
    let tenant = unique_name("unpriced");
    let ada = stack().client("ada", &tenant);
    let root = stack().admin_client("root", &tenant);
    // Model names unique to this test: `mystery-…` has no price; `gpt-4o-…` is priced as a
    // dated snapshot of gpt-4o.
    let mystery = unique_name("mystery");
    let priced = format!("gpt-4o-{}", unique_name("snap"));
    let provider = "openai-compatible";

    // No USD limit anywhere: any model may be chosen (a token limit counts every model).
    let before = ada
        .create_session(json!({"provider": provider, "model": mystery}))
        .id;
    ada.create_session(json!({"provider": provider, "model": mystery, "budget": {"maxTokens": 5}}));
    // The session's own USD limit refuses it at creation.
    assert_refused(
        &ada.post(
            "/v1/sessions",
            &json!({"provider": provider, "model": mystery, "budget": {"maxUsd": 1}}),
        ),
        "unpriced_model",
        &[&mystery, "no price", "config/models.json", "the session's"],
    );

    // The tenant's USD limit refuses it everywhere.
    root.send_raw("PUT", "/v1/budget", r#"{"maxUsd":50}"#)
        .expect_status(200);
    assert_refused(
        &ada.post(
            "/v1/sessions",
            &json!({"provider": provider, "model": mystery}),
        ),
        "unpriced_model",
        &["the tenant's", "inputPerMtok"],
    );
    let session = ada
        .create_session(json!({"provider": provider, "model": priced}))
        .id;
    assert_refused(
        &ada.patch(
            &format!("/v1/sessions/{session}"),
            &json!({"model": mystery}),
        ),
        "unpriced_model",
        &[&mystery],
    );
    let info: Value = ada
        .get(&format!("/v1/sessions/{session}"))
        .expect_status(200)
        .json();
    assert_eq!(info["session"]["model"], priced.as_str(), "{info}");

    // set_model and spawn_session {model} are refused the same way, before anything happens.
    stack().openai().script(
        &priced,
        [
            Reply::tool_calls([
                ("set_model", json!({"model": mystery})),
                ("spawn_session", json!({"task": "hello", "model": mystery})),
            ]),
            Reply::text("Both refused."),
        ],
    );
    ada.enqueue(&session, "followUp", "switch, then spawn");
    ada.wait_idle(&session, TURN);
    let transcript = ada.transcript(&session);
    let text = describe(&transcript);
    let got = results(&transcript);
    assert_eq!(got.len(), 2, "{text}");
    for (is_error, content) in &got {
        assert!(is_error, "{text}");
        assert!(content.contains("has no price"), "{content}");
    }
    assert!(
        customs(&transcript, custom_types::MODEL_CHANGED).is_empty(),
        "{text}"
    );
    let info: Value = ada.get(&format!("/v1/sessions/{session}")).json();
    assert_eq!(info["children"], json!([]), "{info}");
    assert_eq!(info["session"]["model"], priced.as_str(), "{info}");

    // The session made before the limit, on the unpriced model: its next step spends nothing.
    ada.enqueue(&before, "followUp", "hello?");
    ada.wait_idle(&before, TURN);
    let transcript = ada.transcript(&before);
    let text = describe(&transcript);
    let notices = customs(&transcript, custom_types::UNPRICED_MODEL);
    assert_eq!(notices.len(), 1, "{text}");
    assert_eq!(notices[0]["model"], mystery.as_str());
    assert!(
        notices[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("config/models.json"),
        "{text}"
    );
    assert!(assistants(&transcript).is_empty(), "{text}");
    assert!(
        stack().openai().requests_for(&mystery).is_empty(),
        "a request left for the unpriced model"
    );

    // An admin prices it: it is chosen and runs again, and its requests cost what they use.
    let table = json!({"models": [{"id": mystery, "provider": provider, "inputPerMtok": 1, "outputPerMtok": 2}]});
    root.put_doc("config/models.json", table.to_string())
        .expect_status(200);
    stack()
        .openai()
        .script(&mystery, [Reply::text("Priced now.").with_usage(1000, 10)]);
    ada.enqueue(&before, "followUp", "and now?");
    ada.wait_idle(&before, TURN);
    let transcript = ada.transcript(&before);
    let replies = assistants(&transcript);
    assert_eq!(replies.len(), 1, "{}", describe(&transcript));
    let cost = replies[0].usage.and_then(|u| u.cost_usd);
    assert!(cost.is_some_and(|c| c > 0.0), "{cost:?}");
    ada.create_session(json!({"provider": provider, "model": mystery}));
}

#[test]
fn a_usd_budget_of_a_parent_holds_for_the_models_of_its_children() {
    let _guard = stack().guard();
    let tenant = unique_name("unpriced-child");
    let ada = stack().client("ada", &tenant);
    let priced = format!("gpt-4o-{}", unique_name("parent"));
    let mystery = unique_name("mystery-child");
    let parent = ada
        .create_session(
            json!({"provider": "openai-compatible", "model": priced, "budget": {"maxUsd": 5}}),
        )
        .id;
    stack().openai().script(
        &priced,
        [
            Reply::tool_calls([("spawn_session", json!({"task": "hello", "model": mystery}))]),
            Reply::text("Refused."),
        ],
    );
    ada.enqueue(&parent, "followUp", "spawn");
    ada.wait_idle(&parent, TURN);
    let transcript = ada.transcript(&parent);
    let got = results(&transcript);
    assert_eq!(got.len(), 1, "{}", describe(&transcript));
    assert!(got[0].0 && got[0].1.contains("has no price"), "{got:?}");
    assert!(got[0].1.contains("the session's"), "{got:?}");
}

#[test]
fn a_worker_without_the_variable_refuses_fake_and_honours_the_tenants_default() {
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        fake_provider: false,
        ..StackOptions::default()
    });
    let _guard = stack.guard();
    let tenant = unique_name("production");
    let ada = stack.client("ada", &tenant);
    let root = stack.admin_client("root", &tenant);

    // No provider named and no tenant default: refused, naming both ways out.
    assert_refused(
        &ada.post("/v1/sessions", &json!({})),
        "provider_required",
        &[
            "WUHU_ENABLE_FAKE_PROVIDER=1",
            "defaultProvider",
            "config/tenant.json",
        ],
    );
    // fake named: refused, naming the variable.
    for body in [
        json!({"provider": "fake"}),
        json!({"provider": "fake", "model": "fake-echo"}),
    ] {
        assert_refused(
            &ada.post("/v1/sessions", &body),
            "fake_provider_disabled",
            &["WUHU_ENABLE_FAKE_PROVIDER=1"],
        );
    }
    // A chat binding cannot default to it either.
    assert_refused(
        &root.post(
            "/v1/channels",
            &json!({"platform": "slack", "name": "ops", "teamId": "T0001", "apiAppId": "A0001", "credentials": {"signingSecret": "s".repeat(32), "botToken": "xoxb-test"}, "defaults": {"provider": "fake"}}),
        ),
        "fake_provider_disabled",
        &["WUHU_ENABLE_FAKE_PROVIDER=1"],
    );

    // The tenant's default provider and model.
    let model = format!("gpt-4o-{}", unique_name("default"));
    let settings = json!({"defaultProvider": "openai-compatible", "defaultModel": model});
    root.put_doc("config/tenant.json", settings.to_string())
        .expect_status(200);
    let session = ada.create_session(json!({}));
    assert_eq!(
        (session.provider.as_str(), session.model.as_str()),
        ("openai-compatible", model.as_str())
    );
    stack
        .openai()
        .script(&model, [Reply::text("Hello from the default.")]);
    ada.enqueue(&session.id, "followUp", "hi");
    ada.wait_idle(&session.id, TURN);
    let transcript = ada.transcript(&session.id);
    assert_eq!(
        assistants(&transcript).len(),
        1,
        "{}",
        describe(&transcript)
    );
    // A named provider wins over the default; fake stays refused by a switch too.
    let named = ada.create_session(json!({"provider": "anthropic"}));
    assert_eq!(named.provider, "anthropic");
    assert_refused(
        &ada.patch(
            &format!("/v1/sessions/{}", session.id),
            &json!({"provider": "fake"}),
        ),
        "fake_provider_disabled",
        &["WUHU_ENABLE_FAKE_PROVIDER=1"],
    );
}
