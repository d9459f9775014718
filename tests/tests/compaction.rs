//! Context end to end: automatic compaction of a long session on a small window, a provider's
//! context-overflow refusal answered by one compaction and one retry, the manual
//! `POST /v1/sessions/:id/compact`, and forks (`POST /v1/sessions/:id/fork`).

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::compaction::{COMPACT_AT_PERCENT, SUMMARY_SYSTEM_PROMPT, estimate_fixed};
use wuhu_core::llm::models::FAKE_WINDOW_PREFIX;
use wuhu_core::tools::catalogue;
use wuhu_core::wire::{
    Compaction, CompactionReason, Entry, EntryPayload, Message, SessionInfo, custom_types,
};
use wuhu_e2e::entries::{assert_contiguous, assistants, customs, describe};
use wuhu_e2e::util::{unique_name, wait_for};
use wuhu_e2e::{Reply, Stack};

const TURN: Duration = Duration::from_secs(60);
const SYSTEM_PROMPT: &str = "You are a test agent.";

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

fn compactions(entries: &[Entry]) -> Vec<(u64, Compaction)> {
    entries
        .iter()
        .filter_map(|e| match &e.payload {
            EntryPayload::Compaction(c) => Some((e.cursor, c.clone())),
            _ => None,
        })
        .collect()
}

fn user_cursor(entries: &[Entry], text: &str) -> u64 {
    entries
        .iter()
        .find(|e| {
            matches!(&e.payload, EntryPayload::Message { message: Message::User { content, .. } } if content == text)
        })
        .unwrap_or_else(|| panic!("no user message {text:?}"))
        .cursor
}

#[test]
fn a_long_session_on_a_small_window_compacts_and_still_recalls_its_first_fact() {
    let _guard = stack().guard();
    // A window where the system prompt and tools take a fifth: about 30 turns fit in it.
    let fixed = estimate_fixed("fake", SYSTEM_PROMPT, &catalogue());
    let window = fixed * 5 + 2000;
    let api = stack().client("ada", &unique_name("compaction"));
    let session = api.create_session(json!({
        "provider": "fake",
        "model": format!("{FAKE_WINDOW_PREFIX}{window}"),
        "systemPrompt": SYSTEM_PROMPT,
    }));
    let id = session.id;
    const TURNS: usize = 300;
    let first = "fact: the vault code is 7193";
    api.enqueue(&id, "followUp", first);
    api.wait_idle(&id, TURN);
    let filler = "lorem ipsum dolor sit amet ".repeat(24);
    for turn in 2..TURNS {
        api.enqueue(&id, "followUp", &format!("turn {turn}: {filler}"));
        api.wait_idle(&id, TURN);
    }
    api.enqueue(&id, "followUp", r#"@fake {"recall":"vault"}"#);
    api.wait_idle(&id, TURN);

    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let replies = assistants(&transcript);
    assert_eq!(replies.len(), TURNS, "one reply per turn");
    assert_eq!(
        replies.last().unwrap().text(),
        "recalled from the summary: fact: the vault code is 7193",
        "the last reply comes from the summary, not the first message"
    );
    // Nothing deleted: every user message is still in the transcript.
    let users = transcript
        .iter()
        .filter(|e| {
            matches!(
                &e.payload,
                EntryPayload::Message {
                    message: Message::User { .. }
                }
            )
        })
        .count();
    assert_eq!(users, TURNS);
    let compactions = compactions(&transcript);
    assert!(
        compactions.len() >= 5,
        "{} compactions in {TURNS} turns on a {window}-token window",
        compactions.len()
    );
    eprintln!(
        "figures: window {window} tokens (tools and system prompt {fixed}), {TURNS} turns, {} entries, {} compactions at cursors {:?}",
        transcript.len(),
        compactions.len(),
        compactions.iter().map(|(c, _)| *c).collect::<Vec<_>>()
    );
    let fact_cursor = user_cursor(&transcript, first);
    let mut previous_kept = 0;
    for (cursor, compaction) in &compactions {
        assert_eq!(compaction.reason, CompactionReason::Auto);
        assert!(compaction.first_kept_cursor > previous_kept.max(fact_cursor));
        assert!(compaction.first_kept_cursor < *cursor);
        assert!(
            compaction.tokens_before > window * COMPACT_AT_PERCENT / 100,
            "compacted at {} of {window}",
            compaction.tokens_before
        );
        assert!(
            compaction.summary.contains(first),
            "summary at {cursor} lost the fact: {}",
            compaction.summary
        );
        previous_kept = compaction.first_kept_cursor;
    }
    // The threshold held: no request the provider saw passed the window.
    for reply in &replies {
        let input = reply.usage.expect("fake usage").input_tokens;
        assert!(
            input <= window,
            "a request of {input} tokens on a {window}-token window"
        );
    }
    // Summaries are requests too: usage counts them.
    let usage = api.get(&format!("/v1/sessions/{id}/usage")).json();
    assert_eq!(
        usage["messages"].as_u64(),
        Some((TURNS + compactions.len()) as u64),
        "{usage}"
    );
}

#[test]
fn a_context_overflow_refusal_compacts_once_and_the_retry_succeeds() {
    let _guard = stack().guard();
    let (api, id, model) =
        stack().provider_session("ada", "openai-compatible", "gpt-test", SYSTEM_PROMPT);
    let openai = stack().openai();
    let first = "fact: the launch day is Tuesday";
    openai.script(&model, [Reply::text("noted"), Reply::text("sure")]);
    api.enqueue(&id, "followUp", first);
    api.wait_idle(&id, TURN);
    api.enqueue(&id, "followUp", "something else");
    api.wait_idle(&id, TURN);
    openai.script(
        &model,
        [
            Reply::error(
                400,
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 131072 tokens.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            Reply::text("Summary: fact: the launch day is Tuesday"),
            Reply::text("It is Tuesday."),
        ],
    );
    api.enqueue(&id, "followUp", "which day is the launch?");
    api.wait_idle(&id, TURN);

    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let replies: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    assert_eq!(replies, ["noted", "sure", "It is Tuesday."], "{text}");
    let compactions = compactions(&transcript);
    assert_eq!(compactions.len(), 1, "{text}");
    let (_, compaction) = &compactions[0];
    assert_eq!(compaction.reason, CompactionReason::Overflow);
    assert_eq!(
        compaction.summary,
        "Summary: fact: the launch day is Tuesday"
    );
    assert!(compaction.first_kept_cursor > user_cursor(&transcript, first));

    let requests = openai.requests_for(&model);
    assert_eq!(
        requests.len(),
        5,
        "two turns, the refused request, the summary, the retry"
    );
    let system_of = |r: &wuhu_e2e::RecordedRequest| r.messages()[0]["content"].clone();
    let summary_request = &requests[3];
    assert_eq!(system_of(summary_request), json!(SUMMARY_SYSTEM_PROMPT));
    assert!(summary_request.raw_body.contains(first));
    assert!(summary_request.body["tools"].is_null() || summary_request.tool_names().is_empty());
    let retry = &requests[4];
    let contents: Vec<String> = retry
        .messages()
        .iter()
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    assert!(
        contents
            .iter()
            .any(|c| c.contains("Summary: fact: the launch day is Tuesday")),
        "the retry carries the summary: {contents:?}"
    );
    assert!(
        !contents.iter().any(|c| c == first),
        "the summarised message is not sent again: {contents:?}"
    );
    assert!(contents.iter().any(|c| c == "which day is the launch?"));
}

#[test]
fn manual_compaction_takes_instructions_and_refuses_what_it_cannot_do() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("compact"));
    let id = api.create_fake_session().id;
    let path = format!("/v1/sessions/{id}/compact");
    // No message yet: nothing to summarise.
    let response = api.post(&path, &json!({}));
    assert_eq!(response.status, 409, "{response}");
    assert_eq!(response.json()["error"]["code"], "nothing_to_compact");
    api.enqueue(&id, "followUp", "fact: the password hint is blue");
    api.wait_idle(&id, TURN);
    for turn in 0..3 {
        api.enqueue(&id, "followUp", &format!("turn {turn}"));
        api.wait_idle(&id, TURN);
    }
    let response = api.post(&path, &json!({"instructions": "x".repeat(5000)}));
    assert_eq!(response.status, 400, "{response}");
    let response = api.post(&path, &json!({"instructions": 3}));
    assert_eq!(response.status, 400, "{response}");
    let response = api.post(&path, &json!({"instructions": "keep the hint"}));
    assert_eq!(response.status, 200, "{response}");
    let answer = response.json();
    assert_eq!(answer["compaction"]["reason"], "manual");
    assert_eq!(answer["compaction"]["instructions"], "keep the hint");
    assert!(
        answer["compaction"]["summary"]
            .as_str()
            .unwrap()
            .contains("fact: the password hint is blue")
    );
    // The next turn is built from the summary.
    api.enqueue(&id, "followUp", r#"@fake {"recall":"hint"}"#);
    api.wait_idle(&id, TURN);
    let transcript = api.transcript(&id);
    let last = assistants(&transcript).last().unwrap().text();
    assert_eq!(
        last,
        "recalled from the summary: fact: the password hint is blue"
    );
    let entry = transcript
        .iter()
        .find(|e| e.cursor == answer["cursor"].as_u64().unwrap())
        .expect("the compaction entry");
    assert!(matches!(entry.payload, EntryPayload::Compaction(_)));
    assert_eq!(api.get(&path).status, 405);
}

#[test]
fn a_compaction_inside_a_turn_keeps_the_turns_large_user_message() {
    let _guard = stack().guard();
    // About 2,000 tokens of conversation fit under the threshold: the turn's message (about
    // 1,000 tokens) fits, its tool result (about 1,500) passes it and the next step compacts.
    let fixed = estimate_fixed("fake", SYSTEM_PROMPT, &catalogue());
    let window = (fixed + 2000) * 100 / COMPACT_AT_PERCENT;
    let api = stack().client("ada", &unique_name("compaction-turn"));
    let id = api
        .create_session(json!({
            "provider": "fake",
            "model": format!("{FAKE_WINDOW_PREFIX}{window}"),
            "systemPrompt": SYSTEM_PROMPT,
        }))
        .id;
    for turn in 0..2 {
        api.enqueue(&id, "followUp", &format!("fact: warm-up {turn}"));
        api.wait_idle(&id, TURN);
    }
    let task = format!(
        "task: {}\n@fake {}",
        "please read this carefully ".repeat(150),
        json!({
            "toolCalls": [{"name": "js", "arguments": {"code": "'r'.repeat(6000)"}}],
            "afterTools": "done with the task",
        })
    );
    api.enqueue(&id, "followUp", &task);
    api.wait_idle(&id, TURN);

    let transcript = api.transcript(&id);
    let text = describe(&transcript);
    let task_cursor = user_cursor(&transcript, &task);
    let compactions = compactions(&transcript);
    let (_, compaction) = compactions
        .iter()
        .find(|(cursor, _)| *cursor > task_cursor)
        .unwrap_or_else(|| panic!("no compaction inside the turn: {text}"));
    assert_eq!(compaction.reason, CompactionReason::Auto, "{text}");
    assert!(
        compaction.first_kept_cursor <= task_cursor
            || compaction.kept_cursors.contains(&task_cursor),
        "the turn's message was summarised away: {compaction:?}"
    );
    // The step after the tool result still reads the turn's directive.
    assert_eq!(
        assistants(&transcript).last().unwrap().text(),
        "done with the task",
        "{text}"
    );
}

#[test]
fn a_fork_continues_from_a_cursor_reading_its_history_by_reference() {
    let _guard = stack().guard();
    let tenant = unique_name("fork");
    let ada = stack().client("ada", &tenant);
    let bob = stack().client("bob", &tenant);
    let parent = ada.create_fake_session().id;
    ada.enqueue(&parent, "followUp", "fact: the launch code is 4242");
    ada.wait_idle(&parent, TURN);
    for turn in 0..3 {
        ada.enqueue(&parent, "followUp", &format!("turn {turn}"));
        ada.wait_idle(&parent, TURN);
    }
    let at = ada.session(&parent).session.last_cursor;
    ada.enqueue(&parent, "followUp", "fact: the color is red");
    ada.wait_idle(&parent, TURN);
    let parent_before = ada.transcript(&parent);
    let path = format!("/v1/sessions/{parent}/fork");

    // Bad input, and a session the caller may not read.
    for bad in [
        json!({}),
        json!({"atCursor": 0}),
        json!({"atCursor": parent_before.len() as u64 + 1}),
        json!({"atCursor": "3"}),
        json!({"atCursor": 3, "color": "red"}),
        json!({"atCursor": 3, "title": ""}),
    ] {
        let response = ada.post(&path, &bad);
        assert_eq!(response.status, 400, "{bad}: {response}");
        assert_eq!(response.json()["error"]["code"], "bad_request");
    }
    assert_eq!(ada.get(&path).status, 405);
    assert_eq!(bob.post(&path, &json!({"atCursor": 3})).status, 404);

    let response = ada.post(&path, &json!({"atCursor": at, "title": "what if"}));
    assert_eq!(response.status, 201, "{response}");
    let fork: SessionInfo = serde_json::from_value(response.json()).unwrap();
    assert_eq!(fork.title.as_deref(), Some("what if"));
    assert_eq!(fork.created_by, "ada");
    assert_eq!(fork.last_cursor, at + 1);
    let forked_from = fork.forked_from.clone().expect("forkedFrom");
    assert_eq!(
        (forked_from.session_id.as_str(), forked_from.cursor),
        (parent.as_str(), at)
    );

    // Its history is the parent's first entries, then a notice of its own.
    let transcript = ada.transcript(&fork.id);
    assert_contiguous(&transcript);
    assert_eq!(transcript.len() as u64, at + 1);
    assert_eq!(&transcript[..at as usize], &parent_before[..at as usize]);
    let notices = customs(&transcript, custom_types::FORKED);
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0]["atCursor"], at);
    // Nothing archived was copied: the fork's own storage holds only its own entries.
    let stats = ada.get(&format!("/v1/sessions/{}/stats", fork.id)).json();
    assert_eq!(stats["hotEntries"], 1, "{stats}");
    assert!(stats["segments"].as_u64() <= Some(1), "{stats}");
    // The parent's entries reach segments once it has stayed idle a moment
    // (`bookkeeping::IDLE_FLUSH_DELAY_MS`).
    wait_for(
        "the idle parent's entries to be archived",
        Duration::from_secs(30),
        || {
            let parent_stats = ada.get(&format!("/v1/sessions/{parent}/stats")).json();
            (parent_stats["segments"].as_u64() > Some(0)).then_some(())
        },
    );

    // It continues from its history, without what the parent said after the cursor.
    ada.enqueue(&fork.id, "followUp", r#"@fake {"recall":"launch"}"#);
    ada.wait_idle(&fork.id, TURN);
    ada.enqueue(&fork.id, "followUp", r#"@fake {"recall":"color"}"#);
    ada.wait_idle(&fork.id, TURN);
    let transcript = ada.transcript(&fork.id);
    let replies: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    let own = &replies[replies.len() - 2..];
    assert_eq!(
        own,
        [
            "recalled from the message: fact: the launch code is 4242",
            "recalled nothing about color"
        ]
    );
    // The parent is unchanged; the fork's usage is its own.
    assert_eq!(ada.transcript(&parent), parent_before);
    let usage = ada.get(&format!("/v1/sessions/{}/usage", fork.id)).json();
    assert_eq!(usage["messages"], 2, "{usage}");

    // A fork of a fork reads through both; a member who may read a tenant session forks it as
    // their own (private) session.
    let response = ada.post(
        &format!("/v1/sessions/{}/fork", fork.id),
        &json!({"atCursor": at + 2}),
    );
    assert_eq!(response.status, 201, "{response}");
    let grandchild: SessionInfo = serde_json::from_value(response.json()).unwrap();
    assert_eq!(grandchild.title.as_deref(), Some("what if"));
    let transcript = ada.transcript(&grandchild.id);
    assert_contiguous(&transcript);
    assert_eq!(transcript.len() as u64, at + 3);
    assert_eq!(
        user_cursor(&transcript, r#"@fake {"recall":"launch"}"#),
        at + 2
    );
    ada.patch(
        &format!("/v1/sessions/{parent}"),
        &json!({"access": "tenant"}),
    )
    .expect_status(200);
    let response = bob.post(&path, &json!({"atCursor": 2}));
    assert_eq!(response.status, 201, "{response}");
    let bobs: SessionInfo = serde_json::from_value(response.json()).unwrap();
    assert_eq!(
        (bobs.created_by.as_str(), bobs.owner.as_str()),
        ("bob", "bob")
    );
    assert_eq!(ada.get(&format!("/v1/sessions/{}", bobs.id)).status, 404);
    assert_eq!(bob.transcript(&bobs.id).len(), 3);
}
