use serde_json::json;

use super::*;
use crate::llm::models;
use crate::wire::{ToolCall, ToolResult, Usage};

const PROVIDER: &str = "fake";

fn header(window: u64) -> Header {
    Header {
        system_prompt: "s".into(),
        provider: PROVIDER.into(),
        model: format!("{}{window}", models::FAKE_WINDOW_PREFIX),
        reasoning: None,
    }
}

fn at(cursor: u64, payload: EntryPayload) -> Entry {
    Entry {
        cursor,
        id: format!("e{cursor}"),
        created_at: 0,
        payload,
    }
}

fn msg(message: Message) -> EntryPayload {
    EntryPayload::Message { message }
}

fn user(text: &str) -> EntryPayload {
    msg(Message::User {
        author: "ana".into(),
        content: text.into(),
        queue_item_id: None,
        lane: None,
        acting_for: None,
    })
}

fn reply(text: &str) -> EntryPayload {
    msg(Message::Assistant(AssistantMessage {
        provider: PROVIDER.into(),
        content: vec![ContentBlock::Text { text: text.into() }],
        ..Default::default()
    }))
}

fn call(id: &str) -> EntryPayload {
    msg(Message::Assistant(AssistantMessage {
        provider: PROVIDER.into(),
        content: vec![ContentBlock::ToolCall(ToolCall {
            id: id.into(),
            name: "list_sessions".into(),
            arguments: json!({}),
        })],
        stop_reason: crate::wire::StopReason::ToolUse,
        ..Default::default()
    }))
}

fn result(id: &str, text: &str) -> EntryPayload {
    msg(Message::ToolResult(ToolResult {
        tool_call_id: id.into(),
        tool_name: "list_sessions".into(),
        content: text.into(),
        is_error: false,
        blobs: Vec::new(),
    }))
}

fn custom_message(custom_type: &str, content: &str, details: serde_json::Value) -> EntryPayload {
    msg(Message::CustomMessage {
        custom_type: custom_type.into(),
        content: content.into(),
        details: Some(details),
    })
}

fn global(text: &str) -> EntryPayload {
    custom_message(custom_types::GLOBAL_CONTEXT, text, json!({"path": "g"}))
}

fn agents(env: &str, text: &str) -> EntryPayload {
    custom_message(custom_types::AGENTS_MD, text, json!({"environment": env}))
}

fn detached(env: &str) -> EntryPayload {
    EntryPayload::Custom {
        custom_type: custom_types::ENVIRONMENT_DETACHED.into(),
        data: json!({"environment": env}),
    }
}

fn compaction(summary: &str, first_kept_cursor: u64) -> EntryPayload {
    carrying(summary, first_kept_cursor, vec![])
}

/// A compaction that carries the user messages at `kept_cursors`.
fn carrying(summary: &str, first_kept_cursor: u64, kept_cursors: Vec<u64>) -> EntryPayload {
    EntryPayload::Compaction(Compaction {
        summary: summary.into(),
        first_kept_cursor,
        kept_cursors,
        tokens_before: 0,
        reason: CompactionReason::Auto,
        instructions: None,
        provider: PROVIDER.into(),
        model: "m".into(),
        usage: None,
    })
}

/// A window holding `payloads` at cursors 1, 2, …
fn window_of(payloads: Vec<EntryPayload>) -> ContextWindow {
    let mut window = ContextWindow::default();
    for (i, payload) in payloads.into_iter().enumerate() {
        window.push(at(i as u64 + 1, payload), 0);
    }
    window
}

/// A short description of each message: `u:text`, `a:text`, `call:id`, `r:id`, `c:type-tail`.
fn shape(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| match m {
            Message::User { content, .. } => format!("u:{content}"),
            Message::Assistant(a) if a.tool_calls().next().is_some() => format!(
                "call:{}",
                a.tool_calls()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join("+")
            ),
            Message::Assistant(a) => format!("a:{}", a.text()),
            Message::ToolResult(r) => format!("r:{}", r.tool_call_id),
            Message::CustomMessage {
                custom_type,
                content,
                ..
            } if custom_type == custom_types::COMPACTION_SUMMARY => {
                format!("summary:{}", content.rsplit('\n').next().unwrap_or(""))
            }
            Message::CustomMessage { content, .. } => format!("c:{content}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn anchors_pin_global_context_and_attached_agents_md_and_the_latest_compaction() {
    // (entries appended, pinned cursors, compaction cursor)
    let cases: Vec<(Vec<EntryPayload>, Vec<u64>, Option<u64>)> = vec![
        (vec![user("a"), reply("b")], vec![], None),
        (vec![global("g"), user("a")], vec![1], None),
        // A second AGENTS.md of the same environment replaces the first; another adds.
        (
            vec![
                global("g"),
                agents("api", "1"),
                agents("web", "2"),
                agents("api", "3"),
            ],
            vec![1, 3, 4],
            None,
        ),
        // Detaching unpins that environment's AGENTS.md only.
        (
            vec![agents("api", "1"), agents("web", "2"), detached("api")],
            vec![2],
            None,
        ),
        // The latest compaction wins.
        (
            vec![user("a"), compaction("x", 1), user("b"), compaction("y", 3)],
            vec![],
            Some(4),
        ),
    ];
    for (payloads, pinned, compaction_cursor) in cases {
        let label = format!("{} entries", payloads.len());
        let mut anchors = Anchors::default();
        let window = window_of(payloads.clone());
        for (i, payload) in payloads.into_iter().enumerate() {
            let _ = anchors.observe(&at(i as u64 + 1, payload));
        }
        let got: Vec<u64> = anchors.pinned.iter().map(|p| p.cursor).collect();
        assert_eq!(got, pinned, "{label}");
        assert_eq!(
            anchors.compaction.map(|c| c.cursor),
            compaction_cursor,
            "{label}"
        );
        // The window holds exactly the anchored entries.
        let held: Vec<u64> = window.pinned().map(|e| e.cursor).collect();
        assert_eq!(held, pinned, "{label}: window");
        assert_eq!(
            window.compaction().map(|e| e.cursor),
            compaction_cursor,
            "{label}"
        );
    }
}

#[test]
fn pins_are_bounded_oldest_first() {
    let mut anchors = Anchors::default();
    for i in 0..(MAX_PINNED as u64 + 5) {
        let dropped = anchors.observe(&at(i + 1, agents(&format!("env{i}"), "x")));
        assert_eq!(
            dropped,
            if i >= MAX_PINNED as u64 {
                vec![i + 1 - MAX_PINNED as u64]
            } else {
                vec![]
            }
        );
        assert!(anchors.pinned.len() <= MAX_PINNED);
    }
}

#[test]
fn a_compacted_context_is_pinned_then_summary_then_the_kept_tail() {
    let payloads = vec![
        EntryPayload::Header(header(1000)), // 1
        global("G"),                        // 2
        user("first"),                      // 3
        reply("one"),                       // 4
        agents("api", "AGENTS api"),        // 5
        agents("web", "AGENTS web"),        // 6
        detached("web"),                    // 7
        user("second"),                     // 8
        call("x"),                          // 9
        result("x", "ok"),                  // 10
        compaction("the summary", 8),       // 11
        reply("two"),                       // 12
    ];
    let window = window_of(payloads);
    let (request, _) = build(&header(1000), &window, None, vec![]);
    assert_eq!(
        shape(&request.messages),
        "c:G c:AGENTS api summary:the summary u:second call:x r:x a:two"
    );
    // A pinned message inside the kept tail is sent once, where it is.
    let payloads = vec![
        user("first"),        // 1
        compaction("sum", 2), // 2
        agents("api", "A"),   // 3
        user("q"),            // 4
    ];
    let (request, _) = build(&header(1000), &window_of(payloads), None, vec![]);
    assert_eq!(shape(&request.messages), "summary:sum c:A u:q");
}

#[test]
fn anchors_older_than_the_held_entries_still_reach_the_context() {
    // The host loaded the anchors by cursor, then only the newest entries.
    let mut window = ContextWindow::default();
    window.push_anchor(at(2, global("G")));
    window.push_anchor(at(5, agents("api", "A")));
    window.push_anchor(at(900, compaction("sum", 950)));
    for cursor in 940..=960 {
        let payload = if cursor % 2 == 0 {
            user(&cursor.to_string())
        } else {
            reply(&cursor.to_string())
        };
        window.push(at(cursor, payload), 10);
    }
    let (request, _) = build(&header(100_000), &window, None, vec![]);
    let shape = shape(&request.messages);
    assert!(
        shape.starts_with("c:G c:A summary:sum u:950 a:951"),
        "{shape}"
    );
    assert!(!shape.contains("u:948"), "{shape}");
}

#[test]
fn the_estimate_is_corrected_by_the_newest_reported_usage_after_the_latest_compaction() {
    let with_usage = |text: &str, input: u64, output: u64| {
        msg(Message::Assistant(AssistantMessage {
            provider: PROVIDER.into(),
            model: header(1000).model,
            content: vec![ContentBlock::Text { text: text.into() }],
            usage: Some(Usage {
                input_tokens: input,
                output_tokens: output,
                ..Usage::default()
            }),
            ..Default::default()
        }))
    };
    let after = estimate_message(
        PROVIDER,
        &Message::User {
            author: "ana".into(),
            content: "later".into(),
            queue_item_id: None,
            lane: None,
            acting_for: None,
        },
    );
    // (entries, expected estimate; None: the raw estimate)
    let cases: Vec<(Vec<EntryPayload>, Option<u64>)> = vec![
        (vec![user("a"), reply("b"), user("later")], None),
        (
            vec![user("a"), with_usage("b", 500, 20), user("later")],
            Some(520 + after),
        ),
        // The newest report wins.
        (
            vec![
                user("a"),
                with_usage("b", 500, 20),
                user("c"),
                with_usage("d", 900, 7),
                user("later"),
            ],
            Some(907 + after),
        ),
        // A report from before the latest compaction measured a context that no longer exists.
        (
            vec![
                user("a"),
                with_usage("b", 500, 20),
                user("c"),
                compaction("s", 2),
                user("later"),
            ],
            None,
        ),
    ];
    for (i, (payloads, expected)) in cases.into_iter().enumerate() {
        let window = window_of(payloads);
        let parts = parts(&header(1000), &window, None, &[]);
        let (raw, corrected) = parts.estimate(&header(1000));
        assert_eq!(corrected, expected.unwrap_or(raw), "case {i}");
    }
}

/// Every tool call in `messages` is answered right after its assistant message.
fn calls_answered(messages: &[Message]) -> bool {
    let mut open: Vec<String> = Vec::new();
    for m in messages {
        match m {
            Message::Assistant(a) => {
                if !open.is_empty() {
                    return false;
                }
                open = a.tool_calls().map(|c| c.id.clone()).collect();
            }
            Message::ToolResult(r) => {
                if !open.contains(&r.tool_call_id) {
                    return false;
                }
                open.retain(|id| *id != r.tool_call_id);
            }
            _ => {}
        }
    }
    open.is_empty()
}

/// A session of `turns` turns: each a user message of `size` bytes, a tool call, its result,
/// and a reply.
fn session(turns: usize, size: usize) -> Vec<EntryPayload> {
    let mut payloads = vec![EntryPayload::Header(header(1000)), global("G")];
    for t in 0..turns {
        payloads.push(user(&format!("fact: {t} {}", "x".repeat(size))));
        payloads.push(call(&format!("c{t}")));
        // Context a tool added before its result (it reaches the LLM after the result).
        payloads.push(custom_message(
            custom_types::RESUME_NOTE,
            &format!("note {t}"),
            json!({}),
        ));
        payloads.push(result(&format!("c{t}"), &"r".repeat(size)));
        payloads.push(reply(&format!("done {t}")));
    }
    payloads
}

#[test]
fn plans_compact_past_the_threshold_and_cut_where_nothing_is_lost() {
    let (mut sent_plans, mut compact_plans) = (0, 0);
    for window_tokens in [500u64, 1000, 4000, 20_000] {
        for size in [1usize, 40, 200, 1500] {
            for turns in [1usize, 2, 5, 30, 120] {
                let label = format!("window {window_tokens}, size {size}, turns {turns}");
                let payloads = session(turns, size);
                let window = window_of(payloads.clone());
                let h = header(window_tokens);
                let parts = parts(&h, &window, None, &[]);
                let (_, estimate) = parts.estimate(&h);
                let over = estimate > window_tokens * COMPACT_AT_PERCENT / 100;
                match plan_step(&h, &ModelTable::builtin(), &window, None, vec![], true) {
                    StepPlan::Send {
                        request,
                        estimated_tokens,
                    } => {
                        sent_plans += 1;
                        assert_eq!(estimated_tokens, estimate, "{label}");
                        // Under the threshold, or nowhere to cut (a single turn).
                        assert!(
                            !over || turns == 1,
                            "{label}: over the threshold and not compacted"
                        );
                        assert!(calls_answered(&request.messages), "{label}");
                    }
                    StepPlan::Compact(job) => {
                        compact_plans += 1;
                        assert!(over, "{label}: compacted under the threshold");
                        assert_eq!(job.tokens_before, estimate, "{label}");
                        // The cut is a user message or an assistant message (never a result),
                        // and never the first message of the context.
                        let kept = window
                            .entries()
                            .find(|e| e.cursor == job.first_kept_cursor)
                            .unwrap();
                        assert!(
                            matches!(
                                &kept.payload,
                                EntryPayload::Message {
                                    message: Message::User { .. } | Message::Assistant(_)
                                }
                            ),
                            "{label}: cut at {:?}",
                            kept.payload
                        );
                        assert!(job.first_kept_cursor > 3, "{label}");
                        // Every tool call before the cut has its result before the cut.
                        let before_cut = |e: &&Entry| e.cursor < job.first_kept_cursor;
                        let calls_before: Vec<String> = window
                            .entries()
                            .filter(before_cut)
                            .filter_map(|e| match &e.payload {
                                EntryPayload::Message {
                                    message: Message::Assistant(a),
                                } => Some(a.tool_calls().map(|c| c.id.clone()).collect::<Vec<_>>()),
                                _ => None,
                            })
                            .flatten()
                            .collect();
                        for id in calls_before {
                            let answered = window.entries().filter(before_cut).any(|e| {
                                matches!(&e.payload, EntryPayload::Message {
                                    message: Message::ToolResult(r),
                                } if r.tool_call_id == id)
                            });
                            assert!(answered, "{label}: call {id} cut from its result");
                        }
                        // What the summary request quotes and what is kept cover every
                        // message: each turn's fact is in one of them (summary material may
                        // leave out the oldest lines only beyond its budget).
                        let material = shape(&job.request.messages);
                        let mut with_compaction = payloads.clone();
                        assert!(
                            job.kept_cursors.is_empty(),
                            "{label}: no turn being answered"
                        );
                        with_compaction.push(compaction("S", job.first_kept_cursor));
                        let compacted = window_of(with_compaction);
                        let (request, after) = build(&h, &compacted, None, vec![]);
                        assert!(calls_answered(&request.messages), "{label}");
                        let sent = shape(&request.messages);
                        let fits_budget = !material.contains("older messages left out");
                        for t in 0..turns {
                            let fact = format!("fact: {t} ");
                            assert!(
                                sent.contains(&fact) || material.contains(&fact) || !fits_budget,
                                "{label}: turn {t} lost"
                            );
                        }
                        // The compacted context is smaller, and within the kept share when
                        // a cut could keep that little.
                        assert!(after < estimate, "{label}: {after} >= {estimate}");
                        assert!(sent.starts_with("c:G summary:S"), "{label}: {sent}");
                    }
                }
            }
        }
    }
    assert!(
        sent_plans > 10 && compact_plans > 10,
        "{sent_plans} sent, {compact_plans} compacted"
    );
}

#[test]
fn the_entry_bound_compacts_even_when_tokens_fit() {
    let payloads = session(MAX_TAIL_ENTRIES / 4 + 1, 1);
    let window = window_of(payloads);
    let plan = plan_step(
        &header(10_000_000),
        &ModelTable::builtin(),
        &window,
        None,
        vec![],
        true,
    );
    let StepPlan::Compact(job) = plan else {
        panic!("no compaction past {MAX_TAIL_ENTRIES} entries");
    };
    let last = window.entries().last().unwrap().cursor;
    assert!(last - job.first_kept_cursor <= (MAX_TAIL_ENTRIES / 2) as u64);
    // Once compacted in this step, the plan sends.
    assert!(matches!(
        plan_step(
            &header(10_000_000),
            &ModelTable::builtin(),
            &window,
            None,
            vec![],
            false
        ),
        StepPlan::Send { .. }
    ));
}

#[test]
fn the_tenant_table_sets_the_window_compaction_counts_against() {
    // Ten turns of about 250 tokens each: nothing to do in an unknown model's 128,000 tokens,
    // past 80 % of the 2,000 a tenant's table gives the same model.
    let window = window_of(session(10, 1000));
    let on = |models: &ModelTable| {
        let header = Header {
            system_prompt: "s".into(),
            provider: "openai-compatible".into(),
            model: "my-llama-3".into(),
            reasoning: None,
        };
        match plan_step(&header, models, &window, None, vec![], true) {
            StepPlan::Send { .. } => "send",
            StepPlan::Compact(_) => "compact",
        }
    };
    let tenant = ModelTable::with_tenant(Some(
        r#"{"models":[{"id":"my-llama","provider":"openai-compatible","contextWindow":2000}]}"#,
    ))
    .unwrap();
    assert_eq!(
        (on(&ModelTable::builtin()), on(&tenant)),
        ("send", "compact")
    );
}

#[test]
fn a_lone_first_message_has_nothing_to_compact() {
    let window = window_of(vec![
        EntryPayload::Header(header(10)),
        user(&"x".repeat(500)),
    ]);
    assert_eq!(
        plan_compaction(
            &header(10),
            &ModelTable::builtin(),
            &window,
            None,
            &[],
            CompactionReason::Manual,
            None
        ),
        Err(NothingToCompact)
    );
    assert!(matches!(
        plan_step(
            &header(10),
            &ModelTable::builtin(),
            &window,
            None,
            vec![],
            true
        ),
        StepPlan::Send { .. }
    ));
}

#[test]
fn the_summary_request_carries_the_previous_summary_instructions_and_a_bounded_material() {
    let mut payloads = vec![user("fact: start"), compaction("fact: old summary", 1)];
    payloads.extend(session(40, 300).into_iter().skip(2));
    let window = window_of(payloads);
    let job = plan_compaction(
        &header(2000),
        &ModelTable::builtin(),
        &window,
        None,
        &[],
        CompactionReason::Manual,
        Some("keep the numbers".into()),
    )
    .unwrap();
    assert_eq!(job.request.system_prompt, SUMMARY_SYSTEM_PROMPT);
    assert!(job.request.tools.is_empty());
    let Message::User { content, .. } = &job.request.messages[0] else {
        panic!("not a user message");
    };
    assert!(content.starts_with("Summary so far:\n\nfact: old summary"));
    assert!(content.ends_with("Instructions for this summary: keep the numbers"));
    let budget = (2000 * SUMMARY_INPUT_PERCENT / 100) as f64 * bytes_per_token(PROVIDER);
    assert!(
        content.len() as f64 <= budget,
        "{} > {budget}",
        content.len()
    );
    assert!(content.contains("older messages left out"));
}

#[test]
fn finishing_bounds_the_summary_and_refuses_an_empty_one() {
    let job = CompactionJob {
        request: LlmRequest {
            model: "m".into(),
            system_prompt: String::new(),
            messages: vec![],
            tools: vec![],
            max_output_tokens: None,
            reasoning: None,
            images: Default::default(),
        },
        first_kept_cursor: 7,
        kept_cursors: vec![],
        tokens_before: 99,
        reason: CompactionReason::Overflow,
        instructions: None,
    };
    let text = |t: &str| AssistantMessage {
        content: vec![ContentBlock::Text { text: t.into() }],
        ..Default::default()
    };
    assert_eq!(job.clone().finish(&header(10), &text("  ")), None);
    let long = "é".repeat(MAX_SUMMARY_BYTES);
    let done = job.clone().finish(&header(10), &text(&long)).unwrap();
    assert!(done.summary.len() <= MAX_SUMMARY_BYTES + 64);
    assert_eq!((done.first_kept_cursor, done.tokens_before), (7, 99));
    assert_eq!(done.reason, CompactionReason::Overflow);
}

#[test]
fn context_overflow_is_recognised_only_in_refusals() {
    use crate::llm::LlmFailure;
    let cases = [
        (
            400,
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
            true,
        ),
        (
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208000 tokens > 200000 maximum"}}"#,
            true,
        ),
        (
            400,
            r#"{"error":{"message":"Your input exceeds the context window of this model."}}"#,
            true,
        ),
        (
            413,
            r#"{"error":{"type":"request_too_large","message":"Request too large"}}"#,
            true,
        ),
        (400, r#"{"error":{"message":"invalid tool schema"}}"#, false),
        (
            429,
            r#"{"error":{"message":"too many tokens per minute"}}"#,
            false,
        ),
        (500, r#"{"error":{"message":"context length"}}"#, false),
    ];
    for (status, body, overflow) in cases {
        assert_eq!(
            LlmFailure::from_status(status, body).is_context_overflow(),
            overflow,
            "{status} {body}"
        );
    }
}

#[test]
fn sessions_record_compactions_that_move_the_context_forward_only() {
    use crate::session::{Effect, Millis, Session};
    let mut session = Session::create(Millis(0), 1, header(100), vec![]);
    for i in 0..6 {
        session
            .handle_enqueue(
                Millis(1),
                format!("q{i}"),
                crate::wire::Lane::FollowUp,
                "ana".into(),
                "hi".into(),
            )
            .unwrap();
        session.handle_inference_done(Millis(2), i + 1, Ok(AssistantMessage::default()));
    }
    while session.poll_effect().is_some() {}
    let last = session.last_cursor();
    let record = |session: &mut Session, first_kept: u64| {
        let payload = match compaction("s", first_kept) {
            EntryPayload::Compaction(c) => c,
            _ => unreachable!(),
        };
        session.handle_compaction(Millis(3), payload)
    };
    // (first kept cursor, recorded)
    let cases = [
        (0, false),
        (last + 1, false),
        (4, true),
        (4, false),
        (3, false),
        (6, true),
        (last, true),
    ];
    for (first_kept, recorded) in cases {
        let result = record(&mut session, first_kept);
        assert_eq!(result.is_ok(), recorded, "first kept {first_kept}");
        let appended: Vec<Effect> = std::iter::from_fn(|| session.poll_effect()).collect();
        assert_eq!(
            appended.len(),
            usize::from(recorded),
            "first kept {first_kept}"
        );
        if recorded {
            assert_eq!(
                session
                    .context_anchors()
                    .compaction
                    .as_ref()
                    .map(|c| c.first_kept_cursor),
                Some(first_kept)
            );
            assert_eq!(
                session
                    .checkpoint()
                    .context
                    .compaction
                    .as_ref()
                    .map(|c| c.cursor),
                Some(session.last_cursor())
            );
        }
    }
}

#[test]
fn the_fake_summarises_facts_and_recalls_them_from_the_summary() {
    use crate::llm::fake;
    let mut payloads = vec![user("fact: the vault code is 7193"), reply("ok")];
    for i in 0..10 {
        payloads.push(user(&format!("chat {i} {}", "y".repeat(300))));
        payloads.push(reply("ok"));
    }
    let window = window_of(payloads.clone());
    let job = plan_compaction(
        &header(3000),
        &ModelTable::builtin(),
        &window,
        None,
        &[],
        CompactionReason::Manual,
        None,
    )
    .unwrap();
    let summary_reply = fake::respond(&job.request);
    let mut builder = crate::llm::AssistantBuilder::default();
    for event in summary_reply.events {
        builder.push(event);
    }
    let summary = builder.build(PROVIDER, "m");
    assert!(
        summary.text().contains("fact: the vault code is 7193"),
        "{}",
        summary.text()
    );
    let done = job.finish(&header(3000), &summary).unwrap();
    payloads.push(EntryPayload::Compaction(done));
    payloads.push(user(r#"@fake {"recall":"vault"}"#));
    let (request, _) = build(&header(3000), &window_of(payloads), None, vec![]);
    let answer = fake::respond(&request);
    let text: String = answer
        .events
        .iter()
        .filter_map(|e| match e {
            crate::llm::LlmEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        text,
        "recalled from the summary: fact: the vault code is 7193"
    );
}

/// The user messages of `messages`, as sent.
fn user_texts(messages: &[Message]) -> Vec<&str> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::User { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect()
}

/// Appends a compaction of `payloads` planned by `job` and returns its cursor.
fn record(payloads: &mut Vec<EntryPayload>, job: &CompactionJob) -> u64 {
    payloads.push(carrying(
        "S",
        job.first_kept_cursor,
        job.kept_cursors.clone(),
    ));
    payloads.len() as u64
}

/// `steps` tool calls of the turn, `from` on, each with a result of `size` bytes.
fn steps(payloads: &mut Vec<EntryPayload>, from: usize, steps: usize, size: usize) {
    for s in from..from + steps {
        payloads.push(call(&format!("t{s}")));
        payloads.push(result(&format!("t{s}"), &"r".repeat(size)));
    }
}

#[test]
fn a_compaction_never_loses_the_user_messages_of_the_turn_being_answered() {
    let mut carried_cases = 0;
    for window_tokens in [1000u64, 4000] {
        for history in [0usize, 3, 20] {
            for task_size in [10usize, 1200, 3000] {
                for queued in [0usize, 2] {
                    for n_steps in [0usize, 1, 3, 12] {
                        for steer in [false, true] {
                            for result_size in [50usize, 600] {
                                let label = format!(
                                    "window {window_tokens}, history {history}, task {task_size}, queued {queued}, steps {n_steps}, steer {steer}, results {result_size}"
                                );
                                let h = header(window_tokens);
                                let mut payloads = session(history, 100);
                                let mut turn: Vec<String> =
                                    vec![format!("task {}", "t".repeat(task_size))];
                                turn.extend((0..queued).map(|q| format!("queued {q}")));
                                for text in &turn {
                                    payloads.push(user(text));
                                }
                                steps(&mut payloads, 0, n_steps, result_size);
                                if steer {
                                    turn.push("steer: use the other file".into());
                                    payloads.push(user(turn.last().unwrap()));
                                    steps(&mut payloads, n_steps, 2, result_size);
                                }
                                // Two compactions in the same turn, more steps between them.
                                for round in 0..2 {
                                    let label = format!("{label}, round {round}");
                                    let window = window_of(payloads.clone());
                                    let Ok(job) = plan_compaction(
                                        &h,
                                        &ModelTable::builtin(),
                                        &window,
                                        None,
                                        &[],
                                        CompactionReason::Manual,
                                        None,
                                    ) else {
                                        continue;
                                    };
                                    if !job.kept_cursors.is_empty() {
                                        carried_cases += 1;
                                    }
                                    let cursor = record(&mut payloads, &job);
                                    let (request, _) =
                                        build(&h, &window_of(payloads.clone()), None, vec![]);
                                    assert_eq!(
                                        user_texts(&request.messages)
                                            .iter()
                                            .filter(|t| turn.iter().any(|u| u == *t))
                                            .count(),
                                        turn.len(),
                                        "{label}: {}",
                                        shape(&request.messages)
                                    );
                                    assert!(calls_answered(&request.messages), "{label}");
                                    // A host that loads the anchors by cursor, then only the
                                    // entries from the cut on, builds the same request.
                                    let mut anchors = Anchors::default();
                                    for (i, p) in payloads.iter().enumerate() {
                                        let _ = anchors.observe(&at(i as u64 + 1, p.clone()));
                                    }
                                    let mut loaded = ContextWindow::default();
                                    for c in anchors.cursors() {
                                        if c < job.first_kept_cursor {
                                            loaded.push_anchor(at(
                                                c,
                                                payloads[c as usize - 1].clone(),
                                            ));
                                        }
                                    }
                                    for (i, p) in payloads.iter().enumerate() {
                                        let c = i as u64 + 1;
                                        if c >= job.first_kept_cursor {
                                            loaded.push(at(c, p.clone()), 0);
                                        }
                                    }
                                    let (reloaded, _) = build(&h, &loaded, None, vec![]);
                                    assert_eq!(reloaded, request, "{label}: reloaded");
                                    assert!(cursor > job.first_kept_cursor);
                                    steps(&mut payloads, 100 + round * 10, 4, result_size);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(carried_cases > 20, "{carried_cases} compactions carried");
}

#[test]
fn the_cut_keeps_the_turn_in_the_tail_when_that_fits_and_carries_it_otherwise() {
    let h = header(1000);
    // (turn's tool steps, result bytes, carried)
    let cases = [(1usize, 50usize, false), (2, 50, false), (8, 600, true)];
    for (n_steps, size, carried) in cases {
        let mut payloads = session(10, 100);
        payloads.push(user("q1"));
        let q1 = payloads.len() as u64;
        payloads.push(user("q2"));
        steps(&mut payloads, 0, n_steps, size);
        let job = plan_compaction(
            &h,
            &ModelTable::builtin(),
            &window_of(payloads.clone()),
            None,
            &[],
            CompactionReason::Auto,
            None,
        )
        .unwrap();
        if carried {
            assert!(job.first_kept_cursor > q1 + 1, "{n_steps}");
            assert_eq!(job.kept_cursors, [q1, q1 + 1], "{n_steps}");
        } else {
            assert!(job.first_kept_cursor <= q1, "{n_steps}");
            assert!(job.kept_cursors.is_empty(), "{n_steps}");
        }
    }
    // Once a reply ends the turn, its carried messages are summarised like any other.
    let mut payloads = session(10, 100);
    payloads.push(user("q1"));
    steps(&mut payloads, 0, 8, 600);
    let job = plan_compaction(
        &h,
        &ModelTable::builtin(),
        &window_of(payloads.clone()),
        None,
        &[],
        CompactionReason::Auto,
        None,
    )
    .unwrap();
    assert_eq!(job.kept_cursors.len(), 1);
    record(&mut payloads, &job);
    payloads.push(reply("done"));
    payloads.push(user("next"));
    steps(&mut payloads, 50, 8, 600);
    let job = plan_compaction(
        &h,
        &ModelTable::builtin(),
        &window_of(payloads.clone()),
        None,
        &[],
        CompactionReason::Auto,
        None,
    )
    .unwrap();
    assert_eq!(job.kept_cursors, [payloads.len() as u64 - 16]);
}

#[test]
fn carried_messages_outlive_the_entries_held_in_memory() {
    let h = header(100_000);
    let mut payloads = vec![user("old"), reply("ok"), user("the task")];
    steps(&mut payloads, 0, 5, 10);
    payloads.push(carrying("S", 8, vec![3]));
    let mut window = window_of(payloads.clone());
    let mut cursor = payloads.len() as u64;
    for s in 0..HOT_TAIL_KEEP_FOR_TESTS {
        cursor += 1;
        window.push(at(cursor, call(&format!("late{s}"))), 0);
        cursor += 1;
        window.push(at(cursor, result(&format!("late{s}"), "r")), 0);
    }
    assert!(window.entries().all(|e| e.cursor > 8));
    assert_eq!(window.kept().map(|e| e.cursor).collect::<Vec<_>>(), [3]);
    let (request, _) = build(&h, &window, None, vec![]);
    assert!(shape(&request.messages).starts_with("summary:S u:the task"));
}

const HOT_TAIL_KEEP_FOR_TESTS: u64 = crate::archive::HOT_TAIL_KEEP;

#[test]
fn sessions_refuse_carried_cursors_that_are_not_before_the_cut() {
    use crate::session::{Millis, Session};
    let mut session = Session::create(Millis(0), 1, header(100), vec![]);
    for i in 0..12 {
        session
            .handle_enqueue(
                Millis(1),
                format!("q{i}"),
                crate::wire::Lane::FollowUp,
                "ana".into(),
                "hi".into(),
            )
            .unwrap();
        session.handle_inference_done(Millis(2), i + 1, Ok(AssistantMessage::default()));
    }
    while session.poll_effect().is_some() {}
    let too_many: Vec<u64> = (1..=MAX_KEPT_MESSAGES as u64 + 1).collect();
    // (first kept cursor, carried cursors, recorded)
    let cases: Vec<(u64, Vec<u64>, bool)> = vec![
        (6, vec![6], false),
        (6, vec![0, 2], false),
        (6, vec![3, 2], false),
        (6, vec![2, 2], false),
        (20, too_many, false),
        (6, vec![2, 4], true),
        (8, vec![], true),
    ];
    for (first_kept, kept, recorded) in cases {
        let EntryPayload::Compaction(payload) = carrying("s", first_kept, kept.clone()) else {
            unreachable!()
        };
        let result = session.handle_compaction(Millis(3), payload);
        assert_eq!(result.is_ok(), recorded, "{first_kept} {kept:?}");
        while session.poll_effect().is_some() {}
        if recorded {
            let anchors = session.context_anchors();
            assert_eq!(anchors.compaction.as_ref().unwrap().kept, kept);
            assert!(kept.iter().all(|c| anchors.cursors().contains(c)));
        }
    }
}

#[test]
fn a_tool_results_images_count_their_tokens() {
    use crate::wire::{BlobRef, ToolResult};
    let blob = |media_type: &str, size: u64, w: u32, h: u32| BlobRef {
        uri: format!("wuhu://blob/{media_type}{size}{w}"),
        size,
        media_type: media_type.into(),
        preview: None,
        width: Some(w),
        height: Some(h),
    };
    let result = |blobs: Vec<BlobRef>| {
        Message::ToolResult(ToolResult {
            tool_call_id: "c1".into(),
            tool_name: "read".into(),
            content: "shot.png: image/png image".into(),
            is_error: false,
            blobs,
        })
    };
    let max = crate::images::MAX_IMAGE_BYTES;
    for provider in ["anthropic", "openai"] {
        let bare = estimate_message(provider, &result(Vec::new()));
        let cases: Vec<(&str, Vec<BlobRef>, u64)> = vec![
            (
                "one image",
                vec![blob("image/png", 900, 1000, 1000)],
                crate::images::estimate_tokens(provider, Some(1000), Some(1000)),
            ),
            (
                "two images",
                vec![
                    blob("image/png", 900, 1000, 1000),
                    blob("image/jpeg", 900, 100, 100),
                ],
                crate::images::estimate_tokens(provider, Some(1000), Some(1000))
                    + crate::images::estimate_tokens(provider, Some(100), Some(100)),
            ),
            ("a text blob", vec![blob("text/plain", 900, 0, 0)], 0),
            (
                "an image too large to show",
                vec![blob("image/png", max + 1, 10, 10)],
                0,
            ),
        ];
        for (name, blobs, extra) in cases {
            assert_eq!(
                estimate_message(provider, &result(blobs)),
                bare + extra,
                "{provider}: {name}"
            );
        }
    }
}
