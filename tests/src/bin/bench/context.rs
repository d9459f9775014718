//! `context_build`: the request of one step of a 10,000-entry session, built in process.
//!
//! What a session actor does before each LLM request, without the I/O: `compaction::plan_step`
//! over the context window it keeps in memory (the newest 1,024 entries plus the anchored
//! ones). Native release code: the Worker runs the same code as wasm, which is slower by a
//! small factor.

use std::time::Instant;

use serde_json::json;
use wuhu_core::compaction::{self, StepPlan};
use wuhu_core::context::ContextWindow;
use wuhu_core::tools::catalogue;
use wuhu_core::wire::{
    AssistantMessage, Compaction, CompactionReason, ContentBlock, Entry, EntryPayload, Header,
    Message, StopReason, ToolCall, ToolResult, Usage, custom_types,
};

use super::{Config, Measured, Series, ms};

/// Entries of the benchmark's session.
const ENTRIES: u64 = 10_000;
/// The step's target (issue 11).
const TARGET_MS: f64 = 5.0;

fn entry(cursor: u64, payload: EntryPayload) -> Entry {
    Entry {
        cursor,
        id: format!("00000000-0000-4000-8000-{cursor:012}"),
        created_at: 1_790_000_000 + cursor as i64,
        payload,
    }
}

fn message(message: Message) -> EntryPayload {
    EntryPayload::Message { message }
}

/// A coding session: a header, the global context, then turns of a request, a tool call, its
/// result (~1.5 KB) and a reply, and (`compacted`) a compaction near the end.
fn session(compacted: bool) -> (Header, Vec<Entry>) {
    let header = Header {
        system_prompt: "You are Wuhu, a helpful agent. ".repeat(20),
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        reasoning: None,
    };
    let mut entries = vec![
        entry(1, EntryPayload::Header(header.clone())),
        entry(
            2,
            message(Message::CustomMessage {
                custom_type: custom_types::GLOBAL_CONTEXT.into(),
                content: "Prefer small commits. ".repeat(100),
                details: Some(json!({"path": "wuhu://workspace/users/ana/context.md"})),
            }),
        ),
    ];
    let mut turn = 0u64;
    while (entries.len() as u64) < ENTRIES {
        let cursor = entries.len() as u64 + 1;
        if compacted && cursor == ENTRIES - 200 {
            entries.push(entry(
                cursor,
                EntryPayload::Compaction(Compaction {
                    summary: "The user works on the billing service. ".repeat(60),
                    first_kept_cursor: ENTRIES - 400 + 1,
                    kept_cursors: vec![],
                    tokens_before: 150_000,
                    reason: CompactionReason::Auto,
                    instructions: None,
                    provider: header.provider.clone(),
                    model: header.model.clone(),
                    usage: None,
                }),
            ));
            continue;
        }
        let id = format!("toolu_{turn:08}");
        let payload = match (cursor - 3) % 4 {
            0 => message(Message::User {
                author: "ana".into(),
                content: format!(
                    "Step {turn}: look at src/billing/invoice.rs and fix the rounding. "
                ),
                queue_item_id: None,
                lane: None,
                acting_for: None,
            }),
            1 => message(Message::Assistant(AssistantMessage {
                provider: header.provider.clone(),
                model: header.model.clone(),
                content: vec![
                    ContentBlock::Text {
                        text: "Reading the file.".into(),
                    },
                    ContentBlock::ToolCall(ToolCall {
                        id: id.clone(),
                        name: "read".into(),
                        arguments: json!({"path": "src/billing/invoice.rs", "offset": turn % 400}),
                    }),
                ],
                stop_reason: StopReason::ToolUse,
                usage: Some(Usage {
                    input_tokens: 40_000,
                    output_tokens: 120,
                    total_tokens: 40_120,
                    ..Usage::default()
                }),
            })),
            2 => message(Message::ToolResult(ToolResult {
                tool_call_id: id,
                tool_name: "read".into(),
                content: "fn round(amount: Decimal) -> Decimal { amount.round_dp(2) }\n".repeat(25),
                is_error: false,
                blobs: Vec::new(),
            })),
            _ => {
                turn += 1;
                message(Message::Assistant(AssistantMessage {
                    provider: header.provider.clone(),
                    model: header.model.clone(),
                    content: vec![ContentBlock::Text {
                        text: "Fixed: amounts are rounded half-even to cents. ".repeat(8),
                    }],
                    ..Default::default()
                }))
            }
        };
        entries.push(entry(cursor, payload));
    }
    (header, entries)
}

/// The window an actor holds after loading: anchors, then the newest entries.
fn window_of(entries: &[Entry]) -> ContextWindow {
    let mut window = ContextWindow::default();
    for entry in entries {
        let bytes = serde_json::to_string(entry).map_or(0, |j| j.len());
        window.push(entry.clone(), bytes);
    }
    window
}

pub(super) fn context_build(config: &Config) -> Measured {
    let mut series = Vec::new();
    let mut facts = Vec::new();
    for (name, compacted) in [("compacted_step", true), ("uncompacted_step", false)] {
        let (header, entries) = session(compacted);
        let window = window_of(&entries);
        let models = wuhu_core::llm::models::ModelTable::builtin();
        let mut samples = Vec::with_capacity(config.turns);
        let mut plan_kind = "";
        for i in 0..config.warmup + config.turns {
            let started = Instant::now();
            let plan = compaction::plan_step(&header, &models, &window, None, catalogue(), true);
            let elapsed = started.elapsed();
            plan_kind = match plan {
                StepPlan::Send { .. } => "send",
                StepPlan::Compact(_) => "compact",
            };
            std::hint::black_box(plan);
            if i >= config.warmup {
                samples.push(ms(elapsed));
            }
        }
        facts.push((
            if compacted {
                "compacted_step_plan"
            } else {
                "uncompacted_step_plan"
            },
            json!(plan_kind),
        ));
        series.push(Series::new(name, samples));
    }
    let (_, entries) = session(true);
    let mut load = Vec::with_capacity(config.turns);
    for _ in 0..config.turns.min(50) {
        let started = Instant::now();
        std::hint::black_box(window_of(&entries[entries.len() - 1024..]));
        load.push(ms(started.elapsed()));
    }
    series.push(Series::new("window_load_1024", load));
    facts.push(("entries", json!(ENTRIES)));
    facts.push(("target_ms", json!(TARGET_MS)));
    let worst = series[0]
        .samples_ms
        .iter()
        .chain(&series[1].samples_ms)
        .fold(0.0f64, |a, b| a.max(*b));
    facts.push(("max_step_ms", json!(worst)));
    facts.push(("under_target", json!(worst < TARGET_MS)));
    Measured { series, facts }
}
